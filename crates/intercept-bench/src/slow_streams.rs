//! The lean client of the slow-stream rig (`slowgen`): N streamed chat requests at
//! once, in waves, each read only far enough to count its bytes, see `data: [DONE]` and
//! the end of the body.
//!
//! - HTTP/2 (h2c, prior knowledge, hyper's client): the N streams are spread over
//!   `ceil(N / per_connection)` connections, opened once and kept across waves. This is
//!   how it talks to a proxy, which then needs one upstream connection per stream.
//! - HTTP/1.1 (hand-written, [`crate::http1`]): one keep-alive connection per stream,
//!   kept across waves. This is how it talks to the HTTP/1.1-only upstream directly,
//!   i.e. the load a proxy puts on the upstream.
//!
//! A wave starts stream `i` at `i / N × start_over` after the wave begins and measures
//! each stream from its own start (request sent) to the end of its body; the wave ends
//! when every stream has ended or timed out. A stream is ok when the status is 2xx, the
//! body ended cleanly and contained `[DONE]`. A probe task measures how late a 10 ms
//! timer fires (the client's own event-loop lag): a large lag means the client, not the
//! target, was the bottleneck.
//!
//! Cheapness: the client shares a core with the upstream, and being woken for each
//! arriving frame (a cross-core wakeup each time the proxy writes) costs it more than
//! reading the frames. With `coalesce` set, a pacer task puts the thread to sleep for
//! that long between two rounds of I/O, so each round reads everything that arrived
//! meanwhile; durations are then measured to within `coalesce` (1 ms against 10 s
//! streams).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context as _, Result};
use bytes::{Bytes, BytesMut};
use hdrhistogram::Histogram;
use http::{HeaderValue, Request, Uri};
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{Instant, MissedTickBehavior};

use crate::http1::{self, Finder, Framing};
use crate::load::Percentiles;

/// What to send and how.
#[derive(Debug, Clone)]
pub struct StreamsConfig {
    /// Full URL of the chat completions route.
    pub url: Uri,
    /// Bearer secrets, used round robin (at least one).
    pub secrets: Vec<String>,
    /// The request body (should ask for a stream).
    pub body: Bytes,
    /// Streams per wave.
    pub streams: usize,
    /// HTTP/2 (h2c) instead of one HTTP/1.1 connection per stream.
    pub http2: bool,
    /// HTTP/2 streams per connection.
    pub per_connection: usize,
    /// Stream starts are spread evenly over this period.
    pub start_over: Duration,
    /// The wave gives up on the streams still running `start_over + timeout` after it
    /// began (they fail with `timeout`).
    pub timeout: Duration,
    /// Look at the network at most this often: the client thread sleeps this long
    /// between two rounds of I/O instead of being woken for every arriving frame (zero:
    /// woken as data arrives). See the module docs.
    pub coalesce: Duration,
}

/// What one wave measured.
#[derive(Debug, Clone, Serialize)]
pub struct WaveReport {
    /// Streams started.
    pub streams: u64,
    /// Streams that ended well (2xx, clean end, `[DONE]` seen).
    pub ok: u64,
    /// Streams that failed.
    pub errors: u64,
    /// Failures by kind.
    pub error_kinds: BTreeMap<String, u64>,
    /// Duration of ok streams, request sent to end of body.
    pub duration_us: Percentiles,
    /// Time to the first body byte of ok streams.
    pub ttfb_us: Percentiles,
    /// First start to last end, in seconds.
    pub wall_s: f64,
    /// Body bytes read.
    pub bytes_read: u64,
    /// Connections the client opened in this wave.
    pub connections_opened: u64,
    /// Largest lateness of the client's 10 ms probe timer during the wave.
    pub loop_lag_max_us: u64,
}

/// One stream's result.
struct Outcome {
    result: Result<(Duration, Duration), String>,
    bytes: u64,
}

/// The client, with its connections (kept across waves).
#[derive(Debug)]
pub struct StreamClient {
    config: StreamsConfig,
    addr: SocketAddr,
    connections: Arc<AtomicU64>,
    lag_max_us: Arc<AtomicU64>,
    /// HTTP/2 senders and their connection tasks.
    h2: Vec<(SendRequest<Full<Bytes>>, JoinHandle<()>)>,
    /// HTTP/1.1: one idle connection per stream slot.
    h1: Vec<Option<TcpStream>>,
    /// HTTP/1.1: the whole request (head and body), one per secret.
    h1_requests: Vec<Bytes>,
    auth: Vec<HeaderValue>,
    probe: JoinHandle<()>,
    pacer: Option<JoinHandle<()>>,
}

impl Drop for StreamClient {
    fn drop(&mut self) {
        self.probe.abort();
        if let Some(p) = &self.pacer {
            p.abort();
        }
        for (_, task) in &self.h2 {
            task.abort();
        }
    }
}

/// `POST <path>` with the bearer `secret` and `body`, as bytes on the wire.
pub fn h1_request(path: &str, host: &str, secret: &str, body: &[u8]) -> Bytes {
    let mut out = format!(
        "POST {path} HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {secret}\r\n\
         content-type: application/json\r\naccept: text/event-stream\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out.into()
}

impl StreamClient {
    /// Resolves the target and, for HTTP/2, opens the connections.
    pub async fn connect(config: StreamsConfig) -> Result<StreamClient> {
        if config.secrets.is_empty() {
            return Err(anyhow!("no secrets to send"));
        }
        let (authority, addr) = crate::load::resolve(&config.url).await?;
        let auth = config
            .secrets
            .iter()
            .map(|s| HeaderValue::try_from(format!("Bearer {s}")))
            .collect::<Result<Vec<_>, _>>()
            .context("a secret is not a valid header value")?;
        let path = config
            .url
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let h1_requests = if config.http2 {
            Vec::new()
        } else {
            config
                .secrets
                .iter()
                .map(|s| h1_request(path, authority.as_str(), s, &config.body))
                .collect()
        };
        let lag_max_us = Arc::new(AtomicU64::new(0));
        let probe = tokio::spawn(probe(lag_max_us.clone()));
        let pacer = (!config.coalesce.is_zero()).then(|| tokio::spawn(pacer(config.coalesce)));
        let mut client = StreamClient {
            addr,
            connections: Arc::new(AtomicU64::new(0)),
            lag_max_us,
            h2: Vec::new(),
            h1: (0..config.streams).map(|_| None).collect(),
            h1_requests,
            auth,
            probe,
            pacer,
            config,
        };
        if client.config.http2 {
            client.ensure_h2().await?;
        }
        Ok(client)
    }

    /// Connections opened so far.
    pub fn connections_opened(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Opens the HTTP/2 connections that are missing or closed.
    async fn ensure_h2(&mut self) -> Result<()> {
        let per = self.config.per_connection.max(1);
        let want = self.config.streams.div_ceil(per).max(1);
        self.h2.retain(|(s, _)| !s.is_closed());
        while self.h2.len() < want {
            let tcp = TcpStream::connect(self.addr)
                .await
                .with_context(|| format!("cannot connect to {}", self.addr))?;
            tcp.set_nodelay(true)?;
            self.connections.fetch_add(1, Ordering::Relaxed);
            let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .initial_stream_window_size(1 << 20)
                .initial_connection_window_size(64 << 20)
                .handshake(TokioIo::new(tcp))
                .await?;
            let task = tokio::spawn(async move {
                let _ = conn.await;
            });
            self.h2.push((sender, task));
        }
        Ok(())
    }

    /// Runs one wave of `streams` concurrent streams.
    pub async fn wave(&mut self) -> Result<WaveReport> {
        if self.config.http2 {
            self.ensure_h2().await?;
        }
        let n = self.config.streams.max(1);
        let per = self.config.per_connection.max(1);
        let connections_before = self.connections_opened();
        self.lag_max_us.store(0, Ordering::Relaxed);
        let begin = Instant::now();
        let mut set: JoinSet<(usize, Outcome, Option<TcpStream>)> = JoinSet::new();
        for i in 0..n {
            let start_at = begin + self.config.start_over.mul_f64(i as f64 / n as f64);
            if self.config.http2 {
                let mut req = Request::post(self.config.url.clone())
                    .body(Full::new(self.config.body.clone()))?;
                let h = req.headers_mut();
                h.insert(
                    http::header::AUTHORIZATION,
                    self.auth[i % self.auth.len()].clone(),
                );
                h.insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                let sender = self.h2[(i / per).min(self.h2.len() - 1)].0.clone();
                set.spawn(async move {
                    tokio::time::sleep_until(start_at).await;
                    (i, h2_stream(sender, req).await, None)
                });
            } else {
                let conn = self.h1[i].take();
                let request = self.h1_requests[i % self.h1_requests.len()].clone();
                let addr = self.addr;
                let connections = self.connections.clone();
                set.spawn(async move {
                    tokio::time::sleep_until(start_at).await;
                    let (outcome, conn) = h1_stream(conn, addr, request, &connections).await;
                    (i, outcome, conn)
                });
            }
        }
        let histogram = || {
            Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)
                .map_err(|e| anyhow!("histogram: {e}"))
        };
        let mut duration = histogram()?;
        let mut ttfb = histogram()?;
        let mut ok = 0;
        let mut errors = BTreeMap::new();
        let mut bytes_read = 0;
        // One deadline for the wave rather than a timer per stream (each would be
        // polled at every frame).
        let deadline = begin + self.config.start_over + self.config.timeout;
        loop {
            let done = match tokio::time::timeout_at(deadline, set.join_next()).await {
                Ok(Some(done)) => done,
                Ok(None) => break,
                Err(_) => {
                    // The streams still running failed; their connections are dropped.
                    let late = set.len() as u64;
                    set.shutdown().await;
                    *errors.entry("timeout".to_owned()).or_insert(0u64) += late;
                    break;
                }
            };
            let (i, outcome, conn) = done.context("a stream task panicked")?;
            if !self.config.http2 {
                self.h1[i] = conn;
            }
            bytes_read += outcome.bytes;
            match outcome.result {
                Ok((d, t)) => {
                    ok += 1;
                    let _ = duration.record(d.as_micros().max(1) as u64);
                    let _ = ttfb.record(t.as_micros().max(1) as u64);
                }
                Err(kind) => *errors.entry(kind).or_insert(0u64) += 1,
            }
        }
        let wall = begin.elapsed();
        Ok(WaveReport {
            streams: n as u64,
            ok,
            errors: errors.values().sum(),
            error_kinds: errors,
            duration_us: Percentiles::of(&duration),
            ttfb_us: Percentiles::of(&ttfb),
            wall_s: wall.as_secs_f64(),
            bytes_read,
            connections_opened: self.connections_opened() - connections_before,
            loop_lag_max_us: self.lag_max_us.load(Ordering::Relaxed),
        })
    }
}

/// Records how late a 10 ms timer fires.
async fn probe(max_us: Arc<AtomicU64>) {
    let mut interval = tokio::time::interval(Duration::from_millis(10));
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let scheduled = interval.tick().await;
        let late = Instant::now().saturating_duration_since(scheduled);
        max_us.fetch_max(late.as_micros() as u64, Ordering::Relaxed);
    }
}

/// Sleeps the (single) runtime thread for `pause` between two rounds of I/O: a yielded
/// task runs again only after the runtime has polled the I/O driver, so each round
/// handles every socket that became ready during the pause, and the thread is never
/// parked in `epoll_wait` to be woken frame by frame. Meant for a current-thread
/// runtime.
async fn pacer(pause: Duration) {
    loop {
        std::thread::sleep(pause);
        tokio::task::yield_now().await;
    }
}

async fn h2_stream(mut sender: SendRequest<Full<Bytes>>, req: Request<Full<Bytes>>) -> Outcome {
    let t0 = Instant::now();
    let failed = |kind: String, bytes| Outcome {
        result: Err(kind),
        bytes,
    };
    if let Err(e) = sender.ready().await {
        return failed(format!("transport: {e}"), 0);
    }
    let resp = match sender.send_request(req).await {
        Ok(r) => r,
        Err(e) => return failed(format!("transport: {e}"), 0),
    };
    let status = resp.status();
    let mut body = resp.into_body();
    let mut first = None;
    let mut bytes = 0u64;
    let mut done = Finder::new(b"[DONE]");
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    first.get_or_insert_with(|| t0.elapsed());
                    bytes += data.len() as u64;
                    done.push(&data);
                }
            }
            Err(e) => return failed(format!("body: {e}"), bytes),
        }
    }
    let took = t0.elapsed();
    if !status.is_success() {
        return failed(format!("status {}", status.as_u16()), bytes);
    }
    if !done.found() {
        return failed("stream ended without [DONE]".into(), bytes);
    }
    Outcome {
        result: Ok((took, first.unwrap_or(took))),
        bytes,
    }
}

/// One HTTP/1.1 stream on `conn` (or a new connection); gives the connection back when
/// it can carry another request.
async fn h1_stream(
    conn: Option<TcpStream>,
    addr: SocketAddr,
    request: Bytes,
    connections: &AtomicU64,
) -> (Outcome, Option<TcpStream>) {
    let t0 = Instant::now();
    let mut bytes = 0u64;
    let failed = |kind: String, bytes| {
        (
            Outcome {
                result: Err(kind),
                bytes,
            },
            None,
        )
    };
    let mut stream = match conn {
        Some(s) => s,
        None => match TcpStream::connect(addr).await {
            Ok(s) => {
                let _ = s.set_nodelay(true);
                connections.fetch_add(1, Ordering::Relaxed);
                s
            }
            Err(e) => return failed(format!("connect: {}", e.kind()), 0),
        },
    };
    if let Err(e) = stream.write_all(&request).await {
        return failed(format!("write: {}", e.kind()), 0);
    }
    let mut buf = BytesMut::with_capacity(8 << 10);
    let mut first = None;
    let head = loop {
        match http1::parse_response(&buf) {
            Ok(Some(head)) => break head,
            Ok(None) => {}
            Err(e) => return failed(e.to_string(), bytes),
        }
        match stream.read_buf(&mut buf).await {
            Ok(0) => return failed("closed before the response head".into(), bytes),
            Ok(_) => {}
            Err(e) => return failed(format!("read: {}", e.kind()), bytes),
        }
    };
    let _ = buf.split_to(head.head_len);
    let mut done = Finder::new(b"[DONE]");
    let mut decoder = http1::ChunkedDecoder::new();
    let mut left = match head.framing {
        Framing::Length(n) => n,
        _ => u64::MAX,
    };
    let clean_end;
    loop {
        if !buf.is_empty() {
            first.get_or_insert_with(|| t0.elapsed());
            match head.framing {
                Framing::Chunked => {
                    let consumed = match decoder.decode(&buf, |d| {
                        bytes += d.len() as u64;
                        done.push(d);
                    }) {
                        Ok(n) => n,
                        Err(e) => return failed(e.to_string(), bytes),
                    };
                    if decoder.is_done() {
                        // Anything after the body would be an unasked-for response.
                        clean_end = consumed == buf.len();
                        break;
                    }
                    buf.clear();
                }
                Framing::Length(_) | Framing::Close => {
                    let n = (buf.len() as u64).min(left) as usize;
                    bytes += n as u64;
                    done.push(&buf[..n]);
                    left -= n as u64;
                    if left == 0 {
                        clean_end = n == buf.len();
                        break;
                    }
                    buf.clear();
                }
            }
        } else if head.framing == Framing::Length(0) {
            clean_end = true;
            break;
        }
        match stream.read_buf(&mut buf).await {
            Ok(0) if head.framing == Framing::Close => {
                clean_end = false;
                break;
            }
            Ok(0) => return failed("closed in the middle of the body".into(), bytes),
            Ok(_) => {}
            Err(e) => return failed(format!("read: {}", e.kind()), bytes),
        }
    }
    let took = t0.elapsed();
    let reusable = clean_end && !head.close;
    let conn = reusable.then_some(stream);
    if !(200..300).contains(&head.status) {
        return (
            Outcome {
                result: Err(format!("status {}", head.status)),
                bytes,
            },
            conn,
        );
    }
    if !done.found() {
        return (
            Outcome {
                result: Err("stream ended without [DONE]".into()),
                bytes,
            },
            conn,
        );
    }
    (
        Outcome {
            result: Ok((took, first.unwrap_or(took))),
            bytes,
        },
        conn,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slow_upstream::{listen, SlowConfig, SlowUpstream};

    async fn upstream(chunks: usize) -> SlowUpstream {
        let listener = listen("127.0.0.1:0".parse().expect("addr"), 1024).expect("listen");
        SlowUpstream::start(
            listener,
            SlowConfig {
                chunks,
                interval: Duration::from_millis(10),
                ..SlowConfig::default()
            },
        )
        .expect("start")
    }

    #[tokio::test]
    async fn h1_waves_reuse_their_connections() {
        let up = upstream(5).await;
        let mut client = StreamClient::connect(StreamsConfig {
            url: format!("http://{}/v1/chat/completions", up.addr())
                .parse()
                .expect("url"),
            secrets: vec!["a".into(), "b".into()],
            body: crate::bodies::chat_request(true, 512).into(),
            streams: 40,
            http2: false,
            per_connection: 1,
            start_over: Duration::from_millis(20),
            timeout: Duration::from_secs(20),
            coalesce: Duration::ZERO,
        })
        .await
        .expect("client");
        let first = client.wave().await.expect("wave 1");
        assert_eq!((first.ok, first.errors), (40, 0), "{first:?}");
        assert_eq!(first.connections_opened, 40);
        // 5 ticks 10 ms apart: at least 40 ms from the first to the last.
        assert!(first.duration_us.p50 >= 40_000, "{first:?}");
        assert!(first.ttfb_us.p50 < first.duration_us.p50);
        assert!(first.bytes_read > 40 * 5 * 100);
        let second = client.wave().await.expect("wave 2");
        assert_eq!((second.ok, second.errors), (40, 0), "{second:?}");
        assert_eq!(second.connections_opened, 0);
        assert_eq!(second.bytes_read, first.bytes_read);
        let stats = up.stats();
        assert_eq!(stats.connections(), 40);
        assert_eq!(stats.requests(), 80);
        assert_eq!(stats.streams_completed(), 80);
        drop(client);
        up.shutdown().await;
    }

    #[tokio::test]
    async fn h2_spreads_streams_over_few_connections() {
        // The slow upstream speaks HTTP/1.1 only; the mock model of intercept-test
        // speaks h2c too.
        let up = intercept_test::MockUpstream::start_with(intercept_test::MockConfig {
            chunks: 4,
            ..intercept_test::MockConfig::fast()
        })
        .await
        .expect("mock");
        let mut client = StreamClient::connect(StreamsConfig {
            url: up.chat_completions_url().parse().expect("url"),
            secrets: vec!["a".into()],
            body: crate::bodies::chat_request(true, 512).into(),
            streams: 25,
            http2: true,
            per_connection: 10,
            start_over: Duration::ZERO,
            timeout: Duration::from_secs(20),
            coalesce: Duration::ZERO,
        })
        .await
        .expect("client");
        assert_eq!(client.connections_opened(), 3);
        for wave in 0..2 {
            let r = client.wave().await.expect("wave");
            assert_eq!((r.ok, r.errors), (25, 0), "wave {wave}: {r:?}");
            assert_eq!(r.connections_opened, 0);
            assert!(r.bytes_read > 0);
        }
        assert_eq!(up.request_count(), 50);
        drop(client);
        up.shutdown().await;
    }

    #[tokio::test]
    async fn intercept_relays_and_records_the_slow_stream() {
        use intercept_core::{Interception as _, Upstream};
        use intercept_server::{InterceptionServer, ServerConfig};

        let up = upstream(6).await;
        let server = InterceptionServer::new(ServerConfig {
            listen: Some("127.0.0.1:0".parse().expect("addr")),
            ..ServerConfig::default()
        })
        .expect("server");
        server.start().await.expect("start");
        let session = Arc::new(crate::CountingSession::new(
            "s",
            "policy",
            Upstream::new(up.base_url()),
        ));
        let guard = server.acquire(session.clone()).await.expect("acquire");
        let secret = guard.slot().model_secret.expose().to_owned();
        let url = format!(
            "{}/v1/chat/completions",
            server.base_url().expect("base url")
        );
        let mut client = StreamClient::connect(StreamsConfig {
            url: url.parse().expect("url"),
            secrets: vec![secret],
            body: crate::bodies::chat_request(true, 512).into(),
            streams: 12,
            http2: true,
            per_connection: 5,
            start_over: Duration::from_millis(10),
            timeout: Duration::from_secs(20),
            coalesce: Duration::from_millis(1),
        })
        .await
        .expect("client");
        for _ in 0..2 {
            let r = client.wave().await.expect("wave");
            assert_eq!((r.ok, r.errors), (12, 0), "{r:?}");
        }
        // Every call was assembled and recorded without error: the stream has the shape
        // intercept's chat assembly expects, usage and [DONE] included.
        assert_eq!(session.records(), 24);
        assert_eq!(session.errors(), 0);
        let stats = up.stats().snapshot();
        assert_eq!(stats["streams_completed"], 24);
        assert_eq!(stats["requests"], 24);
        drop(client);
        guard.close().await;
        server.stop().await.expect("stop");
        up.shutdown().await;
    }
}
