"""A session that generates its answers (`NativeSession.set_generate_hook`): the hook's
chat completion is served (JSON, and the dialect's stream made from it), its token ids are
recorded, its exceptions keep their meaning (400, an engine's status, 502), and a release
mid-call cancels it on its loop."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

import intercept
from test_lifecycle import ask, client

# Nothing listens there: a generating session never calls its upstream.
NOWHERE = "http://127.0.0.1:9/v1"


def completion(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-gen",
        "object": "chat.completion",
        "created": 1,
        "model": "policy",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


class Status(Exception):
    """An engine error as verifiers' `ProviderError` carries it."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


def generating(sid: str, hook: Any) -> intercept.Session:
    session = intercept.Session(id=sid, model="policy", upstream=NOWHERE)
    session._native.set_generate_hook(hook, asyncio.get_running_loop())
    return session


async def test_generated_answers_are_served_and_recorded_with_their_tokens(server) -> None:
    seen: list[tuple[str, intercept.CallInfo]] = []

    async def generate(body: dict[str, Any], call: intercept.CallInfo) -> dict[str, Any]:
        seen.append((body["messages"][-1]["content"], call))
        n = len(seen)
        return {
            "response": completion(f"made {n}"),
            "tokens": {
                "prompt_ids": [1, 2, 3 + n],
                "completion_ids": [7, 8],
                "logprobs": [-0.5, -0.25],
                "path": "rendered" if n == 1 else "bridged",
                "reason": "first_turn" if n == 1 else None,
            },
        }

    session = generating("g1", generate)
    async with server.acquire(session) as slot:
        c = client(slot)
        assert await ask(c, "hello") == "made 1"
        assert await ask(c, "again", stream=True) == "made 2"
        await c.close()
    assert [(text, call.dialect, call.stream, call.seq) for text, call in seen] == [
        ("hello", "chat_completions", False, 0),
        ("again", "chat_completions", True, 1),
    ]
    calls = session.trace().calls
    assert [c.token_capture for c in calls] == ["captured", "captured"]
    assert [c.prompt_token_ids for c in calls] == [[1, 2, 4], [1, 2, 5]]
    assert [c.completion_token_ids for c in calls] == [[7, 8], [7, 8]]
    assert [c.completion_logprobs for c in calls] == [[-0.5, -0.25], [-0.5, -0.25]]
    assert [(c.token_path, c.token_reason) for c in calls] == [("rendered", "first_turn"), ("bridged", None)]
    assert calls[0].response["choices"][0]["message"]["content"] == "made 1"


async def test_generate_errors_keep_their_meaning(server) -> None:
    async def generate(body: dict[str, Any], call: intercept.CallInfo) -> dict[str, Any]:
        text = body["messages"][-1]["content"]
        if text == "invalid":
            raise intercept.InvalidRequestError("use another client")
        if text == "engine":
            raise Status("engine overloaded", 503)
        if text == "bad status":
            raise Status("odd", 200)
        if text == "shape":
            return {"tokens": None}
        raise RuntimeError("renderer broke")

    session = generating("g2", generate)
    async with server.acquire(session) as slot:
        c = client(slot)
        with pytest.raises(openai.BadRequestError, match="use another client"):
            await ask(c, "invalid")
        with pytest.raises(openai.APIStatusError, match="engine overloaded") as e:
            await ask(c, "engine")
        assert e.value.status_code == 503
        for text, needle in [("other", "RuntimeError: renderer broke"), ("bad status", "status 200"), ("shape", "return {'response'")]:
            with pytest.raises(openai.APIStatusError, match=needle) as e:
                await ask(c, text)
            assert e.value.status_code == 502
        await c.close()
    calls = session.trace().calls
    assert [(c.status, c.error.kind if c.error else None) for c in calls] == [
        (400, "invalid_request"),
        (503, "upstream_status"),
        (502, "hook_failed"),
        (502, "hook_failed"),
        (502, "hook_failed"),
    ]
    assert all(c.token_capture == "off" for c in calls)


async def test_a_release_mid_call_cancels_the_generation(server) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def generate(body: dict[str, Any], call: intercept.CallInfo) -> dict[str, Any]:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("unreachable")

    session = generating("g3", generate)
    slot = await server.acquire(session)
    c = client(slot)
    call = asyncio.create_task(ask(c, "hang"))
    await asyncio.wait_for(started.wait(), 30)
    await asyncio.wait_for(slot.release(), 30)
    await asyncio.wait_for(cancelled.wait(), 30)
    with pytest.raises(openai.APIError):
        await asyncio.wait_for(call, 30)
    await c.close()
    calls = session.trace().calls
    assert len(calls) == 1 and calls[0].error is not None and calls[0].error.kind == "cancelled"
