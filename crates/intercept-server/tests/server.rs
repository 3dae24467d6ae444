//! The interception server through real HTTP against the mock upstream.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use intercept_core::internal::MAX_JSON_DEPTH;
use intercept_core::{ErrorKind, Interception, Limits, Session, SessionStatus, Upstream};
use intercept_server::{ServerConfig, GENERATED_HEADER};
use intercept_test::{Reply, ToolCall};
use serde_json::json;

#[tokio::test]
async fn json_call_imposes_model_and_sampling_and_records_once() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("rollout-a").await;
    let mut body = chat_body("hello there", false);
    body["temperature"] = json!(1.5);
    let answer = post(
        &guard.base_url,
        "/v1/chat/completions",
        Some(guard.model_secret.expose()),
        serde_json::to_vec(&body).expect("json"),
        &[("openai-beta", "feature-x"), ("x-api-key", "must-not-leak")],
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let v = answer.json();
    assert_eq!(v["choices"][0]["message"]["content"], "echo: hello there");
    assert!(answer.headers.get(GENERATED_HEADER).is_none());

    let sent = h.upstream.last_request().expect("upstream saw the call");
    let sent_body = sent.json().expect("json body");
    assert_eq!(sent_body["model"], "policy-model");
    assert_eq!(sent_body["temperature"], 0.25);
    assert_eq!(sent.header("authorization"), Some("Bearer sk-upstream-key"));
    assert_eq!(sent.header("x-session-id"), Some("rollout-a"));
    assert_eq!(sent.header("openai-beta"), Some("feature-x"));
    assert_eq!(sent.header("x-api-key"), None);

    let trace = session.trace();
    assert_eq!(trace.calls.len(), 1);
    let record = &trace.calls[0];
    assert_eq!(record.session, "rollout-a");
    assert_eq!(record.seq, 0);
    assert_eq!(record.model, "policy-model");
    assert_eq!(record.endpoint, "/chat/completions");
    assert!(!record.stream);
    assert_eq!(record.status, 200);
    assert!(record.error.is_none());
    assert_eq!(record.finish_reason.as_deref(), Some("stop"));
    assert!(record.usage.prompt_tokens > 0 && record.usage.completion_tokens > 0);
    assert_eq!(record.sampling.get("temperature"), Some(&json!(0.25)));
    assert_eq!(record.request.to_value(), *sent_body);
    assert_eq!(record.response.as_ref().expect("response").to_value(), v);
    assert!(record.ended_at >= record.started_at);
    // The record serialises to one JSON line.
    let line = record.to_json_line();
    assert!(!line.contains('\n'));
    let back: intercept_core::CallRecord = serde_json::from_str(&line).expect("round trip");
    assert_eq!(&back, record);
    guard.close().await;
    assert_eq!(session.status(), SessionStatus::Released);
    h.server.stop().await.expect("stop");
}

async fn read_stream(base_url: &str, secret: &str, body: &serde_json::Value) -> (u16, String) {
    let a = post_json(base_url, Some(secret), body).await;
    (a.status, a.text())
}

fn sse_data(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|e| {
            e.lines()
                .find_map(|l| l.strip_prefix("data: "))
                .map(str::to_owned)
        })
        .collect()
}

#[tokio::test]
async fn stream_is_relayed_with_done_last_and_assembled_for_the_record() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("rollout-s").await;
    h.upstream.push(
        Reply::text("one two three four five")
            .with_reasoning("thinking hard")
            .with_chunks(5),
    );
    let (status, text) = read_stream(
        &guard.base_url,
        guard.model_secret.expose(),
        &chat_body("x", true),
    )
    .await;
    assert_eq!(status, 200);
    let data = sse_data(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{text}");
    let mut content = String::new();
    for d in &data[..data.len() - 1] {
        let chunk: serde_json::Value = serde_json::from_str(d).expect("chunk");
        // The usage-only chunk the harness did not ask for is not relayed.
        assert!(
            !chunk["choices"].as_array().expect("choices").is_empty(),
            "{d}"
        );
        if let Some(c) = chunk["choices"][0]["delta"]["content"].as_str() {
            content.push_str(c);
        }
    }
    assert_eq!(content, "one two three four five");
    let sent = h.upstream.last_request().expect("sent");
    assert_eq!(
        sent.json().expect("json")["stream_options"]["include_usage"],
        true
    );

    let trace = session.trace();
    assert_eq!(trace.calls.len(), 1);
    let r = &trace.calls[0];
    assert!(r.stream && r.error.is_none(), "{:?}", r.error);
    let resp = r.response.as_ref().expect("assembled").to_value();
    assert_eq!(resp["object"], "chat.completion");
    assert_eq!(
        resp["choices"][0]["message"]["content"],
        "one two three four five"
    );
    assert_eq!(
        resp["choices"][0]["message"]["reasoning_content"],
        "thinking hard"
    );
    assert!(
        r.usage.completion_tokens > 0,
        "usage assembled from the stream: {:?}",
        r.usage
    );
    assert!(r.ttfb_ms.is_some());
    guard.close().await;
}

#[tokio::test]
async fn streamed_tool_calls_are_assembled() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("rollout-t").await;
    h.upstream
        .push(Reply::tool_call("search", r#"{"query":"rust sse"}"#).with_chunks(3));
    let (status, text) = read_stream(
        &guard.base_url,
        guard.model_secret.expose(),
        &chat_body("find", true),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let r = &session.trace().calls[0];
    let resp = r.response.as_ref().expect("assembled").to_value();
    let call = &resp["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "search");
    assert_eq!(call["function"]["arguments"], r#"{"query":"rust sse"}"#);
    assert_eq!(r.finish_reason.as_deref(), Some("tool_calls"));
    let _ = ToolCall::new("x", "{}");
    guard.close().await;
}

#[tokio::test]
async fn bad_inputs_get_their_status_and_shape() {
    let h = Harness::with_config(ServerConfig {
        body_limit: 4096,
        ..ServerConfig::default()
    })
    .await;
    let (session, _w, guard) = h.session("rollout-bad").await;
    let base = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();
    let check = |a: &Answer, status: u16, needle: &str, ty: &str| {
        assert_eq!(a.status, status, "{}", a.text());
        let v = a.json();
        let msg = v["error"]["message"].as_str().expect("message");
        assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
        assert_eq!(v["error"]["type"], ty);
        assert_eq!(a.headers.get(GENERATED_HEADER).expect("marker"), "client");
    };
    check(
        &post_json(&base, None, &chat_body("x", false)).await,
        401,
        "unauthorized",
        "authentication_error",
    );
    check(
        &post_json(&base, Some("not-a-secret"), &chat_body("x", false)).await,
        401,
        "unauthorized",
        "authentication_error",
    );
    // The state secret is not a model secret.
    check(
        &post_json(
            &base,
            Some(guard.state_secret.expose()),
            &chat_body("x", false),
        )
        .await,
        401,
        "unauthorized",
        "authentication_error",
    );
    check(
        &post(
            &base,
            "/v1/chat/completions",
            Some(&secret),
            "{not json",
            &[],
        )
        .await,
        400,
        "not valid JSON",
        "invalid_request_error",
    );
    check(
        &post(&base, "/v1/chat/completions", Some(&secret), "[1,2]", &[]).await,
        400,
        "must be a JSON object",
        "invalid_request_error",
    );
    check(
        &post(&base, "/v1/chat/completions", Some(&secret), "{}", &[]).await,
        400,
        "`messages` is required",
        "invalid_request_error",
    );
    let big = format!("{{\"messages\":[],\"pad\":\"{}\"}}", "x".repeat(5000));
    check(
        &post(&base, "/v1/chat/completions", Some(&secret), big, &[]).await,
        413,
        "exceeds the limit of 4096 bytes",
        "request_too_large",
    );
    let nf = post(&base, "/v1/nothing", Some(&secret), "{}", &[]).await;
    assert_eq!(nf.status, 404);
    assert_eq!(
        h.upstream.request_count(),
        0,
        "no bad input reached the upstream"
    );
    assert!(
        session.trace().calls.is_empty(),
        "refused requests are not calls"
    );
    guard.close().await;
    check(
        &post_json(&base, Some(&secret), &chat_body("late", false)).await,
        409,
        "rollout concluded",
        "invalid_request_error",
    );
}

#[tokio::test]
async fn limits_stop_the_rollout_before_the_call() {
    let h = Harness::new().await;
    let mut config = h.session_config("rollout-limits");
    config.limits = Limits {
        max_turns: Some(2),
        ..Limits::default()
    };
    let (session, _w, guard) = h.session_with(config).await;
    for _ in 0..2 {
        assert_eq!(
            post_json(
                &guard.base_url,
                Some(guard.model_secret.expose()),
                &chat_body("x", false)
            )
            .await
            .status,
            200
        );
    }
    let a = post_json(
        &guard.base_url,
        Some(guard.model_secret.expose()),
        &chat_body("x", false),
    )
    .await;
    assert_eq!(a.status, 400);
    assert_eq!(a.json()["error"]["message"], "rollout stopped: max_turns");
    assert_eq!(session.status(), SessionStatus::Stopped);
    assert_eq!(session.trace().stop_condition.as_deref(), Some("max_turns"));
    assert_eq!(h.upstream.request_count(), 2);
    guard.close().await;
}

#[tokio::test]
async fn upstream_errors_keep_their_status() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("rollout-up").await;
    let secret = guard.model_secret.expose().to_owned();
    h.upstream
        .push(Reply::error(429, "slow down").with_retry_after(7));
    let a = post_json(&guard.base_url, Some(&secret), &chat_body("x", false)).await;
    assert_eq!(a.status, 429);
    assert_eq!(a.headers.get("retry-after").expect("retry-after"), "7");
    assert_eq!(a.headers.get(GENERATED_HEADER).expect("marker"), "upstream");
    assert_eq!(a.json()["error"]["type"], "rate_limit_error");
    assert!(a.json()["error"]["message"]
        .as_str()
        .expect("msg")
        .contains("slow down"));

    h.upstream.push(Reply::error(500, "engine crashed"));
    let a = post_json(&guard.base_url, Some(&secret), &chat_body("x", false)).await;
    assert_eq!(a.status, 500);
    assert_eq!(a.json()["error"]["type"], "api_error");

    h.upstream
        .push(Reply::raw(200, "text/html", "<html>bad gateway</html>"));
    let a = post_json(&guard.base_url, Some(&secret), &chat_body("x", false)).await;
    assert_eq!(a.status, 502);
    assert!(a.json()["error"]["message"]
        .as_str()
        .expect("msg")
        .contains("malformed upstream response"));

    h.upstream.push(Reply::drop_connection());
    let a = post_json(&guard.base_url, Some(&secret), &chat_body("x", false)).await;
    assert_eq!(a.status, 503, "{}", a.text());

    let kinds: Vec<ErrorKind> = session
        .trace()
        .calls
        .iter()
        .map(|c| c.error.as_ref().expect("error").kind)
        .collect();
    assert_eq!(
        kinds,
        vec![
            ErrorKind::UpstreamStatus,
            ErrorKind::UpstreamStatus,
            ErrorKind::UpstreamMalformed,
            ErrorKind::UpstreamUnavailable
        ]
    );
    // Errors do not count as turns.
    assert_eq!(session.totals().turns, 0);
    guard.close().await;
}

#[tokio::test]
async fn unreachable_upstream_is_503_and_timeout_is_504() {
    let h = Harness::with_config(ServerConfig {
        upstream_timeout: Some(Duration::from_millis(200)),
        ..ServerConfig::default()
    })
    .await;
    // A port nobody listens on.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let mut config = h.session_config("rollout-down");
    config.upstream = Upstream::new(format!("http://127.0.0.1:{port}/v1"));
    let (session, _w, guard) = h.session_with(config).await;
    let a = post_json(
        &guard.base_url,
        Some(guard.model_secret.expose()),
        &chat_body("x", false),
    )
    .await;
    assert_eq!(a.status, 503, "{}", a.text());
    assert!(a.json()["error"]["message"]
        .as_str()
        .expect("msg")
        .contains("cannot connect"));

    let (session2, _w2, guard2) = h.session("rollout-slow").await;
    h.upstream.push(Reply::hang());
    let a = post_json(
        &guard2.base_url,
        Some(guard2.model_secret.expose()),
        &chat_body("x", false),
    )
    .await;
    assert_eq!(a.status, 504, "{}", a.text());
    assert_eq!(session.trace().calls.len(), 1);
    assert_eq!(
        session2.trace().calls[0].error.as_ref().expect("err").kind,
        ErrorKind::UpstreamTimeout
    );
    guard.close().await;
    guard2.close().await;
}

#[tokio::test]
async fn an_upstream_refusing_a_large_body_before_reading_it_is_relayed() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    // An engine behind a proxy with a body size limit: it reads the request head,
    // answers 413 and closes without reading the body.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            let body = r#"{"error":{"message":"request body over the 1 MiB limit","type":"invalid_request_error"}}"#;
            let reply = format!(
                "HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(reply.as_bytes()).await;
        }
    });
    let h = Harness::new().await;
    let mut config = h.session_config("rollout-big");
    config.upstream = Upstream::new(format!("http://{addr}/v1"));
    let (session, _w, guard) = h.session_with(config).await;
    let a = post_json(
        &guard.base_url,
        Some(guard.model_secret.expose()),
        &chat_body(&"x".repeat(16 << 20), false),
    )
    .await;
    assert_eq!(a.status, 413, "{}", a.text());
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .expect("msg")
            .contains("over the 1 MiB limit"),
        "{}",
        a.text()
    );
    let calls = session.trace().calls;
    assert_eq!(calls.len(), 1);
    assert_eq!(
        calls[0].error.as_ref().expect("error").kind,
        ErrorKind::UpstreamStatus
    );
    guard.close().await;
}

#[tokio::test]
async fn upstreams_that_stop_taking_or_sending_bytes_time_out_and_are_recorded() {
    use tokio::io::AsyncReadExt as _;
    // An engine that reads the request head (and, for a small body, the body) and then
    // neither reads on, nor answers, nor closes.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut socket, _)) = listener.accept().await {
            let mut buf = [0u8; 64 * 1024];
            let _ = socket.read(&mut buf).await;
            held.push(socket);
        }
    });
    let h = Harness::with_config(ServerConfig {
        upstream_write_idle: Some(Duration::from_millis(300)),
        upstream_read_idle: Some(Duration::from_millis(300)),
        ..ServerConfig::default()
    })
    .await;
    let mut config = h.session_config("rollout-stalled");
    config.upstream = Upstream::new(format!("http://{addr}/v1"));
    let (session, _w, guard) = h.session_with(config).await;
    // 16 MiB the engine never takes: the write idle timeout.
    let a = tokio::time::timeout(
        Duration::from_secs(30),
        post_json(
            &guard.base_url,
            Some(guard.model_secret.expose()),
            &chat_body(&"x".repeat(16 << 20), false),
        ),
    )
    .await
    .expect("answered");
    assert_eq!(a.status, 504, "{}", a.text());
    assert!(a.text().contains("write idle timeout"), "{}", a.text());
    // A small request it takes but never answers: the read idle timeout.
    let a = tokio::time::timeout(
        Duration::from_secs(30),
        post_json(
            &guard.base_url,
            Some(guard.model_secret.expose()),
            &chat_body("hi", false),
        ),
    )
    .await
    .expect("answered");
    assert_eq!(a.status, 504, "{}", a.text());
    assert!(a.text().contains("read idle timeout"), "{}", a.text());
    let calls = session.trace().calls;
    assert_eq!(calls.len(), 2);
    for call in &calls {
        assert_eq!(
            call.error.as_ref().expect("error").kind,
            ErrorKind::UpstreamTimeout
        );
    }
    guard.close().await;
}

#[tokio::test]
async fn context_length_error_stops_the_rollout_cleanly() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("rollout-ctx").await;
    h.upstream.push(Reply::context_length_error());
    let a = post_json(
        &guard.base_url,
        Some(guard.model_secret.expose()),
        &chat_body("x", false),
    )
    .await;
    assert_eq!(a.status, 400);
    assert_eq!(
        a.json()["error"]["message"],
        "rollout stopped: context_length"
    );
    assert_eq!(session.stop_condition().as_deref(), Some("context_length"));
    let trace = session.trace();
    assert_eq!(trace.calls.len(), 1);
    assert_eq!(trace.calls[0].status, 400);
    // Further calls are refused without reaching the upstream.
    let a = post_json(
        &guard.base_url,
        Some(guard.model_secret.expose()),
        &chat_body("x", false),
    )
    .await;
    assert_eq!(a.status, 400);
    assert_eq!(h.upstream.request_count(), 1);
    guard.close().await;
}

#[tokio::test]
async fn keepalive_comment_lines_flow_while_the_upstream_is_silent() {
    let h = Harness::with_config(ServerConfig {
        keepalive: Duration::from_millis(30),
        ..ServerConfig::default()
    })
    .await;
    let (session, _w, guard) = h.session("rollout-ka").await;
    h.upstream.push(
        Reply::text("slow answer")
            .with_chunks(2)
            .with_chunk_delay(Duration::from_millis(150)),
    );
    let (status, text) = read_stream(
        &guard.base_url,
        guard.model_secret.expose(),
        &chat_body("x", true),
    )
    .await;
    assert_eq!(status, 200);
    assert!(text.contains(": keepalive\n"), "{text}");
    assert!(
        !text.contains(": keepalive\n\n"),
        "a keepalive never closes an event: {text}"
    );
    assert_eq!(session.trace().calls.len(), 1);
    assert!(session.trace().calls[0].error.is_none());
    guard.close().await;
}

#[tokio::test]
async fn stream_without_done_is_a_recorded_error_and_an_error_event() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("rollout-trunc").await;
    h.upstream.push(Reply::text("cut short").without_done());
    let (status, text) = read_stream(
        &guard.base_url,
        guard.model_secret.expose(),
        &chat_body("x", true),
    )
    .await;
    assert_eq!(status, 200);
    let last = sse_data(&text).pop().expect("events");
    let v: serde_json::Value = serde_json::from_str(&last).expect("error event");
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("msg")
            .contains("terminal event"),
        "{text}"
    );
    let r = &session.trace().calls[0];
    assert_eq!(
        r.error.as_ref().expect("error").kind,
        ErrorKind::UpstreamMalformed
    );
    guard.close().await;
}

#[tokio::test]
async fn harness_disconnect_mid_stream_still_records_the_whole_turn() {
    let h = Harness::new().await;
    let (session, waiter, guard) = h.session("rollout-dc").await;
    h.upstream.push(
        Reply::text("a b c d e f g h")
            .with_chunks(8)
            .with_chunk_delay(Duration::from_millis(40)),
    );
    let req = http::Request::post(format!("{}/v1/chat/completions", guard.base_url))
        .header(
            "authorization",
            format!("Bearer {}", guard.model_secret.expose()),
        )
        .body(Full::new(Bytes::from(
            serde_json::to_vec(&chat_body("x", true)).expect("json"),
        )))
        .expect("req");
    let client = client();
    let resp = client.request(req).await.expect("resp");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a frame").expect("ok");
    assert!(first.is_data());
    drop(body);
    drop(client);
    waiter.wait_for(1).await;
    let trace = session.trace();
    assert_eq!(trace.calls.len(), 1, "exactly one record");
    let r = &trace.calls[0];
    assert!(r.client_disconnected);
    assert!(r.error.is_none(), "{:?}", r.error);
    let resp = r.response.as_ref().expect("assembled").to_value();
    assert_eq!(resp["choices"][0]["message"]["content"], "a b c d e f g h");
    guard.close().await;
}

#[tokio::test]
async fn release_mid_call_cancels_and_records_once() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("rollout-rel").await;
    h.upstream.push(Reply::hang());
    let base = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();
    let call =
        tokio::spawn(async move { post_json(&base, Some(&secret), &chat_body("x", false)).await });
    h.upstream.wait_for_requests(1).await;
    guard.close().await;
    let a = call.await.expect("join");
    assert_eq!(a.status, 409, "{}", a.text());
    assert_eq!(a.json()["error"]["message"], "rollout concluded");
    let trace = session.trace();
    assert_eq!(trace.calls.len(), 1);
    assert_eq!(
        trace.calls[0].error.as_ref().expect("err").kind,
        ErrorKind::Cancelled
    );
    assert_eq!(session.status(), SessionStatus::Released);
    assert_eq!(h.server.load(), 0);
}

#[tokio::test]
async fn dropping_the_guard_frees_the_slot() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("rollout-drop").await;
    assert_eq!(h.server.load(), 1);
    let base = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();
    drop(guard);
    assert_eq!(h.server.load(), 0);
    assert_eq!(session.status(), SessionStatus::Released);
    assert_eq!(
        post_json(&base, Some(&secret), &chat_body("x", false))
            .await
            .status,
        409
    );
}

#[tokio::test]
async fn state_channel_is_a_separate_capability() {
    let h = Harness::new().await;
    let mut config = h.session_config("rollout-state");
    config.task = Some(json!({"prompt": "add 2+2"}));
    let (session, _w, guard) = h.session_with(config).await;
    let c = client();
    let send = |method: &str, secret: &str, body: &'static str| {
        http::Request::builder()
            .method(method)
            .uri(format!("{}/state", guard.base_url))
            .header("authorization", format!("Bearer {secret}"))
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .expect("req")
    };
    let put = c
        .request(send(
            "PUT",
            guard.state_secret.expose(),
            r#"{"counter": 3}"#,
        ))
        .await
        .expect("put");
    assert_eq!(put.status(), 200);
    assert_eq!(session.state(), json!({"counter": 3}));
    let bad = c
        .request(send("PUT", guard.state_secret.expose(), "{oops"))
        .await
        .expect("put");
    assert_eq!(bad.status(), 400);
    let denied = c
        .request(send("GET", guard.model_secret.expose(), ""))
        .await
        .expect("get");
    assert_eq!(denied.status(), 401, "a model secret never reaches state");
    let got = c
        .request(send("GET", guard.state_secret.expose(), ""))
        .await
        .expect("get");
    let body = got.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).expect("json"),
        json!({"counter": 3})
    );
    guard.close().await;
}

#[tokio::test]
async fn stop_lets_in_flight_calls_finish() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("rollout-stop").await;
    h.upstream
        .push(Reply::text("finishing").with_header_delay(Duration::from_millis(200)));
    let base = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();
    let call =
        tokio::spawn(async move { post_json(&base, Some(&secret), &chat_body("x", false)).await });
    h.upstream.wait_for_requests(1).await;
    h.server.stop().await.expect("stop");
    let a = call.await.expect("join");
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(session.trace().calls.len(), 1);
    assert!(session.trace().calls[0].error.is_none());
    drop(guard);
}

#[tokio::test]
async fn stop_cancels_calls_that_outlive_the_grace_period() {
    let h = Harness::with_config(ServerConfig {
        shutdown_grace: Duration::from_millis(100),
        ..ServerConfig::default()
    })
    .await;
    let (session, _w, guard) = h.session("rollout-grace").await;
    h.upstream.push(Reply::hang());
    let base = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();
    let call =
        tokio::spawn(async move { post_json(&base, Some(&secret), &chat_body("x", false)).await });
    h.upstream.wait_for_requests(1).await;
    h.server.stop().await.expect("stop");
    let a = call.await.expect("join");
    assert_eq!(a.status, 503, "{}", a.text());
    let trace = session.trace();
    assert_eq!(trace.calls.len(), 1);
    assert_eq!(
        trace.calls[0].error.as_ref().expect("err").kind,
        ErrorKind::Cancelled
    );
    drop(guard);
}

#[tokio::test]
async fn models_route_answers_with_the_session_model() {
    let h = Harness::new().await;
    let (_s, _w, guard) = h.session("rollout-models").await;
    let req = http::Request::get(format!("{}/v1/models", guard.base_url))
        .header(
            "authorization",
            format!("Bearer {}", guard.model_secret.expose()),
        )
        .body(Full::new(Bytes::new()))
        .expect("req");
    let resp = client().request(req).await.expect("resp");
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .expect("data")
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert!(ids.contains(&"policy-model"), "{ids:?}");
    guard.close().await;
}

#[tokio::test]
async fn secrets_never_reach_the_logs() {
    use std::io::Write;
    #[derive(Clone, Default)]
    struct Buf(Arc<parking_lot::Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    // The server logs from its event loops' threads: the subscriber is the process's
    // (the other tests of this binary log into it too; only this test sets it).
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber");
    let h = Harness::new().await;
    let (_s, _w, guard) = h.session("rollout-logs").await;
    h.upstream.push(Reply::error(500, "boom"));
    post_json(
        &guard.base_url,
        Some(guard.model_secret.expose()),
        &chat_body("x", false),
    )
    .await;
    post_json(
        &guard.base_url,
        Some(guard.model_secret.expose()),
        &chat_body("x", true),
    )
    .await;
    post_json(
        &guard.base_url,
        Some("wrong-secret"),
        &chat_body("x", false),
    )
    .await;
    let model_secret = guard.model_secret.expose().to_owned();
    let state_secret = guard.state_secret.expose().to_owned();
    guard.close().await;
    h.server.stop().await.expect("stop");
    let logs = String::from_utf8_lossy(&buf.0.lock()).into_owned();
    assert!(
        logs.lines()
            .any(|l| l.contains("model call failed") && l.contains("rollout-logs")),
        "logging was captured: {logs}"
    );
    for secret in [
        model_secret.as_str(),
        state_secret.as_str(),
        "sk-upstream-key",
    ] {
        assert!(!logs.contains(secret), "a secret leaked into the logs");
    }
}

#[tokio::test]
async fn slow_first_byte_is_answered_early_and_kept_alive() {
    let config = ServerConfig {
        first_byte_timeout: Duration::from_millis(50),
        keepalive: Duration::from_millis(30),
        stream_heartbeat: intercept_server::StreamHeartbeat::Comment,
        ..ServerConfig::default()
    };
    let h = Harness::with_config(config).await;
    let (session, _w, guard) = h.session("rollout-slow-head").await;
    h.upstream
        .push(Reply::text("late but fine").with_header_delay(Duration::from_millis(250)));
    let (status, text) = read_stream(
        &guard.base_url,
        guard.model_secret.expose(),
        &chat_body("x", true),
    )
    .await;
    assert_eq!(status, 200);
    assert!(text.starts_with(": keepalive\n"), "{text}");
    assert_eq!(sse_data(&text).last().map(String::as_str), Some("[DONE]"));
    assert!(session.trace().calls[0].error.is_none());

    // An upstream error after the early answer arrives as an SSE error event.
    h.upstream
        .push(Reply::error(503, "overloaded").with_header_delay(Duration::from_millis(250)));
    let (status, text) = read_stream(
        &guard.base_url,
        guard.model_secret.expose(),
        &chat_body("x", true),
    )
    .await;
    assert_eq!(status, 200);
    let last = sse_data(&text).pop().expect("an event");
    let v: serde_json::Value = serde_json::from_str(&last).expect("error event");
    assert_eq!(v["error"]["type"], "api_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .expect("msg")
            .contains("overloaded"),
        "{text}"
    );
    let calls = session.trace().calls;
    assert_eq!(calls.len(), 2);
    assert_eq!(
        calls[1].error.as_ref().expect("err").kind,
        ErrorKind::UpstreamStatus
    );

    // Before the threshold, errors keep their status.
    h.upstream.push(Reply::error(429, "slow down"));
    let a = post_json(
        &guard.base_url,
        Some(guard.model_secret.expose()),
        &chat_body("x", true),
    )
    .await;
    assert_eq!(a.status, 429);
    guard.close().await;
}

/// A chat call whose `tools[0].function.parameters` is `depth` nested arrays.
fn deep_tools_body(depth: usize) -> Vec<u8> {
    let params = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"tools":[{{"type":"function","function":{{"name":"f","parameters":{params}}}}}]}}"#
    )
    .into_bytes()
}

#[tokio::test]
async fn deep_or_broken_json_is_refused_in_the_dialects_shape_and_traces_stay_whole() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("rollout-deep").await;
    let base = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();
    // tools[0].function.parameters sits 4 levels down: 123 more is the deepest accepted.
    h.upstream.push(Reply::text("ok"));
    let a = post(
        &base,
        "/v1/chat/completions",
        Some(&secret),
        deep_tools_body(MAX_JSON_DEPTH - 4),
        &[],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    for depth in [MAX_JSON_DEPTH - 3, 140, 100_000] {
        let a = post(
            &base,
            "/v1/chat/completions",
            Some(&secret),
            deep_tools_body(depth),
            &[],
        )
        .await;
        assert_eq!(a.status, 400, "{}", a.text());
        let v = a.json();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("more than 127 levels deep")),
            "{v}"
        );
    }
    // The Messages dialect answers in its own shape.
    let deep_array = format!("{}{}", "[".repeat(200), "]".repeat(200));
    let a = post(
        &base,
        "/v1/messages",
        None,
        deep_array,
        &[("x-api-key", &secret)],
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.text());
    let v = a.json();
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("levels deep")),
        "{v}"
    );
    // Invalid UTF-8 is named as such, not as "not an object".
    let a = post(
        &base,
        "/v1/chat/completions",
        Some(&secret),
        b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}".to_vec(),
        &[],
    )
    .await;
    assert_eq!(a.status, 400, "{}", a.text());
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("not valid UTF-8")),
        "{}",
        a.text()
    );
    assert_eq!(
        h.upstream.request_count(),
        1,
        "only the accepted call went up"
    );
    // The accepted call's record reads back as a value, tools and all.
    let trace = session.trace();
    assert_eq!(trace.calls.len(), 1);
    let back: intercept_core::session::Trace =
        serde_json::from_slice(&trace.to_json_vec()).expect("trace json");
    let request = back.calls[0].request.to_value();
    assert_ne!(request["tools"], serde_json::Value::Null, "{request}");
    assert_ne!(
        serde_json::to_value(&trace).expect("value"),
        serde_json::Value::Null
    );
    guard.close().await;
}
