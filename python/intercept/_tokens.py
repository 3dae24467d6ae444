"""`Tokens`: a session's token-in/token-out setting (docs/tokens.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from ._errors import InvalidRequestError

__all__ = ["Tokens", "Engine", "OnMismatch"]

Engine = Literal["vllm", "sglang"]
"""The engine's token endpoint: vLLM's `/inference/v1/generate` or SGLang's `/generate`."""

OnMismatch = Literal["render", "chat", "fail"]
"""What a turn that does not extend the previous turn's ids does."""

_FIELDS = (
    "renderer (e.g. 'qwen3'), tokenizer (a folder holding tokenizer.json, or the file), "
    "engine ('vllm' or 'sglang'), on_mismatch ('render', 'chat' or 'fail'), "
    "enable_thinking (True, False or None)"
)


def _check(
    renderer: object,
    tokenizer: object,
    engine: object,
    on_mismatch: object,
    enable_thinking: object,
) -> dict[str, Any]:
    """The setting as the session's JSON; `TypeError` for a wrong type, `InvalidRequestError`
    (a `ValueError`) for a bad value, each naming the key."""
    if not isinstance(renderer, str):
        raise TypeError(f"tokens.renderer: expected a str such as 'qwen3', got {type(renderer).__name__}")
    if not renderer.strip():
        raise InvalidRequestError("tokens.renderer: must not be empty")
    if not isinstance(tokenizer, (str, os.PathLike)):
        raise TypeError(
            f"tokens.tokenizer: expected a path (str or os.PathLike) to a folder holding tokenizer.json, "
            f"or to the file, got {type(tokenizer).__name__}"
        )
    path = os.fspath(tokenizer)
    if not isinstance(path, str):
        raise TypeError("tokens.tokenizer: expected a text path, not bytes")
    if not path.strip():
        raise InvalidRequestError("tokens.tokenizer: must not be empty")
    for key, value, allowed in (
        ("engine", engine, get_args(Engine)),
        ("on_mismatch", on_mismatch, get_args(OnMismatch)),
    ):
        if not isinstance(value, str):
            raise TypeError(f"tokens.{key}: expected a str, one of {', '.join(map(repr, allowed))}; got {type(value).__name__}")
        if value not in allowed:
            raise InvalidRequestError(f"tokens.{key}: {value!r} is not one of {', '.join(map(repr, allowed))}")
    if enable_thinking is not None and not isinstance(enable_thinking, bool):
        raise TypeError(f"tokens.enable_thinking: expected True, False or None, got {type(enable_thinking).__name__}")
    out: dict[str, Any] = {"renderer": renderer, "tokenizer": path, "engine": engine, "on_mismatch": on_mismatch}
    if enable_thinking is not None:
        out["enable_thinking"] = enable_thinking
    return out


@dataclass(frozen=True)
class Tokens:
    """Token-in/token-out for a session: intercept renders each call's conversation to token
    ids with `renderer` (bridging from the previous turn's exact ids), generates on the
    engine's token endpoint and parses the completion ids back into the dialect's answer, so
    the trace holds the ids the model sampled (docs/tokens.md).

    `tokenizer` is a folder holding `tokenizer.json` and `tokenizer_config.json`, or the
    `tokenizer.json` file; it is loaded once per process when a session naming it is
    acquired (a missing file or an unknown renderer raises `InvalidRequestError` there).
    `enable_thinking` is the renderer's option (`None`: the renderer's default, true for
    Qwen3). A wrong type raises `TypeError`, a bad value `InvalidRequestError` (a
    `ValueError`), each naming the field.
    """

    renderer: str
    tokenizer: str | os.PathLike[str]
    engine: Engine = "vllm"
    on_mismatch: OnMismatch = "render"
    enable_thinking: bool | None = None

    def __post_init__(self) -> None:
        self.to_dict()

    def to_dict(self) -> dict[str, Any]:
        """The setting as the `tokens` object of a session (the sidecar's JSON too)."""
        return _check(self.renderer, self.tokenizer, self.engine, self.on_mismatch, self.enable_thinking)

    @classmethod
    def from_mapping(cls, tokens: Mapping[str, Any]) -> Tokens:
        """A `Tokens` from a dict with the same keys (`renderer` and `tokenizer` required)."""
        if not isinstance(tokens, Mapping):
            raise TypeError(f"tokens: expected an intercept.Tokens or a dict of {_FIELDS}; got {type(tokens).__name__}")
        known = ("renderer", "tokenizer", "engine", "on_mismatch", "enable_thinking")
        for key in tokens:
            if key not in known:
                raise InvalidRequestError(f"tokens: unknown key {key!r}; the keys are {_FIELDS}")
        for key in ("renderer", "tokenizer"):
            if key not in tokens:
                raise InvalidRequestError(f"tokens: {key!r} is required; the keys are {_FIELDS}")
        # A key given as None takes its default, as an absent one does.
        engine = tokens.get("engine")
        on_mismatch = tokens.get("on_mismatch")
        return cls(
            renderer=tokens["renderer"],
            tokenizer=tokens["tokenizer"],
            engine="vllm" if engine is None else engine,
            on_mismatch="render" if on_mismatch is None else on_mismatch,
            enable_thinking=tokens.get("enable_thinking"),
        )


def tokens_config(tokens: Tokens | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The session's `tokens` JSON from what `Session(tokens=...)` was given."""
    if tokens is None:
        return None
    if isinstance(tokens, Tokens):
        return tokens.to_dict()
    return Tokens.from_mapping(tokens).to_dict()
