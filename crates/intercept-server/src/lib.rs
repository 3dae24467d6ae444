//! The **intercept** HTTP server: one server multiplexes many RL rollouts. It routes each
//! model call to its rollout by the per-rollout secret, imposes the rollout's model and
//! sampling, proxies the call to the upstream model server through a shared connection
//! pool, relays the answer (JSON, or server-sent events as they arrive) and records
//! every call on the rollout's trace.
//!
//! ```no_run
//! use std::sync::Arc;
//! use intercept_core::{Interception, RolloutSession, SessionConfig, Upstream};
//! use intercept_server::{InterceptionServer, ServerConfig};
//!
//! # async fn run() -> Result<(), intercept_core::Error> {
//! let server = InterceptionServer::new(ServerConfig::default())?;
//! server.start().await?;
//! let upstream = Upstream::new("http://127.0.0.1:8000/v1");
//! let session = Arc::new(RolloutSession::new(SessionConfig::new("rollout-1", "policy", upstream)));
//! let slot = server.acquire(session.clone()).await?;
//! for (key, value) in slot.harness_env() {
//!     std::env::set_var(key, value); // or pass to the harness process
//! }
//! // ... run the harness ...
//! slot.close().await; // seals the trace; late calls get 409
//! server.stop().await
//! # }
//! ```
//!
//! # Contracts
//!
//! - Every call accepted for the upstream ends in exactly one [`CallRecord`](intercept_core::CallRecord),
//!   also when the upstream fails, the harness disconnects, or the rollout is released.
//! - A harness that disconnects mid-stream does not stop the exchange: the upstream stream
//!   is read to its end (up to [`ServerConfig::disconnect_grace`]) and recorded with
//!   `client_disconnected: true`.
//! - Releasing a slot cancels the rollout's in-flight calls; they record as cancelled,
//!   then the session is released. Late calls get 409 `rollout concluded`.
//! - Streams are relayed event by event; the terminal event (`data: [DONE]`) is sent only
//!   after the call is recorded. While the upstream is silent, a `: keepalive` comment
//!   line goes out every [`ServerConfig::keepalive`].
//! - Responses the server generates itself carry the [`GENERATED_HEADER`] header; those
//!   no retry can change (409 concluded, 400 stopped, 401) also carry
//!   `x-should-retry: false` ([`SHOULD_RETRY_HEADER`]), so harness SDKs give up at once.
//! - The upstream's API key is redacted from every upstream text (bodies, stream
//!   events, error messages, headers) before it is relayed, recorded or logged.
//!
//! [`serve_connections`] is the server's accept loop (HTTP/1.1 and h2c, graceful
//! shutdown), public so that other HTTP front ends (the sidecar's control API) share it.
//!
//! # Cargo features
//!
//! - `tls` (default): `https://` upstreams, through rustls with the webpki roots. Without
//!   it (`default-features = false`, for plain-HTTP clusters) the server has no TLS stack,
//!   and a call to an `https://` upstream fails with an error that names the feature.

mod call;
mod config;
mod detach;
mod engines;
mod h1pool;
mod http_body;
mod loops;
mod network;
mod pause;
mod per_core;
mod preamble;
mod redact;
mod registry;
mod relay;
mod respond;
mod retry;
pub mod routing;
mod serve;
mod server;
mod spool;
mod tokens;
mod upstream;

pub use config::{ServerConfig, StreamHeartbeat};
pub use detach::ResponseBody;
pub use preamble::Stats;
pub use respond::{
    control_type, render, render_message, Shape, GENERATED_HEADER, SHOULD_RETRY_HEADER,
};
pub use serve::{
    serve_connections, Busy, Connection, ServeOptions, CANCEL_DRAIN, DEFAULT_MAX_CONNECTIONS,
};
pub use server::{InterceptionServer, STATE_ROUTE_HEADER};
