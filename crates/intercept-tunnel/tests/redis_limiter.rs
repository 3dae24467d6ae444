//! The fleet-wide rate limiter against a real `redis-server` (installed by `.ci/run`):
//! separate processes of several "hosts" each never exceed the cap together, as the
//! receiving end counts; a Redis that is down or frozen fails closed, and a Redis that
//! comes back is used again.
//!
//! The fleet's processes are the `limiter_fleet` example, which `cargo test` builds with
//! the tests.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use intercept_test::redis::RedisServer;
use intercept_tunnel::{
    limiter_unavailable_total, LimiterBackend, RateLimit, RateLimiter, TunnelErrorKind,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn fleet_worker() -> PathBuf {
    intercept_test::helper_binary(
        "examples",
        "limiter_fleet",
        &["-p", "intercept-tunnel", "--example", "limiter_fleet"],
        &[
            "crates/intercept-tunnel/examples/limiter_fleet.rs",
            "crates/intercept-tunnel/src/limiter.rs",
            "crates/intercept-tunnel/src/limiter/redis.rs",
        ],
    )
}

fn redis_limit(url: &str, key: &str, rate: u32, window: Duration) -> RateLimit {
    RateLimit {
        rate,
        window,
        max_wait: Duration::from_secs(30),
        margin: Duration::ZERO,
        backend: LimiterBackend::Redis,
        url: Some(url.to_owned()),
        key: Some(key.to_owned()),
        ..RateLimit::default()
    }
}

/// The most arrivals in any half-open window `(t - w, t]`.
fn max_in_any_window(times: &[u64], w: u64) -> usize {
    let mut t = times.to_vec();
    t.sort_unstable();
    (0..t.len())
        .map(|i| t[..=i].iter().filter(|&&s| s + w > t[i]).count())
        .max()
        .unwrap_or(0)
}

/// The provider: notes when each start arrives (ms since `origin`, on its own clock) and
/// answers one byte.
async fn receiver() -> (std::net::SocketAddr, Arc<Mutex<Vec<u64>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let arrivals = Arc::new(Mutex::new(Vec::new()));
    let seen = arrivals.clone();
    let origin = Instant::now();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut byte = [0u8; 1];
                if tcp.read_exact(&mut byte).await.is_ok() {
                    seen.lock()
                        .unwrap()
                        .push(origin.elapsed().as_millis() as u64);
                    let _ = tcp.write_all(b"k").await;
                }
            });
        }
    });
    (addr, arrivals)
}

/// Runs `processes` fleet processes of `hosts` limiters each; returns the arrivals.
async fn run_fleet(
    redis: &RedisServer,
    sharing: &str,
    key: &str,
    (rate, window_ms): (u32, u64),
    (processes, hosts, starts): (usize, usize, usize),
) -> Vec<u64> {
    let (addr, arrivals) = receiver().await;
    let worker = fleet_worker();
    let children: Vec<_> = (0..processes)
        .map(|_| {
            Command::new(&worker)
                .args([&redis.url(), key, sharing])
                .args([rate.to_string(), window_ms.to_string(), "20".into()])
                .args([hosts.to_string(), starts.to_string(), addr.to_string()])
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    for out in outputs {
        assert!(
            out.status.success(),
            "a fleet process failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let arrivals = arrivals.lock().unwrap().clone();
    arrivals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_sharing_one_redis_never_exceeds_the_cap_at_the_receiving_end() {
    const RATE: u32 = 8;
    const WINDOW_MS: u64 = 600;
    const FLEET: (usize, usize, usize) = (4, 3, 4); // processes, hosts each, starts each
    let redis = RedisServer::start().unwrap();
    let total = FLEET.0 * FLEET.1 * FLEET.2;

    let arrivals = run_fleet(&redis, "shared", "fleet:shared", (RATE, WINDOW_MS), FLEET).await;
    assert_eq!(arrivals.len(), total, "every start reached the provider");
    let most = max_in_any_window(&arrivals, WINDOW_MS);
    assert!(
        most <= RATE as usize,
        "the provider saw {most} starts in one {WINDOW_MS} ms window (cap {RATE}): {arrivals:?}"
    );
    // 48 starts at 8 per window: the limiter did hold them back, over at least 5 windows.
    let span = arrivals.iter().max().unwrap() - arrivals.iter().min().unwrap();
    assert!(span >= 5 * WINDOW_MS, "{span} ms for {total} starts");

    // The control: the same fleet with a window per host (what host-local limiters
    // amount to) goes over the cap at once, so the check above can fail.
    let arrivals = run_fleet(&redis, "per-host", "fleet:own", (RATE, WINDOW_MS), FLEET).await;
    assert_eq!(arrivals.len(), total);
    assert!(max_in_any_window(&arrivals, WINDOW_MS) > RATE as usize);

    // Nothing is left behind but the windows themselves, which expire.
    let ttl = redis.command(&["PTTL", "fleet:shared"]).unwrap();
    let ttl: i64 = ttl.trim().trim_start_matches(':').parse().unwrap();
    assert!(ttl > 0, "the window key expires: PTTL {ttl}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_dies_fails_closed_and_is_used_again_when_it_is_back() {
    let redis = RedisServer::start().unwrap();
    let port = redis.port();
    let url = redis.url();
    let limiter = RateLimiter::new(
        &RateLimit {
            timeout: Duration::from_secs(2),
            ..redis_limit(&url, "dies", 2, Duration::from_secs(60))
        },
        "x",
    )
    .unwrap();
    limiter.acquire().await.unwrap().complete().await;
    let hlen = redis.command(&["HLEN", "dies"]).unwrap();
    assert_eq!(hlen.trim(), ":1", "the start is recorded in Redis");

    redis.kill();
    let before = limiter_unavailable_total();
    let started = Instant::now();
    let err = limiter.acquire().await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(err.kind(), TunnelErrorKind::LimiterUnavailable, "{err}");
    let message = err.to_string();
    assert!(message.contains(&url), "{message}");
    assert!(message.contains("no tunnel is started"), "{message}");
    assert!(limiter_unavailable_total() > before);
    let core: intercept_core::Error = err.into();
    assert_eq!(core.status(), 503);

    // The same Redis comes back (empty: nothing was persisted): the limiter reconnects.
    let _back = RedisServer::start_on(port).unwrap();
    let permit = limiter.acquire().await.unwrap();
    assert!(
        permit.waited < Duration::from_secs(1),
        "{:?}",
        permit.waited
    );
    permit.complete().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_fails_closed_within_the_timeout() {
    // Accepts connections and never answers a byte.
    let frozen = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}/", frozen.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((tcp, _)) = frozen.accept().await {
            open.push(tcp);
        }
    });
    let limiter = RateLimiter::new(
        &RateLimit {
            timeout: Duration::from_millis(300),
            ..redis_limit(&url, "frozen", 2, Duration::from_secs(60))
        },
        "x",
    )
    .unwrap();
    for _ in 0..2 {
        let started = Instant::now();
        let err = limiter.acquire().await.unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "bounded by the timeout: {:?}",
            started.elapsed()
        );
        assert_eq!(err.kind(), TunnelErrorKind::LimiterUnavailable, "{err}");
        assert!(err.to_string().contains("did not answer within"), "{err}");
    }
    held.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_window_waits_like_the_file_window() {
    let redis = RedisServer::start().unwrap();
    let limit = redis_limit(&redis.url(), "waits", 2, Duration::from_millis(300));
    let limiter = RateLimiter::new(&limit, "x").unwrap();
    let a = limiter.acquire().await.unwrap();
    let b = limiter.acquire().await.unwrap();
    // A burst within the budget goes out at once (one round trip each).
    assert!(a.waited.max(b.waited) < Duration::from_millis(100));
    // Both in flight: the third start is given no time until one completes.
    let third = tokio::spawn({
        let l = limiter.clone();
        async move { l.acquire().await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(!third.is_finished(), "the whole budget is in flight");
    a.complete().await;
    let c = third.await.unwrap().unwrap();
    // One window after the first start completed (on the Redis clock).
    assert!(c.at_ms >= b.at_ms + 300, "{} vs {}", c.at_ms, b.at_ms);
    assert!(c.waited >= Duration::from_millis(400), "{:?}", c.waited);
    drop(c); // a cancelled start frees its slot as if it completed now
    b.complete().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Beyond the bound it fails fast and reserves nothing.
    let impatient = RateLimiter::new(
        &RateLimit {
            max_wait: Duration::from_millis(100),
            ..limit
        },
        "x",
    )
    .unwrap();
    let started = Instant::now();
    let err = impatient.acquire().await.unwrap_err();
    assert_eq!(err.kind(), TunnelErrorKind::RateLimited, "{err}");
    assert!(started.elapsed() < Duration::from_millis(200));
    let window = redis.command(&["HGETALL", "waits"]).unwrap();
    assert!(
        !window.contains(" -"),
        "no start in flight: the dropped one completed, the refused one reserved nothing: \
         {window:?}"
    );
}
