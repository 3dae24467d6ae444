//! Session identity and release through the control API over real HTTP: ids and trace
//! files across runs, concurrent `DELETE`s, and the bound on retained released traces.

// Helpers outside #[test] functions panic on purpose, like the tests themselves.
#![allow(clippy::unwrap_used)]

mod common;

use common::control::{error_of, Api};

use std::time::Duration;

use http::{Method, StatusCode};
use intercept_cli::config::{ServeConfig, UpstreamSetting};
use intercept_cli::sidecar::Sidecar;
use intercept_test::{MockUpstream, Reply};
use intercept_trace::read_trace_file;
use serde_json::json;

async fn mock_sidecar(config: ServeConfig) -> Sidecar {
    Sidecar::start(ServeConfig {
        upstream: Some(UpstreamSetting::Mock),
        ..config
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_runs_on_one_trace_dir_never_mix_rollouts() {
    let dir = tempfile::tempdir().unwrap();
    let config = || ServeConfig {
        trace_dir: Some(dir.path().to_owned()),
        ..ServeConfig::default()
    };

    // First run: a generated id and an explicit one, one call each.
    let first = mock_sidecar(config()).await;
    let api = Api::new(&first);
    let generated = api.create(None).await;
    let first_id = generated["id"].as_str().unwrap().to_owned();
    assert!(first_id.starts_with("session-"), "{first_id}");
    let explicit = api.create(Some(json!({"id": "rollout-x"}))).await;
    assert_eq!(
        api.chat(&generated["env"], "one").await.status,
        StatusCode::OK
    );
    assert_eq!(
        api.chat(&explicit["env"], "one").await.status,
        StatusCode::OK
    );
    first.shutdown().await.unwrap();

    // Second run, same directory.
    let second = mock_sidecar(config()).await;
    let api = Api::new(&second);
    let generated = api.create(None).await;
    let second_id = generated["id"].as_str().unwrap().to_owned();
    assert_ne!(second_id, first_id, "generated ids are unique across runs");
    assert_eq!(
        api.chat(&generated["env"], "two").await.status,
        StatusCode::OK
    );

    // Re-creating the explicit id would append to the first run's file: refused.
    let msg = error_of(
        &api.req(
            Method::POST,
            "/v1/sessions",
            Some(json!({"id": "rollout-x"})),
        )
        .await,
        StatusCode::CONFLICT,
        "conflict_error",
    );
    assert!(
        msg.contains("rollout-x.jsonl") && msg.contains("already exists"),
        "{msg}"
    );
    // The refused id is not a session.
    let _ = error_of(
        &api.req(Method::GET, "/v1/sessions/rollout-x", None).await,
        StatusCode::NOT_FOUND,
        "not_found_error",
    );
    second.shutdown().await.unwrap();

    let old = read_trace_file(&dir.path().join("rollout-x.jsonl")).unwrap();
    assert_eq!(old.records.len(), 1, "the first run's file is untouched");
    for (id, text) in [(&first_id, "one"), (&second_id, "two")] {
        let t = read_trace_file(&dir.path().join(format!("{id}.jsonl"))).unwrap();
        assert_eq!(t.records.len(), 1, "{id}");
        assert_eq!(t.records[0].seq, 0);
        assert_eq!(t.records[0].session, *id);
        assert!(
            serde_json::to_string(&t.records[0].request)
                .unwrap()
                .contains(text),
            "{id}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deletes_both_answer_the_final_trace() {
    let mock = MockUpstream::start().await.unwrap();
    mock.push(Reply::hang());
    let sidecar = Sidecar::start(ServeConfig {
        upstream: Some(UpstreamSetting::Url(mock.base_url())),
        model: Some("policy".into()),
        shutdown_grace: Duration::from_secs(2),
        ..ServeConfig::default()
    })
    .await
    .unwrap();
    let api = Api::new(&sidecar);
    let session = api.create(Some(json!({"id": "r"}))).await;

    // One call in flight, held by the upstream.
    let caller = {
        let api = api.clone();
        let session = session.clone();
        tokio::spawn(async move { api.chat(&session["env"], "in flight").await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while mock.request_count() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the call never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let (a, b) = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::join!(
            api.req(Method::DELETE, "/v1/sessions/r", None),
            api.req(Method::DELETE, "/v1/sessions/r", None)
        )
    })
    .await
    .expect("both DELETEs answer");
    for resp in [&a, &b] {
        assert_eq!(
            resp.status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&resp.body)
        );
    }
    let (a, b) = (a.json().unwrap(), b.json().unwrap());
    assert_eq!(a, b, "both answers are the final trace");
    assert_eq!(a["calls"].as_array().unwrap().len(), 1, "{a}");
    assert!(!a["calls"][0]["error"].is_null(), "the cancelled call: {a}");

    // A third DELETE, later, answers the same.
    let c = api.req(Method::DELETE, "/v1/sessions/r", None).await;
    assert_eq!(c.json().unwrap(), a);
    let caller = tokio::time::timeout(Duration::from_secs(10), caller)
        .await
        .expect("the cancelled call is answered")
        .unwrap();
    // One truth: the harness got 409, the record says 409 twice.
    assert_eq!(caller.status, StatusCode::CONFLICT);
    let record = &a["calls"][0];
    assert_eq!(record["status"], 409, "{record}");
    assert_eq!(record["error"]["status"], 409, "{record}");
    assert_eq!(record["error"]["kind"], "cancelled", "{record}");
    sidecar.shutdown().await.unwrap();
    mock.shutdown().await;
}

/// A call whose request (and echoed answer) carries about `size` bytes.
fn big(size: usize, i: usize) -> String {
    format!("{i}:{}", "x".repeat(size))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_traces_are_bounded_in_bytes_and_read_back_from_files() {
    const BOUND: usize = 300_000;
    const SESSIONS: usize = 24;
    const SIZE: usize = 16_000;

    // Without a trace directory: held in memory up to the bound, oldest dropped first.
    let sidecar = mock_sidecar(ServeConfig {
        released_trace_bytes: BOUND,
        ..ServeConfig::default()
    })
    .await;
    let api = Api::new(&sidecar);
    let mut answers = Vec::new();
    for i in 0..SESSIONS {
        let id = format!("m-{i}");
        let session = api.create(Some(json!({ "id": id }))).await;
        for _ in 0..2 {
            assert_eq!(
                api.chat(&session["env"], &big(SIZE, i)).await.status,
                StatusCode::OK
            );
        }
        let answer = api
            .req(Method::DELETE, &format!("/v1/sessions/{id}"), None)
            .await;
        assert_eq!(answer.status, StatusCode::OK);
        let answer = answer.json().unwrap();
        assert_eq!(answer["calls"].as_array().unwrap().len(), 2);
        answers.push(answer);
        let bytes = api.metric("intercept_released_trace_bytes").await;
        assert!(
            bytes as usize <= BOUND,
            "{bytes} bytes retained after {i} releases"
        );
    }
    assert!(
        api.metric("intercept_released_trace_bytes").await > 0,
        "the newest traces stay readable"
    );
    assert_eq!(
        api.metric("intercept_released_sessions").await,
        SESSIONS as u64
    );
    // The newest trace reads back, the oldest is gone (with a clear 410), its id and
    // status still remembered.
    let newest = api
        .req(
            Method::GET,
            &format!("/v1/sessions/m-{}/trace", SESSIONS - 1),
            None,
        )
        .await;
    assert_eq!(newest.status, StatusCode::OK);
    assert_eq!(newest.json().unwrap(), answers[SESSIONS - 1]);
    let msg = error_of(
        &api.req(Method::GET, "/v1/sessions/m-0/trace", None).await,
        StatusCode::GONE,
        "gone_error",
    );
    assert!(
        msg.contains("released_trace_bytes") && msg.contains("--trace-dir"),
        "{msg}"
    );
    let _ = error_of(
        &api.req(Method::GET, "/v1/sessions/m-0/episode", None).await,
        StatusCode::GONE,
        "gone_error",
    );
    let status = api
        .req(Method::GET, "/v1/sessions/m-0", None)
        .await
        .json()
        .unwrap();
    assert_eq!(status["status"], "released");
    assert_eq!(status["calls"], 2);
    sidecar.shutdown().await.unwrap();

    // With a trace directory nothing is held: traces and episodes read back from files.
    let dir = tempfile::tempdir().unwrap();
    let sidecar = mock_sidecar(ServeConfig {
        released_trace_bytes: BOUND,
        trace_dir: Some(dir.path().to_owned()),
        ..ServeConfig::default()
    })
    .await;
    let api = Api::new(&sidecar);
    let mut answers = Vec::new();
    for i in 0..SESSIONS {
        let id = format!("f-{i}");
        let session = api.create(Some(json!({ "id": id }))).await;
        for _ in 0..2 {
            assert_eq!(
                api.chat(&session["env"], &big(SIZE, i)).await.status,
                StatusCode::OK
            );
        }
        let answer = api
            .req(
                Method::DELETE,
                &format!("/v1/sessions/{id}?episode=true"),
                None,
            )
            .await;
        assert_eq!(answer.status, StatusCode::OK);
        answers.push(answer.json().unwrap());
    }
    assert_eq!(api.metric("intercept_released_trace_bytes").await, 0);
    for (i, answer) in answers.iter().enumerate() {
        let trace = api
            .req(Method::GET, &format!("/v1/sessions/f-{i}/trace"), None)
            .await;
        assert_eq!(trace.status, StatusCode::OK);
        let mut expected = answer.clone();
        let episode = expected.as_object_mut().unwrap().remove("episode").unwrap();
        assert_eq!(trace.json().unwrap(), expected, "f-{i}");
        assert_eq!(expected["calls"].as_array().unwrap().len(), 2);
        let read = api
            .req(Method::GET, &format!("/v1/sessions/f-{i}/episode"), None)
            .await;
        assert_eq!(read.status, StatusCode::OK);
        assert_eq!(read.json().unwrap(), episode, "f-{i}");
    }
    // A trace file removed from under the sidecar is a clear 410, not a 500.
    std::fs::remove_file(dir.path().join("f-0.jsonl")).unwrap();
    let msg = error_of(
        &api.req(Method::GET, "/v1/sessions/f-0/trace", None).await,
        StatusCode::GONE,
        "gone_error",
    );
    assert!(msg.contains("f-0.jsonl"), "{msg}");
    sidecar.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_answers_the_final_trace_even_with_no_retention() {
    let sidecar = mock_sidecar(ServeConfig {
        released_retention: 0,
        ..ServeConfig::default()
    })
    .await;
    let api = Api::new(&sidecar);
    let session = api.create(Some(json!({"id": "once"}))).await;
    assert_eq!(api.chat(&session["env"], "hi").await.status, StatusCode::OK);
    let answer = api.req(Method::DELETE, "/v1/sessions/once", None).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json().unwrap()["calls"].as_array().unwrap().len(), 1);
    // Forgotten at once: the id is unknown now, and nothing is held.
    let _ = error_of(
        &api.req(Method::GET, "/v1/sessions/once", None).await,
        StatusCode::NOT_FOUND,
        "not_found_error",
    );
    assert_eq!(api.metric("intercept_released_sessions").await, 0);
    assert_eq!(api.metric("intercept_released_trace_bytes").await, 0);
    sidecar.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_whose_client_hangs_up_leaves_a_whole_release() {
    let mock = MockUpstream::start().await.unwrap();
    mock.push(Reply::hang());
    let dir = tempfile::tempdir().unwrap();
    let sidecar = Sidecar::start(ServeConfig {
        upstream: Some(UpstreamSetting::Url(mock.base_url())),
        model: Some("policy".into()),
        trace_dir: Some(dir.path().to_owned()),
        shutdown_grace: Duration::from_secs(2),
        ..ServeConfig::default()
    })
    .await
    .unwrap();
    let api = Api::new(&sidecar);
    let session = api.create(Some(json!({"id": "gone"}))).await;
    let caller = {
        let api = api.clone();
        let session = session.clone();
        tokio::spawn(async move { api.chat(&session["env"], "in flight").await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while mock.request_count() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the call never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The client hangs up at once (the release is quick, so this may or may not cut
    // into it); either way the release ends whole: trace, episode, the next answer.
    let _ = tokio::time::timeout(
        Duration::from_millis(1),
        api.req(Method::DELETE, "/v1/sessions/gone", None),
    )
    .await;
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        api.req(Method::DELETE, "/v1/sessions/gone", None),
    )
    .await
    .expect("the DELETE answers");
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.json().unwrap()["calls"].as_array().unwrap().len(), 1);
    let _ = tokio::time::timeout(Duration::from_secs(10), caller).await;
    sidecar.shutdown().await.unwrap();
    assert!(
        intercept_trace::read_log_file(&dir.path().join("gone.jsonl"))
            .unwrap()
            .end()
            .is_some()
    );
    let t = read_trace_file(&dir.path().join("gone.jsonl")).unwrap();
    assert_eq!(t.records.len(), 1);
    mock.shutdown().await;
}
