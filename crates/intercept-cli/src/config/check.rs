//! [`ServeConfig::check`]: settings that are valid one by one but must also fit together,
//! checked in stages (each tunnel's keys, the tunnel's needs, the fleet limiter, the pool
//! bounds, the network policy); the first misfit is the error.

use intercept_tunnel::LimiterBackend;

use super::{ConfigError, ServeConfig, Shape, TunnelSetting};

fn inconsistent(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Inconsistent {
        key: key.to_owned(),
        message: message.into(),
    }
}

impl ServeConfig {
    /// Checks that the settings fit together: each tunnel has what it needs and no key of
    /// another tunnel is set; a `custom` tunnel (one fixed URL and port) runs one server.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.check_tunnel_keys()?;
        self.check_tunnel_needs()?;
        self.check_rate_limit()?;
        self.check_pool_bounds()?;
        self.network()?;
        Ok(())
    }

    /// No key of another tunnel than `tunnel` is set.
    fn check_tunnel_keys(&self) -> Result<(), ConfigError> {
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
                        "is a setting of the {} tunnel but tunnel = {}; set tunnel = {} \
                         or remove it",
                        owner.as_str(),
                        self.tunnel.as_str(),
                        owner.as_str()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The tunnel has what it needs; a custom tunnel serves one server.
    fn check_tunnel_needs(&self) -> Result<(), ConfigError> {
        match self.tunnel {
            TunnelSetting::Custom => {
                if self.tunnel_url.is_none() {
                    return Err(inconsistent(
                        "tunnel_url",
                        "required with tunnel = custom: the public URL that reaches the server",
                    ));
                }
                if self.tunnel_port.is_none() {
                    return Err(inconsistent(
                        "tunnel_port",
                        "required with tunnel = custom: the local port the URL forwards to",
                    ));
                }
                match self.interception {
                    Shape::Elastic => Err(inconsistent(
                        "tunnel",
                        "a custom tunnel is one fixed URL and port, but an elastic pool \
                         gives every new server a tunnel of its own; use tunnel = bore or \
                         prime, or interception = server",
                    )),
                    Shape::Static if self.static_servers > 1 => Err(inconsistent(
                        "static_servers",
                        format!(
                            "{} servers cannot share one custom tunnel (one URL, one \
                             port); use static_servers = 1, or tunnel = bore or prime",
                            self.static_servers
                        ),
                    )),
                    _ => Ok(()),
                }
            }
            TunnelSetting::Bore if self.bore_server.is_none() => Err(inconsistent(
                "bore_server",
                "required with tunnel = bore: the host running `bore server`",
            )),
            _ => Ok(()),
        }
    }

    /// A Redis limiter has its URL, a URL has its Redis limiter, and the tunnel starts
    /// something to limit.
    fn check_rate_limit(&self) -> Result<(), ConfigError> {
        match (self.rate_limit_backend, &self.rate_limit_url) {
            (LimiterBackend::Redis, None) => Err(inconsistent(
                "rate_limit_url",
                "required with rate_limit_backend = redis: the Redis server the fleet \
                 shares, e.g. redis://10.0.0.5:6379/",
            )),
            (LimiterBackend::File, Some(_)) => Err(inconsistent(
                "rate_limit_url",
                "is only used with rate_limit_backend = redis; set it, or remove \
                 rate_limit_url",
            )),
            (LimiterBackend::Redis, Some(_))
                if !matches!(self.tunnel, TunnelSetting::Prime | TunnelSetting::Bore) =>
            {
                Err(inconsistent(
                    "rate_limit_backend",
                    format!(
                        "limits tunnel starts, but tunnel = {} starts none; use tunnel = \
                         prime or bore, or remove it",
                        self.tunnel.as_str()
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    /// `min_servers` is at most `max_servers`.
    fn check_pool_bounds(&self) -> Result<(), ConfigError> {
        match self.min_servers {
            Some(min) if min > self.max_servers => Err(inconsistent(
                "min_servers",
                format!("{min} exceeds max_servers = {}", self.max_servers),
            )),
            _ => Ok(()),
        }
    }
}
