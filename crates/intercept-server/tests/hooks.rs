//! Request, response and tool hooks; shared tool servers on the state channel.

mod common;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use intercept_core::{
    CallInfo, CallRecord, Error, HookAction, Interception, JsonBody, RolloutSession, Secret,
    Session, ToolAction, ToolPhase, Upstream,
};
use intercept_server::{InterceptionServer, ServerConfig, STATE_ROUTE_HEADER};
use intercept_test::{MockUpstream, Reply};
use serde_json::{json, Value};

/// A session with hooks around a [`RolloutSession`].
#[derive(Debug)]
struct Hooked {
    inner: RolloutSession,
    rewrite_to: Option<String>,
    stop_on: Option<String>,
}

#[async_trait]
impl Session for Hooked {
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
    fn stop_condition(&self) -> Option<String> {
        self.inner.stop_condition()
    }
    fn stop(&self, reason: &str) {
        self.inner.stop(reason)
    }
    fn on_release(&self) {
        self.inner.on_release()
    }
    async fn on_request(&self, _call: &CallInfo, body: &mut JsonBody) -> Result<HookAction, Error> {
        body.set("user", "hooked")?;
        Ok(HookAction::Continue)
    }
    fn inspects_responses(&self) -> bool {
        true
    }
    async fn on_response(
        &self,
        _call: &CallInfo,
        response: &mut Value,
    ) -> Result<HookAction, Error> {
        let text = response["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if let Some(stop) = &self.stop_on {
            if text.contains(stop.as_str()) {
                return Ok(HookAction::Stop("found_answer".into()));
            }
        }
        if let Some(to) = &self.rewrite_to {
            response["choices"][0]["message"]["content"] = json!(to);
        }
        Ok(HookAction::Continue)
    }
    async fn on_tool(&self, phase: ToolPhase, message: &Value) -> Result<ToolAction, Error> {
        match (phase, message["content"].as_str()) {
            (ToolPhase::Before, Some("secret")) => Ok(ToolAction::Rewrite {
                message: json!({"role": "tool", "tool_call_id": message["tool_call_id"], "content": "[redacted]"}),
            }),
            (ToolPhase::After, Some("rm -rf")) => Ok(ToolAction::Stop {
                reason: "dangerous_tool".into(),
            }),
            _ => Ok(ToolAction::Allow),
        }
    }
}

async fn setup(
    rewrite_to: Option<&str>,
    stop_on: Option<&str>,
) -> (
    MockUpstream,
    InterceptionServer,
    Arc<Hooked>,
    intercept_core::SlotGuard,
) {
    let upstream = MockUpstream::start().await.expect("mock");
    let server = InterceptionServer::new(ServerConfig {
        inspect_memory: 64,
        ..ServerConfig::default()
    })
    .expect("server");
    server.start().await.expect("start");
    let h = Harness { upstream, server };
    let session = Arc::new(Hooked {
        inner: RolloutSession::new(h.session_config("hooked")),
        rewrite_to: rewrite_to.map(str::to_owned),
        stop_on: stop_on.map(str::to_owned),
    });
    let guard = h.server.acquire(session.clone()).await.expect("acquire");
    (h.upstream, h.server, session, guard)
}

#[tokio::test]
async fn response_hook_rewrites_json_and_streams() {
    let (upstream, _server, session, guard) = setup(Some("rewritten by hook"), None).await;
    let secret = guard.model_secret.expose().to_owned();
    let a = post_json(&guard.base_url, Some(&secret), &chat_body("hello", false)).await;
    assert_eq!(a.status, 200);
    assert_eq!(
        a.json()["choices"][0]["message"]["content"],
        "rewritten by hook"
    );
    assert_eq!(
        upstream.last_request().expect("sent").json().expect("json")["user"],
        "hooked"
    );

    // The stream is buffered (spilled to a file: the memory bound is 64 bytes) and
    // re-emitted as a minimal valid stream carrying the rewritten answer.
    upstream.push(Reply::text("original streamed answer").with_chunks(6));
    let a = post_json(&guard.base_url, Some(&secret), &chat_body("hello", true)).await;
    assert_eq!(a.status, 200);
    let text = a.text();
    assert!(!text.contains("original"), "{text}");
    assert!(text.contains("rewritten by hook"), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    // The record keeps what the model produced.
    let calls = session.inner.trace().calls;
    assert_eq!(calls.len(), 2);
    let recorded = calls[1].response.as_ref().expect("response").to_value();
    assert_eq!(
        recorded["choices"][0]["message"]["content"],
        "original streamed answer"
    );
    guard.close().await;
}

#[tokio::test]
async fn unchanged_inspected_streams_replay_the_upstream_bytes() {
    let (upstream, _server, _session, guard) = setup(None, None).await;
    upstream.push(Reply::text("kept as it was").with_chunks(5));
    let a = post_json(
        &guard.base_url,
        Some(guard.model_secret.expose()),
        &chat_body("x", true),
    )
    .await;
    let text = a.text();
    let content: String = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(content, "kept as it was");
    assert!(text.trim_end().ends_with("data: [DONE]"));
    guard.close().await;
}

#[tokio::test]
async fn response_hook_stop_records_the_turn_and_stops() {
    let (_upstream, _server, session, guard) = setup(None, Some("echo")).await;
    let a = post_json(
        &guard.base_url,
        Some(guard.model_secret.expose()),
        &chat_body("x", false),
    )
    .await;
    assert_eq!(a.status, 400);
    assert_eq!(
        a.json()["error"]["message"],
        "rollout stopped: found_answer"
    );
    assert_eq!(session.inner.trace().calls.len(), 1, "the turn is recorded");
    assert!(session.inner.trace().calls[0].error.is_none());
    let again = post_json(
        &guard.base_url,
        Some(guard.model_secret.expose()),
        &chat_body("x", false),
    )
    .await;
    assert_eq!(again.status, 400);
    guard.close().await;
}

async fn post_tool(base: &str, secret: &str, body: Value) -> (u16, Value) {
    let a = post(
        base,
        "/tool",
        Some(secret),
        serde_json::to_vec(&body).expect("json"),
        &[],
    )
    .await;
    (
        a.status,
        serde_json::from_slice(&a.body).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn tool_hook_allows_rewrites_and_stops() {
    let (_upstream, _server, session, guard) = setup(None, None).await;
    let base = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();
    let msg = |content: &str| json!({"role": "tool", "tool_call_id": "call_1", "content": content});
    assert_eq!(
        post_tool(
            &base,
            &secret,
            json!({"phase": "before", "message": msg("ok")})
        )
        .await,
        (200, json!({"action": "allow"}))
    );
    let (status, v) = post_tool(
        &base,
        &secret,
        json!({"phase": "before", "message": msg("secret")}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(v["action"], "rewrite");
    assert_eq!(v["message"]["content"], "[redacted]");
    let (status, v) = post_tool(
        &base,
        &secret,
        json!({"phase": "sideways", "message": msg("x")}),
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert!(v["error"].as_str().expect("error").contains("phase"));
    let (status, _) = post_tool(
        &base,
        guard.state_secret.expose(),
        json!({"phase": "before", "message": msg("x")}),
    )
    .await;
    assert_eq!(status, 401, "the state secret is not a model secret");
    assert_eq!(
        post_tool(
            &base,
            &secret,
            json!({"phase": "after", "message": msg("rm -rf")})
        )
        .await,
        (200, json!({"action": "stop", "reason": "dangerous_tool"}))
    );
    assert_eq!(session.stop_condition().as_deref(), Some("dangerous_tool"));
    guard.close().await;
    let (status, _) = post_tool(
        &base,
        &secret,
        json!({"phase": "before", "message": msg("ok")}),
    )
    .await;
    assert_eq!(status, 409);
}

#[tokio::test]
async fn shared_tool_servers_reach_state_with_a_service_secret_and_route_header() {
    let service = Secret::generate();
    let h = Harness::with_config(ServerConfig {
        service_secrets: vec![service.clone()],
        ..ServerConfig::default()
    })
    .await;
    let (session_a, _wa, guard_a) = h.session("shared-a").await;
    let (session_b, _wb, guard_b) = h.session("shared-b").await;
    let c = client();
    let base = guard_a.base_url.clone();
    let put = |secret: &str, route: Option<&str>, body: &'static str| {
        let mut r = http::Request::put(format!("{base}/state"))
            .header("authorization", format!("Bearer {secret}"));
        if let Some(route) = route {
            r = r.header(STATE_ROUTE_HEADER, route);
        }
        r.body(Full::new(Bytes::from_static(body.as_bytes())))
            .expect("req")
    };
    let ok = c
        .request(put(service.expose(), Some("shared-b"), r#"{"n": 2}"#))
        .await
        .expect("put");
    assert_eq!(ok.status(), 200);
    assert_eq!(session_b.state(), json!({"n": 2}));
    assert_eq!(
        session_a.state(),
        Value::Null,
        "no session sees another's state"
    );
    // The Python implementation's header name works too.
    let legacy = http::Request::put(format!("{}/state", guard_b.base_url))
        .header("authorization", format!("Bearer {}", service.expose()))
        .header("x-verifiers-state-route", "shared-b")
        .body(Full::new(Bytes::from_static(br#"{"n": 3}"#)))
        .expect("req");
    assert_eq!(c.request(legacy).await.expect("put").status(), 200);
    assert_eq!(session_b.state(), json!({"n": 3}));
    let no_route = c
        .request(put(service.expose(), None, "{}"))
        .await
        .expect("put");
    assert_eq!(no_route.status(), 401);
    let wrong = c
        .request(put("not-a-service-secret", Some("shared-b"), "{}"))
        .await
        .expect("put");
    assert_eq!(wrong.status(), 401);
    // A model secret never reaches state, even with a route header.
    let model = c
        .request(put(guard_a.model_secret.expose(), Some("shared-a"), "{}"))
        .await
        .expect("put");
    assert_eq!(model.status(), 401);
    let state_secret = guard_a.state_secret.expose().to_owned();
    guard_a.close().await;
    let late = c
        .request(put(&state_secret, None, "{}"))
        .await
        .expect("put");
    assert_eq!(late.status(), 409, "state writes after release get 409");
    let body = late.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(
        serde_json::from_slice::<Value>(&body).expect("json"),
        json!({"error": "rollout concluded"})
    );
    guard_b.close().await;
}
