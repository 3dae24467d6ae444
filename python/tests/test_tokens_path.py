"""Token-in/token-out end to end: the official SDKs through `intercept.Session(tokens=...)`
against the mock engine, and the engine receives exactly the ids of the reference,
`renderers` 0.1.12's `Qwen3Renderer` on Qwen3's real tokenizer: rendered on the first turn,
bridged from the exact previous ids on a tool result, rendered again on a new user query.

Needs `renderers` and Qwen3's tokenizer (`INTERCEPT_QWEN3_TOKENIZER`): skipped without
them, failed without the tokenizer when `CI` is set.
"""

from __future__ import annotations

import json
import os
from typing import Any

import anthropic
import openai
import pytest

pytest.importorskip("renderers")

from renderers.base import load_tokenizer  # noqa: E402
from renderers.configs import Qwen3RendererConfig  # noqa: E402
from renderers.qwen3 import Qwen3Renderer  # noqa: E402

import intercept  # noqa: E402
from intercept.testing import MockUpstream  # noqa: E402

GENERATE = "/inference/v1/generate"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "opts": {"type": "object"}}, "required": ["city"]},
        },
    }
]


def tokenizer_dir() -> str:
    folder = os.environ.get("INTERCEPT_QWEN3_TOKENIZER")
    if folder:
        return folder
    if os.environ.get("CI"):
        pytest.fail("INTERCEPT_QWEN3_TOKENIZER must name Qwen3's tokenizer folder under CI")
    pytest.skip("INTERCEPT_QWEN3_TOKENIZER is not set")


_REFERENCE: dict[bool, Qwen3Renderer] = {}


def reference(thinking: bool = True) -> Qwen3Renderer:
    if thinking not in _REFERENCE:
        _REFERENCE[thinking] = Qwen3Renderer(load_tokenizer(tokenizer_dir()), Qwen3RendererConfig(enable_thinking=thinking))
    return _REFERENCE[thinking]


async def rollout(mock: MockUpstream, thinking: bool = True) -> tuple[intercept.Server, intercept.Session, Any]:
    server = intercept.Server(shutdown_grace=5)
    await server.start()
    session = intercept.Session(
        id=f"tito-{thinking}",
        model="policy",
        upstream={"base_url": mock.base_url},
        tokens={"renderer": "qwen3", "tokenizer": tokenizer_dir(), "enable_thinking": thinking},
    )
    slot = await server.acquire(session)
    return server, session, slot


def engine_ids(mock: MockUpstream) -> list[list[int]]:
    return [list(b["token_ids"]) for b in mock.bodies(GENERATE)]


async def test_an_openai_sdk_tool_loop_sends_the_engine_the_references_ids() -> None:
    mock = await MockUpstream.start(tokenizer=tokenizer_dir())
    server, session, slot = await rollout(mock)
    ref = reference()
    try:
        client = openai.AsyncOpenAI(base_url=slot.openai_base_url, api_key=slot.model_secret, max_retries=0, timeout=120)
        async with client:
            messages: list[dict[str, Any]] = [
                {"role": "system", "content": "You are helpful."},
                {"role": "user", "content": "Weather in Paris and Lyon? Ünïcödé 🌧 天気"},
            ]
            args = json.dumps({"city": "Paris", "opts": {"units": ["c", "f"], "deep": {"n": 1.5, "ok": True}}})
            mock.push_completion("Checking.", reasoning="Two cities: call twice.", tool_calls=[("get_weather", args), ("get_weather", '{"city": "Lyon"}')])
            first = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
            message = first.choices[0].message
            assert first.choices[0].finish_reason == "tool_calls"
            assert message.content == "Checking."
            assert [c.function.name for c in message.tool_calls or []] == ["get_weather", "get_weather"]
            prompt1 = ref.render_ids(messages, tools=TOOLS, add_generation_prompt=True)
            assert engine_ids(mock) == [prompt1]

            # The tool results: bridged from the exact ids of turn 1.
            messages.append(message.model_dump(exclude_none=True, exclude={"reasoning_content"}))
            results = [{"role": "tool", "tool_call_id": c.id, "content": f"sunny in {i}"} for i, c in enumerate(message.tool_calls or [])]
            messages.extend(results)
            mock.push_completion("Sunny in both.")
            second = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
            assert second.choices[0].message.content == "Sunny in both."
            completion1 = session.trace().calls[0].completion_token_ids
            assert completion1 is not None
            bridged = ref.bridge_to_next_turn(prompt1, completion1, results, tools=TOOLS)
            assert bridged is not None
            assert engine_ids(mock)[1] == bridged.token_ids

            # A new user query, streamed: thinking retention re-renders the conversation.
            messages.append({"role": "assistant", "content": "Sunny in both."})
            messages.append({"role": "user", "content": "Thanks!"})
            mock.push_completion("You're welcome.", reasoning="Polite.")
            text = ""
            stream = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True)  # type: ignore[arg-type]
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
            assert text == "You're welcome."
            assert engine_ids(mock)[2] == ref.render_ids(messages, tools=TOOLS, add_generation_prompt=True)

        calls = session.trace().calls
        assert [c.token_path for c in calls] == ["rendered", "bridged", "rendered"]
        assert [c.token_reason for c in calls] == ["first_turn", None, "thinking_retention"]
        for call, sent in zip(calls, engine_ids(mock)):
            assert call.prompt_token_ids == sent
            assert call.completion_token_ids and call.completion_logprobs
            assert len(call.completion_logprobs) == len(call.completion_token_ids)
    finally:
        await slot.release()
        await server.stop()
        await mock.shutdown()


async def test_responses_and_anthropic_sdks_send_the_references_ids() -> None:
    mock = await MockUpstream.start(tokenizer=tokenizer_dir())
    server, session, slot = await rollout(mock, thinking=False)
    ref = reference(thinking=False)
    try:
        conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]
        mock.push_completion("Hi!")
        oa = openai.AsyncOpenAI(base_url=slot.openai_base_url, api_key=slot.model_secret, max_retries=0, timeout=120)
        async with oa:
            text = ""
            async with oa.responses.stream(model="m", instructions="Be brief.", input="Say hi.") as stream:
                async for event in stream:
                    if event.type == "response.output_text.delta":
                        text += event.delta
            assert text == "Hi!"
        assert engine_ids(mock)[0] == ref.render_ids(conversation, add_generation_prompt=True)

        mock.push_completion("Hello!")
        an = anthropic.AsyncAnthropic(base_url=slot.env["ANTHROPIC_BASE_URL"], api_key=slot.model_secret, max_retries=0, timeout=120)
        async with an:
            reply = await an.messages.create(model="m", max_tokens=64, system="Be brief.", messages=[{"role": "user", "content": "Say hi."}])
        assert reply.content[0].type == "text" and reply.content[0].text == "Hello!"
        assert reply.stop_reason == "end_turn"
        assert engine_ids(mock)[1] == ref.render_ids(conversation, add_generation_prompt=True)
        assert mock.bodies(GENERATE)[1]["sampling_params"]["max_tokens"] == 64
    finally:
        await slot.release()
        await server.stop()
        await mock.shutdown()
