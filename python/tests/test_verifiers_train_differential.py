"""Training through intercept, differentially: the same rollouts with verifiers' train
client (`TrainClientConfig`: Qwen3's renderer from `renderers`, the engine's
`POST /inference/v1/generate`) run once through verifiers' own interception server and
once through `intercept.verifiers`, against intercept's mock engine with Qwen3's real
tokenizer (one engine per side, the same script on each). What prime-rl trains on must
agree token for token: every branch's `token_ids`, `sampled_mask` and spread logprobs,
every node's ids, mask, logprobs and content flags, and the turns, calls, replies and
stop conditions. The engines must have been sent the same requests, and intercept's own
record must hold the ids the engine saw and sampled.

Two harnesses: verifiers' `Rollout` running a program on the official `openai` SDK (as
the eval differential does), and the `openai` SDK in-process on the slot verifiers'
`acquire` yields.

Needs verifiers, `renderers` and Qwen3's tokenizer (`INTERCEPT_QWEN3_TOKENIZER`): skipped
without them, failed without the tokenizer when `CI` is set.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai
import pytest

pytest.importorskip("verifiers.v1.clients.train")
pytest.importorskip("renderers")

from verifiers.v1.interception import InterceptionServer as VerifiersServer  # noqa: E402

import intercept.verifiers as iv  # noqa: E402
from conftest import until  # noqa: E402
from intercept.testing import MockUpstream  # noqa: E402
from vf_support import normal  # noqa: E402
from vf_train import TRAIN_TOOLS, make_train_session, program_output, qwen3_tokenizer, run_train_rollout, tokens_of  # noqa: E402

# One event loop for the module: `renderers`' client keeps a process-wide asyncio lock
# (its engine context-length lookup), bound to the first loop that waits on it.
pytestmark = pytest.mark.asyncio(loop_scope="module")

GENERATE = "/inference/v1/generate"
NESTED = json.dumps({"query": {"city": "Paris", "filters": {"year": [2020, 2021], "exact": True, "tags": ["capital", "EU"]}}, "limit": 3})


@dataclass
class Case:
    """One rollout: the harness mode and prompt, the renderer's `enable_thinking`, the
    sampling's `max_tokens`, and the engine's script (a call of `push_*` per answer)."""

    name: str
    mode: str
    prompt: str
    script: list[Callable[[MockUpstream], None]]
    turns: int = 3
    thinking: bool = True
    max_tokens: int | None = None
    check: Callable[[dict[str, Any], dict[str, Any], dict[str, Any]], None] = field(default=lambda n, t, p: None)


def said(content: str | None = None, **kw: Any) -> Callable[[MockUpstream], None]:
    return lambda m: m.push_completion(content, **kw)


def failed(status: int, message: str) -> Callable[[MockUpstream], None]:
    return lambda m: m.push_error(status, message)


def paths(n: dict[str, Any]) -> list[str]:
    return [c["finish_reason"] for c in n["calls"]]


def check_tool_loop(n: dict[str, Any], t: dict[str, Any], p: dict[str, Any]) -> None:
    calls = p["replies"][0]["tool_calls"]
    assert calls == [["lookup", json.loads(NESTED)]], calls
    assert any(m["role"] == "tool" and m["content"].startswith("found ") for m in n["messages"])
    assert paths(n) == ["tool_calls", "stop", "stop"]


def check_bridged_chain(n: dict[str, Any], t: dict[str, Any], p: dict[str, Any]) -> None:
    # Reasoning off: the new user queries bridge, one branch holds every turn.
    assert len(t["branches"]) == 1 and sum(t["branches"][0]["sampled_mask"]) > 0
    assert n["num_turns"] == 3


def check_rerender(n: dict[str, Any], t: dict[str, Any], p: dict[str, Any]) -> None:
    # Reasoning on: at a new user query the bridge declines (thinking retention) and the
    # whole conversation is rendered, a new branch.
    assert len(t["branches"]) >= 2, len(t["branches"])


def check_truncated(n: dict[str, Any], t: dict[str, Any], p: dict[str, Any]) -> None:
    assert paths(n)[0] == "length" and p["replies"][0]["finish"] == "length"
    assert n["num_turns"] == 2


def check_parallel(n: dict[str, Any], t: dict[str, Any], p: dict[str, Any]) -> None:
    assert [c[0] for c in p["replies"][0]["tool_calls"]] == ["add", "lookup"]
    tools = [m for m in n["messages"] if m["role"] == "tool"]
    assert len(tools) == 2 and tools[0]["content"] == "5"


def check_retried(n: dict[str, Any], t: dict[str, Any], p: dict[str, Any]) -> None:
    assert [c["error"] for c in n["calls"]] == [None, ("ProviderError", 503), None, None]
    assert n["stop_condition"] == "agent_completed"


def check_fatal(n: dict[str, Any], t: dict[str, Any], p: dict[str, Any]) -> None:
    assert [c["error"] for c in n["calls"]] == [None, ("ProviderError", 400)]
    assert n["stop_condition"] == "provider_error"
    assert p["error"][:2] == ["BadRequestError", 400], p


CASES = [
    Case(
        "tool loop, nested arguments, reasoning sent back",
        "tools",
        "keep: how many people live in Paris?",
        [
            said(reasoning="I should look it up.", tool_calls=[("lookup", NESTED)]),
            said("About 2.1 million people.", reasoning="The tool answered."),
            said("Glad to help.", reasoning="Wrap up."),
        ],
        check=check_tool_loop,
    ),
    Case(
        "tool loop, streamed, reasoning dropped",
        "tools-stream",
        "how many people live in Paris?",
        [
            said(reasoning="I should look it up.", tool_calls=[("lookup", NESTED)]),
            said("About 2.1 million people.", reasoning="The tool answered."),
            said("Glad to help.", reasoning="Wrap up."),
        ],
        check=check_tool_loop,
    ),
    Case(
        "reasoning off: new user queries bridge",
        "chat",
        "keep: tell me about tokens",
        [said("Tokens are ids."), said("They come from a tokenizer."), said("That is all.")],
        thinking=False,
        check=check_bridged_chain,
    ),
    Case(
        "reasoning on: a new user query is rendered whole",
        "chat-stream",
        "keep: tell me about tokens",
        [said("Tokens are ids.", reasoning="Simple."), said("From a tokenizer.", reasoning="Still simple."), said("Done.", reasoning="End.")],
        check=check_rerender,
    ),
    Case(
        "a truncated completion (max_tokens), then a new query",
        "chat",
        "keep: write a long story",
        [said("Once upon a time there was a very long story that never seemed to end at all."), said("Fine.")],
        turns=2,
        thinking=False,
        max_tokens=12,
        check=check_truncated,
    ),
    Case(
        "parallel tool calls",
        "tools",
        "keep: add and look up",
        [
            said(tool_calls=[("add", json.dumps({"a": 2, "b": 3})), ("lookup", json.dumps({"query": {"city": "Rome"}}))]),
            said("Five, and Rome was found."),
            said("Bye."),
        ],
        thinking=False,
        check=check_parallel,
    ),
    Case(
        "an engine error the SDK retries",
        "chat",
        "keep: hello",
        [said("Hi."), failed(503, "engine overloaded"), said("Hello again."), said("Bye.")],
        thinking=False,
        check=check_retried,
    ),
    Case(
        "an engine error the harness dies of",
        "chat",
        "keep: hello",
        [said("Hi."), failed(400, "prompt rejected by the engine")],
        thinking=False,
        check=check_fatal,
    ),
]


async def engines(tokenizer: str, n: int) -> list[MockUpstream]:
    return [await MockUpstream.start(tokenizer=tokenizer) for _ in range(n)]


def scripted(m: MockUpstream, case: Case) -> MockUpstream:
    for step in case.script:
        step(m)
    return m


def sequences(episode: Any) -> list[tuple[list[int], list[bool], list[float]]]:
    """intercept's episode as training samples: for each sampled node with ids, the
    sequence from the nearest `token_start` at or above it; the ones no later sample
    extends (what verifiers' branches are)."""
    nodes = {n.id: n for n in episode.nodes}
    seqs = []
    for node in episode.nodes:
        if not node.sampled or node.token_ids is None:
            continue
        parts, at = [], node
        while True:
            if at.token_ids is not None:
                parts.append(at)
                if at.token_start:
                    break
            if at.parent is None:
                break
            at = nodes[at.parent]
        ids: list[int] = []
        mask: list[bool] = []
        logprobs: list[float] = []
        for part in reversed(parts):
            ids += part.token_ids or []
            mask += part.mask or []
            logprobs += part.logprobs or [0.0] * len(part.token_ids or [])
        seqs.append((ids, mask, logprobs))
    return [s for s in seqs if not any(o is not s and len(o[0]) > len(s[0]) and o[0][: len(s[0])] == s[0] for o in seqs)]


def check_intercept_record(session: Any, engine: MockUpstream, theirs: dict[str, Any]) -> None:
    """intercept's own record: each generated call holds the ids the engine was sent and
    sampled, and its episode's samples are verifiers' branches."""
    ours = iv.intercept_session(session)
    assert ours is not None
    sent = engine.bodies(GENERATE)
    assert len(sent) == len(theirs["calls"])
    answered = [body for body, call in zip(sent, theirs["calls"]) if call["error"] is None]
    calls = [c for c in ours.trace().calls if c.token_capture == "captured"]
    assert len(calls) == len(answered) > 0
    for call, body in zip(calls, answered):
        assert call.prompt_token_ids == body["token_ids"]
        assert call.token_path in ("bridged", "rendered") and (call.token_reason is None) == (call.token_path == "bridged")
        assert len(call.completion_token_ids or []) == len(call.completion_logprobs or []) > 0
    branches = {(tuple(b["token_ids"]), tuple(b["sampled_mask"]), tuple(b["logprobs"])) for b in theirs["tokens"]["branches"] if sum(b["sampled_mask"])}
    samples = {(tuple(i), tuple(m), tuple(round(x, 6) for x in lp)) for i, m, lp in sequences(ours.episode())}
    assert {(i, m, tuple(round(x, 6) for x in lp)) for i, m, lp in branches} == samples


async def test_rollouts_train_token_for_token_as_through_verifiers_own_server() -> None:
    tokenizer = qwen3_tokenizer()
    pairs = [(scripted(a, c), scripted(b, c)) for c in CASES for a, b in [await engines(tokenizer, 2)]]
    try:
        async with VerifiersServer() as theirs, iv.InterceptionServer() as ours:

            async def both(case: Case, a: MockUpstream, b: MockUpstream) -> tuple[Any, Any]:
                kw = {"turns": case.turns, "thinking": case.thinking, "max_tokens": case.max_tokens}
                return await asyncio.gather(
                    run_train_rollout(theirs, a.base_url, tokenizer, case.mode, case.prompt, **kw),
                    run_train_rollout(ours, b.base_url, tokenizer, case.mode, case.prompt, **kw),
                )

            results = await asyncio.gather(*(both(c, a, b) for c, (a, b) in zip(CASES, pairs)))
            assert ours.load == 0
        for case, (a, b), ((t_theirs, _), (t_ours, s_ours)) in zip(CASES, pairs, results):
            n_theirs, n_ours = normal(t_theirs), normal(t_ours)
            tok_theirs, tok_ours = tokens_of(t_theirs), tokens_of(t_ours)
            assert n_theirs == n_ours, f"{case.name}: {json.dumps(n_theirs)}\n!=\n{json.dumps(n_ours)}"
            assert tok_theirs == tok_ours, case.name
            assert program_output(t_theirs) == program_output(t_ours), case.name
            # Both engines were asked the same: ids, sampling, stop ids.
            assert a.bodies(GENERATE) == b.bodies(GENERATE), case.name
            # The cases do what they say (on both sides, since they agree).
            assert tok_theirs["branches"] and all(len(x["token_ids"]) == len(x["sampled_mask"]) == len(x["logprobs"]) for x in tok_theirs["branches"])
            case.check(n_theirs, tok_theirs, program_output(t_theirs))
            check_intercept_record(s_ours, b, {**n_ours, "tokens": tok_ours})
    finally:
        for a, b in pairs:
            await a.shutdown()
            await b.shutdown()


# --- the openai SDK in-process, on the slot verifiers' `acquire` yields ------------------


async def sdk_rollout(ic: Any, session: Any, *, stream: bool, turns: int = 3) -> list[Any]:
    """The harness loop of TRAIN_PROGRAM, with `openai.AsyncOpenAI` on the slot."""
    replies: list[Any] = []
    async with ic.acquire(session) as (base_url, model_secret, _state):
        c = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=model_secret, max_retries=0, timeout=120)
        history: list[dict[str, Any]] = [{"role": "user", "content": "keep: sum, then look up"}]
        for i in range(turns):
            if stream:
                text, reasoning, calls = "", "", {}
                events = await c.chat.completions.create(model="m", messages=history, tools=TRAIN_TOOLS, stream=True)  # type: ignore[arg-type]
                async for chunk in events:
                    for ch in chunk.choices:
                        text += ch.delta.content or ""
                        reasoning += getattr(ch.delta, "reasoning_content", None) or ""
                        for tc in ch.delta.tool_calls or []:
                            calls.setdefault(tc.index, {"id": tc.id, "type": "function", "function": {"name": tc.function.name, "arguments": ""}})  # type: ignore[union-attr]
                            calls[tc.index]["function"]["arguments"] += tc.function.arguments or ""  # type: ignore[union-attr]
                tool_calls = [calls[k] for k in sorted(calls)]
            else:
                r = await c.chat.completions.create(model="m", messages=history, tools=TRAIN_TOOLS)  # type: ignore[arg-type]
                m = r.choices[0].message
                text, reasoning = m.content or "", getattr(m, "reasoning_content", None) or ""
                tool_calls = [{"id": t.id, "type": "function", "function": {"name": t.function.name, "arguments": t.function.arguments}} for t in m.tool_calls or []]  # type: ignore[union-attr]
            replies.append([text, reasoning, [t["function"] for t in tool_calls]])
            kept = {"reasoning_content": reasoning} if reasoning else {}
            if tool_calls:
                history.append({"role": "assistant", "content": text or None, "tool_calls": tool_calls, **kept})
                for t in tool_calls:
                    history.append({"role": "tool", "tool_call_id": t["id"], "content": "tool " + t["function"]["name"]})
                continue
            history += [{"role": "assistant", "content": text, **kept}, {"role": "user", "content": f"continue {i}"}]
        await c.close()
    return replies


SDK_SCRIPT = [
    said(reasoning="Two things to do.", tool_calls=[("add", json.dumps({"a": 2, "b": 3})), ("lookup", NESTED)]),
    said("Five; Paris found.", reasoning="Both answered."),
    said("Anything else?", reasoning="Done."),
]


@pytest.mark.parametrize("stream", [False, True])
async def test_an_openai_sdk_harness_trains_the_same(stream: bool) -> None:
    tokenizer = qwen3_tokenizer()
    a, b = await engines(tokenizer, 2)
    for m in (a, b):
        for step in SDK_SCRIPT:
            step(m)
    try:
        s_theirs = make_train_session(a.base_url, tokenizer, "sdk")
        s_ours = make_train_session(b.base_url, tokenizer, "sdk")
        async with VerifiersServer() as theirs, iv.InterceptionServer() as ours:
            r_theirs, r_ours = await asyncio.gather(sdk_rollout(theirs, s_theirs, stream=stream), sdk_rollout(ours, s_ours, stream=stream))
        assert r_theirs == r_ours and r_theirs[0][2][0]["name"] == "add"
        n_theirs, n_ours = normal(s_theirs.trace), normal(s_ours.trace)
        assert n_theirs == n_ours
        assert tokens_of(s_theirs.trace) == tokens_of(s_ours.trace)
        assert a.bodies(GENERATE) == b.bodies(GENERATE)
        # The tool results bridge; the new user query (reasoning on) is rendered whole.
        assert len(tokens_of(s_theirs.trace)["branches"]) == 2 and n_theirs["num_turns"] == 3
        calls = iv.intercept_session(s_ours).trace().calls  # type: ignore[union-attr]
        assert [(c.token_path, c.token_reason) for c in calls] == [("rendered", "first_turn"), ("bridged", None), ("rendered", "bridge_declined")]
        check_intercept_record(s_ours, b, {**n_ours, "tokens": tokens_of(s_ours.trace)})
    finally:
        await a.shutdown()
        await b.shutdown()


async def test_a_release_mid_call_cancels_the_generation_and_leaves_no_call() -> None:
    tokenizer = qwen3_tokenizer()
    a, b = await engines(tokenizer, 2)
    outcomes: list[Any] = []
    try:
        for ic, engine, key in ((VerifiersServer(), a, "theirs"), (iv.InterceptionServer(), b, "ours")):
            engine.push_completion("first")
            engine.push_hang()
            session = make_train_session(engine.base_url, tokenizer, key)
            async with ic:
                async with ic.acquire(session) as (base_url, model_secret, _state):
                    c = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=model_secret, max_retries=0, timeout=60)
                    first = await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
                    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "again"}]
                    call = asyncio.create_task(c.chat.completions.create(model="m", messages=history))  # type: ignore[arg-type]
                    await until(lambda: len(engine.bodies(GENERATE)) == 2, "the second generation")
                # Released with the generation in flight: the harness's call fails.
                with pytest.raises(openai.APIError):
                    await asyncio.wait_for(call, 60)
                await c.close()
            outcomes.append(session)
        n_theirs, n_ours = (normal(s.trace) for s in outcomes)
        assert n_theirs == n_ours
        assert len(n_theirs["calls"]) == 1 and n_theirs["num_turns"] == 1, "the released call left no ModelCall"
        assert [s.trace.pending for s in outcomes] == [[], []]
        assert tokens_of(outcomes[0].trace) == tokens_of(outcomes[1].trace)
    finally:
        await a.shutdown()
        await b.shutdown()


async def test_other_dialects_and_images_fail_as_in_verifiers_with_an_actionable_answer() -> None:
    """The train client renders Chat Completions only: a Responses or Anthropic call is a
    400 in its dialect's shape naming the client to use (verifiers answers 502 with its
    client's exception; the trace records the same call). A turn with an image takes the
    full render, where Qwen3's renderer refuses it, as in verifiers."""
    tokenizer = qwen3_tokenizer()
    a, b = await engines(tokenizer, 2)
    seen: list[list[Any]] = []
    traces: list[dict[str, Any]] = []
    try:
        for ic, engine, key in ((VerifiersServer(), a, "theirs"), (iv.InterceptionServer(), b, "ours")):
            session = make_train_session(engine.base_url, tokenizer, key)
            out: list[Any] = []
            async with ic, ic.acquire(session) as (base_url, model_secret, _state):
                oa = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=model_secret, max_retries=0)
                an = anthropic.AsyncAnthropic(base_url=base_url, api_key=model_secret, max_retries=0)
                with pytest.raises(openai.APIStatusError) as e:
                    await oa.responses.create(model="m", input="hi")
                out.append((e.value.status_code, e.value.message))
                with pytest.raises(anthropic.APIStatusError) as e2:
                    await an.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
                out.append((e2.value.status_code, e2.value.body))
                image = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]
                with pytest.raises(openai.APIStatusError) as e3:
                    await oa.chat.completions.create(model="m", messages=[{"role": "user", "content": image}])  # type: ignore[list-item]
                out.append(e3.value.status_code)
                await oa.close()
                await an.close()
            seen.append(out)
            traces.append(normal(session.trace))
        theirs, ours = seen
        assert traces[0] == traces[1]
        assert [c["error"] for c in traces[0]["calls"]] == [("NotImplementedError", None)] * 3
        assert theirs[0][0] == 502 and theirs[2] == ours[2] == 502
        assert ours[0][0] == 400 and "Chat Completions" in ours[0][1] and "EvalClientConfig" in ours[0][1]
        status, body = ours[1]
        assert status == 400 and body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert "Anthropic Messages" in body["error"]["message"] and "EvalClientConfig" in body["error"]["message"]
        assert a.bodies(GENERATE) == b.bodies(GENERATE) == [], "nothing reached the engines"
    finally:
        await a.shutdown()
        await b.shutdown()

