"""Exceptions: `InterceptError` and one subclass per error kind of the Rust core.

Every exception carries `kind` (a stable snake_case name), `status` (the HTTP status the
harness gets, or would get, for it), `message` (what happened and what to do), `blame`
(`client`, `upstream`, `tunnel` or `internal`) and `retryable`.

The kinds are the Rust core's (`intercept_core::ErrorKind`, exported by the native module
as `ERROR_KINDS`): each class below is named after its kind (`invalid_request` is
`InvalidRequestError`) and takes its kind, status, blame and doc from there. The classes
are written out only so that imports and type checkers see them; a kind without a class
here fails `tests/test_errors_records.py`.
"""

from __future__ import annotations

from typing import Any

from ._native import ERROR_KINDS


class InterceptError(Exception):
    ...

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


# One class per kind of the Rust core, in its order; a class without a docstring takes its
# kind's doc.


class UnauthorizedError(InterceptError):
    ...


class InvalidRequestError(InterceptError, ValueError):
    """A malformed request or setting (also a ValueError)."""


class PayloadTooLargeError(InterceptError):
    ...


class NotFoundError(InterceptError):
    ...


class MethodNotAllowedError(InterceptError):
    ...


class RolloutConcludedError(InterceptError):
    ...


class RolloutStoppedError(InterceptError):
    ...


class UpstreamStatusError(InterceptError):
    """The upstream answered with an error status (kept as `status`)."""


class UpstreamTimeoutError(InterceptError, TimeoutError):
    """The upstream did not answer in time (also a TimeoutError)."""


class UpstreamUnavailableError(InterceptError):
    ...


class UpstreamMalformedError(InterceptError):
    ...


class ClientDisconnectedError(InterceptError):
    ...


class CallCancelledError(InterceptError):
    ...


class TunnelError(InterceptError):
    ...


class ConflictError(InterceptError):
    ...


class PausedError(InterceptError):
    ...


class UnavailableError(InterceptError):
    ...


class HookFailedError(InterceptError):
    ...


class InternalError(InterceptError):
    ...


class UpgradeRequiredError(InterceptError):
    ...


class GoneError(InterceptError):
    ...


class EpisodeUnavailableError(InterceptError, NotImplementedError):
    """This build has no episode (message graph) support (also a NotImplementedError)."""

    default_kind = "episode_unavailable"
    default_status = 501
    default_blame = "internal"


def _class_name(kind: str) -> str:
    """The class of a Rust error kind: `invalid_request` -> `InvalidRequestError`."""
    # `cancelled` is not called `CancelledError`, the name of asyncio's.
    if kind == "cancelled":
        return "CallCancelledError"
    return "".join(part.capitalize() for part in kind.split("_")) + "Error"


def _bind_kinds() -> dict[str, type[InterceptError]]:
    """Each Rust kind's class, given the kind's defaults (a kind with no class is left out)."""
    by_kind: dict[str, type[InterceptError]] = {}
    for kind, status, blame, doc in ERROR_KINDS:
        cls = globals().get(_class_name(kind))
        if not (isinstance(cls, type) and issubclass(cls, InterceptError)):
            continue
        cls.default_kind, cls.default_status, cls.default_blame = kind, status, blame
        if cls.__doc__ is None:
            cls.__doc__ = doc
        by_kind[kind] = cls
    return by_kind


# Kinds of the Python package alone.
_PYTHON_KINDS: tuple[type[InterceptError], ...] = (EpisodeUnavailableError,)

_BY_KIND: dict[str, type[InterceptError]] = {
    **_bind_kinds(),
    **{cls.default_kind: cls for cls in _PYTHON_KINDS},
}


def error_class(kind: str) -> type[InterceptError]:
    """The exception class of an error kind (`InterceptError` for an unknown kind)."""
    return _BY_KIND.get(kind, InterceptError)


def _from_native(kind: str, status: int, message: str, blame: str, retryable: bool) -> InterceptError:
    return error_class(kind)(message, kind=kind, status=status, blame=blame, retryable=retryable)


__all__ = ["InterceptError", "error_class", *[c.__name__ for c in _BY_KIND.values()]]
