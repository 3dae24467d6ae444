//! End to end: the built `intercept serve` binary, driven through its control API, with
//! `async-openai` as the harness, then SIGTERM while calls are in flight.

// Helpers outside #[test] functions panic on purpose, like the tests themselves.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequest,
    CreateChatCompletionRequestArgs,
};
use futures_util::StreamExt as _;
use http::{Method, StatusCode};
use intercept_mock::harness::HttpClient;
use intercept_test::{MockConfig, MockUpstream, Reply};
use intercept_trace::read_trace_file;
use serde_json::{json, Value};

use common::WAIT;

/// An `async-openai` client as the harness of `env`, on rustls with ring: async-openai is
/// built without a crypto provider of its own, and takes the process's default.
fn harness(env: &Value) -> async_openai::Client<OpenAIConfig> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    async_openai::Client::with_config(
        OpenAIConfig::new()
            .with_api_base(env["OPENAI_BASE_URL"].as_str().unwrap())
            .with_api_key(env["OPENAI_API_KEY"].as_str().unwrap()),
    )
}

fn request(text: &str) -> CreateChatCompletionRequest {
    CreateChatCompletionRequestArgs::default()
        .model("gpt-4o-mini")
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content(text)
            .build()
            .unwrap()
            .into()])
        .build()
        .unwrap()
}

async fn streamed_text(client: &async_openai::Client<OpenAIConfig>, text: &str) -> String {
    let mut stream = client.chat().create_stream(request(text)).await.unwrap();
    let mut out = String::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        if let Some(c) = chunk.choices.first().and_then(|c| c.delta.content.clone()) {
            out.push_str(&c);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_binary_end_to_end_with_sigterm_in_flight() {
    let upstream = MockUpstream::start_with(MockConfig::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut command = common::serve(&upstream.base_url(), "policy-e2e");
    command
        .args(["--upstream-api-key-env", "E2E_UPSTREAM_KEY"])
        .args(["--trace-dir", dir.path().to_str().unwrap()])
        .args(["--shutdown-grace-secs", "30"])
        .env("E2E_UPSTREAM_KEY", "sk-upstream-e2e")
        .env("INTERCEPT_LOG", "debug");
    let serving = common::start(command).await;
    assert_eq!(serving.ready["event"], "ready");
    let (control, token) = (serving.control.clone(), serving.token.clone());
    assert!(control.starts_with("http://127.0.0.1:"), "{control}");
    let http = HttpClient::new();

    // Two sessions, each with its own harness.
    let mut sessions = Vec::new();
    for id in ["e2e-a", "e2e-b"] {
        let r = http
            .send(
                Method::POST,
                &format!("{control}/v1/sessions"),
                Some(&token),
                Some(&json!({"id": id})),
            )
            .await
            .unwrap();
        assert_eq!(r.status, StatusCode::CREATED);
        sessions.push(r.json().unwrap());
    }
    let mut secrets: Vec<String> = vec![token.clone()];
    for s in &sessions {
        secrets.push(s["model_secret"].as_str().unwrap().to_owned());
        let client = harness(&s["env"]);
        let id = s["id"].as_str().unwrap();
        let resp = client
            .chat()
            .create(request(&format!("hi from {id}")))
            .await
            .unwrap();
        assert_eq!(
            resp.choices[0].message.content.as_deref(),
            Some(format!("echo: hi from {id}").as_str())
        );
        assert_eq!(resp.model, "policy-e2e");
        assert_eq!(
            streamed_text(&client, &format!("stream {id}")).await,
            format!("echo: stream {id}")
        );
    }
    let seen = upstream.requests();
    assert_eq!(seen.len(), 4);
    assert!(seen
        .iter()
        .all(|r| r.header("authorization") == Some("Bearer sk-upstream-e2e")));

    for s in &sessions {
        let id = s["id"].as_str().unwrap();
        let r = http
            .send(
                Method::DELETE,
                &format!("{control}/v1/sessions/{id}"),
                Some(&token),
                None,
            )
            .await
            .unwrap();
        assert_eq!(r.status, StatusCode::OK);
        let trace = r.json().unwrap();
        let calls = trace["calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2, "{id}");
        assert_eq!(calls.iter().filter(|c| c["stream"] == true).count(), 1);
        assert!(calls
            .iter()
            .all(|c| c["session"] == id && c["error"].is_null()));
        let file = read_trace_file(&dir.path().join(format!("{id}.jsonl"))).unwrap();
        assert_eq!(file.records.len(), 2);
        assert!(file.skipped.is_empty());
        // Released: the secret no longer works.
        let late = harness(&s["env"]).chat().create(request("late")).await;
        assert!(late.is_err(), "a released session still answered");
    }

    // SIGTERM while three slow streams are in flight: they finish and are recorded.
    let r = http
        .send(
            Method::POST,
            &format!("{control}/v1/sessions"),
            Some(&token),
            Some(&json!({"id": "e2e-term"})),
        )
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::CREATED);
    let term = r.json().unwrap();
    secrets.push(term["model_secret"].as_str().unwrap().to_owned());
    let answer = "a slow answer that takes a while";
    upstream.push_many((0..3).map(|_| {
        Reply::text(answer)
            .with_chunks(6)
            .with_chunk_delay(Duration::from_millis(60))
    }));
    let before = upstream.request_count();
    let client = harness(&term["env"]);
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { streamed_text(&client, &format!("slow {i}")).await })
        })
        .collect();
    tokio::time::timeout(WAIT, upstream.wait_for_requests(before + 3))
        .await
        .expect("the calls never reached the upstream");
    serving.sigterm();
    for call in calls {
        let text = tokio::time::timeout(WAIT, call)
            .await
            .expect("call hung")
            .unwrap();
        assert_eq!(text, answer);
    }
    let exited = serving.exit().await;
    assert!(exited.status.success(), "exit status {}", exited.status);
    assert_eq!(exited.stdout, "", "stdout holds only the ready line");
    let file = read_trace_file(&dir.path().join("e2e-term.jsonl")).unwrap();
    assert_eq!(file.records.len(), 3);
    assert!(file.skipped.is_empty());
    for r in &file.records {
        assert!(r.is_ok(), "{:?}", r.error);
        assert!(r.stream);
        let response = serde_json::to_value(r.response.as_ref().unwrap()).unwrap();
        assert_eq!(
            response["choices"][0]["message"]["content"], answer,
            "{response}"
        );
    }

    let logs = exited.logs;
    assert!(logs.contains("shutdown signal received"), "{logs}");
    for secret in &secrets {
        assert!(
            !logs.contains(secret.as_str()),
            "a secret leaked into the logs"
        );
    }
    assert!(
        !logs.contains("sk-upstream-e2e"),
        "the upstream key leaked into the logs"
    );
    upstream.shutdown().await;
}

#[tokio::test]
async fn serve_binary_rejects_bad_settings_naming_the_key() {
    for (args, env, needle) in [
        (vec!["serve", "--multiplex", "zero"], vec![], "--multiplex"),
        (
            vec!["serve"],
            vec![("INTERCEPT_TUNNEL", "ngrok")],
            "INTERCEPT_TUNNEL",
        ),
        (
            vec!["serve", "--interception", "elastic", "--tunnel", "bore"],
            vec![],
            "bore_server",
        ),
        (vec!["serve", "--bore-port", "0"], vec![], "--bore-port"),
    ] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_intercept"))
            .args(&args)
            .env_clear()
            .envs(env)
            .output()
            .await
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        assert!(out.stdout.is_empty(), "no ready line on failure");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// Secrets and logs through the built binary: a session may name only the key variables
/// the sidecar allows; an upstream that echoes its key and forges log lines has the key
/// redacted everywhere and its text escaped in the logs; an unknown `INTERCEPT_*`
/// variable is one warning, not a failed start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_binary_keeps_secrets_and_log_lines_its_own() {
    const KEY: &str = "sk-upstream-e2e-secret";
    const FORGED: &str = "2026-12-03T00:00:00.000000Z  INFO intercept: forged";
    let upstream = MockUpstream::start_with(MockConfig::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut command = common::serve(&upstream.base_url(), "policy-e2e");
    command
        .args(["--upstream-api-key-env", "E2E_UPSTREAM_KEY"])
        .args(["--trace-dir", dir.path().to_str().unwrap()])
        .env("E2E_UPSTREAM_KEY", KEY)
        .env("E2E_OTHER_SECRET", "sk-not-for-sessions")
        .env("INTERCEPT_BIN", "/usr/local/bin/intercept");
    let serving = common::start(command).await;
    let (control, token) = (serving.control.clone(), serving.token.clone());
    let http = HttpClient::new();

    // A variable the sidecar does not allow is refused, naming the allowed one.
    let r = http
        .send(
            Method::POST,
            &format!("{control}/v1/sessions"),
            Some(&token),
            Some(&json!({"upstream": {"base_url": upstream.base_url(), "api_key_env": "E2E_OTHER_SECRET"}})),
        )
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert!(
        text.contains("E2E_OTHER_SECRET") && text.contains("allowed: E2E_UPSTREAM_KEY"),
        "{text}"
    );
    assert_eq!(upstream.requests().len(), 0);
    // The allowed one is accepted.
    let r = http
        .send(
            Method::POST,
            &format!("{control}/v1/sessions"),
            Some(&token),
            Some(&json!({"id": "leak", "upstream": {"base_url": upstream.base_url(), "api_key_env": "E2E_UPSTREAM_KEY"}})),
        )
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::CREATED, "{:?}", r.body);
    let session = r.json().unwrap();

    upstream.push(Reply::error(
        401,
        format!("bad key Bearer {KEY}\n{FORGED}\u{0}\u{1b}[2J"),
    ));
    let base = session["env"]["OPENAI_BASE_URL"].as_str().unwrap();
    let secret = session["env"]["OPENAI_API_KEY"].as_str().unwrap();
    let r = http
        .send(
            Method::POST,
            &format!("{base}/chat/completions"),
            Some(secret),
            Some(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})),
        )
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let text = String::from_utf8_lossy(&r.body).into_owned();
    assert!(
        !text.contains(KEY) && text.contains("Bearer <redacted>"),
        "{text}"
    );
    let r = http
        .send(
            Method::DELETE,
            &format!("{control}/v1/sessions/leak"),
            Some(&token),
            None,
        )
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert!(!String::from_utf8_lossy(&r.body).contains(KEY));
    let file = std::fs::read_to_string(dir.path().join("leak.jsonl")).unwrap();
    assert!(file.contains("<redacted>") && !file.contains(KEY), "{file}");

    serving.sigterm();
    let exited = serving.exit().await;
    assert!(exited.status.success(), "exit status {}", exited.status);
    let logs = exited.logs;
    assert!(
        logs.contains("INTERCEPT_BIN") && logs.contains("did you mean INTERCEPT_"),
        "{logs}"
    );
    assert_eq!(logs.matches("INTERCEPT_BIN").count(), 1, "{logs}");
    assert!(logs.contains("model call failed"), "{logs}");
    assert!(
        !logs.contains(KEY),
        "the upstream key leaked into the logs: {logs}"
    );
    for line in logs.lines() {
        assert!(
            !line.starts_with("2026-12-03T00:00:00"),
            "forged line: {logs}"
        );
        assert!(
            !line.contains('\u{0}') && !line.contains('\u{1b}'),
            "raw control character: {line:?}"
        );
    }
    upstream.shutdown().await;
}
