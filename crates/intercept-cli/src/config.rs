//! Settings of `intercept serve`, layered as config file < environment (`INTERCEPT_*`) <
//! command-line flags.
//!
//! [`ServeConfig`] is the one description of the settings: a `serde` struct whose field
//! names (or `rename`s) are the keys, whose `deserialize_with` functions hold each key's
//! validation, and whose [`Default`] holds the defaults. [`SETTINGS`] is its documentation,
//! one row per key in the same order: it gives the flags of `intercept serve`
//! ([`crate::cli::ServeArgs`]) and the table of `docs/configuration.md`
//! ([`settings_table`], written by `cargo xtask config-docs` and checked by `cargo xtask
//! tidy`). [figment] merges the layers; every value goes through the same deserializer, so
//! a bad value is reported the same way wherever it came from, naming the key and its
//! source:
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

use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use intercept_core::{NetworkPolicy, OnViolation, Secret};
use intercept_pool::{
    ElasticConfig, ElasticEntry, InterceptionConfig, ServerEntry, SettingNames, StaticEntry,
};
use intercept_trace::TraceFormat;
use intercept_tunnel::{redact_url, LimiterBackend, TunnelConfig};
use serde::Deserialize;

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

/// The documentation of one setting of `intercept serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The key as written in the config file; the environment variable is `INTERCEPT_` +
    /// the key in upper case, the flag `--` + the key with `-` for `_`.
    pub key: &'static str,
    /// What the flag takes, as its help shows it (`N`, `SECS`, `none|custom|prime|bore`).
    pub value: &'static str,
    /// The default (Markdown).
    pub default: &'static str,
    /// What it does (Markdown).
    pub doc: &'static str,
}

impl Setting {
    /// The setting's environment variable (`INTERCEPT_MULTIPLEX`).
    pub fn env(&self) -> String {
        Source::Env.spell(self.key)
    }

    /// The first sentence of [`Setting::doc`] (up to a `. ` before a capital letter).
    pub fn summary(&self) -> &'static str {
        let ends = self.doc.match_indices(". ").find(|(i, _)| {
            self.doc[i + 2..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_uppercase())
        });
        ends.map_or(self.doc, |(i, _)| &self.doc[..=i])
    }

    /// The setting's flag without its dashes (`max-servers`).
    pub fn flag(&self) -> String {
        self.key.replace('_', "-")
    }
}

/// Every setting of `intercept serve`, in the order of [`ServeConfig`]'s fields and of the
/// table in `docs/configuration.md`.
pub const SETTINGS: &[Setting] = &[
    Setting {
        key: "upstream",
        value: "URL|mock",
        default: "none",
        doc: "Default upstream of sessions that name none: an OpenAI-compatible base URL \
            with its version segment (`http://127.0.0.1:8000/v1`), or `mock` for the \
            embedded mock model. Without it every `POST /v1/sessions` must carry \
            `upstream`.",
    },
    Setting {
        key: "upstream_api_key_env",
        value: "VAR",
        default: "none",
        doc: "*Name* of the environment variable holding the default upstream's API key (the \
            key is never taken from the command line). Start fails if the variable is \
            unset.",
    },
    Setting {
        key: "allowed_key_envs",
        value: "VAR,...",
        default: "the `upstream_api_key_env` variable (none without it)",
        doc: "Comma-separated names of the environment variables a session may name as \
            `upstream.api_key_env` in `POST /v1/sessions`; any other is refused with 400.",
    },
    Setting {
        key: "model",
        value: "NAME",
        default: "none (`mock-model` with `upstream = \"mock\"`)",
        doc: "Default model of sessions that name none. Without it every session must carry \
            `model`.",
    },
    Setting {
        key: "control",
        value: "ADDR",
        default: "`127.0.0.1:0`",
        doc: "Control API address. Loopback only (`127.0.0.1`, `[::1]`); port 0 picks a free \
            port, reported on the ready line.",
    },
    Setting {
        key: "control_token",
        value: "TOKEN",
        default: "generated (128 random bits)",
        doc: "Bearer token of the control API. Also `INTERCEPT_CONTROL_TOKEN`. Printed once, \
            on the ready line; never logged.",
    },
    Setting {
        key: "interception",
        value: "server|static|elastic",
        default: "`server`",
        doc: "Interception shape: `server` (one interception server), `static` \
            (`static_servers` identical servers, all started up front, least-loaded first) \
            or `elastic` (servers of `multiplex` sessions each, started on demand, healed \
            when their tunnel dies, shrunk when idle; see [pools.md](pools.md)). The \
            sidecar defaults to `server` (unlike the library's `InterceptionConfig`, which \
            defaults to `elastic`): without a tunnel one server multiplexes any number of \
            sessions and there is nothing to scale. With a tunnel, choose `elastic`.",
    },
    Setting {
        key: "multiplex",
        value: "N",
        default: "32",
        doc: "Sessions per server (and so per tunnel) of an elastic pool; at least 1. \
            Validated but unused by `server` and `static`.",
    },
    Setting {
        key: "min_servers",
        value: "N",
        default: "1 with a tunnel, else 0",
        doc: "Elastic: servers warmed at start, regrown after a retirement, never shrunk \
            below. At most `max_servers`.",
    },
    Setting {
        key: "max_servers",
        value: "N",
        default: "256",
        doc: "Elastic: cap on servers; beyond it session creation waits up to \
            `wait_timeout_secs` (300 s) for a free seat, then fails (503) naming the cap.",
    },
    Setting {
        key: "wait_timeout_secs",
        value: "SECS",
        default: "300",
        doc: "Elastic: seconds session creation waits for a seat (all servers full at \
            `max_servers`, or servers still starting) before it fails with 503, naming \
            this key. Greater than 0.",
    },
    Setting {
        key: "drain_timeout_secs",
        value: "SECS",
        default: "120",
        doc: "Elastic: seconds the sessions of a server whose tunnel could not be repaired \
            may finish before the server is torn down anyway. Greater than 0.",
    },
    Setting {
        key: "server_idle_timeout_secs",
        value: "SECS",
        default: "300",
        doc: "Elastic: seconds a server must be empty before idle shrink may stop it (never \
            below `min_servers`); the pool's `idle_timeout`. Greater than 0.",
    },
    Setting {
        key: "static_servers",
        value: "N",
        default: "1",
        doc: "Static: how many identical servers (each with its own tunnel of the configured \
            kind).",
    },
    Setting {
        key: "tunnel",
        value: "none|custom|prime|bore",
        default: "`none`",
        doc: "How servers are exposed: `none` (loopback; every harness on this host), \
            `custom` (your own URL), `prime` (Prime Intellect's tunnel service) or `bore` \
            (a self-hosted bore server). Any value but `none` means a tunnel is \
            *required*: each server (each elastic server, each static server) gets one.",
    },
    Setting {
        key: "tunnel_url",
        value: "URL",
        default: "none; required with `custom`",
        doc: "Custom: the public `http(s)` URL that forwards to `tunnel_port`.",
    },
    Setting {
        key: "tunnel_port",
        value: "PORT",
        default: "none; required with `custom`",
        doc: "Custom: the local port the URL forwards to; the server listens there.",
    },
    Setting {
        key: "tunnel_host",
        value: "IP",
        default: "`0.0.0.0`",
        doc: "Custom: the address the server binds.",
    },
    Setting {
        key: "bore_server",
        value: "HOST",
        default: "none; required with `bore`",
        doc: "Bore: host name or IP of the `bore server` (no scheme, no port).",
    },
    Setting {
        key: "bore_port",
        value: "PORT",
        default: "7835",
        doc: "Bore: the bore server's control port.",
    },
    Setting {
        key: "bore_secret_env",
        value: "VAR",
        default: "none",
        doc: "Bore: *name* of the environment variable holding the bore server's secret \
            (never taken from a flag). Start fails if the variable is unset.",
    },
    Setting {
        key: "frpc_sha256",
        value: "HEX",
        default: "none",
        doc: "Prime: the SHA-256 (64 hex digits) of the frp release tarball for this \
            platform. Without it, frpc must be installed (`FRPC_PATH` or \
            `~/.prime/bin/frpc`): an unpinned download is never made. Refused with any \
            other tunnel.",
    },
    Setting {
        key: "rate_limit_backend",
        value: "file|redis",
        default: "`file`",
        doc: "Prime and bore: where the tunnel start rate limiter keeps its window: `file` \
            (every process of this host, under a file lock) or `redis` (a fleet of hosts \
            sharing `rate_limit_url`; see [tunnels.md](tunnels.md#a-fleet-of-hosts)). With \
            bore, `redis` also turns the limiter on. When Redis cannot be reached or does \
            not answer within 5 s the start fails closed: 503, counted in \
            `intercept_tunnel_limiter_unavailable_total`.",
    },
    Setting {
        key: "rate_limit_url",
        value: "URL",
        default: "none; required with `redis`",
        doc: "The Redis server of `rate_limit_backend = redis`: \
            `redis://[user:password@]host[:port][/db]`. The password is hidden in logs; \
            `INTERCEPT_RATE_LIMIT_URL` keeps it off the command line.",
    },
    Setting {
        key: "trace_dir",
        value: "DIR",
        default: "none",
        doc: "When set, each session's trace is appended to `<dir>/<session id>.jsonl` as \
            its calls end (the folder is created if missing), in `trace_format`.",
    },
    Setting {
        key: "trace_format",
        value: "log|full",
        default: "`log`",
        doc: "With `trace_dir`: `log`, the trace log of [traces.md](traces.md) (each \
            message, value and token written once; the episode is in it), or `full`, the \
            format of earlier versions for readers that cannot change yet (one whole record \
            per line, each repeating the conversation so far, and the episode in \
            `<dir>/<session id>.episode.json` at release).",
    },
    Setting {
        key: "log",
        value: "FILTER",
        default: "`$RUST_LOG`, else `info`",
        doc: "Log filter in `RUST_LOG` syntax, e.g. `intercept_server=debug,info`. Logs go \
            to stderr.",
    },
    Setting {
        key: "log_format",
        value: "text|json",
        default: "`text`",
        doc: "`text` or `json` (one JSON object per line).",
    },
    Setting {
        key: "shutdown_grace_secs",
        value: "SECS",
        default: "30",
        doc: "On SIGINT/SIGTERM, in-flight calls may finish for this long; the rest are \
            cancelled (and recorded as cancelled).",
    },
    Setting {
        key: "network_allow",
        value: "PATTERNS",
        default: "`*`",
        doc: "Network policy of sessions created without a `network` field: comma-separated \
            host patterns the provider may reach (`*`, `*.domain`, hosts); empty means \
            none.",
    },
    Setting {
        key: "network_block",
        value: "PATTERNS",
        default: "none",
        doc: "Comma-separated host patterns never allowed (default policy).",
    },
    Setting {
        key: "network_on_violation",
        value: "strip|reject",
        default: "`strip`",
        doc: "`strip` or `reject` (default policy).",
    },
    Setting {
        key: "header_read_timeout_secs",
        value: "SECS",
        default: "30",
        doc: "A client of the harness ports or the control API must send a whole request \
            head within this many seconds of opening the connection (or of the previous \
            answer), else the connection is closed. This is also the idle timeout of \
            kept-alive connections (HTTP/1 and HTTP/2); it never cuts a request in \
            progress or an answer being sent. `0`: no limit.",
    },
    Setting {
        key: "released_retention",
        value: "N",
        default: "4096",
        doc: "Released sessions the control API remembers (a count of sessions): their \
            status, trace and episode stay readable and their ids stay taken (creating one \
            again answers 409); the oldest are forgotten first (their JSONL files stay). \
            Late calls of a released session's harness get 409 from the servers, which \
            remember released secrets on their own (`ServerConfig::released_secrets`).",
    },
    Setting {
        key: "released_trace_bytes",
        value: "BYTES",
        default: "268435456 (256 MiB)",
        doc: "Without `trace_dir`: bytes of released traces (with their episodes) held in \
            memory so `GET /v1/sessions/{id}/trace` and `/episode` still answer; the \
            oldest are dropped first (their ids stay remembered; reading them answers \
            410), the newest always stays. With `trace_dir` nothing is held: released \
            traces are read back from their files.",
    },
    Setting {
        key: "trace_queue_bytes",
        value: "BYTES",
        default: "67108864 (64 MiB)",
        doc: "With `trace_dir`: most bytes of trace lines handed to the trace writer and not \
            yet written. A call whose line does not fit waits in its record step until the \
            writer made room (a slow or stopped disk slows the calls instead of growing \
            memory). Also the most a crash of the process can lose (see \
            [sidecar.md](sidecar.md#trace-files)).",
    },
    Setting {
        key: "trace_flush_secs",
        value: "SECS",
        default: "0.01",
        doc: "With `trace_dir`: longest time a trace line waits before the writer writes it \
            (lines of every session that arrive meanwhile go in the same batch, one \
            `writev` per file). A crash loses the lines of calls recorded in the last \
            interval. A release, shutdown and reading a live trace write the queue first.",
    },
    Setting {
        key: "max_connections",
        value: "N",
        default: "16384",
        doc: "`max_connections` of the servers, and the same cap for the control API: \
            connections served at once; one beyond it is answered 503 with `Retry-After: \
            1` and closed. `0`: no cap. With the open-file limit raised at start (see \
            [sidecar.md](sidecar.md#lifecycle)) the cap, not the descriptors, is what a \
            flood of connections meets first.",
    },
    Setting {
        key: "max_response_bytes",
        value: "BYTES",
        default: "268435456 (256 MiB)",
        doc: "`max_response_bytes` of the servers: the largest upstream answer read for one \
            call (a JSON body, declared or received, or all the bytes of a stream). Past \
            it the call fails with 502 (`upstream_malformed`, naming the limit and the \
            bytes received), the upstream connection is closed, and the record is marked \
            `truncated`; a stream already under way ends with the dialect's error event.",
    },
    Setting {
        key: "upstream_write_idle_secs",
        value: "SECS",
        default: "30",
        doc: "`upstream_write_idle` of the servers: seconds a plain-HTTP upstream may take \
            no byte of a request before the call fails (504). `0` turns it off.",
    },
    Setting {
        key: "upstream_read_idle_secs",
        value: "SECS",
        default: "0 (off)",
        doc: "`upstream_read_idle` of the servers: seconds a plain-HTTP upstream may send \
            nothing, once it has the request, before the call fails. `0` turns it off.",
    },
    Setting {
        key: "stream_heartbeat",
        value: "event|comment|off",
        default: "`event`",
        doc: "`stream_heartbeat` of the servers: what a stream carries every 3 s while its \
            upstream is silent. `event`: a dialect-valid event where the dialect's SDKs \
            accept one (Chat an empty `delta.content` chunk, Responses \
            `response.in_progress`, Anthropic a no-op `message_delta`), else a `: \
            keepalive` comment; `comment`: always the comment; `off`: nothing. Heartbeats \
            never reach the record (see [dialects.md](dialects.md#streams)).",
    },
    Setting {
        key: "models_timeout_secs",
        value: "SECS",
        default: "30",
        doc: "`models_timeout` of the servers: seconds `GET /v1/models` waits for the \
            session's upstream listing before it lists the session's model alone. Greater \
            than 0.",
    },
];

/// The keys of every setting, in [`SETTINGS`] order.
pub fn keys() -> impl Iterator<Item = &'static str> {
    SETTINGS.iter().map(|s| s.key)
}

/// The Markdown table of [`SETTINGS`] (`| key | default | what it does |`), as
/// `docs/configuration.md` holds it.
pub fn settings_table() -> String {
    let mut out =
        String::from("| key | default | what it does |\n|-----|---------|--------------|\n");
    for s in SETTINGS {
        out.push_str(&format!("| `{}` | {} | {} |\n", s.key, s.default, s.doc));
    }
    out
}

/// A Redis URL (`redis://[user:password@]host[:port][/db]`), its password hidden when
/// shown with `{:?}`.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// The URL, password included.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

/// The resolved settings of `intercept serve`. [`Default`] gives the documented defaults;
/// [`ServeConfig::from_layers`] reads them from a file, the environment and flags. Each
/// field is a key of [`SETTINGS`] (the `_secs` keys are held as [`Duration`]s).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    /// Default upstream of sessions that name none (`None`: each session must name one).
    #[serde(deserialize_with = "value::upstream")]
    pub upstream: Option<UpstreamSetting>,
    /// The environment variable holding the default upstream's API key.
    #[serde(deserialize_with = "value::key_env")]
    pub upstream_api_key_env: Option<String>,
    /// The environment variables a session may name as `upstream.api_key_env` in
    /// `POST /v1/sessions` (`None`: only [`ServeConfig::upstream_api_key_env`]). Any other
    /// is refused, so the control token cannot send the sidecar's other variables
    /// upstream.
    #[serde(deserialize_with = "value::env_names")]
    pub allowed_key_envs: Option<Vec<String>>,
    /// Default model of sessions that name none (with the mock: `mock-model`).
    #[serde(deserialize_with = "value::model")]
    pub model: Option<String>,
    /// Where the control API listens (loopback only; default `127.0.0.1:0`).
    #[serde(deserialize_with = "value::control")]
    pub control: SocketAddr,
    /// The control API token (generated when `None`).
    #[serde(deserialize_with = "value::token")]
    pub control_token: Option<Secret>,
    /// The interception shape (default [`Shape::Server`]).
    #[serde(deserialize_with = "value::shape")]
    pub interception: Shape,
    /// Sessions per server of an elastic pool (default 32; validated, unused by the
    /// other shapes).
    #[serde(deserialize_with = "value::positive")]
    pub multiplex: usize,
    /// Servers an elastic pool keeps up (`None`: 1 with a tunnel, else 0).
    #[serde(deserialize_with = "value::some_count")]
    pub min_servers: Option<usize>,
    /// Cap on an elastic pool's servers (default 256).
    #[serde(deserialize_with = "value::positive")]
    pub max_servers: usize,
    /// Elastic: how long session creation waits for a seat before it fails with 503
    /// (default 300 s).
    #[serde(
        rename = "wait_timeout_secs",
        deserialize_with = "value::positive_secs"
    )]
    pub wait_timeout: Duration,
    /// Elastic: how long an unhealthy server's sessions may finish before it is torn
    /// down anyway (default 120 s).
    #[serde(
        rename = "drain_timeout_secs",
        deserialize_with = "value::positive_secs"
    )]
    pub drain_timeout: Duration,
    /// Elastic: servers empty this long beyond `min_servers` are stopped (default 300 s).
    #[serde(
        rename = "server_idle_timeout_secs",
        deserialize_with = "value::positive_secs"
    )]
    pub server_idle_timeout: Duration,
    /// Servers of a static pool (default 1).
    #[serde(deserialize_with = "value::positive")]
    pub static_servers: usize,
    /// The tunnel (default [`TunnelSetting::None`]).
    #[serde(deserialize_with = "value::tunnel")]
    pub tunnel: TunnelSetting,
    /// `custom`: the public URL that reaches the server.
    #[serde(deserialize_with = "value::tunnel_url")]
    pub tunnel_url: Option<String>,
    /// `custom`: the local port the URL forwards to (the server listens there).
    #[serde(deserialize_with = "value::port")]
    pub tunnel_port: Option<u16>,
    /// `custom`: the address the server binds (default `0.0.0.0`).
    #[serde(deserialize_with = "value::ip")]
    pub tunnel_host: Option<IpAddr>,
    /// `bore`: the host running `bore server`.
    #[serde(deserialize_with = "value::host")]
    pub bore_server: Option<String>,
    /// `bore`: its control port (default 7835).
    #[serde(deserialize_with = "value::port")]
    pub bore_port: Option<u16>,
    /// `bore`: the environment variable holding the bore server's secret, if it has one.
    #[serde(deserialize_with = "value::secret_env")]
    pub bore_secret_env: Option<String>,
    /// `prime`: the pinned SHA-256 (hex) of the frp release tarball for this platform,
    /// which allows frpc to be downloaded when it is not installed.
    #[serde(deserialize_with = "value::sha256")]
    pub frpc_sha256: Option<String>,
    /// `prime` and `bore`: where the tunnel start rate limiter keeps its window: a
    /// host-wide file (the default) or a Redis server shared by a fleet of hosts.
    #[serde(deserialize_with = "value::limiter")]
    pub rate_limit_backend: LimiterBackend,
    /// The Redis server of `rate_limit_backend = redis`.
    #[serde(deserialize_with = "value::redis_url")]
    pub rate_limit_url: Option<RedisUrl>,
    /// Directory of the JSONL trace files (`<dir>/<session id>.jsonl`).
    #[serde(deserialize_with = "value::dir")]
    pub trace_dir: Option<PathBuf>,
    /// What the trace files hold: the log (default) or full records.
    #[serde(deserialize_with = "value::trace_format")]
    pub trace_format: TraceFormat,
    /// Log filter (`RUST_LOG` syntax); `None` uses `RUST_LOG`, else `info`.
    #[serde(deserialize_with = "value::log")]
    pub log: Option<String>,
    /// Log format.
    #[serde(deserialize_with = "value::log_format")]
    pub log_format: LogFormat,
    /// On shutdown, in-flight calls may finish for this long before they are cancelled.
    #[serde(rename = "shutdown_grace_secs", deserialize_with = "value::secs")]
    pub shutdown_grace: Duration,
    /// Default network policy: the hosts the model provider may reach (`*`, `*.domain`,
    /// hosts; default `*`).
    #[serde(deserialize_with = "value::allow")]
    pub network_allow: Vec<String>,
    /// Default network policy: the hosts never allowed (default none).
    #[serde(deserialize_with = "value::block")]
    pub network_block: Vec<String>,
    /// Default network policy: what a forbidden capability gets (default strip).
    #[serde(deserialize_with = "value::on_violation")]
    pub network_on_violation: OnViolation,
    /// A request head (harness ports and control API) must be complete this long after
    /// the connection opened or its previous answer, else the connection is closed;
    /// `None` (`0` in the settings): no limit.
    #[serde(
        rename = "header_read_timeout_secs",
        deserialize_with = "value::header_timeout"
    )]
    pub header_read_timeout: Option<Duration>,
    /// Released sessions the control API remembers (their status, trace and episode
    /// stay readable); not the server's `released_secrets`.
    #[serde(deserialize_with = "value::count")]
    pub released_retention: usize,
    /// Bytes of released traces (and their episodes) held in memory when there is no
    /// trace directory; the oldest are dropped first (their ids stay remembered).
    #[serde(deserialize_with = "value::bytes")]
    pub released_trace_bytes: usize,
    /// With a trace directory: most bytes of lines queued for the trace writer (see
    /// [`intercept_trace::WriterConfig::max_queued_bytes`]).
    #[serde(deserialize_with = "value::positive_bytes")]
    pub trace_queue_bytes: u64,
    /// With a trace directory: longest wait of a line before the writer writes it.
    #[serde(rename = "trace_flush_secs", deserialize_with = "value::secs")]
    pub trace_flush: Duration,
    /// Connections served at once by each harness port and by the control API (default
    /// 16,384; `None`, `0` in the settings: no cap).
    #[serde(deserialize_with = "value::connections")]
    pub max_connections: Option<usize>,
    /// Largest upstream answer read for one call (default 256 MiB); past it the call
    /// fails with 502 and its record is marked `truncated`.
    #[serde(deserialize_with = "value::positive_bytes")]
    pub max_response_bytes: u64,
    /// A plain-HTTP upstream that takes no byte of a request for this long fails the
    /// call (default 30 s; `None`: no limit).
    #[serde(rename = "upstream_write_idle_secs", deserialize_with = "value::idle")]
    pub upstream_write_idle: Option<Duration>,
    /// A plain-HTTP upstream that sends nothing for this long once it has the request
    /// fails the call (default `None`: no limit).
    #[serde(rename = "upstream_read_idle_secs", deserialize_with = "value::idle")]
    pub upstream_read_idle: Option<Duration>,
    /// What a stream carries while its upstream is silent (default `event`).
    #[serde(deserialize_with = "value::stream_heartbeat")]
    pub stream_heartbeat: intercept_server::StreamHeartbeat,
    /// Bound on `GET /v1/models`' upstream listing (default 30 s).
    #[serde(
        rename = "models_timeout_secs",
        deserialize_with = "value::positive_secs"
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
        self.network()?;
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
                limit.url = self.rate_limit_url.as_ref().map(|u| u.expose().to_owned());
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

    /// The network policy of sessions created without one (`network_allow`,
    /// `network_block`, `network_on_violation`).
    pub fn network(&self) -> Result<NetworkPolicy, ConfigError> {
        let inconsistent = |key: &'static str| {
            move |message: String| ConfigError::Inconsistent {
                key: key.into(),
                message,
            }
        };
        // The allow list alone first, so a failure names the list that has it.
        let none: [&str; 0] = [];
        NetworkPolicy::new(&self.network_allow, &none).map_err(inconsistent("network_allow"))?;
        NetworkPolicy::new(&self.network_allow, &self.network_block)
            .map(|p| p.with_on_violation(self.network_on_violation))
            .map_err(inconsistent("network_block"))
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

/// The `deserialize_with` functions of [`ServeConfig`]'s fields: each takes the value as
/// text (a TOML string, number or boolean, an environment variable, a flag), trimmed
/// (but for `control_token`), and checks it, saying what is wrong and what is expected.
mod value {
    use serde::de::{self, Deserializer};

    use super::*;

    /// A value as text: every scalar of a TOML file, and every variable and flag.
    struct Raw(String);

    impl<'de> Deserialize<'de> for Raw {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_any(RawVisitor)
        }
    }

    struct RawVisitor;

    const NOT_SCALAR: &str = "expected a string or a number, not a table or array";

    impl<'de> de::Visitor<'de> for RawVisitor {
        type Value = Raw;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string or a number")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Raw, E> {
            Ok(Raw(v.to_owned()))
        }
        fn visit_string<E: de::Error>(self, v: String) -> Result<Raw, E> {
            Ok(Raw(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Raw, E> {
            Ok(Raw(v.to_string()))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Raw, E> {
            Ok(Raw(v.to_string()))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Raw, E> {
            Ok(Raw(v.to_string()))
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Raw, E> {
            Ok(Raw(v.to_string()))
        }
        fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Raw, A::Error> {
            Err(de::Error::custom(NOT_SCALAR))
        }
        fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<Raw, A::Error> {
            Err(de::Error::custom(NOT_SCALAR))
        }
    }

    /// The value as trimmed text, checked by `parse`.
    fn parse<'de, D, T>(d: D, parse: impl FnOnce(&str) -> Result<T, String>) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
    {
        let Raw(raw) = Raw::deserialize(d)?;
        parse(raw.trim()).map_err(de::Error::custom)
    }

    /// One of `names` (the value as given is its setting's spelling).
    fn one_of<T: Copy>(
        raw: &str,
        names: &[(&str, T)],
        error: impl FnOnce(&str) -> String,
    ) -> Result<T, String> {
        names
            .iter()
            .find(|(name, _)| *name == raw)
            .map(|(_, v)| *v)
            .ok_or_else(|| error(raw))
    }

    fn seconds(raw: &str) -> Option<Duration> {
        raw.parse::<f64>()
            .ok()
            .and_then(|s| Duration::try_from_secs_f64(s).ok())
    }

    fn list(raw: &str) -> Vec<String> {
        raw.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect()
    }

    fn env_name(raw: &str, what: &str) -> Result<String, String> {
        if is_env_name(raw) {
            Ok(raw.to_owned())
        } else {
            Err(format!(
                "{raw:?} is not an environment variable name (letters, digits and `_`); give \
                 the name of the variable that holds the {what}, never the {what} itself"
            ))
        }
    }

    pub(super) fn upstream<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<UpstreamSetting>, D::Error> {
        parse(d, |raw| {
            if raw == "mock" {
                return Ok(Some(UpstreamSetting::Mock));
            }
            check_base_url(raw)
                .map(|url| Some(UpstreamSetting::Url(url)))
                .map_err(|e| format!("{e}, or `mock`"))
        })
    }

    pub(super) fn key_env<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        parse(d, |raw| env_name(raw, "key").map(Some))
    }

    pub(super) fn secret_env<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        parse(d, |raw| env_name(raw, "secret").map(Some))
    }

    pub(super) fn env_names<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Vec<String>>, D::Error> {
        parse(d, |raw| {
            let names = list(raw);
            match names.iter().find(|n| !is_env_name(n)) {
                Some(bad) => Err(format!(
                    "{bad:?} is not an environment variable name (letters, digits and `_`); \
                     give a comma-separated list of variable names"
                )),
                None => Ok(Some(names)),
            }
        })
    }

    pub(super) fn model<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        parse(d, |raw| {
            if raw.is_empty() {
                return Err("the model name is empty".into());
            }
            Ok(Some(raw.to_owned()))
        })
    }

    pub(super) fn control<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
        parse(d, |raw| {
            let addr: SocketAddr = raw.parse().map_err(|_| {
                format!("{raw:?} is not an address; expected IP:PORT such as 127.0.0.1:0")
            })?;
            if !addr.ip().is_loopback() {
                return Err(format!(
                    "{addr} is not a loopback address; the control API only listens on \
                     loopback (e.g. 127.0.0.1:7700)"
                ));
            }
            Ok(addr)
        })
    }

    /// The token as given, not trimmed: a space is refused, not dropped.
    pub(super) fn token<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Secret>, D::Error> {
        let Raw(raw) = Raw::deserialize(d)?;
        if raw.is_empty() || !raw.chars().all(|c| c.is_ascii_graphic()) {
            return Err(de::Error::custom(
                "the token must be non-empty printable ASCII without spaces",
            ));
        }
        Ok(Some(Secret::new(raw)))
    }

    pub(super) fn shape<'de, D: Deserializer<'de>>(d: D) -> Result<Shape, D::Error> {
        let names = [
            ("server", Shape::Server),
            ("static", Shape::Static),
            ("elastic", Shape::Elastic),
        ];
        parse(d, |raw| {
            one_of(raw, &names, |other| {
                format!("{other:?} is not a shape; expected server, static or elastic")
            })
        })
    }

    pub(super) fn tunnel<'de, D: Deserializer<'de>>(d: D) -> Result<TunnelSetting, D::Error> {
        let names = [
            ("none", TunnelSetting::None),
            ("custom", TunnelSetting::Custom),
            ("prime", TunnelSetting::Prime),
            ("bore", TunnelSetting::Bore),
        ];
        parse(d, |raw| {
            one_of(raw, &names, |other| {
                format!("{other:?} is not a tunnel; expected none, custom, prime or bore")
            })
        })
    }

    pub(super) fn limiter<'de, D: Deserializer<'de>>(d: D) -> Result<LimiterBackend, D::Error> {
        let names = [
            ("file", LimiterBackend::File),
            ("redis", LimiterBackend::Redis),
        ];
        parse(d, |raw| {
            one_of(raw, &names, |other| {
                format!(
                    "{other:?} is not a rate limiter backend; expected file (one host) or \
                     redis (a fleet sharing rate_limit_url)"
                )
            })
        })
    }

    pub(super) fn trace_format<'de, D: Deserializer<'de>>(d: D) -> Result<TraceFormat, D::Error> {
        let names = [("log", TraceFormat::Log), ("full", TraceFormat::Full)];
        parse(d, |raw| {
            one_of(raw, &names, |other| {
                format!(
                    "{other:?} is not a trace format; expected log (the trace log) or full \
                     (one whole record per line, the format of earlier versions)"
                )
            })
        })
    }

    pub(super) fn log_format<'de, D: Deserializer<'de>>(d: D) -> Result<LogFormat, D::Error> {
        let names = [("text", LogFormat::Text), ("json", LogFormat::Json)];
        parse(d, |raw| {
            one_of(raw, &names, |other| {
                format!("{other:?} is not a format; expected text or json")
            })
        })
    }

    pub(super) fn stream_heartbeat<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<intercept_server::StreamHeartbeat, D::Error> {
        use intercept_server::StreamHeartbeat;
        let names = [
            ("event", StreamHeartbeat::Event),
            ("comment", StreamHeartbeat::Comment),
            ("off", StreamHeartbeat::Off),
        ];
        parse(d, |raw| {
            one_of(raw, &names, |other| {
                format!("{other:?} is not a heartbeat; expected event, comment or off")
            })
        })
    }

    pub(super) fn on_violation<'de, D: Deserializer<'de>>(d: D) -> Result<OnViolation, D::Error> {
        let names = [
            ("strip", OnViolation::Strip),
            ("reject", OnViolation::Reject),
        ];
        parse(d, |raw| {
            one_of(raw, &names, |other| {
                format!("{other:?} is not strip or reject")
            })
        })
    }

    pub(super) fn positive<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
        parse(d, |raw| match raw.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("{raw:?} is not a positive integer")),
        })
    }

    pub(super) fn count<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
        parse(d, |raw| {
            raw.parse::<usize>()
                .map_err(|_| format!("{raw:?} is not a non-negative integer"))
        })
    }

    pub(super) fn some_count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
        count(d).map(Some)
    }

    pub(super) fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
        parse(d, |raw| {
            raw.parse::<usize>()
                .map_err(|_| format!("{raw:?} is not a number of bytes"))
        })
    }

    pub(super) fn positive_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        parse(d, |raw| {
            raw.parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{raw:?} is not a number of bytes (an integer > 0)"))
        })
    }

    pub(super) fn connections<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
        parse(d, |raw| {
            let n = raw.parse::<usize>().map_err(|_| {
                format!("{raw:?} is not a number of connections (an integer; 0: no cap)")
            })?;
            Ok((n > 0).then_some(n))
        })
    }

    pub(super) fn positive_secs<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        parse(d, |raw| {
            seconds(raw)
                .filter(|d| !d.is_zero())
                .ok_or_else(|| format!("{raw:?} is not a number of seconds (> 0)"))
        })
    }

    pub(super) fn secs<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        parse(d, |raw| {
            seconds(raw).ok_or_else(|| format!("{raw:?} is not a number of seconds (>= 0)"))
        })
    }

    pub(super) fn header_timeout<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        parse(d, |raw| {
            let secs = seconds(raw)
                .ok_or_else(|| format!("{raw:?} is not a number of seconds (>= 0; 0: no limit)"))?;
            Ok((!secs.is_zero()).then_some(secs))
        })
    }

    pub(super) fn idle<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        parse(d, |raw| {
            let secs = seconds(raw).ok_or_else(|| {
                format!("{raw:?} is not a number of seconds (>= 0; 0 turns the timeout off)")
            })?;
            Ok((!secs.is_zero()).then_some(secs))
        })
    }

    pub(super) fn tunnel_url<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        parse(d, |raw| {
            check_base_url(raw).map(Some).map_err(|e| {
                e.replace(
                    "expected e.g. http://127.0.0.1:8000/v1",
                    "expected the public URL, e.g. https://rollouts.example.com",
                )
            })
        })
    }

    pub(super) fn port<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u16>, D::Error> {
        parse(d, |raw| match raw.parse::<u16>() {
            Ok(p) if p > 0 => Ok(Some(p)),
            _ => Err(format!("{raw:?} is not a port; expected 1 to 65535")),
        })
    }

    pub(super) fn ip<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
        parse(d, |raw| {
            raw.parse::<IpAddr>().map(Some).map_err(|_| {
                format!("{raw:?} is not an IP address; expected e.g. 0.0.0.0 or 127.0.0.1")
            })
        })
    }

    pub(super) fn host<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        parse(d, |raw| {
            if raw.is_empty() || (raw.contains(['/', ' ', ':']) && raw.parse::<IpAddr>().is_err()) {
                return Err(format!(
                    "{raw:?} is not a host name or IP address (give the port as bore_port, \
                     without a scheme)"
                ));
            }
            Ok(Some(raw.to_owned()))
        })
    }

    pub(super) fn sha256<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        parse(d, |raw| {
            let hex = raw.to_ascii_lowercase();
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(format!(
                    "{raw:?} is not a SHA-256 (64 hex digits) of the frp release tarball for \
                     this platform"
                ));
            }
            Ok(Some(hex))
        })
    }

    pub(super) fn redis_url<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RedisUrl>, D::Error> {
        parse(d, |raw| {
            if !["redis://", "redis+unix://", "unix://"]
                .iter()
                .any(|scheme| raw.starts_with(scheme))
            {
                return Err(format!(
                    "{:?} is not a Redis URL; expected redis://[user:password@]host[:port][/db]",
                    redact_url(raw)
                ));
            }
            Ok(Some(RedisUrl(raw.to_owned())))
        })
    }

    pub(super) fn dir<'de, D: Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
        parse(d, |raw| {
            if raw.is_empty() {
                return Err("the directory is empty".into());
            }
            Ok(Some(PathBuf::from(raw)))
        })
    }

    pub(super) fn log<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        parse(d, |raw| {
            tracing_subscriber::EnvFilter::try_new(raw).map_err(|e| {
                format!(
                    "{raw:?} is not a log filter ({e}); expected e.g. `info` or \
                     `intercept_server=debug,info`"
                )
            })?;
            Ok(Some(raw.to_owned()))
        })
    }

    /// Host patterns, comma-separated; `on` names the list in the message
    /// (`network.allow: ...`).
    fn patterns(raw: &str, allow: bool) -> Result<Vec<String>, String> {
        let list = list(raw);
        let none: [&str; 0] = [];
        let checked = if allow {
            NetworkPolicy::new(&list, &none)
        } else {
            NetworkPolicy::new(&["*"], &list)
        };
        checked
            .map(|_| list)
            .map_err(|e| format!("{e}; expected comma-separated host patterns"))
    }

    pub(super) fn allow<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        parse(d, |raw| patterns(raw, true))
    }

    pub(super) fn block<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        parse(d, |raw| patterns(raw, false))
    }
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
    fn settings_document_every_field_in_order() {
        let probe = Layer::strings(Source::Flag, [("?", "")].into_iter());
        let e = Figment::from(probe).extract::<ServeConfig>().unwrap_err();
        let figment::error::Kind::UnknownField(_, fields) = e.kind else {
            panic!("{e}")
        };
        assert_eq!(fields, keys().collect::<Vec<_>>());
        let table = settings_table();
        assert_eq!(table.lines().count(), SETTINGS.len() + 2);
        assert!(
            table.contains("| `multiplex` | 32 | Sessions per server"),
            "{table}"
        );
    }

    #[test]
    fn messages_name_the_key_and_the_source() {
        let cases = [
            (
                err(None, &[], &[("multiplex", "zero")]),
                "invalid value for `--multiplex` (command line): \"zero\" is not a positive \
                 integer",
            ),
            (
                err(None, &[("INTERCEPT_MULTIPLEX", " lots ")], &[]),
                "invalid value for `INTERCEPT_MULTIPLEX` (environment): \"lots\" is not a \
                 positive integer",
            ),
            (
                err(Some("multiplex = 0\n"), &[], &[]),
                "invalid value for `multiplex` (config file i.toml): \"0\" is not a positive \
                 integer",
            ),
            (
                err(Some("shutdown_grace_secs = -1.5\n"), &[], &[]),
                "invalid value for `shutdown_grace_secs` (config file i.toml): \"-1.5\" is not \
                 a number of seconds (>= 0)",
            ),
            (
                err(Some("model = [1]\n"), &[], &[]),
                "invalid value for `model` (config file i.toml): expected a string or a number, \
                 not a table or array",
            ),
            // A bad value fails even when a higher layer overrides it.
            (
                err(
                    Some("multiplex = \"x\"\n"),
                    &[("INTERCEPT_MULTIPLEX", "8")],
                    &[],
                ),
                "invalid value for `multiplex` (config file i.toml): \"x\" is not a positive \
                 integer",
            ),
            (
                err(None, &[("INTERCEPT_MULTIPLEX", "x")], &[("multiplex", "8")]),
                "invalid value for `INTERCEPT_MULTIPLEX` (environment): \"x\" is not a \
                 positive integer",
            ),
        ];
        for (e, message) in cases {
            assert_eq!(e.to_string(), message);
        }
        let e = err(Some("multiplx = 3\n"), &[], &[]).to_string();
        assert!(
            e.starts_with(
                "unknown setting `multiplx` (config file i.toml); known settings: upstream, \
                 upstream_api_key_env, "
            ),
            "{e}"
        );
        let e = err(None, &[], &[("nope", "1")]).to_string();
        assert!(
            e.starts_with("unknown setting `--nope` (command line); known settings: --upstream, "),
            "{e}"
        );
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
            ("trace_queue_bytes", "0"),
            ("trace_flush_secs", "-1"),
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
        assert!(c.network().unwrap().is_restricted());
        assert!(c.network().unwrap().allows_host("docs.python.org"));
        assert!(!c.network().unwrap().allows_host("evil.python.org"));
        assert_eq!(c.network().unwrap().on_violation(), OnViolation::Reject);
        assert!(!ServeConfig::default().network().unwrap().is_restricted());
        let none = ServeConfig::from_layers(Layers {
            file: None,
            env: &[],
            flags: &[("network_allow", String::new())],
        })
        .unwrap();
        assert!(!none.network().unwrap().allows_host("python.org"));
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
