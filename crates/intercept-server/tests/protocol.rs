//! Protocol details real harnesses depend on, and what upstream text may not do to an
//! answer (leak the upstream's key), through real HTTP against the mock upstream. What it
//! may not do to the logs is `log_redaction.rs`.

mod common;

use std::time::Duration;

use common::*;
use intercept_core::{Interception, Limits, Session, SessionStatus};
use intercept_server::{GENERATED_HEADER, SHOULD_RETRY_HEADER};
use intercept_test::Reply;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn should_retry(a: &Answer) -> Option<&str> {
    a.headers
        .get(SHOULD_RETRY_HEADER)
        .and_then(|v| v.to_str().ok())
}

async fn get(base_url: &str, path: &str, secret: &str) -> Answer {
    let req = http::Request::get(format!("{base_url}{path}"))
        .header("authorization", format!("Bearer {secret}"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    let resp = client().request(req).await.expect("response");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    Answer {
        status,
        headers,
        body,
    }
}

#[tokio::test]
async fn models_with_a_released_secret_is_409_like_every_other_route() {
    let h = Harness::new().await;
    let (_session, _w, guard) = h.session("models").await;
    let base = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();
    let live = get(&base, "/v1/models", &secret).await;
    assert_eq!(live.status, 200, "{}", live.text());
    assert!(
        live.json()["data"]
            .as_array()
            .expect("data")
            .iter()
            .any(|m| m["id"] == "policy-model"),
        "{}",
        live.text()
    );
    guard.close().await;
    let late = get(&base, "/v1/models", &secret).await;
    assert_eq!(late.status, 409, "{}", late.text());
    assert_eq!(late.json()["error"]["message"], "rollout concluded");
    assert_eq!(should_retry(&late), Some("false"));
    let chat = post_json(&base, Some(&secret), &chat_body("late", false)).await;
    assert_eq!(chat.status, 409);
    let unknown = get(&base, "/v1/models", "not-a-secret").await;
    assert_eq!(unknown.status, 401);
    h.server.stop().await.expect("stop");
}

#[tokio::test]
async fn answers_no_retry_can_change_say_x_should_retry_false_and_others_do_not() {
    let h = Harness::new().await;
    let mut config = h.session_config("retry-hints");
    config.limits = Limits {
        max_turns: Some(1),
        ..Limits::default()
    };
    let (session, _w, guard) = h.session_with(config).await;
    let base = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();

    // 401: an unknown secret.
    let a = post_json(&base, Some("wrong"), &chat_body("x", false)).await;
    assert_eq!(a.status, 401);
    assert_eq!(should_retry(&a), Some("false"));
    // Upstream 429 and 503 are relayed with their status, and a retry can change them.
    h.upstream
        .push(Reply::error(429, "slow down").with_retry_after(1));
    let a = post_json(&base, Some(&secret), &chat_body("x", false)).await;
    assert_eq!(a.status, 429);
    assert_eq!(should_retry(&a), None);
    h.upstream.push(Reply::error(503, "overloaded"));
    let a = post_json(&base, Some(&secret), &chat_body("x", false)).await;
    assert_eq!(a.status, 503);
    assert_eq!(should_retry(&a), None);
    // A paused server's 429 (reject) is retryable too.
    h.server
        .pause(intercept_core::PauseMode::reject(Duration::from_secs(1)))
        .await
        .expect("pause");
    let a = post_json(&base, Some(&secret), &chat_body("x", false)).await;
    assert_eq!(a.status, 429, "{}", a.text());
    assert_eq!(should_retry(&a), None);
    h.server.resume().await.expect("resume");
    // 400 stopped: the turn limit (one successful call) is reached.
    let a = post_json(&base, Some(&secret), &chat_body("x", false)).await;
    assert_eq!(a.status, 200, "{}", a.text());
    let a = post_json(&base, Some(&secret), &chat_body("x", false)).await;
    assert_eq!(a.status, 400, "{}", a.text());
    assert!(a.text().contains("rollout stopped"), "{}", a.text());
    assert_eq!(should_retry(&a), Some("false"));
    assert_eq!(
        a.headers.get(GENERATED_HEADER).map(|v| v.as_bytes()),
        Some(&b"client"[..])
    );
    // 409 concluded.
    guard.close().await;
    assert_eq!(session.status(), SessionStatus::Released);
    let a = post_json(&base, Some(&secret), &chat_body("x", false)).await;
    assert_eq!(a.status, 409);
    assert_eq!(should_retry(&a), Some("false"));
    h.server.stop().await.expect("stop");
}

/// Sends raw bytes and reads the answer until the server closes or the body is in.
async fn raw_exchange(addr: std::net::SocketAddr, request: &str) -> String {
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    conn.write_all(request.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            let n = conn.read(&mut buf).await.expect("read");
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&out);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse::<usize>().ok());
                if len.is_some_and(|len| body.len() >= len) {
                    break;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("answer in time");
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn a_websocket_upgrade_is_answered_426_so_codex_uses_http_at_once() {
    let h = Harness::new().await;
    let (session, _w, guard) = h.session("websocket").await;
    let addr = h.server.local_addr().expect("addr");
    // What Codex's default provider sends first.
    let request = format!(
        "GET /v1/responses HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {}\r\n\
         connection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\n\
         sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        guard.model_secret.expose()
    );
    let answer = raw_exchange(addr, &request).await;
    assert!(answer.starts_with("HTTP/1.1 426"), "{answer}");
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(body).expect("JSON error body");
    let message = v["error"]["message"].as_str().expect("message");
    assert!(message.contains("POST /v1/responses"), "{message}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("x-should-retry: false"),
        "{answer}"
    );
    // Nothing reached the upstream or the trace; HTTP works right after.
    assert!(h.upstream.last_request().is_none());
    let a = post(
        &guard.base_url,
        "/v1/responses",
        Some(guard.model_secret.expose()),
        serde_json::to_vec(&json!({"model": "gpt-5", "input": "hi"})).expect("json"),
        &[],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(session.trace().calls.len(), 1);
    // A plain GET without the upgrade is still a 405.
    let a = get(
        &guard.base_url,
        "/v1/responses",
        guard.model_secret.expose(),
    )
    .await;
    assert_eq!(a.status, 405);
    guard.close().await;
    h.server.stop().await.expect("stop");
}

#[tokio::test]
async fn a_context_length_phrase_stops_the_rollout_only_on_a_4xx() {
    let h = Harness::new().await;
    let (session, w, guard) = h.session("ctx").await;
    let base = guard.base_url.clone();
    let secret = guard.model_secret.expose().to_owned();
    for (n, status) in [429u16, 500, 503].into_iter().enumerate() {
        h.upstream.push(Reply::error(
            status,
            "replica busy: context length cache is full, retry",
        ));
        let a = post_json(&base, Some(&secret), &chat_body("x", false)).await;
        assert_eq!(a.status, status, "{}", a.text());
        w.wait_for(n + 1).await;
        assert_eq!(
            session.stop_condition(),
            None,
            "{status} stopped the rollout"
        );
    }
    // The same for a stream.
    h.upstream
        .push(Reply::error(502, "context length exceeded on the replica"));
    let a = post_json(&base, Some(&secret), &chat_body("x", true)).await;
    assert_eq!(a.status, 502, "{}", a.text());
    assert_eq!(session.stop_condition(), None);
    // A 400 saying so is a context-length stop.
    h.upstream.push(Reply::context_length_error());
    let a = post_json(&base, Some(&secret), &chat_body("x", false)).await;
    assert_eq!(a.status, 400);
    assert_eq!(session.stop_condition().as_deref(), Some("context_length"));
    guard.close().await;
    h.server.stop().await.expect("stop");
}

#[tokio::test]
async fn the_record_keeps_the_model_the_harness_asked_for() {
    let h = Harness::new().await;
    let (session, w, guard) = h.session("requested").await;
    let a = post_json(
        &guard.base_url,
        Some(guard.model_secret.expose()),
        &chat_body("x", true),
    )
    .await;
    assert_eq!(a.status, 200);
    let mut body = chat_body("y", false);
    body.as_object_mut().expect("object").remove("model");
    let a = post_json(&guard.base_url, Some(guard.model_secret.expose()), &body).await;
    assert_eq!(a.status, 200, "{}", a.text());
    w.wait_for(2).await;
    let calls = session.trace().calls;
    assert_eq!(calls[0].model, "policy-model");
    assert_eq!(
        calls[0].requested_model.as_deref(),
        Some("whatever-the-harness-says")
    );
    assert_eq!(calls[1].requested_model, None);
    let line = calls[0].to_json_line();
    assert!(
        line.contains("\"requested_model\":\"whatever-the-harness-says\""),
        "{line}"
    );
    guard.close().await;
    h.server.stop().await.expect("stop");
}

fn events_of(text: &str) -> Vec<(Option<String>, serde_json::Value)> {
    text.split("\n\n")
        .filter_map(|e| {
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .map(str::to_owned);
            let data = e.lines().find_map(|l| l.strip_prefix("data: "))?;
            serde_json::from_str(data).ok().map(|v| (name, v))
        })
        .collect()
}

#[tokio::test]
async fn mid_stream_errors_are_sent_in_each_dialects_native_shape() {
    let h = Harness::new().await;
    let (session, w, guard) = h.session("native-errors").await;
    let secret = guard.model_secret.expose().to_owned();

    // Responses: `event: error` then the terminal `response.failed`.
    h.upstream.push(
        Reply::text("one two three four")
            .with_chunks(4)
            .disconnect_after(3),
    );
    let a = post(
        &guard.base_url,
        "/v1/responses",
        Some(&secret),
        serde_json::to_vec(&json!({"model": "gpt-5", "input": "hi", "stream": true}))
            .expect("json"),
        &[],
    )
    .await;
    assert_eq!(a.status, 200);
    let text = a.text();
    assert!(!text.contains("data: {\"error\""), "{text}");
    let events = events_of(&text);
    let n = events.len();
    assert!(n >= 2, "{text}");
    let (name, error) = &events[n - 2];
    assert_eq!(name.as_deref(), Some("error"), "{text}");
    assert_eq!(error["type"], "error");
    assert_eq!(error["code"], "server_error");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("upstream")),
        "{error}"
    );
    let (name, failed) = &events[n - 1];
    assert_eq!(name.as_deref(), Some("response.failed"), "{text}");
    assert_eq!(failed["type"], "response.failed");
    assert_eq!(failed["response"]["status"], "failed");
    assert_eq!(failed["response"]["error"]["message"], error["message"]);

    // Anthropic Messages: `event: error` with `{"type":"error","error":{...}}`.
    h.upstream.push(
        Reply::text("one two three four")
            .with_chunks(4)
            .disconnect_after(3),
    );
    let a = post(
        &guard.base_url,
        "/v1/messages",
        None,
        serde_json::to_vec(&json!({"model": "claude", "max_tokens": 64, "stream": true,
            "messages": [{"role": "user", "content": "hi"}]}))
        .expect("json"),
        &[("x-api-key", &secret), ("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(a.status, 200);
    let text = a.text();
    let events = events_of(&text);
    let (name, error) = events.last().expect("events");
    assert_eq!(name.as_deref(), Some("error"), "{text}");
    assert_eq!(error["type"], "error");
    assert_eq!(error["error"]["type"], "api_error");
    assert!(error["error"]["message"].as_str().is_some(), "{error}");
    w.wait_for(2).await;
    assert!(session.trace().calls.iter().all(|c| c.error.is_some()));
    guard.close().await;
    h.server.stop().await.expect("stop");
}

/// Writes one request (head, then body in a write of its own) on `conn` and reads one
/// answer: its head (lower-cased) and its body, by its content-length.
async fn one_exchange(
    conn: &mut tokio::net::TcpStream,
    head: &str,
    body: &[u8],
) -> (String, String) {
    conn.write_all(head.as_bytes()).await.expect("write head");
    conn.write_all(body).await.expect("write body");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        loop {
            let n = conn.read(&mut buf).await.expect("read");
            assert!(
                n > 0,
                "closed before an answer: {:?}",
                String::from_utf8_lossy(&out)
            );
            out.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&out).into_owned();
            if let Some((head, rest)) = text.split_once("\r\n\r\n") {
                let head = head.to_ascii_lowercase();
                let len = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .expect("a content-length");
                if rest.len() >= len {
                    return (head, rest[..len].to_owned());
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("answer in time")
}

#[tokio::test]
async fn a_request_refused_before_its_body_was_read_leaves_its_connection_usable() {
    let h = Harness::new().await;
    let (_session, _w, guard) = h.session("refused-bodies").await;
    let addr = h.server.local_addr().expect("addr");
    let state = guard.state_secret.expose().to_owned();
    let body = br#"{"tool_call_id":"x","name":"add","arguments":{"a":1}}"#;
    let refused = [
        ("POST", "/tool", state.as_str(), "401"),
        ("POST", "/v1/chat/completions", "wrong", "401"),
        ("POST", "/v1/messages", "wrong", "401"),
        ("PUT", "/state", "wrong", "401"),
        ("POST", "/no/such/route", "wrong", "404"),
        ("PUT", "/v1/chat/completions", "wrong", "405"),
    ];
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    conn.set_nodelay(true).expect("nodelay");
    for (method, path, secret, status) in refused {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {secret}\r\n\
             x-api-key: {secret}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        let (answer, _) = one_exchange(&mut conn, &head, body).await;
        assert!(
            answer.starts_with(&format!("http/1.1 {status}")),
            "{method} {path}: {answer}"
        );
        assert!(
            !answer.contains("connection: close"),
            "{method} {path}: {answer}"
        );
        // The same connection carries the next request.
        let (next, text) =
            one_exchange(&mut conn, "GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n", b"").await;
        assert!(
            next.starts_with("http/1.1 200"),
            "after {method} {path}: {next}"
        );
        assert_eq!(text, r#"{"status":"ok"}"#);
    }

    // A body larger than what is drained: the answer says the connection ends, and it
    // does.
    let big = vec![b' '; 256 * 1024];
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer wrong\r\n\
         content-length: {}\r\n\r\n",
        big.len()
    );
    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    conn.write_all(head.as_bytes()).await.expect("write head");
    // The body is not sent: the refusal does not wait for it longer than its bound.
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), conn.read_to_end(&mut out))
        .await
        .expect("the server closes the connection")
        .expect("read");
    let answer = String::from_utf8_lossy(&out).to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 401"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    guard.close().await;
    h.server.stop().await.expect("stop");
}
