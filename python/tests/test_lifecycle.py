"""Release mid-call, pause and resume, and what a released slot answers."""

from __future__ import annotations

import asyncio

import openai
import pytest

import intercept
from conftest import until


def client(slot: intercept.Slot) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=slot.env["OPENAI_BASE_URL"], api_key=slot.env["OPENAI_API_KEY"], max_retries=0, timeout=60)


async def ask(c: openai.AsyncOpenAI, text: str = "hi", stream: bool = False) -> str:
    if stream:
        out = ""
        s = await c.chat.completions.create(model="x", messages=[{"role": "user", "content": text}], stream=True)
        async for chunk in s:
            if chunk.choices and chunk.choices[0].delta.content:
                out += chunk.choices[0].delta.content
        return out
    r = await c.chat.completions.create(model="x", messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content or ""


@pytest.mark.parametrize("stream", [False, True])
async def test_release_mid_call_cancels_and_records_it(server, mock, stream) -> None:
    mock.push_hang()
    session = intercept.Session(id="mid", model="m", upstream=mock.base_url)
    slot = await server.acquire(session)
    c = client(slot)
    call = asyncio.create_task(ask(c, stream=stream))
    await asyncio.wait_for(mock.wait_for_requests(1), 30)
    assert server.inflight == 1
    await asyncio.wait_for(slot.release(), 30)
    assert slot.released
    # the harness sees the call fail, not hang
    with pytest.raises(openai.APIError):
        await asyncio.wait_for(call, 30)
    trace = session.trace()
    assert len(trace.calls) == 1
    assert trace.calls[0].error is not None and trace.calls[0].error.kind == "cancelled"
    assert isinstance(trace.calls[0].error.exception(), intercept.CallCancelledError)
    assert session.status == "released"
    # a late call with the same key: 409 rollout concluded, and nothing lands on the trace
    with pytest.raises(openai.ConflictError, match="rollout concluded"):
        await ask(c)
    assert session.calls == 1
    await c.close()
    await slot.release()  # idempotent


async def test_cancelled_acquire_frees_its_slot_and_release_survives_cancellation(server, mock) -> None:
    session = intercept.Session(id="c", model="m", upstream=mock.base_url)
    slot = await server.acquire(session)
    assert server.load == 1
    task = asyncio.create_task(slot.release())
    await asyncio.sleep(0)  # let release() begin, then cancel the task awaiting it
    task.cancel()  # a release with nothing in flight may already be done: either way it completes
    try:
        await task
    except asyncio.CancelledError:
        pass
    await until(lambda: server.load == 0 and session.status == "released", "the release to finish")
    # a slot object dropped without release frees its slot too
    other = intercept.Session(id="d", model="m", upstream=mock.base_url)
    dropped = await server.acquire(other)
    assert server.load == 1
    del dropped
    await until(lambda: server.load == 0, "the dropped slot to be freed")


async def test_pause_hold_then_resume_and_reject(server, mock) -> None:
    session = intercept.Session(id="p", model="m", upstream=mock.base_url)
    async with server.acquire(session) as slot:
        c = client(slot)
        assert await ask(c, "before") == "echo: before"
        status = await server.pause("hold", timeout=60)
        assert status.paused and status.mode == "hold" and status.epoch == 0
        held = asyncio.create_task(ask(c, "held"))
        await until(lambda: server.pause_status().held == 1, "the call to be held")
        assert not held.done()
        assert mock.request_count == 1
        status = await server.resume()
        assert not status.paused and status.epoch == 1
        assert await asyncio.wait_for(held, 30) == "echo: held"
        await server.pause("reject", retry_after=7)
        with pytest.raises(openai.RateLimitError) as info:
            await ask(c, "rejected")
        assert info.value.response.headers["retry-after"] == "7"
        await server.resume()
        assert await ask(c, "after") == "echo: after"
        await c.close()
    epochs = [(call.request["messages"][0]["content"], call.epoch) for call in session.trace().calls]
    assert epochs == [("before", 0), ("held", 1), ("after", 2)]


async def test_limits_stop_the_rollout(server, mock) -> None:
    session = intercept.Session(id="l", model="m", upstream=mock.base_url, limits={"max_turns": 2})
    async with server.acquire(session) as slot:
        c = client(slot)
        await ask(c)
        await ask(c)
        with pytest.raises(openai.BadRequestError, match="rollout stopped: max_turns"):
            await ask(c)
        await c.close()
    assert session.stop_condition == "max_turns"
    assert session.totals().turns == 2
    assert session.calls == 2


async def test_stop_with_calls_in_flight_records_them(mock) -> None:
    mock.push_hang()
    session = intercept.Session(id="s", model="m", upstream=mock.base_url)
    ic = intercept.Server(shutdown_grace=0.2)
    await ic.start()
    slot = await ic.acquire(session)
    c = client(slot)
    call = asyncio.create_task(ask(c))
    await asyncio.wait_for(mock.wait_for_requests(1), 30)
    await asyncio.wait_for(ic.stop(), 30)
    with pytest.raises(openai.APIError):
        await asyncio.wait_for(call, 30)
    assert [r.error.kind for r in session.trace().calls if r.error] == ["cancelled"]
    await c.close()


async def test_a_tunnel_failure_report_on_a_slot_without_a_tunnel_changes_nothing(server, mock) -> None:
    """A server reached without a tunnel has no tunnel to declare dead: the report is
    not recognised, the slot keeps working. (The Prime backend's recognition and the
    pool's re-mint are tested in Rust against the mock Prime service.)"""
    session = intercept.Session(id="report", model="m", upstream=mock.base_url)
    async with server.acquire(session) as slot:
        assert not slot.report_tunnel_failure("404 Tunnel not found or no longer active")
        assert not slot.endpoint_lost
        with pytest.raises(TypeError, match="text: expected a str"):
            slot.report_tunnel_failure(None)  # type: ignore[arg-type]
        c = client(slot)
        assert await ask(c, "still") == "echo: still"
        await c.close()
    assert not slot.report_tunnel_failure("404 Tunnel not found or no longer active")
