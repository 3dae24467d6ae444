"""Typed records: a session's trace as dataclasses with the JSONL's fields."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, overload

from . import _native

if TYPE_CHECKING:
    from ._episode import Episode

from ._errors import InterceptError, error_class
from ._types import Dialect, PauseMode

__all__ = ["Usage", "CallError", "CallRecord", "Trace", "TraceLog", "Totals", "PauseStatus", "ServerStatus"]


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


# Fields left out of a JSONL line when they hold their default, and the default: the
# native module's table, the one the Rust writer follows.
_OMITTED_WHEN_DEFAULT: dict[str, Any] = {
    name: json.loads(default) for name, omit, default in _native.CALL_FIELDS if omit == "when_default"
}


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One model call: one line of a JSONL trace file, field for field."""

    session: str
    """The rollout id."""
    seq: int
    """Per-session sequence number, in the order calls started (from 0)."""
    dialect: Dialect
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
    token_path: str | None = None
    """How intercept made the prompt's ids (token-in/token-out): `bridged`, `rendered` or `chat`; None when the engine rendered it."""
    token_reason: str | None = None
    """Why the prompt was not bridged from the previous turn, when it was not."""
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


class LazyCalls(Sequence["CallRecord"]):
    """A log's calls as a sequence of `CallRecord`s, each rebuilt from the log the first
    time it is read (and kept): reading one call costs that call, not the trace."""

    __slots__ = ("_log", "_cache")

    def __init__(self, log: _native.NativeLog) -> None:
        self._log = log
        self._cache: dict[int, CallRecord] = {}

    def __len__(self) -> int:
        return self._log.calls_len()

    @overload
    def __getitem__(self, index: int) -> CallRecord: ...
    @overload
    def __getitem__(self, index: slice) -> list[CallRecord]: ...
    def __getitem__(self, index: int | slice) -> CallRecord | list[CallRecord]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        i = index + n if index < 0 else index
        if not 0 <= i < n:
            raise IndexError(f"call {index} of {n}")
        rec = self._cache.get(i)
        if rec is None:
            rec = CallRecord.from_dict(json.loads(self._log.record_json(i)))
            self._cache[i] = rec
        return rec

    def __iter__(self) -> Iterator[CallRecord]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return f"<{len(self)} calls>"


@dataclass(frozen=True, slots=True)
class Trace:
    """A rollout's trace: every call in the order they ended. Read from a log
    (`Session.trace()`, `read_trace`), `calls` rebuilds each record when it is read."""

    id: str
    stop_condition: str | None
    calls: Sequence[CallRecord]
    replays: int = 0
    """SDK retries answered without an upstream call (replayed or coalesced)."""
    _log: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trace:
        return cls(
            id=d["id"],
            stop_condition=d.get("stop_condition"),
            calls=[CallRecord.from_dict(c) for c in d.get("calls", [])],
            replays=d.get("replays", 0),
        )

    @classmethod
    def from_log(cls, log: _native.NativeLog, stop_condition: str | None = None, replays: int = 0) -> Trace:
        """The trace of a log; the end line's stop condition and replays, when it has one."""
        end = json.loads(log.end_json())
        if end is not None:
            stop_condition, replays = end.get("stop_condition"), end.get("replays", 0)
        return cls(id=log.session, stop_condition=stop_condition, calls=LazyCalls(log), replays=replays, _log=log)

    def to_dict(self) -> dict[str, Any]:
        """`{"id", "stop_condition", "calls": [...], "replays"}`, as the sidecar's trace API returns it."""
        return {"id": self.id, "stop_condition": self.stop_condition, "calls": [c.to_dict() for c in self.calls], "replays": self.replays}

    def episode(self) -> Episode:
        """The rollout as an episode (a message graph): see `Session.episode`. A trace
        made from plain records (`from_dict`) has no graph and raises
        `EpisodeUnavailableError`; one read from a log (`Session.trace()`,
        `read_trace`) has."""
        if self._log is None:
            from ._errors import EpisodeUnavailableError

            raise EpisodeUnavailableError(
                "this trace was made from plain records and holds no message graph; read it "
                "from its session (Session.episode()) or its log (intercept.read_trace)"
            )
        from ._episode import Episode

        return Episode.from_dict(json.loads(self._log.episode_json()))


class TraceLog:
    """A trace log read from a file (`intercept.read_trace`): its header, its calls (each
    record rebuilt when read), its episode, and whether it is complete."""

    def __init__(self, log: _native.NativeLog) -> None:
        self._log = log
        self.calls: Sequence[CallRecord] = LazyCalls(log)

    @property
    def session(self) -> str:
        return self._log.session

    @property
    def header(self) -> dict[str, Any] | None:
        """The header line: `schema`, `session`, `created_at`, `settings`."""
        h: dict[str, Any] | None = json.loads(self._log.header_json())
        return h

    @property
    def end(self) -> dict[str, Any] | None:
        """The end line (None while the session runs, or after a crash)."""
        e: dict[str, Any] | None = json.loads(self._log.end_json())
        return e

    @property
    def incomplete(self) -> bool:
        """True without an end line (crashed or still running) or with a torn last line."""
        return self._log.incomplete

    @property
    def skipped(self) -> list[tuple[int, str]]:
        """Lines that could not be read: (1-based number, why)."""
        return self._log.skipped()

    def trace(self) -> Trace:
        return Trace.from_log(self._log)

    def episode(self) -> Episode:
        from ._episode import Episode

        return Episode.from_dict(json.loads(self._log.episode_json()))

    def __len__(self) -> int:
        return len(self.calls)

    def __repr__(self) -> str:
        state = "incomplete" if self.incomplete else "complete"
        return f"TraceLog(session={self.session!r}, calls={len(self)}, {state})"


def read_trace(path: str | Any) -> TraceLog:
    """Reads a trace log file (`<trace dir>/<session id>.jsonl`, docs/traces.md): a torn
    last line is left out and the log reads as incomplete."""
    from . import _native

    return TraceLog(_native.NativeLog.read(str(path)))


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
    mode: PauseMode | None
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
