//! Anthropic Messages as the official SDK sends it (headers included), stream and not.
//!
//! No maintained Rust Anthropic client fits here, so the requests are built by hand with
//! exactly the headers the official Python/TypeScript SDKs send.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use intercept_core::{Interception, RolloutSession, SessionConfig, SlotGuard, Upstream};
use intercept_server::{InterceptionServer, ServerConfig};
use intercept_test::{MockUpstream, Reply};
use serde_json::{json, Value};

async fn setup(
    id: &str,
) -> (
    MockUpstream,
    InterceptionServer,
    Arc<RolloutSession>,
    SlotGuard,
) {
    let upstream = MockUpstream::start().await.expect("mock");
    let server = InterceptionServer::new(ServerConfig::default()).expect("server");
    server.start().await.expect("start");
    let session = Arc::new(RolloutSession::new(
        SessionConfig::new(
            id,
            "policy-model",
            Upstream::new(upstream.base_url()).with_api_key("sk-ant-upstream"),
        )
        .with_sampling(
            json!({"temperature": 0.2})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        ),
    ));
    let guard = server.acquire(session.clone()).await.expect("acquire");
    (upstream, server, session, guard)
}

/// What the official SDK sends: `ANTHROPIC_BASE_URL` + `/v1/messages`, `x-api-key`.
async fn sdk_post(guard: &SlotGuard, path: &str, body: Value) -> (u16, Bytes) {
    let env: std::collections::HashMap<_, _> = guard.harness_env().into_iter().collect();
    let req = http::Request::post(format!("{}{path}", env["ANTHROPIC_BASE_URL"]))
        .header("x-api-key", env["ANTHROPIC_API_KEY"].as_str())
        .header("anthropic-version", "2023-06-01")
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .header("user-agent", "Anthropic/Python 0.49.0")
        .header("x-stainless-lang", "python")
        .header("x-stainless-package-version", "0.49.0")
        .header("x-stainless-retry-count", "0")
        .header("x-stainless-timeout", "600")
        .header("anthropic-beta", "interleaved-thinking-2025-05-14")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(&body).expect("json"),
        )))
        .expect("request");
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let resp = client.request(req).await.expect("response");
    let status = resp.status().as_u16();
    (
        status,
        resp.into_body().collect().await.expect("body").to_bytes(),
    )
}

#[tokio::test]
async fn messages_round_trip_as_the_sdk_sends_them() {
    let (upstream, _server, session, guard) = setup("e2e-anthropic").await;
    let (status, body) = sdk_post(
        &guard,
        "/v1/messages",
        json!({"model": "claude-x", "max_tokens": 64, "temperature": 1.0, "messages": [{"role": "user", "content": "hi claude"}]}),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], "echo: hi claude");
    let sent = upstream.last_request().expect("sent");
    assert_eq!(
        sent.path, "/v1/messages",
        "the version segment is not doubled"
    );
    assert_eq!(sent.header("x-api-key"), Some("sk-ant-upstream"));
    assert_eq!(sent.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(
        sent.header("anthropic-beta"),
        Some("interleaved-thinking-2025-05-14")
    );
    let sent = sent.json().cloned().expect("json");
    assert_eq!(sent["model"], "policy-model");
    assert_eq!(sent["temperature"], 0.2);
    assert_eq!(sent["max_tokens"], 64);
    let trace = session.trace();
    assert_eq!(trace.calls.len(), 1);
    assert_eq!(trace.calls[0].finish_reason.as_deref(), Some("stop"));
    guard.close().await;
}

#[tokio::test]
async fn messages_stream_and_count_tokens() {
    let (upstream, _server, session, guard) = setup("e2e-anthropic-stream").await;
    upstream.push(
        Reply::text("streamed claude words")
            .with_reasoning("hmm")
            .with_chunks(3),
    );
    let (status, body) = sdk_post(
        &guard,
        "/v1/messages",
        json!({"model": "claude-x", "max_tokens": 64, "stream": true, "messages": [{"role": "user", "content": "go"}]}),
    )
    .await;
    assert_eq!(status, 200);
    let text = String::from_utf8_lossy(&body).into_owned();
    let mut streamed = String::new();
    for event in text.split("\n\n") {
        if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data: ")) {
            let v: Value = serde_json::from_str(data).expect("event json");
            if v["type"] == "content_block_delta" && v["delta"]["type"] == "text_delta" {
                streamed.push_str(v["delta"]["text"].as_str().unwrap_or_default());
            }
        }
    }
    assert_eq!(streamed, "streamed claude words");
    assert!(
        text.trim_end()
            .ends_with("data: {\"type\":\"message_stop\"}"),
        "{text}"
    );
    let record = &session.trace().calls[0];
    assert!(record.error.is_none(), "{:?}", record.error);
    let assembled = record.response.as_ref().expect("assembled").to_value();
    assert_eq!(assembled["content"][0]["type"], "thinking");
    assert_eq!(assembled["content"][1]["text"], "streamed claude words");

    let (status, body) = sdk_post(
        &guard,
        "/v1/messages/count_tokens",
        json!({"model": "claude-x", "messages": [{"role": "user", "content": "count me"}]}),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).expect("json");
    assert!(v["input_tokens"].as_u64().is_some_and(|n| n > 0));
    assert_eq!(
        session.trace().calls.len(),
        1,
        "count_tokens is never recorded"
    );
    assert_eq!(
        upstream.last_request().expect("sent").json().expect("json")["model"],
        "policy-model"
    );

    // Errors come back in the Anthropic shape.
    upstream.push(Reply::error(529, "overloaded"));
    let (status, body) = sdk_post(
        &guard,
        "/v1/messages",
        json!({"model": "m", "max_tokens": 8, "messages": []}),
    )
    .await;
    assert_eq!(status, 529);
    let v: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "overloaded_error");
    guard.close().await;
}
