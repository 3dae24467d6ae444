//! The `custom` backend: bring your own public URL (a reverse proxy, a load balancer, a
//! port forward) that reaches a fixed local port.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use async_trait::async_trait;
use intercept_core::{BindAddr, Endpoint, Error, Health, Tunnel};

use crate::error::TunnelError;

/// A tunnel that someone else runs: `url` reaches `host:port` on this machine.
///
/// The server binds `host:port` (host `0.0.0.0` by default) and the endpoint's URL is the
/// configured one with any trailing `/` removed. Nothing is created or torn down. The port
/// speaks plaintext HTTP guarded only by the per-rollout secrets, so put a TLS proxy or a
/// firewall in front of it on untrusted networks; a warning says so when the host is not
/// loopback.
#[derive(Debug, Clone)]
pub struct CustomTunnel {
    url: String,
    bind: BindAddr,
}

impl CustomTunnel {
    /// A custom tunnel for `url` reaching local `port` (1 to 65535), bound on `0.0.0.0`.
    pub fn new(url: &str, port: u16) -> Result<Self, TunnelError> {
        let url = url.trim().trim_end_matches('/').to_string();
        if !(url.starts_with("http://") || url.starts_with("https://")) || url.len() < 9 {
            return Err(TunnelError::Config(format!(
                "custom tunnel url {url:?} must be an absolute http:// or https:// URL"
            )));
        }
        if port == 0 {
            return Err(TunnelError::Config(
                "custom tunnel port must be between 1 and 65535 (the port your URL forwards to)"
                    .into(),
            ));
        }
        Ok(CustomTunnel {
            url,
            bind: BindAddr {
                host: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                port,
            },
        })
    }

    /// Binds `host` instead of `0.0.0.0` (e.g. the address your proxy forwards to).
    pub fn with_host(mut self, host: IpAddr) -> Self {
        self.bind.host = host;
        self
    }

    /// The public URL (no trailing slash).
    pub fn url(&self) -> &str {
        &self.url
    }
}

#[async_trait]
impl Tunnel for CustomTunnel {
    fn kind(&self) -> &'static str {
        "custom"
    }

    fn bind_addr(&self) -> BindAddr {
        self.bind
    }

    async fn expose(&self, port: u16) -> Result<Arc<dyn Endpoint>, Error> {
        if port != self.bind.port {
            return Err(TunnelError::Config(format!(
                "custom tunnel: the server is on port {port} but {} forwards to port {}; \
                 bind the tunnel's bind_addr()",
                self.url, self.bind.port
            ))
            .into());
        }
        if !self.bind.host.is_loopback() {
            tracing::warn!(
                host = %self.bind.host,
                port,
                url = %self.url,
                "custom tunnel: the interception port is plaintext HTTP guarded only by \
                 per-rollout secrets; put a TLS proxy or a firewall in front of it on \
                 untrusted networks"
            );
        }
        Ok(Arc::new(StaticEndpoint {
            url: self.url.clone(),
        }))
    }
}

/// An endpoint whose URL never changes and which nothing tears down.
#[derive(Debug, Clone)]
pub struct StaticEndpoint {
    url: String,
}

impl StaticEndpoint {
    /// An endpoint for a fixed URL (a trailing `/` is removed).
    pub fn new(url: &str) -> Self {
        StaticEndpoint {
            url: url.trim_end_matches('/').to_string(),
        }
    }
}

#[async_trait]
impl Endpoint for StaticEndpoint {
    fn url(&self) -> String {
        self.url.clone()
    }

    /// Always healthy: intercept cannot see what runs in front of the port.
    async fn health(&self) -> Health {
        Health::Healthy
    }

    async fn teardown(&self) -> Result<(), Error> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn url_is_normalised_and_validated() {
        let t = CustomTunnel::new("https://proxy.example.com/base//", 8080).unwrap();
        assert_eq!(t.url(), "https://proxy.example.com/base");
        assert_eq!(t.kind(), "custom");
        assert_eq!(
            t.bind_addr(),
            BindAddr {
                host: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                port: 8080
            }
        );
        let err = CustomTunnel::new("proxy.example.com", 8080).unwrap_err();
        assert!(err.to_string().contains("http://"), "{err}");
        let err = CustomTunnel::new("http://x.example", 0).unwrap_err();
        assert!(err.to_string().contains("65535"), "{err}");
    }

    #[tokio::test]
    async fn expose_returns_the_url_and_the_server_is_reachable_on_the_bind_addr() {
        // Pick a free loopback port, then configure the tunnel with it.
        let probe = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let tunnel = CustomTunnel::new(&format!("http://127.0.0.1:{port}/"), port)
            .unwrap()
            .with_host(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let bind = tunnel.bind_addr();
        assert_eq!(bind.host, IpAddr::V4(Ipv4Addr::LOCALHOST));
        let listener = tokio::net::TcpListener::bind((bind.host, bind.port))
            .await
            .unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            s.write_all(b"pong").await.unwrap();
        });
        let endpoint = tunnel.expose(bind.port).await.unwrap();
        let url = endpoint.url();
        assert_eq!(url, format!("http://127.0.0.1:{port}"));
        assert!(endpoint.health().await.is_healthy());
        assert_eq!(endpoint.refresh().await.unwrap(), url);
        let mut c = tokio::net::TcpStream::connect(url.trim_start_matches("http://"))
            .await
            .unwrap();
        let mut buf = Vec::new();
        c.read_to_end(&mut buf).await.unwrap();
        assert_eq!(buf, b"pong");
        server.await.unwrap();
        endpoint.teardown().await.unwrap();
    }

    #[tokio::test]
    async fn expose_on_another_port_is_a_config_error() {
        let tunnel = CustomTunnel::new("http://127.0.0.1:9", 9).unwrap();
        let err = tunnel.expose(10).await.unwrap_err();
        assert_eq!(err.kind(), intercept_core::ErrorKind::Tunnel);
        assert!(!err.retryable());
        assert!(err.to_string().contains("port 10"), "{err}");
    }
}
