//! StaticPool against fake members.

mod support;

use std::sync::Arc;
use std::time::Duration;

use intercept_core::{ErrorKind, Interception};
use intercept_pool::{ServerFactory, StaticPool};
use support::{session, tunnel_down, FakeFactory};
use tokio::task::JoinSet;

/// A static pool of `n` servers, each from its own factory.
fn pool(n: usize) -> (Arc<StaticPool>, Vec<Arc<FakeFactory>>) {
    let factories: Vec<Arc<FakeFactory>> = (0..n)
        .map(|_| FakeFactory::new(Duration::from_millis(10)))
        .collect();
    let dyns: Vec<Arc<dyn ServerFactory>> = factories
        .iter()
        .map(|f| f.clone() as Arc<dyn ServerFactory>)
        .collect();
    (
        Arc::new(StaticPool::new(dyns).expect("test setup")),
        factories,
    )
}

fn server_of(url: &str) -> usize {
    url.trim_start_matches("http://fake-")
        .trim_end_matches(".invalid")
        .parse()
        .expect("test setup")
}

#[tokio::test(start_paused = true)]
async fn acquires_go_to_the_least_loaded_server_ties_taking_turns() {
    let (pool, factories) = pool(3);
    pool.start().await.unwrap();
    let mut guards = Vec::new();
    for i in 0..6 {
        guards.push(pool.acquire(session(format!("r{i}"))).await.unwrap());
    }
    let order: Vec<usize> = guards.iter().map(|g| server_of(&g.base_url)).collect();
    assert_eq!(order, vec![0, 1, 2, 0, 1, 2]);
    assert_eq!(pool.loads(), vec![2, 2, 2]);
    assert_eq!(pool.load(), 6);
    // Free two seats on server 1: the next two acquires go there.
    let freed: Vec<_> = (0..guards.len())
        .rev()
        .filter(|i| server_of(&guards[*i].base_url) == 1)
        .collect();
    for i in freed {
        drop(guards.remove(i));
    }
    assert_eq!(pool.loads(), vec![2, 0, 2]);
    for f in &factories[1..2] {
        assert_eq!(f.members.lock()[0].live(), 0);
    }
    for i in 0..2 {
        let g = pool.acquire(session(format!("again{i}"))).await.unwrap();
        assert_eq!(server_of(&g.base_url), 1);
        guards.push(g);
    }
    assert_eq!(pool.loads(), vec![2, 2, 2]);
    drop(guards);
    assert_eq!(pool.load(), 0);
    pool.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn concurrent_acquires_see_each_others_load() {
    let (pool, factories) = pool(4);
    pool.start().await.unwrap();
    let mut set = JoinSet::new();
    for i in 0..100 {
        let pool = pool.clone();
        set.spawn(async move { pool.acquire(session(format!("r{i}"))).await });
    }
    let mut guards = Vec::new();
    while let Some(r) = set.join_next().await {
        guards.push(r.unwrap().unwrap());
    }
    assert_eq!(pool.loads(), vec![25, 25, 25, 25]);
    for f in &factories {
        assert_eq!(f.members.lock()[0].live(), 25);
    }
    drop(guards);
    pool.stop().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_failed_start_tears_down_the_started_servers() {
    let (pool, factories) = pool(3);
    factories[1].fail_next(1, tunnel_down());
    let err = pool.start().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Tunnel);
    assert_eq!(factories[0].stopped(), vec![0]);
    assert_eq!(factories[2].stopped(), vec![2]);
    let err = pool.acquire(session("a")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict);
}

#[tokio::test(start_paused = true)]
async fn stop_tears_down_newest_first_past_failures() {
    let (pool, factories) = pool(3);
    factories[0].fail_stop_of(0);
    factories[1].fail_stop_of(1);
    pool.start().await.unwrap();
    let g = pool.acquire(session("a")).await.unwrap();
    let err = pool.stop().await.unwrap_err().to_string();
    assert!(err.contains("2 teardowns failed"), "{err}");
    assert!(
        err.contains("server 0") && err.contains("server 1"),
        "{err}"
    );
    // Newest first: 1 is reported before 0.
    assert!(err.find("server 1") < err.find("server 0"), "{err}");
    for (i, f) in factories.iter().enumerate() {
        assert_eq!(f.stopped(), vec![i as u64]);
    }
    drop(g);
    assert_eq!(pool.load(), 0);
}

#[test]
fn an_empty_static_pool_is_refused() {
    let err = StaticPool::new(Vec::new()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidRequest);
    assert!(err.to_string().contains("servers"));
}
