//! OpenAI Responses through `async-openai`, stream and not.

use std::sync::Arc;

use async_openai::config::OpenAIConfig;
use async_openai::types::responses::{CreateResponse, ResponseStreamEvent};
use async_openai::Client;
use futures_util::StreamExt;
use intercept_core::{Interception, RolloutSession, SessionConfig, SlotGuard, Upstream};
use intercept_server::{InterceptionServer, ServerConfig};
use intercept_test::{MockUpstream, Reply};
use serde_json::json;

async fn setup(
    id: &str,
) -> (
    MockUpstream,
    InterceptionServer,
    Arc<RolloutSession>,
    SlotGuard,
    Client<OpenAIConfig>,
) {
    setup_with(id, ServerConfig::default()).await
}

async fn setup_with(
    id: &str,
    config: ServerConfig,
) -> (
    MockUpstream,
    InterceptionServer,
    Arc<RolloutSession>,
    SlotGuard,
    Client<OpenAIConfig>,
) {
    let upstream = MockUpstream::start().await.expect("mock");
    let server = InterceptionServer::new(config).expect("server");
    server.start().await.expect("start");
    let session = Arc::new(RolloutSession::new(
        SessionConfig::new(id, "policy-model", Upstream::new(upstream.base_url())).with_sampling(
            json!({"temperature": 0.3, "max_tokens": 256})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        ),
    ));
    let guard = server.acquire(session.clone()).await.expect("acquire");
    let client = crate::openai(
        OpenAIConfig::new()
            .with_api_base(guard.openai_base_url())
            .with_api_key(guard.model_secret.expose()),
    );
    (upstream, server, session, guard, client)
}

fn request(v: serde_json::Value) -> CreateResponse {
    serde_json::from_value(v).expect("a valid Responses request")
}

#[tokio::test]
async fn responses_round_trip_with_sampling_imposed() {
    let (upstream, _server, session, guard, client) = setup("e2e-responses").await;
    let resp = client
        .responses()
        .create(request(
            json!({"model": "gpt-4.1", "input": "hello responses", "temperature": 1.0}),
        ))
        .await
        .expect("response");
    assert_eq!(resp.output_text().as_deref(), Some("echo: hello responses"));
    let sent = upstream
        .last_request()
        .expect("sent")
        .json()
        .cloned()
        .expect("json");
    assert_eq!(sent["model"], "policy-model");
    assert_eq!(sent["temperature"], 0.3);
    assert_eq!(sent["max_output_tokens"], 256);
    let trace = session.trace();
    assert_eq!(trace.calls.len(), 1);
    assert_eq!(trace.calls[0].endpoint, "/responses");
    assert_eq!(trace.calls[0].finish_reason.as_deref(), Some("stop"));
    assert!(trace.calls[0].usage.prompt_tokens > 0);
    guard.close().await;
}

#[tokio::test]
async fn responses_stream_withholds_completed_until_recorded() {
    let (upstream, _server, session, guard, client) = setup("e2e-responses-stream").await;
    upstream.push(Reply::text("streamed responses text").with_chunks(4));
    let mut stream = client
        .responses()
        .create_stream(request(
            json!({"model": "m", "input": "go", "stream": true}),
        ))
        .await
        .expect("stream");
    let mut text = String::new();
    let mut completed = false;
    while let Some(event) = stream.next().await {
        match event.expect("event") {
            ResponseStreamEvent::ResponseOutputTextDelta(d) => text.push_str(&d.delta),
            ResponseStreamEvent::ResponseCompleted(_) => {
                // By the time the harness sees the terminal event, the turn is recorded.
                assert_eq!(session.trace().calls.len(), 1);
                completed = true;
            }
            _ => {}
        }
    }
    assert!(completed);
    assert_eq!(text, "streamed responses text");
    let record = &session.trace().calls[0];
    assert!(
        record.stream && record.error.is_none(),
        "{:?}",
        record.error
    );
    let assembled = record.response.as_ref().expect("assembled").to_value();
    assert_eq!(assembled["status"], "completed");
    guard.close().await;
}

/// Heartbeats through upstream silence (`response.in_progress`, later events renumbered)
/// are events `async-openai` reads like any other: every event parses, the sequence
/// numbers it sees are consecutive, and the text is whole.
#[tokio::test]
async fn responses_stream_with_heartbeats_reads_cleanly() {
    let config = ServerConfig {
        keepalive: std::time::Duration::from_millis(25),
        ..ServerConfig::default()
    };
    let (upstream, _server, session, guard, client) =
        setup_with("e2e-responses-heartbeat", config).await;
    upstream.push(
        Reply::text("slow thoughts still arrive")
            .with_chunks(3)
            .with_chunk_delay(std::time::Duration::from_millis(120)),
    );
    let mut stream = client
        .responses()
        .create_stream(request(
            json!({"model": "m", "input": "go", "stream": true}),
        ))
        .await
        .expect("stream");
    let mut text = String::new();
    let mut numbers = Vec::new();
    let mut in_progress = 0;
    while let Some(event) = stream.next().await {
        let event = event.expect("every event parses");
        let v = serde_json::to_value(&event).expect("json");
        numbers.push(v["sequence_number"].as_u64().expect("numbered"));
        match event {
            ResponseStreamEvent::ResponseOutputTextDelta(d) => text.push_str(&d.delta),
            ResponseStreamEvent::ResponseInProgress(_) => in_progress += 1,
            _ => {}
        }
    }
    assert_eq!(text, "slow thoughts still arrive");
    assert!(in_progress > 1, "heartbeats were read: {in_progress}");
    let expected: Vec<u64> = (0..numbers.len() as u64).collect();
    assert_eq!(numbers, expected);
    let record = &session.trace().calls[0];
    assert!(record.error.is_none());
    assert_eq!(
        record.response.as_ref().expect("assembled").to_value()["status"],
        "completed"
    );
    guard.close().await;
}
