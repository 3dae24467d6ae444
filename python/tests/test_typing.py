"""The package type-checks in a program that uses it: `tests/typed/usage.py` passes
`mypy --strict`, and a pause mode, status or dialect outside its `Literal` is an error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TYPED = Path(__file__).parent / "typed"


def _mypy(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    try:
        import mypy  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("mypy is not installed in this venv; CI installs it (.ci/run)")
        pytest.skip("mypy is not installed")
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", os.devnull, "--no-error-summary", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def test_typed_usage_passes_mypy_strict() -> None:
    run = _mypy(str(TYPED / "usage.py"), cwd=TYPED)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_value_outside_a_literal_is_a_type_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import intercept\n"
        "async def f(ic: intercept.Server, s: intercept.Session) -> None:\n"
        "    await ic.pause('sideways')\n"
        "    status: intercept.SessionStatus = s.status\n"
        "    wrong: intercept.SessionStatus = 'done'\n"
        "    dialect: intercept.Dialect = 'chat'\n"
    )
    run = _mypy(str(bad), cwd=tmp_path)
    assert run.returncode == 1, run.stdout + run.stderr
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert [line.split(":")[1] for line in errors] == ["3", "5", "6"], run.stdout
    assert "sideways" in errors[0] and "'hold'" in errors[0], errors[0]
