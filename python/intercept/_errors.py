"""Exceptions: `InterceptError` and one subclass per error kind of the Rust core.

Every exception carries `kind` (a stable snake_case name), `status` (the HTTP status the
harness gets, or would get, for it), `message` (what happened and what to do), `blame`
(`client`, `upstream`, `tunnel` or `internal`) and `retryable`.
"""

from __future__ import annotations

from typing import Any


class InterceptError(Exception):
    """Base of every intercept error."""

    default_kind: str = "internal"
    default_status: int = 500
    default_blame: str = "internal"

    def __init__(
        self,
        message: str,
        *,
        kind: str | None = None,
        status: int | None = None,
        blame: str | None = None,
        retryable: bool = False,
    ) -> None:
        super().__init__(message)
        self.message: str = message
        self.kind: str = kind or type(self).default_kind
        self.status: int = type(self).default_status if status is None else status
        self.blame: str = blame or type(self).default_blame
        self.retryable: bool = retryable

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, kind={self.kind!r}, status={self.status})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.kind, self.status, self.blame, self.retryable))


def _rebuild(cls: type[InterceptError], message: str, kind: str, status: int, blame: str, retryable: bool) -> InterceptError:
    return cls(message, kind=kind, status=status, blame=blame, retryable=retryable)


class UnauthorizedError(InterceptError):
    """Missing or unknown secret."""

    default_kind = "unauthorized"
    default_status = 401
    default_blame = "client"


class InvalidRequestError(InterceptError, ValueError):
    """A malformed request or setting (also a ValueError)."""

    default_kind = "invalid_request"
    default_status = 400
    default_blame = "client"


class PayloadTooLargeError(InterceptError):
    """A request body over the configured cap."""

    default_kind = "payload_too_large"
    default_status = 413
    default_blame = "client"


class NotFoundError(InterceptError):
    """No such route."""

    default_kind = "not_found"
    default_status = 404
    default_blame = "client"


class MethodNotAllowedError(InterceptError):
    """The route exists, not for this method."""

    default_kind = "method_not_allowed"
    default_status = 405
    default_blame = "client"


class RolloutConcludedError(InterceptError):
    """The rollout was released; nothing more is accepted."""

    default_kind = "rollout_concluded"
    default_status = 409
    default_blame = "client"


class RolloutStoppedError(InterceptError):
    """The rollout stopped (a limit, a hook, a context-length error)."""

    default_kind = "rollout_stopped"
    default_status = 400
    default_blame = "client"


class UpstreamStatusError(InterceptError):
    """The upstream answered with an error status (kept as `status`)."""

    default_kind = "upstream_status"
    default_status = 502
    default_blame = "upstream"


class UpstreamTimeoutError(InterceptError, TimeoutError):
    """The upstream did not answer in time (also a TimeoutError)."""

    default_kind = "upstream_timeout"
    default_status = 504
    default_blame = "upstream"


class UpstreamUnavailableError(InterceptError):
    """The upstream could not be reached or dropped the connection."""

    default_kind = "upstream_unavailable"
    default_status = 503
    default_blame = "upstream"


class UpstreamMalformedError(InterceptError):
    """The upstream's answer is not what the dialect expects."""

    default_kind = "upstream_malformed"
    default_status = 502
    default_blame = "upstream"


class ClientDisconnectedError(InterceptError):
    """The harness went away before the call finished."""

    default_kind = "client_disconnected"
    default_status = 499
    default_blame = "client"


class CallCancelledError(InterceptError):
    """The call was cancelled (rollout released or server stopping)."""

    default_kind = "cancelled"
    default_status = 503
    default_blame = "internal"


class TunnelError(InterceptError):
    """A tunnel failed or is misconfigured."""

    default_kind = "tunnel"
    default_status = 502
    default_blame = "tunnel"


class ConflictError(InterceptError):
    """A conflict with existing state (e.g. a session acquired twice)."""

    default_kind = "conflict"
    default_status = 409
    default_blame = "client"


class PausedError(InterceptError):
    """Model calls are paused (weight sync)."""

    default_kind = "paused"
    default_status = 429
    default_blame = "internal"


class UnavailableError(InterceptError):
    """No capacity: a pool at its cap, or no server came up in time."""

    default_kind = "unavailable"
    default_status = 503
    default_blame = "internal"


class HookFailedError(InterceptError):
    """A session hook raised or returned something unusable."""

    default_kind = "hook_failed"
    default_status = 502
    default_blame = "internal"


class InternalError(InterceptError):
    """intercept failed internally."""

    default_kind = "internal"
    default_status = 500
    default_blame = "internal"


class EpisodeUnavailableError(InterceptError, NotImplementedError):
    """This build has no episode (message graph) support (also a NotImplementedError)."""

    default_kind = "episode_unavailable"
    default_status = 501
    default_blame = "internal"


_BY_KIND: dict[str, type[InterceptError]] = {
    cls.default_kind: cls
    for cls in (
        UnauthorizedError,
        InvalidRequestError,
        PayloadTooLargeError,
        NotFoundError,
        MethodNotAllowedError,
        RolloutConcludedError,
        RolloutStoppedError,
        UpstreamStatusError,
        UpstreamTimeoutError,
        UpstreamUnavailableError,
        UpstreamMalformedError,
        ClientDisconnectedError,
        CallCancelledError,
        TunnelError,
        ConflictError,
        PausedError,
        UnavailableError,
        HookFailedError,
        InternalError,
        EpisodeUnavailableError,
    )
}


def error_class(kind: str) -> type[InterceptError]:
    """The exception class of an error kind (`InterceptError` for an unknown kind)."""
    return _BY_KIND.get(kind, InterceptError)


def _from_native(kind: str, status: int, message: str, blame: str, retryable: bool) -> InterceptError:
    return error_class(kind)(message, kind=kind, status=status, blame=blame, retryable=retryable)


__all__ = ["InterceptError", "error_class", *[c.__name__ for c in _BY_KIND.values()]]
