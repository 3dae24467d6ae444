//! The request shapes real harnesses send (Codex, Claude Code, the OpenAI Agents SDK),
//! replayed through real HTTP: what `docs/harnesses.md` promises about intercept's
//! answers to them.

mod common;

use std::time::Duration;

use common::*;
use intercept_core::{DialectKind, Interception};
use intercept_server::SHOULD_RETRY_HEADER;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter_map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = e.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((name.to_owned(), serde_json::from_str(data).ok()?))
        })
        .collect()
}

/// Codex (`wire_api = "responses"`): the WebSocket probe, then a streamed Responses call
/// with its headers and body, then the 409 of a released rollout.
#[tokio::test]
async fn codex_responses_shape() {
    let h = Harness::new().await;
    let (session, w, guard) = h.session("codex").await;
    let secret = guard.model_secret.expose().to_owned();
    let addr = h.server.local_addr().expect("addr");

    let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let probe = format!(
        "GET /v1/responses HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {secret}\r\n\
         connection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\n\
         sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\noriginator: codex_cli_rs\r\n\r\n"
    );
    conn.write_all(probe.as_bytes()).await.expect("write");
    let mut head = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(20), conn.read_exact(&mut head))
        .await
        .expect("in time")
        .expect("read");
    assert_eq!(&head, b"HTTP/1.1 426");
    drop(conn);

    let body = json!({
        "model": "gpt-5-codex",
        "instructions": "You are Codex.",
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "list the files"}]}],
        "tools": [{"type": "function", "name": "shell", "description": "run a command",
                   "strict": false,
                   "parameters": {"type": "object", "properties": {"command": {"type": "array", "items": {"type": "string"}}}, "required": ["command"]}}],
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": false,
        "stream": true,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199-session",
    });
    let a = post(
        &guard.base_url,
        "/v1/responses",
        Some(&secret),
        serde_json::to_vec(&body).expect("json"),
        &[
            ("originator", "codex_cli_rs"),
            ("session_id", "0199-session"),
            ("accept", "text/event-stream"),
            ("openai-beta", "responses=experimental"),
        ],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    let evs = events(&a.text());
    assert_eq!(
        evs.last().map(|(n, _)| n.as_str()),
        Some("response.completed"),
        "{}",
        a.text()
    );
    w.wait_for(1).await;
    let calls = session.trace().calls;
    assert_eq!(calls[0].dialect, DialectKind::Responses);
    assert_eq!(calls[0].model, "policy-model");
    assert_eq!(calls[0].requested_model.as_deref(), Some("gpt-5-codex"));
    assert!(calls[0].error.is_none());

    guard.close().await;
    let late = post(
        &h.server.base_url().expect("url"),
        "/v1/responses",
        Some(&secret),
        serde_json::to_vec(&body).expect("json"),
        &[],
    )
    .await;
    assert_eq!(late.status, 409);
    assert_eq!(
        late.headers.get(SHOULD_RETRY_HEADER).map(|v| v.as_bytes()),
        Some(&b"false"[..])
    );
    h.server.stop().await.expect("stop");
}

/// Claude Code: `ANTHROPIC_BASE_URL` without `/v1`, `x-api-key`, `?beta=true` on the
/// path, a token count, a streamed turn; every model call (a title call too) is a record.
#[tokio::test]
async fn claude_code_messages_shape() {
    let h = Harness::new().await;
    let (session, w, guard) = h.session("claude-code").await;
    let secret = guard.model_secret.expose().to_owned();
    let headers = [
        ("x-api-key", secret.as_str()),
        ("anthropic-version", "2023-06-01"),
        (
            "anthropic-beta",
            "claude-code-20250219,interleaved-thinking-2025-05-14",
        ),
        ("x-app", "cli"),
        ("user-agent", "claude-cli/2.1.0 (external, cli)"),
    ];
    let turn = json!({
        "model": "claude-sonnet-4-5",
        "max_tokens": 32000,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "fix the bug"}]}],
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}],
        "metadata": {"user_id": "user_x"},
        "stream": true,
    });
    let count = post(
        &guard.base_url,
        "/v1/messages/count_tokens?beta=true",
        None,
        serde_json::to_vec(&json!({"model": "claude-sonnet-4-5", "messages": turn["messages"]}))
            .expect("json"),
        &headers,
    )
    .await;
    assert_eq!(count.status, 200, "{}", count.text());
    let a = post(
        &guard.base_url,
        "/v1/messages?beta=true",
        None,
        serde_json::to_vec(&turn).expect("json"),
        &headers,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(
        events(&a.text()).last().map(|(n, _)| n.clone()).as_deref(),
        Some("message_stop")
    );
    // The title call Claude Code makes unless CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC is
    // set: a model call like any other, so a record of the rollout.
    let title = json!({"model": "claude-haiku-4-5", "max_tokens": 512,
        "messages": [{"role": "user", "content": "Summarize this coding conversation in a title"}]});
    let a = post(
        &guard.base_url,
        "/v1/messages?beta=true",
        None,
        serde_json::to_vec(&title).expect("json"),
        &headers,
    )
    .await;
    assert_eq!(a.status, 200);
    w.wait_for(2).await;
    let calls = session.trace().calls;
    assert_eq!(
        calls.len(),
        2,
        "count_tokens is not recorded, the title call is"
    );
    assert_eq!(
        calls[1].requested_model.as_deref(),
        Some("claude-haiku-4-5")
    );
    assert!(calls.iter().all(|c| c.dialect == DialectKind::Messages));

    guard.close().await;
    let late = post(
        &h.server.base_url().expect("url"),
        "/v1/messages?beta=true",
        None,
        serde_json::to_vec(&turn).expect("json"),
        &headers,
    )
    .await;
    assert_eq!(late.status, 409);
    assert_eq!(late.json()["type"], "error");
    assert_eq!(
        late.headers.get(SHOULD_RETRY_HEADER).map(|v| v.as_bytes()),
        Some(&b"false"[..])
    );
    h.server.stop().await.expect("stop");
}

/// The OpenAI Agents SDK: `Runner.run` makes non-streamed Responses calls (the default
/// API), `Runner.run_streamed` streamed ones, and `/v1/chat/completions` when set to
/// `chat_completions`.
#[tokio::test]
async fn agents_sdk_shapes() {
    let h = Harness::new().await;
    let (session, w, guard) = h.session("agents").await;
    let secret = guard.model_secret.expose().to_owned();
    let headers = [
        ("user-agent", "Agents/Python 0.24.0"),
        ("x-stainless-lang", "python"),
        ("x-stainless-retry-count", "0"),
    ];
    let run = json!({"model": "gpt-4.1", "instructions": "You are helpful.",
        "input": [{"role": "user", "content": "hello"}], "tools": [], "include": [],
        "stream": false});
    let a = post(
        &guard.base_url,
        "/v1/responses",
        Some(&secret),
        serde_json::to_vec(&run).expect("json"),
        &headers,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    assert_eq!(a.json()["status"], "completed");
    let mut streamed = run.clone();
    streamed["stream"] = json!(true);
    let a = post(
        &guard.base_url,
        "/v1/responses",
        Some(&secret),
        serde_json::to_vec(&streamed).expect("json"),
        &headers,
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(
        events(&a.text()).last().map(|(n, _)| n.clone()).as_deref(),
        Some("response.completed")
    );
    let chat = json!({"model": "gpt-4.1", "messages": [{"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "hello"}], "stream": false});
    let a = post(
        &guard.base_url,
        "/v1/chat/completions",
        Some(&secret),
        serde_json::to_vec(&chat).expect("json"),
        &headers,
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text());
    w.wait_for(3).await;
    let kinds: Vec<DialectKind> = session.trace().calls.iter().map(|c| c.dialect).collect();
    assert_eq!(
        kinds,
        [
            DialectKind::Responses,
            DialectKind::Responses,
            DialectKind::ChatCompletions
        ]
    );
    guard.close().await;
    h.server.stop().await.expect("stop");
}
