//! The control API in-process: every route and every error.

// Helpers outside #[test] functions panic on purpose, like the tests themselves.
#![allow(clippy::unwrap_used)]

mod common;

use common::control::{error_of, Api};

use http::{Method, StatusCode};
use intercept_cli::config::{ServeConfig, UpstreamSetting};
use intercept_cli::sidecar::Sidecar;
use intercept_core::Secret;
use intercept_trace::read_trace_file;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_and_error() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = Sidecar::start(ServeConfig {
        upstream: Some(UpstreamSetting::Mock),
        trace_dir: Some(dir.path().to_owned()),
        control_token: Some(Secret::new("test-token")),
        ..ServeConfig::default()
    })
    .await
    .unwrap();
    let api = Api::new(&sidecar);
    assert_eq!(api.token, "test-token");
    let ready: Value = serde_json::from_str(&sidecar.ready_line()).unwrap();
    assert_eq!(ready["event"], "ready");
    assert_eq!(ready["control_url"], sidecar.control_url());
    assert_eq!(ready["token"], "test-token");

    // Health needs no token; everything else does.
    let health = api
        .client
        .send(Method::GET, &format!("{}/healthz", api.url), None, None)
        .await
        .unwrap();
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.json().unwrap()["status"], "ok");
    for (token, path) in [
        (None, "/v1/sessions"),
        (Some("wrong"), "/metrics"),
        (Some("test-tokenX"), "/nope"),
    ] {
        let resp = api
            .client
            .send(Method::GET, &format!("{}{path}", api.url), token, None)
            .await
            .unwrap();
        let msg = error_of(&resp, StatusCode::UNAUTHORIZED, "authentication_error");
        assert!(!msg.contains("test-token"), "{msg}");
    }
    let _ = error_of(
        &api.req(Method::POST, "/healthz", None).await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed_error",
    );
    let _ = error_of(
        &api.req(Method::PUT, "/v1/sessions", None).await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed_error",
    );
    let _ = error_of(
        &api.req(Method::GET, "/v2/whatever", None).await,
        StatusCode::NOT_FOUND,
        "not_found_error",
    );

    // Create with a generated id (no body at all).
    let created = api.req(Method::POST, "/v1/sessions", None).await;
    assert_eq!(created.status, StatusCode::CREATED);
    let a = created.json().unwrap();
    let a_id = a["id"].as_str().unwrap().to_owned();
    assert!(!a_id.is_empty());
    assert_eq!(a["base_url"], sidecar.interception_url().await.unwrap());
    assert_eq!(
        a["env"]["OPENAI_BASE_URL"],
        format!("{}/v1", a["base_url"].as_str().unwrap())
    );
    assert_eq!(a["env"]["OPENAI_API_KEY"], a["model_secret"]);
    assert_eq!(a["env"]["ANTHROPIC_BASE_URL"], a["base_url"]);
    assert_eq!(a["env"]["ANTHROPIC_API_KEY"], a["model_secret"]);
    assert_ne!(a["model_secret"], a["state_secret"]);

    // Create with every field.
    let b = api
        .req(
            Method::POST,
            "/v1/sessions",
            Some(
                json!({"id": "rollout-b", "model": "policy-b", "sampling": {"temperature": 0.3},
                "limits": {"max_turns": 1}, "task": {"question": "2+2"}}),
            ),
        )
        .await;
    assert_eq!(
        b.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&b.body)
    );
    let b = b.json().unwrap();
    assert_eq!(b["id"], "rollout-b");

    // Errors of POST /v1/sessions, each naming what is wrong.
    let msg = error_of(
        &api.req(
            Method::POST,
            "/v1/sessions",
            Some(json!({"id": "rollout-b"})),
        )
        .await,
        StatusCode::CONFLICT,
        "conflict_error",
    );
    assert!(msg.contains("rollout-b"), "{msg}");
    for (body, needle) in [
        (json!([1, 2]), "JSON object"),
        (json!({"idd": "x"}), "\"idd\""),
        (json!({"id": "../etc"}), "id:"),
        (json!({"model": 7}), "model:"),
        (json!({"sampling": "hot"}), "sampling:"),
        (json!({"limits": {"max_turns": "many"}}), "limits:"),
        (
            json!({"upstream": {"base_url": "nope"}}),
            "upstream.base_url",
        ),
    ] {
        let msg = error_of(
            &api.req(Method::POST, "/v1/sessions", Some(body.clone()))
                .await,
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        );
        assert!(msg.contains(needle), "{body}: {msg}");
    }
    let raw = api
        .client
        .send(
            Method::POST,
            &format!("{}/v1/sessions", api.url),
            Some("test-token"),
            None,
        )
        .await
        .unwrap();
    assert_eq!(raw.status, StatusCode::CREATED, "an empty body is fine");
    let huge = json!({"task": "x".repeat(intercept_cli::control::BODY_LIMIT + 1)});
    let _ = error_of(
        &api.req(Method::POST, "/v1/sessions", Some(huge)).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large_error",
    );

    // Calls through the returned env land on the trace, in the file, in the metrics.
    let resp = api.chat(&b["env"], "hello").await;
    assert_eq!(resp.status, StatusCode::OK);
    assert_eq!(
        resp.json().unwrap()["choices"][0]["message"]["content"],
        "echo: hello"
    );
    let file = dir.path().join("rollout-b.jsonl");
    // Appended by the writer within its flush interval (10 ms) of the call's end, before
    // any release.
    let waited = tokio::time::Instant::now();
    while read_trace_file(&file).unwrap().records.is_empty() {
        assert!(
            waited.elapsed() < std::time::Duration::from_secs(10),
            "the record was not appended before release"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let on_disk = read_trace_file(&file).unwrap();
    assert_eq!(on_disk.records.len(), 1);
    assert_eq!(on_disk.records[0].model, "policy-b");
    assert_eq!(on_disk.records[0].sampling["temperature"], 0.3);

    let status = api.req(Method::GET, "/v1/sessions/rollout-b", None).await;
    assert_eq!(status.status, StatusCode::OK);
    let status = status.json().unwrap();
    assert_eq!(status["status"], "active");
    assert_eq!(status["calls"], 1);
    assert_eq!(status["usage"]["turns"], 1);
    assert!(status["stop_condition"].is_null());

    // The limit stops the rollout.
    let refused = api.chat(&b["env"], "again").await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    let status = api
        .req(Method::GET, "/v1/sessions/rollout-b", None)
        .await
        .json()
        .unwrap();
    assert_eq!(status["status"], "stopped");
    assert_eq!(status["stop_condition"], "max_turns");

    let trace = api
        .req(Method::GET, "/v1/sessions/rollout-b/trace", None)
        .await;
    assert_eq!(trace.status, StatusCode::OK);
    let trace = trace.json().unwrap();
    assert_eq!(trace["id"], "rollout-b");
    assert_eq!(trace["stop_condition"], "max_turns");
    assert_eq!(trace["calls"].as_array().unwrap().len(), 1);
    assert_eq!(
        trace["calls"][0]["response"]["choices"][0]["message"]["content"],
        "echo: hello"
    );

    let list = api
        .req(Method::GET, "/v1/sessions", None)
        .await
        .json()
        .unwrap();
    let ids: Vec<&str> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"rollout-b") && ids.contains(&a_id.as_str()),
        "{list}"
    );

    let shape = api
        .req(Method::GET, "/v1/interception", None)
        .await
        .json()
        .unwrap();
    assert_eq!(shape["shape"], "server");
    assert_eq!(shape["servers"][0]["base_url"], a["base_url"]);
    assert_eq!(shape["servers"][0]["load"], 3);
    assert_eq!(shape["servers"][0]["healthy"], true);

    let metrics = api.req(Method::GET, "/metrics", None).await;
    assert_eq!(metrics.status, StatusCode::OK);
    assert!(metrics
        .content_type
        .as_deref()
        .unwrap()
        .starts_with("text/plain"));
    let text = String::from_utf8(metrics.body.to_vec()).unwrap();
    assert!(
        text.contains("intercept_calls_total{dialect=\"chat_completions\",status=\"200\"} 1"),
        "{text}"
    );
    assert!(text.contains("intercept_active_sessions 3"), "{text}");
    assert!(
        text.contains("intercept_sessions_created_total 3"),
        "{text}"
    );
    assert!(
        text.contains("intercept_call_duration_seconds_count 1"),
        "{text}"
    );
    assert!(text.contains("intercept_servers 1"), "{text}");

    // The episode: one user message and the sampled answer, named by the record.
    let episode = api
        .req(Method::GET, "/v1/sessions/rollout-b/episode", None)
        .await;
    assert_eq!(episode.status, StatusCode::OK);
    let episode = episode.json().unwrap();
    assert_eq!(episode["session"], "rollout-b");
    assert_eq!(episode["nodes"].as_array().unwrap().len(), 2);
    assert_eq!(episode["nodes"][0]["message"]["role"], "user");
    assert_eq!(episode["nodes"][1]["sampled"], true);
    assert_eq!(episode["nodes"][1]["parent"], 0);
    assert_eq!(episode["branches"][0]["path"], json!([0, 1]));
    assert_eq!(episode["summary"]["sampled"], 1);
    let trace = api
        .req(Method::GET, "/v1/sessions/rollout-b/trace", None)
        .await
        .json()
        .unwrap();
    assert_eq!(trace["calls"][0]["node"], 1);
    let msg = error_of(
        &api.req(Method::DELETE, "/v1/sessions/rollout-b?episode=maybe", None)
            .await,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
    );
    assert!(msg.contains("episode") && msg.contains("maybe"), "{msg}");
    let msg = error_of(
        &api.req(Method::DELETE, "/v1/sessions/rollout-b?trace=1", None)
            .await,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
    );
    assert!(msg.contains("trace"), "{msg}");

    // The log, live: read back from the file (flushed first), the same calls and episode.
    let live_log = api
        .req(Method::GET, "/v1/sessions/rollout-b/trace?format=log", None)
        .await;
    assert_eq!(live_log.status, StatusCode::OK);
    let read = intercept_core::log::LogReader::from_bytes(&live_log.body).unwrap();
    assert_eq!(read.session(), "rollout-b");
    assert!(read.incomplete(), "no end line before the release");
    assert_eq!(read.calls().len(), 1);
    assert_eq!(serde_json::to_value(read.episode()).unwrap(), episode);
    let msg = error_of(
        &api.req(Method::GET, "/v1/sessions/rollout-b/trace?format=xml", None)
            .await,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
    );
    assert!(msg.contains("format") && msg.contains("xml"), "{msg}");

    // Release: the final trace comes back (with the episode, when asked), the secret stops
    // working at once, and the log file ends with its end line (it holds the episode).
    let released = api
        .req(Method::DELETE, "/v1/sessions/rollout-b?episode=true", None)
        .await;
    assert_eq!(released.status, StatusCode::OK);
    let mut released = released.json().unwrap();
    assert_eq!(released["episode"], episode);
    let log = intercept_trace::read_log_file(&dir.path().join("rollout-b.jsonl")).unwrap();
    assert!(!log.incomplete(), "{:?}", log.skipped());
    assert_eq!(serde_json::to_value(log.episode()).unwrap(), episode);
    assert!(!dir.path().join("rollout-b.episode.json").exists());
    released.as_object_mut().unwrap().remove("episode");
    assert_eq!(released["calls"].as_array().unwrap().len(), 1);
    assert_eq!(released["id"], "rollout-b");
    let late = api.chat(&b["env"], "late").await;
    assert_eq!(late.status, StatusCode::CONFLICT);
    let status = api
        .req(Method::GET, "/v1/sessions/rollout-b", None)
        .await
        .json()
        .unwrap();
    assert_eq!(status["status"], "released");
    let again = api
        .req(Method::DELETE, "/v1/sessions/rollout-b", None)
        .await;
    assert_eq!(again.status, StatusCode::OK, "DELETE is idempotent");
    assert_eq!(again.json().unwrap(), released);
    let shape = api
        .req(Method::GET, "/v1/interception", None)
        .await
        .json()
        .unwrap();
    assert_eq!(shape["servers"][0]["load"], 2);

    // Unknown sessions.
    for (method, path) in [
        (Method::GET, "/v1/sessions/ghost"),
        (Method::GET, "/v1/sessions/ghost/trace"),
        (Method::GET, "/v1/sessions/ghost/episode"),
        (Method::DELETE, "/v1/sessions/ghost"),
    ] {
        let msg = error_of(
            &api.req(method, path, None).await,
            StatusCode::NOT_FOUND,
            "not_found_error",
        );
        assert!(msg.contains("ghost"), "{msg}");
    }

    sidecar.shutdown().await.unwrap();
    assert_eq!(read_trace_file(&file).unwrap().records.len(), 1);
    assert!(dir.path().join(format!("{a_id}.jsonl")).exists());
    // Sessions still held at shutdown are released: their logs end with the end line.
    let log = intercept_trace::read_log_file(&dir.path().join(format!("{a_id}.jsonl"))).unwrap();
    assert!(log.end().is_some() && !log.incomplete());
}

#[tokio::test]
async fn sessions_need_an_upstream_and_a_model_without_defaults() {
    let sidecar = Sidecar::start(ServeConfig::default()).await.unwrap();
    let api = Api::new(&sidecar);
    let msg = error_of(
        &api.req(Method::POST, "/v1/sessions", Some(json!({"model": "m"})))
            .await,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
    );
    assert!(msg.starts_with("upstream:"), "{msg}");
    let msg = error_of(
        &api.req(
            Method::POST,
            "/v1/sessions",
            Some(json!({"upstream": {"base_url": "http://127.0.0.1:9/v1"}})),
        )
        .await,
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
    );
    assert!(msg.starts_with("model:"), "{msg}");
    let ok = api
        .req(
            Method::POST,
            "/v1/sessions",
            Some(
                json!({"id": "s", "model": "m", "upstream": {"base_url": "http://127.0.0.1:9/v1"}}),
            ),
        )
        .await;
    assert_eq!(ok.status, StatusCode::CREATED);
    assert_eq!(sidecar.token().expose().len(), 22, "a generated token");
    sidecar.shutdown().await.unwrap();
}

#[tokio::test]
async fn released_sessions_are_forgotten_beyond_the_retention() {
    let sidecar = Sidecar::start(ServeConfig {
        upstream: Some(UpstreamSetting::Mock),
        released_retention: 1,
        ..ServeConfig::default()
    })
    .await
    .unwrap();
    let api = Api::new(&sidecar);
    for id in ["one", "two"] {
        let r = api
            .req(Method::POST, "/v1/sessions", Some(json!({"id": id})))
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
        let r = api
            .req(Method::DELETE, &format!("/v1/sessions/{id}"), None)
            .await;
        assert_eq!(r.status, StatusCode::OK);
    }
    assert_eq!(
        api.req(Method::GET, "/v1/sessions/one", None).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        api.req(Method::GET, "/v1/sessions/two", None).await.status,
        StatusCode::OK
    );
    sidecar.shutdown().await.unwrap();
}

/// One raw HTTP/1.1 exchange, so that the test reads every header the server sent.
async fn raw_exchange(url: &str, request: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        stream.read_to_end(&mut out),
    )
    .await
    .unwrap()
    .unwrap();
    String::from_utf8(out).unwrap().to_ascii_lowercase()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_errors_carry_the_blame_and_retry_headers_of_every_error() {
    let sidecar = Sidecar::start(ServeConfig {
        upstream: Some(UpstreamSetting::Mock),
        control_token: Some(Secret::new("test-token")),
        ..ServeConfig::default()
    })
    .await
    .unwrap();
    let url = sidecar.control_url();
    // No token: 401, the client's to fix, and no retry can change it.
    let unauthorized = raw_exchange(
        &url,
        "GET /v1/sessions HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(unauthorized.starts_with("http/1.1 401"), "{unauthorized}");
    assert!(
        unauthorized.contains("\r\nx-intercept-error: client\r\n"),
        "{unauthorized}"
    );
    assert!(
        unauthorized.contains("\r\nx-should-retry: false\r\n"),
        "{unauthorized}"
    );
    assert!(
        unauthorized.contains("\"type\":\"authentication_error\""),
        "{unauthorized}"
    );
    // An unknown session: 404, same headers, the control API's body.
    let missing = raw_exchange(
        &url,
        "GET /v1/sessions/nope HTTP/1.1\r\nhost: x\r\nauthorization: Bearer test-token\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(missing.starts_with("http/1.1 404"), "{missing}");
    assert!(
        missing.contains("\r\nx-intercept-error: client\r\n"),
        "{missing}"
    );
    assert!(
        missing.contains("\"type\":\"not_found_error\""),
        "{missing}"
    );
    sidecar.shutdown().await.unwrap();
}

/// With a flush interval no test waits for, only the flush points write the queued lines:
/// reading a live trace, `DELETE`, and shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_trace_lines_are_written_before_a_trace_a_release_or_shutdown_answers() {
    let dir = tempfile::tempdir().unwrap();
    let sidecar = Sidecar::start(ServeConfig {
        upstream: Some(UpstreamSetting::Mock),
        trace_dir: Some(dir.path().to_owned()),
        trace_flush: std::time::Duration::from_secs(3600),
        ..ServeConfig::default()
    })
    .await
    .unwrap();
    let api = Api::new(&sidecar);
    let mut envs = Vec::new();
    for id in ["q-live", "q-deleted", "q-held"] {
        let r = api
            .req(Method::POST, "/v1/sessions", Some(json!({ "id": id })))
            .await;
        assert_eq!(r.status, StatusCode::CREATED);
        envs.push((id, r.json().unwrap()["env"].clone()));
    }
    for (id, env) in &envs {
        for i in 0..3 {
            let r = api.chat(env, &format!("{id} {i}")).await;
            assert_eq!(r.status, StatusCode::OK);
        }
    }
    let file = |id: &str| dir.path().join(format!("{id}.jsonl"));
    // Queued, not written: the interval has not passed.
    for (id, _) in &envs {
        assert!(
            read_trace_file(&file(id)).unwrap().records.is_empty(),
            "{id}"
        );
    }
    let metrics =
        String::from_utf8(api.req(Method::GET, "/metrics", None).await.body.to_vec()).unwrap();
    let queued = metrics
        .lines()
        .find_map(|l| l.strip_prefix("intercept_trace_queue_bytes "))
        .unwrap();
    assert_ne!(queued, "0", "{metrics}");

    // A live trace is read back from the file, after the queue is written.
    let trace = api
        .req(Method::GET, "/v1/sessions/q-live/trace", None)
        .await;
    assert_eq!(trace.status, StatusCode::OK);
    let trace = trace.json().unwrap();
    let calls = trace["calls"].as_array().unwrap();
    assert_eq!(calls.len(), 3, "{trace}");
    assert_eq!(
        calls[2]["response"]["choices"][0]["message"]["content"],
        "echo: q-live 2"
    );
    assert_eq!(read_trace_file(&file("q-live")).unwrap().records.len(), 3);

    // More calls, queued again; DELETE answers them all, and the file has them.
    let (_, deleted_env) = &envs[1];
    assert_eq!(api.chat(deleted_env, "late").await.status, StatusCode::OK);
    let held_env = &envs[2].1;
    assert_eq!(api.chat(held_env, "last").await.status, StatusCode::OK);
    let released = api
        .req(Method::DELETE, "/v1/sessions/q-deleted", None)
        .await;
    assert_eq!(released.status, StatusCode::OK);
    assert_eq!(
        released.json().unwrap()["calls"].as_array().unwrap().len(),
        4
    );
    assert_eq!(
        read_trace_file(&file("q-deleted")).unwrap().records.len(),
        4
    );

    // Shutdown writes what a session still held has queued.
    assert_eq!(api.chat(held_env, "after").await.status, StatusCode::OK);
    sidecar.shutdown().await.unwrap();
    let held = read_trace_file(&file("q-held")).unwrap();
    assert_eq!(held.records.len(), 5);
    assert!(held.skipped.is_empty());
}
