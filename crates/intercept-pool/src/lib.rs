//! Interception shapes of **intercept**: one server, a [`StaticPool`] of servers, or an
//! [`ElasticPool`] that warms, grows, heals and shrinks; all behind
//! [`intercept_core::Interception`].
//!
//! ```no_run
//! use std::sync::Arc;
//! use intercept_core::{Interception, RolloutSession, SessionConfig, Upstream};
//! use intercept_pool::{ElasticConfig, ElasticPool, InterceptionServerFactory, TunnelSource};
//! use intercept_server::ServerConfig;
//!
//! # async fn run() -> Result<(), intercept_core::Error> {
//! let factory = Arc::new(InterceptionServerFactory::new(ServerConfig::default(), TunnelSource::None));
//! let pool = ElasticPool::new(ElasticConfig { multiplex: 32, ..Default::default() }, factory)?;
//! pool.start().await?;
//! let upstream = Upstream::new("http://127.0.0.1:8000/v1");
//! let session = Arc::new(RolloutSession::new(SessionConfig::new("rollout-1", "policy", upstream)));
//! let slot = pool.acquire(session).await?; // a server comes up on demand
//! println!("OPENAI_BASE_URL={}/v1", slot.base_url);
//! slot.close().await;
//! pool.stop().await
//! # }
//! ```
//!
//! # Cargo features
//!
//! - `tls` (default): turns on the `tls` features of intercept-server (`https://`
//!   upstreams) and intercept-tunnel (the Prime API); off, the whole stack speaks plain
//!   HTTP and pulls no TLS crate.

mod config;
mod elastic;
mod guard;
mod member;
mod pause;
pub mod policy;
mod server_settings;
mod static_pool;

pub use config::{
    make_interception, make_interception_with, requires_tunnel, ElasticEntry, InterceptionConfig,
    Runtime, ServerEntry, SharedToolServer, StaticEntry, ToolServerConfig, TunnelInputs,
    TunnelSpec,
};
pub use elastic::{
    ElasticConfig, ElasticPool, ServerInfo, ServerPhase, SettingNames, STOP_TIMEOUT,
};
pub use member::{InterceptionServerFactory, PoolMember, ServerFactory, TunnelMaker, TunnelSource};
pub use server_settings::server_config;
pub use static_pool::StaticPool;

/// How long [`StaticPool`]'s `servers()` waits for one endpoint's health probe before it
/// reports the server unhealthy.
pub const HEALTH_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
