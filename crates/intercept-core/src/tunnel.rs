//! How a server is exposed: a [`Tunnel`] says where to bind and turns a local port into
//! a public [`Endpoint`].
//!
//! The server holds a `dyn Tunnel` and never names a backend (custom URL, Prime, bore...
//! live in `intercept-tunnel`).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::Error;

/// Where a server must bind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindAddr {
    /// Host to bind.
    pub host: IpAddr,
    /// Port to bind; 0 for an ephemeral port.
    pub port: u16,
}

impl Default for BindAddr {
    /// Loopback, ephemeral port.
    fn default() -> Self {
        BindAddr {
            host: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
        }
    }
}

/// Whether an endpoint still carries traffic.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Health {
    /// Working.
    Healthy,
    /// Dead or dying; the string says why.
    Unhealthy(String),
}

impl Health {
    /// Whether this is [`Health::Healthy`].
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy)
    }
}

/// A tunnel backend.
#[cfg_attr(any(test, feature = "mock"), mockall::automock)]
#[async_trait]
pub trait Tunnel: Send + Sync + fmt::Debug {
    /// The backend's name (`custom`, `prime`, `bore`, ...), for logs and metrics.
    fn kind(&self) -> &'static str;

    /// Where the server must bind. Defaults to loopback on an ephemeral port.
    fn bind_addr(&self) -> BindAddr {
        BindAddr::default()
    }

    /// Exposes a locally bound port; returns the public endpoint. May take seconds.
    async fn expose(&self, port: u16) -> Result<Arc<dyn Endpoint>, Error>;
}

/// A live public address of a server.
#[cfg_attr(any(test, feature = "mock"), mockall::automock)]
#[async_trait]
pub trait Endpoint: Send + Sync + fmt::Debug {
    /// The current public base URL (no trailing slash). It can change when the endpoint
    /// is re-minted, so ask for it per acquire.
    fn url(&self) -> String;

    /// Probes the endpoint.
    async fn health(&self) -> Health;

    /// Returns a working URL, re-minting the endpoint first if it died. The default
    /// returns [`Endpoint::url`].
    async fn refresh(&self) -> Result<String, Error> {
        Ok(self.url())
    }

    /// Resolves once the endpoint knows it is dead (its connection to the tunnel service
    /// closed or went silent, a harness reported it dead, ...), so that a supervisor can
    /// probe and heal it at once instead of at its next round. It resolves at once while
    /// the endpoint stays dead. The default never resolves: such an endpoint is only seen
    /// dead through [`Endpoint::health`].
    async fn dead(&self) {
        std::future::pending::<()>().await;
    }

    /// A harness that reached this endpoint at `url` (its slot's `base_url`) failed with
    /// `text` (its stderr, an exception message). Returns whether the backend recognises
    /// in it this tunnel being dead for good (for Prime: `404 Tunnel not found or no longer
    /// active`). When it does and `url` is still the endpoint's URL, the endpoint counts as
    /// dead from then on: [`Endpoint::health`] reports it, [`Endpoint::dead`] resolves, and
    /// [`Endpoint::refresh`] does not try to repair it in place. The default recognises
    /// nothing.
    fn report_failure(&self, url: &str, text: &str) -> bool {
        let _ = (url, text);
        false
    }

    /// Tears the endpoint down. Called once, when the server stops.
    async fn teardown(&self) -> Result<(), Error>;
}
