//! A very cheap slow-stream upstream for the 10k-streams rig (`slow-upstream`): raw
//! tokio, a hand-written HTTP/1.1 server (see [`crate::http1`]) and ONE shared ticker.
//!
//! `POST …/chat/completions` with `"stream": true` is answered with a
//! `text/event-stream` in `Transfer-Encoding: chunked`: the response head and the role
//! chunk at once, then one content chunk per tick, `chunks` of them; the last tick also
//! writes the finish chunk, the usage chunk (when the request set
//! `stream_options.include_usage`, as intercept always does) and `data: [DONE]`, and
//! ends the body. The events have the shape `intercept-test`'s `MockUpstream` emits
//! (`chat.completion.chunk` objects), so intercept's chat stream assembly accepts them.
//! Without `"stream": true` the reply is the equivalent `chat.completion` JSON. Other
//! routes get 404. Connections are kept alive unless the client asks otherwise.
//!
//! Every byte a stream sends is rendered once per model name ([`Rendered`]); the ticker
//! holds every live stream's socket and, at each tick, writes the next chunk to each with
//! one non-blocking `write` (no timer or task wakeup per stream). A write the socket
//! cannot take whole (the reader is behind) is kept and retried at the next tick
//! (`stalled_writes` counts these); what is left when a stream ends is written by its
//! connection task. The ticker reports how late its ticks were and how long a tick's
//! writes took, so a run can tell whether the upstream kept its schedule.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, Result};
use bytes::{Buf as _, Bytes, BytesMut};
use serde::Deserialize;
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

use crate::http1::{self, Framing};

/// The text of every content chunk (about one token).
pub const CONTENT_PIECE: &str = "tok ";
/// Prompt tokens reported in every usage.
pub const PROMPT_TOKENS: u64 = 64;
/// Largest request head read.
const MAX_HEAD: usize = 64 << 10;
/// Models whose rendering is kept (more distinct names are rendered per request).
const MAX_CACHED_MODELS: usize = 64;

/// How streams are paced.
#[derive(Debug, Clone, Copy)]
pub struct SlowConfig {
    /// Content chunks per stream (at least 1).
    pub chunks: usize,
    /// Time between two ticks.
    pub interval: Duration,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
}

impl Default for SlowConfig {
    /// 200 chunks 50 ms apart (10 s per stream), 64 MiB bodies.
    fn default() -> Self {
        SlowConfig {
            chunks: 200,
            interval: Duration::from_millis(50),
            max_body_bytes: 64 << 20,
        }
    }
}

/// Every byte of one model's replies, rendered once.
#[derive(Debug, Clone)]
pub struct Rendered {
    /// Response head and the first HTTP chunk (the role event), written at once.
    pub head: Bytes,
    /// One content event as one HTTP chunk, written at each tick but the last.
    pub content: Bytes,
    /// The last content event, the finish event, the usage event, `data: [DONE]` and the
    /// end of the body.
    pub last_with_usage: Bytes,
    /// The same without the usage event.
    pub last_without_usage: Bytes,
    /// The non-streamed reply (head and body).
    pub json: Bytes,
}

const ID: &str = "chatcmpl-slow";
const CREATED: u64 = 1_700_000_000;

/// Renders every reply for `model` with `chunks` content chunks, in the mock upstream's
/// own shape ([`intercept_test::render_chat`]).
pub fn render(model: &str, chunks: usize) -> Rendered {
    let chunks = chunks.max(1);
    let usage = intercept_test::Usage::new(PROMPT_TOKENS, chunks as u64);
    // One piece streamed: role, content, finish, usage, [DONE]; the content event is
    // written at every tick.
    let (_, events) = intercept_test::render_chat(model, CONTENT_PIECE, usage, ID, CREATED);
    let [role, content, finish, usage_event, done] = &events[..] else {
        unreachable!("a one-piece answer streams as five events")
    };
    let (json_body, _) =
        intercept_test::render_chat(model, &CONTENT_PIECE.repeat(chunks), usage, ID, CREATED);

    let mut head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    http1::encode_chunk(&mut head, role);
    let mut content_chunk = Vec::new();
    http1::encode_chunk(&mut content_chunk, content);
    let last = |with_usage: bool| {
        let mut events = [&content[..], &finish[..]].concat();
        if with_usage {
            events.extend_from_slice(usage_event);
        }
        events.extend_from_slice(done);
        let mut out = Vec::new();
        http1::encode_chunk(&mut out, &events);
        out.extend_from_slice(http1::LAST_CHUNK);
        Bytes::from(out)
    };
    Rendered {
        head: head.into(),
        content: content_chunk.into(),
        last_with_usage: last(true),
        last_without_usage: last(false),
        json: response(200, "OK", &json_body),
    }
}

fn response(status: u16, reason: &str, body: &[u8]) -> Bytes {
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out.into()
}

fn error_response(status: u16, reason: &str, message: &str) -> Bytes {
    let body = json!({"error": {"message": message, "type": "invalid_request_error"}});
    response(status, reason, body.to_string().as_bytes())
}

/// Counters of a [`SlowUpstream`]. The `*_max_us` figures are the largest since the
/// last [`SlowStats::snapshot`].
#[derive(Debug, Default)]
pub struct SlowStats {
    requests: AtomicU64,
    bad_requests: AtomicU64,
    connections: AtomicU64,
    closed_connections: AtomicU64,
    streams_started: AtomicU64,
    streams_completed: AtomicU64,
    streams_failed: AtomicU64,
    stalled_writes: AtomicU64,
    ticks: AtomicU64,
    tick_late_max_us: AtomicU64,
    tick_busy_max_us: AtomicU64,
    tick_busy_total_us: AtomicU64,
}

impl SlowStats {
    /// Requests read (streamed or not, errors included).
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Connections accepted.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Streams that wrote their last byte.
    pub fn streams_completed(&self) -> u64 {
        self.streams_completed.load(Ordering::Relaxed)
    }

    /// All counters as JSON; resets the `*_max_us` maxima.
    pub fn snapshot(&self) -> serde_json::Value {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let started = get(&self.streams_started);
        let completed = get(&self.streams_completed);
        let failed = get(&self.streams_failed);
        json!({
            "requests": get(&self.requests),
            "bad_requests": get(&self.bad_requests),
            "connections": get(&self.connections),
            "open_connections": get(&self.connections).saturating_sub(get(&self.closed_connections)),
            "streams_started": started,
            "streams_completed": completed,
            "streams_failed": failed,
            "live_streams": started.saturating_sub(completed + failed),
            "stalled_writes": get(&self.stalled_writes),
            "ticks": get(&self.ticks),
            "tick_late_max_us": self.tick_late_max_us.swap(0, Ordering::Relaxed),
            "tick_busy_max_us": self.tick_busy_max_us.swap(0, Ordering::Relaxed),
            "tick_busy_total_us": get(&self.tick_busy_total_us),
        })
    }
}

/// A stream the ticker feeds.
struct Live {
    stream: TcpStream,
    rendered: Arc<Rendered>,
    usage: bool,
    sent: usize,
    pending: Vec<u8>,
    back: oneshot::Sender<Handback>,
}

/// A finished stream's socket, back to its connection task with what is left to write.
struct Handback {
    stream: TcpStream,
    pending: Vec<u8>,
}

enum Step {
    More,
    Done,
    Failed,
}

impl Live {
    /// Writes the next chunk (after anything still pending).
    fn advance(&mut self, chunks: usize, stats: &SlowStats) -> Step {
        self.sent += 1;
        let last = self.sent >= chunks;
        let r = &self.rendered;
        let next: &[u8] = match (last, self.usage) {
            (false, _) => &r.content,
            (true, true) => &r.last_with_usage,
            (true, false) => &r.last_without_usage,
        };
        let result = if self.pending.is_empty() {
            match self.stream.try_write(next) {
                Ok(n) if n == next.len() => Ok(()),
                Ok(n) => {
                    self.pending.extend_from_slice(&next[n..]);
                    Err(None)
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    self.pending.extend_from_slice(next);
                    Err(None)
                }
                Err(e) => Err(Some(e)),
            }
        } else {
            self.pending.extend_from_slice(next);
            match self.stream.try_write(&self.pending) {
                Ok(n) => {
                    self.pending.drain(..n);
                    if self.pending.is_empty() {
                        Ok(())
                    } else {
                        Err(None)
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Err(None),
                Err(e) => Err(Some(e)),
            }
        };
        match result {
            Err(Some(_)) => return Step::Failed,
            Err(None) => {
                stats.stalled_writes.fetch_add(1, Ordering::Relaxed);
            }
            Ok(()) => {}
        }
        if last {
            Step::Done
        } else {
            Step::More
        }
    }
}

/// The slow upstream, serving until [`SlowUpstream::shutdown`] or drop.
#[derive(Debug)]
pub struct SlowUpstream {
    addr: SocketAddr,
    stats: Arc<SlowStats>,
    tasks: JoinSet<()>,
}

/// A listener on `addr` with a deep accept queue (the kernel caps `backlog` at
/// `net.core.somaxconn`): thousands of streams connect at once.
pub fn listen(addr: SocketAddr, backlog: u32) -> Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket
        .bind(addr)
        .with_context(|| format!("cannot listen on {addr}"))?;
    Ok(socket.listen(backlog)?)
}

impl SlowUpstream {
    /// Serves on `listener` (the accept loop and the ticker are spawned on the current
    /// runtime).
    pub fn start(listener: TcpListener, config: SlowConfig) -> Result<SlowUpstream> {
        let addr = listener.local_addr()?;
        let stats = Arc::new(SlowStats::default());
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            config: SlowConfig {
                chunks: config.chunks.max(1),
                ..config
            },
            stats: stats.clone(),
            ticker: tx,
            models: Mutex::new(HashMap::new()),
        });
        let mut tasks = JoinSet::new();
        tasks.spawn(ticker(rx, shared.config, stats.clone()));
        tasks.spawn(accept_loop(listener, shared));
        Ok(SlowUpstream { addr, stats, tasks })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The OpenAI base URL (`http://ADDR/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Its counters.
    pub fn stats(&self) -> &Arc<SlowStats> {
        &self.stats
    }

    /// Stops accepting and drops every connection.
    pub async fn shutdown(mut self) {
        self.tasks.shutdown().await;
    }
}

#[derive(Debug)]
struct Shared {
    config: SlowConfig,
    stats: Arc<SlowStats>,
    ticker: mpsc::UnboundedSender<Live>,
    models: Mutex<HashMap<String, Arc<Rendered>>>,
}

impl Shared {
    fn rendered(&self, model: &str) -> Arc<Rendered> {
        let mut models = self.models.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = models.get(model) {
            return r.clone();
        }
        let r = Arc::new(render(model, self.config.chunks));
        if models.len() < MAX_CACHED_MODELS {
            models.insert(model.to_owned(), r.clone());
        }
        r
    }
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").field("sent", &self.sent).finish()
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    // The connection tasks are owned here: dropping this future aborts them all.
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    shared.stats.connections.fetch_add(1, Ordering::Relaxed);
                    conns.spawn(connection(stream, shared.clone()));
                }
                // Out of descriptors and the like: wait a little rather than spin.
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

/// The ticker: at each tick, the next chunk to every live stream.
async fn ticker(mut rx: mpsc::UnboundedReceiver<Live>, config: SlowConfig, stats: Arc<SlowStats>) {
    let mut interval = tokio::time::interval(config.interval);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut live: Vec<Live> = Vec::new();
    loop {
        let scheduled = interval.tick().await;
        let start = Instant::now();
        loop {
            match rx.try_recv() {
                Ok(l) => live.push(l),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) if live.is_empty() => return,
                Err(mpsc::error::TryRecvError::Disconnected) => break,
            }
        }
        let mut i = 0;
        while i < live.len() {
            match live[i].advance(config.chunks, &stats) {
                Step::More => i += 1,
                Step::Done => {
                    let l = live.swap_remove(i);
                    stats.streams_completed.fetch_add(1, Ordering::Relaxed);
                    let _ = l.back.send(Handback {
                        stream: l.stream,
                        pending: l.pending,
                    });
                }
                Step::Failed => {
                    // Dropping the socket (and the sender) ends the connection task.
                    live.swap_remove(i);
                    stats.streams_failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let us = |d: Duration| d.as_micros().min(u128::from(u64::MAX)) as u64;
        let busy = us(start.elapsed());
        stats.ticks.fetch_add(1, Ordering::Relaxed);
        stats.tick_late_max_us.fetch_max(
            us(start.saturating_duration_since(scheduled)),
            Ordering::Relaxed,
        );
        stats.tick_busy_max_us.fetch_max(busy, Ordering::Relaxed);
        stats.tick_busy_total_us.fetch_add(busy, Ordering::Relaxed);
    }
}

/// What a request asks for.
#[derive(Deserialize)]
struct ChatRequest<'a> {
    #[serde(default, borrow)]
    model: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// A request read off a connection.
struct Request {
    head: http1::RequestHead,
    body: Bytes,
}

enum ReadError {
    /// The client closed the connection between requests.
    Closed,
    /// Answer this and close.
    Reply(Bytes),
}

async fn read_request(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    max_body: usize,
) -> Result<Request, ReadError> {
    let head = loop {
        match http1::parse_request(buf) {
            Ok(Some(head)) => break head,
            Ok(None) if buf.len() > MAX_HEAD => {
                return Err(ReadError::Reply(error_response(
                    431,
                    "Request Header Fields Too Large",
                    "request head too large",
                )))
            }
            Ok(None) => {}
            Err(e) => {
                return Err(ReadError::Reply(error_response(
                    400,
                    "Bad Request",
                    &e.to_string(),
                )))
            }
        }
        match stream.read_buf(buf).await {
            Ok(0) | Err(_) => return Err(ReadError::Closed),
            Ok(_) => {}
        }
    };
    let too_large = || {
        ReadError::Reply(error_response(
            413,
            "Payload Too Large",
            "request body too large",
        ))
    };
    buf.advance(head.head_len);
    let body = match head.framing {
        Framing::Length(n) => {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            if n > max_body {
                return Err(too_large());
            }
            while buf.len() < n {
                buf.reserve(n - buf.len());
                match stream.read_buf(buf).await {
                    Ok(0) | Err(_) => return Err(ReadError::Closed),
                    Ok(_) => {}
                }
            }
            buf.split_to(n).freeze()
        }
        Framing::Chunked => {
            let mut decoder = http1::ChunkedDecoder::new();
            let mut body = Vec::new();
            loop {
                let consumed = decoder
                    .decode(buf, |d| body.extend_from_slice(d))
                    .map_err(|e| {
                        ReadError::Reply(error_response(400, "Bad Request", &e.to_string()))
                    })?;
                buf.advance(consumed);
                if decoder.is_done() {
                    break;
                }
                if body.len() > max_body {
                    return Err(too_large());
                }
                match stream.read_buf(buf).await {
                    Ok(0) | Err(_) => return Err(ReadError::Closed),
                    Ok(_) => {}
                }
            }
            Bytes::from(body)
        }
        // Requests are never close-delimited.
        Framing::Close => Bytes::new(),
    };
    Ok(Request { head, body })
}

async fn connection(stream: TcpStream, shared: Arc<Shared>) {
    serve(stream, &shared).await;
    shared
        .stats
        .closed_connections
        .fetch_add(1, Ordering::Relaxed);
}

/// Answers requests on one connection until it closes.
async fn serve(mut stream: TcpStream, shared: &Shared) {
    let mut buf = BytesMut::with_capacity(8 << 10);
    loop {
        let req = match read_request(&mut stream, &mut buf, shared.config.max_body_bytes).await {
            Ok(req) => req,
            Err(ReadError::Closed) => break,
            Err(ReadError::Reply(reply)) => {
                shared.stats.bad_requests.fetch_add(1, Ordering::Relaxed);
                let _ = stream.write_all(&reply).await;
                break;
            }
        };
        shared.stats.requests.fetch_add(1, Ordering::Relaxed);
        let path = req.head.path.split('?').next().unwrap_or_default();
        if req.head.method != "POST" || !path.ends_with("/chat/completions") {
            shared.stats.bad_requests.fetch_add(1, Ordering::Relaxed);
            let reply = error_response(404, "Not Found", "only POST …/chat/completions is served");
            if stream.write_all(&reply).await.is_err() {
                break;
            }
        } else {
            let parsed = match serde_json::from_slice::<ChatRequest<'_>>(&req.body) {
                Ok(p) => p,
                Err(e) => {
                    shared.stats.bad_requests.fetch_add(1, Ordering::Relaxed);
                    let reply =
                        error_response(400, "Bad Request", &format!("not a chat request: {e}"));
                    let _ = stream.write_all(&reply).await;
                    break;
                }
            };
            let rendered = shared.rendered(parsed.model.as_deref().unwrap_or("slow-model"));
            if parsed.stream != Some(true) {
                if stream.write_all(&rendered.json).await.is_err() {
                    break;
                }
            } else {
                if stream.write_all(&rendered.head).await.is_err() {
                    break;
                }
                shared.stats.streams_started.fetch_add(1, Ordering::Relaxed);
                let (back, handback) = oneshot::channel();
                let live = Live {
                    stream,
                    rendered,
                    usage: parsed
                        .stream_options
                        .and_then(|o| o.include_usage)
                        .unwrap_or(false),
                    sent: 0,
                    pending: Vec::new(),
                    back,
                };
                if shared.ticker.send(live).is_err() {
                    return;
                }
                // The ticker drops the socket if the stream fails.
                let Ok(Handback { stream: s, pending }) = handback.await else {
                    return;
                };
                stream = s;
                if !pending.is_empty() && stream.write_all(&pending).await.is_err() {
                    break;
                }
            }
        }
        if req.head.close {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http1::{ChunkedDecoder, Finder};

    /// The data of a chunked body, and whether it ended.
    fn dechunk(body: &[u8]) -> (Vec<u8>, bool) {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        d.decode(body, |b| out.extend_from_slice(b))
            .expect("valid chunked body");
        (out, d.is_done())
    }

    fn events(sse: &[u8]) -> Vec<serde_json::Value> {
        std::str::from_utf8(sse)
            .expect("utf-8")
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let data = e.strip_prefix("data: ").expect("data line");
                if data == "[DONE]" {
                    json!("[DONE]")
                } else {
                    serde_json::from_str(data).expect("JSON event")
                }
            })
            .collect()
    }

    #[test]
    fn rendered_stream_is_a_complete_chat_stream() {
        let r = render("policy \"q\"", 3);
        let head_end = http1::parse_response(&r.head)
            .expect("valid")
            .expect("complete");
        assert_eq!((head_end.status, head_end.framing), (200, Framing::Chunked));
        let body = [
            &r.head[head_end.head_len..],
            &r.content,
            &r.content,
            &r.last_with_usage,
        ]
        .concat();
        let (data, done) = dechunk(&body);
        assert!(done);
        let ev = events(&data);
        // role, 3 content, finish, usage, [DONE]
        assert_eq!(ev.len(), 7, "{ev:?}");
        assert_eq!(ev[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(ev[0]["model"], "policy \"q\"");
        let text: String = ev[1..4]
            .iter()
            .map(|e| {
                e["choices"][0]["delta"]["content"]
                    .as_str()
                    .expect("content")
            })
            .collect();
        assert_eq!(text, CONTENT_PIECE.repeat(3));
        assert_eq!(ev[4]["choices"][0]["finish_reason"], "stop");
        assert_eq!(ev[5]["choices"], json!([]));
        assert_eq!(ev[5]["usage"]["completion_tokens"], 3);
        assert_eq!(ev[5]["object"], "chat.completion.chunk");
        assert_eq!(ev[6], "[DONE]");

        let (data, done) = dechunk(&r.last_without_usage);
        assert!(done);
        let ev = events(&data);
        assert_eq!(ev.len(), 3);
        assert!(ev.iter().all(|e| e.get("usage").is_none()));
    }

    #[test]
    fn rendered_json_reply_has_the_streamed_text() {
        let r = render("m", 5);
        let head = http1::parse_response(&r.json)
            .expect("valid")
            .expect("complete");
        assert_eq!(
            head.framing,
            Framing::Length((r.json.len() - head.head_len) as u64)
        );
        let v: serde_json::Value = serde_json::from_slice(&r.json[head.head_len..]).expect("JSON");
        assert_eq!(
            v["choices"][0]["message"]["content"],
            CONTENT_PIECE.repeat(5)
        );
        assert_eq!(v["usage"]["total_tokens"], PROMPT_TOKENS + 5);
    }

    async fn request(stream: &mut TcpStream, body: &str) -> (http1::ResponseHead, Vec<u8>) {
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(req.as_bytes()).await.expect("write");
        let mut buf = BytesMut::new();
        let head = loop {
            if let Some(h) = http1::parse_response(&buf).expect("valid head") {
                break h;
            }
            assert!(stream.read_buf(&mut buf).await.expect("read") > 0, "closed");
        };
        buf.advance(head.head_len);
        let mut data = Vec::new();
        match head.framing {
            Framing::Chunked => {
                let mut d = ChunkedDecoder::new();
                loop {
                    let n = d
                        .decode(&buf, |b| data.extend_from_slice(b))
                        .expect("chunked");
                    assert_eq!(n, buf.len(), "bytes after the body");
                    buf.clear();
                    if d.is_done() {
                        break;
                    }
                    assert!(stream.read_buf(&mut buf).await.expect("read") > 0, "closed");
                }
            }
            Framing::Length(n) => {
                while (buf.len() as u64) < n {
                    assert!(stream.read_buf(&mut buf).await.expect("read") > 0);
                }
                data = buf.to_vec();
            }
            Framing::Close => panic!("close-delimited"),
        }
        (head, data)
    }

    #[tokio::test]
    async fn streams_are_paced_by_the_ticker_and_connections_kept() {
        let listener = listen("127.0.0.1:0".parse().expect("addr"), 128).expect("listen");
        let up = SlowUpstream::start(
            listener,
            SlowConfig {
                chunks: 4,
                interval: Duration::from_millis(20),
                ..SlowConfig::default()
            },
        )
        .expect("start");
        let mut conns = Vec::new();
        for _ in 0..3 {
            conns.push(TcpStream::connect(up.addr()).await.expect("connect"));
        }
        let body =
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#;
        // Two requests on each connection, the three connections concurrently.
        let results = futures_util::future::join_all(conns.iter_mut().map(|c| async move {
            let mut out = Vec::new();
            for _ in 0..2 {
                let t = std::time::Instant::now();
                let (head, data) = request(c, body).await;
                out.push((head.status, data, t.elapsed()));
            }
            out
        }))
        .await;
        for (status, data, took) in results.into_iter().flatten() {
            assert_eq!(status, 200);
            let mut f = Finder::new(b"data: [DONE]");
            f.push(&data);
            assert!(f.found());
            assert_eq!(events(&data).len(), 4 + 4);
            // 4 ticks 20 ms apart; the first one comes within one interval.
            assert!(took >= Duration::from_millis(55), "{took:?}");
            assert!(took < Duration::from_secs(2), "{took:?}");
        }
        // A JSON request and an unknown route on a fresh connection.
        let mut c = TcpStream::connect(up.addr()).await.expect("connect");
        let (head, data) = request(&mut c, r#"{"model":"m","messages":[]}"#).await;
        assert_eq!(head.status, 200);
        let v: serde_json::Value = serde_json::from_slice(&data).expect("JSON");
        assert_eq!(v["object"], "chat.completion");
        let stats = up.stats().snapshot();
        assert_eq!(stats["requests"], 7);
        assert_eq!(stats["connections"], 4);
        assert_eq!(stats["streams_started"], 6);
        assert_eq!(stats["streams_completed"], 6);
        assert_eq!(stats["streams_failed"], 0);
        c.write_all(b"GET /other HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        let mut buf = BytesMut::new();
        let head = loop {
            if let Some(h) = http1::parse_response(&buf).expect("valid head") {
                break h;
            }
            assert!(c.read_buf(&mut buf).await.expect("read") > 0);
        };
        assert_eq!(head.status, 404);
        up.shutdown().await;
    }

    #[tokio::test]
    async fn a_client_that_leaves_mid_stream_frees_its_stream() {
        let listener = listen("127.0.0.1:0".parse().expect("addr"), 128).expect("listen");
        let up = SlowUpstream::start(
            listener,
            SlowConfig {
                chunks: 1000,
                interval: Duration::from_millis(5),
                ..SlowConfig::default()
            },
        )
        .expect("start");
        let mut c = TcpStream::connect(up.addr()).await.expect("connect");
        let body = r#"{"model":"m","stream":true}"#;
        let req = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        c.write_all(req.as_bytes()).await.expect("write");
        let mut buf = BytesMut::new();
        while http1::parse_response(&buf).expect("valid").is_none() {
            assert!(c.read_buf(&mut buf).await.expect("read") > 0);
        }
        drop(c);
        // The ticker finds out at its next writes; wait for it (bounded).
        let deadline = Instant::now() + Duration::from_secs(5);
        let stats = loop {
            let s = up.stats().snapshot();
            if s["open_connections"] == 0 || Instant::now() > deadline {
                break s;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert_eq!(stats["streams_failed"], 1, "{stats}");
        assert_eq!(stats["streams_completed"], 0, "{stats}");
        assert_eq!(stats["live_streams"], 0, "{stats}");
        assert_eq!(stats["open_connections"], 0, "{stats}");
        up.shutdown().await;
    }
}
