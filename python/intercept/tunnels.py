"""Tunnels that expose a server to harnesses off this host.

Pass one as `tunnel=` to `Server`, `StaticPool` (per server) or `ElasticPool` (each server
the pool starts gets its own). Without a tunnel, servers bind `127.0.0.1` on an ephemeral
port. A dict `{"type": "custom" | "prime" | "bore", ...}` works too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Union

from ._errors import InvalidRequestError

__all__ = ["Custom", "Bore", "Prime", "Tunnel"]


@dataclass(frozen=True, slots=True)
class Custom:
    """Bring your own public URL (a reverse proxy, a pre-started tunnel, a direct bind)
    that reaches `host:port` on this machine. The server binds `host` (default all
    interfaces) on `port`; harnesses get `url`."""

    url: str
    port: int
    host: str = "0.0.0.0"

    def to_config(self) -> dict[str, Any]:
        return {"type": "custom", "url": self.url, "port": self.port, "host": self.host}


@dataclass(frozen=True, slots=True)
class Bore:
    """A self-hosted bore server (`bore server`); the tunnel runs in-process."""

    server: str
    control_port: int = 7835
    secret: str | None = field(default=None, repr=False)
    heartbeat_timeout: float = 5.0
    rate_limit: Mapping[str, Any] | None = None

    def to_config(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "bore",
            "server": self.server,
            "control_port": self.control_port,
            "secret": self.secret,
            "heartbeat_timeout_secs": self.heartbeat_timeout,
        }
        if self.rate_limit is not None:
            out["rate_limit"] = dict(self.rate_limit)
        return out


@dataclass(frozen=True, slots=True)
class Prime:
    """Prime Intellect's tunnel service (frpc). Needs `PRIME_API_KEY` or
    `~/.prime/config.json`. `settings` are the backend's knobs (see docs/tunnels.md:
    `frpc_path`, `connection_timeout`, `retries`, `rate_limit`, ...)."""

    settings: Mapping[str, Any] = field(default_factory=dict)

    def to_config(self) -> dict[str, Any]:
        return {"type": "prime", **dict(self.settings)}


Tunnel = Union[Custom, Bore, Prime, Mapping[str, Any], str]


def tunnel_config(tunnel: Tunnel | None) -> dict[str, Any] | None:
    """The tunnel's configuration value (None for no tunnel)."""
    if tunnel is None:
        return None
    if isinstance(tunnel, (Custom, Bore, Prime)):
        return tunnel.to_config()
    if isinstance(tunnel, str):
        if tunnel == "none":
            return None
        if tunnel == "prime":
            return {"type": "prime"}
        raise InvalidRequestError(f"tunnel {tunnel!r}: use intercept.tunnels.Custom(...), Bore(...), Prime() or 'prime'")
    if isinstance(tunnel, Mapping):
        out = dict(tunnel)
        if out.get("type") in (None, "none"):
            return None
        return out
    raise TypeError(
        f"tunnel: expected a tunnel from intercept.tunnels (Custom, Bore, Prime), a dict, 'prime' or None; "
        f"got {type(tunnel).__name__}"
    )
