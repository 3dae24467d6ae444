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
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

from . import _interception
from ._interception import Interception as _AsyncInterception
from ._records import PauseStatus, ServerStatus
from ._session import Session

__all__ = ["Server", "StaticPool", "ElasticPool", "Slot"]

T = TypeVar("T")


class _Portal:
    """An event loop running in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="intercept-sync", daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

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

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"sync.{self._slot!r}"


class _Sync:
    _cls: type[_AsyncInterception]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._ic = self._cls(*args, **kwargs)
        self._portal: _Portal | None = None

    def _p(self) -> _Portal:
        if self._portal is None:
            raise RuntimeError("not started: call start() or use `with`")
        return self._portal

    def start(self) -> None:
        if self._portal is None:
            self._portal = _Portal()
        self._portal.call(self._ic.start())

    def stop(self) -> None:
        portal = self._portal
        if portal is None:
            return
        try:
            portal.call(self._ic.stop())
        finally:
            self._portal = None
            portal.close()

    def __enter__(self) -> _Sync:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def acquire(self, session: Session) -> Slot:
        """Registers `session` and returns its slot (a context manager that releases it)."""
        portal = self._p()

        async def go() -> _interception.Slot:
            return await self._ic.acquire(session)

        return Slot(portal.call(go()), portal)

    @property
    def load(self) -> int:
        return self._ic.load

    @property
    def inflight(self) -> int:
        return self._ic.inflight

    def servers(self) -> list[ServerStatus]:
        return self._p().call(self._ic.servers())

    def pause(self, mode: str = "hold", *, timeout: float = 600.0, retry_after: float = 5.0) -> PauseStatus:
        return self._p().call(self._ic.pause(mode, timeout=timeout, retry_after=retry_after))

    def resume(self) -> PauseStatus:
        return self._p().call(self._ic.resume())

    def pause_status(self) -> PauseStatus:
        return self._ic.pause_status()


class Server(_Sync):
    """`intercept.Server`, blocking."""

    _cls = _interception.Server


class StaticPool(_Sync):
    """`intercept.StaticPool`, blocking."""

    _cls = _interception.StaticPool


class ElasticPool(_Sync):
    """`intercept.ElasticPool`, blocking."""

    _cls = _interception.ElasticPool
