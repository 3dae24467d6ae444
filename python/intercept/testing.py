"""Test helpers, present in wheels built with the `testing` cargo feature (the CI's test
wheel): `MockUpstream`, a scriptable mock model server speaking Chat Completions,
Responses and Anthropic Messages (it echoes by default), and `BoreServer`, an in-process
bore server for the bore tunnel."""

from __future__ import annotations

from typing import Any

from . import _native

__all__ = ["MockUpstream", "BoreServer", "AVAILABLE"]

AVAILABLE: bool = bool(getattr(_native, "TESTING", False))


def _need() -> None:
    if not AVAILABLE:
        raise RuntimeError("intercept.testing needs a wheel built with the `testing` feature (maturin build --features testing)")


class MockUpstream:
    """A mock model server on 127.0.0.1. `await MockUpstream.start()`."""

    def __init__(self, native: Any) -> None:
        self._native = native

    @classmethod
    async def start(cls) -> MockUpstream:
        _need()
        return cls(await _native.NativeMock.start())

    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:<port>/v1`."""
        return str(self._native.base_url)

    def push_hang(self) -> None:
        self._native.push_hang()

    def push_error(self, status: int, message: str) -> None:
        self._native.push_error(status, message)

    def push_text(self, text: str, *, chunks: int | None = None, chunk_delay: float | None = None, header_delay: float | None = None) -> None:
        self._native.push_text(text, chunks, chunk_delay, header_delay)

    @property
    def request_count(self) -> int:
        return int(self._native.request_count())

    async def wait_for_requests(self, n: int) -> None:
        await self._native.wait_for_requests(n)

    async def shutdown(self) -> None:
        await self._native.shutdown()


class BoreServer:
    """An in-process bore server on 127.0.0.1. `await BoreServer.start()`."""

    def __init__(self, native: Any) -> None:
        self._native = native

    @classmethod
    async def start(cls, secret: str | None = None) -> BoreServer:
        _need()
        return cls(await _native.NativeBoreServer.start(secret))

    @property
    def control_port(self) -> int:
        return int(self._native.control_port)

    async def shutdown(self) -> None:
        await self._native.shutdown()
