//! Network policy end to end: official-SDK-shaped requests of a restricted session reach
//! the upstream without the provider-side capabilities the policy forbids, carry the
//! notice, and are recorded with the removed paths; the strict mode answers 400.

use std::sync::Arc;

use async_openai::config::OpenAIConfig;
use async_openai::types::chat::CreateChatCompletionRequest;
use async_openai::types::responses::CreateResponse;
use async_openai::Client;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use intercept_core::network::NOTICE;
use intercept_core::{
    Interception, NetworkPolicy, OnViolation, RolloutSession, SessionConfig, SlotGuard, Upstream,
};
use intercept_server::{InterceptionServer, ServerConfig};
use intercept_test::MockUpstream;
use serde_json::{json, Value};

async fn setup(
    id: &str,
    network: NetworkPolicy,
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
        SessionConfig::new(id, "policy-model", Upstream::new(upstream.base_url()))
            .with_network(network),
    ));
    let guard = server.acquire(session.clone()).await.expect("acquire");
    (upstream, server, session, guard)
}

fn openai(guard: &SlotGuard) -> Client<OpenAIConfig> {
    crate::openai(
        OpenAIConfig::new()
            .with_api_base(guard.openai_base_url())
            .with_api_key(guard.model_secret.expose()),
    )
}

/// What the official Anthropic SDK sends (headers included).
async fn anthropic_post(guard: &SlotGuard, path: &str, body: Value) -> (u16, Value) {
    let env: std::collections::HashMap<_, _> = guard.harness_env().into_iter().collect();
    let req = http::Request::post(format!("{}{path}", env["ANTHROPIC_BASE_URL"]))
        .header("x-api-key", env["ANTHROPIC_API_KEY"].as_str())
        .header("anthropic-version", "2023-06-01")
        .header("anthropic-beta", "mcp-client-2025-04-04")
        .header("content-type", "application/json")
        .header("user-agent", "Anthropic/Python 0.49.0")
        .header("x-stainless-lang", "python")
        .header("x-stainless-retry-count", "0")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(&body).expect("json"),
        )))
        .expect("request");
    let client: HttpClient<_, Full<Bytes>> = HttpClient::builder(TokioExecutor::new()).build_http();
    let resp = client.request(req).await.expect("response");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).expect("json answer"))
}

fn allow_ok_org() -> NetworkPolicy {
    NetworkPolicy::new(&["*.ok.org"], &[] as &[&str]).expect("policy")
}

#[tokio::test]
async fn responses_of_a_restricted_session_lose_stored_state_and_server_tools() {
    let (upstream, _server, session, guard) = setup("np-responses", allow_ok_org()).await;
    let request: CreateResponse = serde_json::from_value(json!({
        "model": "gpt-4.1",
        "input": "find the docs",
        "previous_response_id": "resp_123",
        "tools": [
            {"type": "function", "name": "read_file", "parameters": {"type": "object", "properties": {}}},
            {"type": "web_search"},
            {"type": "mcp", "server_label": "deepwiki", "server_url": "https://mcp.deepwiki.com/mcp"}
        ]
    }))
    .expect("an SDK-shaped Responses request");
    let resp = openai(&guard)
        .responses()
        .create(request)
        .await
        .expect("response");
    assert_eq!(
        resp.status,
        async_openai::types::responses::Status::Completed
    );
    let sent = upstream.last_request().expect("sent");
    let sent = sent.json().cloned().expect("json");
    assert!(sent.get("previous_response_id").is_none(), "{sent}");
    let types: Vec<&str> = sent["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .filter_map(|t| t["type"].as_str())
        .collect();
    assert_eq!(types, ["function", "web_search"], "{sent}");
    assert_eq!(
        sent["tools"][1]["filters"]["allowed_domains"],
        json!(["ok.org"])
    );
    assert_eq!(sent["input"], format!("find the docs\n\n{NOTICE}"));
    let record = &session.trace().calls[0];
    let policy = record.policy.as_ref().expect("policy event");
    assert_eq!(policy.code, "provider_capability_unavailable");
    assert_eq!(
        policy.paths,
        [
            "previous_response_id",
            "tools[1].filters.allowed_domains",
            "tools[2].type"
        ]
    );
    // The record's request is what went upstream.
    assert_eq!(record.request.to_value(), sent);
    let line: Value = serde_json::from_str(&record.to_json_line()).expect("line");
    assert_eq!(line["policy"]["paths"][2], "tools[2].type");
    guard.close().await;
}

#[tokio::test]
async fn anthropic_messages_and_count_tokens_lose_web_search_and_mcp_servers() {
    let (upstream, _server, session, guard) =
        setup("np-anthropic", NetworkPolicy::deny_all()).await;
    let body = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 256,
        "system": "You are a coding agent.",
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "What changed upstream?"},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/chart.png"}}
            ]}
        ],
        "tools": [
            {"name": "bash", "description": "run a command", "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}
        ],
        "mcp_servers": [{"type": "url", "url": "https://mcp.example.com/sse", "name": "example"}]
    });
    let (status, answer) = anthropic_post(&guard, "/v1/messages", body.clone()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["type"], "message");
    let sent = upstream.last_request().expect("sent");
    assert_eq!(sent.path, "/v1/messages");
    let sent = sent.json().cloned().expect("json");
    assert!(sent.get("mcp_servers").is_none(), "{sent}");
    assert_eq!(sent["tools"], json!([body["tools"][0]]));
    assert_eq!(
        sent["messages"][0]["content"],
        json!([{"type": "text", "text": "What changed upstream?"}, {"type": "text", "text": NOTICE}])
    );
    let paths = session.trace().calls[0]
        .policy
        .clone()
        .expect("policy")
        .paths;
    assert_eq!(
        paths,
        [
            "mcp_servers",
            "tools[1].type",
            "messages[0].content[1].source.url"
        ]
    );

    let mut count = body;
    count.as_object_mut().expect("object").remove("max_tokens");
    let (_status, _answer) = anthropic_post(&guard, "/v1/messages/count_tokens", count).await;
    let sent = upstream.last_request().expect("sent");
    assert_eq!(sent.path, "/v1/messages/count_tokens");
    let sent = sent.json().cloned().expect("json");
    assert!(sent.get("mcp_servers").is_none(), "{sent}");
    assert_eq!(sent["tools"].as_array().map(Vec::len), Some(1), "{sent}");
    assert_eq!(
        session.trace().calls.len(),
        1,
        "count_tokens is not recorded"
    );
    guard.close().await;
}

#[tokio::test]
async fn reject_mode_answers_400_in_the_dialect_shape_and_sends_nothing() {
    let policy = allow_ok_org().with_on_violation(OnViolation::Reject);
    let (upstream, _server, session, guard) = setup("np-reject", policy).await;
    let request: CreateChatCompletionRequest = serde_json::from_value(json!({
        "model": "gpt-4.1",
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "describe"},
            {"type": "image_url", "image_url": {"url": "https://evil.com/a.png"}}
        ]}],
        "web_search_options": {}
    }))
    .expect("an SDK-shaped Chat request");
    let err = openai(&guard)
        .chat()
        .create(request)
        .await
        .expect_err("refused");
    let text = err.to_string();
    assert!(
        text.contains("network policy: `web_search_options` (and 1 more: messages[0].content[1].image_url.url)"),
        "{text}"
    );
    let (status, answer) = anthropic_post(
        &guard,
        "/v1/messages",
        json!({"model": "c", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "container": "cntr_1"}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(answer["type"], "error");
    assert_eq!(answer["error"]["type"], "invalid_request_error");
    assert!(
        answer["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("network policy: `container`")),
        "{answer}"
    );
    assert_eq!(upstream.request_count(), 0, "nothing went upstream");
    assert!(session.trace().calls.is_empty());

    // A clean request of the same session goes through untouched by mediation.
    let ok: CreateChatCompletionRequest = serde_json::from_value(json!({
        "model": "gpt-4.1",
        "messages": [{"role": "user", "content": "hello"}]
    }))
    .expect("request");
    openai(&guard).chat().create(ok).await.expect("served");
    let sent = upstream
        .last_request()
        .expect("sent")
        .json()
        .cloned()
        .expect("json");
    assert_eq!(
        sent["messages"],
        json!([{"role": "user", "content": "hello"}])
    );
    assert!(session.trace().calls[0].policy.is_none());
    guard.close().await;
}
