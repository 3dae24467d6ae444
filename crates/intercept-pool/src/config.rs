//! Interception configuration: serde enums tagged `type = "server" | "static" |
//! "elastic"`, [`make_interception`] to build one, and [`requires_tunnel`] to decide
//! whether servers must be exposed through tunnels.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

use intercept_core::{Error, Interception, Tunnel};
use intercept_server::{InterceptionServer, ServerConfig};
use intercept_tunnel::{make_tunnel, TunnelConfig};
use serde::{Deserialize, Serialize};

use crate::elastic::{ElasticConfig, ElasticPool};
use crate::member::{InterceptionServerFactory, ServerFactory, TunnelSource};
use crate::static_pool::StaticPool;

/// A tunnel configuration value (e.g. the tunnel crate's config enum, tagged
/// `type = "none" | "custom" | "prime" | "bore"`): how to make one server's tunnel.
pub trait TunnelSpec: fmt::Debug + Send + Sync + 'static {
    /// Whether this configuration asks for no tunnel (`type = "none"`).
    fn is_none(&self) -> bool;

    /// Makes the tunnel of one server. Called once per server (an elastic pool calls it
    /// for every server it starts, so each gets a freshly minted tunnel).
    fn make(&self) -> Result<Arc<dyn Tunnel>, Error>;
}

impl TunnelSpec for TunnelConfig {
    fn is_none(&self) -> bool {
        matches!(self, TunnelConfig::None)
    }

    fn make(&self) -> Result<Arc<dyn Tunnel>, Error> {
        make_tunnel(self)?.ok_or_else(no_tunnel_error)
    }
}

/// One server: its tunnel and, optionally, where it listens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(bound(deserialize = "T: Deserialize<'de> + Default"))]
pub struct ServerEntry<T = TunnelConfig> {
    /// How the server is exposed when a tunnel is required (default `none`).
    #[serde(default)]
    pub tunnel: T,
    /// Where to listen; by default the tunnel decides (loopback, ephemeral port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
}

/// A fixed list of servers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(bound(deserialize = "T: Deserialize<'de> + Default"))]
pub struct StaticEntry<T = TunnelConfig> {
    /// The servers, at least one; each with its own tunnel.
    pub servers: Vec<ServerEntry<T>>,
}

/// An elastic pool: its knobs (flattened: `multiplex`, `min_servers`, ...) and the kind
/// of tunnel each new server gets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "T: Deserialize<'de> + Default"))]
pub struct ElasticEntry<T = TunnelConfig> {
    /// Tunnel configuration of every server the pool starts (default `none`).
    #[serde(default)]
    pub tunnel: T,
    /// The pool's knobs.
    #[serde(flatten)]
    pub pool: ElasticConfig,
    /// Keys that are not knobs; refused by [`make_interception`] (flattened structs cannot
    /// deny unknown fields themselves).
    #[serde(flatten, skip_serializing)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

/// Which interception to run, tagged `type = "server" | "static" | "elastic"`; `T` is
/// the tunnel configuration (by default `intercept_tunnel::TunnelConfig`). The default
/// is an elastic pool with default knobs and no tunnel.
///
/// ```
/// use intercept_pool::InterceptionConfig;
/// use intercept_tunnel::TunnelConfig;
///
/// let config: InterceptionConfig = serde_json::from_str(
///     r#"{"type": "elastic", "multiplex": 16, "tunnel": {"type": "bore", "server": "bore.example"}}"#,
/// ).unwrap();
/// let InterceptionConfig::Elastic(elastic) = config else { panic!("elastic") };
/// assert_eq!(elastic.pool.multiplex, 16);
/// assert_eq!(elastic.tunnel.kind(), "bore");
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[serde(bound(deserialize = "T: Deserialize<'de> + Default"))]
pub enum InterceptionConfig<T = TunnelConfig> {
    /// One server with an optional tunnel.
    Server(ServerEntry<T>),
    /// A fixed list of servers, least-loaded first.
    Static(StaticEntry<T>),
    /// An elastic pool (the default shape).
    Elastic(ElasticEntry<T>),
}

/// Builds an interception (not started) from its configuration with default server
/// settings. See [`make_interception_with`].
pub fn make_interception<T: TunnelSpec + Clone>(
    config: &InterceptionConfig<T>,
    requires_tunnel: bool,
) -> Result<Arc<dyn Interception>, Error> {
    make_interception_with(config, requires_tunnel, ServerConfig::default())
}

/// Builds an interception (not started) whose servers use the `server` settings.
///
/// Tunnels are made only when `requires_tunnel` is true (as in the reference); a tunnel
/// configuration of `type = "none"` is then an error, since remote consumers could not
/// reach the servers. An elastic pool's `min_servers` left unset becomes 1 when a tunnel
/// is required (warm one tunnel ahead of demand), else 0.
pub fn make_interception_with<T: TunnelSpec + Clone>(
    config: &InterceptionConfig<T>,
    requires_tunnel: bool,
    server: ServerConfig,
) -> Result<Arc<dyn Interception>, Error> {
    match config {
        InterceptionConfig::Server(entry) => {
            let mut settings = server;
            settings.listen = entry.listen.or(settings.listen);
            settings.tunnel = tunnel_of(&entry.tunnel, requires_tunnel)?;
            Ok(Arc::new(InterceptionServer::new(settings)?))
        }
        InterceptionConfig::Static(entry) => {
            let factories = entry
                .servers
                .iter()
                .map(|e| {
                    let mut settings = server.clone();
                    settings.listen = e.listen.or(settings.listen);
                    let source = match tunnel_of(&e.tunnel, requires_tunnel)? {
                        Some(t) => TunnelSource::Shared(t),
                        None => TunnelSource::None,
                    };
                    Ok(Arc::new(InterceptionServerFactory::new(settings, source))
                        as Arc<dyn ServerFactory>)
                })
                .collect::<Result<Vec<_>, Error>>()?;
            Ok(Arc::new(StaticPool::new(factories)?))
        }
        InterceptionConfig::Elastic(entry) => {
            if let Some(key) = entry.unknown.keys().next() {
                return Err(Error::invalid(format!(
                    "unknown elastic pool setting `{key}`: see docs/pools.md for the knobs"
                )));
            }
            let mut pool = entry.pool.clone();
            pool.min_servers =
                Some(
                    pool.min_servers
                        .unwrap_or(if requires_tunnel { 1 } else { 0 }),
                );
            let source = if requires_tunnel {
                if entry.tunnel.is_none() {
                    return Err(no_tunnel_error());
                }
                let spec = entry.tunnel.clone();
                TunnelSource::PerServer(Arc::new(move || spec.make()))
            } else {
                TunnelSource::None
            };
            let factory = Arc::new(InterceptionServerFactory::new(server, source));
            Ok(Arc::new(ElasticPool::new(pool, factory)?))
        }
    }
}

impl<T: Default> Default for InterceptionConfig<T> {
    fn default() -> Self {
        InterceptionConfig::Elastic(ElasticEntry {
            tunnel: T::default(),
            pool: ElasticConfig::default(),
            unknown: serde_json::Map::new(),
        })
    }
}

fn no_tunnel_error() -> Error {
    Error::invalid(
        "a tunnel is required (the harness or a tool server runs off this host) but the \
         tunnel is configured as `type = \"none\"`: choose custom, prime or bore",
    )
}

fn tunnel_of<T: TunnelSpec>(
    spec: &T,
    requires_tunnel: bool,
) -> Result<Option<Arc<dyn Tunnel>>, Error> {
    if !requires_tunnel {
        return Ok(None);
    }
    if spec.is_none() {
        return Err(no_tunnel_error());
    }
    spec.make().map(Some)
}

/// Where a harness or a tool server runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Runtime {
    /// A process on this host.
    Subprocess,
    /// A container on this host.
    Docker,
    /// A Prime sandbox (remote).
    Prime,
    /// A Modal sandbox (remote).
    Modal,
}

impl Runtime {
    /// Whether it shares this host's network (reaches `127.0.0.1`).
    pub fn is_local(self) -> bool {
        matches!(self, Runtime::Subprocess | Runtime::Docker)
    }
}

/// A live tool server shared by rollouts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedToolServer {
    /// Where it runs.
    pub runtime: Runtime,
    /// Whether it is external (not run by the framework; it connects out by itself).
    pub external: bool,
}

/// A task-scoped tool server configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolServerConfig {
    /// Where it would run.
    pub runtime: Runtime,
    /// Whether it has a `url` (external: it connects out by itself).
    pub has_url: bool,
    /// Whether it shares the harness runtime (`colocated`).
    pub colocated: bool,
}

/// What [`requires_tunnel`] decides from.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TunnelInputs {
    /// Whether every agent role's harness runtime is local (subprocess, docker).
    pub harness_is_local: bool,
    /// Live shared tool servers.
    pub shared_servers: Vec<SharedToolServer>,
    /// The task class's tool-server configurations.
    pub tool_servers: Vec<ToolServerConfig>,
}

/// Whether servers must be exposed through tunnels: true when any consumer is off the
/// host network (the rule of verifiers' `requires_tunnel`):
///
/// 1. the harness runtime is not local; or
/// 2. a live shared tool server that is not external runs in a non-local runtime; or
/// 3. a task-scoped tool server runs in a non-local runtime, skipping those with a `url`
///    (external) and `colocated` ones (they share the harness runtime).
///
/// ```
/// use intercept_pool::{requires_tunnel, Runtime, ToolServerConfig, TunnelInputs};
/// let mut inputs = TunnelInputs { harness_is_local: true, ..Default::default() };
/// assert!(!requires_tunnel(&inputs));
/// inputs.tool_servers.push(ToolServerConfig { runtime: Runtime::Modal, has_url: false, colocated: false });
/// assert!(requires_tunnel(&inputs));
/// ```
pub fn requires_tunnel(inputs: &TunnelInputs) -> bool {
    !inputs.harness_is_local
        || inputs
            .shared_servers
            .iter()
            .any(|s| !s.external && !s.runtime.is_local())
        || inputs
            .tool_servers
            .iter()
            .any(|c| !c.has_url && !c.colocated && !c.runtime.is_local())
}
