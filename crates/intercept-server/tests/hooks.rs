//! Request, response and tool hooks; shared tool servers on the state channel; failed
//! Responses answers and keepalives while a response hook buffers a stream. Everything
//! goes through real HTTP: the server on `127.0.0.1`, a hyper client, the mock upstream.

mod common;

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use intercept_core::{
    CallInfo, CallRecord, DialectKind, Error, ErrorKind, HookAction, Interception, JsonBody,
    RolloutSession, Secret, Session, ToolAction, ToolPhase, Upstream,
};
use intercept_server::{InterceptionServer, ServerConfig, GENERATED_HEADER, STATE_ROUTE_HEADER};
use intercept_test::{MockUpstream, Reply};
use serde_json::{json, Value};

/// Bounds a test: a hang fails it instead of stalling the run.
async fn within<T>(test: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), test)
        .await
        .expect("the test finished within 30 s")
}

/// What a [`Hooked`] session's request hook does.
#[derive(Debug, Clone, Default)]
enum RequestHook {
    /// Sets `user` to `hooked` and goes on.
    #[default]
    Rewrite,
    /// Stops the rollout with this reason.
    Stop(&'static str),
    /// Fails with this error when the first message's content is `fail`; otherwise as
    /// `Rewrite`.
    Fail(Error),
}

/// A session with hooks around a [`RolloutSession`].
#[derive(Debug)]
struct Hooked {
    inner: RolloutSession,
    rewrite_to: Option<String>,
    stop_on: Option<String>,
    request: RequestHook,
    /// Times the request hook ran.
    request_calls: AtomicUsize,
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
    fn stop_reason(&self) -> Option<intercept_core::StopReason> {
        self.inner.stop_reason()
    }
    fn stop_with(&self, reason: intercept_core::StopReason) {
        self.inner.stop_with(reason)
    }
    fn on_release(&self) {
        self.inner.on_release()
    }
    async fn on_request(&self, _call: &CallInfo, body: &mut JsonBody) -> Result<HookAction, Error> {
        self.request_calls.fetch_add(1, Ordering::SeqCst);
        match &self.request {
            RequestHook::Stop(reason) => return Ok(HookAction::Stop((*reason).into())),
            RequestHook::Fail(e) if body.to_value()["messages"][0]["content"] == "fail" => {
                return Err(e.clone())
            }
            RequestHook::Fail(_) | RequestHook::Rewrite => {}
        }
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

/// The hooks of a [`Hooked`] session.
#[derive(Debug, Default)]
struct Hooks {
    /// The response hook rewrites the answer's content to this.
    rewrite_to: Option<String>,
    /// The response hook stops the rollout (`found_answer`) when the answer contains this.
    stop_on: Option<String>,
    request: RequestHook,
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
    let config = ServerConfig {
        inspect_memory: 64,
        ..ServerConfig::default()
    };
    let hooks = Hooks {
        rewrite_to: rewrite_to.map(str::to_owned),
        stop_on: stop_on.map(str::to_owned),
        ..Hooks::default()
    };
    setup_with(config, hooks).await
}

/// A mock upstream, a started server and one [`Hooked`] session on it.
async fn setup_with(
    config: ServerConfig,
    hooks: Hooks,
) -> (
    MockUpstream,
    InterceptionServer,
    Arc<Hooked>,
    intercept_core::SlotGuard,
) {
    let h = Harness::with_config(config).await;
    let session = Arc::new(Hooked {
        inner: RolloutSession::new(h.session_config("hooked")),
        rewrite_to: hooks.rewrite_to,
        stop_on: hooks.stop_on,
        request: hooks.request,
        request_calls: AtomicUsize::new(0),
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
    // The flat channel's errors carry the same headers as every other error.
    assert_eq!(late.headers()["x-intercept-error"], "client");
    assert_eq!(late.headers()["x-should-retry"], "false");
    let body = late.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(
        serde_json::from_slice::<Value>(&body).expect("json"),
        json!({"error": "rollout concluded"})
    );
    guard_b.close().await;
}

/// The OpenAI error body the server generates (Chat Completions, Responses).
fn openai_error(message: &str, error_type: &str) -> Value {
    json!({"error": {"message": message, "type": error_type, "param": null, "code": null}})
}

#[tokio::test]
async fn request_hook_stop_refuses_the_call_before_the_upstream() {
    within(async {
        let anthropic_body = |text: &str| {
            json!({"model": "claude", "max_tokens": 32, "messages": [{"role": "user", "content": text}]})
        };
        let cases = [
            (
                "/v1/chat/completions",
                chat_body("x", false),
                openai_error("rollout stopped: request_stop", "invalid_request_error"),
            ),
            (
                "/v1/messages",
                anthropic_body("x"),
                json!({"type": "error", "error": {"type": "invalid_request_error", "message": "rollout stopped: request_stop"}}),
            ),
        ];
        for (path, body, expected) in cases {
            let hooks = Hooks {
                request: RequestHook::Stop("request_stop"),
                ..Hooks::default()
            };
            let (upstream, server, session, guard) =
                setup_with(ServerConfig::default(), hooks).await;
            let secret = guard.model_secret.expose().to_owned();
            let send = |body: &Value| {
                post(
                    &guard.base_url,
                    path,
                    Some(&secret),
                    serde_json::to_vec(body).expect("json"),
                    &[],
                )
            };
            let a = send(&body).await;
            assert_eq!(a.status, 400, "{path}: {}", a.text());
            assert_eq!(a.headers[GENERATED_HEADER], "client", "{path}");
            assert_eq!(a.headers[http::header::CONTENT_TYPE], "application/json");
            assert_eq!(a.json(), expected, "{path}");
            assert_eq!(upstream.request_count(), 0, "{path}: nothing reached the upstream");
            assert_eq!(session.request_calls.load(Ordering::SeqCst), 1);
            assert_eq!(session.stop_condition().as_deref(), Some("request_stop"));
            // A call refused before the upstream is not an exchange: no record.
            assert!(session.inner.trace().calls.is_empty(), "{path}");
            assert_eq!(server.stats().calls(), 0);

            // Later calls (streamed ones too) are refused by the stop condition before
            // the hook runs: same answer, still nothing upstream.
            let mut streamed = body.clone();
            streamed["stream"] = json!(true);
            let again = send(&streamed).await;
            assert_eq!(again.status, 400, "{path}");
            assert_eq!(again.json(), expected, "{path}");
            assert_eq!(session.request_calls.load(Ordering::SeqCst), 1);
            assert_eq!(upstream.request_count(), 0);
            assert!(session.inner.trace().calls.is_empty());
            guard.close().await;
            server.stop().await.expect("stop");
        }
    })
    .await
}

#[tokio::test]
async fn failing_request_hook_is_a_502_and_nothing_goes_upstream() {
    within(async {
        let hooks = Hooks {
            request: RequestHook::Fail(Error::Internal("policy service unreachable".into())),
            ..Hooks::default()
        };
        let (upstream, server, session, guard) = setup_with(ServerConfig::default(), hooks).await;
        let secret = guard.model_secret.expose().to_owned();
        let expected = openai_error(
            "model boundary hook failed: request hook failed: policy service unreachable",
            "api_error",
        );
        // A hook that breaks (`Error::Internal`) is a 502, streamed or not: the refusal
        // comes before any response head.
        for stream in [false, true] {
            let a = post_json(&guard.base_url, Some(&secret), &chat_body("fail", stream)).await;
            assert_eq!(a.status, 502, "stream {stream}: {}", a.text());
            assert_eq!(a.headers[GENERATED_HEADER], "internal");
            assert_eq!(a.headers[http::header::CONTENT_TYPE], "application/json");
            assert_eq!(a.json(), expected);
        }
        assert_eq!(session.request_calls.load(Ordering::SeqCst), 2);
        assert_eq!(upstream.request_count(), 0, "nothing reached the upstream");
        assert!(
            session.inner.trace().calls.is_empty(),
            "no exchange, no record"
        );
        assert_eq!(server.stats().calls(), 0);
        assert_eq!(
            session.stop_condition(),
            None,
            "a failing hook does not stop"
        );

        // The rollout goes on: the next call passes the hook and is served.
        let ok = post_json(&guard.base_url, Some(&secret), &chat_body("fine", false)).await;
        assert_eq!(ok.status, 200, "{}", ok.text());
        assert_eq!(ok.json()["choices"][0]["message"]["content"], "echo: fine");
        assert_eq!(upstream.request_count(), 1);
        let calls = session.inner.trace().calls;
        assert_eq!(calls.len(), 1);
        // The refused calls used sequence numbers 0 and 1.
        assert_eq!(calls[0].seq, 2);
        assert!(calls[0].error.is_none());
        guard.close().await;
        server.stop().await.expect("stop");
    })
    .await
}

#[tokio::test]
async fn a_request_hook_chosen_error_is_answered_as_it_is() {
    within(async {
        let hooks = Hooks {
            request: RequestHook::Fail(Error::invalid("tool output too long")),
            ..Hooks::default()
        };
        let (upstream, server, _session, guard) = setup_with(ServerConfig::default(), hooks).await;
        let secret = guard.model_secret.expose().to_owned();
        let a = post_json(&guard.base_url, Some(&secret), &chat_body("fail", false)).await;
        assert_eq!(a.status, 400, "{}", a.text());
        assert_eq!(a.headers[GENERATED_HEADER], "client");
        assert_eq!(
            a.json(),
            openai_error("tool output too long", "invalid_request_error")
        );
        assert_eq!(upstream.request_count(), 0);
        guard.close().await;
        server.stop().await.expect("stop");
    })
    .await
}

#[tokio::test]
async fn failed_responses_answer_is_an_upstream_error_over_json() {
    within(async {
        let h = Harness::new().await;
        let (session, _waiter, guard) = h.session("responses-failed").await;
        h.upstream.push(Reply::responses_failed(
            "server_error",
            "The model crashed.",
        ));
        let body = json!({"model": "m", "input": "hi"});
        let a = post(
            &guard.base_url,
            "/v1/responses",
            Some(guard.model_secret.expose()),
            serde_json::to_vec(&body).expect("json"),
            &[],
        )
        .await;
        let message = "upstream 502: upstream Responses request did not complete: failed: \
                       server_error: The model crashed.";
        assert_eq!(a.status, 502, "{}", a.text());
        assert_eq!(a.headers[GENERATED_HEADER], "upstream");
        assert_eq!(a.json(), openai_error(message, "api_error"));
        assert_eq!(h.upstream.request_count(), 1);

        let calls = session.trace().calls;
        assert_eq!(calls.len(), 1);
        let record = &calls[0];
        assert_eq!(record.dialect, DialectKind::Responses);
        assert!(!record.stream);
        assert_eq!(record.status, 502);
        let error = record.error.as_ref().expect("an error");
        assert_eq!(error.kind, ErrorKind::UpstreamStatus);
        assert_eq!(error.status, 502);
        assert_eq!(error.message, message);
        // The upstream's failed response object is not kept, only the error.
        assert!(record.response.is_none());
        assert_eq!(record.finish_reason, None);
        assert_eq!(
            record.usage.prompt_tokens + record.usage.completion_tokens,
            0
        );
        assert_eq!(session.stop_condition(), None);
        assert_eq!(h.server.stats().failed(), 1);
        guard.close().await;
        h.server.stop().await.expect("stop");
    })
    .await
}

#[tokio::test]
async fn failed_responses_stream_ends_with_an_error_event() {
    within(async {
        let h = Harness::new().await;
        let (session, _waiter, guard) = h.session("responses-failed-stream").await;
        h.upstream.push(Reply::responses_failed(
            "server_error",
            "The model crashed.",
        ));
        let body = json!({"model": "m", "input": "hi", "stream": true});
        let a = post(
            &guard.base_url,
            "/v1/responses",
            Some(guard.model_secret.expose()),
            serde_json::to_vec(&body).expect("json"),
            &[],
        )
        .await;
        let message = "upstream 502: upstream Responses request did not complete: failed: \
                       server_error: The model crashed.";
        // The head went out with the first events, so the failure arrives in-stream.
        assert_eq!(a.status, 200);
        assert_eq!(a.headers[http::header::CONTENT_TYPE], "text/event-stream");
        let text = a.text();
        let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
        assert_eq!(events.len(), 4, "{text}");
        assert!(events[0].starts_with("event: response.created\n"), "{text}");
        assert!(
            events[1].starts_with("event: response.in_progress\n"),
            "{text}"
        );
        // The upstream's terminal event is withheld and replaced by the native pair:
        // `event: error`, then `event: response.failed` with the same code and message.
        let data = |e: &str, name: &str| -> Value {
            let rest = e
                .strip_prefix(&format!("event: {name}\ndata: "))
                .unwrap_or_else(|| panic!("an `{name}` event: {text}"));
            serde_json::from_str(rest).expect("json")
        };
        let error = data(events[2], "error");
        assert_eq!(
            error,
            json!({"type": "error", "code": "server_error", "message": message, "param": null})
        );
        let failed = data(events[3], "response.failed");
        assert_eq!(failed["type"], "response.failed");
        assert_eq!(failed["response"]["status"], "failed");
        assert_eq!(
            failed["response"]["error"],
            json!({"code": "server_error", "message": message})
        );
        assert!(!text.contains("data: {\"error\""), "{text}");

        let calls = session.trace().calls;
        assert_eq!(calls.len(), 1);
        let record = &calls[0];
        assert!(record.stream);
        assert_eq!(record.status, 200, "the harness got a 200 head");
        let recorded = record.error.as_ref().expect("an error");
        assert_eq!(recorded.kind, ErrorKind::UpstreamStatus);
        assert_eq!(recorded.status, 502);
        assert_eq!(recorded.message, message);
        assert!(record.response.is_none());
        assert!(record.ttfb_ms.is_some());
        guard.close().await;
        h.server.stop().await.expect("stop");
    })
    .await
}

#[tokio::test]
async fn keepalives_flow_while_a_response_hook_buffers_a_slow_stream() {
    within(async {
        let config = ServerConfig {
            keepalive: Duration::from_millis(20),
            stream_heartbeat: intercept_server::StreamHeartbeat::Comment,
            ..ServerConfig::default()
        };
        let (upstream, server, session, guard) = setup_with(config, Hooks::default()).await;
        upstream.push(
            Reply::text("slow buffered answer")
                .with_chunks(3)
                .with_chunk_delay(Duration::from_millis(60)),
        );
        let a = post_json(
            &guard.base_url,
            Some(guard.model_secret.expose()),
            &chat_body("x", true),
        )
        .await;
        assert_eq!(a.status, 200);
        assert_eq!(a.headers[http::header::CONTENT_TYPE], "text/event-stream");
        let text = a.text();
        let first_data = text
            .find("data:")
            .unwrap_or_else(|| panic!("no event: {text}"));
        // Nothing of the answer goes out before the hook ran on all of it; keepalive
        // comment lines (never a blank line: they close no event) fill the wait.
        let before = &text[..first_data];
        assert!(before.starts_with(": keepalive\n"), "{text}");
        assert!(
            before.lines().all(|l| l == ": keepalive"),
            "only keepalives before the first event: {before:?}"
        );
        assert!(!before.contains("\n\n"), "{before:?}");
        // The buffered stream is replayed as it came, without keepalives in between.
        let replayed = &text[first_data..];
        assert!(!replayed.contains(": keepalive"), "{replayed}");
        let content: String = replayed
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
        assert_eq!(content, "slow buffered answer");
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");

        let calls = session.inner.trace().calls;
        assert_eq!(calls.len(), 1, "recorded once");
        assert!(calls[0].stream);
        assert!(calls[0].error.is_none());
        assert_eq!(calls[0].status, 200);
        let recorded = calls[0].response.as_ref().expect("response").to_value();
        assert_eq!(
            recorded["choices"][0]["message"]["content"],
            "slow buffered answer"
        );
        assert_eq!(server.stats().calls(), 1);
        assert_eq!(upstream.request_count(), 1);
        guard.close().await;
        server.stop().await.expect("stop");
    })
    .await
}

/// A session with its own tool and task channels (a tool gate's protocol, a task
/// document of its own shape) that consumes one request header.
#[derive(Debug)]
struct Gate {
    inner: RolloutSession,
    /// The headers each request hook saw.
    seen: parking_lot::Mutex<Vec<Vec<(String, String)>>>,
    /// Asks for a credential too: the server must not hand it over.
    hook_headers: Vec<String>,
    /// Signalled when a tool call that never answers has started.
    hanging: tokio::sync::Notify,
}

#[async_trait]
impl Session for Gate {
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
    fn hook_headers(&self) -> &[String] {
        &self.hook_headers
    }
    async fn on_request(&self, call: &CallInfo, _body: &mut JsonBody) -> Result<HookAction, Error> {
        self.seen.lock().push(call.headers.clone());
        match call.headers.first() {
            Some((_, v)) if v == "bad id!" => Err(Error::invalid("not a valid request id")),
            _ => Ok(HookAction::Continue),
        }
    }
    fn task_body(&self) -> Result<Value, Error> {
        Ok(json!({"cls": "tasks:Row", "task": "{\"prompt\":\"p\"}"}))
    }
    async fn tool(&self, body: &[u8]) -> Result<Value, Error> {
        let call: Value =
            serde_json::from_slice(body).map_err(|e| Error::invalid(e.to_string()))?;
        match call["tool_call_id"].as_str() {
            Some("hang") => {
                self.hanging.notify_one();
                std::future::pending().await
            }
            Some("call_1") => Ok(json!({"action": "allow"})),
            _ => Err(Error::invalid("tool gate asked about an unknown call")),
        }
    }
}

async fn get(base: &str, path: &str, secret: &str) -> (u16, Value) {
    let req = http::Request::get(format!("{base}{path}"))
        .header("authorization", format!("Bearer {secret}"))
        .body(Full::new(Bytes::new()))
        .expect("req");
    let resp = client().request(req).await.expect("response");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_session_answers_the_task_and_tool_channels_in_its_own_protocol() {
    within(async {
        let h = Harness::new().await;
        let session = Arc::new(Gate {
            inner: RolloutSession::new(h.session_config("gate")),
            seen: Default::default(),
            hook_headers: vec!["X-ACP-Model-Request-ID".into(), "authorization".into()],
            hanging: tokio::sync::Notify::new(),
        });
        let guard = h.server.acquire(session.clone()).await.expect("acquire");
        let base = guard.base_url.clone();
        let (model, state) = (
            guard.model_secret.expose().to_owned(),
            guard.state_secret.expose().to_owned(),
        );
        // GET /task: the session's whole answer, on the state secret only.
        assert_eq!(
            get(&base, "/task", &state).await,
            (
                200,
                json!({"cls": "tasks:Row", "task": "{\"prompt\":\"p\"}"})
            )
        );
        assert_eq!(get(&base, "/task", &model).await.0, 401);
        // POST /tool: the session's protocol, on the model secret only.
        let gate = |id: &str| json!({"tool_call_id": id, "name": "add", "arguments": {"a": 1}});
        assert_eq!(
            post_tool(&base, &model, gate("call_1")).await,
            (200, json!({"action": "allow"}))
        );
        assert_eq!(
            post_tool(&base, &model, gate("call_9")).await,
            (
                400,
                json!({"error": "tool gate asked about an unknown call"})
            )
        );
        assert_eq!(post_tool(&base, &state, gate("call_1")).await.0, 401);
        // The consumed header reaches the request hook (never the credential) and does
        // not go upstream; a hook's refusal of it is a 400 and nothing goes upstream.
        let ok = post(
            &base,
            "/v1/chat/completions",
            Some(&model),
            serde_json::to_vec(&chat_body("hi", false)).expect("json"),
            &[("X-ACP-Model-Request-ID", "req-1")],
        )
        .await;
        assert_eq!(ok.status, 200, "{}", ok.text());
        let bad = post(
            &base,
            "/v1/chat/completions",
            Some(&model),
            serde_json::to_vec(&chat_body("hi", false)).expect("json"),
            &[("x-acp-model-request-id", "bad id!")],
        )
        .await;
        assert_eq!(bad.status, 400);
        assert_eq!(bad.json()["error"]["message"], "not a valid request id");
        let plain = post_json(&base, Some(&model), &chat_body("hi", false)).await;
        assert_eq!(plain.status, 200);
        assert_eq!(
            *session.seen.lock(),
            vec![
                vec![("x-acp-model-request-id".to_owned(), "req-1".to_owned())],
                vec![("x-acp-model-request-id".to_owned(), "bad id!".to_owned())],
                vec![],
            ]
        );
        let upstream = h.upstream.requests();
        assert_eq!(upstream.len(), 2, "the refused call never went upstream");
        assert!(upstream
            .iter()
            .all(|r| r.header("x-acp-model-request-id").is_none()));
        assert_eq!(session.inner.trace().calls.len(), 2);
        // A tool answer in progress is dropped at release: 409, and the release is not
        // held up by it.
        let pending = tokio::spawn({
            let (base, model) = (base.clone(), model.clone());
            async move { post_tool(&base, &model, gate("hang")).await }
        });
        session.hanging.notified().await;
        guard.close().await;
        assert_eq!(
            pending.await.expect("join"),
            (409, json!({"error": "rollout concluded"}))
        );
        h.server.stop().await.expect("stop");
    })
    .await
}

#[tokio::test]
async fn the_default_task_channel_answers_id_and_task() {
    let h = Harness::new().await;
    let (_session, _waiter, guard) = h
        .session_with(
            h.session_config("with-task")
                .with_task(json!({"repo": "x"})),
        )
        .await;
    assert_eq!(
        get(&guard.base_url, "/task", guard.state_secret.expose()).await,
        (200, json!({"id": "with-task", "task": {"repo": "x"}}))
    );
    let (_s, _w, without) = h.session("no-task").await;
    assert_eq!(
        get(&without.base_url, "/task", without.state_secret.expose())
            .await
            .0,
        404
    );
    guard.close().await;
    without.close().await;
}
