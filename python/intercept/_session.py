"""`Session`: one rollout (model, sampling, upstream, limits, hooks) and its trace."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from . import _native
from ._episode import Episode
from ._errors import ConflictError, InvalidRequestError
from ._hooks import RequestHook, ResponseHook, takes_call
from ._records import Totals, Trace
from ._tokens import Tokens, tokens_config
from ._types import SessionStatus, expect, wrong_type

__all__ = ["Session"]

_LIMIT_KEYS = ("max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens")


def _upstream(upstream: Any, api_key: Any, headers: Any) -> dict[str, Any]:
    if isinstance(upstream, str):
        out: dict[str, Any] = {"base_url": upstream}
    elif isinstance(upstream, Mapping):
        out = dict(upstream)
    elif isinstance(upstream, Sequence):
        urls = list(upstream)
        for i, u in enumerate(urls):
            expect(f"upstream[{i}]", u, str, "a URL string")
        if not urls:
            raise InvalidRequestError("upstream: a list of engines must hold at least one URL string")
        out = {"base_urls": urls}
    else:
        wrong_type("upstream", "a URL such as 'http://127.0.0.1:8000/v1', a list of URLs or a dict", upstream)
    if api_key is not None:
        expect("api_key", api_key, str, "a str or None")
        out["api_key"] = api_key
    if headers is not None:
        expect("headers", headers, Mapping, "a dict of header names to values, or None")
    if headers:
        out["headers"] = _header_pairs("headers", headers)
    elif isinstance(out.get("headers"), Mapping):
        out["headers"] = _header_pairs("upstream.headers", out["headers"])
    return out


def _header_pairs(name: str, headers: Mapping[Any, Any]) -> list[list[str]]:
    for k, v in headers.items():
        expect(f"{name} key", k, str, "a header name (str)")
        expect(f"{name}[{k!r}]", v, str, "a header value (str)")
    return [[k, v] for k, v in headers.items()]


def _json_arg(name: str, value: Any) -> None:
    """`TypeError` unless `value` is JSON data; `InvalidRequestError` for a number JSON
    cannot hold (NaN, infinity)."""
    try:
        json.dumps(value, allow_nan=False)
    except TypeError as e:
        raise TypeError(f"{name}: expected JSON data (dict, list, str, int, float, bool or None): {e}") from None
    except ValueError as e:
        raise InvalidRequestError(f"{name}: must be JSON data: {e}") from None


class Session:
    """One rollout as the server sees it.

    `upstream` is the engine's OpenAI base URL (`http://host:8000/v1`), a list of engines
    of the same model (the session is pinned to one), or a dict
    `{"base_url" | "base_urls", "api_key", "headers"}`. `sampling` is imposed on every
    call; `limits` (`max_turns`, `max_input_tokens`, `max_output_tokens`,
    `max_total_tokens`) refuse calls once reached. `capture_tokens` asks the engine for
    token ids and logprobs. `task` is served on `GET /task`. `tokens` turns on
    token-in/token-out: an `intercept.Tokens(renderer, tokenizer, ...)` or a dict with the
    same keys (see docs/tokens.md); the tokenizer is loaded, and the renderer checked, when
    the session is acquired (`InvalidRequestError` naming what is wrong).

    Hooks are callables, sync or async, run on the event loop that acquired the session:
    `on_request(body)` or `on_request(body, call)` sees the request after the model and
    sampling were imposed; `on_response(response[, call])` sees the complete response
    (a stream's assembled one) before the harness does. Each returns a new dict, `None`
    (no change, or the argument edited in place) or `intercept.Stop(reason)`.
    `hook_headers` names request headers the hooks consume: their values arrive in
    `CallInfo.headers` and are not forwarded upstream (credentials never are handed over).

    A session is acquired once; make a new one per rollout. An acquire that fails or is
    cancelled leaves it free to be acquired again.

    An argument of the wrong type raises `TypeError` naming it; a value of the right type
    that is not allowed raises `InvalidRequestError` (a `ValueError`).
    """

    def __init__(
        self,
        id: str,
        model: str,
        upstream: str | Sequence[str] | Mapping[str, Any],
        *,
        sampling: Mapping[str, Any] | None = None,
        limits: Mapping[str, int | None] | None = None,
        capture_tokens: bool = False,
        task: Any = None,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        on_request: RequestHook | None = None,
        on_response: ResponseHook | None = None,
        hook_headers: Sequence[str] = (),
        tokens: Tokens | Mapping[str, Any] | None = None,
    ) -> None:
        expect("id", id, str, "a str")
        if not id:
            raise InvalidRequestError("session: `id` must be a non-empty string")
        expect("model", model, str, "a str")
        for name, hook in (("on_request", on_request), ("on_response", on_response)):
            if hook is not None and not callable(hook):
                wrong_type(name, "a callable (sync or async) or None", hook)
        if sampling is not None:
            expect("sampling", sampling, Mapping, "a dict of sampling parameters, or None")
        if limits is not None:
            expect("limits", limits, Mapping, "a dict such as {'max_turns': 32}, or None")
            for key, value in limits.items():
                if value is not None:
                    expect(f"limits[{key!r}]", value, int, "an int or None")
        expect("capture_tokens", capture_tokens, bool, "a bool")
        if isinstance(hook_headers, str) or not isinstance(hook_headers, Sequence):
            wrong_type("hook_headers", "a list of header names", hook_headers)
        for i, h in enumerate(hook_headers):
            expect(f"hook_headers[{i}]", h, str, "a header name (str)")
        config = {
            "id": id,
            "model": model,
            "sampling": dict(sampling or {}),
            "upstream": _upstream(upstream, api_key, headers),
            "limits": dict(limits or {}),
            "task": task,
        }
        tokens_json = tokens_config(tokens)
        if tokens_json is not None:
            config["tokens"] = tokens_json
        for key in ("upstream", "sampling", "limits", "task"):
            _json_arg(key, config[key])
        text = json.dumps(config, allow_nan=False)
        self._native = _native.NativeSession(
            text,
            capture_tokens,
            on_request,
            on_request is not None and takes_call(on_request),
            on_response,
            on_response is not None and takes_call(on_response),
        )
        if hook_headers:
            self._native.set_hook_headers(list(hook_headers))
        self._id = id
        self._model = model
        self._hooks = on_request is not None or on_response is not None
        self._acquired = False

    @property
    def id(self) -> str:
        return self._id

    @property
    def model(self) -> str:
        return self._model

    def _claim(self) -> None:
        """Marks the session taken by an acquire; a second acquire raises `ConflictError`."""
        # A released session was acquired (an acquire cancelled just after its slot was
        # made releases that slot): it is concluded for good.
        if self._acquired or self._native.status() == "released":
            raise ConflictError(
                f"session {self._id!r} was already acquired (or is being acquired); make a new Session per rollout"
            )
        self._acquired = True

    def _unclaim(self) -> None:
        """Gives the claim back after an acquire that failed or was cancelled, so the same
        session can be acquired again."""
        self._acquired = False

    def trace(self) -> Trace:
        """The trace so far (a snapshot of the session's log): every recorded call as a
        `CallRecord`, each rebuilt from the log when it is first read."""
        return Trace.from_log(self._native.log(), self.stop_condition, int(self._native.replays()))

    def trace_dict(self) -> dict[str, Any]:
        """The trace as plain JSON data (what `trace().to_dict()` gives, without the dataclasses)."""
        data: dict[str, Any] = json.loads(self._native.trace_json())
        return data

    def episode(self) -> Episode:
        """The rollout as an episode: every message once (`nodes`), every root-to-leaf
        path a `Branch` whose `token_ids`, `mask` and `logprobs` (with `capture_tokens`)
        are plain lists, ready for `torch.tensor`."""
        return Episode.from_dict(json.loads(self._native.episode_json()))

    @property
    def calls(self) -> int:
        """Recorded calls."""
        return int(self._native.calls())

    @property
    def status(self) -> SessionStatus:
        """`active`, `stopped` or `released`."""
        return self._native.status()

    @property
    def stop_condition(self) -> str | None:
        """Why the rollout stopped, if it did."""
        return self._native.stop_condition()

    def stop(self, reason: str) -> None:
        """Stops the rollout (the first condition wins): later calls get 400 `rollout stopped: <reason>`."""
        expect("reason", reason, str, "a str")
        self._native.stop(reason)

    def totals(self) -> Totals:
        """Turn and token totals, from the calls' usage."""
        return Totals(**json.loads(self._native.totals_json()))

    @property
    def tokens(self) -> Tokens | None:
        """The session's token-in/token-out setting, as the session holds it (`None`: off)."""
        data = json.loads(self._native.tokens_json())
        return None if data is None else Tokens.from_mapping(data)

    @property
    def state(self) -> Any:
        """The `/state` document tool servers wrote."""
        return json.loads(self._native.state_json())

    def __repr__(self) -> str:
        return f"Session(id={self._id!r}, model={self._model!r}, status={self.status!r}, calls={self.calls})"
