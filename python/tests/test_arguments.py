"""Arguments and retries: a wrong type is a `TypeError` naming the argument and the type
it takes (never an `InterceptError`, a panic or an `AttributeError`), and an acquire that
fails or is cancelled leaves its session free to be acquired again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import intercept
from intercept import sync, tunnels

from conftest import until

URL = "http://127.0.0.1:1/v1"


def _session(**kw: Any) -> intercept.Session:
    args: dict[str, Any] = {"id": "t", "model": "m", "upstream": URL}
    args.update(kw)
    return intercept.Session(**args)


def _type_error(make: Callable[[], object], *words: str) -> None:
    with pytest.raises(TypeError) as info:
        make()
    assert not isinstance(info.value, intercept.InterceptError), info.value
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_wrong_types_in_a_session_are_type_errors_naming_the_argument() -> None:
    _type_error(lambda: _session(id=17), "id", "expected a str", "int")
    _type_error(lambda: _session(model=None), "model", "expected a str", "NoneType")
    _type_error(lambda: _session(upstream=8000), "upstream", "URL", "int")
    _type_error(lambda: _session(upstream=[URL, 2]), "upstream[1]", "URL string")
    _type_error(lambda: _session(sampling=[("temperature", 0.7)]), "sampling", "dict", "list")
    _type_error(lambda: _session(limits=32), "limits", "dict", "int")
    _type_error(lambda: _session(limits={"max_turns": "32"}), "limits['max_turns']", "int", "str")
    _type_error(lambda: _session(limits={"max_turns": True}), "limits['max_turns']", "int", "bool")
    _type_error(lambda: _session(capture_tokens="yes"), "capture_tokens", "bool", "str")
    _type_error(lambda: _session(api_key=123), "api_key", "str")
    _type_error(lambda: _session(headers={"x-a": 1}), "headers['x-a']", "str", "int")
    _type_error(lambda: _session(headers=["x-a"]), "headers", "dict", "list")
    _type_error(lambda: _session(on_request="log"), "on_request", "callable", "str")
    _type_error(lambda: _session(hook_headers="x-tag"), "hook_headers", "list", "str")
    _type_error(lambda: _session(hook_headers=[b"x-tag"]), "hook_headers[0]", "str", "bytes")
    _type_error(lambda: _session(task=object()), "task", "JSON")
    _type_error(lambda: _session(tokens=["qwen3"]), "tokens", "list")
    _type_error(lambda: _session().stop(3), "reason", "str", "int")
    # A right type with a value that is not allowed is still an InvalidRequestError.
    with pytest.raises(intercept.InvalidRequestError):
        _session(id="")
    with pytest.raises(intercept.InvalidRequestError):
        _session(sampling={"temperature": float("nan")})


def test_wrong_types_in_interceptions_are_type_errors_naming_the_argument() -> None:
    _type_error(lambda: intercept.Server(tunnel=5), "tunnel", "int")
    _type_error(lambda: intercept.StaticPool("3"), "servers", "count", "str")
    _type_error(lambda: intercept.StaticPool(True), "servers", "count", "bool")
    _type_error(lambda: intercept.ElasticPool(multiplex="32"), "multiplex", "int", "str")
    # Server settings are typed by the server itself: serde's message names the setting
    # and the type it takes.
    _type_error(lambda: intercept.Server(body_limit="big"), "body_limit", "invalid type")
    _type_error(lambda: intercept.ElasticPool(max_servers="4"), "invalid type")
    _type_error(lambda: sync.Server(tunnel=3.5), "tunnel", "float")
    _type_error(lambda: intercept.Tokens(renderer=1, tokenizer="x"), "tokens.renderer", "int")  # type: ignore[arg-type]


async def test_wrong_types_in_calls_on_a_running_interception(server, mock) -> None:
    _type_error(lambda: server.acquire("rollout-1"), "session", "intercept.Session", "str")
    _type_error(lambda: server.acquire(None), "session", "NoneType")
    with pytest.raises(TypeError, match="mode"):
        await server.pause(1)
    with pytest.raises(TypeError, match="timeout.*number of seconds.*str"):
        await server.pause("hold", timeout="10")
    with pytest.raises(TypeError, match="retry_after"):
        await server.pause("reject", retry_after=None)
    with pytest.raises(intercept.InvalidRequestError, match="hold"):
        await server.pause("sideways")  # type: ignore[arg-type]
    assert not server.pause_status().paused
    session = intercept.Session(id="types", model="m", upstream=mock.base_url)
    async with server.acquire(session) as slot:
        _type_error(lambda: slot.report_tunnel_failure(b"404"), "text", "str", "bytes")


async def test_an_acquire_before_start_fails_and_the_same_session_is_acquired_after_it(mock) -> None:
    ic = intercept.Server()
    session = intercept.Session(id="early", model="m", upstream=mock.base_url)
    with pytest.raises(intercept.ConflictError, match="not started"):
        await ic.acquire(session)
    async with ic:
        async with ic.acquire(session) as slot:
            assert not slot.released and session.status == "active"
        assert session.status == "released"
        # Acquired once: a second acquire of a used session is refused.
        with pytest.raises(intercept.ConflictError, match="already acquired"):
            await ic.acquire(session)


async def test_a_refused_session_setting_can_be_retried(server, tmp_path: Path) -> None:
    tokens = intercept.Tokens(renderer="qwen3", tokenizer=str(tmp_path / "no-such-tokenizer"))
    session = intercept.Session(id="bad-tokens", model="m", upstream=URL, tokens=tokens)
    for _ in range(2):
        # Each attempt fails for what is wrong, never for an earlier attempt.
        with pytest.raises(intercept.InterceptError) as info:
            await server.acquire(session)
        assert not isinstance(info.value, intercept.ConflictError), info.value
        assert "no-such-tokenizer" in info.value.message
    assert server.load == 0


async def test_a_timed_out_and_a_cancelled_acquire_leave_the_session_free(mock) -> None:
    async with intercept.ElasticPool(multiplex=1, max_servers=1, wait_timeout=0.2) as ic:
        first = intercept.Session(id="first", model="m", upstream=mock.base_url)
        second = intercept.Session(id="second", model="m", upstream=mock.base_url)
        slot = await ic.acquire(first)
        # The pool is full: the wait times out, and the session stays free.
        with pytest.raises(intercept.UnavailableError):
            await ic.acquire(second)
        slot.release_now()
        await until(lambda: ic.load == 0, "the first slot released")
        async with ic.acquire(second) as again:
            assert not again.released
    async with intercept.ElasticPool(multiplex=1, max_servers=1, wait_timeout=60) as ic:
        first = intercept.Session(id="first", model="m", upstream=mock.base_url)
        second = intercept.Session(id="second", model="m", upstream=mock.base_url)
        slot = await ic.acquire(first)
        waiting = asyncio.create_task(ic.acquire(second).__aenter__())
        # While it waits, the session is taken: a concurrent acquire is a conflict.
        await until(lambda: second._acquired, "the acquire to claim its session")
        with pytest.raises(intercept.ConflictError, match="being acquired"):
            await ic.acquire(second)
        assert not waiting.done()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await slot.release()
        async with ic.acquire(second) as again:
            assert not again.released and second.status == "active"
        assert second.status == "released"


async def test_a_failed_sync_acquire_leaves_the_session_free(mock) -> None:
    first = intercept.Session(id="first", model="m", upstream=mock.base_url)
    second = intercept.Session(id="second", model="m", upstream=mock.base_url)

    def run() -> None:
        with sync.ElasticPool(multiplex=1, max_servers=1, wait_timeout=0.2) as ic:
            with ic.acquire(first):
                with pytest.raises(intercept.UnavailableError):
                    ic.acquire(second)
            with ic.acquire(second) as slot:
                assert not slot.released and second.status == "active"

    await asyncio.to_thread(run)
    assert first.status == second.status == "released"
    _type_error(lambda: sync.Server().acquire(tunnels), "session", "module")  # type: ignore[arg-type]
