"""Exceptions carry the Rust error's kind, status and message; records carry the JSONL's fields."""

from __future__ import annotations

import dataclasses
import json
import pickle

import openai
import pytest

import intercept
from intercept import tunnels
from test_lifecycle import ask, client


def test_bad_settings_raise_invalid_request_errors() -> None:
    cases = [
        lambda: intercept.Session(id="", model="m", upstream="http://127.0.0.1:1/v1"),
        lambda: intercept.Session(id="a", model="m", upstream="ftp://nowhere"),
        lambda: intercept.Session(id="a", model="m", upstream="http://127.0.0.1:1/v1", limits={"max_turnz": 3}),
        lambda: intercept.Session(id="a", model="m", upstream="http://127.0.0.1:1/v1", sampling={"t": float("nan")}),
        lambda: intercept.Server(bogus=1),
        lambda: intercept.Server(keepalive=-1),
        lambda: intercept.ElasticPool(multiplex=0),
        lambda: intercept.StaticPool(0),
    ]
    for make in cases:
        with pytest.raises(intercept.InvalidRequestError) as info:
            make()
        e = info.value
        assert isinstance(e, intercept.InterceptError) and isinstance(e, ValueError)
        assert e.kind == "invalid_request" and e.status == 400 and e.blame == "client"
        assert e.message and str(e) == e.message
    with pytest.raises(intercept.InvalidRequestError, match="max_turnz"):
        cases[2]()


def test_tunnel_errors(monkeypatch, tmp_path) -> None:
    with pytest.raises(intercept.TunnelError) as info:
        intercept.Server(tunnel=tunnels.Custom(url="not a url", port=8080))
    assert info.value.kind == "tunnel" and info.value.status == 502
    monkeypatch.delenv("PRIME_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(intercept.TunnelError, match="PRIME_API_KEY"):
        intercept.Server(tunnel=tunnels.Prime())
    with pytest.raises(intercept.TunnelError, match="server"):
        intercept.Server(tunnel=tunnels.Bore(server=" "))


async def test_runtime_errors_are_mapped(server, mock) -> None:
    session = intercept.Session(id="e", model="m", upstream=mock.base_url)
    async with server.acquire(session):
        with pytest.raises(intercept.ConflictError, match="already acquired") as info:
            await server.acquire(session)
        assert info.value.status == 409
    with pytest.raises(intercept.InvalidRequestError, match="hold"):
        await server.pause("sideways")
    e = pickle.loads(pickle.dumps(intercept.UpstreamStatusError("upstream 500: boom", status=500, retryable=True)))
    assert type(e) is intercept.UpstreamStatusError and (e.kind, e.status, e.retryable) == ("upstream_status", 500, True)
    assert intercept.error_class("paused") is intercept.PausedError
    assert intercept.error_class("something_new") is intercept.InterceptError


def test_every_rust_error_kind_has_its_class_and_every_class_a_kind() -> None:
    from intercept import _errors, _native

    rust = {kind: (status, blame) for kind, status, blame, _ in _native.ERROR_KINDS}
    for kind, (status, blame) in rust.items():
        cls = intercept.error_class(kind)
        assert cls is not intercept.InterceptError, f"error kind {kind!r} has no class: declare {_errors._class_name(kind)} in _errors.py"
        assert (cls.default_kind, cls.default_status, cls.default_blame) == (kind, status, blame)
        assert cls.__doc__, cls
        assert cls.__name__ in intercept.__all__ and getattr(intercept, cls.__name__) is cls, cls
    declared = {
        c for c in vars(_errors).values() if isinstance(c, type) and issubclass(c, intercept.InterceptError) and c is not intercept.InterceptError
    }
    for cls in declared:
        assert intercept.error_class(cls.default_kind) is cls, f"{cls.__name__} names no error kind"
        assert cls.default_kind in rust or cls in _errors._PYTHON_KINDS, cls
    assert intercept.GoneError.default_status == 410 and intercept.UpgradeRequiredError.default_status == 426


async def test_failed_calls_record_errors_that_map_to_exceptions(server, mock) -> None:
    mock.push_error(500, "engine on fire")
    session = intercept.Session(id="f", model="m", upstream=mock.base_url)
    async with server.acquire(session) as slot:
        c = client(slot)
        with pytest.raises(openai.InternalServerError):
            await ask(c)
        await c.close()
    (call,) = session.trace().calls
    assert call.status == 500 and not call.ok
    assert call.error is not None and call.error.kind == "upstream_status" and "engine on fire" in call.error.message
    exc = call.error.exception()
    assert isinstance(exc, intercept.UpstreamStatusError) and exc.status == 500


async def test_records_have_the_jsonl_fields(server, mock) -> None:
    session = intercept.Session(id="j", model="m", upstream=mock.base_url, sampling={"temperature": 0.25}, capture_tokens=False)
    async with server.acquire(session) as slot:
        c = client(slot)
        await ask(c, "one")
        await ask(c, "two", stream=True)
        await c.close()
    raw = session.trace_dict()
    trace = session.trace()
    names = {f.name for f in dataclasses.fields(intercept.CallRecord)} - {"extra"}
    for line, record in zip(raw["calls"], trace.calls):
        assert set(line) <= names, set(line) - names
        assert record.to_dict() == line
        assert json.loads(json.dumps(record.to_dict())) == line
        assert record.extra == {}
        assert record.sampling == {"temperature": 0.25}
        assert record.duration >= 0 and record.ttfb_ms is not None
    assert trace.to_dict() == raw
    assert [c.stream for c in trace.calls] == [False, True]


def test_a_trace_of_plain_records_has_no_graph() -> None:
    trace = intercept.Trace.from_dict({"id": "t", "stop_condition": None, "calls": []})
    with pytest.raises(intercept.EpisodeUnavailableError) as info:
        trace.episode()
    assert isinstance(info.value, NotImplementedError)
    assert "read_trace" in info.value.message
