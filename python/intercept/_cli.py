"""The `intercept` command installed with the wheel: the Rust CLI, in-process."""

from __future__ import annotations

import signal
import sys

from . import _native


def main(argv: list[str] | None = None) -> int:
    """Runs `intercept <args>` (`serve`, `demo`) and returns its exit status."""
    args = ["intercept", *(sys.argv[1:] if argv is None else argv)]
    # SIGINT and SIGTERM are the Rust side's: `serve` shuts down gracefully on them. Python's
    # own handler (chained behind it) must not turn them into KeyboardInterrupt afterwards.
    previous = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        code = _native.cli_main(args)
    finally:
        signal.signal(signal.SIGINT, previous)
    sys.stdout.flush()
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
