//! An elastic pool of real interception servers behind real bore tunnels (the in-process
//! `BoreServer`): a frozen bore server is noticed, and the pool server behind it retired,
//! within the heartbeat timeout plus two connect timeouts, whatever the health round.

// Helpers outside `#[test]` functions unwrap too: this is test code.
#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use intercept_core::{Interception, Tunnel};
use intercept_pool::{
    ElasticConfig, ElasticPool, InterceptionServerFactory, ServerPhase, TunnelSource,
};
use intercept_server::ServerConfig;
use intercept_tunnel::{bore, BoreServer, BoreTunnel};
use support::{session, Watched};
use tokio::time::Instant;

/// The bound with the default settings: the heartbeat timeout, then (the pool woken at
/// once) one repair attempt of the endpoint's own and one of the pool's, each bounded by
/// the connect timeout, whatever `health_interval` is.
#[test]
fn the_default_bound_is_within_20_s() {
    let bound = bore::DEFAULT_HEARTBEAT_TIMEOUT + 2 * bore::DEFAULT_CONNECT_TIMEOUT;
    assert!(bound <= Duration::from_secs(20), "{bound:?}");
    assert_eq!(
        ElasticConfig::default().health_interval,
        Duration::from_secs(10)
    );
}

// Real time with short intervals: under paused time tokio advances the clock past the
// heartbeats already on their way over loopback, so every tunnel would die of silence.
#[tokio::test]
async fn a_frozen_bore_server_is_retired_after_the_heartbeat_not_the_health_round() {
    let heartbeat = Duration::from_secs(1);
    let connect = Duration::from_millis(300);
    let bore = BoreServer::bind("127.0.0.1:0".parse().unwrap(), Some("s3cret"))
        .await
        .unwrap();
    let tunnel: Arc<dyn Tunnel> = Arc::new(
        BoreTunnel::new("127.0.0.1")
            .with_control_port(bore.control_addr().port())
            .with_secret(Some("s3cret".into()))
            .with_heartbeat_timeout(heartbeat)
            .with_connect_timeout(connect),
    );
    let factory = Watched::new(Arc::new(InterceptionServerFactory::new(
        ServerConfig::default(),
        TunnelSource::Shared(tunnel),
    )));
    // The default health round (10 s): far longer than what the test allows.
    let config = ElasticConfig {
        min_servers: Some(1),
        start_attempts: 1,
        ..ElasticConfig::default()
    };
    let pool = ElasticPool::new(config, factory.clone()).unwrap();
    pool.start().await.unwrap();
    let slot = pool.acquire(session("a")).await.unwrap();
    assert!(
        slot.base_url.starts_with("http://127.0.0.1:"),
        "{}",
        slot.base_url
    );
    // The rollout ends; the server stays up (the floor), so retiring it tears it down
    // at once.
    slot.close().await;

    let frozen_at = Instant::now();
    bore.freeze(true);
    let bound = heartbeat + 2 * connect + Duration::from_secs(1);
    tokio::time::timeout(bound * 3, factory.stopping(0))
        .await
        .expect("the pool must retire the server behind a frozen bore server");
    let took = frozen_at.elapsed();
    println!(
        "frozen bore server: pool server retired after {took:?} (heartbeat timeout \
         {heartbeat:?}, connect timeout {connect:?}, health round 10s)"
    );
    assert!(took <= bound, "{took:?}");
    let servers = pool.servers();
    assert!(
        servers
            .iter()
            .all(|s| s.index != 0 || s.phase == ServerPhase::Stopping),
        "{servers:?}"
    );

    bore.freeze(false);
    pool.stop().await.unwrap();
    bore.shutdown().await;
}
