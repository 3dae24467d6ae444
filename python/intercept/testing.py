"""Test helpers, present in wheels built with the `testing` cargo feature (the CI's test
wheel): `MockUpstream`, a scriptable mock model server speaking Chat Completions,
Responses and Anthropic Messages (it echoes by default) and, given a tokenizer, vLLM's
token-in/token-out `POST /inference/v1/generate` (and SGLang's `POST /generate`), and
`BoreServer`, an in-process bore server for the bore tunnel."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from . import _native

__all__ = ["MockUpstream", "BoreServer", "AVAILABLE"]

AVAILABLE: bool = bool(getattr(_native, "TESTING", False))


def _need() -> None:
    if not AVAILABLE:
        raise RuntimeError("intercept.testing needs a wheel built with the `testing` feature (maturin build --features testing)")


class MockUpstream:
    """A mock model server on 127.0.0.1. `await MockUpstream.start()`.

    `start(tokenizer=FOLDER)` (a folder holding `tokenizer.json` and
    `tokenizer_config.json`, e.g. Qwen3's) also serves the engine's token routes: each
    scripted completion is laid out as Qwen3 writes it (`<think>` block, content, hermes
    `<tool_call>` blocks), tokenized, and answered as ids with per-token logprobs and the
    request's stop id (or cut at `max_tokens`, or by `finish_reason="length"`)."""

    def __init__(self, native: Any) -> None:
        self._native = native

    @classmethod
    async def start(cls, tokenizer: str | None = None) -> MockUpstream:
        _need()
        return cls(await _native.NativeMock.start(tokenizer))

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

    def push_completion(
        self,
        content: str | None = None,
        *,
        reasoning: str | None = None,
        tool_calls: Sequence[tuple[str, str]] = (),
        finish_reason: str | None = None,
        raw: bool = False,
    ) -> None:
        """Queues a completion: content, reasoning, tool calls as `(name, arguments JSON)`,
        a finish reason (`"length"` cuts it before its stop id). `raw`: on the token
        routes, `content` is tokenized as it is (no think block or tool-call layout)."""
        self._native.push_completion(content, reasoning, [(str(n), str(a)) for n, a in tool_calls], finish_reason, raw)

    def bodies(self, path: str) -> list[Any]:
        """The JSON bodies of the requests received on `path` (e.g. `/inference/v1/generate`)."""
        out: list[Any] = json.loads(self._native.bodies(path))
        return out

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
