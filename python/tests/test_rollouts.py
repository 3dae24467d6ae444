"""Many concurrent rollouts through the official SDKs, each trace holding exactly its own calls."""

from __future__ import annotations

import asyncio

import json
import urllib.error
import urllib.request

import anthropic
import openai

import intercept

ROLLOUTS = 200


async def chat(env: dict[str, str], marker: str) -> list[str]:
    client = openai.AsyncOpenAI(base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"], max_retries=0, timeout=180)
    async with client:
        messages = [{"role": "user", "content": f"{marker} one"}]
        first = await client.chat.completions.create(model="ignored", messages=messages)
        messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": f"{marker} two"}]
        second = await client.chat.completions.create(model="ignored", messages=messages)
        return [first.choices[0].message.content or "", second.choices[0].message.content or ""]


async def chat_stream(env: dict[str, str], marker: str) -> list[str]:
    client = openai.AsyncOpenAI(base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"], max_retries=0, timeout=180)
    out = []
    async with client:
        for turn in ("one", "two"):
            text = ""
            stream = await client.chat.completions.create(model="ignored", messages=[{"role": "user", "content": f"{marker} {turn}"}], stream=True)
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
            out.append(text)
    return out


async def responses(env: dict[str, str], marker: str) -> list[str]:
    client = openai.AsyncOpenAI(base_url=env["OPENAI_BASE_URL"], api_key=env["OPENAI_API_KEY"], max_retries=0, timeout=180)
    async with client:
        first = await client.responses.create(model="ignored", input=f"{marker} one")
        text = ""
        async with client.responses.stream(model="ignored", input=f"{marker} two") as stream:
            async for event in stream:
                if event.type == "response.output_text.delta":
                    text += event.delta
        return [first.output_text, text]


async def messages(env: dict[str, str], marker: str) -> list[str]:
    client = anthropic.AsyncAnthropic(base_url=env["ANTHROPIC_BASE_URL"], api_key=env["ANTHROPIC_API_KEY"], max_retries=0, timeout=180)
    async with client:
        first = await client.messages.create(model="ignored", max_tokens=64, messages=[{"role": "user", "content": f"{marker} one"}])
        text = ""
        async with client.messages.stream(model="ignored", max_tokens=64, messages=[{"role": "user", "content": f"{marker} two"}]) as stream:
            async for piece in stream.text_stream:
                text += piece
        return [first.content[0].text, text]  # type: ignore[union-attr]


HARNESSES = [chat, chat_stream, responses, messages]
DIALECTS = {chat: "chat_completions", chat_stream: "chat_completions", responses: "responses", messages: "messages"}


async def test_200_concurrent_rollouts_each_trace_holds_its_own_calls(mock) -> None:
    async with intercept.ElasticPool(multiplex=32) as ic:
        sessions = [
            intercept.Session(id=f"rollout-{i}", model=f"policy-{i % 3}", upstream=mock.base_url, sampling={"temperature": 0.5 + i % 3 / 10})
            for i in range(ROLLOUTS)
        ]

        async def rollout(i: int) -> list[str]:
            async with ic.acquire(sessions[i]) as slot:
                assert ic.load >= 1
                return await HARNESSES[i % 4](slot.env, f"marker-{i}")

        replies = await asyncio.gather(*(rollout(i) for i in range(ROLLOUTS)))
        assert ic.load == 0
        servers = await ic.servers()
        assert len(servers) >= ROLLOUTS // 32

    for i, (session, reply) in enumerate(zip(sessions, replies)):
        assert reply == [f"echo: marker-{i} one", f"echo: marker-{i} two"], (i, reply)
        trace = session.trace()
        assert session.status == "released"
        assert trace.id == f"rollout-{i}"
        assert len(trace.calls) == 2, (i, trace.calls)
        for call, turn in zip(sorted(trace.calls, key=lambda c: c.seq), ("one", "two")):
            assert call.ok, call.error
            assert call.session == f"rollout-{i}"
            assert call.model == f"policy-{i % 3}"
            assert call.request["model"] == f"policy-{i % 3}"
            assert call.dialect == DIALECTS[HARNESSES[i % 4]]
            assert f"marker-{i} {turn}" in str(call.request)
            # no other rollout's marker anywhere in this call
            assert f"marker-{i} " in str(call.request) and all(
                f"marker-{j} " not in str(call.request) for j in (i - 1, i + 1) if 0 <= j < ROLLOUTS
            )
            assert call.usage.completion_tokens > 0
        assert trace.calls[0].stream is (HARNESSES[i % 4] is chat_stream)


def post(url: str, body: bytes, key: str) -> tuple[int, dict[str, str], dict]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"authorization": f"Bearer {key}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read())


async def test_raw_http_gets_dialect_errors(server, mock) -> None:
    session = intercept.Session(id="raw", model="m", upstream=mock.base_url)
    async with server.acquire(session) as slot:
        url = slot.openai_base_url + "/chat/completions"
        status, headers, body = await asyncio.to_thread(post, url, b"{}", "nope")
        assert status == 401
        assert headers["x-intercept-error"] == "client"
        assert "unauthorized" in body["error"]["message"]
        status, headers, body = await asyncio.to_thread(post, url, b"{not json", slot.model_secret)
        assert status == 400
        assert body["error"]["message"]
    assert session.calls == 0
