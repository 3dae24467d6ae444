"""The verifiers swap, differentially: the same scripted rollouts of verifiers 0.4's own
`Rollout` (its subprocess runtime; a harness program using the official `openai` and
`anthropic` SDKs; a scripted model server) run once through verifiers' own interception
server and once through `intercept.verifiers`, and the traces verifiers builds must agree:
nodes and messages, branches, calls (node, model, sampling, endpoint, finish reason,
usage, error type and status, ACP info), tools, turns, last reply, stop condition, errors.
Ids and timings may differ. The task and tool channels (`GET /task`, `POST /tool`) answer
verifiers' own tool servers and tool gates as its server does.

Skipped when verifiers is not installed; CI installs `verifiers==0.4.0`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

pytest.importorskip("verifiers.v1.interception")

from verifiers.v1.interception import InterceptionServer as VerifiersServer  # noqa: E402

import intercept.verifiers as iv  # noqa: E402
from vf_support import DENIED, ScriptedModel, make_session, normal, run_rollout  # noqa: E402

# Releases after 0.4.0 type Anthropic error bodies by status and match re-sent turns under
# the harness's replay view of the request's dialect.
VF_TYPES_ERRORS = "status_code" in inspect.signature(__import__("verifiers.v1.dialects", fromlist=["x"]).AnthropicDialect.error_body).parameters
VF_REPLAY_VIEW = hasattr(__import__("verifiers.v1.harness", fromlist=["x"]).Harness, "replay_view")

CASES: list[tuple[str, str, dict[str, Any]]] = [
    # Every dialect, JSON and streamed: three turns each.
    ("chat", "hello", {}),
    ("chat-stream", "hello", {}),
    ("responses", "hello", {}),
    ("responses-stream", "hello", {}),
    ("anthropic", "hello", {}),
    ("anthropic-stream", "hello", {}),
    # A tool loop (the model calls `add`, the harness answers it), JSON and streamed.
    ("tools", "sum it", {}),
    ("tools-stream", "sum it", {}),
    # A task `@stop` (two turns), and a limit (max_turns=2).
    ("chat", "stop me", {"task": "StoppingTask"}),
    ("anthropic-stream", "limit", {"max_turns": 2}),
    # An upstream 500 the SDK retries, JSON and streamed.
    ("chat", "flaky", {}),
    ("responses-stream", "flaky", {}),
    # An upstream 400 the harness dies of: the rollout fails with verifiers' ProviderError.
    ("chat", "broken", {}),
    ("anthropic-stream", "broken", {}),
    # A response interceptor and a response `@stop` (intercept holds these responses back).
    ("chat-stream", "rewrite", {"task": "RewritingTask"}),
    ("anthropic", "rewrite", {"task": "RewritingTask"}),
    # A harness that gates its tool calls on `/tool` and a request interceptor that
    # denies them: the model sees the policy's result instead of the tool's.
    ("tools", "sum it", {"task": "GatedTask", "harness": "GatedHarness"}),
    ("tools-stream", "sum it", {"task": "GatedTask", "harness": "GatedHarness"}),
    # An upstream 529 on every attempt: the SDKs retry, then die of it (Anthropic's
    # `overloaded_error`, in the dialect's shape).
    ("chat", "overloaded", {}),
    ("anthropic", "overloaded", {}),
    ("anthropic-stream", "overloaded", {}),
    # A harness that re-sends its replies trimmed, and says so in its replay view of Chat
    # Completions: the re-sent turns match the nodes they came from.
    ("chat", "trailing", {"harness": "TrimmingHarness"}),
    # ACP request ids on every call, and a malformed one (a 400 the harness dies of).
    ("chat", "acp ids", {}),
    ("chat-stream", "bad acp", {}),
]


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedModel]:
    model = await ScriptedModel.start()
    try:
        yield model
    finally:
        await model.shutdown()


def diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    return "\n".join(f"{k}:\n  verifiers: {json.dumps(a[k])}\n  intercept: {json.dumps(b[k])}" for k in a if a[k] != b[k])


async def test_traces_agree_with_verifiers_own_server(scripted: ScriptedModel) -> None:
    """Every case runs once through verifiers' own server and once through each shape of
    intercept's (a single server, an elastic pool), all at once; each shape's trace is held
    to verifiers' trace of the same case."""
    shapes: dict[str, Any] = {
        "server": iv.InterceptionServer(),
        "elastic": iv.ElasticInterceptionPool(iv.ElasticInterceptionPoolConfig(multiplex=4)),
    }
    async with VerifiersServer() as theirs, shapes["server"], shapes["elastic"]:

        async def each(mode: str, prompt: str, kw: dict[str, Any]) -> list[Any]:
            return await asyncio.gather(*(run_rollout(i, scripted.base_url, mode, prompt, **kw) for i in (theirs, *shapes.values())))

        results = await asyncio.gather(*(each(*c) for c in CASES))
        for shape, ours in shapes.items():
            assert ours.load == 0, shape
    assert scripted.acp_upstream == 0, "the ACP header is consumed, never sent upstream"
    for (mode, prompt, kw), (t_theirs, *t_shapes) in zip(CASES, results):
        for shape, t_ours in zip(shapes, t_shapes):
            agrees(f"{shape}: {mode} {prompt} {kw}", mode, prompt, kw, t_theirs, t_ours)


def agrees(case: str, mode: str, prompt: str, kw: dict[str, Any], t_theirs: Any, t_ours: Any) -> None:
    """Holds intercept's trace of one case (`t_ours`) to verifiers' (`t_theirs`), and both
    to what the case is meant to do."""
    a, b = normal(t_theirs), normal(t_ours)
    assert a == b, f"{case}:\n{diff(a, b)}"
    # What a harness that died of an error saw: its SDK's class, the status and the
    # body's error type. The Anthropic SDK reads the type: verifiers 0.4.0 typed every
    # such body `invalid_request_error`, later releases type it by status, as intercept
    # does. The OpenAI SDKs read the status only (verifiers types those bodies
    # `invalid_request_error`, intercept by status).
    seen = [json.loads(t.info.get("program") or "{}").get("error") for t in (t_theirs, t_ours)]
    if prompt == "rewrite" and mode.endswith("-stream") and None not in seen:
        # A documented difference: intercept holds such a stream with keepalives, and a
        # response `@stop` then arrives as the dialect's SSE error event (the SDK's
        # `APIError`, no status) instead of verifiers' HTTP 400.
        assert seen[1][:2] == ["APIError", None] and seen[0][1] == 400, seen
        seen[1] = seen[0]
    if VF_TYPES_ERRORS and mode.startswith("anthropic"):
        assert seen[0] == seen[1], f"{case}: {seen}"
    else:
        assert [e and e[:2] for e in seen[:1]] == [e and e[:2] for e in seen[1:]], f"{case}: {seen}"
    if prompt in ("broken", "overloaded", "bad acp"):
        assert seen[1] is not None, f"{case}: the harness did not die of the error"
    if prompt == "hello":
        assert seen == [None, None], f"{case}: {seen}"
    # The cases do what they say (on both sides, since they agree).
    if prompt == "hello":
        assert (a["num_turns"], len(a["calls"]), len(a["messages"]), a["stop_condition"]) == (3, 3, 6, "agent_completed")
        assert a["last_reply"] == "reply 2: continue 1"
    if prompt == "sum it":
        assert a["num_turns"] == 3 and any(m["role"] == "tool" for m in a["messages"])
    if kw.get("harness") == "GatedHarness":
        # The harness asked the gate and was denied, on both sides.
        gates = [json.loads(t.info["program"])["gates"] for t in (t_theirs, t_ours)]
        assert gates[0] == gates[1] and [g["action"] for g in gates[0]] == ["deny"], gates
        assert gates[0][0]["message"]["content"] == DENIED
        assert [m["content"] for m in a["messages"] if m["role"] == "tool"] == [DENIED]
        assert a["last_reply"] == "reply 2: continue 1" and "deny_tools" in a["request_rewrites"]
    if prompt == "acp ids":
        assert [c["acp"] for c in a["calls"]] == [{"request_id": f"turn-{i}"} for i in range(3)]
    if prompt == "bad acp":
        # The second call is refused before anything is recorded.
        assert [c["acp"] for c in a["calls"]] == [{"request_id": "turn-0"}] and a["num_turns"] == 1
    if prompt == "stop me":
        assert (a["num_turns"], a["stop_condition"]) == (2, "two_turns")
    if prompt == "limit":
        assert (a["num_turns"], a["stop_condition"], a["is_truncated"]) == (2, "max_turns", True)
    if prompt == "flaky":
        assert [c["error"] for c in a["calls"]] == [None, ("ProviderError", 500), None, None]
    if prompt == "rewrite":
        assert (a["stop_condition"], a["last_reply"]) == ("third_reply", "REPLY 2: CONTINUE 1")
        assert a["response_rewrites"] == ["shout"] * 3
    if prompt == "broken":
        assert a["stop_condition"] == "provider_error" and a["calls"][-1]["error"] == ("ProviderError", 400)
        assert seen[1][1:] == [400, "invalid_request_error"], seen
    if prompt == "overloaded":
        # The first call and the second turn's three attempts (two SDK retries).
        assert [c["error"] for c in a["calls"]] == [None] + [("ProviderError", 529)] * 3
        assert a["stop_condition"] == "provider_error"
        assert seen[1] == ["OverloadedError" if mode.startswith("anthropic") else "InternalServerError", 529, "overloaded_error"], seen
    if prompt == "trailing":
        # One branch: each re-sent, trimmed reply matched its node (verifiers after 0.4.0;
        # 0.4.0 has no replay view and forks at every turn, on both sides).
        assert len(a["branches"]) == (1 if VF_REPLAY_VIEW else 3), len(a["branches"])
    # Same upstream traffic: model and sampling imposed by verifiers' rules.
    assert all(c["model"] == "policy" and c["sampling"]["temperature"] == 0.5 for c in a["calls"])


async def test_another_verifiers_version_fails_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    from importlib import metadata

    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "0.2.1" if name == "verifiers" else real(name))
    with pytest.raises(iv.VerifiersVersionError, match=r"supports verifiers >=0.4,<0.5; verifiers 0.2.1 is installed"):
        iv.ElasticInterceptionPool()
    monkeypatch.setattr(metadata, "version", lambda name: "0.5.0" if name == "verifiers" else real(name))
    with pytest.raises(ImportError, match="0.5.0"):
        iv.InterceptionServer()


async def test_state_route_reaches_the_rollouts_verifiers_state(scripted: ScriptedModel) -> None:
    from verifiers.v1.state import State

    class Counter(State):
        count: int = 0

    for ic in (VerifiersServer(state_service_secrets=("service",)), iv.InterceptionServer(None, False, ("service",))):
        async with ic, httpx.AsyncClient(timeout=30) as c:
            s = make_session(scripted.base_url, 0, state=Counter(count=1))
            async with ic.acquire(s) as (base, model_secret, state_secret):
                bearer = {"Authorization": f"Bearer {state_secret}"}
                r = await c.get(f"{base}/state", headers=bearer)
                assert (r.status_code, r.json()["count"]) == (200, 1), type(ic)
                r = await c.put(f"{base}/state", content=b'{"count": 5}', headers=bearer)
                assert (r.status_code, r.json()) == (200, {"ok": True})
                assert s.trace.state == Counter(count=5)
                r = await c.put(f"{base}/state", content=b'{"count": "many"}', headers=bearer)
                assert r.status_code == 400 and "Counter" in r.text
                # A shared tool server: the service secret plus the rollout's trace id.
                shared = {"Authorization": "Bearer service", "X-Verifiers-State-Route": s.trace.id}
                r = await c.get(f"{base}/state", headers=shared)
                assert (r.status_code, r.json()["count"]) == (200, 5)
                # The model secret is not a state capability.
                r = await c.get(f"{base}/state", headers={"Authorization": f"Bearer {model_secret}"})
                assert r.status_code == 401
            assert s.trace.state == Counter(count=5)


async def test_task_and_tool_channels_answer_as_verifiers_own_server(scripted: ScriptedModel) -> None:
    """`GET /task` (what verifiers' tool servers fetch) and `POST /tool` (verifiers' tool
    gate) on both servers: the same answers, statuses and capabilities."""
    from verifiers.v1.mcp.server import ServerBase

    answers: list[list[Any]] = []
    for ic in (VerifiersServer(), iv.InterceptionServer()):
        seen: list[Any] = []
        answers.append(seen)
        async with ic, httpx.AsyncClient(timeout=30) as c:
            s = make_session(scripted.base_url, 7)
            async with ic.acquire(s) as (base, model_secret, state_secret):
                model, state = ({"Authorization": f"Bearer {secret}"} for secret in (model_secret, state_secret))
                r = await c.get(f"{base}/task", headers=state)
                seen.append((r.status_code, r.json()))
                # verifiers' own tool server reads it back into the rollout's task row.
                task = await ServerBase._fetch_task(None, f"{base}/state", state_secret)  # type: ignore[arg-type]
                assert task == s.trace.task.data, type(ic)
                # Each secret is its own capability.
                seen.append((await c.get(f"{base}/task", headers=model)).status_code)
                ask = {"tool_call_id": "call_9", "name": "add", "arguments": {"a": 1}}
                seen.append((await c.post(f"{base}/tool", json=ask, headers=state)).status_code)
                # A call the model never proposed: verifiers' HarnessError, a 400 that
                # fails the rollout.
                r = await c.post(f"{base}/tool", json=ask, headers=model)
                seen.append((r.status_code, r.json(), type(s.error).__name__))
                s.error = None
                s.trace.stop("enough")
                r = await c.post(f"{base}/tool", json=ask, headers=model)
                seen.append((r.status_code, r.json()))
            if isinstance(ic, iv.InterceptionServer):
                late = await c.post(f"{base}/tool", json=ask, headers=model)
                assert late.status_code == 409 and late.json() == {"error": "rollout concluded"}
    theirs, ours = answers
    assert theirs == ours
    assert theirs[0] == (200, {"cls": "verifiers.v1.task:TaskData", "task": s.trace.task.data.model_dump_json()})
    assert theirs[1:3] == [401, 401]
    assert theirs[3][0] == 400 and theirs[3][2] == "HarnessError"
    assert theirs[4] == (200, {"action": "stop", "reason": "enough"})
