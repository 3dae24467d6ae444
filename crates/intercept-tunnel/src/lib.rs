//! Tunnel backends for intercept: they expose an interception server to harnesses in
//! remote sandboxes, behind the [`Tunnel`](intercept_core::Tunnel) /
//! [`Endpoint`](intercept_core::Endpoint) contracts of `intercept-core`.
//!
//! - [`CustomTunnel`]: bring your own public URL for a fixed local port.
//! - [`PrimeTunnel`]: Prime Intellect's tunnel service (HTTP API + an `frpc` child).
//! - [`BoreTunnel`]: a self-hosted [bore](https://github.com/ekzhang/bore) server, run
//!   in-process; [`BoreServer`] is an in-process bore server.
//! - [`RateLimiter`]: the host-wide rolling-window cap on tunnel creation.
//! - [`TunnelConfig`] + [`make_tunnel`]: build any of them from configuration.
//!
//! Endpoints heal: [`Endpoint::refresh`](intercept_core::Endpoint::refresh) re-mints a
//! dead endpoint (through the rate limiter) and returns its current URL, so ask for the
//! URL per acquire. Failures are [`TunnelError`]s (kind, retryable, an actionable message),
//! which become [`intercept_core::Error::Tunnel`] at the trait boundary.
//!
//! ```
//! use std::net::{IpAddr, Ipv4Addr};
//! use intercept_core::{Endpoint, Tunnel};
//! use intercept_tunnel::{BoreServer, BoreTunnel, CustomTunnel};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Bring your own URL: bind where the tunnel says, expose, hand out the URL.
//! let custom = CustomTunnel::new("https://rollouts.example.com/", 8080)?
//!     .with_host(IpAddr::V4(Ipv4Addr::LOCALHOST));
//! assert_eq!(custom.bind_addr().port, 8080);
//! let endpoint = custom.expose(8080).await?;
//! assert_eq!(endpoint.url(), "https://rollouts.example.com");
//!
//! // A real tunnel through an in-process bore server on loopback.
//! let server = BoreServer::bind("127.0.0.1:0".parse()?, Some("secret")).await?;
//! let local = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let bore = BoreTunnel::new("127.0.0.1")
//!     .with_control_port(server.control_addr().port())
//!     .with_secret(Some("secret".into()));
//! let endpoint = bore.expose(local.local_addr()?.port()).await?;
//! assert!(endpoint.url().starts_with("http://127.0.0.1:"));
//! assert!(endpoint.health().await.is_healthy());
//! endpoint.teardown().await?;
//! server.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! # Cargo features
//!
//! - `tls` (default): HTTPS to the Prime tunnel API and the frpc download (rustls with
//!   the webpki roots). Without it those requests fail with an error that names the
//!   feature; `bore`, `custom` and frp with a configured server need no TLS.

pub mod bore;
pub mod config;
pub mod custom;
pub mod error;
pub mod limiter;
pub mod prime;

pub use bore::{BoreEndpoint, BoreServer, BoreTunnel};
pub use config::{make_tunnel, BoreConfig, CustomConfig, TunnelConfig};
pub use custom::{CustomTunnel, StaticEndpoint};
pub use error::{TunnelError, TunnelErrorKind};
pub use limiter::{
    limiter_unavailable_total, redact_url, Backend as LimiterBackend, Permit, RateLimit,
    RateLimiter,
};
pub use prime::{PrimeConfig, PrimeEndpoint, PrimeStatus, PrimeTunnel};
