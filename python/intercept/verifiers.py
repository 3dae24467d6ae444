"""Drop-in classes for verifiers 0.4's `verifiers.v1.interception`: swap the import, keep the rest.

    # from verifiers.v1.interception import ElasticInterceptionPool, ElasticInterceptionPoolConfig
    from intercept.verifiers import ElasticInterceptionPool, ElasticInterceptionPoolConfig

    pool = ElasticInterceptionPool(ElasticInterceptionPoolConfig(multiplex=32), requires_tunnel=False)
    async with pool:
        async with pool.acquire(session) as (base_url, model_secret, state_secret):   # verifiers' Slot
            ...

Supported: verifiers `>=0.4,<0.5` (`SUPPORTED`). Any other installed version (or none)
fails at construction with `VerifiersVersionError`.

The constructors take verifiers' configs (its pydantic objects, or dicts of the same shape:
`{"type": "server", "tunnel": {"type": "prime" | "custom", "url", "port"}}`,
`{"type": "static", "servers": [...]}`, `{"type": "elastic", "multiplex": 32}`),
`requires_tunnel` and `state_service_secrets`, as verifiers' do.

`acquire(session)` takes verifiers' `RolloutSession`. Each of its model calls runs
verifiers' own per-turn logic on verifiers' own objects (limits and `@stop`s, request and
response interceptors, pinned tool results, network-policy mediation, the message graph,
tool-call gating, one `ModelCall` per exchange, previews and notifications), so
`session.trace` ends as verifiers' server would have left it; intercept does the HTTP,
the relay (streams live, only the terminal event held until the turn is committed), the
pooled upstream, retries, pools and tunnels. An `intercept.Session` is accepted too (its
trace is then `session.trace()`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from ._errors import InvalidRequestError
from ._interception import ElasticPool, Interception, Server, StaticPool
from ._session import Session
from ._verifiers import SUPPORTED, Bridge, VerifiersVersionError, check_version, upstream_of, vf
from .tunnels import Custom, Prime

__all__ = [
    "SUPPORTED",
    "VerifiersVersionError",
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


def _settings(state_service_secrets: Collection[str], settings: dict[str, Any]) -> dict[str, Any]:
    secrets = [str(s) for s in state_service_secrets if s]
    if secrets:
        settings = {**settings, "service_secrets": secrets}
    return settings


class _Compat:
    """The shared part: lifecycle, `load`, `base_url` and `acquire(session)`."""

    def __init__(self, ic: Interception, upstream: Any) -> None:
        self._ic = ic
        self._upstream = upstream
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

    @asynccontextmanager
    async def acquire(self, session: Any) -> AsyncIterator[tuple[str, str, str]]:
        """verifiers' `acquire`: registers the rollout and yields `(base_url, model_secret,
        state_secret)`; on exit the rollout is sealed (late calls get 409, calls in flight
        are cancelled and leave no `ModelCall`, as in verifiers)."""
        if isinstance(session, Session):
            async with self._ic.acquire(session) as slot:
                yield (slot.base_url, slot.model_secret, slot.state_secret)
            return
        if not isinstance(session, vf().session_cls):
            raise InvalidRequestError(
                f"acquire: expected a verifiers RolloutSession or an intercept.Session, got {type(session).__name__}"
            )
        bridge = Bridge(session)
        ours = Session(
            id=str(session.trace.id),
            model=str(session.ctx.model),
            upstream=upstream_of(session, self._upstream),
            on_request=bridge.on_request,
            on_response=bridge.on_response if bridge.inspects_responses else None,
            hook_headers=sorted(vf().semantic.ACP_EXTENSION_HEADERS),
        )
        ours._native.set_record_hook(bridge.on_record, asyncio.get_running_loop())
        ours._native.set_state_hook(bridge.get_state, bridge.put_state)
        ours._native.set_task_body(bridge.task_body())
        ours._native.set_tool_hook(bridge.on_tool)
        slot = await self._ic.acquire(ours)
        try:
            yield (slot.base_url, slot.model_secret, slot.state_secret)
        finally:
            bridge.release()
            await slot.release()
            bridge.drain()


class InterceptionServer(_Compat):
    """verifiers' `InterceptionServer(config, requires_tunnel, state_service_secrets)`: one shared server."""

    def __init__(
        self,
        config: Any = None,
        requires_tunnel: bool = False,
        state_service_secrets: Collection[str] = (),
        *,
        upstream: Any = None,
        **settings: Any,
    ) -> None:
        check_version()
        config = config if config is not None else InterceptionServerConfig()
        tunnel = _tunnel(_get(config, "tunnel", PrimeTunnelConfig())) if requires_tunnel else None
        super().__init__(Server(tunnel=tunnel, **_settings(state_service_secrets, settings)), upstream)
        self.config = config


class StaticInterceptionPool(_Compat):
    """verifiers' `StaticInterceptionPool(config, requires_tunnel, state_service_secrets)`: a
    fixed list of servers, least-loaded first."""

    def __init__(
        self,
        config: Any,
        requires_tunnel: bool = False,
        state_service_secrets: Collection[str] = (),
        *,
        upstream: Any = None,
        **settings: Any,
    ) -> None:
        check_version()
        servers = list(_get(config, "servers") or [])
        if not servers:
            raise InvalidRequestError("StaticInterceptionPoolConfig.servers: at least one server")
        entries = [_tunnel(_get(s, "tunnel", PrimeTunnelConfig())) if requires_tunnel else None for s in servers]
        super().__init__(StaticPool(entries, **_settings(state_service_secrets, settings)), upstream)
        self.config = config


class ElasticInterceptionPool(_Compat):
    """verifiers' `ElasticInterceptionPool(config, requires_tunnel, state_service_secrets)`:
    `multiplex` rollouts per server, servers started on demand (Prime tunnels when a tunnel
    is required, as in verifiers)."""

    def __init__(
        self,
        config: Any = None,
        requires_tunnel: bool = False,
        state_service_secrets: Collection[str] = (),
        *,
        upstream: Any = None,
        **settings: Any,
    ) -> None:
        check_version()
        config = config if config is not None else ElasticInterceptionPoolConfig()
        multiplex = int(_get(config, "multiplex", 32))
        if multiplex < 1:
            raise InvalidRequestError("multiplex: must be at least 1")
        tunnel = Prime() if requires_tunnel else None
        super().__init__(ElasticPool(multiplex=multiplex, tunnel=tunnel, **_settings(state_service_secrets, settings)), upstream)
        self.config = config


def make_interception(
    config: Any, *, requires_tunnel: bool, state_service_secrets: tuple[str, ...] = (), upstream: Any = None
) -> _Compat:
    """verifiers' `make_interception`: the shape by the config's `type`."""
    kind = _get(config, "type", "elastic")
    if kind == "server":
        return InterceptionServer(config, requires_tunnel, state_service_secrets, upstream=upstream)
    if kind == "static":
        return StaticInterceptionPool(config, requires_tunnel, state_service_secrets, upstream=upstream)
    return ElasticInterceptionPool(config, requires_tunnel, state_service_secrets, upstream=upstream)
