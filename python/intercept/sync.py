"""A blocking facade for scripts: `intercept.sync.Server`, `StaticPool`, `ElasticPool`.

Each runs its interception on a private asyncio loop in a background thread (hooks run
there too); every method blocks until done::

    from intercept import Session, sync

    with sync.Server() as ic:
        session = Session(id="r1", model="policy", upstream="http://127.0.0.1:8000/v1")
        with ic.acquire(session) as slot:
            subprocess.run(["my-harness"], env={**os.environ, **slot.env}, check=True)
        print(len(session.trace().calls))
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from types import TracebackType
from typing import Any, TypeVar

from . import _interception
from ._interception import Interception as _AsyncInterception
from ._records import PauseStatus, ServerStatus
from ._session import Session
from ._types import PauseMode
from .tunnels import Tunnel

__all__ = ["Server", "StaticPool", "ElasticPool", "Slot"]

T = TypeVar("T")


class _Portal:
    """An event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="intercept-sync", daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Runs `coro` on the loop and waits for it; an interruption of the wait (Ctrl-C)
        cancels it there too, so nothing outlives the call (an acquire holds no slot)."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class Slot:
    """A slot held from sync code; see `intercept.Slot`."""

    def __init__(self, slot: _interception.Slot, portal: _Portal) -> None:
        self._slot = slot
        self._portal = portal

    @property
    def env(self) -> dict[str, str]:
        return self._slot.env

    @property
    def base_url(self) -> str:
        return self._slot.base_url

    @property
    def openai_base_url(self) -> str:
        """`base_url + "/v1"`, what OpenAI SDKs take."""
        return self._slot.openai_base_url

    @property
    def anthropic_base_url(self) -> str:
        """`base_url`, what Anthropic SDKs take."""
        return self._slot.anthropic_base_url

    @property
    def model_secret(self) -> str:
        return self._slot.model_secret

    @property
    def state_secret(self) -> str:
        return self._slot.state_secret

    @property
    def session(self) -> Session:
        return self._slot.session

    @property
    def released(self) -> bool:
        return self._slot.released

    @property
    def endpoint_lost(self) -> bool:
        return self._slot.endpoint_lost

    def report_tunnel_failure(self, text: str) -> bool:
        """See `intercept.Slot.report_tunnel_failure`."""
        return self._slot.report_tunnel_failure(text)

    def release(self) -> None:
        """Frees the slot; returns once the trace is sealed."""
        self._portal.call(self._slot.release())

    def release_now(self) -> None:
        """Frees the slot at once without waiting (calls in flight are cancelled and
        recorded in the background)."""
        self._slot.release_now()

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"sync.{self._slot!r}"


_S = TypeVar("_S", bound="_Sync")


class _Sync:
    """What every blocking interception offers: the async one's methods, each waiting."""

    _ic: _AsyncInterception

    def __init__(self, ic: _AsyncInterception) -> None:
        self._ic = ic
        self._portal: _Portal | None = None

    def _p(self) -> _Portal:
        if self._portal is None:
            raise RuntimeError("not started: call start() or use `with`")
        return self._portal

    def start(self) -> None:
        """Brings the servers (and tunnels) up; see `intercept.Interception.start`."""
        if self._portal is None:
            self._portal = _Portal()
        self._portal.call(self._ic.start())

    def stop(self) -> None:
        """Stops everything and seals every session; see `intercept.Interception.stop`."""
        portal = self._portal
        if portal is None:
            return
        try:
            portal.call(self._ic.stop())
        finally:
            self._portal = None
            portal.close()

    def __enter__(self: _S) -> _S:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def acquire(self, session: Session) -> Slot:
        """Registers `session` and returns its slot (a context manager that releases it).
        An acquire that fails or is interrupted leaves `session` free to be acquired
        again."""
        pending = self._ic.acquire(session)
        portal = self._p()

        async def go() -> _interception.Slot:
            return await pending

        return Slot(portal.call(go()), portal)

    @property
    def load(self) -> int:
        """Sessions holding a slot."""
        return self._ic.load

    @property
    def inflight(self) -> int:
        """Model calls in flight."""
        return self._ic.inflight

    def servers(self) -> list[ServerStatus]:
        """The servers as they are now."""
        return self._p().call(self._ic.servers())

    def base_url(self) -> str | None:
        """The first server's base URL (for a `Server`: its URL), None before start."""
        if self._portal is None:
            return None
        return self._portal.call(self._ic.base_url())

    def pause(self, mode: PauseMode = "hold", *, timeout: float = 600.0, retry_after: float = 5.0) -> PauseStatus:
        """Pauses new model calls; see `intercept.Interception.pause`."""
        return self._p().call(self._ic.pause(mode, timeout=timeout, retry_after=retry_after))

    def resume(self) -> PauseStatus:
        """Resumes model calls; the pause epoch goes up by one."""
        return self._p().call(self._ic.resume())

    def pause_status(self) -> PauseStatus:
        return self._ic.pause_status()

    def __repr__(self) -> str:
        return f"sync.{self._ic!r}"


class Server(_Sync):
    """`intercept.Server`, blocking."""

    def __init__(self, *, tunnel: Tunnel | None = None, **settings: Any) -> None:
        super().__init__(_interception.Server(tunnel=tunnel, **settings))


class StaticPool(_Sync):
    """`intercept.StaticPool`, blocking."""

    def __init__(self, servers: int | Sequence[Any] = 2, **settings: Any) -> None:
        super().__init__(_interception.StaticPool(servers, **settings))


class ElasticPool(_Sync):
    """`intercept.ElasticPool`, blocking."""

    def __init__(self, multiplex: int = 32, tunnel: Tunnel | None = None, **settings: Any) -> None:
        super().__init__(_interception.ElasticPool(multiplex, tunnel, **settings))
