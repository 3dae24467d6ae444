"""The verifiers swap, the tunnels, and the other shapes."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

import openai

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


def verifiers_session(i: int) -> SimpleNamespace:
    """What verifiers' RolloutSession offers the interception layer (trace id, model context, limits)."""
    return SimpleNamespace(
        trace=SimpleNamespace(id=f"vf-{i}"),
        ctx=SimpleNamespace(model="policy", sampling={"temperature": 0.3, "top_p": None}, client=None),
        limits=SimpleNamespace(max_turns=4, max_input_tokens=None, max_output_tokens=None, max_total_tokens=None),
    )


async def harness(base_url: str, secret: str, text: str) -> str:
    # verifiers hands a harness `{base_url}/v1` and the secret as its API key
    async with openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=secret, max_retries=0, timeout=60) as c:
        return await ask(c, text)


async def test_verifiers_call_sequence_on_every_shape(mock) -> None:
    shapes = [
        ElasticInterceptionPool(ElasticInterceptionPoolConfig(multiplex=2), requires_tunnel=False, upstream=mock.base_url),
        StaticInterceptionPool(StaticInterceptionPoolConfig(servers=[{"type": "server"}, {"type": "server"}]), requires_tunnel=False, upstream=mock.base_url),
        InterceptionServer(None, False, upstream=mock.base_url),
        make_interception({"type": "elastic", "multiplex": 3}, requires_tunnel=False, upstream=mock.base_url),
    ]
    for pool in shapes:
        async with pool:
            sessions = [verifiers_session(i) for i in range(5)]

            async def rollout(s: SimpleNamespace) -> str:
                async with pool.acquire(s) as slot:
                    base_url, secret = slot  # verifiers 0.2's Slot
                    assert pool.load >= 1
                    return await harness(base_url, secret, s.trace.id)

            out = await asyncio.gather(*(rollout(s) for s in sessions))
            assert out == [f"echo: vf-{i}" for i in range(5)]
            assert pool.load == 0
        for s in sessions:
            trace = s.intercept_trace
            assert trace.id == s.trace.id and len(trace.calls) == 1
            assert trace.calls[0].model == "policy" and trace.calls[0].sampling == {"temperature": 0.3}


async def test_verifiers_triple_slot_and_our_sessions(mock) -> None:
    pool = InterceptionServer(upstream=mock.base_url, slot="triple")
    async with pool:
        ours = intercept.Session(id="mine", model="m", upstream=mock.base_url)
        async with pool.acquire(ours) as (base_url, model_secret, state_secret):
            assert model_secret != state_secret
            assert await harness(base_url, model_secret, "three") == "echo: three"
        assert ours.calls == 1


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
