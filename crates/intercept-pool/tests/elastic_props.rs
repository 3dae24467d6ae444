//! Property test of the real ElasticPool (fake members, paused time): for any sequence of
//! acquire / release / health / start-failure / time events, no server exceeds
//! `multiplex`, every live session is on exactly one live server, and the server count
//! never exceeds `max_servers`.

mod support;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use intercept_core::{Interception, SlotGuard};
use intercept_pool::{ElasticConfig, ElasticPool};
use parking_lot::Mutex;
use proptest::prelude::*;
use support::{session, tunnel_down, FakeFactory};

#[derive(Debug, Clone)]
enum Event {
    Acquire,
    Release(usize),
    Kill(usize),
    FailNextStart,
    Advance(u64),
    Maintain,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        5 => Just(Event::Acquire),
        3 => any::<usize>().prop_map(Event::Release),
        1 => any::<usize>().prop_map(Event::Kill),
        1 => Just(Event::FailNextStart),
        3 => (0u64..40).prop_map(Event::Advance),
        1 => Just(Event::Maintain),
    ]
}

fn server_of(url: &str) -> u64 {
    url.trim_start_matches("http://fake-")
        .trim_end_matches(".invalid")
        .parse()
        .expect("fake url")
}

async fn yield_a_lot() {
    for _ in 0..30 {
        tokio::task::yield_now().await;
    }
}

async fn run(
    events: Vec<Event>,
    multiplex: usize,
    min: usize,
    max: usize,
) -> Result<(), TestCaseError> {
    let factory = FakeFactory::new(Duration::from_secs(1));
    let pool = Arc::new(
        ElasticPool::new(
            ElasticConfig {
                multiplex,
                min_servers: Some(min.min(max)),
                max_servers: max,
                max_concurrent_starts: 2,
                wait_timeout: Duration::from_secs(15),
                idle_timeout: Duration::from_secs(30),
                health_interval: Duration::from_secs(5),
                drain_timeout: Duration::from_secs(20),
                ..ElasticConfig::default()
            },
            factory.clone(),
        )
        .expect("valid"),
    );
    pool.start().await.expect("start");
    let held: Arc<Mutex<HashMap<String, SlotGuard>>> = Arc::default();
    let mut tasks = tokio::task::JoinSet::new();
    let mut next = 0;
    for e in events {
        match e {
            Event::Acquire => {
                let id = format!("s{next}");
                next += 1;
                let pool = pool.clone();
                let held = held.clone();
                tasks.spawn(async move {
                    if let Ok(g) = pool.acquire(session(id.clone())).await {
                        held.lock().insert(id, g);
                    }
                });
            }
            Event::Release(k) => {
                let mut h = held.lock();
                let mut keys: Vec<String> = h.keys().cloned().collect();
                keys.sort();
                if !keys.is_empty() {
                    let g = h.remove(&keys[k % keys.len()]);
                    drop(h);
                    drop(g);
                }
            }
            Event::Kill(k) => {
                let members = factory.members.lock().clone();
                if !members.is_empty() {
                    members[k % members.len()].kill();
                }
            }
            Event::FailNextStart => factory.fail_next(1, tunnel_down()),
            Event::Advance(s) => tokio::time::sleep(Duration::from_secs(s)).await,
            Event::Maintain => pool.maintain().await,
        }
        yield_a_lot().await;

        let servers = pool.servers();
        prop_assert!(
            servers.len() <= max,
            "{} servers > max {}",
            servers.len(),
            max
        );
        for s in &servers {
            prop_assert!(s.load <= multiplex, "server {} load {}", s.index, s.load);
        }
        let members = factory.members.lock().clone();
        let mut seen: HashMap<String, u64> = HashMap::new();
        for m in &members {
            let sessions = m.sessions.lock().clone();
            prop_assert!(sessions.len() <= multiplex);
            if m.stopped.load(Ordering::SeqCst) {
                prop_assert!(sessions.is_empty());
            }
            for id in sessions {
                prop_assert!(
                    seen.insert(id.clone(), m.index).is_none(),
                    "{} on two servers",
                    id
                );
            }
        }
        for (id, g) in held.lock().iter() {
            let server = server_of(&g.base_url);
            let member = members
                .iter()
                .find(|m| m.index == server)
                .expect("member exists");
            if member.stopped.load(Ordering::SeqCst) {
                // Its server was retired after the drain timeout: the session ended.
                prop_assert!(!seen.contains_key(id));
            } else {
                prop_assert_eq!(seen.get(id), Some(&server), "{} not on its server", id);
            }
        }
        // Nothing registered that nobody holds (an acquire in progress holds a seat
        // only until its task stores the guard, which happens without yielding).
        for id in seen.keys() {
            prop_assert!(
                held.lock().contains_key(id),
                "{} registered but not held",
                id
            );
        }
    }
    held.lock().clear();
    pool.stop().await.ok();
    while tasks.join_next().await.is_some() {}
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn elastic_pool_invariants(
        events in proptest::collection::vec(event(), 1..50),
        multiplex in 1usize..4,
        min in 0usize..3,
        max in 1usize..5,
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        rt.block_on(run(events, multiplex, min, max))?;
    }
}
