//! Heartbeats through a silent upstream (`stream_heartbeat`): dialect-valid events where
//! the dialect's SDKs accept one, comments elsewhere, nothing with `off`; never in the
//! record.

mod common;

use std::time::Duration;

use common::*;
use intercept_core::internal::CHAT_HEARTBEAT_ID;
use intercept_server::{ServerConfig, StreamHeartbeat};
use intercept_test::Reply;
use serde_json::{json, Value};

fn config(mode: StreamHeartbeat) -> ServerConfig {
    ServerConfig {
        keepalive: Duration::from_millis(25),
        first_byte_timeout: Duration::from_millis(40),
        stream_heartbeat: mode,
        ..ServerConfig::default()
    }
}

/// Each event of a stream: its `event:` name (if any) and its data, parsed (`[DONE]` as
/// a string); comment lines as `(":", null)`.
fn events(text: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        let mut name = String::new();
        let mut data = None;
        for line in block.lines() {
            if line.starts_with(':') {
                out.push((":".to_owned(), Value::Null));
            } else if let Some(n) = line.strip_prefix("event: ") {
                name = n.to_owned();
            } else if let Some(d) = line.strip_prefix("data: ") {
                data = Some(serde_json::from_str(d).unwrap_or_else(|_| json!(d)));
            }
        }
        if let Some(d) = data {
            out.push((name, d));
        }
    }
    out
}

fn is_chat_heartbeat(v: &Value) -> bool {
    v["choices"][0]["delta"] == json!({"content": ""}) && v["choices"][0]["finish_reason"].is_null()
}

#[tokio::test]
async fn chat_heartbeats_are_empty_content_chunks_of_the_stream() {
    let h = Harness::with_config(config(StreamHeartbeat::Event)).await;
    let (session, w, guard) = h.session("hb-chat").await;
    h.upstream.push(
        Reply::text("a slow careful answer")
            .with_chunks(3)
            .with_chunk_delay(Duration::from_millis(120))
            .with_header_delay(Duration::from_millis(150)),
    );
    let a = post_json(
        &guard.base_url,
        Some(guard.model_secret.expose()),
        &chat_body("x", true),
    )
    .await;
    assert_eq!(a.status, 200);
    let text = a.text();
    // Events, not comments, until the finish reason (after it no chunk is valid).
    let finish_at = text.find("\"finish_reason\":\"stop\"").expect("finish");
    assert!(!text[..finish_at].contains(": keepalive"), "{text}");
    let evs: Vec<_> = events(&text)
        .into_iter()
        .filter(|(n, _)| n != ":")
        .collect();
    let first_real = evs
        .iter()
        .position(|(_, v)| !is_chat_heartbeat(v))
        .expect("a real chunk");
    assert!(first_real > 0, "heartbeats before the first byte: {text}");
    for (_, v) in &evs[..first_real] {
        assert_eq!(v["id"], CHAT_HEARTBEAT_ID);
        assert_eq!(v["object"], "chat.completion.chunk");
        assert_eq!(v["model"], "policy-model");
    }
    let id = evs[first_real].1["id"].clone();
    let mid: Vec<_> = evs[first_real..]
        .iter()
        .filter(|(_, v)| is_chat_heartbeat(v))
        .collect();
    assert!(
        !mid.is_empty(),
        "heartbeats through mid-stream silence: {text}"
    );
    for (_, v) in &mid {
        assert_eq!(v["id"], id, "shaped like the stream's chunks");
        assert_eq!(v["created"], evs[first_real].1["created"]);
    }
    // Nothing after the finish reason but [DONE].
    let finish = evs
        .iter()
        .position(|(_, v)| v["choices"][0]["finish_reason"].is_string())
        .expect("finish");
    assert!(evs[finish + 1..].iter().all(|(_, v)| !is_chat_heartbeat(v)));
    assert_eq!(evs.last().map(|e| e.1.clone()), Some(json!("[DONE]")));
    let content: String = evs
        .iter()
        .filter_map(|(_, v)| v["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "a slow careful answer");
    // The record is what the upstream sent.
    w.wait_for(1).await;
    let record = &session.trace().calls[0];
    let response = record.response.as_ref().expect("response").to_value();
    assert_eq!(
        response["choices"][0]["message"]["content"],
        "a slow careful answer"
    );
    assert_ne!(response["id"], CHAT_HEARTBEAT_ID);
    assert!(record.error.is_none());
    guard.close().await;
}

#[tokio::test]
async fn responses_heartbeats_are_in_progress_events_numbered_in_sequence() {
    let h = Harness::with_config(config(StreamHeartbeat::Event)).await;
    let (session, w, guard) = h.session("hb-responses").await;
    h.upstream.push(
        Reply::text("numbered with care")
            .with_chunks(3)
            .with_chunk_delay(Duration::from_millis(120))
            .with_header_delay(Duration::from_millis(150)),
    );
    let body = json!({"model": "m", "input": "x", "stream": true});
    let a = post(
        &guard.base_url,
        "/v1/responses",
        Some(guard.model_secret.expose()),
        serde_json::to_vec(&body).expect("json"),
        &[],
    )
    .await;
    assert_eq!(a.status, 200);
    let text = a.text();
    // Before `response.created` only comments are valid.
    let created_at = text.find("event: response.created").expect("created");
    assert!(text[..created_at].starts_with(": keepalive\n"), "{text}");
    let evs: Vec<_> = events(&text)
        .into_iter()
        .filter(|(n, _)| n != ":")
        .collect();
    let numbers: Vec<u64> = evs
        .iter()
        .map(|(_, v)| v["sequence_number"].as_u64().expect("numbered"))
        .collect();
    let expected: Vec<u64> = (0..numbers.len() as u64).collect();
    assert_eq!(numbers, expected, "consecutive from 0: {text}");
    let in_progress = evs
        .iter()
        .filter(|(n, _)| n == "response.in_progress")
        .count();
    assert!(
        in_progress > 1,
        "heartbeats besides the upstream's own in_progress: {text}"
    );
    for (name, v) in &evs {
        assert_eq!(&v["type"], name.as_str());
        if name == "response.in_progress" {
            assert_eq!(v["response"]["status"], "in_progress");
            assert_eq!(v["response"]["id"], evs[0].1["response"]["id"]);
        }
    }
    let (last, completed) = evs.last().expect("terminal");
    assert_eq!(last, "response.completed");
    // Nothing after the terminal event, and the record is the upstream's response.
    w.wait_for(1).await;
    let record = session.trace().calls[0].clone();
    assert_eq!(
        record.response.as_ref().expect("response").to_value(),
        completed["response"]
    );
    guard.close().await;
}

#[tokio::test]
async fn anthropic_heartbeats_are_no_op_message_deltas_after_message_start() {
    let h = Harness::with_config(config(StreamHeartbeat::Event)).await;
    let (session, w, guard) = h.session("hb-anthropic").await;
    h.upstream.push(
        Reply::text("claude takes its time")
            .with_chunks(3)
            .with_chunk_delay(Duration::from_millis(120)),
    );
    let body = json!({"model": "m", "max_tokens": 64, "stream": true,
                      "messages": [{"role": "user", "content": "x"}]});
    let a = post(
        &guard.base_url,
        "/v1/messages",
        Some(guard.model_secret.expose()),
        serde_json::to_vec(&body).expect("json"),
        &[],
    )
    .await;
    assert_eq!(a.status, 200);
    let evs: Vec<_> = events(&a.text())
        .into_iter()
        .filter(|(n, _)| n != ":")
        .collect();
    assert_eq!(evs[0].0, "message_start");
    let deltas: Vec<_> = evs.iter().filter(|(n, _)| n == "message_delta").collect();
    assert!(
        deltas.len() > 1,
        "heartbeats besides the upstream's: {}",
        a.text()
    );
    let (real, beats) = deltas.split_last().expect("deltas");
    assert_eq!(real.1["delta"]["stop_reason"], "end_turn");
    for (_, v) in beats {
        assert!(v["delta"]["stop_reason"].is_null());
        assert_eq!(v["usage"]["output_tokens"], 1, "message_start's count");
    }
    // After the upstream's message_delta: only message_stop.
    assert_eq!(evs.last().expect("end").0, "message_stop");
    assert_eq!(evs[evs.len() - 2].1, real.1);
    w.wait_for(1).await;
    let record = session.trace().calls[0].clone();
    let response = record.response.as_ref().expect("response").to_value();
    assert_eq!(response["content"][0]["text"], "claude takes its time");
    assert_eq!(response["stop_reason"], "end_turn");
    guard.close().await;
}

#[tokio::test]
async fn comment_and_off_modes() {
    for (mode, comments) in [
        (StreamHeartbeat::Comment, true),
        (StreamHeartbeat::Off, false),
    ] {
        let h = Harness::with_config(config(mode)).await;
        let (_s, _w, guard) = h.session("hb-modes").await;
        h.upstream.push(
            Reply::text("quiet one")
                .with_chunks(2)
                .with_chunk_delay(Duration::from_millis(120))
                .with_header_delay(Duration::from_millis(150)),
        );
        let a = post_json(
            &guard.base_url,
            Some(guard.model_secret.expose()),
            &chat_body("x", true),
        )
        .await;
        assert_eq!(a.status, 200);
        let text = a.text();
        assert_eq!(text.contains(": keepalive\n"), comments, "{mode:?}: {text}");
        assert!(
            events(&text).iter().all(|(_, v)| !is_chat_heartbeat(v)),
            "{mode:?}: {text}"
        );
        guard.close().await;
    }
}
