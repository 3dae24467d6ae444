"""Typed records: a session's trace as dataclasses with the JSONL's fields."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ._errors import InterceptError, error_class

__all__ = ["Usage", "CallError", "CallRecord", "Trace", "Totals", "PauseStatus", "ServerStatus"]


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage of one call, as the upstream reported it."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_input_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True, slots=True)
class CallError:
    """What went wrong with a call."""

    kind: str
    message: str
    status: int

    def exception(self) -> InterceptError:
        """The exception this error maps to (not raised)."""
        return error_class(self.kind)(self.message, kind=self.kind, status=self.status)


# Fields left out of a JSONL line when they hold their default.
_OMITTED_WHEN_DEFAULT = {
    "engine": None,
    "token_capture": "off",
    "prompt_token_ids": None,
    "completion_token_ids": None,
    "completion_logprobs": None,
    "requested_model": None,
    "node": None,
    "policy": None,
    "truncated": False,
}


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One model call: one line of a JSONL trace file, field for field."""

    session: str
    """The rollout id."""
    seq: int
    """Per-session sequence number, in the order calls started (from 0)."""
    dialect: str
    """`chat_completions`, `responses`, `messages` or `completions`."""
    endpoint: str
    """The upstream path (e.g. `/chat/completions`)."""
    model: str
    """The model sent upstream."""
    stream: bool
    """Whether the harness asked for a stream."""
    sampling: dict[str, Any]
    """The sampling settings of the effective request."""
    request: dict[str, Any]
    """The request body exactly as sent upstream."""
    response: Any
    """The upstream JSON, or for a stream the assembled response; None if nothing usable arrived."""
    finish_reason: str | None
    """Normalised finish reason (`stop`, `length`, `tool_calls`, ...)."""
    usage: Usage
    status: int
    """The HTTP status the harness got."""
    started_at: float
    """Seconds since the Unix epoch."""
    ended_at: float
    ttfb_ms: float | None
    """Time to the first upstream body byte."""
    client_disconnected: bool = False
    error: CallError | None = None
    """None on success."""
    epoch: int = 0
    """The pause epoch in which the call was admitted."""
    engine: str | None = None
    token_capture: str = "off"
    """`off`, `captured` or `missing`."""
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    requested_model: str | None = None
    """The model the harness asked for, before the session's was imposed; None when it named none."""
    node: int | None = None
    """The episode node this call produced (its sampled response); None for a failed call."""
    policy: dict[str, Any] | None = None
    """What network-policy mediation removed from the request; None when nothing was."""
    truncated: bool = False
    """The upstream's answer passed `max_response_bytes` and was cut off (the call failed)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Fields of the record this version of the package does not know."""

    @property
    def ok(self) -> bool:
        """Whether the call succeeded."""
        return self.error is None

    @property
    def duration(self) -> float:
        """Seconds from start to record."""
        return self.ended_at - self.started_at

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CallRecord:
        """A record from its JSON object (a JSONL line, parsed)."""
        known = {f.name for f in fields(cls)} - {"extra"}
        kw = {k: v for k, v in d.items() if k in known}
        kw["usage"] = Usage(**d.get("usage") or {})
        err = d.get("error")
        kw["error"] = None if err is None else CallError(kind=err["kind"], message=err["message"], status=err["status"])
        kw["extra"] = {k: v for k, v in d.items() if k not in known}
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the record, exactly as the JSONL line holds it."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "extra":
                continue
            v = getattr(self, f.name)
            if f.name in _OMITTED_WHEN_DEFAULT and v == _OMITTED_WHEN_DEFAULT[f.name]:
                continue
            if isinstance(v, Usage):
                v = {"prompt_tokens": v.prompt_tokens, "completion_tokens": v.completion_tokens, "cached_input_tokens": v.cached_input_tokens, "reasoning_tokens": v.reasoning_tokens}
            elif isinstance(v, CallError):
                v = {"kind": v.kind, "message": v.message, "status": v.status}
            out[f.name] = v
        out.update(self.extra)
        return out


@dataclass(frozen=True, slots=True)
class Trace:
    """A rollout's trace: every call in the order they ended."""

    id: str
    stop_condition: str | None
    calls: list[CallRecord]
    replays: int = 0
    """SDK retries answered without an upstream call (replayed or coalesced)."""
    _episode: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any], episode: Any = None) -> Trace:
        return cls(
            id=d["id"],
            stop_condition=d.get("stop_condition"),
            calls=[CallRecord.from_dict(c) for c in d.get("calls", [])],
            replays=d.get("replays", 0),
            _episode=episode,
        )

    def to_dict(self) -> dict[str, Any]:
        """`{"id", "stop_condition", "calls": [...], "replays"}`, as the sidecar's trace API returns it."""
        return {"id": self.id, "stop_condition": self.stop_condition, "calls": [c.to_dict() for c in self.calls], "replays": self.replays}

    def episode(self) -> Any:
        """The rollout as an episode (a message graph). See `Session.episode`."""
        if self._episode is None:
            from ._session import _episode_unavailable

            raise _episode_unavailable()
        return self._episode


@dataclass(frozen=True, slots=True)
class Totals:
    """Turn and token totals of a rollout, from its calls' usage."""

    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0


@dataclass(frozen=True, slots=True)
class PauseStatus:
    """Whether model calls are paused. Swap weights once `paused` and `inflight == 0`."""

    paused: bool
    mode: str | None
    """`hold` or `reject` while paused."""
    epoch: int
    """0 at start, plus one per resume; every record carries the epoch it was admitted in."""
    inflight: int
    held: int
    """Calls waiting for resume (mode `hold`)."""


@dataclass(frozen=True, slots=True)
class ServerStatus:
    """One server of an interception."""

    base_url: str | None
    load: int
    healthy: bool
