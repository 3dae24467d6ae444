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
    );
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

    // A server comes back on the same control port: refresh re-mints through the limiter.
    let server = BoreServer::bind(
        format!("127.0.0.1:{control_port}").parse().unwrap(),
        Some("s3cret"),
    )
    .await
    .unwrap();
    let new_url = endpoint.refresh().await.unwrap();
    assert_eq!(endpoint.url(), new_url);
    assert!(endpoint.health().await.is_healthy());
    assert_eq!(
        common::get(&format!("{new_url}/again")).await.unwrap().1,
        "hello /again"
    );
    let starts = std::fs::read_to_string(limiter.path().unwrap()).unwrap();
    assert_eq!(
        starts.lines().count(),
        3,
        "open, failed re-mint, re-mint: {starts}"
    );

    // Teardown closes the tunnel's public port.
    endpoint.teardown().await.unwrap();
    assert!(!endpoint.health().await.is_healthy());
    assert!(common::get(&format!("{new_url}/gone")).await.is_err());
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
