"""The verifiers swap, the tunnels, and the other shapes."""

from __future__ import annotations

import asyncio
import importlib.util
import socket

import openai
import pytest

import intercept
from intercept import tunnels
from intercept.testing import BoreServer
from intercept.verifiers import (
    ElasticInterceptionPool,
    ElasticInterceptionPoolConfig,
    InterceptionServer,
    StaticInterceptionPool,
    StaticInterceptionPoolConfig,
    make_interception,
)
from test_lifecycle import ask


async def harness(base_url: str, secret: str, text: str) -> str:
    # verifiers hands a harness `{base_url}/v1` and the secret as its API key
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=secret, max_retries=0, timeout=60) as c:
        return await ask(c, text)


needs_verifiers = pytest.mark.skipif(importlib.util.find_spec("verifiers") is None, reason="verifiers is not installed")


@needs_verifiers
async def test_verifiers_call_sequence_on_every_shape(mock) -> None:
    # The verifiers shapes (with verifiers' configs as dicts or their dataclasses) carry
    # intercept sessions too; rollouts of verifiers' own sessions are in
    # test_verifiers_differential.py.
    shapes = [
        ElasticInterceptionPool(ElasticInterceptionPoolConfig(multiplex=2), requires_tunnel=False),
        StaticInterceptionPool(StaticInterceptionPoolConfig(servers=[{"type": "server"}, {"type": "server"}]), requires_tunnel=False),
        InterceptionServer(None, False, ("service-secret",)),
        make_interception({"type": "elastic", "multiplex": 3}, requires_tunnel=False),
    ]
    for pool in shapes:
        async with pool:
            sessions = [intercept.Session(id=f"vf-{i}", model="policy", upstream=mock.base_url, sampling={"temperature": 0.3}) for i in range(5)]

            async def rollout(s: intercept.Session) -> str:
                async with pool.acquire(s) as slot:
                    base_url, model_secret, state_secret = slot  # verifiers 0.4's Slot
                    assert model_secret != state_secret
                    assert pool.load >= 1
                    return await harness(base_url, model_secret, s.id)

            out = await asyncio.gather(*(rollout(s) for s in sessions))
            assert out == [f"echo: vf-{i}" for i in range(5)]
            assert pool.load == 0
        for s in sessions:
            trace = s.trace()
            assert trace.id == s.id and len(trace.calls) == 1
            assert trace.calls[0].model == "policy" and trace.calls[0].sampling == {"temperature": 0.3}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_bore_and_custom_tunnels(mock) -> None:
    bore = await BoreServer.start(secret="s3cret")
    try:
        async with intercept.ElasticPool(multiplex=2, tunnel=tunnels.Bore(server="127.0.0.1", control_port=bore.control_port, secret="s3cret")) as ic:
            session = intercept.Session(id="b", model="m", upstream=mock.base_url)
            async with ic.acquire(session) as slot:
                assert slot.base_url.startswith("http://127.0.0.1:")
                assert await harness(slot.base_url, slot.model_secret, "through bore") == "echo: through bore"
            assert session.calls == 1
    finally:
        await bore.shutdown()
    port = free_port()
    async with intercept.Server(tunnel=tunnels.Custom(url=f"http://127.0.0.1:{port}/", port=port, host="127.0.0.1")) as ic:
        assert await ic.base_url() == f"http://127.0.0.1:{port}"
        session = intercept.Session(id="c", model="m", upstream=mock.base_url)
        async with ic.acquire(session) as slot:
            assert slot.base_url == f"http://127.0.0.1:{port}"
            assert await harness(slot.base_url, slot.model_secret, "custom") == "echo: custom"


async def test_static_pool_spreads_least_loaded(mock) -> None:
    async with intercept.StaticPool(3) as ic:
        slots = [await ic.acquire(intercept.Session(id=f"s{i}", model="m", upstream=mock.base_url)) for i in range(6)]
        servers = await ic.servers()
        assert sorted(s.load for s in servers) == [2, 2, 2]
        assert len({s.base_url for s in slots}) == 3
        for s in slots:
            await s.release()
        assert ic.load == 0
