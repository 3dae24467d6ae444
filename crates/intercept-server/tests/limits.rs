//! Nothing an upstream sends is unbounded: a JSON answer that declares or sends more than
//! `max_response_bytes`, a stream of endless deltas, a stream that is one endless line.
//! Each fails the call with 502 (or the dialect's error event, once a stream is under
//! way), closes the upstream connection, and is recorded `truncated`. The upstream here
//! is a raw socket that writes until it is stopped.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use intercept_core::{Interception, Upstream};
use intercept_server::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Notify;

const LIMIT: u64 = 1 << 20;
/// What the endless upstream writes at most before it gives up by itself.
const UPSTREAM_CAP: u64 = 64 << 20;
/// Generous bound for "promptly" on a loaded machine.
const BOUND: Duration = Duration::from_secs(30);

#[derive(Clone, Copy)]
enum Endless {
    /// `content-length: 5000000000`, then zeros.
    DeclaredHuge,
    /// A chunked JSON body that never ends.
    ChunkedJson,
    /// An event stream of 1 KiB chat deltas, forever.
    Deltas,
    /// An event stream that is one line, never terminated.
    OneLine,
}

/// A loopback upstream that answers every request with `kind`, writing until the peer
/// closes (or `UPSTREAM_CAP` bytes). Returns its base URL and the bytes it wrote.
async fn endless_upstream(kind: Endless) -> (String, Arc<AtomicU64>, Arc<Notify>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let written = Arc::new(AtomicU64::new(0));
    let closed = Arc::new(Notify::new());
    let count = written.clone();
    let on_close = closed.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let count = count.clone();
            let closed = on_close.clone();
            tokio::spawn(async move {
                // The request head (the body is small and stays in the socket buffer).
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let (start, piece): (&[u8], Vec<u8>) = match kind {
                    Endless::DeclaredHuge => (
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                          content-length: 5000000000\r\n\r\n",
                        vec![b' '; 16 * 1024],
                    ),
                    Endless::ChunkedJson => (
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                          transfer-encoding: chunked\r\n\r\n",
                        chunk(&vec![b' '; 16 * 1024]),
                    ),
                    Endless::Deltas => {
                        let delta = format!(
                            "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":0,\
                             \"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}},\
                             \"finish_reason\":null}}]}}\n\n",
                            "a".repeat(1024)
                        );
                        (
                            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                              transfer-encoding: chunked\r\n\r\n",
                            chunk(delta.repeat(8).as_bytes()),
                        )
                    }
                    Endless::OneLine => (
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                          transfer-encoding: chunked\r\n\r\n",
                        chunk(&vec![b'x'; 16 * 1024]),
                    ),
                };
                if tcp.write_all(start).await.is_err() {
                    return;
                }
                if matches!(kind, Endless::OneLine)
                    && tcp.write_all(&chunk(b"data: ")).await.is_err()
                {
                    return;
                }
                while count.load(Ordering::Relaxed) < UPSTREAM_CAP {
                    if tcp.write_all(&piece).await.is_err() {
                        // The proxy closed the connection: what the test waits for.
                        closed.notify_one();
                        return;
                    }
                    count.fetch_add(piece.len() as u64, Ordering::Relaxed);
                }
            });
        }
    });
    (format!("http://{addr}/v1"), written, closed)
}

fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}

async fn harness() -> Harness {
    Harness::with_config(ServerConfig {
        max_response_bytes: LIMIT,
        ..ServerConfig::default()
    })
    .await
}

/// Runs one call of `kind` and checks what the harness got and what was recorded.
async fn cut_off(kind: Endless, stream: bool) -> (Answer, intercept_core::CallRecord) {
    let h = harness().await;
    let (url, written, closed) = endless_upstream(kind).await;
    let mut config = h.session_config("endless");
    config.upstream = Upstream::new(url);
    let (session, w, guard) = h.session_with(config).await;
    let answer = tokio::time::timeout(
        BOUND,
        post_json(
            &guard.base_url,
            Some(guard.model_secret.expose()),
            &chat_body("go", stream),
        ),
    )
    .await
    .expect("the call ends although the upstream never does");
    w.wait_for(1).await;
    let record = session.trace().calls[0].clone();
    // The upstream connection was closed (the writer's next write failed), well before
    // the writer's own cap.
    tokio::time::timeout(BOUND, closed.notified())
        .await
        .expect("the upstream connection is closed");
    let after = written.load(Ordering::Relaxed);
    assert!(
        after < UPSTREAM_CAP / 2,
        "the upstream was read on: {after} bytes"
    );
    // The server still serves: a normal call on a fresh session.
    let (_s, _w, normal) = h.session("after").await;
    let ok = post_json(
        &normal.base_url,
        Some(normal.model_secret.expose()),
        &chat_body("fine", false),
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    normal.close().await;
    guard.close().await;
    h.server.stop().await.expect("stop");
    (answer, record)
}

fn check_record(record: &intercept_core::CallRecord) -> String {
    assert!(record.truncated, "{record:?}");
    assert!(record.response.is_none());
    let error = record.error.as_ref().expect("an error");
    assert_eq!(error.kind, intercept_core::ErrorKind::UpstreamMalformed);
    assert!(
        error.message.contains("max_response_bytes"),
        "{}",
        error.message
    );
    assert!(error.message.contains("1048576 bytes"), "{}", error.message);
    // The JSON line says so too.
    let line = String::from_utf8(record.to_json_vec()).expect("utf-8");
    assert!(line.contains("\"truncated\":true"), "{line}");
    error.message.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_huge_json_answer_is_refused_unread() {
    let (answer, record) = cut_off(Endless::DeclaredHuge, false).await;
    assert_eq!(answer.status, 502, "{}", answer.text());
    let body = answer.json();
    assert_eq!(body["error"]["type"], "api_error", "{body}");
    let message = body["error"]["message"].as_str().expect("message");
    assert!(message.contains("5000000000-byte"), "{message}");
    assert!(message.contains("max_response_bytes"), "{message}");
    let recorded = check_record(&record);
    assert!(recorded.contains("nothing of it was read"), "{recorded}");
    assert_eq!(record.status, 502);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_chunked_json_answer_is_cut_off_at_the_limit() {
    let (answer, record) = cut_off(Endless::ChunkedJson, false).await;
    assert_eq!(answer.status, 502, "{}", answer.text());
    assert_eq!(answer.json()["error"]["type"], "api_error");
    let recorded = check_record(&record);
    assert!(recorded.contains("bytes received"), "{recorded}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_stream_of_deltas_ends_with_an_error_event() {
    let (answer, record) = cut_off(Endless::Deltas, true).await;
    assert_eq!(answer.status, 200);
    let text = answer.text();
    // Deltas went out, then the dialect's error event ended the stream.
    assert!(
        text.contains("chat.completion.chunk"),
        "{}",
        &text[..200.min(text.len())]
    );
    let tail = &text[text.len().saturating_sub(600)..];
    assert!(tail.contains("max_response_bytes"), "{tail}");
    assert!(
        answer.body.len() as u64 <= 2 * LIMIT,
        "{}",
        answer.body.len()
    );
    check_record(&record);
    assert_eq!(record.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_is_one_endless_line_is_cut_off() {
    let (answer, record) = cut_off(Endless::OneLine, true).await;
    assert_eq!(answer.status, 200);
    let text = answer.text();
    assert!(text.contains("max_response_bytes"), "{text}");
    // Nothing of the unterminated line reached the harness.
    assert!(!text.contains("xxxx"), "{}", &text[..200.min(text.len())]);
    check_record(&record);
}
