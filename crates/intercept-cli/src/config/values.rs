//! The value types of the settings ([`UpstreamSetting`], [`Shape`], [`TunnelSetting`],
//! [`LogFormat`], [`RedisUrl`]) and the `deserialize_with` functions of [`ServeConfig`]'s
//! fields: each takes the value as text (a TOML string, number or boolean, an environment
//! variable, a flag), trimmed (but for `control_token`), and checks it, saying what is
//! wrong and what is expected.

use intercept_core::{NetworkPolicy, OnMismatch, TokenEngine, TokensConfig};
use intercept_tunnel::redact_url;
use serde::de::{self, Deserializer};

use super::*;

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

pub(super) fn env_names<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
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

/// The keys of a `tokens` object, for messages.
pub(crate) const TOKENS_FIELDS: &str = "renderer (e.g. \"qwen3\"), tokenizer (a folder \
     holding tokenizer.json, or the file), engine (\"vllm\" or \"sglang\"), on_mismatch \
     (\"render\", \"chat\" or \"fail\"), enable_thinking (true or false)";

/// Checks the keys of a `tokens` object and their types (`null` unsets a key); `what`
/// names it in the message (`tokens`).
pub(crate) fn check_tokens_patch(
    what: &str,
    map: &serde_json::Map<String, serde_json::Value>,
) -> Result<(), String> {
    use serde_json::Value;
    for (key, value) in map {
        let checked = match (key.as_str(), value) {
            (_, Value::Null) => Ok(()),
            ("renderer" | "tokenizer", Value::String(s)) if s.trim().is_empty() => {
                Err("must not be empty".to_owned())
            }
            ("renderer" | "tokenizer", Value::String(_)) => Ok(()),
            ("renderer" | "tokenizer", _) => Err("expected a string".to_owned()),
            ("enable_thinking", Value::Bool(_)) => Ok(()),
            ("enable_thinking", _) => Err("expected true or false".to_owned()),
            ("engine", v) => TokenEngine::deserialize(v)
                .map(drop)
                .map_err(|e| e.to_string()),
            ("on_mismatch", v) => OnMismatch::deserialize(v)
                .map(drop)
                .map_err(|e| e.to_string()),
            (other, _) => {
                return Err(format!(
                    "{what}: unknown field {other:?}; the fields are {TOKENS_FIELDS}"
                ))
            }
        };
        checked.map_err(|e| format!("{what}.{key}: {e}; the fields are {TOKENS_FIELDS}"))?;
    }
    Ok(())
}

/// `patch` (checked by [`check_tokens_patch`]) over the keys of `default`: a key of
/// `patch` replaces the default's, a `null` one unsets it. `renderer` and `tokenizer`
/// must be given by one of them.
pub(crate) fn merge_tokens(
    default: Option<&TokensConfig>,
    patch: &serde_json::Map<String, serde_json::Value>,
) -> Result<TokensConfig, String> {
    let mut merged = match default.map(serde_json::to_value) {
        Some(Ok(serde_json::Value::Object(map))) => map,
        _ => serde_json::Map::new(),
    };
    for (key, value) in patch {
        if value.is_null() {
            merged.remove(key);
        } else {
            merged.insert(key.clone(), value.clone());
        }
    }
    serde_json::from_value(serde_json::Value::Object(merged)).map_err(|e| {
        let default = if default.is_some() {
            ""
        } else {
            " (there is no `tokens` default to take it from)"
        };
        format!("tokens: {e}{default}; the fields are {TOKENS_FIELDS}")
    })
}

/// A whole `tokens` setting from its JSON: an object with at least `renderer` and
/// `tokenizer`; `null` or `false`: none.
fn tokens_value(value: serde_json::Value) -> Result<Option<TokensConfig>, String> {
    match value {
        serde_json::Value::Null | serde_json::Value::Bool(false) => Ok(None),
        serde_json::Value::Object(map) => {
            check_tokens_patch("tokens", &map)?;
            serde_json::from_value(serde_json::Value::Object(map))
                .map(Some)
                .map_err(|e| format!("tokens: {e}; the fields are {TOKENS_FIELDS}"))
        }
        other => Err(format!(
            "expected an object of {TOKENS_FIELDS}, or `off`; got {other}"
        )),
    }
}

/// `tokens`: a table (the config file) or its JSON text (every layer:
/// `{"renderer": "qwen3", "tokenizer": "/models/qwen3"}`); `off`, `null` or `false`: none.
pub(super) fn tokens<'de, D: Deserializer<'de>>(d: D) -> Result<Option<TokensConfig>, D::Error> {
    struct Visitor;

    impl<'de> de::Visitor<'de> for Visitor {
        type Value = Option<TokensConfig>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a table, or its JSON text")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            let raw = v.trim();
            if matches!(raw, "off" | "none" | "") {
                return Ok(None);
            }
            let value = serde_json::from_str(raw).map_err(|e| {
                E::custom(format!(
                    "{raw:?} is not JSON ({e}); expected an object such as \
                     {{\"renderer\": \"qwen3\", \"tokenizer\": \"/models/qwen3\"}}, or `off`"
                ))
            })?;
            tokens_value(value).map_err(E::custom)
        }
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
            tokens_value(serde_json::Value::Bool(v)).map_err(E::custom)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            let value = serde_json::Value::deserialize(de::value::MapAccessDeserializer::new(map))?;
            tokens_value(value).map_err(de::Error::custom)
        }
    }

    d.deserialize_any(Visitor)
}
