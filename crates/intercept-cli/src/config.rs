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
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use intercept_core::Secret;

/// Every setting key, as written in the config file (the environment variable is
/// `INTERCEPT_` + the key in upper case, the flag is `--` + the key with `-` for `_`).
pub const KEYS: &[&str] = &[
    "upstream",
    "upstream_api_key_env",
    "model",
    "control",
    "control_token",
    "interception",
    "multiplex",
    "tunnel",
    "trace_dir",
    "log",
    "log_format",
    "shutdown_grace_secs",
    "released_retention",
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
    /// One interception server.
    Server,
}

impl Shape {
    /// The name used in settings and in `GET /v1/interception`.
    pub fn as_str(self) -> &'static str {
        match self {
            Shape::Server => "server",
        }
    }
}

/// Which tunnel exposes the interception.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TunnelSetting {
    /// No tunnel: harnesses reach the server on loopback.
    None,
}

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
            ConfigError::UnknownKey { key, .. } | ConfigError::BadValue { key, .. } => Some(key),
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
    /// Default model of sessions that name none (with the mock: `mock-model`).
    pub model: Option<String>,
    /// Where the control API listens (loopback only; default `127.0.0.1:0`).
    pub control: SocketAddr,
    /// The control API token (generated when `None`).
    pub control_token: Option<Secret>,
    /// The interception shape.
    pub interception: Shape,
    /// Sessions per server (elastic pools; validated, unused by the single server).
    pub multiplex: usize,
    /// The tunnel.
    pub tunnel: TunnelSetting,
    /// Directory of the JSONL trace files (`<dir>/<session id>.jsonl`).
    pub trace_dir: Option<PathBuf>,
    /// Log filter (`RUST_LOG` syntax); `None` uses `RUST_LOG`, else `info`.
    pub log: Option<String>,
    /// Log format.
    pub log_format: LogFormat,
    /// On shutdown, in-flight calls may finish for this long before they are cancelled.
    pub shutdown_grace: Duration,
    /// Released sessions whose traces stay readable through the control API.
    pub released_retention: usize,
}

impl fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServeConfig")
            .field("upstream", &self.upstream)
            .field("upstream_api_key_env", &self.upstream_api_key_env)
            .field("model", &self.model)
            .field("control", &self.control)
            .field(
                "control_token",
                &self.control_token.as_ref().map(|_| "<set>"),
            )
            .field("interception", &self.interception)
            .field("multiplex", &self.multiplex)
            .field("tunnel", &self.tunnel)
            .field("trace_dir", &self.trace_dir)
            .field("log", &self.log)
            .field("log_format", &self.log_format)
            .field("shutdown_grace", &self.shutdown_grace)
            .field("released_retention", &self.released_retention)
            .finish()
    }
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            upstream: None,
            upstream_api_key_env: None,
            model: None,
            control: SocketAddr::from(([127, 0, 0, 1], 0)),
            control_token: None,
            interception: Shape::Server,
            multiplex: 32,
            tunnel: TunnelSetting::None,
            trace_dir: None,
            log: None,
            log_format: LogFormat::Text,
            shutdown_grace: Duration::from_secs(30),
            released_retention: 4096,
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
                return Err(unknown(name, &Source::Env));
            }
            config.set(&Source::Env, &key, value)?;
        }
        for (key, value) in layers.flags {
            config.set(&Source::Flag, key, value)?;
        }
        Ok(config)
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
                if raw_trimmed.is_empty()
                    || !raw_trimmed
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    return Err(bad(format!(
                        "{raw_trimmed:?} is not an environment variable name (letters, digits \
                         and `_`); give the name of the variable that holds the key, never \
                         the key itself"
                    )));
                }
                self.upstream_api_key_env = Some(raw_trimmed.to_owned());
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
                    "static" | "elastic" => {
                        return Err(bad(format!(
                            "the {raw_trimmed} pool is not available in this build yet; use \
                             `server`"
                        )))
                    }
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
            "tunnel" => {
                self.tunnel = match raw_trimmed {
                    "none" => TunnelSetting::None,
                    "custom" | "prime" | "bore" => {
                        return Err(bad(format!(
                            "the {raw_trimmed} tunnel is not available in this build yet; use \
                             `none`"
                        )))
                    }
                    other => {
                        return Err(bad(format!(
                            "{other:?} is not a tunnel; expected none, custom, prime or bore"
                        )))
                    }
                };
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
            "released_retention" => {
                self.released_retention = raw_trimmed
                    .parse::<usize>()
                    .map_err(|_| bad(format!("{raw_trimmed:?} is not a non-negative integer")))?;
            }
            _ => return Err(unknown(&source.spell(key), source)),
        }
        Ok(())
    }
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
        let e = err(None, &[("INTERCEPT_MULTIPLX", "3")], &[]);
        assert_eq!(e.key(), Some("INTERCEPT_MULTIPLX"));
        assert!(
            e.to_string().contains("INTERCEPT_MULTIPLEX"),
            "lists known: {e}"
        );
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
            ("interception", "elastic"),
            ("interception", "static"),
            ("multiplex", "0"),
            ("multiplex", "-1"),
            ("multiplex", "x"),
            ("tunnel", "ngrok"),
            ("tunnel", "bore"),
            ("trace_dir", ""),
            ("log", "info,[[["),
            ("log_format", "xml"),
            ("shutdown_grace_secs", "-1"),
            ("shutdown_grace_secs", "soon"),
            ("released_retention", "-5"),
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
        let e = err(None, &[], &[("interception", "elastic")]);
        assert!(
            e.to_string().contains("not available in this build yet"),
            "{e}"
        );
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
    }
}
