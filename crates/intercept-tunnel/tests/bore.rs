//! The bore backend end to end: a real bore server in-process on loopback, a local hyper
//! server exposed through it, requests through the tunnel, death and healing.

// Helpers outside `#[test]` functions unwrap too: this is test code.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use intercept_core::{Endpoint, Tunnel};
use intercept_tunnel::{BoreEndpoint, BoreServer, BoreTunnel, RateLimit, RateLimiter};

#[tokio::test]
async fn request_through_a_real_bore_server_then_death_and_healing() {
    let server = BoreServer::bind("127.0.0.1:0".parse().unwrap(), Some("s3cret"))
        .await
        .unwrap();
    let control_port = server.control_addr().port();
    let app = common::hello_server("hello").await;

    let dir = tempfile::tempdir().unwrap();
    let limiter = RateLimiter::new(
        &RateLimit {
            path: Some(dir.path().join("bore.window")),
            ..RateLimit::default()
        },
        "bore",
    )
    .unwrap();
    let tunnel = BoreTunnel::new("127.0.0.1")
        .with_control_port(control_port)
        .with_secret(Some("s3cret".into()))
        .with_limiter(limiter.clone());
    assert_eq!(tunnel.kind(), "bore");
    let endpoint = BoreEndpoint::open(tunnel, app.port).await.unwrap();
    let url = endpoint.url();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert_ne!(url, format!("http://127.0.0.1:{}", app.port));
    assert!(endpoint.health().await.is_healthy());

    // Several requests through the tunnel, one after another and concurrently.
    assert_eq!(
        common::get(&format!("{url}/v1/models")).await.unwrap(),
        (200, "hello /v1/models".to_string())
    );
    let (url_a, url_b) = (format!("{url}/a"), format!("{url}/b"));
    let (a, b) = tokio::join!(common::get(&url_a), common::get(&url_b));
    assert_eq!(a.unwrap().1, "hello /a");
    assert_eq!(b.unwrap().1, "hello /b");
    assert_eq!(endpoint.refresh().await.unwrap(), url, "healthy: same URL");

    // Stop the bore server: the endpoint notices and reports unhealthy.
    let repairs = endpoint.repairs();
    server.shutdown().await;
    let reason = tokio::time::timeout(Duration::from_secs(10), endpoint.closed())
        .await
        .expect("the endpoint must notice the server going away");
    assert!(reason.contains("bore"), "{reason}");
    let health = endpoint.health().await;
    assert!(!health.is_healthy(), "{health:?}");
    assert!(common::get(&format!("{url}/x")).await.is_err());

    // While the server is down, refresh fails with a retryable tunnel error.
    let err = endpoint.refresh().await.unwrap_err();
    assert!(err.retryable(), "{err}");

    // A server comes back on the same control port: the endpoint repairs itself, with
    // nobody calling refresh, on the same public port: the old URL works again.
    let server = BoreServer::bind(
        format!("127.0.0.1:{control_port}").parse().unwrap(),
        Some("s3cret"),
    )
    .await
    .unwrap();
    wait_repaired(repairs, 1).await;
    assert_eq!(endpoint.url(), url, "repaired in place: same URL");
    assert_eq!(endpoint.moves(), 0);
    assert!(endpoint.health().await.is_healthy());
    assert_eq!(
        common::get(&format!("{url}/again")).await.unwrap().1,
        "hello /again"
    );
    assert_eq!(endpoint.refresh().await.unwrap(), url);
    let starts = std::fs::read_to_string(limiter.path().unwrap()).unwrap();
    assert!(
        starts.lines().count() >= 2,
        "the repair went through the limiter: {starts}"
    );

    // Teardown closes the tunnel's public port.
    endpoint.teardown().await.unwrap();
    assert!(!endpoint.health().await.is_healthy());
    assert!(common::get(&format!("{url}/gone")).await.is_err());
    server.shutdown().await;
}

async fn wait_repaired(mut repairs: tokio::sync::watch::Receiver<u64>, n: u64) {
    tokio::time::timeout(Duration::from_secs(30), repairs.wait_for(|r| *r >= n))
        .await
        .expect("the endpoint must repair itself within 30 s")
        .unwrap();
}

#[tokio::test]
async fn a_taken_port_moves_the_tunnel_to_a_new_url() {
    let server = BoreServer::bind("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let control_port = server.control_addr().port();
    let app = common::hello_server("moved").await;
    let tunnel = BoreTunnel::new("127.0.0.1")
        .with_control_port(control_port)
        .with_repair_backoff(Duration::from_millis(50), Duration::from_millis(200));
    let endpoint = BoreEndpoint::open(tunnel, app.port).await.unwrap();
    let url = endpoint.url();
    let old_port: u16 = url.rsplit(':').next().unwrap().parse().unwrap();
    let repairs = endpoint.repairs();
    server.shutdown().await;
    endpoint.closed().await;
    // Someone else takes the old public port while the server is down.
    let squatter = tokio::net::TcpListener::bind(("127.0.0.1", old_port))
        .await
        .unwrap();
    let server = BoreServer::bind(format!("127.0.0.1:{control_port}").parse().unwrap(), None)
        .await
        .unwrap();
    wait_repaired(repairs, 1).await;
    let new_url = endpoint.url();
    assert_ne!(new_url, url, "the old port is taken: a new endpoint");
    assert_eq!(endpoint.moves(), 1);
    assert_eq!(
        common::get(&format!("{new_url}/y")).await.unwrap().1,
        "moved /y"
    );
    drop(squatter);
    endpoint.teardown().await.unwrap();
    server.shutdown().await;
}

#[tokio::test]
async fn a_frozen_server_is_a_retryable_timeout_not_an_auth_error() {
    // Accepts connections and never says a word (a hung bore server).
    let frozen = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = frozen.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = frozen.accept().await {
            conns.push(c);
        }
    });
    for secret in [Some("s3cret".to_string()), None] {
        let tunnel = BoreTunnel::new("127.0.0.1")
            .with_control_port(port)
            .with_secret(secret.clone());
        let err = BoreEndpoint::open(tunnel, 1).await.unwrap_err();
        assert_eq!(
            err.kind(),
            intercept_tunnel::TunnelErrorKind::Timeout,
            "secret {secret:?}: {err}"
        );
        assert!(err.retryable(), "{err}");
        assert!(err.to_string().contains("does not answer"), "{err}");
    }
    held.abort();
}

#[tokio::test]
async fn a_missing_secret_names_where_to_set_it() {
    let server = BoreServer::bind("127.0.0.1:0".parse().unwrap(), Some("s3cret"))
        .await
        .unwrap();
    let tunnel = BoreTunnel::new("127.0.0.1")
        .with_control_port(server.control_addr().port())
        .with_secret_source("--bore-secret-env");
    let err = BoreEndpoint::open(tunnel, 1).await.unwrap_err();
    assert_eq!(err.kind(), intercept_tunnel::TunnelErrorKind::Rejected);
    assert!(!err.retryable());
    assert!(err.to_string().contains("--bore-secret-env"), "{err}");
    server.shutdown().await;
}

#[tokio::test]
async fn expose_through_the_trait_object() {
    let server = BoreServer::bind("127.0.0.1:0".parse().unwrap(), None)
        .await
        .unwrap();
    let app = common::hello_server("dyn").await;
    let tunnel: std::sync::Arc<dyn Tunnel> = std::sync::Arc::new(
        BoreTunnel::new("127.0.0.1").with_control_port(server.control_addr().port()),
    );
    let endpoint = tunnel.expose(app.port).await.unwrap();
    assert_eq!(
        common::get(&format!("{}/z", endpoint.url()))
            .await
            .unwrap()
            .1,
        "dyn /z"
    );
    // Dropping the endpoint closes the tunnel too.
    let url = endpoint.url();
    drop(endpoint);
    assert!(common::get(&format!("{url}/z")).await.is_err());
}

// Real time, short intervals: under paused time tokio advances the clock past heartbeats
// that are already on their way over loopback, so a tunnel would die of silence anyway.
#[tokio::test]
async fn a_frozen_server_is_noticed_within_the_heartbeat_timeout_and_thaws_in_place() {
    let heartbeat = Duration::from_secs(1);
    let server = BoreServer::bind("127.0.0.1:0".parse().unwrap(), Some("s3cret"))
        .await
        .unwrap();
    let app = common::hello_server("frozen").await;
    let tunnel = BoreTunnel::new("127.0.0.1")
        .with_control_port(server.control_addr().port())
        .with_secret(Some("s3cret".into()))
        .with_heartbeat_timeout(heartbeat)
        .with_connect_timeout(Duration::from_millis(300))
        .with_repair_backoff(Duration::from_millis(50), Duration::from_millis(100));
    let endpoint = BoreEndpoint::open(tunnel, app.port).await.unwrap();
    let url = endpoint.url();
    let repairs = endpoint.repairs();
    // Heartbeats keep it alive past the timeout.
    assert!(
        tokio::time::timeout(heartbeat * 2, endpoint.dead())
            .await
            .is_err(),
        "a live server's tunnel died"
    );
    assert!(endpoint.health().await.is_healthy());

    let frozen_at = tokio::time::Instant::now();
    server.freeze(true);
    tokio::time::timeout(Duration::from_secs(10), endpoint.dead())
        .await
        .expect("a frozen server must be noticed");
    let noticed = frozen_at.elapsed();
    println!("frozen bore server noticed by its endpoint after {noticed:?}");
    assert!(
        noticed <= heartbeat + Duration::from_millis(500),
        "{noticed:?}"
    );
    assert!(!endpoint.health().await.is_healthy());
    // While it stays frozen, a repair is a retryable timeout, not an auth error.
    let err = endpoint.refresh().await.unwrap_err();
    assert!(err.retryable(), "{err}");
    assert!(err.to_string().contains("does not answer"), "{err}");

    // Thawed, the endpoint repairs itself. (On the same URL only if the thawed server
    // has already noticed the old control connection gone and freed its port; else the
    // tunnel moves.)
    server.freeze(false);
    wait_repaired(repairs, 1).await;
    assert!(endpoint.health().await.is_healthy());
    let now = endpoint.url();
    assert!(now == url || endpoint.moves() == 1, "{now} vs {url}");
    assert_eq!(
        common::get(&format!("{now}/again")).await.unwrap().1,
        "frozen /again"
    );
    endpoint.teardown().await.unwrap();
    // Torn down, it stays dead.
    endpoint.dead().await;
    server.shutdown().await;
}
