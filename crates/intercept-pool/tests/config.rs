//! Config enums, make_interception and requires_tunnel.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use intercept_core::{Endpoint, Error, ErrorKind, Health, Tunnel};
use intercept_pool::{
    make_interception, requires_tunnel, ElasticConfig, InterceptionConfig, Runtime,
    SharedToolServer, ToolServerConfig, TunnelInputs, TunnelSpec,
};
use serde::{Deserialize, Serialize};
use support::session;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Tunnels minted by [`TestTunnelConfig::Loop`] across the test binary.
static MINTED: AtomicUsize = AtomicUsize::new(0);

/// A stand-in for the tunnel crate's config enum.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum TestTunnelConfig {
    #[default]
    None,
    /// "Exposes" a port as `http://127.0.0.1:<port>`.
    Loop,
}

impl TunnelSpec for TestTunnelConfig {
    fn is_none(&self) -> bool {
        matches!(self, TestTunnelConfig::None)
    }

    fn make(&self) -> Result<Arc<dyn Tunnel>, Error> {
        MINTED.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(LoopTunnel))
    }
}

#[derive(Debug)]
struct LoopTunnel;

#[derive(Debug)]
struct LoopEndpoint(String);

#[async_trait]
impl Tunnel for LoopTunnel {
    fn kind(&self) -> &'static str {
        "loop"
    }

    async fn expose(&self, port: u16) -> Result<Arc<dyn Endpoint>, Error> {
        Ok(Arc::new(LoopEndpoint(format!("http://127.0.0.1:{port}"))))
    }
}

#[async_trait]
impl Endpoint for LoopEndpoint {
    fn url(&self) -> String {
        self.0.clone()
    }

    async fn health(&self) -> Health {
        Health::Healthy
    }

    async fn teardown(&self) -> Result<(), Error> {
        Ok(())
    }
}

fn parse(json: &str) -> InterceptionConfig<TestTunnelConfig> {
    serde_json::from_str(json).expect("test setup")
}

#[test]
fn shapes_parse_from_tagged_json() {
    let c = parse(r#"{"type": "server", "tunnel": {"type": "none"}}"#);
    assert!(matches!(c, InterceptionConfig::Server(ref s) if s.tunnel == TestTunnelConfig::None));
    let c = parse(
        r#"{"type": "static", "servers": [
            {"tunnel": {"type": "loop"}, "listen": "127.0.0.1:0"},
            {"tunnel": {"type": "none"}}]}"#,
    );
    let InterceptionConfig::Static(s) = c else {
        panic!("not static")
    };
    assert_eq!(s.servers.len(), 2);
    assert_eq!(s.servers[0].listen, Some("127.0.0.1:0".parse().unwrap()));
    let c = parse(
        r#"{"type": "elastic", "tunnel": {"type": "loop"}, "multiplex": 8,
            "max_servers": 4, "idle_timeout": 1.5, "wait_timeout": 10}"#,
    );
    let InterceptionConfig::Elastic(e) = c else {
        panic!("not elastic")
    };
    assert_eq!(e.pool.multiplex, 8);
    assert_eq!(e.pool.max_servers, 4);
    assert_eq!(e.pool.idle_timeout, std::time::Duration::from_millis(1_500));
    assert_eq!(e.pool.wait_timeout, std::time::Duration::from_secs(10));
    // Unset knobs keep their defaults.
    assert_eq!(
        e.pool.max_concurrent_starts,
        ElasticConfig::default().max_concurrent_starts
    );
    assert_eq!(e.pool.min_servers, None);
    // Round trip.
    let back = serde_json::to_value(InterceptionConfig::Elastic(e.clone())).unwrap();
    assert_eq!(back["type"], "elastic");
    assert_eq!(back["multiplex"], 8);
    assert_eq!(back["tunnel"]["type"], "loop");

    let err = serde_json::from_str::<InterceptionConfig<TestTunnelConfig>>(
        r#"{"type": "server", "tunnel": {"type": "none"}, "bogus": 1}"#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("bogus"));
    assert!(
        serde_json::from_str::<InterceptionConfig<TestTunnelConfig>>(r#"{"type": "cluster"}"#)
            .is_err()
    );
}

#[test]
fn the_tunnel_crate_config_is_the_default_tunnel_type() {
    let c: InterceptionConfig = serde_json::from_str(
        r#"{"type": "static", "servers": [
            {"tunnel": {"type": "custom", "url": "https://a.example.org/", "port": 8765}},
            {}]}"#,
    )
    .unwrap();
    let InterceptionConfig::Static(s) = &c else {
        panic!("not static")
    };
    assert_eq!(s.servers[0].tunnel.kind(), "custom");
    assert!(!s.servers[0].tunnel.is_none());
    assert_eq!(s.servers[0].tunnel.make().unwrap().kind(), "custom");
    // An omitted tunnel is `none`.
    assert!(s.servers[1].tunnel.is_none());
    assert!(make_interception(&c, false).is_ok());
    let err = make_interception(&c, true).unwrap_err();
    assert!(err.to_string().contains("tunnel is required"), "{err}");
    // The default shape is an elastic pool with default knobs.
    let InterceptionConfig::Elastic(e) =
        InterceptionConfig::<intercept_tunnel::TunnelConfig>::default()
    else {
        panic!("not elastic")
    };
    assert_eq!(e.pool, ElasticConfig::default());
    assert_eq!(e.pool.multiplex, 32);
}

#[test]
fn unknown_elastic_knob_is_refused() {
    let c = parse(r#"{"type": "elastic", "tunnel": {"type": "none"}, "multiplx": 8}"#);
    let err = make_interception(&c, false).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(err.to_string().contains("multiplx"), "{err}");
}

#[test]
fn a_required_tunnel_configured_as_none_is_an_error() {
    for json in [
        r#"{"type": "server", "tunnel": {"type": "none"}}"#,
        r#"{"type": "static", "servers": [{"tunnel": {"type": "none"}}]}"#,
        r#"{"type": "elastic", "tunnel": {"type": "none"}}"#,
    ] {
        let err = make_interception(&parse(json), true).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest, "{json}");
        assert!(err.to_string().contains("tunnel is required"), "{err}");
        // Without the requirement, the same configuration is fine.
        assert!(make_interception(&parse(json), false).is_ok());
    }
    let err = make_interception(&parse(r#"{"type": "static", "servers": []}"#), false).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
}

async fn healthz(base_url: &str) -> bool {
    let addr = base_url.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .expect("test setup");
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("test setup");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("test setup");
    out.starts_with("HTTP/1.1 200")
}

#[tokio::test]
async fn every_shape_serves_through_make_interception() {
    for json in [
        r#"{"type": "server", "tunnel": {"type": "loop"}}"#,
        r#"{"type": "static", "servers": [{"tunnel": {"type": "loop"}}, {"tunnel": {"type": "loop"}}]}"#,
        r#"{"type": "elastic", "tunnel": {"type": "loop"}, "multiplex": 1}"#,
    ] {
        for tunnel in [false, true] {
            let interception = make_interception(&parse(json), tunnel).unwrap();
            interception.start().await.unwrap();
            let a = interception.acquire(session("a")).await.unwrap();
            let b = interception.acquire(session("b")).await.unwrap();
            assert_eq!(interception.load(), 2, "{json}");
            assert!(
                healthz(&a.base_url).await && healthz(&b.base_url).await,
                "{json}"
            );
            drop((a, b));
            interception.stop().await.unwrap();
        }
    }
}

#[tokio::test]
async fn elastic_mints_a_tunnel_per_server_and_warms_one() {
    let config = parse(r#"{"type": "elastic", "tunnel": {"type": "loop"}, "multiplex": 1}"#);
    let before = MINTED.load(Ordering::SeqCst);
    let pool = make_interception(&config, true).unwrap();
    pool.start().await.unwrap();
    let mut guards = Vec::new();
    for i in 0..3 {
        guards.push(pool.acquire(session(format!("r{i}"))).await.unwrap());
    }
    // min_servers defaults to 1 with a tunnel: the warm server took the first session.
    assert!(MINTED.load(Ordering::SeqCst) - before >= 3);
    let urls: std::collections::HashSet<_> = guards.iter().map(|g| g.base_url.clone()).collect();
    assert_eq!(urls.len(), 3);
    drop(guards);
    pool.stop().await.unwrap();
}

#[test]
fn requires_tunnel_follows_the_reference_rules() {
    let local = TunnelInputs {
        harness_is_local: true,
        ..Default::default()
    };
    assert!(!requires_tunnel(&local));
    // 1. a remote harness
    assert!(requires_tunnel(&TunnelInputs::default()));
    // 2. shared servers: only non-external, non-local ones count
    let shared = |runtime, external| TunnelInputs {
        shared_servers: vec![SharedToolServer { runtime, external }],
        ..local.clone()
    };
    assert!(requires_tunnel(&shared(Runtime::Prime, false)));
    assert!(!requires_tunnel(&shared(Runtime::Prime, true)));
    assert!(!requires_tunnel(&shared(Runtime::Docker, false)));
    // 3. task tool servers: skip those with a url and colocated ones
    let tool = |runtime, has_url, colocated| TunnelInputs {
        tool_servers: vec![ToolServerConfig {
            runtime,
            has_url,
            colocated,
        }],
        ..local.clone()
    };
    assert!(requires_tunnel(&tool(Runtime::Modal, false, false)));
    assert!(!requires_tunnel(&tool(Runtime::Modal, true, false)));
    assert!(!requires_tunnel(&tool(Runtime::Modal, false, true)));
    assert!(!requires_tunnel(&tool(Runtime::Subprocess, false, false)));
    assert!(Runtime::Docker.is_local() && !Runtime::Prime.is_local());
}
