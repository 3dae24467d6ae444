//! Pausing a pool of real servers: every server in step, servers started during a pause
//! start paused, one epoch for the whole pool.

use std::sync::Arc;
use std::time::Duration;

use intercept_core::{Interception, PauseMode, RolloutSession, SessionConfig, Upstream};
use intercept_pool::{
    ElasticConfig, ElasticPool, InterceptionServerFactory, StaticPool, TunnelSource,
};
use intercept_server::ServerConfig;
use intercept_test::MockUpstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn session(id: &str, upstream: &MockUpstream) -> Arc<RolloutSession> {
    Arc::new(RolloutSession::new(SessionConfig::new(
        id,
        "policy",
        Upstream::new(upstream.base_url()),
    )))
}

/// One chat call over a raw connection; returns the status code.
async fn call(base_url: &str, secret: &str) -> u16 {
    let addr = base_url.trim_start_matches("http://");
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {secret}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("read");
    response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn factory() -> Arc<InterceptionServerFactory> {
    Arc::new(InterceptionServerFactory::new(
        ServerConfig::default(),
        TunnelSource::None,
    ))
}

#[tokio::test]
async fn an_elastic_pool_pauses_every_server_and_new_ones_start_paused() {
    let upstream = MockUpstream::start().await.expect("mock");
    let pool = ElasticPool::new(
        ElasticConfig {
            multiplex: 1,
            ..ElasticConfig::default()
        },
        factory(),
    )
    .expect("pool");
    pool.start().await.expect("start");
    let sessions: Vec<_> = (0..3)
        .map(|i| session(&format!("p{i}"), &upstream))
        .collect();
    let mut guards = Vec::new();
    for s in &sessions[..2] {
        guards.push(pool.acquire(s.clone()).await.expect("acquire"));
    }
    let status = pool
        .pause(PauseMode::Reject {
            retry_after: Duration::from_secs(2),
        })
        .await
        .expect("pause");
    assert!(status.paused);
    assert_eq!(status.epoch, 0);
    // A server that comes up during the pause starts paused.
    guards.push(pool.acquire(sessions[2].clone()).await.expect("acquire"));
    assert_eq!(pool.created(), 3);
    for g in &guards {
        assert_eq!(call(&g.base_url, g.model_secret.expose()).await, 429);
    }
    assert_eq!(
        upstream.request_count(),
        0,
        "no call is served during the pause"
    );
    let status = pool.resume().await.expect("resume");
    assert!(!status.paused);
    assert_eq!(status.epoch, 1);
    assert_eq!(pool.pause_status().epoch, 1);
    for g in &guards {
        assert_eq!(call(&g.base_url, g.model_secret.expose()).await, 200);
    }
    for s in &sessions {
        let trace = s.trace();
        assert_eq!(trace.calls.len(), 1);
        assert_eq!(
            trace.calls[0].epoch, 1,
            "every server is in the pool's epoch"
        );
    }
    drop(guards);
    pool.stop().await.expect("stop");
}

#[tokio::test]
async fn a_static_pool_pauses_and_resumes_all_its_servers() {
    let upstream = MockUpstream::start().await.expect("mock");
    let pool = StaticPool::new(vec![factory(), factory()]).expect("pool");
    pool.start().await.expect("start");
    let a = session("s0", &upstream);
    let b = session("s1", &upstream);
    let ga = pool.acquire(a.clone()).await.expect("acquire");
    let gb = pool.acquire(b.clone()).await.expect("acquire");
    assert_ne!(ga.base_url, gb.base_url);
    pool.pause(PauseMode::Reject {
        retry_after: Duration::from_secs(1),
    })
    .await
    .expect("pause");
    assert!(pool.pause_status().paused);
    assert_eq!(call(&ga.base_url, ga.model_secret.expose()).await, 429);
    assert_eq!(call(&gb.base_url, gb.model_secret.expose()).await, 429);
    pool.resume().await.expect("resume");
    assert_eq!(call(&ga.base_url, ga.model_secret.expose()).await, 200);
    assert_eq!(call(&gb.base_url, gb.model_secret.expose()).await, 200);
    assert_eq!(b.trace().calls[0].epoch, 1);
    drop((ga, gb));
    pool.stop().await.expect("stop");
}
