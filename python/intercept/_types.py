"""The package's closed sets of names as `typing.Literal` types, and its argument checks.

A wrong type raises `TypeError` naming the argument and the type it takes; a value of the
right type that is not allowed raises `InvalidRequestError` (a `ValueError`).
"""

from __future__ import annotations

from typing import Literal, NoReturn

__all__ = ["Dialect", "PauseMode", "SessionStatus", "expect", "wrong_type"]

Dialect = Literal["chat_completions", "responses", "messages", "completions"]
"""The API a call spoke: OpenAI Chat Completions, OpenAI Responses, Anthropic Messages or
the legacy OpenAI Completions."""

PauseMode = Literal["hold", "reject"]
"""How a pause treats new model calls: `hold` (they wait for `resume()`) or `reject` (429
with `Retry-After`)."""

SessionStatus = Literal["active", "stopped", "released"]
"""A session's state: accepting calls, stopped by a condition, or released (trace sealed)."""


def wrong_type(name: str, expected: str, value: object) -> NoReturn:
    """Raises the `TypeError` of argument `name`, which takes `expected`, given `value`."""
    raise TypeError(f"{name}: expected {expected}, got {type(value).__name__}")


def expect(name: str, value: object, types: type | tuple[type, ...], expected: str) -> None:
    """Raises `TypeError` (see `wrong_type`) unless `value` is an instance of `types`. A
    `bool` is not taken for a number."""
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        wrong_type(name, expected, value)


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)
