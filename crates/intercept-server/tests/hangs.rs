//! No stalled peer holds a release, a shutdown or a connection: a harness that stops
//! reading a stream, a request left half-sent, a head dribbled byte by byte.

mod common;

use std::time::Duration;

use common::*;
use intercept_core::{ErrorKind, Interception};
use intercept_server::ServerConfig;
use intercept_test::Reply;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Generous bound for what must happen "at once" on a loaded machine.
const BOUND: Duration = Duration::from_secs(20);

fn authority(base_url: &str) -> String {
    base_url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .expect("host:port")
        .to_owned()
}

/// Reads until the peer closes the connection; fails the test if it stays open.
async fn expect_closed(tcp: &mut TcpStream) {
    let mut buf = vec![0u8; 64 * 1024];
    tokio::time::timeout(BOUND, async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .expect("the server closed the connection");
}

#[tokio::test]
async fn a_harness_that_stops_reading_a_stream_does_not_hold_the_release() {
    let h = Harness::new().await;
    let (session, waiter, guard) = h.session("rollout-frozen").await;
    // Far more than the socket buffers and the relay's queue hold.
    h.upstream
        .push(Reply::text("word ".repeat(6_000_000)).with_chunks(20_000));
    let body = serde_json::to_vec(&chat_body("x", true)).expect("json");
    let mut tcp = TcpStream::connect(authority(&guard.base_url))
        .await
        .expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        guard.model_secret.expose(),
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.expect("head");
    tcp.write_all(&body).await.expect("body");
    // Read the start of the answer, then freeze like a paused sandbox.
    let mut first = [0u8; 12];
    tcp.read_exact(&mut first).await.expect("the answer starts");
    assert_eq!(&first, b"HTTP/1.1 200");

    tokio::time::timeout(BOUND, guard.close())
        .await
        .expect("the release does not wait for the harness to read");
    waiter.wait_for(1).await;
    let trace = session.trace();
    assert_eq!(trace.calls.len(), 1, "exactly one record");
    let record = &trace.calls[0];
    let error = record.error.as_ref().expect("the call was cut short");
    assert_eq!(error.kind, ErrorKind::Cancelled, "{error:?}");
    // The record keeps what was relayed: the completion assembled from what arrived.
    let response = record.response.as_ref().expect("partial").to_value();
    let content = response["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert!(content.starts_with("word "), "{response}");
    drop(tcp);
}

#[tokio::test]
async fn shutdown_closes_idle_and_partial_connections_at_once() {
    let h = Harness::with_config(ServerConfig {
        shutdown_grace: Duration::from_secs(1),
        ..ServerConfig::default()
    })
    .await;
    let (_session, _w, guard) = h.session("rollout-partial").await;
    let addr = authority(&guard.base_url);
    // Half a head.
    let mut half_head = TcpStream::connect(&addr).await.expect("connect");
    half_head
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-le")
        .await
        .expect("write");
    // A whole head and part of the declared body.
    let mut half_body = TcpStream::connect(&addr).await.expect("connect");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\n\
         content-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"model\":",
        guard.model_secret.expose()
    );
    half_body.write_all(head.as_bytes()).await.expect("write");
    // A connection that never sends a byte.
    let mut idle = TcpStream::connect(&addr).await.expect("connect");
    // The partial body is being read by the server before shutdown starts.
    let probe = post_json(&guard.base_url, None, &chat_body("x", false)).await;
    assert_eq!(probe.status, 401, "the server answers: {}", probe.text());

    tokio::time::timeout(BOUND, h.server.stop())
        .await
        .expect("stop does not wait for stalled clients")
        .expect("stop");
    for tcp in [&mut half_head, &mut half_body, &mut idle] {
        expect_closed(tcp).await;
    }
    drop(guard);
}

#[tokio::test]
async fn a_dribbled_request_head_is_cut_off_by_the_header_timeout() {
    let h = Harness::with_config(ServerConfig {
        header_read_timeout: Some(Duration::from_millis(500)),
        ..ServerConfig::default()
    })
    .await;
    let (_session, _w, guard) = h.session("rollout-slowloris").await;
    let addr = authority(&guard.base_url);
    let mut slow = TcpStream::connect(&addr).await.expect("connect");
    slow.write_all(b"GET /v1/models HTTP/1.1\r\nho")
        .await
        .expect("write");
    let mut silent = TcpStream::connect(&addr).await.expect("connect");
    expect_closed(&mut slow).await;
    expect_closed(&mut silent).await;
    // A head that arrives in time is served on the same server.
    let answer = post_json(&guard.base_url, None, &chat_body("x", false)).await;
    assert_eq!(answer.status, 401, "{}", answer.text());
    guard.close().await;
}

/// The header-read timeout is also the keep-alive idle timeout: a kept-alive connection
/// that sends no next request within it is closed, while the answer to a request that
/// came in time is not cut, however long it takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_alive_connection_left_idle_is_closed_but_a_slow_answer_is_not() {
    let h = Harness::with_config(ServerConfig {
        header_read_timeout: Some(Duration::from_millis(300)),
        ..ServerConfig::default()
    })
    .await;
    let (_session, _w, guard) = h.session("rollout-idle").await;
    let addr = authority(&guard.base_url);
    let secret = guard.model_secret.expose().to_owned();
    let body = serde_json::to_vec(&chat_body("x", false)).expect("json");
    let request = |body: &[u8]| {
        let mut r = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {secret}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(body);
        r
    };
    // An answer that takes 1 s, three times the timeout: served whole.
    h.upstream
        .push(Reply::text("slow but whole").with_header_delay(Duration::from_secs(1)));
    let mut tcp = TcpStream::connect(&addr).await.expect("connect");
    tcp.write_all(&request(&body)).await.expect("write");
    let mut got = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    tokio::time::timeout(BOUND, async {
        while !String::from_utf8_lossy(&got).contains("slow but whole") {
            let n = tcp.read(&mut buf).await.expect("read");
            assert!(
                n > 0,
                "closed before the answer: {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
    })
    .await
    .expect("the slow answer arrives");
    assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    // Then nothing: the idle kept-alive connection is closed after the timeout.
    let idle_since = tokio::time::Instant::now();
    expect_closed(&mut tcp).await;
    assert!(
        idle_since.elapsed() >= Duration::from_millis(250),
        "closed before the timeout: {:?}",
        idle_since.elapsed()
    );
    guard.close().await;
}

/// Sends a request on `tcp` and waits for the start of its answer: the server holds the
/// connection.
async fn answered(tcp: &mut TcpStream) {
    tcp.write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let mut head = [0u8; 12];
    tokio::time::timeout(BOUND, tcp.read_exact(&mut head))
        .await
        .expect("answered in time")
        .expect("read");
    assert!(head.starts_with(b"HTTP/1.1 "), "{head:?}");
}

/// Connections beyond `max_connections` are answered 503 with `Retry-After` and closed,
/// never left hanging; once one closes, a new one is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_max_connections_get_a_503_and_are_closed() {
    let h = Harness::with_config(ServerConfig {
        max_connections: Some(2),
        ..ServerConfig::default()
    })
    .await;
    let (_session, _w, guard) = h.session("rollout-crowded").await;
    let addr = authority(&guard.base_url);
    // Both are served (so the server holds both) before the third arrives.
    let mut first = TcpStream::connect(&addr).await.expect("connect");
    let mut second = TcpStream::connect(&addr).await.expect("connect");
    answered(&mut first).await;
    answered(&mut second).await;
    let mut third = TcpStream::connect(&addr).await.expect("connect");
    third
        .write_all(b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(BOUND, third.read_to_end(&mut answer))
        .await
        .expect("the third connection is answered and closed")
        .expect("read");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("retry-after: 1"),
        "{text}"
    );
    assert!(text.contains("max_connections (2"), "{text}");
    // Rendered as every other error of the server: the OpenAI shape, the marker header.
    assert!(text.contains("x-intercept-error: internal"), "{text}");
    assert!(text.contains(r#""type":"api_error""#), "{text}");
    // One of the two closes: a new connection is served again.
    drop(first);
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let answer = post_json(&guard.base_url, None, &chat_body("x", false)).await;
        if answer.status == 401 {
            break;
        }
        assert_eq!(answer.status, 503, "{}", answer.text());
        assert!(tokio::time::Instant::now() < deadline, "never served again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(second);
    guard.close().await;
}
