//! Settings of `intercept serve`, layered as config file < environment (`INTERCEPT_*`) <
//! command-line flags.
//!
//! Every layer goes through the same parser ([`ServeConfig::set`]), so a bad value is
//! reported the same way wherever it came from, naming the key and its source:
//!
//! ```
//! use intercept_cli::config::{ServeConfig, Layers};
//!
//! let file = "multiplex = 8\nmodel = \"from-file\"\n";
//! let env = [("INTERCEPT_MODEL".to_string(), "from-env".to_string())];
//! let flags = [("multiplex", "16".to_string())];
//! let config = ServeConfig::from_layers(Layers {
//!     file: Some(("intercept.toml".as_ref(), file)),
//!     env: &env,
//!     flags: &flags,
//! })?;
//! assert_eq!(config.model.as_deref(), Some("from-env"));
//! assert_eq!(config.multiplex, 16);
//!
//! let err = ServeConfig::from_layers(Layers {
//!     file: None,
//!     env: &[("INTERCEPT_MULTIPLEX".to_string(), "lots".to_string())],
//!     flags: &[],
//! }).unwrap_err();
//! assert!(err.to_string().contains("INTERCEPT_MULTIPLEX"));
//! # Ok::<(), intercept_cli::config::ConfigError>(())
//! ```

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use intercept_core::{NetworkPolicy, OnViolation, Secret};
use intercept_pool::{
    ElasticConfig, ElasticEntry, InterceptionConfig, ServerEntry, SettingNames, StaticEntry,
};
use intercept_tunnel::{redact_url, LimiterBackend, TunnelConfig};

/// Every setting key, as written in the config file (the environment variable is
/// `INTERCEPT_` + the key in upper case, the flag is `--` + the key with `-` for `_`).
pub const KEYS: &[&str] = &[
    "upstream",
    "upstream_api_key_env",
    "allowed_key_envs",
    "model",
    "control",
    "control_token",
    "interception",
    "multiplex",
    "min_servers",
    "max_servers",
    "wait_timeout_secs",
    "drain_timeout_secs",
    "server_idle_timeout_secs",
    "static_servers",
    "tunnel",
    "tunnel_url",
    "tunnel_port",
    "tunnel_host",
    "bore_server",
    "bore_port",
    "bore_secret_env",
    "frpc_sha256",
    "rate_limit_backend",
    "rate_limit_url",
    "trace_dir",
    "log",
    "log_format",
    "shutdown_grace_secs",
    "header_read_timeout_secs",
    "released_retention",
    "released_trace_bytes",
    "max_response_bytes",
    "max_connections",
    "upstream_write_idle_secs",
    "upstream_read_idle_secs",
    "network_allow",
    "network_block",
    "network_on_violation",
];

/// The prefix of the environment variables that configure the sidecar.
pub const ENV_PREFIX: &str = "INTERCEPT_";

/// The environment variable that names a config file (like `--config`).
pub const CONFIG_ENV: &str = "INTERCEPT_CONFIG";

/// Where the default upstream is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamSetting {
    /// The embedded mock model (the one `intercept demo` uses).
    Mock,
    /// An OpenAI-compatible base URL including its version segment.
    Url(String),
}

/// Which interception shape runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Shape {
    /// One interception server (the sidecar's default).
    Server,
    /// `static_servers` identical servers, all started up front; least-loaded first.
    Static,
    /// Servers of `multiplex` sessions each, started on demand, healed and shrunk.
    Elastic,
}

impl Shape {
    /// The name used in settings and in `GET /v1/interception`.
    pub fn as_str(self) -> &'static str {
        match self {
            Shape::Server => "server",
            Shape::Static => "static",
            Shape::Elastic => "elastic",
        }
    }
}

/// Which tunnel exposes the interception's servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TunnelSetting {
    /// No tunnel: harnesses reach the servers on loopback.
    None,
    /// Bring your own public URL (`tunnel_url`) forwarding to `tunnel_port`.
    Custom,
    /// Prime Intellect's tunnel service (`PRIME_API_KEY` or `~/.prime/config.json`).
    Prime,
    /// A self-hosted bore server (`bore_server`, `bore_port`, `bore_secret_env`).
    Bore,
}

impl TunnelSetting {
    /// The name used in settings (`none`, `custom`, `prime`, `bore`).
    pub fn as_str(self) -> &'static str {
        match self {
            TunnelSetting::None => "none",
            TunnelSetting::Custom => "custom",
            TunnelSetting::Prime => "prime",
            TunnelSetting::Bore => "bore",
        }
    }
}

/// bore's default control port.
pub const BORE_DEFAULT_PORT: u16 = 7835;

/// Log line format on stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Where a setting came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The config file at this path.
    File(PathBuf),
    /// The environment.
    Env,
    /// A command-line flag.
    Flag,
}

impl Source {
    /// How the key is spelled in this source.
    pub fn spell(&self, key: &str) -> String {
        match self {
            Source::File(_) => key.to_owned(),
            Source::Env => format!("{ENV_PREFIX}{}", key.to_ascii_uppercase()),
            Source::Flag => format!("--{}", key.replace('_', "-")),
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::File(p) => write!(f, "config file {}", p.display()),
            Source::Env => f.write_str("environment"),
            Source::Flag => f.write_str("command line"),
        }
    }
}

/// A setting that could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The key is not a known setting.
    #[error("unknown setting `{key}` ({origin}); known settings: {known}")]
    UnknownKey {
        /// The key as spelled in its source.
        key: String,
        /// Where it came from.
        origin: Source,
        /// The known keys, as spelled in that source.
        known: String,
    },
    /// The value is not valid for the key.
    #[error("invalid value for `{key}` ({origin}): {message}")]
    BadValue {
        /// The key as spelled in its source.
        key: String,
        /// Where it came from.
        origin: Source,
        /// What is wrong and what is expected.
        message: String,
    },
    /// Settings that are valid one by one but not together (a tunnel without what it
    /// needs, a key that its tunnel does not use, ...).
    #[error("setting `{key}`: {message}")]
    Inconsistent {
        /// The key (config-file spelling) the problem is about.
        key: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// The config file could not be read or is not TOML.
    #[error("cannot read config file {path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

impl ConfigError {
    /// The key (as spelled in its source) the error is about, if any.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::UnknownKey { key, .. }
            | ConfigError::BadValue { key, .. }
            | ConfigError::Inconsistent { key, .. } => Some(key),
            ConfigError::File { .. } => None,
        }
    }
}

/// The resolved settings of `intercept serve`. [`Default`] gives the documented defaults.
#[derive(Clone)]
pub struct ServeConfig {
    /// Default upstream of sessions that name none (`None`: each session must name one).
    pub upstream: Option<UpstreamSetting>,
    /// The environment variable holding the default upstream's API key.
    pub upstream_api_key_env: Option<String>,
    /// The environment variables a session may name as `upstream.api_key_env` in
    /// `POST /v1/sessions` (`None`: only [`ServeConfig::upstream_api_key_env`]). Any other
    /// is refused, so the control token cannot send the sidecar's other variables
    /// upstream.
    pub allowed_key_envs: Option<Vec<String>>,
    /// Non-fatal findings of [`ServeConfig::from_layers`] (unknown `INTERCEPT_*`
    /// environment variables), for the binary to log once logging is up.
    pub warnings: Vec<String>,
    /// Default model of sessions that name none (with the mock: `mock-model`).
    pub model: Option<String>,
    /// Where the control API listens (loopback only; default `127.0.0.1:0`).
    pub control: SocketAddr,
    /// The control API token (generated when `None`).
    pub control_token: Option<Secret>,
    /// The interception shape (default [`Shape::Server`]).
    pub interception: Shape,
    /// Sessions per server of an elastic pool (default 32; validated, unused by the
    /// other shapes).
    pub multiplex: usize,
    /// Servers an elastic pool keeps up (`None`: 1 with a tunnel, else 0).
    pub min_servers: Option<usize>,
    /// Cap on an elastic pool's servers (default 256).
    pub max_servers: usize,
    /// Elastic: how long session creation waits for a seat before it fails with 503
    /// (default 300 s).
    pub wait_timeout: Duration,
    /// Elastic: how long an unhealthy server's sessions may finish before it is torn
    /// down anyway (default 120 s).
    pub drain_timeout: Duration,
    /// Elastic: servers empty this long beyond `min_servers` are stopped (default 300 s).
    pub server_idle_timeout: Duration,
    /// Servers of a static pool (default 1).
    pub static_servers: usize,
    /// The tunnel (default [`TunnelSetting::None`]).
    pub tunnel: TunnelSetting,
    /// `custom`: the public URL that reaches the server.
    pub tunnel_url: Option<String>,
    /// `custom`: the local port the URL forwards to (the server listens there).
    pub tunnel_port: Option<u16>,
    /// `custom`: the address the server binds (default `0.0.0.0`).
    pub tunnel_host: Option<IpAddr>,
    /// `bore`: the host running `bore server`.
    pub bore_server: Option<String>,
    /// `bore`: its control port (default 7835).
    pub bore_port: Option<u16>,
    /// `bore`: the environment variable holding the bore server's secret, if it has one.
    pub bore_secret_env: Option<String>,
    /// `prime`: the pinned SHA-256 (hex) of the frp release tarball for this platform,
    /// which allows frpc to be downloaded when it is not installed.
    pub frpc_sha256: Option<String>,
    /// `prime` and `bore`: where the tunnel start rate limiter keeps its window: a
    /// host-wide file (the default) or a Redis server shared by a fleet of hosts.
    pub rate_limit_backend: LimiterBackend,
    /// The Redis server of `rate_limit_backend = redis` (`redis://host:port/db`).
    pub rate_limit_url: Option<String>,
    /// Directory of the JSONL trace files (`<dir>/<session id>.jsonl`).
    pub trace_dir: Option<PathBuf>,
    /// Log filter (`RUST_LOG` syntax); `None` uses `RUST_LOG`, else `info`.
    pub log: Option<String>,
    /// Log format.
    pub log_format: LogFormat,
    /// On shutdown, in-flight calls may finish for this long before they are cancelled.
    pub shutdown_grace: Duration,
    /// An HTTP/1 request head (harness ports and control API) must be complete this
    /// long after the connection opened or its previous answer, else the connection is
    /// closed; `None` (`0` in the settings): no limit.
    pub header_read_timeout: Option<Duration>,
    /// Released sessions whose traces stay readable through the control API.
    pub released_retention: usize,
    /// Bytes of released traces (and their episodes) held in memory when there is no
    /// trace directory; the oldest are dropped first (their ids stay remembered).
    pub released_trace_bytes: usize,
    /// Largest upstream answer read for one call (default 256 MiB); past it the call
    /// fails with 502 and its record is marked `truncated`.
    pub max_response_bytes: u64,
    /// Connections served at once by each harness port and by the control API (default
    /// 16,384; `None`, `0` in the settings: no cap).
    pub max_connections: Option<usize>,
    /// A plain-HTTP upstream that takes no byte of a request for this long fails the
    /// call (default 30 s; `None`: no limit).
    pub upstream_write_idle: Option<Duration>,
    /// A plain-HTTP upstream that sends nothing for this long once it has the request
    /// fails the call (default `None`: no limit).
    pub upstream_read_idle: Option<Duration>,
    /// Network policy of sessions that name none (default unrestricted).
    pub network: NetworkPolicy,
}

impl fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeConfig")
            .field("upstream", &self.upstream)
            .field("upstream_api_key_env", &self.upstream_api_key_env)
            .field("allowed_key_envs", &self.allowed_key_envs)
            .field("model", &self.model)
            .field("control", &self.control)
            .field(
                "control_token",
                &self.control_token.as_ref().map(|_| "<set>"),
            )
            .field("interception", &self.interception)
            .field("multiplex", &self.multiplex)
            .field("min_servers", &self.min_servers)
            .field("max_servers", &self.max_servers)
            .field("wait_timeout", &self.wait_timeout)
            .field("drain_timeout", &self.drain_timeout)
            .field("server_idle_timeout", &self.server_idle_timeout)
            .field("static_servers", &self.static_servers)
            .field("tunnel", &self.tunnel)
            .field("tunnel_url", &self.tunnel_url)
            .field("tunnel_port", &self.tunnel_port)
            .field("tunnel_host", &self.tunnel_host)
            .field("bore_server", &self.bore_server)
            .field("bore_port", &self.bore_port)
            .field("bore_secret_env", &self.bore_secret_env)
            .field("frpc_sha256", &self.frpc_sha256)
            .field("rate_limit_backend", &self.rate_limit_backend)
            .field(
                "rate_limit_url",
                &self.rate_limit_url.as_deref().map(redact_url),
            )
            .field("trace_dir", &self.trace_dir)
            .field("log", &self.log)
            .field("log_format", &self.log_format)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("header_read_timeout", &self.header_read_timeout)
            .field("released_retention", &self.released_retention)
            .field("released_trace_bytes", &self.released_trace_bytes)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("max_connections", &self.max_connections)
            .field("upstream_write_idle", &self.upstream_write_idle)
            .field("upstream_read_idle", &self.upstream_read_idle)
            .field("warnings", &self.warnings)
            .field("network", &self.network)
            .finish()
    }
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            upstream: None,
            upstream_api_key_env: None,
            allowed_key_envs: None,
            warnings: Vec::new(),
            model: None,
            control: SocketAddr::from(([127, 0, 0, 1], 0)),
            control_token: None,
            interception: Shape::Server,
            multiplex: 32,
            min_servers: None,
            max_servers: 256,
            wait_timeout: Duration::from_secs(300),
            drain_timeout: Duration::from_secs(120),
            server_idle_timeout: Duration::from_secs(300),
            static_servers: 1,
            tunnel: TunnelSetting::None,
            tunnel_url: None,
            tunnel_port: None,
            tunnel_host: None,
            bore_server: None,
            bore_port: None,
            bore_secret_env: None,
            frpc_sha256: None,
            rate_limit_backend: LimiterBackend::File,
            rate_limit_url: None,
            trace_dir: None,
            log: None,
            log_format: LogFormat::Text,
            shutdown_grace: Duration::from_secs(30),
            header_read_timeout: Some(Duration::from_secs(30)),
            released_retention: 4096,
            released_trace_bytes: 256 << 20,
            max_response_bytes: 256 << 20,
            max_connections: Some(intercept_server::DEFAULT_MAX_CONNECTIONS),
            upstream_write_idle: Some(Duration::from_secs(30)),
            upstream_read_idle: None,
            network: NetworkPolicy::default(),
        }
    }
}

/// The raw layers a [`ServeConfig`] is built from.
#[derive(Debug, Clone, Copy)]
pub struct Layers<'a> {
    /// The config file: its path (for messages) and its TOML text.
    pub file: Option<(&'a Path, &'a str)>,
    /// The environment; only `INTERCEPT_*` variables are looked at.
    pub env: &'a [(String, String)],
    /// Flags that were given: (key, value).
    pub flags: &'a [(&'a str, String)],
}

impl ServeConfig {
    /// Builds the settings from the layers, lowest first: file, environment, flags.
    pub fn from_layers(layers: Layers<'_>) -> Result<Self, ConfigError> {
        let mut config = ServeConfig::default();
        if let Some((path, text)) = layers.file {
            let source = Source::File(path.to_owned());
            let table: toml::Table = text.parse().map_err(|e| ConfigError::File {
                path: path.to_owned(),
                message: format!("not valid TOML: {e}"),
            })?;
            for (key, value) in &table {
                let raw = match value {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Integer(i) => i.to_string(),
                    toml::Value::Float(f) => f.to_string(),
                    toml::Value::Boolean(b) => b.to_string(),
                    _ => {
                        if !KEYS.contains(&key.as_str()) {
                            return Err(unknown(key, &source));
                        }
                        return Err(ConfigError::BadValue {
                            key: key.clone(),
                            origin: source,
                            message: "expected a string or a number, not a table or array".into(),
                        });
                    }
                };
                config.set(&source, key, &raw)?;
            }
        }
        for (name, value) in layers.env {
            let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
                continue;
            };
            if name == CONFIG_ENV {
                continue;
            }
            let key = rest.to_ascii_lowercase();
            if !KEYS.contains(&key.as_str()) || rest != rest.to_ascii_uppercase() {
                // Scripts export variables of their own with this prefix (`INTERCEPT_BIN`):
                // a warning, not an error (an unknown key in a file or a flag is one).
                config.warnings.push(format!(
                    "ignoring the environment variable {name}: not a setting (did you mean {}?)",
                    closest_key(&key, &Source::Env)
                ));
                continue;
            }
            config.set(&Source::Env, &key, value)?;
        }
        for (key, value) in layers.flags {
            config.set(&Source::Flag, key, value)?;
        }
        config.check()?;
        Ok(config)
    }

    /// Checks that the settings fit together: each tunnel has what it needs and no key of
    /// another tunnel is set; a `custom` tunnel (one fixed URL and port) runs one server.
    pub fn check(&self) -> Result<(), ConfigError> {
        let inconsistent = |key: &str, message: String| ConfigError::Inconsistent {
            key: key.to_owned(),
            message,
        };
        let tunnel = self.tunnel.as_str();
        let given: [(&str, bool, TunnelSetting); 7] = [
            (
                "tunnel_url",
                self.tunnel_url.is_some(),
                TunnelSetting::Custom,
            ),
            (
                "tunnel_port",
                self.tunnel_port.is_some(),
                TunnelSetting::Custom,
            ),
            (
                "tunnel_host",
                self.tunnel_host.is_some(),
                TunnelSetting::Custom,
            ),
            (
                "bore_server",
                self.bore_server.is_some(),
                TunnelSetting::Bore,
            ),
            ("bore_port", self.bore_port.is_some(), TunnelSetting::Bore),
            (
                "bore_secret_env",
                self.bore_secret_env.is_some(),
                TunnelSetting::Bore,
            ),
            (
                "frpc_sha256",
                self.frpc_sha256.is_some(),
                TunnelSetting::Prime,
            ),
        ];
        for (key, set, owner) in given {
            if set && self.tunnel != owner {
                return Err(inconsistent(
                    key,
                    format!(
                        "is a setting of the {} tunnel but tunnel = {tunnel}; set tunnel = {} \
                         or remove it",
                        owner.as_str(),
                        owner.as_str()
                    ),
                ));
            }
        }
        match self.tunnel {
            TunnelSetting::Custom => {
                if self.tunnel_url.is_none() {
                    return Err(inconsistent(
                        "tunnel_url",
                        "required with tunnel = custom: the public URL that reaches the server"
                            .into(),
                    ));
                }
                if self.tunnel_port.is_none() {
                    return Err(inconsistent(
                        "tunnel_port",
                        "required with tunnel = custom: the local port the URL forwards to".into(),
                    ));
                }
                match self.interception {
                    Shape::Elastic => {
                        return Err(inconsistent(
                            "tunnel",
                            "a custom tunnel is one fixed URL and port, but an elastic pool \
                             gives every new server a tunnel of its own; use tunnel = bore or \
                             prime, or interception = server"
                                .into(),
                        ))
                    }
                    Shape::Static if self.static_servers > 1 => {
                        return Err(inconsistent(
                            "static_servers",
                            format!(
                                "{} servers cannot share one custom tunnel (one URL, one \
                                 port); use static_servers = 1, or tunnel = bore or prime",
                                self.static_servers
                            ),
                        ))
                    }
                    _ => {}
                }
            }
            TunnelSetting::Bore if self.bore_server.is_none() => {
                return Err(inconsistent(
                    "bore_server",
                    "required with tunnel = bore: the host running `bore server`".into(),
                ));
            }
            _ => {}
        }
        match (self.rate_limit_backend, &self.rate_limit_url) {
            (LimiterBackend::Redis, None) => {
                return Err(inconsistent(
                    "rate_limit_url",
                    "required with rate_limit_backend = redis: the Redis server the fleet \
                     shares, e.g. redis://10.0.0.5:6379/"
                        .into(),
                ))
            }
            (LimiterBackend::File, Some(_)) => {
                return Err(inconsistent(
                    "rate_limit_url",
                    "is only used with rate_limit_backend = redis; set it, or remove \
                     rate_limit_url"
                        .into(),
                ))
            }
            (LimiterBackend::Redis, Some(_))
                if !matches!(self.tunnel, TunnelSetting::Prime | TunnelSetting::Bore) =>
            {
                return Err(inconsistent(
                    "rate_limit_backend",
                    format!(
                        "limits tunnel starts, but tunnel = {tunnel} starts none; use tunnel = \
                         prime or bore, or remove it"
                    ),
                ))
            }
            _ => {}
        }
        if let Some(min) = self.min_servers {
            if min > self.max_servers {
                return Err(inconsistent(
                    "min_servers",
                    format!("{min} exceeds max_servers = {}", self.max_servers),
                ));
            }
        }
        Ok(())
    }

    /// The tunnel configuration these settings describe; `bore_secret` is the value of
    /// the variable named by `bore_secret_env` (read by the caller).
    pub fn tunnel_config(&self, bore_secret: Option<String>) -> Result<TunnelConfig, ConfigError> {
        let value = match self.tunnel {
            TunnelSetting::None => serde_json::json!({"type": "none"}),
            TunnelSetting::Prime => serde_json::json!({"type": "prime"}),
            TunnelSetting::Custom => {
                let mut v = serde_json::json!({
                    "type": "custom",
                    "url": self.tunnel_url,
                    "port": self.tunnel_port,
                });
                if let Some(host) = self.tunnel_host {
                    v["host"] = serde_json::Value::String(host.to_string());
                }
                v
            }
            TunnelSetting::Bore => serde_json::json!({
                "type": "bore",
                "server": self.bore_server,
                "control_port": self.bore_port.unwrap_or(BORE_DEFAULT_PORT),
                "secret": bore_secret,
            }),
        };
        let mut config: TunnelConfig =
            serde_json::from_value(value).map_err(|e| ConfigError::Inconsistent {
                key: "tunnel".into(),
                message: format!(
                    "the {} tunnel's settings are incomplete: {e}",
                    self.tunnel.as_str()
                ),
            })?;
        // A fleet-wide limiter: Prime's (on by default) moves to Redis; bore's (off by
        // default, the server has no cap of its own) is turned on.
        if self.rate_limit_backend == LimiterBackend::Redis {
            let limit = match &mut config {
                TunnelConfig::Prime(prime) => Some(&mut prime.rate_limit),
                TunnelConfig::Bore(bore) => Some(&mut bore.rate_limit),
                _ => None,
            };
            if let Some(limit) = limit {
                limit.enabled = true;
                limit.backend = LimiterBackend::Redis;
                limit.url.clone_from(&self.rate_limit_url);
            }
        }
        // Messages that ask for a setting name the sidecar's own.
        match &mut config {
            TunnelConfig::Bore(bore) => {
                bore.secret_hint = Some(
                    "bore_secret_env (--bore-secret-env) to the name of the environment \
                     variable that holds it"
                        .into(),
                );
            }
            TunnelConfig::Prime(prime) => {
                if let (Some(hex), Some(platform)) = (
                    &self.frpc_sha256,
                    intercept_tunnel::prime::install::platform(),
                ) {
                    prime.frpc.sha256.insert(platform.to_owned(), hex.clone());
                }
                prime.frpc.pin_hint = Some("with frpc_sha256 (--frpc-sha256)".into());
            }
            _ => {}
        }
        Ok(config)
    }

    /// The interception configuration these settings describe, with tunnels of
    /// `tunnel` (`T` wraps or is the tunnel crate's configuration).
    pub fn interception_config<T: Clone>(&self, tunnel: T) -> InterceptionConfig<T> {
        match self.interception {
            Shape::Server => InterceptionConfig::Server(ServerEntry {
                tunnel,
                listen: None,
            }),
            Shape::Static => InterceptionConfig::Static(StaticEntry {
                servers: vec![
                    ServerEntry {
                        tunnel,
                        listen: None,
                    };
                    self.static_servers
                ],
            }),
            Shape::Elastic => InterceptionConfig::Elastic(ElasticEntry {
                tunnel,
                pool: ElasticConfig {
                    multiplex: self.multiplex,
                    min_servers: self.min_servers,
                    max_servers: self.max_servers,
                    wait_timeout: self.wait_timeout,
                    drain_timeout: self.drain_timeout,
                    idle_timeout: self.server_idle_timeout,
                    setting_names: SettingNames {
                        max_servers: "max_servers",
                        multiplex: "multiplex",
                        wait_timeout: "wait_timeout_secs",
                    },
                    ..ElasticConfig::default()
                },
                unknown: serde_json::Map::new(),
            }),
        }
    }

    /// Applies one setting; `key` is the file spelling (e.g. `shutdown_grace_secs`).
    pub fn set(&mut self, source: &Source, key: &str, raw: &str) -> Result<(), ConfigError> {
        let bad = |message: String| ConfigError::BadValue {
            key: source.spell(key),
            origin: source.clone(),
            message,
        };
        let raw_trimmed = raw.trim();
        match key {
            "upstream" => {
                self.upstream = Some(parse_upstream(raw_trimmed).map_err(bad)?);
            }
            "upstream_api_key_env" => {
                if !is_env_name(raw_trimmed) {
                    return Err(bad(format!(
                        "{raw_trimmed:?} is not an environment variable name (letters, digits \
                         and `_`); give the name of the variable that holds the key, never \
                         the key itself"
                    )));
                }
                self.upstream_api_key_env = Some(raw_trimmed.to_owned());
            }
            "allowed_key_envs" => {
                let names: Vec<String> = raw_trimmed
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .map(str::to_owned)
                    .collect();
                if let Some(bad_name) = names.iter().find(|n| !is_env_name(n)) {
                    return Err(bad(format!(
                        "{bad_name:?} is not an environment variable name (letters, digits \
                         and `_`); give a comma-separated list of variable names"
                    )));
                }
                self.allowed_key_envs = Some(names);
            }
            "model" => {
                if raw_trimmed.is_empty() {
                    return Err(bad("the model name is empty".into()));
                }
                self.model = Some(raw_trimmed.to_owned());
            }
            "control" => {
                let addr: SocketAddr = raw_trimmed.parse().map_err(|_| {
                    bad(format!(
                        "{raw_trimmed:?} is not an address; expected IP:PORT such as \
                         127.0.0.1:0"
                    ))
                })?;
                if !addr.ip().is_loopback() {
                    return Err(bad(format!(
                        "{addr} is not a loopback address; the control API only listens on \
                         loopback (e.g. 127.0.0.1:7700)"
                    )));
                }
                self.control = addr;
            }
            "control_token" => {
                if raw.is_empty() || !raw.chars().all(|c| c.is_ascii_graphic()) {
                    return Err(bad(
                        "the token must be non-empty printable ASCII without spaces".into(),
                    ));
                }
                self.control_token = Some(Secret::new(raw));
            }
            "interception" => {
                self.interception = match raw_trimmed {
                    "server" => Shape::Server,
                    "static" => Shape::Static,
                    "elastic" => Shape::Elastic,
                    other => {
                        return Err(bad(format!(
                            "{other:?} is not a shape; expected server, static or elastic"
                        )))
                    }
                };
            }
            "multiplex" => {
                self.multiplex = match raw_trimmed.parse::<usize>() {
                    Ok(n) if n > 0 => n,
                    _ => return Err(bad(format!("{raw_trimmed:?} is not a positive integer"))),
                };
            }
            "min_servers" => {
                self.min_servers =
                    Some(raw_trimmed.parse::<usize>().map_err(|_| {
                        bad(format!("{raw_trimmed:?} is not a non-negative integer"))
                    })?);
            }
            "max_servers" | "static_servers" => {
                let n = match raw_trimmed.parse::<usize>() {
                    Ok(n) if n > 0 => n,
                    _ => return Err(bad(format!("{raw_trimmed:?} is not a positive integer"))),
                };
                if key == "max_servers" {
                    self.max_servers = n;
                } else {
                    self.static_servers = n;
                }
            }
            "tunnel" => {
                self.tunnel = match raw_trimmed {
                    "none" => TunnelSetting::None,
                    "custom" => TunnelSetting::Custom,
                    "prime" => TunnelSetting::Prime,
                    "bore" => TunnelSetting::Bore,
                    other => {
                        return Err(bad(format!(
                            "{other:?} is not a tunnel; expected none, custom, prime or bore"
                        )))
                    }
                };
            }
            "tunnel_url" => {
                self.tunnel_url = Some(check_base_url(raw_trimmed).map_err(|e| {
                    bad(e.replace(
                        "expected e.g. http://127.0.0.1:8000/v1",
                        "expected the public URL, e.g. https://rollouts.example.com",
                    ))
                })?);
            }
            "tunnel_port" | "bore_port" => {
                let port = match raw_trimmed.parse::<u16>() {
                    Ok(p) if p > 0 => p,
                    _ => {
                        return Err(bad(format!(
                            "{raw_trimmed:?} is not a port; expected 1 to 65535"
                        )))
                    }
                };
                if key == "tunnel_port" {
                    self.tunnel_port = Some(port);
                } else {
                    self.bore_port = Some(port);
                }
            }
            "tunnel_host" => {
                self.tunnel_host = Some(raw_trimmed.parse::<IpAddr>().map_err(|_| {
                    bad(format!(
                        "{raw_trimmed:?} is not an IP address; expected e.g. 0.0.0.0 or 127.0.0.1"
                    ))
                })?);
            }
            "bore_server" => {
                if raw_trimmed.is_empty()
                    || (raw_trimmed.contains(['/', ' ', ':'])
                        && raw_trimmed.parse::<IpAddr>().is_err())
                {
                    return Err(bad(format!(
                        "{raw_trimmed:?} is not a host name or IP address (give the port as \
                         bore_port, without a scheme)"
                    )));
                }
                self.bore_server = Some(raw_trimmed.to_owned());
            }
            "wait_timeout_secs" | "drain_timeout_secs" | "server_idle_timeout_secs" => {
                let secs = raw_trimmed
                    .parse::<f64>()
                    .ok()
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| {
                        bad(format!("{raw_trimmed:?} is not a number of seconds (> 0)"))
                    })?;
                match key {
                    "wait_timeout_secs" => self.wait_timeout = secs,
                    "drain_timeout_secs" => self.drain_timeout = secs,
                    _ => self.server_idle_timeout = secs,
                }
            }
            "frpc_sha256" => {
                let hex = raw_trimmed.to_ascii_lowercase();
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(bad(format!(
                        "{raw_trimmed:?} is not a SHA-256 (64 hex digits) of the frp release \
                         tarball for this platform"
                    )));
                }
                self.frpc_sha256 = Some(hex);
            }
            "rate_limit_backend" => {
                self.rate_limit_backend = match raw_trimmed {
                    "file" => LimiterBackend::File,
                    "redis" => LimiterBackend::Redis,
                    other => {
                        return Err(bad(format!(
                            "{other:?} is not a rate limiter backend; expected file (one \
                             host) or redis (a fleet sharing rate_limit_url)"
                        )))
                    }
                };
            }
            "rate_limit_url" => {
                if !(raw_trimmed.starts_with("redis://")
                    || raw_trimmed.starts_with("redis+unix://")
                    || raw_trimmed.starts_with("unix://"))
                {
                    return Err(bad(format!(
                        "{:?} is not a Redis URL; expected redis://[user:password@]host[:port][/db]",
                        redact_url(raw_trimmed)
                    )));
                }
                self.rate_limit_url = Some(raw_trimmed.to_owned());
            }
            "bore_secret_env" => {
                if !is_env_name(raw_trimmed) {
                    return Err(bad(format!(
                        "{raw_trimmed:?} is not an environment variable name (letters, digits \
                         and `_`); give the name of the variable that holds the secret, never \
                         the secret itself"
                    )));
                }
                self.bore_secret_env = Some(raw_trimmed.to_owned());
            }
            "trace_dir" => {
                if raw_trimmed.is_empty() {
                    return Err(bad("the directory is empty".into()));
                }
                self.trace_dir = Some(PathBuf::from(raw_trimmed));
            }
            "log" => {
                tracing_subscriber::EnvFilter::try_new(raw_trimmed).map_err(|e| {
                    bad(format!(
                        "{raw_trimmed:?} is not a log filter ({e}); expected e.g. `info` or \
                         `intercept_server=debug,info`"
                    ))
                })?;
                self.log = Some(raw_trimmed.to_owned());
            }
            "log_format" => {
                self.log_format = match raw_trimmed {
                    "text" => LogFormat::Text,
                    "json" => LogFormat::Json,
                    other => {
                        return Err(bad(format!(
                            "{other:?} is not a format; expected text or json"
                        )))
                    }
                };
            }
            "shutdown_grace_secs" => {
                self.shutdown_grace = raw_trimmed
                    .parse::<f64>()
                    .ok()
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .ok_or_else(|| {
                        bad(format!("{raw_trimmed:?} is not a number of seconds (>= 0)"))
                    })?;
            }
            "header_read_timeout_secs" => {
                let secs = raw_trimmed
                    .parse::<f64>()
                    .ok()
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .ok_or_else(|| {
                        bad(format!(
                            "{raw_trimmed:?} is not a number of seconds (>= 0; 0: no limit)"
                        ))
                    })?;
                self.header_read_timeout = (!secs.is_zero()).then_some(secs);
            }
            "released_retention" => {
                self.released_retention = raw_trimmed
                    .parse::<usize>()
                    .map_err(|_| bad(format!("{raw_trimmed:?} is not a non-negative integer")))?;
            }
            "released_trace_bytes" => {
                self.released_trace_bytes = raw_trimmed
                    .parse::<usize>()
                    .map_err(|_| bad(format!("{raw_trimmed:?} is not a number of bytes")))?;
            }
            "max_connections" => {
                let n = raw_trimmed.parse::<usize>().map_err(|_| {
                    bad(format!(
                        "{raw_trimmed:?} is not a number of connections (an integer; 0: no cap)"
                    ))
                })?;
                self.max_connections = (n > 0).then_some(n);
            }
            "max_response_bytes" => {
                self.max_response_bytes = raw_trimmed
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| {
                        bad(format!(
                            "{raw_trimmed:?} is not a number of bytes (an integer > 0)"
                        ))
                    })?;
            }
            "upstream_write_idle_secs" | "upstream_read_idle_secs" => {
                let limit = raw_trimmed
                    .parse::<f64>()
                    .ok()
                    .and_then(|s| Duration::try_from_secs_f64(s).ok())
                    .ok_or_else(|| {
                        bad(format!(
                            "{raw_trimmed:?} is not a number of seconds (>= 0; 0 turns the \
                             timeout off)"
                        ))
                    })?;
                let limit = (!limit.is_zero()).then_some(limit);
                if key == "upstream_write_idle_secs" {
                    self.upstream_write_idle = limit;
                } else {
                    self.upstream_read_idle = limit;
                }
            }
            "network_allow" | "network_block" => {
                let list: Vec<&str> = raw_trimmed
                    .split(',')
                    .map(str::trim)
                    .filter(|p| !p.is_empty())
                    .collect();
                let (allow, block) = if key == "network_allow" {
                    (
                        list.iter().map(|p| (*p).to_owned()).collect(),
                        self.network.block_patterns(),
                    )
                } else {
                    (
                        self.network.allow_patterns(),
                        list.iter().map(|p| (*p).to_owned()).collect(),
                    )
                };
                self.network = NetworkPolicy::new(&allow, &block)
                    .map_err(|e| bad(format!("{e}; expected comma-separated host patterns")))?
                    .with_on_violation(self.network.on_violation());
            }
            "network_on_violation" => {
                let mode = match raw_trimmed {
                    "strip" => OnViolation::Strip,
                    "reject" => OnViolation::Reject,
                    other => return Err(bad(format!("{other:?} is not strip or reject"))),
                };
                self.network = self.network.clone().with_on_violation(mode);
            }
            _ => return Err(unknown(&source.spell(key), source)),
        }
        Ok(())
    }
}

impl ServeConfig {
    /// The variables a session may name as `upstream.api_key_env`:
    /// [`ServeConfig::allowed_key_envs`], else the configured `upstream_api_key_env`.
    pub fn key_envs_allowed(&self) -> Vec<String> {
        match &self.allowed_key_envs {
            Some(list) => list.clone(),
            None => self.upstream_api_key_env.iter().cloned().collect(),
        }
    }
}

/// The known key closest to `key` (edit distance), spelled for `source`.
fn closest_key(key: &str, source: &Source) -> String {
    let best = KEYS
        .iter()
        .min_by_key(|k| strsim::levenshtein(k, key))
        .copied()
        .unwrap_or("upstream");
    source.spell(best)
}

fn is_env_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn unknown(key: &str, source: &Source) -> ConfigError {
    ConfigError::UnknownKey {
        key: key.to_owned(),
        origin: source.clone(),
        known: KEYS
            .iter()
            .map(|k| source.spell(k))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// Checks an upstream base URL (`http(s)://host[:port]/path`).
pub(crate) fn check_base_url(raw: &str) -> Result<String, String> {
    let uri: http::Uri = raw
        .parse()
        .map_err(|e| format!("{raw:?} is not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http" | "https") if uri.host().is_some() => Ok(raw.trim_end_matches('/').to_owned()),
        _ => Err(format!(
            "{raw:?} is not an http(s) URL; expected e.g. http://127.0.0.1:8000/v1"
        )),
    }
}

fn parse_upstream(raw: &str) -> Result<UpstreamSetting, String> {
    if raw == "mock" {
        return Ok(UpstreamSetting::Mock);
    }
    check_base_url(raw)
        .map(UpstreamSetting::Url)
        .map_err(|e| format!("{e}, or `mock`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults() {
        let c = ServeConfig::from_layers(Layers {
            file: None,
            env: &env(&[("PATH", "/bin"), ("INTERCEPT_CONFIG", "x.toml")]),
            flags: &[],
        })
        .unwrap();
        assert_eq!(c.control, SocketAddr::from(([127, 0, 0, 1], 0)));
        assert_eq!(c.multiplex, 32);
        assert_eq!(c.upstream, None);
        assert_eq!(c.shutdown_grace, Duration::from_secs(30));
        assert_eq!(c.log_format, LogFormat::Text);
        assert!(c.control_token.is_none());
    }

    #[test]
    fn layers_override_in_order() {
        let file = "upstream = \"mock\"\nmodel = \"file\"\nmultiplex = 4\nlog_format = \"json\"\n\
                    trace_dir = \"/tmp/file\"\nshutdown_grace_secs = 1.5\n";
        let e = env(&[
            ("INTERCEPT_MODEL", "env"),
            ("INTERCEPT_MULTIPLEX", "8"),
            ("INTERCEPT_CONTROL_TOKEN", "env-token"),
        ]);
        let flags = [("multiplex", "16".to_string())];
        let c = ServeConfig::from_layers(Layers {
            file: Some((Path::new("i.toml"), file)),
            env: &e,
            flags: &flags,
        })
        .unwrap();
        assert_eq!(c.upstream, Some(UpstreamSetting::Mock));
        assert_eq!(c.model.as_deref(), Some("env"));
        assert_eq!(c.multiplex, 16);
        assert_eq!(c.log_format, LogFormat::Json);
        assert_eq!(c.trace_dir, Some(PathBuf::from("/tmp/file")));
        assert_eq!(c.shutdown_grace, Duration::from_millis(1500));
        assert_eq!(c.control_token.unwrap().expose(), "env-token");
        let debug = format!(
            "{:?}",
            ServeConfig::from_layers(Layers {
                file: None,
                env: &e,
                flags: &[],
            })
            .unwrap()
        );
        assert!(!debug.contains("env-token"), "{debug}");
    }

    fn err(file: Option<&str>, e: &[(&str, &str)], flags: &[(&str, &str)]) -> ConfigError {
        let e = env(e);
        let flags: Vec<(&str, String)> = flags.iter().map(|(k, v)| (*k, v.to_string())).collect();
        ServeConfig::from_layers(Layers {
            file: file.map(|t| (Path::new("i.toml"), t)),
            env: &e,
            flags: &flags,
        })
        .unwrap_err()
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = err(Some("multiplx = 3\n"), &[], &[]);
        assert!(matches!(e, ConfigError::UnknownKey { ref key, .. } if key == "multiplx"));
        assert!(e.to_string().contains("config file i.toml"), "{e}");
        // Unknown environment variables are warnings naming the closest setting, and
        // the ones that are settings still apply.
        let vars = env(&[
            ("INTERCEPT_MULTIPLX", "3"),
            ("INTERCEPT_BIN", "/usr/local/bin/intercept"),
            ("INTERCEPT_MODEL", "m"),
        ]);
        let c = ServeConfig::from_layers(Layers {
            file: None,
            env: &vars,
            flags: &[],
        })
        .expect("unknown variables are not errors");
        assert_eq!(c.model.as_deref(), Some("m"));
        assert_eq!(c.warnings.len(), 2, "{:?}", c.warnings);
        assert!(
            c.warnings[0].contains("INTERCEPT_MULTIPLX")
                && c.warnings[0].contains("did you mean INTERCEPT_MULTIPLEX?"),
            "{:?}",
            c.warnings
        );
        assert!(c.warnings[1].contains("INTERCEPT_BIN"), "{:?}", c.warnings);
        let e = err(None, &[], &[("nope", "1")]);
        assert_eq!(e.key(), Some("--nope"));
        let e = err(Some("[server]\nport = 1\n"), &[], &[]);
        assert_eq!(e.key(), Some("server"));
        let e = err(Some("model = [1]\n"), &[], &[]);
        assert!(matches!(e, ConfigError::BadValue { ref key, .. } if key == "model"));
        let e = err(Some("this is = = not toml"), &[], &[]);
        assert!(matches!(e, ConfigError::File { .. }), "{e}");
    }

    #[test]
    fn every_bad_value_names_its_key() {
        let cases: &[(&str, &str)] = &[
            ("upstream", "ftp://x"),
            ("upstream", "not a url"),
            ("upstream_api_key_env", "sk-abc def"),
            ("upstream_api_key_env", ""),
            ("model", " "),
            ("control", "localhost"),
            ("control", "0.0.0.0:80"),
            ("control_token", "has space"),
            ("control_token", ""),
            ("interception", "cluster"),
            ("interception", "Elastic"),
            ("multiplex", "0"),
            ("multiplex", "-1"),
            ("multiplex", "x"),
            ("min_servers", "-1"),
            ("min_servers", "some"),
            ("max_servers", "0"),
            ("max_servers", "1.5"),
            ("wait_timeout_secs", "0"),
            ("wait_timeout_secs", "soon"),
            ("drain_timeout_secs", "-1"),
            ("server_idle_timeout_secs", "x"),
            ("frpc_sha256", "abc"),
            ("frpc_sha256", &"g".repeat(64)),
            ("static_servers", "0"),
            ("static_servers", "two"),
            ("tunnel", "ngrok"),
            ("tunnel", ""),
            ("tunnel_url", "rollouts.example.com"),
            ("tunnel_url", "ftp://rollouts.example.com"),
            ("tunnel_url", ""),
            ("tunnel_port", "0"),
            ("tunnel_port", "65536"),
            ("tunnel_port", "http"),
            ("tunnel_host", "localhost"),
            ("tunnel_host", "0.0.0.0:80"),
            ("bore_server", ""),
            ("bore_server", "http://bore.example"),
            ("bore_server", "bore.example:7835"),
            ("bore_port", "0"),
            ("bore_port", "70000"),
            ("bore_secret_env", "s3cret value"),
            ("bore_secret_env", ""),
            ("trace_dir", ""),
            ("log", "info,[[["),
            ("log_format", "xml"),
            ("shutdown_grace_secs", "-1"),
            ("shutdown_grace_secs", "soon"),
            ("released_retention", "-5"),
            ("released_trace_bytes", "256MiB"),
            ("max_response_bytes", "0"),
            ("max_connections", "-1"),
            ("max_connections", "many"),
            ("max_response_bytes", "1GB"),
            ("upstream_write_idle_secs", "-1"),
            ("upstream_write_idle_secs", "never"),
            ("upstream_read_idle_secs", "1e400"),
            ("upstream_read_idle_secs", ""),
            ("network_allow", "https://example.org"),
            ("network_block", "*.x.org, a:80"),
            ("network_on_violation", "drop"),
            ("rate_limit_backend", "memcached"),
            ("rate_limit_url", "http://u:pw@redis.example:6379/"),
        ];
        for (key, value) in cases {
            let e = err(None, &[], &[(key, value)]);
            let flag = format!("--{}", key.replace('_', "-"));
            assert_eq!(e.key(), Some(flag.as_str()), "{key}={value}: {e}");
            assert!(e.to_string().contains(&flag), "{e}");
            let var = format!("INTERCEPT_{}", key.to_ascii_uppercase());
            let e = err(None, &[(&var, value)], &[]);
            assert_eq!(e.key(), Some(var.as_str()), "{key}={value}: {e}");
            let toml = format!("{key} = {}\n", toml::Value::String(value.to_string()));
            let e = err(Some(&toml), &[], &[]);
            assert_eq!(e.key(), Some(*key), "{key}={value}: {e}");
        }
    }

    #[test]
    fn settings_that_do_not_fit_together_name_the_key() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("tunnel", "custom")], "tunnel_url"),
            (
                &[("tunnel", "custom"), ("tunnel_url", "https://x.example")],
                "tunnel_port",
            ),
            (
                &[
                    ("tunnel", "custom"),
                    ("tunnel_url", "https://x.example"),
                    ("tunnel_port", "8080"),
                    ("interception", "elastic"),
                ],
                "tunnel",
            ),
            (
                &[
                    ("tunnel", "custom"),
                    ("tunnel_url", "https://x.example"),
                    ("tunnel_port", "8080"),
                    ("interception", "static"),
                    ("static_servers", "2"),
                ],
                "static_servers",
            ),
            (&[("tunnel", "bore")], "bore_server"),
            (&[("tunnel_url", "https://x.example")], "tunnel_url"),
            (&[("tunnel_port", "8080")], "tunnel_port"),
            (&[("tunnel_host", "127.0.0.1")], "tunnel_host"),
            (
                &[("tunnel", "prime"), ("bore_server", "b.example")],
                "bore_server",
            ),
            (&[("bore_port", "7000")], "bore_port"),
            (
                &[("tunnel", "custom"), ("bore_secret_env", "S")],
                "bore_secret_env",
            ),
            (&[("min_servers", "5"), ("max_servers", "4")], "min_servers"),
            (
                &[("tunnel", "bore"), ("frpc_sha256", &"a".repeat(64))],
                "frpc_sha256",
            ),
            (
                &[("tunnel", "prime"), ("rate_limit_backend", "redis")],
                "rate_limit_url",
            ),
            (
                &[("tunnel", "prime"), ("rate_limit_url", "redis://r:6379/")],
                "rate_limit_url",
            ),
            (
                &[
                    ("rate_limit_backend", "redis"),
                    ("rate_limit_url", "redis://r:6379/"),
                ],
                "rate_limit_backend",
            ),
        ];
        for (flags, key) in cases {
            let e = err(None, &[], flags);
            assert!(
                matches!(e, ConfigError::Inconsistent { key: ref k, .. } if k == key),
                "{flags:?}: {e}"
            );
            assert_eq!(e.key(), Some(*key));
            assert!(e.to_string().contains(&format!("`{key}`")), "{e}");
        }
    }

    #[test]
    fn pools_and_tunnels_parse_in_every_layer() {
        let file = "interception = \"static\"\nstatic_servers = 3\ntunnel = \"bore\"\n\
                    bore_server = \"bore.example\"\nbore_port = 9000\n";
        let e = env(&[
            ("INTERCEPT_BORE_SECRET_ENV", "MY_BORE_SECRET"),
            ("INTERCEPT_MAX_SERVERS", "8"),
        ]);
        let flags = [
            ("interception", "elastic".to_string()),
            ("multiplex", "2".to_string()),
            ("min_servers", "0".to_string()),
        ];
        let c = ServeConfig::from_layers(Layers {
            file: Some((Path::new("i.toml"), file)),
            env: &e,
            flags: &flags,
        })
        .unwrap();
        assert_eq!(c.interception, Shape::Elastic);
        assert_eq!(c.static_servers, 3);
        assert_eq!((c.multiplex, c.min_servers, c.max_servers), (2, Some(0), 8));
        assert_eq!(c.tunnel, TunnelSetting::Bore);
        assert_eq!(c.bore_server.as_deref(), Some("bore.example"));
        assert_eq!(c.bore_port, Some(9000));
        assert_eq!(c.bore_secret_env.as_deref(), Some("MY_BORE_SECRET"));

        let tunnel = c.tunnel_config(Some("hush".into())).unwrap();
        let TunnelConfig::Bore(bore) = &tunnel else {
            panic!("{tunnel:?}")
        };
        assert_eq!(bore.server, "bore.example");
        assert_eq!(bore.control_port, 9000);
        assert_eq!(bore.secret.as_deref(), Some("hush"));
        let InterceptionConfig::Elastic(entry) = c.interception_config(tunnel.clone()) else {
            panic!("elastic")
        };
        assert_eq!(entry.pool.multiplex, 2);
        assert_eq!(entry.pool.min_servers, Some(0));
        assert_eq!(entry.pool.max_servers, 8);
        assert_eq!(entry.tunnel, tunnel);

        let c = ServeConfig {
            interception: Shape::Static,
            static_servers: 3,
            ..ServeConfig::default()
        };
        let InterceptionConfig::Static(entry) = c.interception_config(TunnelConfig::None) else {
            panic!("static")
        };
        assert_eq!(entry.servers.len(), 3);

        let flags = [
            ("tunnel", "custom".to_string()),
            ("tunnel_url", "https://rollouts.example.com/".to_string()),
            ("tunnel_port", "8765".to_string()),
            ("tunnel_host", "127.0.0.1".to_string()),
        ];
        let c = ServeConfig::from_layers(Layers {
            file: None,
            env: &[],
            flags: &flags,
        })
        .unwrap();
        let TunnelConfig::Custom(custom) = c.tunnel_config(None).unwrap() else {
            panic!("custom")
        };
        assert_eq!(custom.url, "https://rollouts.example.com");
        assert_eq!(custom.port, 8765);
        assert!(custom.host.is_loopback());
        assert!(matches!(
            c.interception_config(TunnelConfig::None),
            InterceptionConfig::Server(_)
        ));

        let c = ServeConfig {
            tunnel: TunnelSetting::Prime,
            ..ServeConfig::default()
        };
        assert!(matches!(
            c.tunnel_config(None).unwrap(),
            TunnelConfig::Prime(_)
        ));
        assert_eq!(
            ServeConfig::default().tunnel_config(None).unwrap(),
            TunnelConfig::None
        );
        assert_eq!(ServeConfig::default().interception, Shape::Server);
    }

    #[test]
    fn good_values_parse() {
        let flags = [
            ("upstream", "https://api.example.com/v1/".to_string()),
            ("upstream_api_key_env", "MY_KEY".to_string()),
            ("control", "127.0.0.1:7700".to_string()),
            ("control", "[::1]:7700".to_string()),
            ("log", "intercept_server=debug,info".to_string()),
            ("released_retention", "0".to_string()),
            ("released_trace_bytes", "1048576".to_string()),
            ("max_response_bytes", "2097152".to_string()),
            ("max_connections", "0".to_string()),
            ("network_allow", "*.python.org, files.test".to_string()),
            ("network_block", "evil.python.org".to_string()),
            ("network_on_violation", "reject".to_string()),
        ];
        let c = ServeConfig::from_layers(Layers {
            file: None,
            env: &[],
            flags: &flags,
        })
        .unwrap();
        assert_eq!(
            c.upstream,
            Some(UpstreamSetting::Url("https://api.example.com/v1".into()))
        );
        assert_eq!(c.upstream_api_key_env.as_deref(), Some("MY_KEY"));
        assert_eq!(c.control.port(), 7700);
        assert!(c.control.is_ipv6());
        assert_eq!(c.released_retention, 0);
        assert_eq!(c.released_trace_bytes, 1 << 20);
        assert_eq!(c.max_response_bytes, 2 << 20);
        assert_eq!(c.max_connections, None);
        assert!(c.network.is_restricted());
        assert!(c.network.allows_host("docs.python.org"));
        assert!(!c.network.allows_host("evil.python.org"));
        assert_eq!(c.network.on_violation(), OnViolation::Reject);
        assert!(!ServeConfig::default().network.is_restricted());
        let none = ServeConfig::from_layers(Layers {
            file: None,
            env: &[],
            flags: &[("network_allow", String::new())],
        })
        .unwrap();
        assert!(!none.network.allows_host("python.org"));
    }

    #[test]
    fn upstream_idle_timeouts_default_and_turn_off_with_zero() {
        let c = ServeConfig::default();
        assert_eq!(c.upstream_write_idle, Some(Duration::from_secs(30)));
        assert_eq!(c.upstream_read_idle, None);
        let file = "upstream_write_idle_secs = 0\nupstream_read_idle_secs = 600\n";
        let e = env(&[("INTERCEPT_UPSTREAM_READ_IDLE_SECS", "90.5")]);
        let c = ServeConfig::from_layers(Layers {
            file: Some((Path::new("i.toml"), file)),
            env: &e,
            flags: &[],
        })
        .unwrap();
        assert_eq!(c.upstream_write_idle, None);
        assert_eq!(c.upstream_read_idle, Some(Duration::from_millis(90_500)));
        let flags = [("upstream_write_idle_secs", "5".to_string())];
        let c = ServeConfig::from_layers(Layers {
            file: None,
            env: &[],
            flags: &flags,
        })
        .unwrap();
        assert_eq!(c.upstream_write_idle, Some(Duration::from_secs(5)));
    }

    #[test]
    fn pool_timeouts_and_the_frpc_checksum_reach_the_pool_and_the_tunnel() {
        let c = ServeConfig::default();
        assert_eq!(c.wait_timeout, Duration::from_secs(300));
        assert_eq!(c.drain_timeout, Duration::from_secs(120));
        assert_eq!(c.server_idle_timeout, Duration::from_secs(300));
        let sha = "AB".repeat(32);
        let file = "interception = \"elastic\"\ntunnel = \"prime\"\nwait_timeout_secs = 2.5\n";
        let e = env(&[
            ("INTERCEPT_DRAIN_TIMEOUT_SECS", "7"),
            ("INTERCEPT_FRPC_SHA256", &sha),
        ]);
        let flags = [("server_idle_timeout_secs", "9".to_string())];
        let c = ServeConfig::from_layers(Layers {
            file: Some((Path::new("i.toml"), file)),
            env: &e,
            flags: &flags,
        })
        .unwrap();
        match c.interception_config(()) {
            InterceptionConfig::Elastic(e) => {
                assert_eq!(e.pool.wait_timeout, Duration::from_millis(2500));
                assert_eq!(e.pool.drain_timeout, Duration::from_secs(7));
                assert_eq!(e.pool.idle_timeout, Duration::from_secs(9));
                assert_eq!(e.pool.setting_names.wait_timeout, "wait_timeout_secs");
            }
            other => panic!("not elastic: {other:?}"),
        }
        match c.tunnel_config(None).unwrap() {
            TunnelConfig::Prime(p) => {
                let platform = intercept_tunnel::prime::install::platform();
                if let Some(platform) = platform {
                    assert_eq!(p.frpc.sha256.get(platform), Some(&sha.to_ascii_lowercase()));
                }
                assert!(p.frpc.pin_hint.unwrap().contains("frpc_sha256"));
            }
            other => panic!("not prime: {other:?}"),
        }
    }

    #[test]
    fn a_redis_rate_limiter_reaches_prime_and_bore_and_hides_its_password() {
        let url = "redis://fleet:pw@10.0.0.5:6379/2";
        let flags = |tunnel: &str| {
            let mut f = vec![
                ("tunnel", tunnel.to_string()),
                ("rate_limit_backend", "redis".to_string()),
                ("rate_limit_url", url.to_string()),
            ];
            if tunnel == "bore" {
                f.push(("bore_server", "b.example".to_string()));
            }
            ServeConfig::from_layers(Layers {
                file: None,
                env: &[],
                flags: &f,
            })
            .unwrap()
        };
        let c = flags("prime");
        let shown = format!("{c:?}");
        assert!(!shown.contains("pw"), "{shown}");
        match c.tunnel_config(None).unwrap() {
            TunnelConfig::Prime(p) => {
                assert_eq!(p.rate_limit.backend, LimiterBackend::Redis);
                assert_eq!(p.rate_limit.url.as_deref(), Some(url));
                assert_eq!(
                    p.rate_limit.rate, 512,
                    "the rest of the limiter is unchanged"
                );
            }
            other => panic!("not prime: {other:?}"),
        }
        match flags("bore").tunnel_config(None).unwrap() {
            TunnelConfig::Bore(b) => {
                assert!(b.rate_limit.enabled, "bore's limiter is turned on");
                assert_eq!(b.rate_limit.backend, LimiterBackend::Redis);
            }
            other => panic!("not bore: {other:?}"),
        }
        // Without the keys, Prime keeps its host-wide file limiter.
        let plain = ServeConfig::from_layers(Layers {
            file: None,
            env: &[],
            flags: &[("tunnel", "prime".to_string())],
        })
        .unwrap();
        match plain.tunnel_config(None).unwrap() {
            TunnelConfig::Prime(p) => assert_eq!(p.rate_limit.backend, LimiterBackend::File),
            other => panic!("not prime: {other:?}"),
        }
    }
}
