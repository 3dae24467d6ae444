//! A runaway answer's memory, through the built binary: an upstream that never ends its
//! answer is cut off at `max_response_bytes`, and once the session is released the
//! sidecar's resident memory returns to about where it was, for a streamed call and a
//! plain one alike.

// Helpers outside #[test] functions panic on purpose, like the tests themselves.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use tokio::time::Instant;

use http::{Method, StatusCode};
use intercept_mock::harness::HttpClient;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// The cap of one answer (`--max-response-bytes`).
const CAP: u64 = 64 << 20;
/// How far above its start the sidecar's memory may stay after the release: half the
/// cap, so a runaway's buffer (the cap, or more) that stayed resident fails the test,
/// while what the first calls set up once may stay (the runtime's buffers, and the
/// allocator's arena pages of the buffers that grew up to 4 MiB, kept for reuse: 15-23
/// MiB in the first round on the machine measured, ~1-7 MiB in the next).
const RETURNED_WITHIN: u64 = CAP / 2;

/// An upstream that answers every request with an event stream of 1 KB deltas that
/// never ends (chunked), until the reader goes away.
async fn endless_upstream() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let event = format!(
        "data: {{\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
        "a".repeat(1000)
    );
    let block = event.repeat(256);
    let chunk = format!("{:x}\r\n{block}\r\n", block.len()).into_bytes();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let chunk = chunk.clone();
            tokio::spawn(async move {
                // The request: its head and whatever of its body came with it.
                let mut buf = vec![0u8; 64 << 10];
                let mut seen = Vec::new();
                while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                }
                let head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                if socket.write_all(head).await.is_err() {
                    return;
                }
                while socket.write_all(&chunk).await.is_ok() {}
            });
        }
    });
    format!("http://{addr}/v1")
}

/// `VmRSS` and `VmHWM` of a process, in bytes.
fn memory(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<u64>().ok())
            .unwrap()
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

async fn call(http: &HttpClient, env: &Value, stream: bool) -> (StatusCode, bytes::Bytes) {
    let url = format!(
        "{}/chat/completions",
        env["OPENAI_BASE_URL"].as_str().unwrap()
    );
    let body =
        json!({"model": "x", "stream": stream, "messages": [{"role": "user", "content": "go"}]});
    let r = tokio::time::timeout(
        common::WAIT,
        http.send(
            Method::POST,
            &url,
            env["OPENAI_API_KEY"].as_str(),
            Some(&body),
        ),
    )
    .await
    .expect("the call did not end in time")
    .unwrap();
    (r.status, r.body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_answers_memory_returns_when_its_session_is_released() {
    let upstream = endless_upstream().await;
    let mut command = common::serve(&upstream, "policy");
    command.args(["--max-response-bytes", &CAP.to_string(), "--log", "error"]);
    let serving = common::start(command).await;
    let pid = serving.child.id().unwrap();
    let http = HttpClient::new();

    for round in 0..2 {
        let r = http
            .send(
                Method::POST,
                &format!("{}/v1/sessions", serving.control),
                Some(&serving.token),
                Some(&json!({})),
            )
            .await
            .unwrap();
        assert_eq!(r.status, StatusCode::CREATED);
        let session: Value = r.json().unwrap();
        let (before, _) = memory(pid);

        // A stream is relayed until the cap, then ended with an error event.
        let (status, body) = call(&http, &session["env"], true).await;
        assert_eq!(status, StatusCode::OK);
        let text = String::from_utf8_lossy(&body);
        assert!(
            text.contains("max_response_bytes"),
            "round {round}: {}",
            &text[text.len().saturating_sub(400)..]
        );
        // A plain answer is read until the cap, then refused.
        let (status, body) = call(&http, &session["env"], false).await;
        assert_eq!(
            status,
            StatusCode::BAD_GATEWAY,
            "{}",
            String::from_utf8_lossy(&body)
        );
        let (_, peak) = memory(pid);
        assert!(
            peak <= before + 3 * CAP,
            "round {round}: peak {peak} bytes for a cap of {CAP} from {before}"
        );

        let id = session["id"].as_str().unwrap();
        let r = http
            .send(
                Method::DELETE,
                &format!("{}/v1/sessions/{id}", serving.control),
                Some(&serving.token),
                None,
            )
            .await
            .unwrap();
        assert_eq!(r.status, StatusCode::OK);

        let deadline = Instant::now() + Duration::from_secs(5);
        let mut now = memory(pid).0;
        while now > before + RETURNED_WITHIN && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
            now = memory(pid).0;
        }
        eprintln!(
            "round {round}: {before} bytes before the calls, peak {peak}, {now} after the release"
        );
        assert!(
            now <= before + RETURNED_WITHIN,
            "round {round}: {now} bytes resident after the release, {before} before the calls"
        );
    }
    serving.sigterm();
    let exited = serving.exit().await;
    assert!(exited.status.success(), "{}", exited.logs);
}
