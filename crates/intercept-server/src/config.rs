//! Server settings.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use intercept_core::Tunnel;

/// Settings of an [`InterceptionServer`](crate::InterceptionServer). `Default` gives the
/// documented defaults.
#[derive(Clone)]
pub struct ServerConfig {
    /// Largest request body accepted, in bytes (default 1 GiB). Larger bodies get 413.
    pub body_limit: u64,
    /// Largest upstream answer read for one call, in bytes (default 256 MiB): a JSON
    /// body (declared or received), or all the bytes of a stream. Past it the call fails
    /// with 502, the upstream connection is closed, and the record is marked
    /// `truncated`; a stream already under way ends with the dialect's error event.
    pub max_response_bytes: u64,
    /// Harness connections served at once (default 16,384); one beyond it is answered
    /// 503 with `Retry-After: 1` and closed. `None`: no cap.
    pub max_connections: Option<usize>,
    /// While a stream's upstream is silent, a heartbeat is sent this often (default
    /// 3 s); [`ServerConfig::stream_heartbeat`] says what it is.
    pub keepalive: Duration,
    /// What a stream's heartbeat is (default [`StreamHeartbeat::Event`]): a dialect-valid
    /// event where the dialect's SDKs accept one, else a `: keepalive` comment line.
    pub stream_heartbeat: StreamHeartbeat,
    /// On stop, in-flight calls may finish for this long before they are cancelled
    /// (default 30 s).
    pub shutdown_grace: Duration,
    /// A streaming call whose upstream has sent no response headers for this long is
    /// answered 200 at once and kept alive with keepalive comments (default 10 s); an
    /// upstream error after that reaches the harness as an SSE error event. Errors that
    /// arrive earlier keep their HTTP status, so SDK retries still work.
    pub first_byte_timeout: Duration,
    /// After a harness disconnects mid-stream, the upstream stream is still read (and
    /// recorded) for at most this long (default 120 s).
    pub disconnect_grace: Duration,
    /// A harness connection with no request in progress this long after it opened, or
    /// after its previous answer, is closed (default 30 s): a request head must be
    /// complete within it. This bounds slow-header (slowloris) clients, connections
    /// that never send a byte and idle kept-alive ones (HTTP/1 and HTTP/2 alike); a
    /// request in progress is never cut by it. `None`: no limit.
    pub header_read_timeout: Option<Duration>,
    /// Connect timeout towards upstreams (default 30 s).
    pub connect_timeout: Duration,
    /// Optional cap on a whole upstream exchange; `None` (the default) waits as long as
    /// the upstream takes: agentic completions are slow, and the rollout's own timeout is
    /// the backstop. When it elapses the harness gets 504.
    pub upstream_timeout: Option<Duration>,
    /// On a plain-`http://` upstream connection, a request being written fails (the
    /// harness gets 504) when the upstream takes none of its bytes for this long
    /// (default 30 s); `None` waits as long as the upstream takes.
    pub upstream_write_idle: Option<Duration>,
    /// On a plain-`http://` upstream connection, once the request is written, the call
    /// fails when the upstream sends nothing for this long: no response head (the
    /// harness gets 504) or no byte of the body (the call ends with an upstream error).
    /// `None` (the default) waits as long as the upstream takes: agentic completions
    /// can think for minutes before their first byte. A stream's read also stays quiet
    /// while a slow harness holds it back.
    pub upstream_read_idle: Option<Duration>,
    /// `GET /v1/models` relays the session's upstream listing; this bounds that exchange
    /// (default 30 s). Past it, or on any upstream failure, the session's own model is
    /// listed instead.
    pub models_timeout: Duration,
    /// When a session inspects responses, a stream is held in memory up to this many
    /// bytes, then in a temporary file (default 4 MiB).
    pub inspect_memory: usize,
    /// Events buffered between the upstream and a slow harness (default 16).
    pub stream_buffer: usize,
    /// Secrets of released sessions (two each: model and state) remembered so that
    /// stragglers get 409 `rollout concluded` instead of 401 (default 65 536; the oldest
    /// are forgotten first). A count of secrets in this server's registry; the sidecar's
    /// `released_retention` is another setting, a count of sessions its control API
    /// remembers.
    pub released_secrets: usize,
    /// Idle upstream connections kept per upstream host (default 256).
    pub upstream_idle_per_host: usize,
    /// When an upstream has several engines and one refuses connections, new calls skip
    /// it for this long (doubling on each failed retry, up to 32x), then try it again
    /// (default 5 s).
    pub engine_retry_after: Duration,
    /// Secrets of shared tool servers: with one of them and the
    /// `X-Intercept-State-Route: <session id>` header, `/state` of any session is reachable.
    pub service_secrets: Vec<intercept_core::Secret>,
    /// Event loops serving the harnesses' connections (default `0`: one per core the
    /// process may use, its CPU affinity honoured). Each loop is a thread running a
    /// single-threaded runtime with its own listening socket on the server's port
    /// (`SO_REUSEPORT`, so the kernel spreads connections over them), its own upstream
    /// connections and caches: a connection, and every call on it, stays on one loop.
    /// Servers of one process with the same count share their loops.
    pub workers: usize,
    /// Where to listen. `None` asks the tunnel (if any), else binds `127.0.0.1:0`.
    pub listen: Option<SocketAddr>,
    /// The tunnel that exposes the server, if consumers are off this host.
    pub tunnel: Option<Arc<dyn Tunnel>>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            body_limit: 1 << 30,
            max_response_bytes: 256 << 20,
            max_connections: Some(crate::serve::DEFAULT_MAX_CONNECTIONS),
            keepalive: Duration::from_secs(3),
            stream_heartbeat: StreamHeartbeat::Event,
            shutdown_grace: Duration::from_secs(30),
            first_byte_timeout: Duration::from_secs(10),
            disconnect_grace: Duration::from_secs(120),
            header_read_timeout: Some(Duration::from_secs(30)),
            connect_timeout: Duration::from_secs(30),
            upstream_timeout: None,
            upstream_write_idle: Some(Duration::from_secs(30)),
            upstream_read_idle: None,
            models_timeout: Duration::from_secs(30),
            inspect_memory: 4 << 20,
            stream_buffer: 16,
            released_secrets: 65_536,
            upstream_idle_per_host: 256,
            engine_retry_after: Duration::from_secs(5),
            service_secrets: Vec::new(),
            workers: 0,
            listen: None,
            tunnel: None,
        }
    }
}

impl ServerConfig {
    /// Uses a tunnel.
    pub fn with_tunnel(mut self, tunnel: Arc<dyn Tunnel>) -> Self {
        self.tunnel = Some(tunnel);
        self
    }
}

impl fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerConfig")
            .field("body_limit", &self.body_limit)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("max_connections", &self.max_connections)
            .field("keepalive", &self.keepalive)
            .field("stream_heartbeat", &self.stream_heartbeat)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("first_byte_timeout", &self.first_byte_timeout)
            .field("disconnect_grace", &self.disconnect_grace)
            .field("header_read_timeout", &self.header_read_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("upstream_timeout", &self.upstream_timeout)
            .field("upstream_write_idle", &self.upstream_write_idle)
            .field("upstream_read_idle", &self.upstream_read_idle)
            .field("models_timeout", &self.models_timeout)
            .field("stream_buffer", &self.stream_buffer)
            .field("released_secrets", &self.released_secrets)
            .field("engine_retry_after", &self.engine_retry_after)
            .field("workers", &self.workers)
            .field("listen", &self.listen)
            .field("tunnel", &self.tunnel.as_ref().map(|t| t.kind()))
            .finish()
    }
}

/// What goes to the harness while a stream's upstream is silent, every
/// [`ServerConfig::keepalive`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StreamHeartbeat {
    /// A dialect-valid event where the dialect's SDKs accept one (the default): Chat an
    /// empty `delta.content` chunk, Responses `response.in_progress` once
    /// `response.created` went out (later events renumbered), Anthropic a no-op
    /// `message_delta` between `message_start` and the upstream's own `message_delta`.
    /// Where no event is valid (before a Responses or Anthropic stream's first event,
    /// after its end), a `: keepalive` comment line.
    #[default]
    Event,
    /// A `: keepalive` comment line, always (SDKs never see it; proxies and byte-level
    /// read timeouts do).
    Comment,
    /// Nothing: a silent upstream is a silent stream.
    Off,
}

impl StreamHeartbeat {
    /// The setting's name: `event`, `comment` or `off`.
    pub fn as_str(self) -> &'static str {
        match self {
            StreamHeartbeat::Event => "event",
            StreamHeartbeat::Comment => "comment",
            StreamHeartbeat::Off => "off",
        }
    }
}

impl std::str::FromStr for StreamHeartbeat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "event" => Ok(StreamHeartbeat::Event),
            "comment" => Ok(StreamHeartbeat::Comment),
            "off" => Ok(StreamHeartbeat::Off),
            other => Err(format!(
                "unknown stream heartbeat `{other}`: expected event, comment or off"
            )),
        }
    }
}
