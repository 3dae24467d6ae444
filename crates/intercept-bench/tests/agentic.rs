//! The agent-shaped load through a real server over real HTTP: every call answered and
//! recorded, each rollout one unbranched conversation in its session's graph, and the
//! per-turn CPU figures filled.

// Measuring programs: they time real work on the process's clock, in and out of
// runtimes.
#![allow(clippy::disallowed_types)]

use std::sync::Arc;
use std::time::Duration;

use intercept_bench::agentic::{self, AgenticConfig};
use intercept_core::{Interception, RolloutSession, Session, SessionConfig, Upstream};
use intercept_server::{InterceptionServer, ServerConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waves_of_tool_loops_are_answered_recorded_and_measured_per_turn() {
    let mock = intercept_test::MockUpstream::start().await.unwrap();
    let server = InterceptionServer::new(ServerConfig::default()).unwrap();
    server.start().await.unwrap();
    let (sessions, turns, waves) = (3, 6, 2);
    let mut guards = Vec::new();
    let mut secrets = Vec::new();
    let mut held = Vec::new();
    for i in 0..sessions * waves {
        let session = Arc::new(RolloutSession::new(SessionConfig::new(
            format!("agent-{i}"),
            "policy",
            Upstream::new(mock.base_url()),
        )));
        let guard = server.acquire(session.clone()).await.unwrap();
        secrets.push(guard.slot().model_secret.expose().to_owned());
        held.push(session);
        guards.push(guard);
    }
    let url = format!("{}/v1/chat/completions", guards[0].slot().base_url);
    let config = AgenticConfig {
        sessions,
        turns,
        max_waves: waves,
        duration: Duration::from_secs(60),
        cpu_pids: vec![std::process::id()],
        ..AgenticConfig::new(url.parse().unwrap(), secrets)
    };
    let r = agentic::run(&config).await.unwrap();
    assert_eq!(
        (r.errors, r.waves, r.rollouts),
        (0, waves, sessions * waves),
        "{r:#?}"
    );
    assert_eq!(r.calls, (sessions * turns * waves) as u64);
    assert!(!r.secrets_reused);
    // ~20 KB of tools and a ~5 KB task at turn 1; each turn adds an answer and ~2 KB.
    assert!(r.request_bytes_first > 20_000.0, "{r:#?}");
    assert!(
        r.request_bytes_last > r.request_bytes_first + 9_000.0,
        "{r:#?}"
    );
    assert_eq!(r.cpu_ns_by_turn.len(), turns);
    assert!(r.cpu_ns_by_turn.iter().all(|c| *c > 0.0), "{r:#?}");
    assert!(r.cpu_growth.is_some_and(|g| g > 0.0));
    for guard in guards {
        guard.close().await;
    }
    for session in &held {
        assert_eq!(session.calls(), turns, "{}", session.id());
        let episode = session.episode();
        // Each turn's prompt extends the last answer: one branch, no duplicated root.
        assert_eq!(
            episode.branches.len(),
            1,
            "{}: {:?}",
            session.id(),
            episode.summary
        );
    }
    server.stop().await.unwrap();
    mock.shutdown().await;
}
