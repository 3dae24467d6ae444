//! An elastic pool of real interception servers behind Prime tunnels (the mock Prime API
//! of `intercept_test::prime` and the `fake-frpc` binary): a request to a slot's URL goes
//! through the mock's public port and a real frpc process to the server.
//!
//! - A tunnel whose frpc was killed is repaired in place by the pool's maintenance round:
//!   the same registration and the same URL, the server not drained, no new server.
//! - With the API hanging, the pool's stop ends within the per-delete bound (all servers
//!   at once), kills every frpc first and reports every failed delete.

// Helpers outside `#[test]` functions unwrap too: this is test code.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use async_trait::async_trait;
use intercept_core::{BindAddr, Endpoint, Error, Interception, Tunnel};
use intercept_pool::{
    ElasticConfig, ElasticPool, InterceptionServerFactory, ServerPhase, TunnelSource,
};
use intercept_server::ServerConfig;
use intercept_test::prime::{fake_frpc, MockPrime};
use intercept_test::process::{exits_soon, kill9};
use intercept_tunnel::prime::PrimeEnv;
use intercept_tunnel::{PrimeConfig, PrimeEndpoint, PrimeTunnel, RateLimit};
use parking_lot::Mutex;
use support::session;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const KEY: &str = "test-api-key";

/// The Prime backend, keeping every endpoint it opens so the test can reach its frpc.
#[derive(Debug)]
struct Kept {
    inner: PrimeTunnel,
    endpoints: Mutex<Vec<Arc<PrimeEndpoint>>>,
}

#[async_trait]
impl Tunnel for Kept {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn bind_addr(&self) -> BindAddr {
        self.inner.bind_addr()
    }

    async fn expose(&self, port: u16) -> Result<Arc<dyn Endpoint>, Error> {
        let endpoint = Arc::new(self.inner.open(port).await?);
        self.endpoints.lock().push(endpoint.clone());
        Ok(endpoint)
    }
}

/// The status line of `GET /healthz` at `base_url` (`http://host:port`), bounded to 10 s.
async fn healthz(base_url: &str) -> String {
    let addr = base_url.trim_start_matches("http://").to_owned();
    let get = async move {
        let mut stream = TcpStream::connect(&addr).await.ok()?;
        let head = format!("GET /healthz HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
        stream.write_all(head.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        Some(response.lines().next().unwrap_or_default().to_owned())
    };
    tokio::time::timeout(Duration::from_secs(10), get)
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| "no answer".into())
}

struct Fixture {
    mock: MockPrime,
    _home: tempfile::TempDir,
    tunnel: Arc<Kept>,
    pool: Arc<ElasticPool>,
}

async fn fixture() -> Fixture {
    let mock = MockPrime::start(KEY).await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let env = PrimeEnv::with_home(home.path())
        .var("PRIME_API_KEY", KEY)
        .var("PRIME_API_BASE_URL", &mock.base_url());
    let config = PrimeConfig {
        frpc_path: Some(fake_frpc()),
        connection_timeout: Duration::from_secs(20),
        initial_backoff: Duration::from_millis(5),
        api_timeout: Duration::from_secs(10),
        rate_limit: RateLimit {
            path: Some(home.path().join("limiter.window")),
            ..RateLimit::default()
        },
        ..PrimeConfig::default()
    };
    let tunnel = Arc::new(Kept {
        inner: PrimeTunnel::with_env(config, env).unwrap(),
        endpoints: Mutex::new(Vec::new()),
    });
    let factory = InterceptionServerFactory::new(
        ServerConfig::default(),
        TunnelSource::Shared(tunnel.clone()),
    );
    let pool = Arc::new(
        ElasticPool::new(
            ElasticConfig {
                multiplex: 1,
                min_servers: Some(0),
                // Maintenance rounds are run by the test, not by the clock.
                health_interval: Duration::from_secs(3600),
                ..ElasticConfig::default()
            },
            Arc::new(factory),
        )
        .unwrap(),
    );
    pool.start().await.unwrap();
    Fixture {
        mock,
        _home: home,
        tunnel,
        pool,
    }
}

#[tokio::test]
async fn a_tunnel_whose_frpc_died_is_repaired_in_place_by_the_pool() {
    let f = fixture().await;
    let slot = f.pool.acquire(session("a")).await.unwrap();
    assert_eq!(healthz(&slot.base_url).await, "HTTP/1.1 200 OK");
    let endpoint = f.tunnel.endpoints.lock()[0].clone();
    assert_eq!(endpoint.url(), slot.base_url);
    let pid = endpoint.frpc_pid().await.unwrap();
    kill9(pid);
    tokio::time::timeout(Duration::from_secs(10), endpoint.frpc_exited())
        .await
        .unwrap();
    // The endpoint knows itself dead (`Endpoint::dead`) and wakes the pool, whose round
    // may already be restarting frpc; a round run now waits for that repair or makes it.
    f.pool.maintain().await;

    let servers = f.pool.servers();
    assert_eq!(servers.len(), 1, "nothing replaced the server: {servers:?}");
    assert_eq!(servers[0].phase, ServerPhase::Ready);
    assert_eq!(f.pool.created(), 1);
    assert_eq!(
        f.mock.count("POST", "/api/v1/tunnel"),
        1,
        "the same registration, no second one"
    );
    let restarted = endpoint.frpc_pid().await.unwrap();
    assert_ne!(restarted, pid, "a new frpc");
    // The session's URL works again, and the server takes new sessions.
    assert_eq!(endpoint.url(), slot.base_url);
    assert_eq!(healthz(&slot.base_url).await, "HTTP/1.1 200 OK");
    let status = Interception::servers(&*f.pool).await;
    assert!(status[0].healthy, "{status:?}");
    slot.close().await;
    f.pool.stop().await.unwrap();
    assert!(exits_soon(restarted).await);
    f.mock.shutdown().await;
}

#[tokio::test]
async fn with_the_api_hanging_the_pool_stops_within_the_delete_bound() {
    let f = fixture().await;
    let mut slots = Vec::new();
    for i in 0..3 {
        slots.push(f.pool.acquire(session(format!("r{i}"))).await.unwrap());
    }
    let endpoints = f.tunnel.endpoints.lock().clone();
    assert_eq!(endpoints.len(), 3);
    let mut pids = Vec::new();
    for e in &endpoints {
        pids.push(e.frpc_pid().await.unwrap());
    }
    f.mock.freeze(true);
    let t = Instant::now();
    let err = f
        .pool
        .stop()
        .await
        .expect_err("deletes that never answered are reported")
        .to_string();
    let took = t.elapsed();
    // Each delete is bounded to 5 s and all three run at once: one bound, not three
    // (and not the three 30 s attempts of an unbounded client).
    assert!(took >= Duration::from_secs(5), "{took:?}");
    assert!(took < Duration::from_secs(12), "{took:?}");
    assert!(err.contains("3 teardowns failed"), "{err}");
    for pid in pids {
        assert!(exits_soon(pid).await, "frpc {pid} outlived the stop");
    }
    assert_eq!(
        f.mock.count("DELETE", "/api/v1/tunnel/"),
        3,
        "one delete per tunnel"
    );
    drop(slots);
    f.mock.shutdown().await;
}

#[tokio::test]
async fn a_tunnel_a_harness_reports_reaped_is_re_minted_at_once_not_at_the_next_round() {
    // The health round is an hour away (the fixture's): only the report can trigger this.
    let f = fixture().await;
    let slot = f.pool.acquire(session("a")).await.unwrap();
    let endpoint = f.tunnel.endpoints.lock()[0].clone();
    let old_id = endpoint.tunnel_id().await.unwrap();
    assert_eq!(healthz(&slot.base_url).await, "HTTP/1.1 200 OK");

    f.mock.reap(&old_id);
    assert_eq!(healthz(&slot.base_url).await, "HTTP/1.1 404 Not Found");
    assert!(!slot.report_tunnel_failure("the harness exited with status 1"));
    assert!(slot.report_tunnel_failure(
        "openai.NotFoundError: Error code: 404 - Tunnel not found or no longer active"
    ));
    let re_minted = f
        .mock
        .wait_until(Duration::from_secs(30), |m| {
            m.tunnels().get(&old_id).is_some_and(|t| t.deleted) && m.live_tunnels().len() == 1
        })
        .await;
    assert!(re_minted, "{:?}", f.mock.tunnels());
    // The re-mint holds the endpoint's lock until the new URL is set: once it is free,
    // the slot learns that its URL is gone, and the server behind it takes new rollouts
    // at its new URL.
    assert_ne!(endpoint.tunnel_id().await.unwrap(), old_id);
    assert!(slot.endpoint_lost());
    assert_eq!(f.pool.created(), 1, "healed in place: no second server");
    let old_url = slot.base_url.clone();
    slot.close().await;
    let next = f.pool.acquire(session("b")).await.unwrap();
    assert_ne!(next.base_url, old_url);
    assert_eq!(healthz(&next.base_url).await, "HTTP/1.1 200 OK");
    next.close().await;
    f.pool.stop().await.unwrap();
    f.mock.shutdown().await;
}
