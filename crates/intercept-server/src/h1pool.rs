//! Plain-HTTP/1.1 upstream connections driven by the call that uses them.
//!
//! A pooled client that runs each connection in a task of its own hands a streamed
//! response over one body frame at a time: every SSE event of the upstream costs a wake
//! of the call's task, a wake of the connection's task and a poll of each. Here the call
//! polls its connection itself (inside [`DrivenBody::poll_frame`]), so the frames the
//! connection has already read pass over with no task switch. Between calls, a
//! connection rests in the pool unpolled; it is polled once on checkout, which notices a
//! connection the upstream closed meanwhile.
//!
//! Only `http://` upstreams go through here (the RL case: engines on the same host or
//! network); `https://` ones use the general pooled client, with TLS and HTTP/2.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt as _;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpStream;

use crate::http_body::SliceBody;

type Conn = http1::Connection<TokioIo<TcpStream>, SliceBody>;

/// Idle connections older than this are closed rather than reused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// A connection: its request handle and its state machine (boxed once when it is made,
/// so moving it in and out of the pool copies a pointer).
struct Live {
    sender: http1::SendRequest<SliceBody>,
    conn: Conn,
}

/// One idle connection.
struct Idle {
    live: Box<Live>,
    since: Instant,
}

/// Why a request got no response.
#[derive(Debug)]
pub(crate) enum H1Error {
    /// No connection could be made (the request never left).
    Connect(std::io::Error),
    /// Connecting took longer than the connect timeout.
    ConnectTimeout,
    /// The exchange failed.
    Http(hyper::Error),
}

/// The pool: idle connections per `host:port`.
pub(crate) struct H1Pool {
    idle: Mutex<HashMap<String, Vec<Idle>>>,
    max_idle_per_host: usize,
    connect_timeout: Duration,
}

impl std::fmt::Debug for H1Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H1Pool")
            .field("max_idle_per_host", &self.max_idle_per_host)
            .finish_non_exhaustive()
    }
}

impl H1Pool {
    pub(crate) fn new(max_idle_per_host: usize, connect_timeout: Duration) -> Arc<Self> {
        Arc::new(H1Pool {
            idle: Mutex::new(HashMap::new()),
            max_idle_per_host,
            connect_timeout,
        })
    }

    /// A live idle connection to `key`, if the pool has one.
    fn checkout(&self, key: &str) -> Option<Box<Live>> {
        loop {
            let mut idle = {
                let mut map = self.idle.lock();
                map.get_mut(key)?.pop()?
            };
            if idle.since.elapsed() > IDLE_TIMEOUT {
                continue;
            }
            // One poll: reads a close (or anything unexpected) the upstream sent meanwhile.
            let live = &mut *idle.live;
            if (&mut live.conn).now_or_never().is_some() || live.sender.is_closed() {
                continue;
            }
            return Some(idle.live);
        }
    }

    fn checkin(&self, key: String, live: Box<Live>) {
        if self.max_idle_per_host == 0 || live.sender.is_closed() {
            return;
        }
        let mut map = self.idle.lock();
        let list = map.entry(key).or_default();
        if list.len() < self.max_idle_per_host {
            list.push(Idle {
                live,
                since: Instant::now(),
            });
        }
    }

    async fn connect(&self, key: &str) -> Result<Box<Live>, H1Error> {
        let stream = match tokio::time::timeout(self.connect_timeout, TcpStream::connect(key)).await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(H1Error::Connect(e)),
            Err(_) => return Err(H1Error::ConnectTimeout),
        };
        let _ = stream.set_nodelay(true);
        let (sender, conn) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(H1Error::Http)?;
        Ok(Box::new(Live { sender, conn }))
    }

    /// Sends `req` (an absolute `http://` request) on a pooled or new connection to its
    /// authority. A pooled connection that turns out closed before the request left is
    /// replaced by another (hyper hands back a request it did not send).
    pub(crate) async fn send(
        self: &Arc<Self>,
        req: Request<SliceBody>,
    ) -> Result<Response<DrivenBody>, H1Error> {
        let (mut parts, body) = req.into_parts();
        let authority = parts.uri.authority().cloned();
        let Some(authority) = authority else {
            return Err(H1Error::Connect(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the upstream URL has no host",
            )));
        };
        let key = match authority.port_u16() {
            Some(_) => authority.as_str().to_owned(),
            None => format!("{}:80", authority.host()),
        };
        // On the wire: origin-form request line and a Host header.
        parts.uri = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
            .parse()
            .unwrap_or_default();
        if !parts.headers.contains_key(http::header::HOST) {
            if let Ok(host) = http::HeaderValue::from_str(authority.as_str()) {
                parts.headers.insert(http::header::HOST, host);
            }
        }
        let mut req = Request::from_parts(parts, body);
        loop {
            let (reused, mut live) = match self.checkout(&key) {
                Some(c) => (true, c),
                None => (false, self.connect(&key).await?),
            };
            let Live { sender, conn } = &mut *live;
            // Not ready: the connection closed while it rested, and nothing was sent.
            if let Err(e) = drive(conn, sender.ready()).await.and_then(|r| r) {
                if reused {
                    continue;
                }
                return Err(H1Error::Http(e));
            }
            match drive(conn, sender.try_send_request(req)).await {
                Ok(Ok(resp)) => {
                    return Ok(resp.map(|body| DrivenBody {
                        body,
                        conn: Some(live),
                        pool: self.clone(),
                        key,
                    }))
                }
                // The request never left a pooled connection: try it on another.
                Ok(Err(mut e)) => match e.take_message() {
                    Some(back) if reused => req = back,
                    _ => return Err(H1Error::Http(e.into_error())),
                },
                Err(e) => return Err(H1Error::Http(e)),
            }
        }
    }
}

/// Polls `fut` to completion, polling the connection whenever `fut` waits.
async fn drive<F: Future>(conn: &mut Conn, fut: F) -> Result<F::Output, hyper::Error> {
    let mut fut = std::pin::pin!(fut);
    let mut conn_done = false;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = fut.as_mut().poll(cx) {
            return Poll::Ready(Ok(out));
        }
        if !conn_done {
            match Pin::new(&mut *conn).poll(cx) {
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => conn_done = true,
                Poll::Pending => {}
            }
            if let Poll::Ready(out) = fut.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
        }
        Poll::Pending
    })
    .await
}

/// A response body read from a connection that this body drives; the connection goes
/// back to the pool when the body ends.
pub(crate) struct DrivenBody {
    body: Incoming,
    conn: Option<Box<Live>>,
    pool: Arc<H1Pool>,
    key: String,
}

impl std::fmt::Debug for DrivenBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrivenBody").finish_non_exhaustive()
    }
}

impl Body for DrivenBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        for _ in 0..2 {
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Ready(None) => {
                    if let Some(live) = this.conn.take() {
                        this.pool.checkin(std::mem::take(&mut this.key), live);
                    }
                    return Poll::Ready(None);
                }
                Poll::Ready(other) => return Poll::Ready(other),
                Poll::Pending => {}
            }
            // The connection reads on: what it passes to the body is taken on the
            // second round, in this same poll.
            let Some(live) = this.conn.as_mut() else {
                return Poll::Pending;
            };
            match Pin::new(&mut live.conn).poll(cx) {
                Poll::Pending => {}
                Poll::Ready(Ok(())) => this.conn = None,
                Poll::Ready(Err(e)) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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

    async fn text(resp: Response<DrivenBody>) -> String {
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
            let pool = H1Pool::new(8, Duration::from_secs(5));
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
            tokio::spawn(async move {
                while let Ok((mut socket, _)) = listener.accept().await {
                    count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
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
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    });
                }
            });
            let pool = H1Pool::new(8, Duration::from_secs(5));
            let url = format!("http://{addr}/v1/chat/completions");
            for _ in 0..3 {
                let resp = pool.send(chat(&url, false)).await.expect("response");
                assert_eq!(text(resp).await, "ok");
                // Let the upstream close the connection the pool now holds.
                tokio::time::sleep(Duration::from_millis(60)).await;
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
            let pool = H1Pool::new(8, Duration::from_secs(5));
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
        let pool = H1Pool::new(8, Duration::from_secs(5));
        let err = pool
            .send(chat(&format!("http://{addr}/v1/chat/completions"), false))
            .await
            .expect_err("refused");
        assert!(matches!(err, H1Error::Connect(_)), "{err:?}");
    }
}
