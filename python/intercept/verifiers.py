"""Drop-in classes for `verifiers.v1.interception`: swap the import, keep the harness code.

    # from verifiers.v1.interception import ElasticInterceptionPool, ElasticInterceptionPoolConfig
    from intercept.verifiers import ElasticInterceptionPool, ElasticInterceptionPoolConfig

    pool = ElasticInterceptionPool(ElasticInterceptionPoolConfig(multiplex=32), requires_tunnel=False)
    async with pool:
        async with pool.acquire(session) as (base_url, secret):   # verifiers' Slot
            ...

The constructors take verifiers' configs (the pydantic objects of `verifiers`, or dicts of
the same shape: `{"type": "server", "tunnel": {"type": "prime" | "custom", "url", "port"}}`,
`{"type": "static", "servers": [...]}`, `{"type": "elastic", "multiplex": 32}`) and
`requires_tunnel`. `acquire(session)` is an async context manager that yields verifiers'
`Slot`: `(base_url, secret)` as verifiers 0.2 has it, or `(base_url, model_secret,
state_secret)` where the installed verifiers declares the three-part slot (or with
`slot="triple"`).

`session` may be an `intercept.Session` (its trace is then `session.trace()`), or a
verifiers `RolloutSession`: its trace id, model (`ctx.model`), sampling (`ctx.sampling`)
and limits are taken over; the upstream comes from the class's `upstream=` argument (or
the session client's `base_url`, when it has one). After release its intercept trace is
`session.intercept_trace` (an `intercept.Trace`); verifiers' own message graph
(`session.trace.nodes`) is not filled.
"""

from __future__ import annotations

import typing
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from ._errors import InvalidRequestError
from ._interception import ElasticPool, Interception, Server, StaticPool
from ._session import Session
from .tunnels import Custom, Prime

__all__ = [
    "InterceptionServer",
    "StaticInterceptionPool",
    "ElasticInterceptionPool",
    "InterceptionServerConfig",
    "StaticInterceptionPoolConfig",
    "ElasticInterceptionPoolConfig",
    "PrimeTunnelConfig",
    "CustomTunnelConfig",
    "make_interception",
]


@dataclass
class PrimeTunnelConfig:
    type: Literal["prime"] = "prime"


@dataclass
class CustomTunnelConfig:
    url: str = ""
    port: int = 0
    type: Literal["custom"] = "custom"


@dataclass
class InterceptionServerConfig:
    tunnel: Any = field(default_factory=PrimeTunnelConfig)
    type: Literal["server"] = "server"


@dataclass
class StaticInterceptionPoolConfig:
    servers: list[Any] = field(default_factory=list)
    type: Literal["static"] = "static"


@dataclass
class ElasticInterceptionPoolConfig:
    multiplex: int = 32
    type: Literal["elastic"] = "elastic"


def _get(obj: Any, key: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)


def _tunnel(config: Any) -> Custom | Prime:
    """verifiers' tunnel config -> an intercept tunnel (the server binds where verifiers' does)."""
    kind = _get(config, "type", "prime")
    if kind == "custom":
        url, port = _get(config, "url"), _get(config, "port")
        if not url or not port:
            raise InvalidRequestError("custom tunnel: `url` and `port` are required")
        return Custom(url=str(url).rstrip("/"), port=int(port))
    if kind == "prime":
        return Prime()
    raise InvalidRequestError(f"tunnel type {kind!r}: verifiers knows `prime` and `custom`")


def _slot_shape() -> str:
    try:
        from verifiers.v1.interception.base import Slot
    except Exception:  # noqa: BLE001 - verifiers is optional
        return "pair"
    return "triple" if len(typing.get_args(Slot)) == 3 else "pair"


def _limits(session: Any) -> dict[str, Any]:
    limits = _get(session, "limits")
    if limits is None:
        return {}
    keys = ("max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens")
    return {k: _get(limits, k) for k in keys if _get(limits, k) is not None}


def _sampling(ctx: Any) -> dict[str, Any]:
    sampling = _get(ctx, "sampling")
    if sampling is None:
        return {}
    if hasattr(sampling, "model_dump"):
        dumped: dict[str, Any] = sampling.model_dump(exclude_none=True)
        return dumped
    return {k: v for k, v in dict(sampling).items() if v is not None}


class _Compat:
    """The shared part: lifecycle, `load`, `base_url` and `acquire(session)`."""

    def __init__(self, ic: Interception, upstream: Any, slot: str | None) -> None:
        self._ic = ic
        self._upstream = upstream
        self._slot = slot
        self.base_url = ""

    async def start(self) -> None:
        await self._ic.start()
        self.base_url = await self._ic.base_url() or ""

    async def stop(self) -> None:
        await self._ic.stop()

    async def __aenter__(self) -> Any:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    @property
    def load(self) -> int:
        return self._ic.load

    @property
    def interception(self) -> Interception:
        """The intercept interception underneath (pause/resume, servers, ...)."""
        return self._ic

    def _session(self, session: Any) -> Session:
        if isinstance(session, Session):
            return session
        trace = _get(session, "trace")
        ctx = _get(session, "ctx")
        sid = _get(trace, "id")
        model = _get(ctx, "model")
        if not sid or not model:
            raise InvalidRequestError("acquire: expected an intercept.Session or a verifiers RolloutSession (with trace.id and ctx.model)")
        upstream = self._upstream
        if upstream is None:
            client = _get(ctx, "client")
            upstream = _get(client, "base_url") or _get(_get(client, "config"), "base_url")
        if upstream is None:
            raise InvalidRequestError(
                "acquire: this verifiers session's client names no base_url; pass upstream='http://host:8000/v1' to the intercept.verifiers class"
            )
        return Session(id=str(sid), model=str(model), upstream=upstream, sampling=_sampling(ctx), limits=_limits(session))

    @asynccontextmanager
    async def acquire(self, session: Any) -> AsyncIterator[tuple[str, ...]]:
        ours = self._session(session)
        shape = self._slot or _slot_shape()
        async with self._ic.acquire(ours) as slot:
            if shape == "triple":
                yield (slot.base_url, slot.model_secret, slot.state_secret)
            else:
                yield (slot.base_url, slot.model_secret)
        if ours is not session:
            try:
                session.intercept_trace = ours.trace()
            except AttributeError:
                pass


class InterceptionServer(_Compat):
    """verifiers' `InterceptionServer(config, requires_tunnel)`: one shared server."""

    def __init__(self, config: Any = None, requires_tunnel: bool = False, *, upstream: Any = None, slot: str | None = None, **settings: Any) -> None:
        config = config if config is not None else InterceptionServerConfig()
        tunnel = _tunnel(_get(config, "tunnel", PrimeTunnelConfig())) if requires_tunnel else None
        super().__init__(Server(tunnel=tunnel, **settings), upstream, slot)
        self.config = config


class StaticInterceptionPool(_Compat):
    """verifiers' `StaticInterceptionPool(config, requires_tunnel)`: a fixed list of servers, least-loaded first."""

    def __init__(self, config: Any, requires_tunnel: bool = False, *, upstream: Any = None, slot: str | None = None, **settings: Any) -> None:
        servers = list(_get(config, "servers") or [])
        if not servers:
            raise InvalidRequestError("StaticInterceptionPoolConfig.servers: at least one server")
        entries = [_tunnel(_get(s, "tunnel", PrimeTunnelConfig())) if requires_tunnel else None for s in servers]
        super().__init__(StaticPool(entries, **settings), upstream, slot)
        self.config = config


class ElasticInterceptionPool(_Compat):
    """verifiers' `ElasticInterceptionPool(config, requires_tunnel)`: `multiplex` rollouts
    per server, servers started on demand (Prime tunnels when a tunnel is required, as in
    verifiers)."""

    def __init__(self, config: Any = None, requires_tunnel: bool = False, *, upstream: Any = None, slot: str | None = None, **settings: Any) -> None:
        config = config if config is not None else ElasticInterceptionPoolConfig()
        multiplex = int(_get(config, "multiplex", 32))
        if multiplex < 1:
            raise InvalidRequestError("multiplex: must be at least 1")
        tunnel = Prime() if requires_tunnel else None
        super().__init__(ElasticPool(multiplex=multiplex, tunnel=tunnel, **settings), upstream, slot)
        self.config = config


def make_interception(config: Any, *, requires_tunnel: bool, upstream: Any = None) -> _Compat:
    """verifiers' `make_interception`: the shape by the config's `type`."""
    kind = _get(config, "type", "elastic")
    if kind == "server":
        return InterceptionServer(config, requires_tunnel, upstream=upstream)
    if kind == "static":
        return StaticInterceptionPool(config, requires_tunnel, upstream=upstream)
    return ElasticInterceptionPool(config, requires_tunnel, upstream=upstream)
