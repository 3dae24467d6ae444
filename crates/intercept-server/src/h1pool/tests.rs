//! The pool against real and scripted upstreams, and in-memory pipes.

mod differential;

use std::future::Future;
use std::time::Duration;

use http::header;
use http_body_util::BodyExt as _;
use intercept_test::{MockConfig, MockUpstream};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::*;

fn chat(url: &str, stream: bool) -> Request<SliceBody> {
    let body = serde_json::json!({
        "model": "m", "stream": stream,
        "messages": [{"role": "user", "content": "hi"}],
    });
    let bytes = Bytes::from(serde_json::to_vec(&body).expect("json"));
    Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(SliceBody::new(vec![bytes]))
        .expect("request")
}

async fn text<D: Dial>(resp: Response<DrivenBody<D>>) -> String {
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8(bytes.to_vec()).expect("utf-8")
}

async fn within<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("the test finished in time")
}

#[tokio::test]
async fn sequential_calls_share_one_connection() {
    within(async {
        let upstream = MockUpstream::start().await.expect("mock");
        let pool = H1Pool::new(8, Duration::from_secs(5), Timeouts::default());
        let url = upstream.chat_completions_url();
        for i in 0..4 {
            let resp = pool.send(chat(&url, i % 2 == 1)).await.expect("response");
            assert_eq!(resp.status(), 200);
            let body = text(resp).await;
            if i % 2 == 1 {
                assert!(body.contains(r#""content":"ec""#), "{body}");
                assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
            } else {
                assert!(body.contains("echo: hi"), "{body}");
            }
        }
        assert_eq!(upstream.request_count(), 4);
        assert_eq!(upstream.connections(), 1, "one connection, reused");
        let seen = upstream.requests();
        assert_eq!(seen[0].path, "/v1/chat/completions");
    })
    .await
}

#[tokio::test]
async fn a_connection_the_upstream_closed_while_idle_is_replaced() {
    within(async {
        // Answers one request per connection, then closes it without saying so.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        // Each connection's close, once the upstream has closed it.
        let (closed_tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let closed_tx = closed_tx.clone();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&seen).to_ascii_lowercase();
                    assert!(
                        head.starts_with("post /v1/chat/completions http/1.1\r\n"),
                        "{head}"
                    );
                    assert!(head.contains(&format!("host: {addr}")), "{head}");
                    let _ = socket
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await;
                    drop(socket);
                    let _ = closed_tx.send(());
                });
            }
        });
        let pool = H1Pool::new(8, Duration::from_secs(5), Timeouts::default());
        // Credentials in the URL stay out of the Host header and the pool key.
        let url = format!("http://user:pw@{addr}/v1/chat/completions");
        for _ in 0..3 {
            let resp = pool.send(chat(&url, false)).await.expect("response");
            assert_eq!(text(resp).await, "ok");
            // The upstream has closed the connection the pool now holds.
            closed.recv().await.expect("the upstream closes");
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
    })
    .await
}

#[tokio::test]
async fn a_body_dropped_midway_does_not_go_back_to_the_pool() {
    within(async {
        let upstream = MockUpstream::start_with(MockConfig {
            chunk_delay: Duration::from_millis(50),
            ..MockConfig::default()
        })
        .await
        .expect("mock");
        let pool = H1Pool::new(8, Duration::from_secs(5), Timeouts::default());
        let url = upstream.chat_completions_url();
        let resp = pool.send(chat(&url, true)).await.expect("response");
        let mut body = resp.into_body();
        let first = body.frame().await.expect("a frame").expect("data");
        assert!(!first.into_data().expect("data").is_empty());
        drop(body);
        let resp = pool.send(chat(&url, false)).await.expect("response");
        assert!(text(resp).await.contains("echo: hi"));
        assert_eq!(
            upstream.connections(),
            2,
            "the half-read connection was closed"
        );
    })
    .await
}

#[tokio::test]
async fn nothing_listening_is_a_connect_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    let pool = H1Pool::new(8, Duration::from_secs(5), Timeouts::default());
    let err = pool
        .send(chat(&format!("http://{addr}/v1/chat/completions"), false))
        .await
        .expect_err("refused");
    assert!(matches!(err, H1Error::Connect(_)), "{err:?}");
}

/// A raw upstream: each connection reads requests and answers each with the next
/// scripted reply (`None`: close without answering); a connection is closed after a
/// reply that says `connection: close` or has no length. Counts connections and
/// requests.
struct Scripted {
    url: String,
    connections: Arc<std::sync::atomic::AtomicUsize>,
    requests: Arc<std::sync::atomic::AtomicUsize>,
}

async fn scripted(replies: Vec<Option<&'static str>>) -> Scripted {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let replies = Arc::new(Mutex::new(std::collections::VecDeque::from(replies)));
    let (c, r) = (connections.clone(), requests.clone());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            let (r, replies) = (r.clone(), replies.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    // One request: its head, then its content-length body.
                    let end = loop {
                        if let Some(i) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .and_then(|v| v.trim().parse().ok())
                        .expect("the request has a content-length");
                    while seen.len() < end + len {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => seen.extend_from_slice(&buf[..n]),
                        }
                    }
                    seen.drain(..end + len);
                    r.fetch_add(1, Ordering::SeqCst);
                    let Some(reply) = replies.lock().pop_front().flatten() else {
                        return;
                    };
                    if socket.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                    let lower = reply.to_ascii_lowercase();
                    if lower.contains("connection: close")
                        || !(lower.contains("content-length") || lower.contains("chunked"))
                    {
                        return;
                    }
                }
            });
        }
    });
    Scripted {
        url: format!("http://{addr}/v1/chat/completions"),
        connections,
        requests,
    }
}

impl Scripted {
    fn counts(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering;
        (
            self.connections.load(Ordering::SeqCst),
            self.requests.load(Ordering::SeqCst),
        )
    }
}

#[tokio::test]
async fn interim_answers_are_skipped_and_connections_reused_only_when_they_can_be() {
    within(async {
        let up = scripted(vec![
            Some("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n"),
            Some("HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\ncd"),
            Some("HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nef"),
            Some("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nup to the close"),
            Some("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\ngh"),
        ])
        .await;
        let pool = H1Pool::new(8, Duration::from_secs(5), Timeouts::default());
        let mut bodies = Vec::new();
        for _ in 0..5 {
            let resp = pool.send(chat(&up.url, false)).await.expect("response");
            bodies.push((resp.status().as_u16(), text(resp).await));
        }
        assert_eq!(
            bodies,
            vec![
                (200, "ab".to_owned()),
                (201, "cd".to_owned()),
                (200, "ef".to_owned()),
                (200, "up to the close".to_owned()),
                (200, "gh".to_owned()),
            ]
        );
        // 1-3 on one connection; `connection: close` and a body up to the close
        // each end theirs.
        assert_eq!(up.counts(), (3, 5));
    })
    .await
}

#[tokio::test]
async fn a_body_cut_short_is_an_error_and_its_connection_is_not_reused() {
    within(async {
        let up = scripted(vec![
            Some("HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"),
            None,
        ])
        .await;
        let pool = H1Pool::new(8, Duration::from_secs(5), Timeouts::default());
        let resp = pool.send(chat(&up.url, false)).await.expect("response");
        let mut body = resp.into_body();
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().expect("data"), "abc");
        // The upstream waits for the next request, which this connection never
        // carries: the pool is asked again while the body is still open.
        drop(body);
        let err = pool
            .send(chat(&up.url, false))
            .await
            .expect_err("no answer");
        let H1Error::Exchange(e) = err else {
            panic!("{err:?}")
        };
        assert!(e.to_string().contains("without answering"), "{e}");
        // Sent once each, on two connections: a request that left is never repeated.
        assert_eq!(up.counts(), (2, 2));
    })
    .await
}

#[tokio::test]
async fn a_connection_closed_mid_body_ends_the_body_with_an_error() {
    within(async {
        let up = scripted(vec![Some(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n3\r\nabc\r\n",
        )])
        .await;
        let pool = H1Pool::new(8, Duration::from_secs(5), Timeouts::default());
        let resp = pool.send(chat(&up.url, true)).await.expect("response");
        let err = resp.into_body().collect().await.expect_err("cut short");
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{err}");
        assert!(pool.idle.lock().values().all(VecDeque::is_empty));
    })
    .await
}

#[tokio::test]
async fn what_is_not_http_is_an_exchange_error() {
    within(async {
        let up = scripted(vec![Some("SSH-2.0-OpenSSH_9.6\r\n\r\n")]).await;
        let pool = H1Pool::new(8, Duration::from_secs(5), Timeouts::default());
        let err = pool.send(chat(&up.url, false)).await.expect_err("not http");
        let H1Error::Exchange(e) = err else {
            panic!("{err:?}")
        };
        assert!(e.to_string().contains("not an HTTP/1.x response"), "{e}");
    })
    .await
}

#[tokio::test]
async fn an_answer_before_the_whole_body_was_read_is_the_response() {
    within(async {
        // Reads the request head only, refuses the body and closes.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
                match socket.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            let body = r#"{"error":{"message":"request body too large"}}"#;
            let reply = format!(
                "HTTP/1.1 413 Payload Too Large\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = socket.write_all(reply.as_bytes()).await;
        });
        let pool = H1Pool::new(8, Duration::from_secs(5), Timeouts::default());
        let big = Bytes::from(vec![b' '; 32 << 20]);
        let req = Request::post(format!("http://{addr}/v1/chat/completions"))
            .body(SliceBody::new(vec![Bytes::from_static(b"{}"), big]))
            .expect("request");
        let resp = pool.send(req).await.expect("the upstream's answer");
        assert_eq!(resp.status(), 413);
        assert!(text(resp).await.contains("too large"));
        assert!(pool.idle.lock().values().all(VecDeque::is_empty), "not reused");
    })
    .await
}

#[tokio::test]
async fn connections_that_rested_too_long_are_closed_when_another_comes_back() {
    within(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let pool = Arc::new(H1Pool {
            dial: Tcp,
            timeouts: Timeouts::default(),
            idle: Mutex::new(HashMap::default()),
            max_idle_per_host: 8,
            idle_timeout: Duration::from_millis(50),
            connect_timeout: Duration::from_secs(5),
        });
        let key = addr.to_string();
        let mut accepted = Vec::new();
        for _ in 0..3 {
            let conn = pool.connect(&key).await.expect("connect");
            accepted.push(listener.accept().await.expect("accept").0);
            pool.checkin(key.clone(), conn);
            if accepted.len() == 2 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        assert_eq!(pool.idle.lock()[&key].len(), 1, "the two old ones are gone");
        // Closed, not merely forgotten: the upstream's side reads the end.
        for mut socket in accepted.drain(..2) {
            let mut buf = [0u8; 1];
            assert_eq!(socket.read(&mut buf).await.expect("read"), 0);
        }
        assert!(pool.checkout(&key).is_some(), "the fresh one is handed out");
    })
    .await
}

/// Connections over in-memory pipes of `capacity` bytes each way; the upstream's
/// end of each pipe goes to the receiver.
struct Pipes {
    capacity: usize,
    ends: tokio::sync::mpsc::UnboundedSender<tokio::io::DuplexStream>,
}

impl Dial for Pipes {
    type Io = tokio::io::DuplexStream;

    async fn dial(&self, _key: &str) -> io::Result<tokio::io::DuplexStream> {
        let (ours, theirs) = tokio::io::duplex(self.capacity);
        self.ends
            .send(theirs)
            .map_err(|_| io::Error::from(io::ErrorKind::ConnectionRefused))?;
        Ok(ours)
    }
}

type PipeEnds = tokio::sync::mpsc::UnboundedReceiver<tokio::io::DuplexStream>;

fn piped(capacity: usize, timeouts: Timeouts) -> (Arc<H1Pool<Pipes>>, PipeEnds) {
    let (ends, rx) = tokio::sync::mpsc::unbounded_channel();
    let pool = H1Pool::with_dial(
        Pipes { capacity, ends },
        8,
        Duration::from_secs(5),
        timeouts,
    );
    (pool, rx)
}

fn idle_count<D: Dial>(pool: &H1Pool<D>) -> usize {
    pool.idle.lock().values().map(VecDeque::len).sum()
}

/// Reads one request (head and content-length body) off `io`: the head, lowercased.
async fn read_request<Io: tokio::io::AsyncRead + Unpin>(io: &mut Io) -> Option<String> {
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let end = loop {
        if let Some(i) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut have = seen.len() - end;
    while have < len {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => have += n,
        }
    }
    Some(head)
}

fn big_request(url: &str, body_bytes: usize) -> Request<SliceBody> {
    Request::post(url)
        .body(SliceBody::new(vec![
            Bytes::from_static(b"{}"),
            Bytes::from(vec![b' '; body_bytes]),
        ]))
        .expect("request")
}

/// An upstream that reads request heads only and hands each accepted socket (and
/// the head it read) to the test.
async fn head_reader() -> (
    String,
    tokio::sync::mpsc::UnboundedReceiver<tokio::net::TcpStream>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 1];
                // One byte at a time: nothing past the head is taken.
                while !seen.ends_with(b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => seen.push(buf[0]),
                    }
                }
                let _ = tx.send(socket);
            });
        }
    });
    (format!("http://{addr}/v1/chat/completions"), rx)
}

#[tokio::test]
async fn an_early_answer_from_an_upstream_that_stops_reading_is_the_response() {
    within(async {
        // The upstream answers 413 after the head and then neither reads nor closes:
        // written first and read after, a 32 MiB body never got to the answer.
        let (url, mut sockets) = head_reader().await;
        let held = tokio::spawn(async move {
            let mut socket = sockets.recv().await.expect("a connection");
            let body = r#"{"error":{"message":"request body too large"}}"#;
            let reply = format!(
                "HTTP/1.1 413 Payload Too Large\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            socket.write_all(reply.as_bytes()).await.expect("answer");
            // Held open, unread, until the client is done with it.
            let mut rest = Vec::new();
            let _ = socket.read_to_end(&mut rest).await;
        });
        let pool = H1Pool::new(8, Duration::from_secs(5), Timeouts::default());
        let resp = pool
            .send(big_request(&url, 32 << 20))
            .await
            .expect("the early answer");
        assert_eq!(resp.status(), 413);
        assert!(text(resp).await.contains("too large"));
        assert_eq!(
            idle_count(&pool),
            0,
            "a half-written request's connection is closed"
        );
        // Closed, not merely forgotten: the upstream's read ends.
        held.await.expect("the upstream saw the close");
    })
    .await
}

#[tokio::test]
async fn the_rest_of_the_body_is_written_while_an_early_answer_is_read() {
    within(async {
        // The upstream sends its head at once, then reads the whole body, then ends
        // the answer with the number of body bytes it got.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut seen = Vec::new();
            let mut buf = vec![0u8; 64 * 1024];
            let end = loop {
                if let Some(i) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let n = socket.read(&mut buf).await.expect("read");
                seen.extend_from_slice(&buf[..n]);
            };
            socket
                .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                .await
                .expect("head");
            let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse().ok())
                .expect("a length");
            let mut got = seen.len() - end;
            while got < len {
                match socket.read(&mut buf).await.expect("read") {
                    0 => break,
                    n => got += n,
                }
            }
            let count = got.to_string();
            let last = format!("{:x}\r\n{count}\r\n0\r\n\r\n", count.len());
            socket.write_all(last.as_bytes()).await.expect("end");
            let _ = socket.read(&mut buf).await;
        });
        let pool = H1Pool::new(8, Duration::from_secs(5), Timeouts::default());
        let body = 32 << 20;
        let resp = pool
            .send(big_request(&format!("http://{addr}/v1/x"), body))
            .await
            .expect("response");
        assert_eq!(resp.status(), 200);
        assert_eq!(text(resp).await, (body + 2).to_string());
        assert_eq!(
            idle_count(&pool),
            1,
            "written whole and read whole: reusable"
        );
    })
    .await
}

#[tokio::test]
async fn an_upstream_that_takes_no_bytes_fails_the_write_after_the_write_idle_timeout() {
    within(async {
        let (url, mut sockets) = head_reader().await;
        let hold = tokio::spawn(async move { sockets.recv().await });
        let pool = H1Pool::new(
            8,
            Duration::from_secs(5),
            Timeouts {
                write_idle: Some(Duration::from_millis(200)),
                read_idle: None,
            },
        );
        let err = pool
            .send(big_request(&url, 32 << 20))
            .await
            .expect_err("stalled");
        let H1Error::Exchange(e) = err else {
            panic!("{err:?}")
        };
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("write idle timeout"), "{e}");
        drop(hold);
    })
    .await
}

#[tokio::test]
async fn an_upstream_that_sends_nothing_fails_the_call_after_the_read_idle_timeout() {
    within(async {
        let timeouts = Timeouts {
            write_idle: Some(Duration::from_secs(30)),
            read_idle: Some(Duration::from_millis(200)),
        };
        // No head: the request is read whole, and never answered.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            let mut held = Vec::new();
            let mut first = true;
            while let Ok((mut socket, _)) = listener.accept().await {
                if read_request(&mut socket).await.is_none() {
                    continue;
                }
                if !first {
                    // The second connection gets a head and half a body.
                    let _ = socket
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n",
                        )
                        .await;
                }
                first = false;
                held.push(socket);
            }
        });
        let pool = H1Pool::new(8, Duration::from_secs(5), timeouts);
        let url = format!("http://{addr}/v1/chat/completions");
        let err = pool.send(chat(&url, false)).await.expect_err("no head");
        let H1Error::Exchange(e) = err else {
            panic!("{err:?}")
        };
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("read idle timeout"), "{e}");

        let resp = pool.send(chat(&url, true)).await.expect("a head");
        let mut body = resp.into_body();
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().expect("data"), "abc");
        let e = body
            .frame()
            .await
            .expect("an end")
            .expect_err("the body stalled");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(body.frame().await.is_none(), "the body is over");
        assert_eq!(idle_count(&pool), 0);
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn the_read_idle_timeout_restarts_with_every_byte_and_is_off_by_default() {
    let limit = Duration::from_secs(60);
    let (pool, mut ends) = piped(
        64,
        Timeouts {
            write_idle: None,
            read_idle: Some(limit),
        },
    );
    tokio::spawn(async move {
        let mut end = ends.recv().await.expect("a connection");
        read_request(&mut end).await.expect("a request");
        end.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n")
            .await
            .expect("head");
        // A byte every 59 s, five times, then silence (held open).
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(59)).await;
            end.write_all(b"x").await.expect("byte");
        }
        std::future::pending::<()>().await;
    });
    let start = Instant::now();
    let resp = pool
        .send(chat("http://upstream:8000/v1/x", true))
        .await
        .expect("head");
    let mut body = resp.into_body();
    let mut got = Vec::new();
    let err = loop {
        match body.frame().await.expect("not over") {
            Ok(frame) => got.extend_from_slice(&frame.into_data().expect("data")),
            Err(e) => break e,
        }
    };
    assert_eq!(got, b"xxxxx");
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    // Paused time: the clock moved by exactly the waits.
    assert_eq!(start.elapsed(), Duration::from_secs(5 * 59) + limit);

    // Without a read idle timeout, a silent upstream is waited for.
    let (pool, mut ends) = piped(64, Timeouts::default());
    tokio::spawn(async move {
        let mut end = ends.recv().await.expect("a connection");
        read_request(&mut end).await.expect("a request");
        std::future::pending::<()>().await;
    });
    let waited = tokio::time::timeout(
        Duration::from_secs(24 * 3600),
        pool.send(chat("http://upstream:8000/v1/x", false)),
    )
    .await;
    assert!(waited.is_err(), "still waiting after a day");
}

#[tokio::test(start_paused = true)]
async fn resting_connections_age_on_the_runtime_clock() {
    let (pool, mut ends) = piped(1024, Timeouts::default());
    tokio::spawn(async move {
        while let Some(mut end) = ends.recv().await {
            tokio::spawn(async move {
                while read_request(&mut end).await.is_some() {
                    if end
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    let url = "http://upstream:8000/v1/x";
    assert_eq!(
        text(pool.send(chat(url, false)).await.expect("1")).await,
        "ok"
    );
    assert_eq!(idle_count(&pool), 1);
    tokio::time::advance(Duration::from_secs(89)).await;
    assert!(pool.checkout("upstream:8000").is_some(), "fresh at 89 s");
    assert_eq!(
        text(pool.send(chat(url, false)).await.expect("2")).await,
        "ok"
    );
    tokio::time::advance(IDLE_TIMEOUT + Duration::from_secs(1)).await;
    assert!(pool.checkout("upstream:8000").is_none(), "too old at 91 s");
}

#[tokio::test]
async fn a_response_with_both_framings_closes_its_connection() {
    within(async {
        let up = scripted(vec![
            Some("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 99\r\n\r\n2\r\nab\r\n0\r\n\r\n"),
            Some("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\ncd"),
        ])
        .await;
        let pool = H1Pool::new(8, Duration::from_secs(5), Timeouts::default());
        let resp = pool.send(chat(&up.url, false)).await.expect("response");
        assert!(resp.headers().get(header::CONTENT_LENGTH).is_none());
        assert_eq!(text(resp).await, "ab");
        assert_eq!(idle_count(&pool), 0);
        let resp = pool.send(chat(&up.url, false)).await.expect("response");
        assert_eq!(text(resp).await, "cd");
        assert_eq!(up.counts(), (2, 2), "the second call had a new connection");
    })
    .await
}

#[tokio::test]
async fn endless_interim_answers_are_an_error() {
    within(async {
        let (pool, mut ends) = piped(256, Timeouts::default());
        tokio::spawn(async move {
            let mut end = ends.recv().await.expect("a connection");
            read_request(&mut end).await.expect("a request");
            while end
                .write_all(b"HTTP/1.1 100 Continue\r\nx: y\r\n\r\n")
                .await
                .is_ok()
            {}
        });
        let err = pool
            .send(chat("http://upstream:8000/v1/x", false))
            .await
            .expect_err("endless");
        let H1Error::Exchange(e) = err else {
            panic!("{err:?}")
        };
        assert!(e.to_string().contains("interim"), "{e}");
    })
    .await
}
