//! What a pool is made of: [`PoolMember`]s (an [`InterceptionServer`] in production, a
//! fake in tests) created by a [`ServerFactory`].

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use intercept_core::{
    Error, Health, Interception, PauseMode, PauseStatus, Session, SlotGuard, Tunnel,
};
use intercept_server::{InterceptionServer, ServerConfig};

/// One started server in a pool.
///
/// It repeats part of [`Interception`] (`acquire`, `load`, `stop`, `inflight`,
/// `pause_status`) on purpose: it is the pool's view of one server, not a shape a
/// harness drives. A pool
/// never starts, pauses or resumes a member through it (members are started by the
/// [`ServerFactory`] and kept in the pool's pause epoch by [`PoolMember::sync_pause`]),
/// and it needs what `Interception` does not say: the endpoint's [`health`], an in-place
/// [`repair`], the one-server `base_url`. Folding the two would give every interception
/// shape (a pool too) these server-only methods, and every test fake the whole of
/// `Interception`.
///
/// [`health`]: PoolMember::health
/// [`repair`]: PoolMember::repair
#[async_trait]
pub trait PoolMember: Send + Sync + fmt::Debug {
    /// Registers a session on this server and returns its slot guard.
    async fn acquire(&self, session: Arc<dyn Session>) -> Result<SlotGuard, Error>;

    /// Sessions registered on this server.
    fn load(&self) -> usize;

    /// Whether the server's endpoint still carries traffic.
    async fn health(&self) -> Health;

    /// Tears the server (and its tunnel) down. Called once.
    async fn stop(&self) -> Result<(), Error>;

    /// Repairs an unhealthy endpoint in place (the same registration and URL when the
    /// backend can; see [`intercept_core::Endpoint::refresh`]). The pool calls it before
    /// it drains a server, and drains only when it fails or the server is still
    /// unhealthy after it. The default cannot repair.
    async fn repair(&self) -> Result<(), Error> {
        Err(Error::Unavailable(
            "this server cannot repair its endpoint".into(),
        ))
    }

    /// Resolves once the server's endpoint knows itself dead
    /// ([`intercept_core::Endpoint::dead`]: a lost tunnel connection, a harness's report),
    /// so that the pool probes it at once instead of at its next health round. The
    /// default never resolves.
    async fn dead(&self) {
        std::future::pending::<()>().await;
    }

    /// Its public base URL, if it has one (for introspection). Defaults to `None`.
    fn base_url(&self) -> Option<String> {
        None
    }

    /// Model calls in flight on this server (for introspection). Defaults to 0.
    fn inflight(&self) -> usize {
        0
    }

    /// Sets the server's pause state and epoch (the pool keeps its servers in step).
    /// Defaults to doing nothing.
    fn sync_pause(&self, _mode: Option<PauseMode>, _epoch: u64) {}

    /// The server's pause status. Defaults to not paused, epoch 0, nothing in flight.
    fn pause_status(&self) -> PauseStatus {
        PauseStatus::default()
    }
}

#[async_trait]
impl PoolMember for InterceptionServer {
    async fn acquire(&self, session: Arc<dyn Session>) -> Result<SlotGuard, Error> {
        Interception::acquire(self, session).await
    }

    fn load(&self) -> usize {
        Interception::load(self)
    }

    async fn health(&self) -> Health {
        match self.endpoint() {
            Some(endpoint) => endpoint.health().await,
            None if self.base_url().is_some() => Health::Healthy,
            None => Health::Unhealthy("the server is not running".into()),
        }
    }

    async fn stop(&self) -> Result<(), Error> {
        Interception::stop(self).await
    }

    async fn repair(&self) -> Result<(), Error> {
        match self.endpoint() {
            Some(endpoint) => endpoint.refresh().await.map(drop),
            None => Err(Error::Unavailable(
                "the server has no endpoint to repair".into(),
            )),
        }
    }

    async fn dead(&self) {
        match self.endpoint() {
            Some(endpoint) => endpoint.dead().await,
            None => std::future::pending::<()>().await,
        }
    }

    fn base_url(&self) -> Option<String> {
        InterceptionServer::base_url(self)
    }

    fn inflight(&self) -> usize {
        InterceptionServer::inflight(self)
    }

    fn sync_pause(&self, mode: Option<PauseMode>, epoch: u64) {
        InterceptionServer::sync_pause(self, mode, epoch);
    }

    fn pause_status(&self) -> PauseStatus {
        InterceptionServer::pause_status(self)
    }
}

/// Creates and starts the servers of a pool.
#[async_trait]
pub trait ServerFactory: Send + Sync + fmt::Debug {
    /// Creates a server, starts it (binding and exposing it through a fresh tunnel when
    /// one is configured) and returns it. `index` numbers the pool's servers in creation
    /// order, from 0. A failed start must leave nothing running.
    async fn start_server(&self, index: u64) -> Result<Arc<dyn PoolMember>, Error>;
}

/// Makes the tunnel of one new server.
pub type TunnelMaker = Arc<dyn Fn() -> Result<Arc<dyn Tunnel>, Error> + Send + Sync>;

/// How an [`InterceptionServerFactory`] gives each server its tunnel.
#[derive(Clone, Default)]
pub enum TunnelSource {
    /// No tunnel: servers listen on loopback.
    #[default]
    None,
    /// Every server exposes itself through this one tunnel backend (a backend that mints
    /// a new public endpoint per `expose`).
    Shared(Arc<dyn Tunnel>),
    /// Every server gets a tunnel of its own, made when the server starts.
    PerServer(TunnelMaker),
}

impl fmt::Debug for TunnelSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TunnelSource::None => f.write_str("None"),
            TunnelSource::Shared(t) => f.debug_tuple("Shared").field(&t.kind()).finish(),
            TunnelSource::PerServer(_) => f.write_str("PerServer(..)"),
        }
    }
}

/// Builds real [`InterceptionServer`]s from a settings template.
#[derive(Debug)]
pub struct InterceptionServerFactory {
    template: ServerConfig,
    tunnel: TunnelSource,
}

impl InterceptionServerFactory {
    /// A factory whose servers use `template` (its `tunnel` field is replaced by what
    /// `tunnel` gives each server).
    pub fn new(template: ServerConfig, tunnel: TunnelSource) -> Self {
        InterceptionServerFactory { template, tunnel }
    }
}

#[async_trait]
impl ServerFactory for InterceptionServerFactory {
    async fn start_server(&self, _index: u64) -> Result<Arc<dyn PoolMember>, Error> {
        let mut config = self.template.clone();
        config.tunnel = match &self.tunnel {
            TunnelSource::None => None,
            TunnelSource::Shared(t) => Some(t.clone()),
            TunnelSource::PerServer(make) => Some(make()?),
        };
        let server = InterceptionServer::new(config)?;
        Interception::start(&server).await?;
        Ok(Arc::new(server))
    }
}
