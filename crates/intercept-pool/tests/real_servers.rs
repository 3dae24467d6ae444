//! Pools of real `InterceptionServer`s (no tunnel, and a mock tunnel): an acquired slot's
//! base URL serves HTTP.

mod support;

use std::sync::Arc;

use intercept_core::tunnel::{MockEndpoint, MockTunnel};
use intercept_core::{Health, Interception};
use intercept_pool::{
    ElasticConfig, ElasticPool, InterceptionServerFactory, ServerFactory, StaticPool, TunnelSource,
};
use intercept_server::ServerConfig;
use support::session;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `GET /healthz` on a base URL `http://host:port`; returns the status line.
async fn healthz(base_url: &str) -> String {
    let addr = base_url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(addr).await.expect("test setup");
    stream
        .write_all(
            format!("GET /healthz HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .expect("test setup");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("test setup");
    response.lines().next().unwrap_or_default().to_owned()
}

fn factory() -> Arc<dyn ServerFactory> {
    Arc::new(InterceptionServerFactory::new(
        ServerConfig::default(),
        TunnelSource::None,
    ))
}

#[tokio::test]
async fn static_pool_of_real_servers_serves_http() {
    let pool = StaticPool::new(vec![factory(), factory()]).unwrap();
    assert!(pool.servers().await.is_empty(), "nothing before start");
    pool.start().await.unwrap();
    let a = pool.acquire(session("a")).await.unwrap();
    let b = pool.acquire(session("b")).await.unwrap();
    assert_ne!(a.base_url, b.base_url, "two servers, least-loaded spreads");
    let servers = pool.servers().await;
    assert_eq!(servers.len(), 2);
    for (s, g) in servers.iter().zip([&a, &b]) {
        assert_eq!(s.base_url.as_deref(), Some(g.base_url.as_str()));
        assert_eq!(s.load, 1);
        assert!(s.healthy);
    }
    assert_eq!(Interception::inflight(&pool), 0);
    for g in [&a, &b] {
        assert!(g.base_url.starts_with("http://127.0.0.1:"));
        assert_eq!(healthz(&g.base_url).await, "HTTP/1.1 200 OK");
    }
    assert_eq!(pool.load(), 2);
    a.close().await;
    b.close().await;
    assert_eq!(pool.load(), 0);
    pool.stop().await.unwrap();
    assert!(pool.servers().await.is_empty(), "nothing after stop");
}

#[tokio::test]
async fn elastic_pool_of_real_servers_grows_and_serves_http() {
    let pool = ElasticPool::new(
        ElasticConfig {
            multiplex: 2,
            ..ElasticConfig::default()
        },
        factory(),
    )
    .unwrap();
    pool.start().await.unwrap();
    let mut guards = Vec::new();
    for i in 0..3 {
        guards.push(pool.acquire(session(format!("r{i}"))).await.unwrap());
    }
    assert_eq!(pool.created(), 2);
    assert_eq!(guards[0].base_url, guards[1].base_url);
    assert_ne!(guards[0].base_url, guards[2].base_url);
    let servers = Interception::servers(&pool).await;
    assert_eq!(
        servers
            .iter()
            .map(|s| (s.base_url.clone().unwrap(), s.load, s.healthy))
            .collect::<Vec<_>>(),
        [
            (guards[0].base_url.clone(), 2, true),
            (guards[2].base_url.clone(), 1, true),
        ]
    );
    assert_eq!(Interception::inflight(&pool), 0);
    for g in &guards {
        assert_eq!(healthz(&g.base_url).await, "HTTP/1.1 200 OK");
    }
    let url = guards[2].base_url.clone();
    for g in guards {
        g.close().await;
    }
    pool.stop().await.unwrap();
    assert!(Interception::servers(&pool).await.is_empty());
    assert!(TcpStream::connect(url.trim_start_matches("http://"))
        .await
        .is_err());
}

#[tokio::test]
async fn a_real_server_reports_its_tunnel_endpoint_health() {
    let mut endpoint = MockEndpoint::new();
    endpoint
        .expect_url()
        .return_const("https://t-1.tunnel.invalid".to_owned());
    endpoint
        .expect_health()
        .times(1)
        .returning(|| Health::Unhealthy("frpc exited".into()));
    endpoint.expect_teardown().times(1).returning(|| Ok(()));
    let endpoint = Arc::new(endpoint);
    let mut tunnel = MockTunnel::new();
    tunnel.expect_kind().return_const("mock");
    tunnel.expect_bind_addr().returning(Default::default);
    tunnel
        .expect_expose()
        .times(1)
        .returning(move |_| Ok(endpoint.clone() as Arc<dyn intercept_core::Endpoint>));
    let factory = InterceptionServerFactory::new(
        ServerConfig::default(),
        TunnelSource::Shared(Arc::new(tunnel)),
    );
    let member = factory.start_server(0).await.unwrap();
    assert_eq!(
        member.health().await,
        Health::Unhealthy("frpc exited".into())
    );
    member.stop().await.unwrap();
}
