//! Token capture end to end: `async-openai` as the harness, streaming and not, against a
//! vLLM-like engine. The record holds the ids and logprobs the engine sent; the harness
//! sees what it would have seen without capture.

use std::sync::Arc;

use async_openai::config::OpenAIConfig;
use async_openai::types::chat::{CreateChatCompletionRequest, CreateChatCompletionResponse};
use async_openai::Client;
use futures_util::StreamExt;
use intercept_core::{Interception, RolloutSession, SessionConfig, TokenCapture, Upstream};
use intercept_server::{InterceptionServer, ServerConfig};
use serde_json::json;

use crate::fake_engine::{answer_text, ids_of, logprob_of, EngineConfig, FakeEngine};

async fn harness(
    server: &InterceptionServer,
    id: &str,
    upstream: &str,
    capture: bool,
) -> (
    Arc<RolloutSession>,
    intercept_core::SlotGuard,
    Client<OpenAIConfig>,
) {
    let session = Arc::new(
        RolloutSession::new(SessionConfig::new(
            id,
            "policy-model",
            Upstream::new(upstream),
        ))
        .with_capture_tokens(capture),
    );
    let guard = server.acquire(session.clone()).await.expect("acquire");
    let env: std::collections::HashMap<_, _> = guard.harness_env().into_iter().collect();
    let config = OpenAIConfig::new()
        .with_api_base(env["OPENAI_BASE_URL"].clone())
        .with_api_key(env["OPENAI_API_KEY"].clone());
    (session, guard, crate::openai(config))
}

fn request(text: &str, stream: bool) -> CreateChatCompletionRequest {
    serde_json::from_value(json!({"model": "gpt-4o", "stream": stream,
        "messages": [{"role": "user", "content": text}]}))
    .expect("request")
}

#[tokio::test]
async fn async_openai_streams_and_json_with_capture_match_a_plain_run() {
    let engine = FakeEngine::start(EngineConfig {
        name: "vllm".into(),
        token_ids: true,
    })
    .await;
    let server = InterceptionServer::new(ServerConfig::default()).expect("server");
    server.start().await.expect("start");
    let (plain_s, _pg, plain) = harness(&server, "e2e-plain", &engine.base_url(), false).await;
    let (cap_s, _cg, captured) = harness(&server, "e2e-captured", &engine.base_url(), true).await;
    let text = "alpha beta gamma";
    // Non-streaming: same typed response either way, logprobs absent for the harness.
    let a: CreateChatCompletionResponse = plain
        .chat()
        .create(request(text, false))
        .await
        .expect("plain");
    let b: CreateChatCompletionResponse = captured
        .chat()
        .create(request(text, false))
        .await
        .expect("captured");
    assert_eq!(
        serde_json::to_value(&a).expect("json"),
        serde_json::to_value(&b).expect("json")
    );
    assert!(b.choices[0].logprobs.is_none());
    assert_eq!(
        b.choices[0].message.content.as_deref(),
        Some(answer_text(text).as_str())
    );
    // Streaming: the same chunks, chunk for chunk.
    let mut chunks = Vec::new();
    for client in [&plain, &captured] {
        let mut stream = client
            .chat()
            .create_stream(request(text, true))
            .await
            .expect("stream");
        let mut got = Vec::new();
        while let Some(chunk) = stream.next().await {
            got.push(serde_json::to_value(chunk.expect("chunk")).expect("json"));
        }
        chunks.push(got);
    }
    assert_eq!(chunks[0], chunks[1]);
    assert!(chunks[1]
        .iter()
        .all(|c| c["choices"][0]["logprobs"].is_null()));
    // The captured records hold exactly what the engine sent.
    let ids = ids_of(&answer_text(text));
    let lps: Vec<f64> = (0..ids.len()).map(logprob_of).collect();
    let trace = cap_s.trace();
    assert_eq!(trace.calls.len(), 2);
    for record in &trace.calls {
        assert_eq!(record.token_capture, TokenCapture::Captured);
        assert_eq!(record.prompt_token_ids.as_ref(), Some(&ids_of(text)));
        assert_eq!(record.completion_token_ids.as_ref(), Some(&ids));
        assert_eq!(record.completion_logprobs.as_ref(), Some(&lps));
    }
    assert!(plain_s
        .trace()
        .calls
        .iter()
        .all(|c| c.token_capture == TokenCapture::Off));
    server.stop().await.expect("stop");
}
