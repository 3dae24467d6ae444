"""Shared fixtures: a mock model server per test (the Rust mock of intercept-test, built
into the test wheel with the `testing` feature)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

import intercept
from intercept.testing import AVAILABLE, MockUpstream

assert AVAILABLE, "the test suite needs a wheel built with `maturin build --features testing`"


@pytest.fixture
async def mock() -> AsyncIterator[MockUpstream]:
    upstream = await MockUpstream.start()
    try:
        yield upstream
    finally:
        await upstream.shutdown()


@pytest.fixture
async def server() -> AsyncIterator[intercept.Server]:
    async with intercept.Server(shutdown_grace=5) as ic:
        yield ic


async def until(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Waits until `cond()` holds (checked on every loop turn), failing after `timeout`."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)
