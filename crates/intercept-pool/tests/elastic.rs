//! ElasticPool against fake members under paused time.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use intercept_core::{Error, ErrorKind, Interception};
use intercept_pool::{ElasticConfig, ElasticPool, ServerPhase, STOP_TIMEOUT};
use support::{session, tunnel_down, FakeFactory};
use tokio::task::JoinSet;
use tokio::time::Instant;

const SEC: Duration = Duration::from_secs(1);

fn config(multiplex: usize) -> ElasticConfig {
    ElasticConfig {
        multiplex,
        min_servers: Some(0),
        ..ElasticConfig::default()
    }
}

fn pool(config: ElasticConfig, factory: &Arc<FakeFactory>) -> Arc<ElasticPool> {
    Arc::new(ElasticPool::new(config, factory.clone()).expect("valid config"))
}

/// Lets spawned tasks run until every one of them is parked.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn burst_of_1000_brings_up_exactly_32_servers() {
    let factory = FakeFactory::new(SEC);
    let pool = pool(config(32), &factory);
    pool.start().await.unwrap();
    let t0 = Instant::now();
    let mut set = JoinSet::new();
    for i in 0..1_000 {
        let pool = pool.clone();
        set.spawn(async move { pool.acquire(session(format!("r{i}"))).await });
    }
    let mut guards = Vec::new();
    while let Some(r) = set.join_next().await {
        guards.push(r.unwrap().unwrap());
    }
    assert_eq!(guards.len(), 1_000);
    assert_eq!(pool.created(), 32);
    assert_eq!(factory.start_calls.load(Ordering::SeqCst), 32);
    let servers = pool.servers();
    assert_eq!(servers.len(), 32);
    // 31 full servers and one with the remaining 8.
    let mut loads: Vec<usize> = servers.iter().map(|s| s.load).collect();
    loads.sort_unstable();
    assert_eq!(loads[0], 8);
    assert!(loads[1..].iter().all(|l| *l == 32));
    for m in factory.members.lock().iter() {
        assert!(m.live() <= 32);
    }
    assert!(factory.max_in_flight.load(Ordering::SeqCst) <= 16);
    // Two waves of 16 concurrent one-second starts.
    assert_eq!(t0.elapsed(), 2 * SEC);
    assert_eq!(pool.load(), 1_000);
    drop(guards);
    assert_eq!(pool.load(), 0);
    pool.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn acquires_that_fit_are_not_delayed_by_a_slow_start() {
    let factory = FakeFactory::new(SEC);
    factory.set_latency(1, Duration::from_secs(100));
    let pool = pool(
        ElasticConfig {
            min_servers: Some(1),
            ..config(32)
        },
        &factory,
    );
    pool.start().await.unwrap();
    // The first acquire waits for the warm server (and starts no second one).
    let mut guards = vec![pool.acquire(session("r0")).await.unwrap()];
    assert_eq!(pool.created(), 1);
    for i in 1..32 {
        let before = Instant::now();
        guards.push(pool.acquire(session(format!("r{i}"))).await.unwrap());
        assert_eq!(Instant::now(), before, "an acquire that fits waited");
    }
    // 8 acquires that do not fit: server 1 starts, slowly, for them.
    let mut set = JoinSet::new();
    for i in 0..8 {
        let pool = pool.clone();
        set.spawn(async move {
            pool.acquire(session(format!("late{i}")))
                .await
                .map(|g| (g, Instant::now()))
        });
    }
    settle().await;
    assert_eq!(pool.waiting(), 8);
    let servers = pool.servers();
    assert_eq!(servers[0].load, 32);
    assert_eq!(servers[1].phase, ServerPhase::Starting);
    // A seat freed on server 0 is taken at once by the oldest waiter, slow start or not.
    let t_release = Instant::now();
    drop(guards.pop());
    let mut at_once = 0;
    let mut after_start = 0;
    while let Some(r) = set.join_next().await {
        let (g, at) = r.unwrap().unwrap();
        if at == t_release {
            at_once += 1;
        } else {
            assert!(at - t_release >= Duration::from_secs(98));
            after_start += 1;
        }
        guards.push(g);
    }
    assert_eq!((at_once, after_start), (1, 7));
    assert_eq!(pool.created(), 2);
    pool.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn ready_server_seats_at_once_while_another_starts() {
    let factory = FakeFactory::new(SEC);
    factory.set_latency(1, Duration::from_secs(600));
    let pool = pool(
        ElasticConfig {
            min_servers: Some(2),
            ..config(4)
        },
        &factory,
    );
    pool.start().await.unwrap();
    let first = pool.acquire(session("a")).await.unwrap();
    let t = Instant::now();
    assert_eq!(t.elapsed(), Duration::ZERO);
    let mut guards = vec![first];
    for i in 0..3 {
        guards.push(pool.acquire(session(format!("b{i}"))).await.unwrap());
    }
    assert_eq!(Instant::now(), t, "seats on the ready server waited");
    assert_eq!(pool.servers()[1].phase, ServerPhase::Starting);
    pool.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn cap_waits_then_fails_naming_the_cap() {
    let factory = FakeFactory::new(SEC);
    let pool = pool(
        ElasticConfig {
            max_servers: 2,
            wait_timeout: Duration::from_secs(30),
            ..config(1)
        },
        &factory,
    );
    pool.start().await.unwrap();
    let a = pool.acquire(session("a")).await.unwrap();
    let _b = pool.acquire(session("b")).await.unwrap();
    assert_eq!(pool.created(), 2);
    let t = Instant::now();
    let err = pool.acquire(session("c")).await.unwrap_err();
    assert_eq!(t.elapsed(), Duration::from_secs(30));
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(err.retryable());
    let msg = err.to_string();
    assert!(msg.contains("max_servers = 2"), "{msg}");
    assert_eq!(pool.waiting(), 0);
    assert_eq!(pool.created(), 2);

    // Within the timeout, a freed seat is handed to the waiter.
    let waiter = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.acquire(session("d")).await })
    };
    settle().await;
    assert_eq!(pool.waiting(), 1);
    drop(a);
    let d = waiter.await.unwrap().unwrap();
    assert_eq!(d.base_url, "http://fake-0.invalid");
    pool.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn warm_up_starts_min_servers_in_the_background() {
    let factory = FakeFactory::new(Duration::from_secs(3));
    let pool = pool(
        ElasticConfig {
            min_servers: Some(2),
            ..config(8)
        },
        &factory,
    );
    let t = Instant::now();
    pool.start().await.unwrap();
    assert_eq!(t.elapsed(), Duration::ZERO, "start waited for the warm-up");
    let servers = pool.servers();
    assert_eq!(servers.len(), 2);
    assert!(servers.iter().all(|s| s.phase == ServerPhase::Starting));
    // An acquire during warm-up waits for a warm server instead of starting another.
    let g = pool.acquire(session("a")).await.unwrap();
    assert_eq!(t.elapsed(), Duration::from_secs(3));
    assert_eq!(pool.created(), 2);
    assert!(pool.servers().iter().all(|s| s.phase == ServerPhase::Ready));
    drop(g);
    pool.stop().await.unwrap();
    assert_eq!(factory.stopped(), vec![1, 0]);
}

#[tokio::test(start_paused = true)]
async fn unhealthy_server_drains_then_is_replaced() {
    let factory = FakeFactory::new(SEC);
    let pool = pool(
        ElasticConfig {
            min_servers: Some(1),
            ..config(2)
        },
        &factory,
    );
    pool.start().await.unwrap();
    let a = pool.acquire(session("a")).await.unwrap();
    assert_eq!(a.base_url, "http://fake-0.invalid");
    factory.member(0).kill();
    pool.maintain().await;
    let servers = pool.servers();
    assert_eq!(servers[0].phase, ServerPhase::Draining);
    // The floor regrows at once.
    assert_eq!(servers[1].phase, ServerPhase::Starting);
    // Introspection: the draining server is listed unhealthy; the starting one is not
    // listed yet.
    let status = Interception::servers(&*pool).await;
    assert_eq!(status.len(), 1, "{status:?}");
    assert!(!status[0].healthy);
    assert_eq!(status[0].load, 1);
    // New sessions go to the new server, never to the draining one.
    let b = pool.acquire(session("b")).await.unwrap();
    assert_eq!(b.base_url, "http://fake-1.invalid");
    settle().await;
    assert!(factory.stopped().is_empty(), "torn down before draining");
    assert_eq!(factory.member(0).live(), 1);
    // The last session ends: the server is torn down.
    drop(a);
    assert_eq!(factory.wait_stopped(1).await, vec![0]);
    settle().await;
    let servers = pool.servers();
    assert_eq!(servers.len(), 1);
    assert_eq!(servers[0].index, 1);
    drop(b);
    pool.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_unhealthy_endpoint_is_repaired_in_place_before_anything_drains() {
    let factory = FakeFactory::new(SEC);
    let pool = pool(
        ElasticConfig {
            min_servers: Some(1),
            ..config(2)
        },
        &factory,
    );
    pool.start().await.unwrap();
    let a = pool.acquire(session("a")).await.unwrap();
    assert_eq!(a.base_url, "http://fake-0.invalid");
    // The endpoint dies (its frpc exited); repairing it brings it back on the same URL.
    let member = factory.member(0);
    member.set_repairable(true);
    member.kill();
    pool.maintain().await;
    assert_eq!(member.repairs.load(Ordering::SeqCst), 1);
    let servers = pool.servers();
    assert_eq!(
        servers.len(),
        1,
        "nothing replaces a repaired server: {servers:?}"
    );
    assert_eq!(servers[0].phase, ServerPhase::Ready);
    assert_eq!(
        factory.start_calls.load(Ordering::SeqCst),
        1,
        "no second registration"
    );
    // The session keeps its seat and its URL; a new one joins it there.
    let b = pool.acquire(session("b")).await.unwrap();
    assert_eq!(b.base_url, "http://fake-0.invalid");
    assert_eq!(member.live(), 2);
    // A healthy endpoint is not touched.
    pool.maintain().await;
    assert_eq!(member.repairs.load(Ordering::SeqCst), 1);
    // Only when the repair fails does the server drain (and the floor regrow).
    member.set_repairable(false);
    member.kill();
    pool.maintain().await;
    assert_eq!(member.repairs.load(Ordering::SeqCst), 2);
    let servers = pool.servers();
    assert_eq!(servers[0].phase, ServerPhase::Draining);
    assert_eq!(servers[1].phase, ServerPhase::Starting);
    drop((a, b));
    assert_eq!(factory.wait_stopped(1).await, vec![0]);
    pool.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn drain_gives_up_after_drain_timeout() {
    let factory = FakeFactory::new(SEC);
    let pool = pool(
        ElasticConfig {
            drain_timeout: Duration::from_secs(120),
            ..config(2)
        },
        &factory,
    );
    pool.start().await.unwrap();
    let _a = pool.acquire(session("a")).await.unwrap();
    factory.member(0).kill();
    let t = Instant::now();
    pool.maintain().await;
    assert_eq!(factory.wait_stopped(1).await, vec![0]);
    assert_eq!(t.elapsed(), Duration::from_secs(120));
    pool.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn health_loop_runs_on_its_own() {
    let factory = FakeFactory::new(SEC);
    let pool = pool(
        ElasticConfig {
            health_interval: Duration::from_secs(10),
            ..config(2)
        },
        &factory,
    );
    pool.start().await.unwrap();
    let a = pool.acquire(session("a")).await.unwrap();
    drop(a);
    factory.member(0).kill();
    let t = Instant::now();
    assert_eq!(factory.wait_stopped(1).await, vec![0]);
    assert!(t.elapsed() <= Duration::from_secs(10));
    pool.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn idle_servers_shrink_newest_first_down_to_the_floor() {
    let factory = FakeFactory::new(SEC);
    let pool = pool(
        ElasticConfig {
            min_servers: Some(1),
            idle_timeout: Duration::from_secs(300),
            ..config(1)
        },
        &factory,
    );
    pool.start().await.unwrap();
    let mut guards = Vec::new();
    for i in 0..3 {
        guards.push(pool.acquire(session(format!("r{i}"))).await.unwrap());
    }
    assert_eq!(pool.created(), 3);
    let t = Instant::now();
    guards.clear();
    assert_eq!(factory.wait_stopped(2).await, vec![2, 1]);
    let idle = t.elapsed();
    assert!(
        idle >= Duration::from_secs(300) && idle <= Duration::from_secs(310),
        "{idle:?}"
    );
    settle().await;
    let servers = pool.servers();
    assert_eq!(servers.len(), 1);
    assert_eq!(servers[0].index, 0);
    // A busy server is never shrunk.
    let g = pool.acquire(session("busy")).await.unwrap();
    let before = factory.stopped().len();
    pool.maintain().await;
    assert_eq!(factory.stopped().len(), before);
    drop(g);
    pool.stop().await.unwrap();
    assert_eq!(factory.stopped(), vec![2, 1, 0]);
}

#[tokio::test(start_paused = true)]
async fn stop_goes_on_past_a_failed_teardown_and_reports_it() {
    let factory = FakeFactory::new(SEC);
    factory.fail_stop_of(1);
    let pool = pool(config(1), &factory);
    pool.start().await.unwrap();
    let mut guards = Vec::new();
    for i in 0..3 {
        guards.push(pool.acquire(session(format!("r{i}"))).await.unwrap());
    }
    let err = pool.stop().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Tunnel);
    assert!(err.to_string().contains("server 1"), "{err}");
    assert_eq!(factory.stopped(), vec![2, 1, 0]);
    // Releasing guards after stop is harmless; acquiring fails clearly.
    drop(guards);
    let err = pool.acquire(session("late")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    // A second stop has nothing left to do.
    pool.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn several_failed_teardowns_are_all_reported() {
    let factory = FakeFactory::new(SEC);
    factory.fail_stop_of(0);
    factory.fail_stop_of(2);
    let pool = pool(config(1), &factory);
    pool.start().await.unwrap();
    let mut guards = Vec::new();
    for i in 0..3 {
        guards.push(pool.acquire(session(format!("r{i}"))).await.unwrap());
    }
    let err = pool.stop().await.unwrap_err().to_string();
    assert!(err.contains("2 teardowns failed"), "{err}");
    assert!(
        err.contains("server 0") && err.contains("server 2"),
        "{err}"
    );
    assert_eq!(factory.stopped(), vec![2, 1, 0]);
}

#[tokio::test(start_paused = true)]
async fn failed_starts_are_retried_with_backoff() {
    let factory = FakeFactory::new(SEC);
    factory.fail_next(2, tunnel_down());
    let pool = pool(config(4), &factory);
    pool.start().await.unwrap();
    let t = Instant::now();
    let g = pool.acquire(session("a")).await.unwrap();
    // Three one-second attempts with 0.5 s and 1 s of backoff between them.
    assert_eq!(t.elapsed(), Duration::from_millis(4_500));
    assert_eq!(factory.start_calls.load(Ordering::SeqCst), 3);
    assert_eq!(pool.created(), 1);
    drop(g);
    pool.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_start_that_keeps_failing_surfaces_the_tunnel_error() {
    let factory = FakeFactory::new(SEC);
    factory.fail_next(4, tunnel_down());
    let pool = pool(config(4), &factory);
    pool.start().await.unwrap();
    let mut set = JoinSet::new();
    for i in 0..3 {
        let pool = pool.clone();
        set.spawn(async move { pool.acquire(session(format!("r{i}"))).await });
    }
    let mut errors = 0;
    while let Some(r) = set.join_next().await {
        let err = r.unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Tunnel);
        assert!(err.to_string().contains("503"));
        errors += 1;
    }
    assert_eq!(errors, 3);
    assert_eq!(factory.start_calls.load(Ordering::SeqCst), 4);
    assert!(pool.servers().is_empty());
    // The pool recovers once the tunnel does.
    let g = pool.acquire(session("later")).await.unwrap();
    assert_eq!(g.base_url, "http://fake-1.invalid");
    drop(g);
    pool.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_non_retryable_start_error_is_surfaced_at_once() {
    let factory = FakeFactory::new(SEC);
    factory.fail_next(
        1,
        Error::Tunnel {
            message: "tunnel registration refused (401): check PRIME_API_KEY".into(),
            retryable: false,
        },
    );
    let pool = pool(config(4), &factory);
    pool.start().await.unwrap();
    let t = Instant::now();
    let err = pool.acquire(session("a")).await.unwrap_err();
    assert_eq!(t.elapsed(), SEC);
    assert!(err.to_string().contains("PRIME_API_KEY"));
    assert_eq!(factory.start_calls.load(Ordering::SeqCst), 1);
    pool.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_acquire_leaves_no_seat_behind() {
    let factory = FakeFactory::new(Duration::from_secs(5));
    let pool = pool(config(2), &factory);
    pool.start().await.unwrap();
    let attempt = tokio::time::timeout(SEC, pool.acquire(session("gave-up"))).await;
    assert!(attempt.is_err());
    assert_eq!(pool.waiting(), 0);
    // The server still comes up (it was already starting) and holds no seat.
    let g = pool.acquire(session("a")).await.unwrap();
    assert_eq!(pool.load(), 1);
    assert_eq!(pool.created(), 1);
    drop(g);
    assert_eq!(pool.load(), 0);
    pool.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn stop_fails_waiters_and_lets_starts_finish_before_teardown() {
    let factory = FakeFactory::new(Duration::from_secs(5));
    let pool = pool(config(2), &factory);
    pool.start().await.unwrap();
    let waiter = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.acquire(session("a")).await })
    };
    settle().await;
    assert_eq!(pool.waiting(), 1);
    pool.stop().await.unwrap();
    let err = waiter.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Cancelled);
    // The server that was starting came up and was torn down, not leaked.
    assert_eq!(factory.stopped(), vec![0]);
    assert!(pool.start().await.is_err(), "a stopped pool cannot restart");
}

#[tokio::test(start_paused = true)]
async fn acquire_before_start_is_refused() {
    let factory = FakeFactory::new(SEC);
    let pool = pool(config(2), &factory);
    let err = pool.acquire(session("a")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
    assert!(err.to_string().contains("start()"));
}

#[test]
fn bad_knobs_are_refused() {
    let factory = FakeFactory::new(SEC);
    for bad in [
        config(0),
        ElasticConfig {
            max_servers: 0,
            ..config(1)
        },
        ElasticConfig {
            min_servers: Some(5),
            max_servers: 2,
            ..config(1)
        },
    ] {
        let err = ElasticPool::new(bad, factory.clone()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    }
}

/// Log lines at WARN and above, captured from this test's thread.
#[derive(Clone, Default)]
struct Warnings(Arc<parking_lot::Mutex<Vec<u8>>>);

impl std::io::Write for Warnings {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Warnings {
    fn capture() -> (Warnings, tracing::subscriber::DefaultGuard) {
        let w = Warnings::default();
        let writer = w.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (w, tracing::subscriber::set_default(subscriber))
    }

    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock())
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

#[tokio::test(start_paused = true)]
async fn while_every_start_fails_rounds_back_off_and_warn_once() {
    let (warnings, _guard) = Warnings::capture();
    let factory = FakeFactory::new(SEC);
    factory.fail_next(100_000, tunnel_down());
    // One attempt per round: without a pause between rounds the pool would start a
    // server every second, 600 in these ten minutes.
    let pool = pool(
        ElasticConfig {
            start_attempts: 1,
            ..config(4)
        },
        &factory,
    );
    pool.start().await.unwrap();
    let t0 = Instant::now();
    let mut failed = 0u64;
    let mut last_half = 0u64;
    // An acquire is always waiting, for ten minutes of (paused) time.
    while t0.elapsed() < Duration::from_secs(600) {
        let err = pool
            .acquire(session(format!("r{failed}")))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Tunnel, "{err}");
        failed += 1;
        if t0.elapsed() >= Duration::from_secs(300) {
            last_half += 1;
        }
    }
    let starts = factory.start_calls.load(Ordering::SeqCst) as u64;
    assert_eq!(pool.failed_start_rounds(), starts, "one attempt per round");
    assert_eq!(failed, starts, "each round fails the acquire it was for");
    // 0.25-0.5 s, 0.5-1 s, ... then 15-30 s (jittered halves of 30 s) between rounds.
    assert!(starts <= 40, "{starts} starts in 10 minutes");
    assert!(
        last_half <= 300 / 16 + 1,
        "{last_half} rounds in the last 5 minutes"
    );
    let elastic_warnings = |w: &Warnings| {
        w.lines()
            .into_iter()
            .filter(|l| l.contains("WARN") && l.contains("elastic pool"))
            .collect::<Vec<_>>()
    };
    // One warning for the first failed start and one as the backoff begins; every later
    // round is logged at debug.
    let during = elastic_warnings(&warnings);
    assert_eq!(during.len(), 2, "{during:#?}");
    assert!(during[1].contains("backing off"), "{during:#?}");
    // The tunnel service is back: the next round seats the acquire, with one warning.
    factory.heal();
    let g = pool.acquire(session("back")).await.unwrap();
    let after = elastic_warnings(&warnings);
    assert_eq!(after.len(), 3, "{after:#?}");
    assert!(after[2].contains("start again"), "{after:#?}");
    drop(g);
    pool.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn stop_tears_every_server_down_at_once_and_abandons_a_hung_teardown() {
    let factory = FakeFactory::new(SEC);
    for i in 0..3 {
        factory.set_stop_latency(i, 10 * SEC);
    }
    // The tunnel API never answers this server's delete.
    factory.set_stop_latency(1, Duration::MAX);
    let pool = pool(config(1), &factory);
    pool.start().await.unwrap();
    let mut guards = Vec::new();
    for i in 0..3 {
        guards.push(pool.acquire(session(format!("r{i}"))).await.unwrap());
    }
    assert_eq!(pool.servers().len(), 3);
    let t = Instant::now();
    let err = pool.stop().await.unwrap_err().to_string();
    // In parallel: the stop lasts as long as the one bound, not 10 + 30 + 10 s.
    assert_eq!(t.elapsed(), STOP_TIMEOUT);
    assert!(
        err.contains("server 1") && err.contains("did not end within"),
        "{err}"
    );
    assert!(
        !err.contains("server 0") && !err.contains("server 2"),
        "{err}"
    );
    let mut stopped = factory.stopped();
    stopped.sort_unstable();
    assert_eq!(stopped, vec![0, 2]);
    drop(guards);
}
