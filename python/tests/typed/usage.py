"""Typed use of the package, checked by mypy --strict (tests/test_typing.py): the names a
program writes against, with the `Literal` types of modes, statuses and dialects."""

from __future__ import annotations

from typing import Literal

from typing_extensions import assert_type

import intercept
from intercept import sync


async def rollout(ic: intercept.Interception, upstream: str) -> intercept.SessionStatus:
    def on_request(body: dict[str, object], call: intercept.CallInfo) -> None:
        assert_type(call.dialect, Literal["chat_completions", "responses", "messages", "completions"])

    session = intercept.Session(id="r1", model="policy", upstream=upstream, on_request=on_request)
    async with ic.acquire(session) as slot:
        url: str = slot.openai_base_url
        assert url
    mode: intercept.PauseMode = "hold"
    status = await ic.pause(mode, timeout=30)
    assert status.paused
    await ic.resume()
    base: str | None = await ic.base_url()
    assert base
    assert_type(session.status, Literal["active", "stopped", "released"])
    return session.status


def blocking(upstream: str) -> intercept.SessionStatus:
    with sync.ElasticPool(multiplex=4) as ic:
        session = intercept.Session(id="r2", model="policy", upstream=upstream)
        with ic.acquire(session) as slot:
            env: dict[str, str] = slot.env
            assert env and slot.anthropic_base_url
            slot.release_now()
        ic.pause("reject", retry_after=1.5)
        ic.resume()
        assert ic.base_url() is not None
    return session.status
