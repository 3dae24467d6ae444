//! Sessions that answer their model calls themselves (`Session::generate`): served as the
//! upstream's answer (JSON, or the dialect's stream made from it), recorded once with the
//! token data the session reports, errors with their status, and cancelled on release.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use common::*;
use intercept_core::{
    CallInfo, CallRecord, Error, Generated, Interception, JsonBody, RolloutSession, Session,
    SessionConfig, TokenCapture, TokenPath, TurnTokens, Upstream,
};
use serde_json::{json, Value};
use tokio::sync::Notify;

/// What the generating session does with a call.
#[derive(Debug, Clone)]
enum Behaviour {
    Answer,
    Fail(Error),
    Hang,
}

#[derive(Debug)]
struct Generating {
    inner: RolloutSession,
    behaviour: Behaviour,
    calls: AtomicUsize,
    started: Notify,
    seen: parking_lot::Mutex<Vec<Value>>,
}

impl Generating {
    fn new(id: &str, behaviour: Behaviour, waiter: Arc<Waiter>) -> Arc<Self> {
        // The upstream is never used: a port nothing listens on.
        let config = SessionConfig::new(id, "policy", Upstream::new("http://127.0.0.1:9/v1"));
        Arc::new(Generating {
            inner: RolloutSession::new(config).with_sink(waiter),
            behaviour,
            calls: AtomicUsize::new(0),
            started: Notify::new(),
            seen: Default::default(),
        })
    }
}

fn completion(text: &str) -> Value {
    json!({
        "id": "chatcmpl-gen", "object": "chat.completion", "created": 1, "model": "policy",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    })
}

#[async_trait]
impl Session for Generating {
    fn id(&self) -> &str {
        self.inner.id()
    }
    fn model(&self) -> &str {
        self.inner.model()
    }
    fn upstream(&self) -> &Upstream {
        self.inner.upstream()
    }
    fn record(&self, record: CallRecord) {
        self.inner.record(record)
    }
    fn on_release(&self) {
        self.inner.on_release()
    }
    fn generates(&self) -> bool {
        true
    }
    async fn generate(&self, _call: &CallInfo, body: &JsonBody) -> Result<Generated, Error> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.seen.lock().push(body.to_value());
        self.started.notify_waiters();
        match &self.behaviour {
            Behaviour::Answer => Ok(Generated {
                response: Bytes::from(completion("made here").to_string()),
                tokens: Some(TurnTokens {
                    prompt_ids: vec![1, 2, 3],
                    completion_ids: vec![7, 8],
                    logprobs: vec![-0.5, -0.25],
                    path: Some(TokenPath::Rendered),
                    reason: Some("first_turn".into()),
                }),
            }),
            Behaviour::Fail(e) => Err(e.clone()),
            Behaviour::Hang => std::future::pending().await,
        }
    }
}

async fn acquire(
    h: &Harness,
    behaviour: Behaviour,
) -> (Arc<Generating>, Arc<Waiter>, intercept_core::SlotGuard) {
    let waiter = Arc::new(Waiter::default());
    let session = Generating::new("gen", behaviour, waiter.clone());
    let guard = h.server.acquire(session.clone()).await.expect("acquire");
    (session, waiter, guard)
}

#[tokio::test]
async fn a_generated_answer_is_served_and_recorded_with_its_tokens() {
    let h = Harness::new().await;
    let (session, waiter, guard) = acquire(&h, Behaviour::Answer).await;
    let slot = guard.slot();
    let answer = post_json(
        &slot.base_url,
        Some(slot.model_secret.expose()),
        &chat_body("hi", false),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json(), completion("made here"));
    // The session got the request as it would have gone upstream: its model imposed.
    assert_eq!(session.seen.lock()[0]["model"], "policy");
    waiter.wait_for(1).await;
    let trace = session.inner.trace();
    let record = &trace.calls[0];
    assert_eq!(record.status, 200);
    assert_eq!(record.token_capture, TokenCapture::Captured);
    assert_eq!(record.prompt_token_ids.as_deref(), Some(&[1, 2, 3][..]));
    assert_eq!(record.completion_token_ids.as_deref(), Some(&[7, 8][..]));
    assert_eq!(
        record.completion_logprobs.as_deref(),
        Some(&[-0.5, -0.25][..])
    );
    assert_eq!(record.token_path, Some(TokenPath::Rendered));
    assert_eq!(record.token_reason.as_deref(), Some("first_turn"));
    assert_eq!(record.finish_reason.as_deref(), Some("stop"));
    // No upstream request was made.
    assert_eq!(h.upstream.requests().len(), 0);
    // The log carries the same fields.
    let log = String::from_utf8(session.inner.log()).unwrap();
    assert!(log.contains(r#""token_path":"rendered""#), "{log}");
    assert!(log.contains(r#""token_reason":"first_turn""#), "{log}");
    guard.close().await;
}

#[tokio::test]
async fn a_streamed_call_gets_the_dialect_stream_made_from_the_generated_answer() {
    let h = Harness::new().await;
    let (session, waiter, guard) = acquire(&h, Behaviour::Answer).await;
    let slot = guard.slot();
    let answer = post_json(
        &slot.base_url,
        Some(slot.model_secret.expose()),
        &chat_body("hi", true),
    )
    .await;
    assert_eq!(answer.status, 200);
    assert!(answer.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let text = answer.text();
    assert!(text.contains("made here"), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    waiter.wait_for(1).await;
    let trace = session.inner.trace();
    let record = &trace.calls[0];
    assert!(record.stream);
    assert_eq!(record.completion_token_ids.as_deref(), Some(&[7, 8][..]));
    let response = record.response.as_ref().unwrap().to_value();
    assert_eq!(response["choices"][0]["message"]["content"], "made here");
    guard.close().await;
}

#[tokio::test]
async fn a_generation_error_is_answered_with_its_status_and_recorded_once() {
    let h = Harness::new().await;
    let upstream_error = Error::upstream_status(503, "engine overloaded".into(), Some("2".into()));
    let (session, waiter, guard) = acquire(&h, Behaviour::Fail(upstream_error)).await;
    let slot = guard.slot();
    let answer = post_json(
        &slot.base_url,
        Some(slot.model_secret.expose()),
        &chat_body("hi", false),
    )
    .await;
    assert_eq!(answer.status, 503, "{}", answer.text());
    assert!(
        answer.text().contains("engine overloaded"),
        "{}",
        answer.text()
    );
    waiter.wait_for(1).await;
    let trace = session.inner.trace();
    assert_eq!(trace.calls.len(), 1);
    assert_eq!(trace.calls[0].status, 503);
    assert_eq!(trace.calls[0].token_capture, TokenCapture::Off);
    guard.close().await;

    let (_, _, guard) = acquire(
        &h,
        Behaviour::Fail(Error::invalid("train clients serve chat only")),
    )
    .await;
    let slot = guard.slot();
    let answer = post_json(
        &slot.base_url,
        Some(slot.model_secret.expose()),
        &chat_body("hi", true),
    )
    .await;
    assert_eq!(answer.status, 400, "{}", answer.text());
    assert_eq!(
        answer.json()["error"]["message"]
            .as_str()
            .map(|m| m.contains("chat only")),
        Some(true),
        "{}",
        answer.text()
    );
    guard.close().await;
}

#[tokio::test]
async fn a_release_cancels_a_generation_in_flight_and_records_it() {
    let h = Harness::new().await;
    let (session, waiter, guard) = acquire(&h, Behaviour::Hang).await;
    let slot = guard.slot();
    let base = slot.base_url.clone();
    let secret = slot.model_secret.expose().to_owned();
    let started = session.started.notified();
    tokio::pin!(started);
    started.as_mut().enable();
    let call =
        tokio::spawn(async move { post_json(&base, Some(&secret), &chat_body("hi", false)).await });
    started.await;
    guard.close().await;
    let answer = call.await.unwrap();
    assert_eq!(answer.status, 409, "{}", answer.text());
    waiter.wait_for(1).await;
    let trace = session.inner.trace();
    assert_eq!(trace.calls.len(), 1);
    assert_eq!(
        trace.calls[0].error.as_ref().map(|e| e.kind.as_str()),
        Some("cancelled")
    );
    assert_eq!(session.calls.load(Ordering::SeqCst), 1);
}
