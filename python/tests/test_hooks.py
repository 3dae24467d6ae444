"""Python hooks: a request hook that rewrites, a response hook that rewrites, hooks that stop, hooks that fail."""

from __future__ import annotations

import openai
import pytest

import intercept
from test_lifecycle import ask, client


async def test_request_hook_rewrites_async_and_sees_call_info(server, mock) -> None:
    seen: list[intercept.CallInfo] = []

    async def on_request(body: dict, call: intercept.CallInfo) -> dict:
        seen.append(call)
        assert body["model"] == "policy"  # after the model was imposed
        body = dict(body)
        body["messages"] = [{"role": "user", "content": "rewritten " + body["messages"][-1]["content"]}]
        return body

    session = intercept.Session(id="h1", model="policy", upstream=mock.base_url, on_request=on_request)
    async with server.acquire(session) as slot:
        c = client(slot)
        assert await ask(c, "hello") == "echo: rewritten hello"
        assert await ask(c, "again", stream=True) == "echo: rewritten again"
        await c.close()
    calls = session.trace().calls
    assert [c.request["messages"][0]["content"] for c in calls] == ["rewritten hello", "rewritten again"]
    assert [(i.dialect, i.stream, i.seq, i.session) for i in seen] == [("chat_completions", False, 0, "h1"), ("chat_completions", True, 1, "h1")]


async def test_sync_hook_editing_in_place_and_response_hook_rewriting(server, mock) -> None:
    def on_request(body: dict) -> None:
        body["messages"][-1]["content"] = body["messages"][-1]["content"].upper()

    def on_response(response: dict) -> dict:
        response["choices"][0]["message"]["content"] = "redacted"
        return response

    session = intercept.Session(id="h2", model="m", upstream=mock.base_url, on_request=on_request, on_response=on_response)
    async with server.acquire(session) as slot:
        c = client(slot)
        assert await ask(c, "quiet") == "redacted"
        assert await ask(c, "streamed", stream=True) == "redacted"
        await c.close()
    calls = session.trace().calls
    assert calls[0].request["messages"][0]["content"] == "QUIET"
    assert calls[0].response["choices"][0]["message"]["content"] == "echo: QUIET"  # the record keeps what the upstream said


async def test_request_hook_that_stops(server, mock) -> None:
    async def on_request(body: dict) -> intercept.Stop | None:
        if "enough" in body["messages"][-1]["content"]:
            return intercept.Stop("said_enough")
        return None

    session = intercept.Session(id="h3", model="m", upstream=mock.base_url, on_request=on_request)
    async with server.acquire(session) as slot:
        c = client(slot)
        assert await ask(c, "go on") == "echo: go on"
        with pytest.raises(openai.BadRequestError, match="rollout stopped: said_enough"):
            await ask(c, "that is enough")
        with pytest.raises(openai.BadRequestError, match="rollout stopped: said_enough"):
            await ask(c, "more")
        await c.close()
    assert session.stop_condition == "said_enough"
    assert session.calls == 1
    assert mock.request_count == 1


async def test_response_hook_that_stops(server, mock) -> None:
    session = intercept.Session(id="h4", model="m", upstream=mock.base_url, on_response=lambda r: intercept.Stop("judged"))
    async with server.acquire(session) as slot:
        c = client(slot)
        with pytest.raises(openai.BadRequestError, match="rollout stopped: judged"):
            await ask(c, "x")
        await c.close()
    assert session.stop_condition == "judged"
    assert session.calls == 1  # the exchange happened and is recorded


@pytest.mark.parametrize(
    "hook, message",
    [
        (lambda body: 1 / 0, "raised ZeroDivisionError"),
        (lambda body: ["not", "a", "dict"], "returned a list"),
        (lambda body: {"x": {1, 2}}, "cannot be sent"),
    ],
)
async def test_failing_hooks_are_hook_failed_errors(server, mock, hook, message) -> None:
    session = intercept.Session(id="h5", model="m", upstream=mock.base_url, on_request=hook)
    async with server.acquire(session) as slot:
        c = client(slot)
        with pytest.raises(openai.APIStatusError) as info:
            await ask(c, "x")
        assert info.value.status_code == 502
        assert "on_request" in info.value.message and message in info.value.message
        assert info.value.response.headers["x-intercept-error"] == "internal"
        await c.close()
    assert mock.request_count == 0


async def test_hook_rewrites_in_the_sync_facade(mock) -> None:
    from intercept import sync

    session = intercept.Session(id="h6", model="m", upstream=mock.base_url, on_request=lambda b: {**b, "messages": [{"role": "user", "content": "sync"}]})

    def run() -> str:
        with sync.Server() as ic:
            with ic.acquire(session) as slot:
                c = openai.OpenAI(base_url=slot.env["OPENAI_BASE_URL"], api_key=slot.env["OPENAI_API_KEY"], max_retries=0, timeout=60)
                r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "a"}])
                c.close()
                return r.choices[0].message.content or ""

    import asyncio

    assert await asyncio.to_thread(run) == "echo: sync"
    assert session.status == "released" and session.calls == 1


async def test_hook_headers_reach_the_hook_and_a_hook_can_answer_400(server, mock) -> None:
    seen: list[dict[str, str]] = []

    def on_request(body: dict, call: intercept.CallInfo) -> None:
        seen.append(call.headers)
        if call.headers.get("x-request-tag") == "refuse":
            raise intercept.InvalidRequestError("x-request-tag: refused by the hook")

    session = intercept.Session(id="h-headers", model="m", upstream=mock.base_url, on_request=on_request, hook_headers=["X-Request-Tag"])
    async with server.acquire(session) as slot:
        c = client(slot)
        r = await c.chat.completions.create(model="x", messages=[{"role": "user", "content": "a"}], extra_headers={"X-Request-Tag": "t-1"})
        assert r.choices[0].message.content == "echo: a"
        assert await ask(c, "b") == "echo: b"
        with pytest.raises(openai.BadRequestError, match="x-request-tag: refused by the hook") as refused:
            await c.chat.completions.create(model="x", messages=[{"role": "user", "content": "c"}], extra_headers={"X-Request-Tag": "refuse"})
        assert refused.value.status_code == 400
        await c.close()
    assert seen == [{"x-request-tag": "t-1"}, {}, {"x-request-tag": "refuse"}]
    assert session.calls == 2 and mock.request_count == 2  # the refused call went nowhere
    # Credentials never reach a hook.
    with pytest.raises(intercept.InvalidRequestError, match="secret"):
        intercept.Session(id="h-auth", model="m", upstream=mock.base_url, hook_headers=["Authorization"])
