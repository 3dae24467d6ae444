"""`renderers`' own generate client (what verifiers' train client calls) against the
mock's POST /inference/v1/generate, over three turns of a Qwen3 conversation.

Run by `tests/generate.rs` as `python renderers_generate.py <base_url> <tokenizer folder>`
with three replies queued on the mock: reasoning plus two tool calls, the echo, and a raw
completion whose tool call is broken JSON. Prints what it saw as one JSON line; an
assertion that fails exits non-zero.
"""

import asyncio
import json
import sys

from openai import AsyncOpenAI
from renderers.base import ToolCallParseStatus, load_tokenizer
from renderers.client import generate
from renderers.qwen3 import Qwen3Renderer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a time zone.",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"type": "string"}},
                "required": ["tz"],
            },
        },
    },
]


async def main(base_url: str, tokenizer_dir: str) -> None:
    renderer = Qwen3Renderer(load_tokenizer(tokenizer_dir))
    client = AsyncOpenAI(base_url=base_url, api_key="sk-mock")
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather and time in Paris?"},
    ]

    # Turn 1: the scripted reasoning and two parallel calls parse back as they were.
    first = await generate(
        client=client,
        renderer=renderer,
        messages=messages,
        model="mock-model",
        tools=TOOLS,
        sampling_params={"max_tokens": 512, "temperature": 0.7},
    )
    assert first["reasoning_content"] == "Two lookups.", first
    assert first["content"] == "", first
    calls = [(c.name, c.arguments, c.status) for c in first["tool_calls"]]
    assert calls == [
        ("get_weather", {"city": "Paris"}, ToolCallParseStatus.OK),
        ("get_time", {"tz": "Europe/Paris"}, ToolCallParseStatus.OK),
    ], calls
    # The client promotes `stop` to `tool_calls` when a call parsed.
    assert first["finish_reason"] == "tool_calls", first["finish_reason"]
    assert first["completion_ids"][-1] == renderer.get_stop_token_ids()[0]
    assert len(first["completion_logprobs"]) == len(first["completion_ids"])
    assert first["request_id"].startswith("generate-tokens-"), first["request_id"]

    # Turn 2: the bridge extends turn 1's ids with the tool results; the echo answers.
    new_messages = [
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "12:00"},
    ]
    bridged = renderer.bridge_to_next_turn(
        first["prompt_ids"], first["completion_ids"], new_messages, tools=TOOLS
    )
    assert bridged is not None, "the bridge declined"
    second = await generate(
        client=client,
        renderer=renderer,
        messages=messages + new_messages,
        model="mock-model",
        prompt_ids=bridged.token_ids,
        prompt_attribution=bridged,
        tools=TOOLS,
        sampling_params={"max_tokens": 512},
    )
    assert second["content"] == "tool said: sunny\n12:00", second["content"]
    assert second["tool_calls"] == [], second["tool_calls"]
    assert second["finish_reason"] == "stop", second["finish_reason"]

    # Turn 3: a broken call is reported as such, and `stop` stays `stop`.
    third = await generate(
        client=client,
        renderer=renderer,
        messages=[{"role": "user", "content": "again"}],
        model="mock-model",
        tools=TOOLS,
    )
    statuses = [c.status for c in third["tool_calls"]]
    assert statuses == [ToolCallParseStatus.INVALID_JSON], statuses
    assert third["finish_reason"] == "stop", third["finish_reason"]

    print(
        json.dumps(
            {
                "first_prompt_ids": first["prompt_ids"],
                "first_completion_ids": first["completion_ids"],
                "second_prompt_ids": second["prompt_ids"],
                "second_completion_ids": second["completion_ids"],
                "third_prompt_ids": third["prompt_ids"],
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
