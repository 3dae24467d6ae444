"""Request and response hooks: `Stop`, `CallInfo`, and how the native server runs them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Union

from ._errors import InvalidRequestError, RolloutConcludedError
from ._types import Dialect

__all__ = ["Stop", "CallInfo", "RequestHook", "ResponseHook"]


@dataclass(frozen=True, slots=True)
class Stop:
    """Returned by a hook: stop the rollout with this condition. The harness gets
    400 `rollout stopped: <reason>`; later calls are refused the same way."""

    reason: str = "hook"


@dataclass(frozen=True, slots=True)
class CallInfo:
    """What a hook that takes two arguments learns about the call."""

    dialect: Dialect
    """`chat_completions`, `responses`, `messages` or `completions`."""
    stream: bool
    """Whether the harness asked for a stream."""
    seq: int
    """Per-session sequence number of the call (from 0)."""
    session: str
    """The rollout id."""
    headers: dict[str, str] = field(default_factory=dict)
    """The request headers the session consumes (lower-case names), as the call carried
    them; empty unless the session asked for some (`NativeSession.set_hook_headers`).
    Such headers are not forwarded upstream, and credentials never appear here."""


HookResult = Union[dict[str, Any], Stop, None]
RequestHook = Callable[..., Union[HookResult, Awaitable[HookResult]]]
ResponseHook = RequestHook

_DONE, _STOP, _ERROR, _CANCELLED, _INVALID, _CONCLUDED, _STATUS = 0, 1, 2, 3, 4, 5, 6

GenerateHook = Callable[[dict[str, Any], CallInfo], Awaitable[dict[str, Any]]]
"""`hook(body, call)` answering a model call itself (`NativeSession.set_generate_hook`):
returns `{"response": dict, "tokens": {"prompt_ids", "completion_ids", "logprobs", "path",
"reason"} | None}`."""


def takes_call(fn: Callable[..., Any]) -> bool:
    """Whether `fn` accepts a second positional argument (the `CallInfo`)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    positional = 0
    for p in sig.parameters.values():
        if p.kind == p.VAR_POSITIONAL:
            return True
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 2


def run_hook(
    loop: asyncio.AbstractEventLoop,
    fn: Callable[..., Any],
    payload: bytes,
    with_call: bool,
    call: tuple[Dialect, bool, int, str, list[tuple[str, str]]],
    done: Callable[[int, str | None], None],
) -> concurrent.futures.Future[Any]:
    """Schedules `fn` on `loop` (called by the native server from its own threads) and
    reports the outcome through `done(tag, text)` exactly once. A hook that raises
    `InvalidRequestError` answers the call 400 with its message, one that raises
    `RolloutConcludedError` 409."""
    body = json.loads(payload)

    async def runner() -> Any:
        dialect, stream, seq, session, headers = call
        args = (body, CallInfo(dialect, stream, seq, session, dict(headers))) if with_call else (body,)
        result = fn(*args)
        if inspect.isawaitable(result):
            result = await result
        return result

    def finish(fut: concurrent.futures.Future[Any]) -> None:
        try:
            if fut.cancelled():
                done(_CANCELLED, None)
                return
            exc = fut.exception()
            if isinstance(exc, InvalidRequestError):
                done(_INVALID, str(exc))
                return
            if isinstance(exc, RolloutConcludedError):
                done(_CONCLUDED, str(exc))
                return
            if exc is not None:
                done(_ERROR, f"raised {type(exc).__name__}: {exc}")
                return
            result = fut.result()
            if isinstance(result, Stop):
                done(_STOP, str(result.reason))
                return
            if result is None:
                result = body  # edited in place, or not at all
            if not isinstance(result, dict):
                done(_ERROR, f"returned a {type(result).__name__}; return a dict, None or intercept.Stop(reason)")
                return
            done(_DONE, json.dumps(result, ensure_ascii=False, allow_nan=False))
        except BaseException as e:  # noqa: BLE001 - every outcome must be reported
            done(_ERROR, f"returned a value that cannot be sent: {type(e).__name__}: {e}")

    coro = runner()
    try:
        fut = asyncio.run_coroutine_threadsafe(coro, loop)
    except BaseException:
        coro.close()
        raise
    fut.add_done_callback(finish)
    return fut


def _status_of(exc: BaseException) -> int | None:
    """The HTTP status an exception carries (`status_code`, as verifiers' `ProviderError`
    and the SDKs' status errors do), if it is an integer."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return status
    return None


def run_generate(
    loop: asyncio.AbstractEventLoop,
    fn: Callable[..., Any],
    payload: bytes,
    with_call: bool,
    call: tuple[Dialect, bool, int, str, list[tuple[str, str]]],
    done: Callable[[int, str | None], None],
) -> concurrent.futures.Future[Any]:
    """Schedules a generate hook `fn(body, call)` on `loop` (called by the native server)
    and reports through `done(tag, text)` exactly once: its answer `{"response": dict,
    "tokens": dict | None}` as JSON; `InvalidRequestError` as a 400, an exception with an
    integer `status_code` as that status, any other exception as a failure (502)."""
    body = json.loads(payload)

    async def runner() -> Any:
        dialect, stream, seq, session, headers = call
        return await fn(body, CallInfo(dialect, stream, seq, session, dict(headers)))

    def finish(fut: concurrent.futures.Future[Any]) -> None:
        try:
            if fut.cancelled():
                done(_CANCELLED, None)
                return
            exc = fut.exception()
            if isinstance(exc, InvalidRequestError):
                done(_INVALID, str(exc))
                return
            if isinstance(exc, RolloutConcludedError):
                done(_CONCLUDED, str(exc))
                return
            if exc is not None:
                status = _status_of(exc)
                if status is not None:
                    done(_STATUS, json.dumps({"status": status, "message": str(exc) or type(exc).__name__}))
                    return
                done(_ERROR, f"raised {type(exc).__name__}: {exc}")
                return
            result = fut.result()
            if not isinstance(result, dict) or not isinstance(result.get("response"), dict):
                done(_ERROR, f"returned a {type(result).__name__}; return {{'response': dict, 'tokens': dict | None}}")
                return
            done(_DONE, json.dumps(result, ensure_ascii=False, allow_nan=False))
        except BaseException as e:  # noqa: BLE001 - every outcome must be reported
            done(_ERROR, f"returned a value that cannot be sent: {type(e).__name__}: {e}")

    coro = runner()
    try:
        fut = asyncio.run_coroutine_threadsafe(coro, loop)
    except BaseException:
        coro.close()
        raise
    fut.add_done_callback(finish)
    return fut


def resolve(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    """Resolves an awaitable of the native module (called on its loop's thread)."""
    if fut.done():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)
