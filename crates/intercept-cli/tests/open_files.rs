//! The built `intercept serve` binary and its open-file limit (Linux, under `prlimit`
//! from util-linux): it raises its soft limit to the hard one at start, and when it is
//! out of descriptors anyway it backs off and logs once, recovers as connections close,
//! and never answers 500.

// Helpers outside #[test] functions panic on purpose, like the tests themselves.
#![allow(clippy::unwrap_used)]
#![cfg(target_os = "linux")]

mod common;

use common::{Serving, WAIT};
use http::{Method, StatusCode};
use intercept_mock::harness::HttpClient;
use serde_json::{json, Value};
use tokio::net::TcpStream;

/// `prlimit`, or a failure that says how to get it (CI installs util-linux).
fn prlimit() -> &'static str {
    for p in ["/usr/bin/prlimit", "/bin/prlimit"] {
        if std::path::Path::new(p).exists() {
            return p;
        }
    }
    panic!("these tests need `prlimit` (Debian package util-linux)");
}

/// Starts `intercept serve --upstream mock` under `prlimit --nofile=<nofile>`.
async fn serve(nofile: &str, extra: &[&str], trace_dir: &std::path::Path) -> Serving {
    let mut args = vec![
        format!("--nofile={nofile}"),
        env!("CARGO_BIN_EXE_intercept").to_owned(),
        "serve".into(),
        "--upstream".into(),
        "mock".into(),
        "--trace-dir".into(),
        trace_dir.to_str().unwrap().to_owned(),
        "--log".into(),
        "info".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let mut command = tokio::process::Command::new(prlimit());
    command.args(&args).env_clear();
    common::start(command).await
}

/// SIGTERM; the sidecar exits cleanly. Returns its logs.
async fn stop(s: Serving) -> String {
    s.sigterm();
    let exited = s.exit().await;
    assert!(exited.status.success(), "{}", exited.status);
    exited.logs
}

/// The soft and hard "Max open files" of a process.
fn open_file_limits(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let numbers: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (numbers[0], numbers[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_soft_open_file_limit_is_raised_to_the_hard_one() {
    let dir = tempfile::tempdir().unwrap();
    let s = serve("1024:4096", &[], dir.path()).await;
    let pid = s.child.id().unwrap();
    assert_eq!(open_file_limits(pid), (4096, 4096));
    let logs = stop(s).await;
    assert!(logs.contains("raised the open-file limit"), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_the_sidecar_backs_off_recovers_and_never_answers_500() {
    let dir = tempfile::tempdir().unwrap();
    // Soft = hard: nothing to raise. Idle connections are closed after 2 s.
    let s = serve("96:96", &["--header-read-timeout-secs", "2"], dir.path()).await;
    let pid = s.child.id().unwrap();
    assert_eq!(open_file_limits(pid), (96, 96));
    let authority = s.control.trim_start_matches("http://").to_owned();
    // More idle connections than descriptors: the kernel queues what is not accepted.
    let mut idle = Vec::new();
    for _ in 0..150 {
        idle.push(TcpStream::connect(&authority).await.unwrap());
    }
    let http = HttpClient::new();
    // Queued behind the idle ones; answered once the header timeout frees descriptors.
    let created = tokio::time::timeout(
        WAIT,
        http.send(
            Method::POST,
            &format!("{}/v1/sessions", s.control),
            Some(&s.token),
            Some(&json!({"id": "while-exhausted"})),
        ),
    )
    .await
    .expect("session creation answers while descriptors run out")
    .unwrap();
    assert!(
        created.status == StatusCode::CREATED || created.status == StatusCode::SERVICE_UNAVAILABLE,
        "{} {}",
        created.status,
        String::from_utf8_lossy(&created.body)
    );
    drop(idle);
    // Recovered: a session and a model call on it.
    let session = http
        .send(
            Method::POST,
            &format!("{}/v1/sessions", s.control),
            Some(&s.token),
            Some(&json!({"id": "after"})),
        )
        .await
        .unwrap();
    assert_eq!(
        session.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&session.body)
    );
    let session: Value = session.json().unwrap();
    let answer = http
        .send(
            Method::POST,
            &format!(
                "{}/chat/completions",
                session["env"]["OPENAI_BASE_URL"].as_str().unwrap()
            ),
            session["env"]["OPENAI_API_KEY"].as_str(),
            Some(&json!({"model": "x", "messages": [{"role": "user", "content": "hi"}]})),
        )
        .await
        .unwrap();
    assert_eq!(
        answer.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let logs = stop(s).await;
    // One warning per run of failures, not one per failed accept.
    let warnings = logs.matches("cannot accept connections").count();
    assert!(
        (1..10).contains(&warnings),
        "{warnings} accept warnings:\n{logs}"
    );
}
