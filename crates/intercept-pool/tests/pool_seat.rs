//! `pool_seat`: simulated time to seat N rollouts with multiplex 32 when every server
//! (tunnel) start takes 1 s, for the elastic pool and for a strictly serial
//! grow-under-one-lock baseline (the reference implementation's strategy). Paused tokio
//! time: the figures are simulated seconds, deterministic. Run with
//! `cargo test -p intercept-pool --test pool_seat -- --nocapture` to see them.
//! Only structural invariants are asserted, never timings.

mod support;

use std::sync::Arc;
use std::time::Duration;

use intercept_core::{Error, Interception};
use intercept_pool::{ElasticConfig, ElasticPool};
use support::{session, FakeFactory};
use tokio::task::JoinSet;
use tokio::time::Instant;

const START: Duration = Duration::from_secs(1);
const MULTIPLEX: usize = 32;

/// The baseline: one lock held across the whole acquire, servers created one at a time
/// under it (as verifiers' `ElasticInterceptionPool` does).
#[derive(Debug, Default)]
struct SerialPool {
    servers: tokio::sync::Mutex<Vec<usize>>,
}

impl SerialPool {
    async fn acquire(&self) -> usize {
        let mut servers = self.servers.lock().await;
        let index = match servers.iter().position(|l| *l < MULTIPLEX) {
            Some(i) => i,
            None => {
                tokio::time::sleep(START).await; // create the server + tunnel
                servers.push(0);
                servers.len() - 1
            }
        };
        servers[index] += 1;
        index
    }
}

async fn seat_serial(n: usize) -> (Duration, usize) {
    let pool = Arc::new(SerialPool::default());
    let t = Instant::now();
    let mut set = JoinSet::new();
    for _ in 0..n {
        let pool = pool.clone();
        set.spawn(async move { pool.acquire().await });
    }
    let mut seated = 0;
    while let Some(r) = set.join_next().await {
        r.expect("test setup");
        seated += 1;
    }
    assert_eq!(seated, n);
    let servers = pool.servers.lock().await;
    assert!(servers.iter().all(|l| *l <= MULTIPLEX));
    (t.elapsed(), servers.len())
}

async fn seat_elastic(n: usize, max_concurrent_starts: usize) -> Result<(Duration, usize), Error> {
    let factory = FakeFactory::new(START);
    let pool = Arc::new(ElasticPool::new(
        ElasticConfig {
            multiplex: MULTIPLEX,
            max_servers: 1_000,
            max_concurrent_starts,
            ..ElasticConfig::default()
        },
        factory.clone(),
    )?);
    pool.start().await?;
    let t = Instant::now();
    let mut set = JoinSet::new();
    for i in 0..n {
        let pool = pool.clone();
        set.spawn(async move { pool.acquire(session(format!("r{i}"))).await });
    }
    let mut guards = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        guards.push(r.expect("acquire task")?);
    }
    let elapsed = t.elapsed();
    assert!(pool.servers().iter().all(|s| s.load <= MULTIPLEX));
    let created = pool.created() as usize;
    drop(guards);
    pool.stop().await?;
    Ok((elapsed, created))
}

#[tokio::test(start_paused = true)]
async fn pool_seat() {
    println!("pool_seat: multiplex {MULTIPLEX}, 1 s per server start (simulated seconds)");
    for (n, starts) in [(1_000, 16), (1_000, 32), (10_000, 16)] {
        let (serial, serial_servers) = seat_serial(n).await;
        let (elastic, servers) = seat_elastic(n, starts).await.unwrap();
        let expected = n.div_ceil(MULTIPLEX);
        assert_eq!(serial_servers, expected);
        assert_eq!(
            servers, expected,
            "the burst reserved exactly ceil(N/multiplex)"
        );
        println!(
            "  N={n:>6} max_concurrent_starts={starts:>2}: serial {:>6.1} s, elastic {:>5.1} s, {:>5.1}x faster, {servers} servers",
            serial.as_secs_f64(),
            elastic.as_secs_f64(),
            serial.as_secs_f64() / elastic.as_secs_f64().max(f64::EPSILON),
        );
    }
}
