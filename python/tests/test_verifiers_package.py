"""Rollouts run by the real verifiers package from PyPI (its `Rollout`, its subprocess
runtime, its `EvalClient` and a `Harness` subclass), with an intercept shape injected as
the eval's interception: the swap a verifiers user makes.

Skipped when verifiers is not installed; CI installs `verifiers==0.2.1`.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

vf_rollout = pytest.importorskip("verifiers.v1.rollout")

from verifiers.v1.clients import EvalClient, ModelContext  # noqa: E402
from verifiers.v1.harness import Harness, HarnessConfig  # noqa: E402
from verifiers.v1.runtimes import SubprocessConfig  # noqa: E402
from verifiers.v1.task import Task, TaskData  # noqa: E402
from verifiers.v1.types import SamplingConfig  # noqa: E402

from intercept.verifiers import (  # noqa: E402
    ElasticInterceptionPool,
    ElasticInterceptionPoolConfig,
    InterceptionServer,
)

# The agent program: the official OpenAI SDK in a child process, two turns.
AGENT = """
import os, sys, openai
c = openai.OpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"], max_retries=0)
for turn in ("first", "second"):
    r = c.chat.completions.create(model="anything", messages=[{"role": "user", "content": sys.argv[1] + " " + turn}])
    assert r.choices[0].message.content == "echo: " + sys.argv[1] + " " + turn, r
"""


class SDKHarness(Harness[HarnessConfig]):
    """Runs AGENT in the rollout's runtime against the endpoint verifiers hands it."""

    async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str, mcp_urls: Any) -> Any:
        env = {"OPENAI_BASE_URL": endpoint, "OPENAI_API_KEY": secret}
        return await runtime.run_program([sys.executable, "-c", AGENT, trace.task.data.prompt], env)


class Spy:
    """The interception as verifiers sees it, keeping the sessions it is handed."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.sessions: list[Any] = []

    def acquire(self, session: Any) -> Any:
        self.sessions.append(session)
        return self.inner.acquire(session)


@pytest.mark.parametrize("shape", ["elastic", "server"])
async def test_verifiers_rollouts_run_through_intercept(mock: Any, shape: str) -> None:
    if shape == "elastic":
        interception: Any = ElasticInterceptionPool(ElasticInterceptionPoolConfig(multiplex=2), requires_tunnel=False)
    else:
        interception = InterceptionServer(None, False)
    spy = Spy(interception)
    async with interception:
        ctx = ModelContext(
            model="policy",
            client=EvalClient(base_url=mock.base_url, api_key="unused"),
            sampling=SamplingConfig(temperature=0.5),
        )
        rollouts = [
            vf_rollout.Rollout(
                task=Task(TaskData(idx=i, prompt=f"task-{i}")),
                harness=SDKHarness(HarnessConfig()),
                ctx=ctx,
                runtime_config=SubprocessConfig(),
                interception=spy,
            )
            for i in range(4)
        ]
        traces = await asyncio.gather(*(r.run() for r in rollouts))
        assert interception.load == 0
    for i, trace in enumerate(traces):
        assert trace.errors == [], trace.errors
        assert trace.stop_condition == "agent_completed"
        assert trace.task.data.prompt == f"task-{i}"
    assert len(spy.sessions) == 4
    for session in spy.sessions:
        # Each rollout's intercept trace holds exactly its own two calls, under verifiers'
        # trace id, with the eval's model and sampling imposed.
        records = session.intercept_trace
        assert records.id == session.trace.id
        prompt = session.trace.task.data.prompt
        assert [r.request["messages"][0]["content"] for r in records.calls] == [f"{prompt} first", f"{prompt} second"]
        assert all(r.model == "policy" and r.sampling == {"temperature": 0.5} for r in records.calls)
        assert all(r.status == 200 for r in records.calls)
