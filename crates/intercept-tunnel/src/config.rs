//! Tunnel configuration as data, and [`make_tunnel`] to build a tunnel from it.
//!
//! ```
//! use intercept_tunnel::{make_tunnel, TunnelConfig};
//!
//! let config: TunnelConfig =
//!     serde_json::from_str(r#"{"type": "custom", "url": "https://proxy.example/", "port": 8080}"#)
//!         .unwrap();
//! let tunnel = make_tunnel(&config).unwrap().expect("custom is a tunnel");
//! assert_eq!(tunnel.kind(), "custom");
//! assert_eq!(tunnel.bind_addr().port, 8080);
//!
//! let none: TunnelConfig = serde_json::from_str(r#"{"type": "none"}"#).unwrap();
//! assert!(make_tunnel(&none).unwrap().is_none());
//! ```

use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use intercept_core::Tunnel;
use serde::{Deserialize, Serialize};

use crate::bore::BoreTunnel;
use crate::custom::CustomTunnel;
use crate::error::TunnelError;
use crate::limiter::{RateLimit, RateLimiter};
use crate::prime::{PrimeConfig, PrimeTunnel};

/// Which tunnel exposes a server, tagged by `type`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum TunnelConfig {
    /// No tunnel: the server binds loopback and every consumer is on this host.
    #[default]
    None,
    /// Bring your own public URL.
    Custom(CustomConfig),
    /// Prime Intellect's tunnel service.
    Prime(PrimeConfig),
    /// A self-hosted bore server.
    Bore(BoreConfig),
}

/// Configuration of the `custom` backend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomConfig {
    /// The public URL that reaches `host:port` (a trailing `/` is removed).
    pub url: String,
    /// The local port the URL forwards to (1 to 65535).
    pub port: u16,
    /// The host to bind (default `0.0.0.0`).
    #[serde(default = "unspecified")]
    pub host: IpAddr,
}

fn unspecified() -> IpAddr {
    IpAddr::V4(Ipv4Addr::UNSPECIFIED)
}

/// Configuration of the `bore` backend.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoreConfig {
    /// The bore server's host name or IP.
    pub server: String,
    /// Its control port (bore's default 7835).
    #[serde(default = "bore_control_port")]
    pub control_port: u16,
    /// The server's secret (`bore server --secret`), if any. Never printed.
    #[serde(default)]
    pub secret: Option<String>,
    /// Seconds without a heartbeat after which the tunnel counts as dead (default 5; the
    /// server sends two a second).
    #[serde(default = "heartbeat_secs")]
    pub heartbeat_timeout_secs: f64,
    /// Creation rate limit (off by default: a self-hosted server has no cap).
    #[serde(default = "RateLimit::off")]
    pub rate_limit: RateLimit,
    /// How error messages tell the user to give the secret (default: "the tunnel's
    /// `secret`"); a front end names its own setting (the sidecar: `bore_secret_env`).
    /// Not part of config files.
    #[serde(skip)]
    pub secret_hint: Option<String>,
}

fn bore_control_port() -> u16 {
    bore_cli::shared::CONTROL_PORT
}

fn heartbeat_secs() -> f64 {
    crate::bore::DEFAULT_HEARTBEAT_TIMEOUT.as_secs_f64()
}

impl fmt::Debug for BoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoreConfig")
            .field("server", &self.server)
            .field("control_port", &self.control_port)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("heartbeat_timeout_secs", &self.heartbeat_timeout_secs)
            .field("rate_limit", &self.rate_limit)
            .field("secret_hint", &self.secret_hint)
            .finish()
    }
}

impl TunnelConfig {
    /// The backend's name (`none`, `custom`, `prime`, `bore`).
    pub fn kind(&self) -> &'static str {
        match self {
            TunnelConfig::None => "none",
            TunnelConfig::Custom(_) => "custom",
            TunnelConfig::Prime(_) => "prime",
            TunnelConfig::Bore(_) => "bore",
        }
    }
}

/// Builds the tunnel a configuration describes; `None` for [`TunnelConfig::None`].
///
/// Fails when the configuration cannot work: a custom URL that is not absolute or a port
/// of 0, a Prime tunnel without an API key (`PRIME_API_KEY` or `~/.prime/config.json`), a
/// bore tunnel without a server or with a bad heartbeat timeout.
pub fn make_tunnel(config: &TunnelConfig) -> Result<Option<Arc<dyn Tunnel>>, TunnelError> {
    Ok(match config {
        TunnelConfig::None => None,
        TunnelConfig::Custom(c) => Some(Arc::new(
            CustomTunnel::new(&c.url, c.port)?.with_host(c.host),
        )),
        TunnelConfig::Prime(c) => Some(Arc::new(PrimeTunnel::new(c.clone())?)),
        TunnelConfig::Bore(c) => {
            if c.server.trim().is_empty() {
                return Err(TunnelError::Config(
                    "bore tunnel: `server` is required (the host running `bore server`)".into(),
                ));
            }
            let heartbeat = Duration::try_from_secs_f64(c.heartbeat_timeout_secs)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    TunnelError::Config(
                        "bore tunnel: heartbeat_timeout_secs must be a positive number".into(),
                    )
                })?;
            let limiter = RateLimiter::new(&c.rate_limit, &format!("bore-{}", c.server))?;
            let mut tunnel = BoreTunnel::new(&c.server)
                .with_control_port(c.control_port)
                .with_secret(c.secret.clone())
                .with_heartbeat_timeout(heartbeat)
                .with_limiter(limiter);
            if let Some(hint) = &c.secret_hint {
                tunnel = tunnel.with_secret_source(hint);
            }
            Some(Arc::new(tunnel))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_type() {
        let c: TunnelConfig = serde_json::from_str(r#"{"type":"none"}"#).unwrap();
        assert_eq!(c, TunnelConfig::None);
        assert_eq!(TunnelConfig::default().kind(), "none");

        let c: TunnelConfig = serde_json::from_str(
            r#"{"type":"custom","url":"http://h.example","port":9000,"host":"127.0.0.1"}"#,
        )
        .unwrap();
        let TunnelConfig::Custom(custom) = &c else {
            panic!("{c:?}")
        };
        assert_eq!(custom.host, IpAddr::V4(Ipv4Addr::LOCALHOST));
        let t = make_tunnel(&c).unwrap().unwrap();
        assert_eq!(t.bind_addr().host, IpAddr::V4(Ipv4Addr::LOCALHOST));

        let c: TunnelConfig = serde_json::from_str(
            r#"{"type":"prime","connection_timeout":12,"rate_limit":{"rate":100}}"#,
        )
        .unwrap();
        let TunnelConfig::Prime(p) = &c else {
            panic!("{c:?}")
        };
        assert_eq!(p.connection_timeout, Duration::from_secs(12));
        assert_eq!(p.rate_limit.rate, 100);
        assert_eq!(c.kind(), "prime");

        let c: TunnelConfig =
            serde_json::from_str(r#"{"type":"bore","server":"bore.example","secret":"hush"}"#)
                .unwrap();
        let TunnelConfig::Bore(b) = &c else {
            panic!("{c:?}")
        };
        assert_eq!(b.control_port, 7835);
        assert!(!b.rate_limit.enabled);
        assert!(!format!("{c:?}").contains("hush"));
        let t = make_tunnel(&c).unwrap().unwrap();
        assert_eq!(t.kind(), "bore");
        assert!(t.bind_addr().host.is_loopback());

        assert!(serde_json::from_str::<TunnelConfig>(r#"{"type":"ngrok"}"#).is_err());
        for typo in [
            r#"{"type":"prime","nope":1}"#,
            r#"{"type":"custom","url":"http://h","port":1,"prot":2}"#,
            r#"{"type":"bore","server":"h","secrett":"x"}"#,
        ] {
            assert!(
                serde_json::from_str::<TunnelConfig>(typo).is_err(),
                "{typo}"
            );
        }
    }

    #[test]
    fn bad_configs_fail_with_config_errors() {
        let bad = [
            TunnelConfig::Custom(CustomConfig {
                url: "nope".into(),
                port: 1,
                host: unspecified(),
            }),
            TunnelConfig::Bore(BoreConfig {
                server: " ".into(),
                control_port: 1,
                secret: None,
                heartbeat_timeout_secs: 1.0,
                rate_limit: RateLimit::off(),
                secret_hint: None,
            }),
            TunnelConfig::Bore(BoreConfig {
                server: "h".into(),
                control_port: 1,
                secret: None,
                heartbeat_timeout_secs: -1.0,
                rate_limit: RateLimit::off(),
                secret_hint: None,
            }),
        ];
        for c in bad {
            let err = make_tunnel(&c).expect_err("must fail");
            assert_eq!(err.kind(), crate::TunnelErrorKind::Config, "{err}");
        }
    }
}
