//! What the settings turn into: the tunnel and interception configurations of the pool
//! crate, the network policy, the key variables a session may name.

use intercept_core::NetworkPolicy;
use intercept_pool::{
    ElasticConfig, ElasticEntry, InterceptionConfig, ServerEntry, SettingNames, StaticEntry,
};
use intercept_tunnel::{LimiterBackend, TunnelConfig};

use super::{ConfigError, ServeConfig, Shape, TunnelSetting, BORE_DEFAULT_PORT};

impl ServeConfig {
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
