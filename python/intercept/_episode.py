"""A rollout as a message graph (the episode), typed: what a trainer consumes.

Every distinct message is one `Node`; each root-to-leaf path is a `Branch`, a training
sample whose `token_ids`, `mask` and `logprobs` are plain lists that go straight into
`torch.tensor`. See `docs/training-capture.md` and `docs/traces.md`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Node", "Branch", "EpisodeSummary", "Episode"]


@dataclass(frozen=True, slots=True)
class Node:
    """One message of the graph, stored once."""

    id: int
    parent: int | None
    """The node before it; None for the first message of a path."""
    hash: str
    """The message's content hash (32 hex digits), the same in every dialect."""
    message: dict[str, Any]
    """`{"role", "content": [{"type": "text", "text"} | {"type": "image", "url"} | ...],
    "reasoning", "tool_calls", "tool_call_id", "state"}` (absent fields omitted)."""
    sampled: bool
    """Whether the model sampled it (a call's response)."""
    call: int | None = None
    """The `seq` of the call that sampled it."""
    token_ids: list[int] | None = None
    """The tokens it adds to its path's sequence (sampled nodes of calls with token ids)."""
    mask: list[bool] | None = None
    """True on the sampled (completion) tokens, aligned with `token_ids`."""
    logprobs: list[float] | None = None
    """Aligned with `token_ids`, 0 where `mask` is false."""
    token_start: bool = False
    token_break: str | None = None

    @property
    def role(self) -> str:
        return str(self.message.get("role", ""))

    @property
    def text(self) -> str:
        """The message's text parts, joined."""
        return "".join(p.get("text", "") for p in self.message.get("content", []) if p.get("type") == "text")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Node:
        return cls(
            id=d["id"],
            parent=d.get("parent"),
            hash=d.get("hash", ""),
            message=d.get("message", {}),
            sampled=bool(d.get("sampled", False)),
            call=d.get("call"),
            token_ids=d.get("token_ids"),
            mask=d.get("mask"),
            logprobs=d.get("logprobs"),
            token_start=bool(d.get("token_start", False)),
            token_break=d.get("token_break"),
        )


@dataclass(frozen=True, slots=True)
class Branch:
    """One root-to-leaf path: a training sample."""

    leaf: int
    path: list[int]
    """Node ids from the root to the leaf."""
    turns: int
    token_start: int | None = None
    token_ids: list[int] | None = None
    """The leaf call's prompt ids followed by its completion ids (None without capture)."""
    mask: list[bool] | None = None
    """True on every sampled token of the sequence."""
    logprobs: list[float] | None = None
    """Aligned with `token_ids` (0 where `mask` is false); None when a turn has none."""
    prompt_len: int | None = None
    completion_tokens: int | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Branch:
        return cls(
            leaf=d["leaf"],
            path=list(d.get("path", [])),
            turns=d.get("turns", 0),
            token_start=d.get("token_start"),
            token_ids=d.get("token_ids"),
            mask=d.get("mask"),
            logprobs=d.get("logprobs"),
            prompt_len=d.get("prompt_len"),
            completion_tokens=d.get("completion_tokens"),
        )


@dataclass(frozen=True, slots=True)
class EpisodeSummary:
    """Counts over an episode."""

    calls: int = 0
    sampled: int = 0
    failed: int = 0
    unreadable: int = 0
    nodes: int = 0
    branches: int = 0
    tokens: int = 0
    token_turns: int = 0
    token_breaks: int = 0
    token_breaks_by_reason: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Episode:
    """A rollout as a message graph."""

    session: str
    nodes: list[Node]
    """Every node, parents before children; `nodes[i].id == i`."""
    branches: list[Branch]
    """Every leaf's path, in the order the leaves were made."""
    summary: EpisodeSummary

    def messages(self, branch: Branch) -> list[dict[str, Any]]:
        """The messages of a branch, root first."""
        return [self.nodes[i].message for i in branch.path]

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Episode:
        s = d.get("summary") or {}
        known = set(EpisodeSummary.__dataclass_fields__)
        return cls(
            session=d.get("session", ""),
            nodes=[Node.from_dict(n) for n in d.get("nodes", [])],
            branches=[Branch.from_dict(b) for b in d.get("branches", [])],
            summary=EpisodeSummary(**{k: v for k, v in s.items() if k in known}),
        )
