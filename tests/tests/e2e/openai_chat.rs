//! The `async-openai` crate as the harness, against the interception server and the mock
//! upstream.

use std::sync::Arc;

use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::types::chat::{CreateChatCompletionRequest, CreateChatCompletionResponse};
use async_openai::Client;
use futures_util::StreamExt;
use intercept_core::{Interception, RolloutSession, SessionConfig, SlotGuard, Upstream};
use intercept_server::{InterceptionServer, ServerConfig};
use intercept_test::{MockUpstream, Reply};
use serde_json::json;

struct Setup {
    upstream: MockUpstream,
    server: InterceptionServer,
}

async fn setup() -> Setup {
    setup_with(ServerConfig::default()).await
}

async fn setup_with(config: ServerConfig) -> Setup {
    let upstream = MockUpstream::start().await.expect("mock upstream");
    let server = InterceptionServer::new(config).expect("server");
    server.start().await.expect("start");
    Setup { upstream, server }
}

impl Setup {
    async fn rollout(&self, id: &str) -> (Arc<RolloutSession>, SlotGuard, Client<OpenAIConfig>) {
        let session = Arc::new(RolloutSession::new(
            SessionConfig::new(id, "policy-model", Upstream::new(self.upstream.base_url()))
                .with_sampling(
                    json!({"temperature": 0.5})
                        .as_object()
                        .cloned()
                        .unwrap_or_default(),
                ),
        ));
        let guard = self.server.acquire(session.clone()).await.expect("acquire");
        // Exactly what a harness gets through its environment.
        let env: std::collections::HashMap<_, _> = guard.harness_env().into_iter().collect();
        let config = OpenAIConfig::new()
            .with_api_base(env["OPENAI_BASE_URL"].clone())
            .with_api_key(env["OPENAI_API_KEY"].clone());
        (session, guard, crate::openai(config))
    }
}

fn request(value: serde_json::Value) -> CreateChatCompletionRequest {
    serde_json::from_value(value).expect("a valid chat request")
}

#[tokio::test]
async fn non_streaming_chat_through_async_openai() {
    let s = setup().await;
    let (session, guard, client) = s.rollout("e2e-json").await;
    let resp: CreateChatCompletionResponse = client
        .chat()
        .create(request(
            json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "ping pong"}]}),
        ))
        .await
        .expect("completion");
    assert_eq!(
        resp.choices[0].message.content.as_deref(),
        Some("echo: ping pong")
    );
    let trace = session.trace();
    assert_eq!(trace.calls.len(), 1);
    assert_eq!(trace.calls[0].model, "policy-model");
    assert_eq!(trace.calls[0].request.to_value()["temperature"], 0.5);
    assert_eq!(
        s.upstream
            .last_request()
            .expect("sent")
            .json()
            .expect("json")["model"],
        "policy-model"
    );
    guard.close().await;
    s.server.stop().await.expect("stop");
}

#[tokio::test]
async fn streaming_chat_through_async_openai() {
    let s = setup().await;
    let (session, guard, client) = s.rollout("e2e-stream").await;
    s.upstream
        .push(Reply::text("streamed words arrive in pieces").with_chunks(6));
    let mut stream = client
        .chat()
        .create_stream(request(json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "go"}], "stream": true})))
        .await
        .expect("stream");
    let mut text = String::new();
    let mut finish = None;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("chunk");
        for choice in chunk.choices {
            if let Some(c) = choice.delta.content {
                text.push_str(&c);
            }
            if choice.finish_reason.is_some() {
                finish = choice.finish_reason;
            }
        }
    }
    assert_eq!(text, "streamed words arrive in pieces");
    assert!(finish.is_some());
    let trace = session.trace();
    assert_eq!(trace.calls.len(), 1);
    let record = &trace.calls[0];
    assert!(record.stream && record.error.is_none());
    assert_eq!(
        record.response.as_ref().expect("assembled").to_value()["choices"][0]["message"]["content"],
        "streamed words arrive in pieces"
    );
    guard.close().await;
}

#[tokio::test]
async fn tool_call_round_trip_through_async_openai() {
    let s = setup().await;
    let (session, guard, client) = s.rollout("e2e-tools").await;
    let tools = json!([{"type": "function", "function": {"name": "lookup", "description": "look up", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}]);
    let first = client
        .chat()
        .create(request(json!({"model": "m", "tools": tools, "messages": [{"role": "user", "content": "please use a tool"}]})))
        .await
        .expect("first turn");
    let message = &first.choices[0].message;
    let calls = message.tool_calls.as_ref().expect("a tool call");
    assert_eq!(calls.len(), 1);
    let call = serde_json::to_value(&calls[0]).expect("json");
    let call_id = call["id"].as_str().expect("id").to_owned();
    assert_eq!(call["function"]["name"], "lookup");
    let second = client
        .chat()
        .create(request(json!({"model": "m", "tools": tools, "messages": [
            {"role": "user", "content": "please use a tool"},
            {"role": "assistant", "content": null, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": "42"}
        ]})))
        .await
        .expect("second turn");
    assert_eq!(
        second.choices[0].message.content.as_deref(),
        Some("tool said: 42")
    );
    let trace = session.trace();
    assert_eq!(trace.calls.len(), 2);
    assert_eq!(trace.calls[0].finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(trace.calls[1].finish_reason.as_deref(), Some("stop"));
    guard.close().await;
}

#[tokio::test]
async fn sdk_sees_typed_errors() {
    let s = setup().await;
    let (_session, guard, _client) = s.rollout("e2e-errors").await;
    let wrong = crate::openai(
        OpenAIConfig::new()
            .with_api_base(guard.openai_base_url())
            .with_api_key("wrong"),
    );
    let err = wrong
        .chat()
        .create(request(
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
        ))
        .await
        .expect_err("unauthorized");
    match err {
        OpenAIError::ApiError(api) => {
            assert_eq!(api.status_code.as_u16(), 401);
            assert_eq!(
                api.api_error.r#type.as_deref(),
                Some("authentication_error")
            );
            assert!(
                api.api_error.message.contains("unauthorized"),
                "{}",
                api.api_error.message
            );
        }
        other => panic!("expected an API error, got {other:?}"),
    }
    guard.close().await;
}

#[tokio::test]
async fn many_rollouts_at_once_keep_their_own_traces() {
    let s = Arc::new(setup().await);
    let mut tasks = Vec::new();
    for i in 0..24 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let (session, guard, client) = s.rollout(&format!("e2e-many-{i}")).await;
            for turn in 0..3 {
                let content = format!("rollout {i} turn {turn}");
                if (i + turn) % 2 == 0 {
                    let r = client
                        .chat()
                        .create(request(json!({"model": "m", "messages": [{"role": "user", "content": content}]})))
                        .await
                        .expect("completion");
                    assert_eq!(r.choices[0].message.content.as_deref(), Some(format!("echo: {content}").as_str()));
                } else {
                    let mut stream = client
                        .chat()
                        .create_stream(request(json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": content}]})))
                        .await
                        .expect("stream");
                    let mut text = String::new();
                    while let Some(chunk) = stream.next().await {
                        for c in chunk.expect("chunk").choices {
                            text.push_str(c.delta.content.as_deref().unwrap_or_default());
                        }
                    }
                    assert_eq!(text, format!("echo: {content}"));
                }
            }
            guard.close().await;
            let trace = session.trace();
            assert_eq!(trace.calls.len(), 3);
            for (turn, call) in trace.calls.iter().enumerate() {
                assert!(call.error.is_none());
                let sent = call.request.to_value()["messages"][0]["content"].as_str().unwrap_or_default().to_owned();
                assert!(sent.starts_with(&format!("rollout {i} ")), "{sent}");
                let _ = turn;
            }
        }));
    }
    for t in tasks {
        t.await.expect("rollout");
    }
    assert_eq!(s.server.load(), 0);
    assert_eq!(s.upstream.request_count(), 72);
    // The upstream connection pool is shared: far fewer connections than calls.
    assert!(
        s.upstream.connections() < 72,
        "connections: {}",
        s.upstream.connections()
    );
}

/// Heartbeat chunks (empty `delta.content`) through a slow first token and mid-stream
/// silence are chunks `async-openai` reads like any other; the text and the record are
/// whole.
#[tokio::test]
async fn streaming_chat_with_heartbeats_reads_cleanly() {
    let s = setup_with(ServerConfig {
        keepalive: std::time::Duration::from_millis(25),
        first_byte_timeout: std::time::Duration::from_millis(40),
        ..ServerConfig::default()
    })
    .await;
    let (session, guard, client) = s.rollout("e2e-stream-heartbeat").await;
    s.upstream.push(
        Reply::text("patience is rewarded")
            .with_chunks(3)
            .with_chunk_delay(std::time::Duration::from_millis(120))
            .with_header_delay(std::time::Duration::from_millis(150)),
    );
    let mut stream = client
        .chat()
        .create_stream(request(json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "go"}], "stream": true})))
        .await
        .expect("stream");
    let mut text = String::new();
    let mut empty = 0;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("every chunk parses");
        for choice in chunk.choices {
            match choice.delta.content.as_deref() {
                Some("") => empty += 1,
                Some(c) => text.push_str(c),
                None => {}
            }
        }
    }
    assert_eq!(text, "patience is rewarded");
    assert!(empty > 2, "heartbeat chunks were read: {empty}");
    let record = &session.trace().calls[0];
    assert!(record.error.is_none());
    assert_eq!(
        record.response.as_ref().expect("assembled").to_value()["choices"][0]["message"]["content"],
        "patience is rewarded"
    );
    guard.close().await;
}
