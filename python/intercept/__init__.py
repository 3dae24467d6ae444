"""intercept: the interception layer of RL rollouts, as a native Python package.

Harnesses (any OpenAI or Anthropic SDK) are pointed at an in-process server through the
environment of their slot; every model call is routed to its rollout by a per-rollout
secret, gets the rollout's model and sampling imposed, is proxied to the upstream engine
and recorded on the rollout's trace::

    import intercept

    async with intercept.ElasticPool(multiplex=32) as ic:      # or Server(), StaticPool(n)
        session = intercept.Session(id="rollout-17", model="policy",
                                    upstream="http://127.0.0.1:8000/v1",
                                    sampling={"temperature": 0.7}, limits={"max_turns": 32})
        async with ic.acquire(session) as slot:
            await run_harness(env=slot.env)
        trace = session.trace()

See docs/python.md for the whole API.
"""

from __future__ import annotations

import atexit as _atexit

from . import _native, tunnels
from ._errors import (
    CallCancelledError,
    ClientDisconnectedError,
    ConflictError,
    EpisodeUnavailableError,
    GoneError,
    HookFailedError,
    InterceptError,
    InternalError,
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    PausedError,
    PayloadTooLargeError,
    RolloutConcludedError,
    RolloutStoppedError,
    TunnelError,
    UnauthorizedError,
    UnavailableError,
    UpstreamMalformedError,
    UpstreamStatusError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
    UpgradeRequiredError,
    error_class,
)
from ._hooks import CallInfo, Stop
from ._interception import ElasticPool, Interception, Server, Slot, StaticPool
from ._native import __version__, enable_logging
from ._episode import Branch, Episode, EpisodeSummary, Node
from ._records import CallError, CallRecord, PauseStatus, ServerStatus, Totals, Trace, TraceLog, Usage, read_trace
from ._session import Session
from ._tokens import Tokens
from ._types import Dialect, PauseMode, SessionStatus

__all__ = [
    "__version__",
    "enable_logging",
    "tunnels",
    "Server",
    "StaticPool",
    "ElasticPool",
    "Interception",
    "Slot",
    "Session",
    "Tokens",
    "Dialect",
    "PauseMode",
    "SessionStatus",
    "Stop",
    "CallInfo",
    "Trace",
    "TraceLog",
    "read_trace",
    "Episode",
    "Node",
    "Branch",
    "EpisodeSummary",
    "CallRecord",
    "CallError",
    "Usage",
    "Totals",
    "PauseStatus",
    "ServerStatus",
    "error_class",
    "InterceptError",
    "UnauthorizedError",
    "InvalidRequestError",
    "PayloadTooLargeError",
    "NotFoundError",
    "MethodNotAllowedError",
    "RolloutConcludedError",
    "RolloutStoppedError",
    "UpstreamStatusError",
    "UpstreamTimeoutError",
    "UpstreamUnavailableError",
    "UpstreamMalformedError",
    "ClientDisconnectedError",
    "CallCancelledError",
    "TunnelError",
    "ConflictError",
    "PausedError",
    "UnavailableError",
    "HookFailedError",
    "InternalError",
    "UpgradeRequiredError",
    "GoneError",
    "EpisodeUnavailableError",
]

# Before the interpreter finalises, stop every interception still running (calls in flight
# are cancelled and recorded), so that no server thread is inside Python while it exits.
_atexit.register(_native.at_exit, 5.0)
