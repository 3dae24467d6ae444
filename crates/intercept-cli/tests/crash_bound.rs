//! The crash bound of trace files, through the built binary: calls are answered, the
//! process is killed with SIGKILL, and the files must hold whole lines only, every call
//! recorded before the last flush interval, and miss nothing but the latest calls.

// Helpers outside #[test] functions panic on purpose, like the tests themselves.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use http::{Method, StatusCode};
use intercept_mock::harness::HttpClient;
use intercept_test::{MockConfig, MockUpstream};
use intercept_trace::read_trace_file;
use serde_json::{json, Value};

/// The writer's flush interval (`WriterConfig::default`).
const FLUSH: Duration = Duration::from_millis(10);
/// Room for a loaded machine to schedule the writer thread.
const SLACK: Duration = Duration::from_secs(1);
const SESSIONS: usize = 4;

/// One call of session `env`; returns when the harness has the whole answer.
async fn call(http: &HttpClient, env: &Value, text: &str) {
    let r = common::try_chat(http, env, text).await.unwrap();
    assert_eq!(
        r.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&r.body)
    );
}

/// `per_session` calls in each session, the sessions concurrently and each session's
/// calls one after the other, so that a session's sequence numbers follow its calls.
/// Returns, per session, when each call's answer arrived.
async fn calls(
    http: &HttpClient,
    envs: &[(String, Value)],
    first: usize,
    per_session: usize,
) -> HashMap<String, Vec<Instant>> {
    let runs = envs.iter().map(|(id, env)| async move {
        let mut answered = Vec::new();
        for i in first..first + per_session {
            call(http, env, &format!("{id} call {i}")).await;
            answered.push(Instant::now());
        }
        (id.clone(), answered)
    });
    futures_util::future::join_all(runs)
        .await
        .into_iter()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_only_the_lines_of_the_last_flush_interval_and_tears_none() {
    let upstream = MockUpstream::start_with(MockConfig::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut command = common::serve(&upstream.base_url(), "policy");
    command.args(["--trace-dir", dir.path().to_str().unwrap()]);
    let mut serving = common::start(command).await;
    let http = HttpClient::new();
    let mut envs = Vec::new();
    for i in 0..SESSIONS {
        let id = format!("crash-{i}");
        let r = http
            .send(
                Method::POST,
                &format!("{}/v1/sessions", serving.control),
                Some(&serving.token),
                Some(&json!({ "id": id })),
            )
            .await
            .unwrap();
        assert_eq!(r.status, StatusCode::CREATED);
        envs.push((id, r.json().unwrap()["env"].clone()));
    }

    // Calls answered long enough before the crash: all of them must be on disk.
    let settled = 20;
    calls(&http, &envs, 0, settled).await;
    tokio::time::sleep(FLUSH + SLACK).await;
    // Calls answered just before the crash: some may still be queued.
    let recent = 20;
    let answered = calls(&http, &envs, settled, recent).await;
    serving.child.start_kill().unwrap();
    let killed_at = Instant::now();
    let status = tokio::time::timeout(common::WAIT, serving.child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(!status.success(), "{status:?}");

    let mut missing_total = 0;
    for (id, _) in &envs {
        let trace = read_trace_file(&dir.path().join(format!("{id}.jsonl"))).unwrap();
        // Whole lines only (a torn line would be skipped and reported).
        assert!(
            trace.skipped.is_empty(),
            "{id}: torn lines {:?}",
            trace.skipped
        );
        let seqs: Vec<u64> = trace.records.iter().map(|r| r.seq).collect();
        // What is missing is the latest calls, never one before a recorded one.
        let written = seqs.len();
        assert_eq!(
            seqs,
            (0..written as u64).collect::<Vec<_>>(),
            "{id}: records missing before the last one written"
        );
        assert!(
            written >= settled,
            "{id}: only {written} of the {settled} calls answered before the pause were written"
        );
        // Each missing call was answered within the last flush interval (plus slack).
        let times = &answered[id];
        for seq in written..settled + recent {
            let at = times[seq - settled];
            assert!(
                killed_at.duration_since(at) <= FLUSH + SLACK,
                "{id}: call {seq}, answered {:?} before the kill, is not in the file",
                killed_at.duration_since(at)
            );
        }
        missing_total += settled + recent - written;
        for r in &trace.records {
            assert_eq!(&r.session, id);
            assert!(r.response.is_some(), "{id}: {r:?}");
        }
    }
    eprintln!(
        "{missing_total} of {} calls not in the files after SIGKILL",
        SESSIONS * (settled + recent)
    );
}
