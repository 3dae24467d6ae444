"""The blocking facade (`intercept.sync`) offers what the asyncio API does, each method
waiting for its result."""

from __future__ import annotations

import asyncio
import inspect

import openai

import intercept
from intercept import sync


def _public(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


def test_the_sync_classes_have_every_public_member_of_the_async_ones() -> None:
    # `session` is an attribute of the async Slot's instances (a slot), a property here.
    async_slot = _public(intercept.Slot) | {"session"}
    assert async_slot <= _public(sync.Slot), sorted(async_slot - _public(sync.Slot))
    for name in ("Server", "StaticPool", "ElasticPool"):
        a, s = getattr(intercept, name), getattr(sync, name)
        assert _public(a) <= _public(s), (name, sorted(_public(a) - _public(s)))
        # The constructors take the same parameters.
        assert list(inspect.signature(a).parameters) == list(inspect.signature(s).parameters), name


async def test_every_sync_method_works(mock) -> None:
    session = intercept.Session(id="sync-all", model="m", upstream=mock.base_url)

    def run() -> None:
        ic = sync.Server(shutdown_grace=5)
        assert ic.base_url() is None  # not started
        with ic:
            base = ic.base_url()
            assert base is not None and base.startswith("http://127.0.0.1:")
            assert [s.base_url for s in ic.servers()] == [base]
            assert ic.load == 0 and ic.inflight == 0
            assert "load=0" in repr(ic)
            with ic.acquire(session) as slot:
                assert ic.load == 1
                assert slot.base_url == base
                assert slot.openai_base_url == base + "/v1" == slot.env["OPENAI_BASE_URL"]
                assert slot.anthropic_base_url == base == slot.env["ANTHROPIC_BASE_URL"]
                assert slot.model_secret == slot.env["OPENAI_API_KEY"] and slot.state_secret
                assert slot.session is session and not slot.released and not slot.endpoint_lost
                assert not slot.report_tunnel_failure("404 Tunnel not found or no longer active")
                c = openai.OpenAI(base_url=slot.openai_base_url, api_key=slot.model_secret, max_retries=0, timeout=60)
                r = c.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
                c.close()
                assert r.choices[0].message.content == "echo: hi"
                paused = ic.pause("reject", retry_after=2)
                assert paused.paused and paused.mode == "reject"
                assert ic.pause_status().paused
                resumed = ic.resume()
                assert not resumed.paused and resumed.epoch == paused.epoch + 1
                slot.release_now()
                assert slot.released and session.status == "released"
                slot.release()  # idempotent
            assert session.calls == 1

    await asyncio.to_thread(run)


async def test_sync_pools_take_the_async_pools_arguments(mock) -> None:
    sessions = [intercept.Session(id=f"pool-{i}", model="m", upstream=mock.base_url) for i in range(2)]

    def run() -> None:
        with sync.StaticPool(servers=2) as static:
            slots = [static.acquire(s) for s in sessions[:1]]
            assert static.load == 1 and len(static.servers()) == 2
            for s in slots:
                s.release()
        with sync.ElasticPool(multiplex=1, max_servers=2) as elastic:
            slot = elastic.acquire(sessions[1])
            assert elastic.load == 1 and elastic.base_url() == slot.base_url
            slot.release()

    await asyncio.to_thread(run)
    assert [s.status for s in sessions] == ["released", "released"]
