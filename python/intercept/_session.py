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

__all__ = ["Session"]

_LIMIT_KEYS = ("max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens")


def _upstream(upstream: Any, api_key: str | None, headers: Mapping[str, str] | None) -> dict[str, Any]:
    if isinstance(upstream, str):
        out: dict[str, Any] = {"base_url": upstream}
    elif isinstance(upstream, Mapping):
        out = dict(upstream)
    elif isinstance(upstream, Sequence):
        urls = list(upstream)
        if not urls or not all(isinstance(u, str) for u in urls):
            raise InvalidRequestError("upstream: a list of engines must hold at least one URL string")
        out = {"base_urls": urls}
    else:
        raise InvalidRequestError(
            f"upstream: expected a URL such as 'http://127.0.0.1:8000/v1', a list of URLs or a dict, got {type(upstream).__name__}"
        )
    if api_key is not None:
        out["api_key"] = api_key
    if headers:
        out["headers"] = [[str(k), str(v)] for k, v in headers.items()]
    elif isinstance(out.get("headers"), Mapping):
        out["headers"] = [[str(k), str(v)] for k, v in out["headers"].items()]
    return out


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

    A session is acquired once; make a new one per rollout.
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
        if not isinstance(id, str) or not id:
            raise InvalidRequestError("session: `id` must be a non-empty string")
        if not isinstance(model, str):
            raise InvalidRequestError("session: `model` must be a string")
        for name, hook in (("on_request", on_request), ("on_response", on_response)):
            if hook is not None and not callable(hook):
                raise InvalidRequestError(f"session: `{name}` must be callable")
        config = {
            "id": id,
            "model": model,
            "sampling": dict(sampling or {}),
            "upstream": _upstream(upstream, api_key, headers),
            "limits": {k: v for k, v in dict(limits or {}).items()},
            "task": task,
        }
        tokens_json = tokens_config(tokens)
        if tokens_json is not None:
            config["tokens"] = tokens_json
        try:
            text = json.dumps(config, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise InvalidRequestError(f"session: sampling, limits and task must be JSON values: {e}") from None
        self._native = _native.NativeSession(
            text,
            bool(capture_tokens),
            on_request,
            on_request is not None and takes_call(on_request),
            on_response,
            on_response is not None and takes_call(on_response),
        )
        if hook_headers:
            if isinstance(hook_headers, str) or not all(isinstance(h, str) for h in hook_headers):
                raise InvalidRequestError("session: `hook_headers` must be a list of header names")
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
        if self._acquired:
            raise ConflictError(f"session {self._id!r} was already acquired; make a new Session per rollout")
        self._acquired = True

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
    def status(self) -> str:
        """`active`, `stopped` or `released`."""
        return str(self._native.status())

    @property
    def stop_condition(self) -> str | None:
        """Why the rollout stopped, if it did."""
        return self._native.stop_condition()

    def stop(self, reason: str) -> None:
        """Stops the rollout (the first condition wins): later calls get 400 `rollout stopped: <reason>`."""
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
