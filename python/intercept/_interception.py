"""`Server`, `StaticPool`, `ElasticPool`: interceptions rollouts acquire slots on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Generator, Sequence
from types import TracebackType
from typing import Any

from . import _native
from ._errors import InvalidRequestError
from ._records import PauseStatus, ServerStatus
from ._session import Session
from ._types import PauseMode, expect, wrong_type
from .tunnels import Tunnel, tunnel_config

__all__ = ["Server", "StaticPool", "ElasticPool", "Slot", "Interception"]

POOL_KNOBS = (
    "min_servers",
    "max_servers",
    "max_concurrent_starts",
    "wait_timeout",
    "idle_timeout",
    "health_interval",
    "drain_timeout",
    "start_attempts",
    "backoff_base",
    "backoff_max",
)


def _settings(settings: dict[str, Any]) -> str:
    """Server settings for the native module, which reads them as `ServerConfig`'s fields
    (an unknown name is refused there, with the known ones); None keeps a default."""
    clean = {k: v for k, v in settings.items() if v is not None}
    if "listen" in clean:
        clean["listen"] = str(clean["listen"])
    return json.dumps(clean)


class Slot:
    """What a rollout gets: where its harness goes (`env`), and the hold on the slot.

    `env` holds `OPENAI_BASE_URL` (`base_url + "/v1"`), `OPENAI_API_KEY`,
    `ANTHROPIC_BASE_URL` (`base_url`) and `ANTHROPIC_API_KEY`: pass it to the harness's
    process or SDK. `release()` frees the slot: late calls get 409, in-flight calls are
    cancelled and recorded, and the trace is sealed once it returns.
    """

    __slots__ = ("_native", "session")

    def __init__(self, native: Any, session: Session) -> None:
        self._native = native
        self.session = session

    @property
    def base_url(self) -> str:
        return str(self._native.base_url)

    @property
    def model_secret(self) -> str:
        return str(self._native.model_secret)

    @property
    def state_secret(self) -> str:
        return str(self._native.state_secret)

    @property
    def env(self) -> dict[str, str]:
        return dict(self._native.env())

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.base_url

    @property
    def released(self) -> bool:
        return bool(self._native.released)

    def report_tunnel_failure(self, text: str) -> bool:
        """Hands intercept the harness's failure text (its stderr, an exception message).
        True when the slot's tunnel backend recognises its tunnel dead in it (Prime's
        `404 Tunnel not found or no longer active`): the server behind the slot is healed
        at once (a new tunnel, or a new server), and the rollout should be retried on a
        new slot. False for any other failure, and for a released slot."""
        expect("text", text, str, "a str")
        return bool(self._native.report_tunnel_failure(text))

    @property
    def endpoint_lost(self) -> bool:
        """Whether `base_url` is gone for good: the slot's tunnel was re-minted at a new
        URL, so the harness can no longer reach the server through it."""
        return bool(self._native.endpoint_lost)

    async def release(self) -> None:
        """Frees the slot; returns once in-flight calls recorded and the trace is sealed.
        Idempotent. Completes even if the awaiting task is cancelled meanwhile."""
        await self._native.release()

    def release_now(self) -> None:
        """Frees the slot at once without waiting (calls in flight are cancelled and
        recorded in the background)."""
        self._native.release_now()

    def __repr__(self) -> str:
        return f"Slot(base_url={self.base_url!r}, session={self.session.id!r}, released={self.released})"


def _pause_seconds(mode: object, timeout: object, retry_after: object) -> float:
    """The seconds of a pause in `mode`, the arguments' types checked."""
    expect("mode", mode, str, "'hold' or 'reject'")
    expect("timeout", timeout, (int, float), "a number of seconds")
    expect("retry_after", retry_after, (int, float), "a number of seconds")
    return float(timeout if mode == "hold" else retry_after)  # type: ignore[arg-type]


class _Acquire:
    """`await ic.acquire(s)` gives a `Slot`; `async with ic.acquire(s) as slot:` releases it on exit."""

    __slots__ = ("_ic", "_session", "_slot")

    def __init__(self, ic: Interception, session: Session) -> None:
        self._ic = ic
        self._session = session
        self._slot: Slot | None = None

    async def _acquire(self) -> Slot:
        session = self._session
        # Claimed while the acquire runs (a concurrent acquire of the same session is a
        # ConflictError), given back if it fails or is cancelled: a retry may succeed.
        session._claim()
        try:
            if session._hooks:
                session._native.bind_loop(asyncio.get_running_loop())
            native = await self._ic._native.acquire(session._native)
        except BaseException:
            session._unclaim()
            raise
        return Slot(native, session)

    def __await__(self) -> Generator[Any, None, Slot]:
        return self._acquire().__await__()

    async def __aenter__(self) -> Slot:
        self._slot = await self._acquire()
        return self._slot

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self._slot is not None:
            await self._slot.release()


class Interception:
    """The lifecycle every shape shares: `start`/`stop` (or `async with`), `acquire`."""

    def __init__(self, config: dict[str, Any], requires_tunnel: bool, settings: dict[str, Any]) -> None:
        self._config = config
        self._native = _native.NativeInterception(json.dumps(config), requires_tunnel, _settings(settings))

    async def start(self) -> None:
        """Brings the servers (and tunnels) up; a failing start tears down what it made."""
        await self._native.start()

    async def stop(self) -> None:
        """Stops accepting, lets in-flight calls finish (up to `shutdown_grace`), cancels
        and records the rest, seals every session, tears servers and tunnels down."""
        await self._native.stop()

    async def __aenter__(self) -> Interception:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    def acquire(self, session: Session) -> _Acquire:
        """Registers `session` on a server and gives its `Slot` (awaitable, or an async
        context manager that releases the slot on exit). An acquire that fails (not
        started, no room before `wait_timeout`, a session setting refused) or is cancelled
        leaves `session` free to be acquired again."""
        expect("session", session, Session, "an intercept.Session")
        return _Acquire(self, session)

    @property
    def load(self) -> int:
        """Sessions holding a slot."""
        return int(self._native.load())

    @property
    def inflight(self) -> int:
        """Model calls in flight."""
        return int(self._native.inflight())

    async def servers(self) -> list[ServerStatus]:
        """The servers as they are now."""
        return [ServerStatus(**s) for s in json.loads(await self._native.servers())]

    async def base_url(self) -> str | None:
        """The first server's base URL (for a `Server`: its URL), None before start."""
        servers = await self.servers()
        return servers[0].base_url if servers else None

    async def pause(self, mode: PauseMode = "hold", *, timeout: float = 600.0, retry_after: float = 5.0) -> PauseStatus:
        """Pauses new model calls (weight sync). `hold`: they wait for `resume()` (at most
        `timeout` s, then 503); `reject`: 429 with `Retry-After: retry_after` at once.
        Calls already admitted finish. Swap weights once `inflight` is 0."""
        seconds = _pause_seconds(mode, timeout, retry_after)
        return PauseStatus(**json.loads(await self._native.pause(mode, float(seconds))))

    async def resume(self) -> PauseStatus:
        """Resumes model calls; the pause epoch goes up by one."""
        return PauseStatus(**json.loads(await self._native.resume()))

    def pause_status(self) -> PauseStatus:
        return PauseStatus(**json.loads(self._native.pause_status()))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(load={self.load}, inflight={self.inflight})"


class Server(Interception):
    """One server that multiplexes every rollout. Without a tunnel it binds
    `127.0.0.1` on an ephemeral port (or `listen`); with one, where the tunnel says.

    Server settings are the fields of the Rust `ServerConfig`, durations in seconds:
    `listen`, `body_limit`, `keepalive`, `stream_heartbeat` (`"event"`, `"comment"` or
    `"off"`), `upstream_timeout`, ... (see docs/configuration.md); an unknown one is an
    `InvalidRequestError` that lists the known ones.
    """

    def __init__(self, *, tunnel: Tunnel | None = None, **settings: Any) -> None:
        t = tunnel_config(tunnel)
        super().__init__({"type": "server", "tunnel": t or {"type": "none"}}, t is not None, settings)


class StaticPool(Interception):
    """A fixed list of servers, all started up front; each acquire goes to the
    least-loaded one. `servers` is a count, or one entry per server: a tunnel, None, or
    `{"tunnel": ..., "listen": "127.0.0.1:8100"}`."""

    def __init__(self, servers: int | Sequence[Any] = 2, **settings: Any) -> None:
        if isinstance(servers, str) or not isinstance(servers, (int, Sequence)) or isinstance(servers, bool):
            wrong_type("servers", "a count (int) or a list with one entry per server", servers)
        if isinstance(servers, int):
            if servers < 1:
                raise InvalidRequestError("StaticPool: at least one server")
            entries: list[Any] = [None] * servers
        else:
            entries = list(servers)
            if not entries:
                raise InvalidRequestError("StaticPool: at least one server")
        out = []
        for entry in entries:
            if isinstance(entry, dict) and ("tunnel" in entry or "listen" in entry):
                t = tunnel_config(entry.get("tunnel"))
                item: dict[str, Any] = {"tunnel": t or {"type": "none"}}
                if entry.get("listen") is not None:
                    item["listen"] = str(entry["listen"])
            else:
                t = tunnel_config(entry)
                item = {"tunnel": t or {"type": "none"}}
            out.append(item)
        requires = any(e["tunnel"]["type"] != "none" for e in out)
        super().__init__({"type": "static", "servers": out}, requires, settings)


class ElasticPool(Interception):
    """Servers of `multiplex` sessions each, started on demand (several at once, bounded
    by the tunnel rate limiter), healed when a tunnel dies, shrunk when idle. Each server
    gets its own `tunnel` (None: loopback, no tunnel).

    Pool knobs: `min_servers`, `max_servers`, `max_concurrent_starts`, `wait_timeout`,
    `idle_timeout`, `health_interval`, `drain_timeout`, `start_attempts`,
    `backoff_base`, `backoff_max` (docs/pools.md); the other keywords are server settings.
    """

    def __init__(self, multiplex: int = 32, tunnel: Tunnel | None = None, **settings: Any) -> None:
        expect("multiplex", multiplex, int, "an int (sessions per server)")
        t = tunnel_config(tunnel)
        knobs = {k: settings.pop(k) for k in list(settings) if k in POOL_KNOBS}
        knobs = {k: v for k, v in knobs.items() if v is not None}
        config = {"type": "elastic", "tunnel": t or {"type": "none"}, "multiplex": multiplex, **knobs}
        super().__init__(config, t is not None, settings)
