"""Whole processes: exiting with calls in flight, the `intercept` command."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

EXIT_SCRIPTS = {
    # asyncio.run returns with the server never stopped and a call hanging upstream
    "async_no_stop": """
        async def main():
            mock = await MockUpstream.start()
            mock.push_hang()
            ic = intercept.Server()
            await ic.start()
            session = intercept.Session(id="x", model="m", upstream=mock.base_url)
            slot = await ic.acquire(session)
            c = openai.AsyncOpenAI(base_url=slot.env["OPENAI_BASE_URL"], api_key=slot.model_secret, max_retries=0)
            asyncio.get_running_loop().create_task(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}]))
            await mock.wait_for_requests(1)
            print("in flight", flush=True)
        asyncio.run(main())
    """,
    # a Python hook is running (never returns) when the interpreter exits
    "hook_pending": """
        started = threading.Event()
        async def main():
            mock = await MockUpstream.start()
            async def hook(body):
                started.set()
                await asyncio.Event().wait()
            ic = intercept.Server()
            await ic.start()
            session = intercept.Session(id="x", model="m", upstream=mock.base_url, on_request=hook)
            slot = await ic.acquire(session)
            c = openai.AsyncOpenAI(base_url=slot.env["OPENAI_BASE_URL"], api_key=slot.model_secret, max_retries=0)
            asyncio.get_running_loop().create_task(c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}]))
            while not started.is_set():
                await asyncio.sleep(0.01)
            print("in flight", flush=True)
        asyncio.run(main())
    """,
    # the sync facade, a call in flight from a thread, sys.exit
    "sync_exit": """
        def main():
            loop = asyncio.new_event_loop()
            mock = loop.run_until_complete(MockUpstream.start())
            mock.push_hang()
            ic = sync.Server()
            ic.start()
            slot = ic.acquire(intercept.Session(id="x", model="m", upstream=mock.base_url))
            c = openai.OpenAI(base_url=slot.env["OPENAI_BASE_URL"], api_key=slot.model_secret, max_retries=0)
            def call():
                # The exit cancels the call: its answer (409, or a dropped connection)
                # may reach this thread before the interpreter is gone.
                try:
                    c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
                except openai.APIError:
                    pass
            threading.Thread(target=call, daemon=True).start()
            loop.run_until_complete(mock.wait_for_requests(1))
            print("in flight", flush=True)
            sys.exit(0)
        main()
    """,
}

PRELUDE = "import asyncio, sys, threading, openai, intercept\nfrom intercept import sync\nfrom intercept.testing import MockUpstream\n"


@pytest.mark.parametrize("name", sorted(EXIT_SCRIPTS))
def test_interpreter_exits_cleanly_with_calls_in_flight(name, tmp_path) -> None:
    script = tmp_path / "s.py"
    script.write_text(PRELUDE + textwrap.dedent(EXIT_SCRIPTS[name]))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "in flight" in done.stdout, done.stderr
    assert done.returncode == 0, done.stderr
    assert "panicked" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def intercept_command() -> list[str]:
    return [os.path.join(os.path.dirname(sys.executable), "intercept")]


def test_intercept_command_help_version_and_bad_flags(tmp_path) -> None:
    ok = subprocess.run([*intercept_command(), "--help"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and "serve" in ok.stdout and "demo" in ok.stdout
    v = subprocess.run([sys.executable, "-m", "intercept", "--version"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert v.returncode == 0 and v.stdout.startswith("intercept ")
    bad = subprocess.run([*intercept_command(), "serve", "--multiplex", "zero"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "multiplex" in bad.stderr


def test_intercept_serve_runs_and_stops_on_sigterm_and_sigint() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        proc = subprocess.Popen([*intercept_command(), "serve", "--upstream", "mock", "--control", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            ready = json.loads(proc.stdout.readline())
            assert ready["event"] == "ready" and ready["control_url"].startswith("http://127.0.0.1:")
            # The command owns its process and applies the binary's settings to it:
            # transparent huge pages off (Linux reports it per process).
            status = Path(f"/proc/{proc.pid}/status")
            if status.exists():
                thp = [line for line in status.read_text().splitlines() if line.startswith("THP_enabled:")]
                if thp:
                    assert thp[0].split()[1] == "0", thp
            proc.send_signal(sig)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_intercept_demo_runs() -> None:
    done = subprocess.run([*intercept_command(), "demo", "--rollouts", "4", "--turns", "2"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "rollouts" in done.stdout
