//! Settings of `intercept serve`, layered as config file < environment (`INTERCEPT_*`) <
//! command-line flags.
//!
//! [`ServeConfig`] is the one description of the settings: a `serde` struct whose field
//! names (or `rename`s) are the keys, whose `deserialize_with` functions hold each key's
//! validation (`values.rs`, with the value types), and whose [`Default`] holds the
//! defaults. [`SETTINGS`] (`settings.rs`) is its documentation, one row per key in the same
//! order: it gives the flags of `intercept serve` ([`crate::cli::ServeArgs`]) and the table
//! of `docs/configuration.md` ([`settings_table`], written by `cargo xtask config-docs` and
//! checked by the test `config_docs`). [figment] merges the layers (here); every value goes
//! through the same deserializer, so a bad value is reported the same way wherever it came
//! from, naming the key and its source. [`ServeConfig::check`] (`check.rs`) then checks
//! that the settings fit together, and `convert.rs` turns them into the tunnel, pool and
//! network configurations:
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

mod check;
mod convert;
mod settings;
#[cfg(test)]
mod tests;
mod values;

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use intercept_core::{OnViolation, Secret, TokensConfig};
use intercept_trace::TraceFormat;
use intercept_tunnel::LimiterBackend;
use serde::Deserialize;

pub use settings::{keys, settings_table, Setting, SETTINGS};
pub(crate) use values::{check_tokens_patch, merge_tokens, TOKENS_FIELDS};
pub use values::{LogFormat, RedisUrl, Shape, TunnelSetting, UpstreamSetting, BORE_DEFAULT_PORT};

/// The prefix of the environment variables that configure the sidecar.
pub const ENV_PREFIX: &str = "INTERCEPT_";

/// The environment variable that names a config file (like `--config`).
pub const CONFIG_ENV: &str = "INTERCEPT_CONFIG";

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

/// The resolved settings of `intercept serve`. [`Default`] gives the documented defaults;
/// [`ServeConfig::from_layers`] reads them from a file, the environment and flags. Each
/// field is a key of [`SETTINGS`] (the `_secs` keys are held as [`Duration`]s).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    /// Default upstream of sessions that name none (`None`: each session must name one).
    #[serde(deserialize_with = "values::upstream")]
    pub upstream: Option<UpstreamSetting>,
    /// The environment variable holding the default upstream's API key.
    #[serde(deserialize_with = "values::key_env")]
    pub upstream_api_key_env: Option<String>,
    /// The environment variables a session may name as `upstream.api_key_env` in
    /// `POST /v1/sessions` (`None`: only [`ServeConfig::upstream_api_key_env`]). Any other
    /// is refused, so the control token cannot send the sidecar's other variables
    /// upstream.
    #[serde(deserialize_with = "values::env_names")]
    pub allowed_key_envs: Option<Vec<String>>,
    /// Default model of sessions that name none (with the mock: `mock-model`).
    #[serde(deserialize_with = "values::model")]
    pub model: Option<String>,
    /// Default token-in/token-out of sessions (`None`: off unless a session turns it on);
    /// a session's `tokens` object is merged over its keys.
    #[serde(deserialize_with = "values::tokens")]
    pub tokens: Option<TokensConfig>,
    /// Where the control API listens (loopback only; default `127.0.0.1:0`).
    #[serde(deserialize_with = "values::control")]
    pub control: SocketAddr,
    /// The control API token (generated when `None`).
    #[serde(deserialize_with = "values::token")]
    pub control_token: Option<Secret>,
    /// The interception shape (default [`Shape::Server`]).
    #[serde(deserialize_with = "values::shape")]
    pub interception: Shape,
    /// Sessions per server of an elastic pool (default 32; validated, unused by the
    /// other shapes).
    #[serde(deserialize_with = "values::positive")]
    pub multiplex: usize,
    /// Servers an elastic pool keeps up (`None`: 1 with a tunnel, else 0).
    #[serde(deserialize_with = "values::some_count")]
    pub min_servers: Option<usize>,
    /// Cap on an elastic pool's servers (default 256).
    #[serde(deserialize_with = "values::positive")]
    pub max_servers: usize,
    /// Elastic: how long session creation waits for a seat before it fails with 503
    /// (default 300 s).
    #[serde(
        rename = "wait_timeout_secs",
        deserialize_with = "values::positive_secs"
    )]
    pub wait_timeout: Duration,
    /// Elastic: how long an unhealthy server's sessions may finish before it is torn
    /// down anyway (default 120 s).
    #[serde(
        rename = "drain_timeout_secs",
        deserialize_with = "values::positive_secs"
    )]
    pub drain_timeout: Duration,
    /// Elastic: servers empty this long beyond `min_servers` are stopped (default 300 s).
    #[serde(
        rename = "server_idle_timeout_secs",
        deserialize_with = "values::positive_secs"
    )]
    pub server_idle_timeout: Duration,
    /// Servers of a static pool (default 1).
    #[serde(deserialize_with = "values::positive")]
    pub static_servers: usize,
    /// The tunnel (default [`TunnelSetting::None`]).
    #[serde(deserialize_with = "values::tunnel")]
    pub tunnel: TunnelSetting,
    /// `custom`: the public URL that reaches the server.
    #[serde(deserialize_with = "values::tunnel_url")]
    pub tunnel_url: Option<String>,
    /// `custom`: the local port the URL forwards to (the server listens there).
    #[serde(deserialize_with = "values::port")]
    pub tunnel_port: Option<u16>,
    /// `custom`: the address the server binds (default `0.0.0.0`).
    #[serde(deserialize_with = "values::ip")]
    pub tunnel_host: Option<IpAddr>,
    /// `bore`: the host running `bore server`.
    #[serde(deserialize_with = "values::host")]
    pub bore_server: Option<String>,
    /// `bore`: its control port (default 7835).
    #[serde(deserialize_with = "values::port")]
    pub bore_port: Option<u16>,
    /// `bore`: the environment variable holding the bore server's secret, if it has one.
    #[serde(deserialize_with = "values::secret_env")]
    pub bore_secret_env: Option<String>,
    /// `prime`: the pinned SHA-256 (hex) of the frp release tarball for this platform,
    /// which allows frpc to be downloaded when it is not installed.
    #[serde(deserialize_with = "values::sha256")]
    pub frpc_sha256: Option<String>,
    /// `prime` and `bore`: where the tunnel start rate limiter keeps its window: a
    /// host-wide file (the default) or a Redis server shared by a fleet of hosts.
    #[serde(deserialize_with = "values::limiter")]
    pub rate_limit_backend: LimiterBackend,
    /// The Redis server of `rate_limit_backend = redis`.
    #[serde(deserialize_with = "values::redis_url")]
    pub rate_limit_url: Option<RedisUrl>,
    /// Directory of the JSONL trace files (`<dir>/<session id>.jsonl`).
    #[serde(deserialize_with = "values::dir")]
    pub trace_dir: Option<PathBuf>,
    /// What the trace files hold: the log (default) or full records.
    #[serde(deserialize_with = "values::trace_format")]
    pub trace_format: TraceFormat,
    /// Log filter (`RUST_LOG` syntax); `None` uses `RUST_LOG`, else `info`.
    #[serde(deserialize_with = "values::log")]
    pub log: Option<String>,
    /// Log format.
    #[serde(deserialize_with = "values::log_format")]
    pub log_format: LogFormat,
    /// On shutdown, in-flight calls may finish for this long before they are cancelled.
    #[serde(rename = "shutdown_grace_secs", deserialize_with = "values::secs")]
    pub shutdown_grace: Duration,
    /// Default network policy: the hosts the model provider may reach (`*`, `*.domain`,
    /// hosts; default `*`).
    #[serde(deserialize_with = "values::allow")]
    pub network_allow: Vec<String>,
    /// Default network policy: the hosts never allowed (default none).
    #[serde(deserialize_with = "values::block")]
    pub network_block: Vec<String>,
    /// Default network policy: what a forbidden capability gets (default strip).
    #[serde(deserialize_with = "values::on_violation")]
    pub network_on_violation: OnViolation,
    /// A request head (harness ports and control API) must be complete this long after
    /// the connection opened or its previous answer, else the connection is closed;
    /// `None` (`0` in the settings): no limit.
    #[serde(
        rename = "header_read_timeout_secs",
        deserialize_with = "values::header_timeout"
    )]
    pub header_read_timeout: Option<Duration>,
    /// Released sessions the control API remembers (their status, trace and episode
    /// stay readable); not the server's `released_secrets`.
    #[serde(deserialize_with = "values::count")]
    pub released_retention: usize,
    /// Bytes of released traces (and their episodes) held in memory when there is no
    /// trace directory; the oldest are dropped first (their ids stay remembered).
    #[serde(deserialize_with = "values::bytes")]
    pub released_trace_bytes: usize,
    /// With a trace directory: most bytes of lines queued for the trace writer (see
    /// [`intercept_trace::WriterConfig::max_queued_bytes`]).
    #[serde(deserialize_with = "values::positive_bytes")]
    pub trace_queue_bytes: u64,
    /// With a trace directory: longest wait of a line before the writer writes it.
    #[serde(rename = "trace_flush_secs", deserialize_with = "values::secs")]
    pub trace_flush: Duration,
    /// Connections served at once by each harness port and by the control API (default
    /// 16,384; `None`, `0` in the settings: no cap).
    #[serde(deserialize_with = "values::connections")]
    pub max_connections: Option<usize>,
    /// Event loops of each server (`ServerConfig::workers`; default 0: one per core the
    /// process may use).
    #[serde(deserialize_with = "values::count")]
    pub workers: usize,
    /// Largest upstream answer read for one call (default 256 MiB); past it the call
    /// fails with 502 and its record is marked `truncated`.
    #[serde(deserialize_with = "values::positive_bytes")]
    pub max_response_bytes: u64,
    /// A plain-HTTP upstream that takes no byte of a request for this long fails the
    /// call (default 30 s; `None`: no limit).
    #[serde(rename = "upstream_write_idle_secs", deserialize_with = "values::idle")]
    pub upstream_write_idle: Option<Duration>,
    /// A plain-HTTP upstream that sends nothing for this long once it has the request
    /// fails the call (default `None`: no limit).
    #[serde(rename = "upstream_read_idle_secs", deserialize_with = "values::idle")]
    pub upstream_read_idle: Option<Duration>,
    /// What a stream carries while its upstream is silent (default `event`).
    #[serde(deserialize_with = "values::stream_heartbeat")]
    pub stream_heartbeat: intercept_server::StreamHeartbeat,
    /// Bound on `GET /v1/models`' upstream listing (default 30 s).
    #[serde(
        rename = "models_timeout_secs",
        deserialize_with = "values::positive_secs"
    )]
    pub models_timeout: Duration,
    /// Non-fatal findings of [`ServeConfig::from_layers`] (unknown `INTERCEPT_*`
    /// environment variables), for the binary to log once logging is up.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            upstream: None,
            upstream_api_key_env: None,
            allowed_key_envs: None,
            model: None,
            tokens: None,
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
            trace_format: TraceFormat::Log,
            log: None,
            log_format: LogFormat::Text,
            shutdown_grace: Duration::from_secs(30),
            network_allow: vec!["*".to_owned()],
            network_block: Vec::new(),
            network_on_violation: OnViolation::Strip,
            header_read_timeout: Some(Duration::from_secs(30)),
            released_retention: 4096,
            released_trace_bytes: 256 << 20,
            trace_queue_bytes: 64 << 20,
            trace_flush: Duration::from_millis(10),
            max_connections: Some(intercept_server::DEFAULT_MAX_CONNECTIONS),
            workers: 0,
            max_response_bytes: 256 << 20,
            upstream_write_idle: Some(Duration::from_secs(30)),
            upstream_read_idle: None,
            stream_heartbeat: intercept_server::StreamHeartbeat::Event,
            models_timeout: Duration::from_secs(30),
            warnings: Vec::new(),
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

/// One layer of settings for figment: its values, named by where they came from.
struct Layer {
    source: Source,
    values: Dict,
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.source.to_string())
    }

    fn data(&self) -> Result<Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.values.clone()))
    }
}

impl Layer {
    fn strings<'a>(source: Source, pairs: impl Iterator<Item = (&'a str, &'a str)>) -> Self {
        let values = pairs
            .map(|(k, v)| (k.to_owned(), Value::from(v.to_owned())))
            .collect();
        Layer { source, values }
    }

    /// The error figment found in the values of `layers`, naming the key as its source
    /// spells it.
    fn error(e: figment::Error, layers: &[Layer]) -> ConfigError {
        let name = e.metadata.as_ref().map(|m| m.name.as_ref());
        let source = layers
            .iter()
            .find(|l| Some(l.source.to_string().as_str()) == name)
            .or(layers.last())
            .map_or(Source::Flag, |l| l.source.clone());
        match e.kind {
            figment::error::Kind::UnknownField(key, _) => unknown(&source.spell(&key), &source),
            kind => ConfigError::BadValue {
                key: source.spell(e.path.last().map_or("", String::as_str)),
                origin: source,
                message: match kind {
                    figment::error::Kind::Message(m) => m,
                    other => other.to_string(),
                },
            },
        }
    }
}

impl ServeConfig {
    /// Builds the settings from the layers, lowest first: file, environment, flags.
    ///
    /// Every value is checked in its own layer first, so a bad one fails the start even
    /// when a higher layer overrides it.
    pub fn from_layers(layers: Layers<'_>) -> Result<Self, ConfigError> {
        let mut parts = Vec::with_capacity(3);
        if let Some((path, text)) = layers.file {
            let table: toml::Table = text.parse().map_err(|e| ConfigError::File {
                path: path.to_owned(),
                message: format!("not valid TOML: {e}"),
            })?;
            let values = match Value::serialize(&table) {
                Ok(Value::Dict(_, values)) => values,
                _ => {
                    return Err(ConfigError::File {
                        path: path.to_owned(),
                        message: "not a table of settings".into(),
                    })
                }
            };
            parts.push(Layer {
                source: Source::File(path.to_owned()),
                values,
            });
        }
        let mut warnings = Vec::new();
        let env = layers.env.iter().filter_map(|(name, value)| {
            let rest = name.strip_prefix(ENV_PREFIX)?;
            if name == CONFIG_ENV {
                return None;
            }
            let key = rest.to_ascii_lowercase();
            match SETTINGS.iter().find(|s| s.key == key) {
                Some(s) if rest == rest.to_ascii_uppercase() => Some((s.key, value.as_str())),
                _ => {
                    // Scripts export variables of their own with this prefix
                    // (`INTERCEPT_BIN`): a warning, not an error (an unknown key in a file
                    // or a flag is one).
                    warnings.push(format!(
                        "ignoring the environment variable {name}: not a setting (did you \
                         mean {}?)",
                        closest_key(&key, &Source::Env)
                    ));
                    None
                }
            }
        });
        parts.push(Layer::strings(Source::Env, env));
        let flags = layers.flags.iter().map(|(k, v)| (*k, v.as_str()));
        parts.push(Layer::strings(Source::Flag, flags));

        let mut figment = Figment::new();
        for part in &parts {
            Figment::from(part)
                .extract::<ServeConfig>()
                .map_err(|e| Layer::error(e, std::slice::from_ref(part)))?;
            figment = figment.merge(part);
        }
        let mut config: ServeConfig = figment.extract().map_err(|e| Layer::error(e, &parts))?;
        config.warnings = warnings;
        config.check()?;
        Ok(config)
    }
}

/// The known key closest to `key` (edit distance), spelled for `source`.
fn closest_key(key: &str, source: &Source) -> String {
    let best = keys()
        .min_by_key(|k| strsim::levenshtein(k, key))
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
        known: keys()
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
