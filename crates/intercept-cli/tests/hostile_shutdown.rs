//! SIGTERM to the built `intercept serve` binary while every kind of stalled peer holds a
//! connection: a harness that stopped reading a stream (a frozen sandbox: its receive
//! window is full), half a request head and half a request body on the harness port and on
//! the control port, and connections that never sent a byte. The process exits within
//! `shutdown_grace` (plus a margin for a loaded machine), and the frozen harness's call is
//! in its trace file, once, as cancelled, with what was relayed before.

// Helpers outside #[test] functions panic on purpose, like the tests themselves.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use tokio::time::Instant;

use common::WAIT;

use http::{Method, StatusCode};
use intercept_core::ErrorKind;
use intercept_mock::harness::HttpClient;
use intercept_test::{MockConfig, MockUpstream, Reply};
use intercept_trace::read_trace_file;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const GRACE: Duration = Duration::from_secs(1);

fn authority(url: &str) -> String {
    let rest = url.split_once("://").unwrap().1;
    rest.split('/').next().unwrap().to_owned()
}

/// Reads until EOF or a reset, within `WAIT`: the server closed the connection.
async fn expect_closed(tcp: &mut TcpStream) {
    let mut sink = vec![0u8; 64 * 1024];
    let closed = tokio::time::timeout(WAIT, async {
        loop {
            match tcp.read(&mut sink).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the connection was left open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_is_not_held_by_a_frozen_harness_or_partial_requests() {
    let upstream = MockUpstream::start_with(MockConfig::default())
        .await
        .unwrap();
    // Far more than the socket buffers and the relay's queue hold.
    upstream.push(Reply::text("word ".repeat(6_000_000)).with_chunks(20_000));
    let dir = tempfile::tempdir().unwrap();
    let mut command = common::serve(&upstream.base_url(), "policy");
    command
        .args(["--trace-dir", dir.path().to_str().unwrap()])
        .args(["--shutdown-grace-secs", &GRACE.as_secs().to_string()]);
    let serving = common::start(command).await;
    let (control, token) = (serving.control.clone(), serving.token.clone());
    let created = HttpClient::new()
        .send(
            Method::POST,
            &format!("{control}/v1/sessions"),
            Some(&token),
            Some(&json!({"id": "frozen"})),
        )
        .await
        .unwrap();
    assert_eq!(
        created.status,
        StatusCode::CREATED,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let session: Value = created.json().unwrap();
    let base_url = session["env"]["OPENAI_BASE_URL"].as_str().unwrap();
    let secret = session["model_secret"].as_str().unwrap();
    let harness_port = authority(base_url);
    let control_port = authority(&control);

    // The frozen harness: a streamed call whose answer it reads the start of, then never
    // another byte.
    let body = json!({"model": "m", "stream": true,
                      "messages": [{"role": "user", "content": "go"}]})
    .to_string();
    let mut frozen = TcpStream::connect(&harness_port).await.unwrap();
    frozen
        .write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer \
                 {secret}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut first = [0u8; 12];
    tokio::time::timeout(WAIT, frozen.read_exact(&mut first))
        .await
        .expect("the answer starts")
        .unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");

    // Stalled requests on both ports.
    let mut stalled = Vec::new();
    for port in [&harness_port, &control_port] {
        let mut half_head = TcpStream::connect(port).await.unwrap();
        half_head
            .write_all(b"POST /v1/sessions HTTP/1.1\r\nhost: x\r\ncontent-le")
            .await
            .unwrap();
        let mut half_body = TcpStream::connect(port).await.unwrap();
        half_body
            .write_all(
                format!(
                    "POST /v1/sessions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {token}\r\n\
                     content-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"id\":"
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        let silent = TcpStream::connect(port).await.unwrap();
        stalled.extend([half_head, half_body, silent]);
    }
    // Let the relay fill the frozen harness's socket and the server read the partial
    // bodies.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let sent = Instant::now();
    serving.sigterm();
    let exited = serving.exit().await;
    let status = exited.status;
    let took = sent.elapsed();
    eprintln!("exited {took:?} after SIGTERM");
    assert!(status.success(), "exit status {status}");
    // The bound is the grace plus a second; a loaded CI machine gets two more.
    assert!(
        took < GRACE + Duration::from_secs(3),
        "exited {took:?} after SIGTERM with a {GRACE:?} grace"
    );
    for tcp in &mut stalled {
        expect_closed(tcp).await;
    }

    let file = read_trace_file(&dir.path().join("frozen.jsonl")).unwrap();
    assert!(file.skipped.is_empty());
    assert_eq!(
        file.records.len(),
        1,
        "exactly one record of the frozen call"
    );
    let record = &file.records[0];
    let error = record.error.as_ref().expect("the call was cut short");
    assert_eq!(error.kind, ErrorKind::Cancelled, "{error:?}");
    assert!(record.stream);
    // With what was relayed before: the completion assembled so far, no finish reason.
    let response = record
        .response
        .as_ref()
        .expect("the partial completion")
        .to_value();
    let content = response["choices"][0]["message"]["content"]
        .as_str()
        .unwrap();
    assert!(content.starts_with("word word"), "{response}");
    assert!(
        response["choices"][0]["finish_reason"].is_null(),
        "{response}"
    );
    let logs = exited.logs;
    assert!(logs.contains("shutdown signal received"), "{logs}");
    drop(frozen);
    upstream.shutdown().await;
}
