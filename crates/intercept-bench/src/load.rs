//! A closed-loop HTTP load generator on hyper: `connections` connections, each carrying
//! `per_connection` requests at a time (1 for HTTP/1.1; more with HTTP/2), stopping
//! after `requests` requests or `duration` (after `warmup`), whichever comes first.
//!
//! Requests are spread over many bearer secrets (round robin), so a proxy that routes by
//! secret sees many sessions. It measures latency (request sent to body fully read),
//! time to first body byte, throughput over the measured window, and errors by kind;
//! with [`LoadConfig::interval`], also the successful requests completed in each
//! interval of the measured window ([`Intervals`]), to see whether throughput holds
//! over a long run.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{HeaderValue, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;

/// What to send, how hard and for how long.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// Full URL of the route (`http://127.0.0.1:PORT/v1/chat/completions`).
    pub url: Uri,
    /// Bearer secrets, used round robin (at least one).
    pub secrets: Vec<String>,
    /// The request body (shared by every request, never copied).
    pub body: Bytes,
    /// Whether the body asks for a stream (the response must end with `[DONE]`).
    pub stream: bool,
    /// Connections opened.
    pub connections: usize,
    /// Requests in flight per connection (HTTP/2 streams; 1 for HTTP/1.1).
    pub per_connection: usize,
    /// Speak HTTP/2 (prior knowledge, h2c) instead of HTTP/1.1.
    pub http2: bool,
    /// Stop after this many requests (warmup included).
    pub requests: u64,
    /// Stop after warmup + this long.
    pub duration: Duration,
    /// Requests started in this first period are sent but not measured.
    pub warmup: Duration,
    /// Give up on one request after this long (counted as an error).
    pub timeout: Duration,
    /// Count the successful requests completed in each interval of this length of the
    /// measured window ([`LoadReport::intervals`]); `None`: no intervals.
    pub interval: Option<Duration>,
}

impl LoadConfig {
    /// 1 connection, HTTP/1.1, 1000 requests or 10 s, no warmup, 60 s timeout.
    pub fn new(url: Uri, secrets: Vec<String>, body: Bytes) -> Self {
        let stream = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("stream").and_then(serde_json::Value::as_bool))
            .unwrap_or(false);
        LoadConfig {
            url,
            secrets,
            body,
            stream,
            connections: 1,
            per_connection: 1,
            http2: false,
            requests: 1000,
            duration: Duration::from_secs(10),
            warmup: Duration::ZERO,
            timeout: Duration::from_secs(60),
            interval: None,
        }
    }
}

/// Percentiles of a latency distribution, in microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// Largest.
    pub max: u64,
    /// Mean.
    pub mean: f64,
    /// Samples.
    pub count: u64,
}

impl Percentiles {
    /// The percentiles of `h` (all zero when it is empty).
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            max: h.max(),
            mean: h.mean(),
            count: h.len(),
        }
    }
}

/// Successful requests by the interval of the measured window in which they completed:
/// `ok[i]` ended in `[i × width_s, (i + 1) × width_s)` after the warmup. Requests that
/// end after the measured window (those still in flight at its end) are in no interval,
/// nor are those that ended during the warmup.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Intervals {
    /// Length of one interval, in seconds.
    pub width_s: f64,
    /// Length of the measured window, in seconds (the last interval may be shorter).
    pub window_s: f64,
    /// Successful requests completed in each interval.
    pub ok: Vec<u64>,
}

impl Intervals {
    /// Empty intervals of `width` covering `window` (the last one may be shorter).
    pub fn new(width: Duration, window: Duration) -> Self {
        let width_s = width.as_secs_f64();
        let n = if width_s > 0.0 {
            (window.as_secs_f64() / width_s).ceil() as usize
        } else {
            0
        };
        Intervals {
            width_s,
            window_s: window.as_secs_f64(),
            ok: vec![0; n],
        }
    }

    /// Counts one request that completed `since` after the start of the measured window.
    pub fn add(&mut self, since: Duration) {
        let since = since.as_secs_f64();
        if self.width_s <= 0.0 || since >= self.window_s {
            return;
        }
        let i = (since / self.width_s) as usize;
        if let Some(n) = self.ok.get_mut(i) {
            *n += 1;
        }
    }

    /// Adds the counts of `other` (same width and window) to these.
    pub fn merge(&mut self, other: &Intervals) {
        if self.ok.len() < other.ok.len() {
            self.ok.resize(other.ok.len(), 0);
        }
        for (a, b) in self.ok.iter_mut().zip(&other.ok) {
            *a += b;
        }
    }

    /// Requests per second over the first (`from_end` false) or the last intervals that
    /// make up `window_s` seconds (at least one interval; a shorter last interval counts
    /// for its own length); `None` when there are fewer intervals than that.
    pub fn window_rps(&self, window_s: f64, from_end: bool) -> Option<f64> {
        let (requests, seconds) = self.window(window_s, from_end)?;
        (seconds > 0.0).then(|| requests as f64 / seconds)
    }

    /// The successful requests and the seconds of the window of
    /// [`Intervals::window_rps`]; `None` when there are fewer intervals than it takes.
    pub fn window(&self, window_s: f64, from_end: bool) -> Option<(u64, f64)> {
        if self.width_s <= 0.0 {
            return None;
        }
        let n = ((window_s / self.width_s).round() as usize).max(1);
        if n > self.ok.len() {
            return None;
        }
        let first = if from_end { self.ok.len() - n } else { 0 };
        let requests: u64 = self.ok[first..first + n].iter().sum();
        let seconds: f64 = (first..first + n).map(|i| self.length_s(i)).sum();
        Some((requests, seconds))
    }

    /// Length of interval `i` in seconds: `width_s`, or less for a last interval cut by
    /// the end of the window.
    fn length_s(&self, i: usize) -> f64 {
        let left = self.window_s - i as f64 * self.width_s;
        if self.window_s > 0.0 {
            self.width_s.min(left).max(0.0)
        } else {
            self.width_s
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// Requests answered with 2xx and a complete body (warmup included).
    pub ok: u64,
    /// Requests that failed (status, transport, timeout, incomplete stream).
    pub errors: u64,
    /// Failures by kind.
    pub error_kinds: BTreeMap<String, u64>,
    /// Successful requests started after the warmup.
    pub measured_ok: u64,
    /// Length of the measured window, in seconds.
    pub measured_s: f64,
    /// Whole run, warmup included, in seconds.
    pub elapsed_s: f64,
    /// Successful requests per second over the measured window.
    pub rps: f64,
    /// Latency of measured successful requests.
    pub latency_us: Percentiles,
    /// Time to the first body byte of measured successful requests.
    pub ttfb_us: Percentiles,
    /// TCP connections opened (reconnections included).
    pub connections_opened: u64,
    /// Response body bytes read.
    pub bytes_read: u64,
    /// Size of the request body sent (every request sends the same one).
    pub request_body_bytes: u64,
    /// Successful requests per interval of the measured window, with
    /// [`LoadConfig::interval`].
    pub intervals: Option<Intervals>,
}

/// One request's result.
enum Outcome {
    Ok { latency: Duration, ttfb: Duration },
    Failed(String),
}

#[derive(Debug)]
struct Shared {
    issued: AtomicU64,
    connections: AtomicU64,
    bytes_read: AtomicU64,
}

/// Per-worker tallies, merged at the end.
struct Tally {
    latency: Histogram<u64>,
    ttfb: Histogram<u64>,
    ok: u64,
    measured_ok: u64,
    errors: BTreeMap<String, u64>,
    intervals: Option<Intervals>,
}

impl Tally {
    fn new(intervals: Option<Intervals>) -> Result<Self> {
        let h = || Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3);
        Ok(Tally {
            latency: h().map_err(|e| anyhow!("histogram: {e}"))?,
            ttfb: h().map_err(|e| anyhow!("histogram: {e}"))?,
            ok: 0,
            measured_ok: 0,
            errors: BTreeMap::new(),
            intervals,
        })
    }

    fn merge(&mut self, other: Tally) -> Result<()> {
        self.latency
            .add(&other.latency)
            .map_err(|e| anyhow!("histogram: {e}"))?;
        self.ttfb
            .add(&other.ttfb)
            .map_err(|e| anyhow!("histogram: {e}"))?;
        self.ok += other.ok;
        self.measured_ok += other.measured_ok;
        for (k, v) in other.errors {
            *self.errors.entry(k).or_default() += v;
        }
        if let (Some(mine), Some(theirs)) = (&mut self.intervals, &other.intervals) {
            mine.merge(theirs);
        }
        Ok(())
    }
}

/// A connection's request sender, HTTP/1.1 (owned by one worker) or HTTP/2 (shared).
enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

impl Sender {
    async fn send(&mut self, req: Request<Full<Bytes>>) -> hyper::Result<http::Response<Incoming>> {
        match self {
            Sender::H1(s) => {
                s.ready().await?;
                s.send_request(req).await
            }
            Sender::H2(s) => {
                s.ready().await?;
                s.send_request(req).await
            }
        }
    }

    fn is_closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }

    /// Another handle on the same connection (HTTP/2 only).
    fn share(&self) -> Option<Sender> {
        match self {
            Sender::H1(_) => None,
            Sender::H2(s) => Some(Sender::H2(s.clone())),
        }
    }
}

async fn connect(addr: SocketAddr, http2: bool, shared: &Shared) -> Result<Sender> {
    let tcp = TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    tcp.set_nodelay(true)?;
    shared.connections.fetch_add(1, Ordering::Relaxed);
    let io = TokioIo::new(tcp);
    if http2 {
        let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(1 << 20)
            .initial_connection_window_size(16 << 20)
            .handshake(io)
            .await?;
        tokio::spawn(conn);
        Ok(Sender::H2(sender))
    } else {
        let (sender, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(conn);
        Ok(Sender::H1(sender))
    }
}

/// The host part of a target URL and the address it resolves to.
pub(crate) async fn resolve(url: &http::Uri) -> Result<(http::uri::Authority, SocketAddr)> {
    let authority = url
        .authority()
        .ok_or_else(|| anyhow!("the URL {url} has no host"))?
        .clone();
    let addr = tokio::net::lookup_host(authority.as_str())
        .await?
        .next()
        .ok_or_else(|| anyhow!("{authority} does not resolve"))?;
    Ok((authority, addr))
}

/// Runs the load and reports. Fails only if the target cannot be reached at all.
pub async fn run(config: &LoadConfig) -> Result<LoadReport> {
    if config.secrets.is_empty() {
        return Err(anyhow!("no secrets to send"));
    }
    let (_, addr) = resolve(&config.url).await?;
    let auth: Arc<Vec<HeaderValue>> = Arc::new(
        config
            .secrets
            .iter()
            .map(|s| HeaderValue::try_from(format!("Bearer {s}")))
            .collect::<Result<_, _>>()
            .context("a secret is not a valid header value")?,
    );
    let shared = Arc::new(Shared {
        issued: AtomicU64::new(0),
        connections: AtomicU64::new(0),
        bytes_read: AtomicU64::new(0),
    });
    let started = Instant::now();
    let measure_from = started + config.warmup;
    let deadline = measure_from + config.duration;
    let per_connection = if config.http2 {
        config.per_connection.max(1)
    } else {
        1
    };

    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..config.connections.max(1) {
        let first = connect(addr, config.http2, &shared).await?;
        let mut senders: Vec<Sender> = (1..per_connection).filter_map(|_| first.share()).collect();
        senders.push(first);
        for sender in senders {
            let worker = Worker {
                config: config.clone(),
                auth: auth.clone(),
                shared: shared.clone(),
                addr,
                sender,
                measure_from,
                deadline,
            };
            workers.spawn(worker.run());
        }
    }
    let intervals = config
        .interval
        .map(|width| Intervals::new(width, config.duration));
    let mut total = Tally::new(intervals)?;
    while let Some(done) = workers.join_next().await {
        total.merge(done.context("a load worker panicked")??)?;
    }
    let ended = Instant::now();
    let measured_s = ended.saturating_duration_since(measure_from).as_secs_f64();
    let errors = total.errors.values().sum();
    Ok(LoadReport {
        ok: total.ok,
        errors,
        error_kinds: total.errors,
        measured_ok: total.measured_ok,
        measured_s,
        elapsed_s: ended.duration_since(started).as_secs_f64(),
        rps: if measured_s > 0.0 {
            total.measured_ok as f64 / measured_s
        } else {
            0.0
        },
        latency_us: Percentiles::of(&total.latency),
        ttfb_us: Percentiles::of(&total.ttfb),
        connections_opened: shared.connections.load(Ordering::Relaxed),
        bytes_read: shared.bytes_read.load(Ordering::Relaxed),
        request_body_bytes: config.body.len() as u64,
        intervals: total.intervals,
    })
}

struct Worker {
    config: LoadConfig,
    auth: Arc<Vec<HeaderValue>>,
    shared: Arc<Shared>,
    addr: SocketAddr,
    sender: Sender,
    measure_from: Instant,
    deadline: Instant,
}

impl Worker {
    async fn run(mut self) -> Result<Tally> {
        let mut tally = Tally::new(
            self.config
                .interval
                .map(|width| Intervals::new(width, self.config.duration)),
        )?;
        let path = self
            .config
            .url
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/".into());
        let host = HeaderValue::try_from(
            self.config
                .url
                .authority()
                .map(|a| a.as_str())
                .unwrap_or("localhost"),
        )?;
        loop {
            let n = self.shared.issued.fetch_add(1, Ordering::Relaxed);
            let t0 = Instant::now();
            if n >= self.config.requests || t0 >= self.deadline {
                break;
            }
            if self.sender.is_closed() {
                match connect(self.addr, self.config.http2, &self.shared).await {
                    Ok(s) => self.sender = s,
                    Err(e) => {
                        *tally.errors.entry(format!("connect: {e}")).or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                }
            }
            let uri: Uri = if self.config.http2 {
                self.config.url.clone()
            } else {
                path.parse()?
            };
            let mut req = Request::post(uri).body(Full::new(self.config.body.clone()))?;
            let h = req.headers_mut();
            if !self.config.http2 {
                h.insert(http::header::HOST, host.clone());
            }
            h.insert(
                http::header::AUTHORIZATION,
                self.auth[(n % self.auth.len() as u64) as usize].clone(),
            );
            h.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            let t0 = Instant::now();
            let outcome = match tokio::time::timeout(self.config.timeout, self.one(req, t0)).await {
                Ok(o) => o,
                Err(_) => Outcome::Failed("timeout".into()),
            };
            match outcome {
                Outcome::Ok { latency, ttfb } => {
                    tally.ok += 1;
                    if let Some(intervals) = &mut tally.intervals {
                        let ended = t0 + latency;
                        if ended >= self.measure_from && ended < self.deadline {
                            intervals.add(ended - self.measure_from);
                        }
                    }
                    if t0 >= self.measure_from {
                        tally.measured_ok += 1;
                        let _ = tally.latency.record(latency.as_micros().max(1) as u64);
                        let _ = tally.ttfb.record(ttfb.as_micros().max(1) as u64);
                    }
                }
                Outcome::Failed(kind) => {
                    *tally.errors.entry(kind).or_default() += 1;
                }
            }
        }
        Ok(tally)
    }

    async fn one(&mut self, req: Request<Full<Bytes>>, t0: Instant) -> Outcome {
        let resp = match self.sender.send(req).await {
            Ok(r) => r,
            Err(e) => return Outcome::Failed(format!("transport: {e}")),
        };
        let status = resp.status();
        let mut body = resp.into_body();
        let mut ttfb = None;
        let mut tail: Vec<u8> = Vec::new();
        let mut read = 0u64;
        while let Some(frame) = body.frame().await {
            let frame = match frame {
                Ok(f) => f,
                Err(e) => return Outcome::Failed(format!("body: {e}")),
            };
            if let Ok(data) = frame.into_data() {
                if ttfb.is_none() {
                    ttfb = Some(t0.elapsed());
                }
                read += data.len() as u64;
                if self.config.stream {
                    // Keep the last few bytes to check the terminal event.
                    tail.extend_from_slice(&data[data.len().saturating_sub(32)..]);
                    if tail.len() > 64 {
                        tail.drain(..tail.len() - 32);
                    }
                }
            }
        }
        let latency = t0.elapsed();
        self.shared.bytes_read.fetch_add(read, Ordering::Relaxed);
        if !status.is_success() {
            return Outcome::Failed(format!("status {}", status.as_u16()));
        }
        if self.config.stream && !contains(&tail, b"[DONE]") {
            return Outcome::Failed("stream ended without [DONE]".into());
        }
        Outcome::Ok {
            latency,
            ttfb: ttfb.unwrap_or(latency),
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use intercept_test::{MockConfig, MockUpstream};

    async fn against_mock(stream: bool, http2: bool) -> LoadReport {
        let upstream = MockUpstream::start_with(MockConfig {
            chunks: 16,
            ..MockConfig::fast()
        })
        .await
        .expect("mock");
        let config = LoadConfig {
            connections: 2,
            per_connection: 3,
            http2,
            requests: 40,
            ..LoadConfig::new(
                upstream.chat_completions_url().parse().expect("url"),
                vec!["a".into(), "b".into()],
                crate::bodies::chat_request(stream, 2048).into(),
            )
        };
        let report = run(&config).await.expect("run");
        assert_eq!(upstream.request_count() as u64, report.ok + report.errors);
        upstream.shutdown().await;
        report
    }

    #[test]
    fn intervals_count_completions_by_second_and_drop_the_rest() {
        let mut iv = Intervals::new(Duration::from_secs(1), Duration::from_millis(3500));
        assert_eq!(iv.ok, vec![0, 0, 0, 0]);
        for ms in [0, 999, 1000, 2500, 3499, 3500, 9000] {
            iv.add(Duration::from_millis(ms));
        }
        // 3500 ms and later are past the window (4 intervals: the last covers 3.0–3.5 s).
        assert_eq!(iv.ok, vec![2, 1, 1, 1]);
        let mut other = Intervals::new(Duration::from_secs(1), Duration::from_millis(3500));
        other.add(Duration::from_millis(1500));
        iv.merge(&other);
        assert_eq!(iv.ok, vec![2, 2, 1, 1]);
        let mut none = Intervals::new(Duration::ZERO, Duration::from_secs(3));
        none.add(Duration::from_secs(1));
        assert!(none.ok.is_empty());
        assert_eq!(none.window_rps(1.0, false), None);
    }

    #[test]
    fn window_rates_use_whole_intervals_at_either_end() {
        let iv = Intervals {
            width_s: 0.5,
            window_s: 3.0,
            ok: vec![100, 200, 300, 400, 500, 600],
        };
        // First second: 100 + 200 requests in 1 s; last second: 500 + 600.
        assert_eq!(iv.window_rps(1.0, false), Some(300.0));
        assert_eq!(iv.window_rps(1.0, true), Some(1100.0));
        // A window shorter than one interval is one interval.
        assert_eq!(iv.window_rps(0.1, true), Some(1200.0));
        assert_eq!(iv.window_rps(3.0, false), Some(700.0));
        assert_eq!(iv.window_rps(3.5, false), None);
        // A window of 2.75 s: the last interval lasts 0.25 s.
        let cut = Intervals {
            window_s: 2.75,
            ..iv.clone()
        };
        assert_eq!(cut.window_rps(1.0, true), Some(1100.0 / 0.75));
        assert_eq!(cut.window_rps(1.0, false), Some(300.0));
        assert_eq!(cut.window(1.0, true), Some((1100, 0.75)));
        assert_eq!(cut.window(3.5, true), None);
    }

    #[tokio::test]
    async fn intervals_add_up_to_the_measured_completions() {
        let upstream = MockUpstream::start_with(MockConfig::fast())
            .await
            .expect("mock");
        let body: Bytes = crate::bodies::chat_request(false, 2048).into();
        let config = LoadConfig {
            connections: 2,
            requests: 1_000_000,
            duration: Duration::from_millis(600),
            interval: Some(Duration::from_millis(200)),
            ..LoadConfig::new(
                upstream.chat_completions_url().parse().expect("url"),
                vec!["a".into()],
                body.clone(),
            )
        };
        let report = run(&config).await.expect("run");
        upstream.shutdown().await;
        assert_eq!(report.errors, 0, "{report:?}");
        assert_eq!(report.request_body_bytes, body.len() as u64);
        let iv = report.intervals.clone().expect("intervals");
        assert_eq!(iv.ok.len(), 3);
        let counted: u64 = iv.ok.iter().sum();
        // Every request ended inside the window but those in flight at its end (one per
        // connection at most).
        assert!(
            counted <= report.ok && counted + 2 >= report.ok,
            "{iv:?} {report:?}"
        );
        assert!(iv.ok.iter().all(|&n| n > 0), "{iv:?}");
    }

    #[tokio::test]
    async fn counts_every_request_once() {
        for (stream, http2) in [(false, false), (true, false), (true, true)] {
            let r = against_mock(stream, http2).await;
            assert_eq!(r.ok, 40, "{r:?}");
            assert_eq!(r.errors, 0, "{r:?}");
            assert_eq!(r.latency_us.count, 40);
            assert!(r.ttfb_us.p50 <= r.latency_us.p50);
            assert_eq!(r.connections_opened, 2);
        }
    }
}
