//! A [`ServerConfig`] read from a map of its settings: the names are `ServerConfig`'s
//! fields (`released_memory` is still accepted for `released_secrets`), durations are
//! (fractional) seconds, and a name that is not a setting is refused with the list of
//! known ones. The Python package hands its server keywords through here, so the names
//! are written once, on `ServerConfig`.
//!
//! ```
//! let settings = serde_json::json!({"keepalive": 1.5, "stream_buffer": 64});
//! let config = intercept_pool::server_config(settings.as_object().unwrap()).unwrap();
//! assert_eq!(config.stream_buffer, 64);
//! let err = intercept_pool::server_config(serde_json::json!({"bogus": 1}).as_object().unwrap());
//! assert!(err.unwrap_err().contains("unknown field `bogus`, expected one of"));
//! ```

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use intercept_core::{Secret, Tunnel};
use intercept_server::{ServerConfig, StreamHeartbeat};
use serde::de::{Deserializer, Error as _};
use serde::Deserialize;
use serde_json::{Map, Value};

/// A [`ServerConfig`] from `settings`; every setting not named keeps its default. The
/// error names the setting that is wrong and says why (an unknown name lists the known
/// ones).
pub fn server_config(settings: &Map<String, Value>) -> Result<ServerConfig, String> {
    let whole = Value::Object(settings.clone());
    Settings::deserialize(whole).map_err(|e| {
        // serde does not say which field a value error is in: find the first one that
        // fails on its own.
        let named = settings.iter().find_map(|(key, value)| {
            let alone = Value::Object(Map::from_iter([(key.clone(), value.clone())]));
            Settings::deserialize(alone).err().map(|e| (key, e))
        });
        match named {
            Some((key, e)) if !e.to_string().starts_with("unknown field") => {
                format!("server setting {key}: {e}")
            }
            _ => format!("server settings: {e}"),
        }
    })
}

/// `ServerConfig`'s fields as serde reads them. As a `remote` definition, it must name
/// exactly `ServerConfig`'s fields with their types, or the crate does not build: a
/// setting added to the server is a setting here.
#[derive(Deserialize)]
#[serde(
    remote = "ServerConfig",
    default = "ServerConfig::default",
    deny_unknown_fields
)]
#[allow(dead_code)] // read only by the derive
struct Settings {
    body_limit: u64,
    max_response_bytes: u64,
    max_connections: Option<usize>,
    #[serde(deserialize_with = "positive_secs")]
    keepalive: Duration,
    #[serde(deserialize_with = "heartbeat")]
    stream_heartbeat: StreamHeartbeat,
    #[serde(deserialize_with = "secs")]
    shutdown_grace: Duration,
    #[serde(deserialize_with = "secs")]
    first_byte_timeout: Duration,
    #[serde(deserialize_with = "secs")]
    disconnect_grace: Duration,
    #[serde(deserialize_with = "opt_secs")]
    header_read_timeout: Option<Duration>,
    #[serde(deserialize_with = "secs")]
    connect_timeout: Duration,
    #[serde(deserialize_with = "opt_secs")]
    upstream_timeout: Option<Duration>,
    #[serde(deserialize_with = "opt_secs")]
    upstream_write_idle: Option<Duration>,
    #[serde(deserialize_with = "opt_secs")]
    upstream_read_idle: Option<Duration>,
    #[serde(deserialize_with = "secs")]
    models_timeout: Duration,
    inspect_memory: usize,
    #[serde(deserialize_with = "at_least_one")]
    stream_buffer: usize,
    #[serde(alias = "released_memory")]
    released_secrets: usize,
    upstream_idle_per_host: usize,
    #[serde(deserialize_with = "secs")]
    engine_retry_after: Duration,
    #[serde(deserialize_with = "secrets")]
    service_secrets: Vec<Secret>,
    workers: usize,
    listen: Option<SocketAddr>,
    /// Not a setting: a tunnel is given as an object.
    #[serde(skip)]
    tunnel: Option<Arc<dyn Tunnel>>,
}

fn secs<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let v = f64::deserialize(d)?;
    Duration::try_from_secs_f64(v).map_err(|_| {
        D::Error::custom(format!(
            "expected a non-negative number of seconds, got {v}"
        ))
    })
}

fn positive_secs<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let v = secs(d)?;
    if v.is_zero() {
        return Err(D::Error::custom("must be more than 0 seconds"));
    }
    Ok(v)
}

fn opt_secs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    match Option::<f64>::deserialize(d)? {
        None => Ok(None),
        Some(v) => Duration::try_from_secs_f64(v).map(Some).map_err(|_| {
            D::Error::custom(format!(
                "expected a non-negative number of seconds, got {v}"
            ))
        }),
    }
}

fn at_least_one<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    match usize::deserialize(d)? {
        0 => Err(D::Error::custom("must be at least 1")),
        n => Ok(n),
    }
}

fn heartbeat<'de, D: Deserializer<'de>>(d: D) -> Result<StreamHeartbeat, D::Error> {
    String::deserialize(d)?.parse().map_err(D::Error::custom)
}

fn secrets<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Secret>, D::Error> {
    let list = Vec::<String>::deserialize(d)?;
    if list.iter().any(String::is_empty) {
        return Err(D::Error::custom("a secret must not be empty"));
    }
    Ok(list.into_iter().map(Secret::new).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: Value) -> Result<ServerConfig, String> {
        server_config(v.as_object().unwrap())
    }

    #[test]
    fn names_are_the_fields_and_the_rest_keeps_its_default() {
        let c = read(json!({
            "listen": "127.0.0.1:8100",
            "keepalive": 0.5,
            "upstream_timeout": 60,
            "released_memory": 7,
            "stream_heartbeat": "comment",
            "service_secrets": ["tool"],
            "max_connections": null,
        }))
        .unwrap();
        assert_eq!(c.listen, Some("127.0.0.1:8100".parse().unwrap()));
        assert_eq!(c.keepalive, Duration::from_millis(500));
        assert_eq!(c.upstream_timeout, Some(Duration::from_secs(60)));
        assert_eq!(c.released_secrets, 7);
        assert_eq!(c.stream_heartbeat, StreamHeartbeat::Comment);
        assert_eq!(c.service_secrets.len(), 1);
        assert_eq!(c.max_connections, None);
        let d = ServerConfig::default();
        assert_eq!(
            (c.body_limit, c.stream_buffer),
            (d.body_limit, d.stream_buffer)
        );
        assert!(c.tunnel.is_none());
    }

    #[test]
    fn errors_name_the_setting() {
        let unknown = read(json!({"keepalive": 1, "bogus": 1})).unwrap_err();
        assert!(unknown.contains("unknown field `bogus`"), "{unknown}");
        assert!(
            unknown.contains("`body_limit`") && unknown.contains("`listen`"),
            "{unknown}"
        );
        assert!(!unknown.contains("tunnel"), "{unknown}");
        for (settings, says) in [
            (
                json!({"keepalive": 0}),
                "keepalive: must be more than 0 seconds",
            ),
            (
                json!({"shutdown_grace": -1}),
                "shutdown_grace: expected a non-negative",
            ),
            (
                json!({"stream_buffer": 0}),
                "stream_buffer: must be at least 1",
            ),
            (
                json!({"service_secrets": [""]}),
                "service_secrets: a secret must not be empty",
            ),
            (
                json!({"stream_heartbeat": "loud"}),
                "stream_heartbeat: unknown stream heartbeat",
            ),
            (
                json!({"listen": "nowhere"}),
                "listen: invalid socket address",
            ),
        ] {
            let e = read(settings).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }
}
