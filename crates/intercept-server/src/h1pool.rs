//! Plain-HTTP/1.1 upstream connections read by the call that uses them.
//!
//! A pooled client that runs each connection in a task of its own hands a streamed
//! response over one body frame at a time, through a channel: every SSE event of the
//! upstream costs a wake of the call's task, a wake of the connection's task and a poll
//! of each. Here the call writes its request and reads the answer itself: the response
//! head is parsed with `httparse`, and the body is decoded (`content-length`, chunked,
//! or up to the close) straight out of the connection's read buffer, each frame a slice
//! of that buffer. Between calls, a connection rests in the pool unpolled; on checkout
//! a non-blocking read of one byte notices a connection the upstream closed meanwhile.
//!
//! The request is written while the connection is read: an upstream that answers
//! before it has taken the whole body (and then stops reading) cannot wedge the call,
//! and the rest of the body goes out while the answer is read. A write that makes no
//! progress for the write idle timeout fails the call; so does a read that gets nothing
//! for the read idle timeout, when one is set. Every buffer the decoder keeps is bounded
//! (head, chunk-size lines, extensions, trailers, interim answers).
//!
//! The connection is any `AsyncRead + AsyncWrite` a [`Dial`] opens: TCP in the server,
//! an in-memory pipe in tests.
//!
//! Only `http://` upstreams go through here (the RL case: engines on the same host or
//! network); `https://` ones use the general pooled client, with TLS and HTTP/2.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io::{self, IoSlice, Write as _};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf as _, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::http_body::SliceBody;

/// Idle connections older than this are closed rather than reused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Most response headers accepted.
const MAX_HEADERS: usize = 128;
/// Most interim (`1xx`) answers accepted before the final one.
const MAX_INTERIM: usize = 32;
/// Longest chunk-size line accepted.
const MAX_LINE: usize = 8 * 1024;
/// Most bytes of chunk extensions accepted over one body (hyper's limit).
const MAX_EXTENSIONS: u64 = 16 * 1024;
/// Largest trailer section accepted (hyper's limit).
const MAX_TRAILERS: u64 = 16 * 1024;
/// Room made in the read buffer before a read, and the most made for a long body.
const READ_MIN: usize = 8 * 1024;
const READ_MAX: usize = 64 * 1024;
/// Most buffers handed to one vectored write.
const MAX_IOV: usize = 16;

/// How a pool opens its connections.
pub(crate) trait Dial: Send + Sync + 'static {
    /// A connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// Opens a connection to `key` (`host:port`).
    fn dial(&self, key: &str) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

/// TCP connections, with `TCP_NODELAY`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Tcp;

impl Dial for Tcp {
    type Io = TcpStream;

    async fn dial(&self, key: &str) -> io::Result<TcpStream> {
        let io = TcpStream::connect(key).await?;
        let _ = io.set_nodelay(true);
        Ok(io)
    }
}

/// Per-read and per-write idle timeouts of upstream connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Timeouts {
    /// While the request is written, the upstream must take some of it this often.
    pub(crate) write_idle: Option<Duration>,
    /// Once the request is written, the upstream must send something this often.
    pub(crate) read_idle: Option<Duration>,
}

/// A connection and the bytes read from it but not yet used.
struct Conn<Io> {
    io: Io,
    buf: BytesMut,
}

/// One idle connection.
struct Idle<Io> {
    conn: Conn<Io>,
    since: Instant,
}

/// Why a request got no response.
#[derive(Debug)]
pub(crate) enum H1Error {
    /// No connection could be made (the request never left).
    Connect(io::Error),
    /// Connecting took longer than the connect timeout.
    ConnectTimeout,
    /// The exchange failed: the connection broke or went idle past a timeout, or the
    /// answer is not HTTP/1.x.
    Exchange(io::Error),
}

/// Idle connections by `host:port`.
type IdleByHost<Io> = HashMap<String, VecDeque<Idle<Io>>, foldhash::fast::RandomState>;

/// The pool: idle connections per `host:port`, oldest first; the newest is taken first.
pub(crate) struct H1Pool<D: Dial = Tcp> {
    dial: D,
    /// Keyed by upstream hosts (the sessions' configuration, not the harnesses'), so a
    /// fast hash with a per-process seed: it is hashed at every checkout and return.
    idle: Mutex<IdleByHost<D::Io>>,
    max_idle_per_host: usize,
    idle_timeout: Duration,
    connect_timeout: Duration,
    timeouts: Timeouts,
}

impl<D: Dial> std::fmt::Debug for H1Pool<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H1Pool")
            .field("max_idle_per_host", &self.max_idle_per_host)
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

impl H1Pool<Tcp> {
    /// A pool of TCP connections.
    pub(crate) fn new(
        max_idle_per_host: usize,
        connect_timeout: Duration,
        timeouts: Timeouts,
    ) -> Arc<Self> {
        H1Pool::with_dial(Tcp, max_idle_per_host, connect_timeout, timeouts)
    }
}

impl<D: Dial> H1Pool<D> {
    /// A pool of the connections `dial` opens.
    pub(crate) fn with_dial(
        dial: D,
        max_idle_per_host: usize,
        connect_timeout: Duration,
        timeouts: Timeouts,
    ) -> Arc<Self> {
        Arc::new(H1Pool {
            dial,
            idle: Mutex::new(HashMap::default()),
            max_idle_per_host,
            idle_timeout: IDLE_TIMEOUT,
            connect_timeout,
            timeouts,
        })
    }

    /// A live idle connection to `key`, if the pool has one.
    fn checkout(&self, key: &str) -> Option<Conn<D::Io>> {
        loop {
            let mut idle = {
                let mut map = self.idle.lock();
                map.get_mut(key)?.pop_back()?
            };
            if idle.since.elapsed() > self.idle_timeout {
                continue;
            }
            // Nothing may be readable on a resting connection: a close, a reset or
            // stray bytes all retire it.
            if resting(&mut idle.conn.io) {
                return Some(idle.conn);
            }
        }
    }

    fn checkin(&self, key: String, conn: Conn<D::Io>) {
        if self.max_idle_per_host == 0 || !conn.buf.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut map = self.idle.lock();
        let list = map.entry(key).or_default();
        // Connections that rested too long are closed here, not left to wait for a
        // checkout that may never reach them.
        while list
            .front()
            .is_some_and(|idle| now.duration_since(idle.since) > self.idle_timeout)
        {
            list.pop_front();
        }
        if list.len() < self.max_idle_per_host {
            list.push_back(Idle { conn, since: now });
        }
    }

    async fn connect(&self, key: &str) -> Result<Conn<D::Io>, H1Error> {
        let io = match tokio::time::timeout(self.connect_timeout, self.dial.dial(key)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(H1Error::Connect(e)),
            Err(_) => return Err(H1Error::ConnectTimeout),
        };
        Ok(Conn {
            io,
            buf: BytesMut::new(),
        })
    }

    /// Sends `req` (an absolute `http://` request) on a pooled or new connection to its
    /// authority. When the request cannot be written on a pooled connection (the
    /// upstream closed it while it rested), it goes once more, on a new connection; a
    /// request that left is never sent twice.
    pub(crate) async fn send(
        self: &Arc<Self>,
        req: Request<SliceBody>,
    ) -> Result<Response<DrivenBody<D>>, H1Error> {
        let (parts, body) = req.into_parts();
        let Some(authority) = parts.uri.authority().cloned() else {
            return Err(H1Error::Connect(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the upstream URL has no host",
            )));
        };
        // `host[:port]`, without any `user:password@`.
        let host = authority
            .as_str()
            .rsplit_once('@')
            .map_or(authority.as_str(), |(_, host)| host);
        let key = match authority.port_u16() {
            Some(_) => host.to_owned(),
            None => format!("{host}:80"),
        };
        let len = body.len();
        let chunks = body.into_chunks();
        let mut out = Vec::with_capacity(1 + chunks.len());
        out.push(Bytes::from(encode_head(&parts, host, len)));
        out.extend(chunks.into_iter().filter(|c| !c.is_empty()));
        let mut out = Out::new(out);
        let mut pooled = self.checkout(&key);
        loop {
            let reused = pooled.is_some();
            let mut conn = match pooled.take() {
                Some(c) => c,
                None => self.connect(&key).await?,
            };
            match exchange(&mut conn, &mut out, self.timeouts).await {
                Ok(head) => {
                    let unsent = (!out.is_done()).then_some(out);
                    let watch =
                        (unsent.is_some() || self.timeouts.read_idle.is_some()).then(|| {
                            Box::new(Watch {
                                unsent,
                                read_timer: IdleTimer::new(self.timeouts.read_idle),
                                write_timer: IdleTimer::new(self.timeouts.write_idle),
                            })
                        });
                    let mut resp = Response::new(DrivenBody {
                        conn: Some(conn),
                        decoder: Decoder::new(head.framing),
                        keep_alive: head.keep_alive,
                        watch,
                        pool: self.clone(),
                        key,
                    });
                    *resp.status_mut() = head.status;
                    *resp.version_mut() = head.version;
                    *resp.headers_mut() = head.headers;
                    if resp.body().decoder.is_done() {
                        resp.body_mut().finish();
                    }
                    return Ok(resp);
                }
                Err(Failed { error, unsent }) => {
                    if reused && unsent {
                        out.rewind();
                        continue;
                    }
                    return Err(H1Error::Exchange(error));
                }
            }
        }
    }
}

/// Whether a resting connection has nothing to read (no close, no reset, no stray
/// bytes): one read with a waker that does nothing.
fn resting<Io: AsyncRead + Unpin>(io: &mut Io) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    let mut byte = [0u8; 1];
    let mut buf = ReadBuf::new(&mut byte);
    Pin::new(io).poll_read(&mut cx, &mut buf).is_pending()
}

/// The request line and headers of `parts`, in origin form, with a `Host` header and
/// the body's length.
fn encode_head(parts: &http::request::Parts, host: &str, len: u64) -> Vec<u8> {
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut head = Vec::with_capacity(128 + path.len() + 64 * parts.headers.len());
    head.extend_from_slice(parts.method.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(path.as_bytes());
    head.extend_from_slice(b" HTTP/1.1\r\n");
    if !parts.headers.contains_key(header::HOST) {
        head.extend_from_slice(b"host: ");
        head.extend_from_slice(host.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    for (name, value) in &parts.headers {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            continue;
        }
        head.extend_from_slice(name.as_str().as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    let _ = write!(head, "content-length: {len}\r\n\r\n");
    head
}

/// The bytes of a request still to be written: its head, then its body's slices.
struct Out {
    parts: Vec<Bytes>,
    /// The first part not written whole.
    next: usize,
    /// How much of `parts[next]` is written.
    offset: usize,
}

impl Out {
    fn new(parts: Vec<Bytes>) -> Self {
        Out {
            parts,
            next: 0,
            offset: 0,
        }
    }

    fn is_done(&self) -> bool {
        self.next == self.parts.len()
    }

    /// Back to the first byte, for another connection.
    fn rewind(&mut self) {
        self.next = 0;
        self.offset = 0;
    }

    fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let left = self.parts[self.next].len() - self.offset;
            if n < left {
                self.offset += n;
                return;
            }
            n -= left;
            self.next += 1;
            self.offset = 0;
        }
    }

    /// Writes as much as the connection takes, in as few writes as it allows: `Ready`
    /// once everything is written, `Pending` when the connection takes no more for
    /// now. `timer` is told of each write that made progress.
    fn poll_write<Io: AsyncWrite + Unpin>(
        &mut self,
        io: &mut Io,
        timer: &mut IdleTimer,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        while !self.is_done() {
            let mut iov = [IoSlice::new(&[]); MAX_IOV];
            let mut used = 0;
            for (i, part) in self.parts[self.next..].iter().take(MAX_IOV).enumerate() {
                let skip = if i == 0 { self.offset } else { 0 };
                iov[i] = IoSlice::new(&part[skip..]);
                used += 1;
            }
            match Pin::new(&mut *io).poll_write_vectored(cx, &iov[..used]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    timer.progress();
                    self.advance(n);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Pin::new(io).poll_flush(cx)
    }
}

/// An idle timeout: it runs while the I/O it watches is pending, restarts from the
/// next wait after any progress, and is armed (and allocated) only when a wait begins.
struct IdleTimer {
    limit: Option<Duration>,
    sleep: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl IdleTimer {
    fn new(limit: Option<Duration>) -> Self {
        IdleTimer {
            limit,
            sleep: None,
            armed: false,
        }
    }

    /// The watched I/O made progress: the next wait starts a new period.
    fn progress(&mut self) {
        self.armed = false;
    }

    /// The watched I/O is pending: whether the limit is over (else `cx` is woken
    /// when it will be).
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(limit) = self.limit else {
            return false;
        };
        if !self.armed {
            self.armed = true;
            let deadline = Instant::now() + limit;
            match &mut self.sleep {
                Some(sleep) => sleep.as_mut().reset(deadline),
                None => self.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        self.sleep
            .as_mut()
            .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready())
    }
}

fn write_stalled(limit: Option<Duration>) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "the upstream took no bytes of the request for {:?} (write idle timeout)",
            limit.unwrap_or_default()
        ),
    )
}

fn read_stalled(limit: Option<Duration>) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "the upstream sent nothing for {:?} (read idle timeout)",
            limit.unwrap_or_default()
        ),
    )
}

/// How long an answer may take to arrive once the upstream closed the connection
/// before the request was written whole.
const EARLY_ANSWER_WAIT: Duration = Duration::from_secs(1);

/// An exchange that got no response head.
struct Failed {
    error: io::Error,
    /// The request could not be written whole, so the upstream cannot have taken it.
    unsent: bool,
}

/// A parsed response head.
struct Head {
    status: StatusCode,
    version: Version,
    headers: HeaderMap,
    framing: State,
    keep_alive: bool,
}

/// Writes the request and, at the same time, reads the response head (skipping
/// interim `1xx` answers). An answer may come before the whole request was written:
/// the rest is then left in `out`, for the body to write while it is read. When the
/// upstream breaks the connection while the request is written, an answer it sent
/// before is still the response (a body it refuses), and the connection is not reused.
async fn exchange<Io: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut Conn<Io>,
    out: &mut Out,
    timeouts: Timeouts,
) -> Result<Head, Failed> {
    let mut write_timer = IdleTimer::new(timeouts.write_idle);
    let mut read_timer = IdleTimer::new(timeouts.read_idle);
    let mut write_error: Option<io::Error> = None;
    let mut interim = 0;
    std::future::poll_fn(|cx| {
        loop {
            if write_error.is_none() && !out.is_done() {
                match out.poll_write(&mut conn.io, &mut write_timer, cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => {
                        write_error = Some(e);
                        // The answer, if any, is already on its way.
                        read_timer = IdleTimer::new(Some(
                            timeouts
                                .read_idle
                                .map_or(EARLY_ANSWER_WAIT, |t| t.min(EARLY_ANSWER_WAIT)),
                        ));
                    }
                    Poll::Pending if write_timer.poll_expired(cx) => {
                        return Poll::Ready(Err(Failed {
                            error: write_stalled(timeouts.write_idle),
                            unsent: true,
                        }))
                    }
                    Poll::Pending => {}
                }
            }
            let writing = write_error.is_none() && !out.is_done();
            match final_head(&mut conn.buf, &mut interim) {
                Ok(Some(mut head)) => {
                    if write_error.is_some() {
                        head.keep_alive = false;
                    }
                    return Poll::Ready(Ok(head));
                }
                Ok(None) => {}
                Err(error) => {
                    return Poll::Ready(Err(Failed {
                        error,
                        unsent: false,
                    }))
                }
            }
            let unsent = write_error.is_some() || !out.is_done();
            let end = |error: io::Error, write_error: &mut Option<io::Error>| {
                Poll::Ready(Err(Failed {
                    error: write_error.take().unwrap_or(error),
                    unsent,
                }))
            };
            conn.buf.reserve(READ_MIN);
            match tokio_util::io::poll_read_buf(Pin::new(&mut conn.io), cx, &mut conn.buf) {
                Poll::Ready(Ok(0)) => {
                    return end(
                        io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the upstream closed the connection without answering",
                        ),
                        &mut write_error,
                    )
                }
                Poll::Ready(Ok(_)) => read_timer.progress(),
                Poll::Ready(Err(e)) => return end(e, &mut write_error),
                // While the request is being written, the upstream is taking it: the
                // read idle timeout starts once it has all of it.
                Poll::Pending if writing => return Poll::Pending,
                Poll::Pending if read_timer.poll_expired(cx) => {
                    let stalled = read_stalled(read_timer.limit);
                    return end(stalled, &mut write_error);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    })
    .await
}

/// The final response head at the start of `buf`, past interim (`1xx`) answers
/// (`interim` counts them across reads); `None` while it is incomplete.
#[inline]
fn final_head(buf: &mut BytesMut, interim: &mut usize) -> io::Result<Option<Head>> {
    while !buf.is_empty() {
        let Some((used, head)) = parse_head(buf)? else {
            return Ok(None);
        };
        buf.advance(used);
        if !head.status.is_informational() {
            return Ok(Some(head));
        }
        if head.status == StatusCode::SWITCHING_PROTOCOLS {
            return Err(invalid("the upstream switched protocols on a model call"));
        }
        *interim += 1;
        if *interim > MAX_INTERIM {
            return Err(invalid(format!(
                "the upstream sent over {MAX_INTERIM} interim (1xx) answers"
            )));
        }
    }
    Ok(None)
}

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

/// Parses a complete response head at the start of `buf`: its length and content, or
/// `None` while it is incomplete.
fn parse_head(buf: &[u8]) -> io::Result<Option<(usize, Head)>> {
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut slots);
    let used = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD => {
            return Err(invalid(format!(
                "the upstream's response head is over {} KiB",
                MAX_HEAD / 1024
            )))
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => {
            return Err(invalid(format!(
                "the upstream's answer is not an HTTP/1.x response ({e})"
            )))
        }
    };
    let code = resp.code.unwrap_or_default();
    let status = StatusCode::from_u16(code)
        .map_err(|_| invalid(format!("the upstream answered with status {code}")))?;
    let version = if resp.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let mut framing = FramingHeaders::default();
    let mut headers = HeaderMap::with_capacity(resp.headers.len());
    for h in resp.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| invalid(format!("the upstream sent a bad header name `{}`", h.name)))?;
        let value = HeaderValue::from_bytes(h.value)
            .map_err(|_| invalid(format!("the upstream sent a bad `{name}` header value")))?;
        framing.note(&name, h.value)?;
        headers.append(name, value);
    }
    let (framing, keep_alive) = framing.decide(status, version, &mut headers);
    Ok(Some((
        used,
        Head {
            status,
            version,
            headers,
            framing,
            keep_alive,
        },
    )))
}

/// What the headers of a response head say of its body's framing and of its
/// connection.
#[derive(Debug, Default)]
struct FramingHeaders {
    /// Whether the last transfer coding is chunked, if there is a `Transfer-Encoding`.
    chunked: Option<bool>,
    length: Option<u64>,
    /// `Connection: close` anywhere.
    close: bool,
    /// `Connection: keep-alive` (what an HTTP/1.0 answer needs to be reused).
    keep_alive: bool,
}

impl FramingHeaders {
    /// Notes one header of the head.
    fn note(&mut self, name: &HeaderName, value: &[u8]) -> io::Result<()> {
        if name == header::TRANSFER_ENCODING {
            // The last coding decides: chunked is the only one that frames a body.
            if let Some(last) = value.rsplit(|&b| b == b',').next() {
                self.chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            }
        } else if name == header::CONTENT_LENGTH {
            for part in value.split(|&b| b == b',') {
                let n = std::str::from_utf8(part.trim_ascii())
                    .ok()
                    .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| invalid("the upstream sent a bad content-length"))?;
                if self.length.is_some_and(|l| l != n) {
                    return Err(invalid("the upstream sent two different content-lengths"));
                }
                self.length = Some(n);
            }
        } else if name == header::CONNECTION {
            for token in value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    self.close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    self.keep_alive = true;
                }
            }
        }
        Ok(())
    }

    /// The body's framing, and whether the connection may be reused after it.
    fn decide(
        self,
        status: StatusCode,
        version: Version,
        headers: &mut HeaderMap,
    ) -> (State, bool) {
        // A `close` anywhere wins over any `keep-alive`, which only an HTTP/1.0 answer
        // needs.
        let mut keep_alive = !self.close && (version == Version::HTTP_11 || self.keep_alive);
        let framing = if status.is_informational()
            || status == StatusCode::NO_CONTENT
            || status == StatusCode::NOT_MODIFIED
        {
            State::Length(0)
        } else if let Some(chunked) = self.chunked {
            if self.length.is_some() {
                // Transfer-Encoding overrides Content-Length, but a message with both
                // may be an attempt at response splitting: it is read by its transfer
                // coding, relayed without the length, and its connection is closed
                // after it (RFC 9112, section 6.3).
                headers.remove(header::CONTENT_LENGTH);
                keep_alive = false;
            }
            if chunked {
                State::Chunked(Chunk::Size)
            } else {
                keep_alive = false;
                State::UntilClose
            }
        } else if let Some(n) = self.length {
            State::Length(n)
        } else {
            keep_alive = false;
            State::UntilClose
        };
        (framing, keep_alive)
    }
}

/// Where a body's decoding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// This many bytes are still to come.
    Length(u64),
    /// A chunked body.
    Chunked(Chunk),
    /// The body ends when the upstream closes the connection.
    UntilClose,
    /// The body ended.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// A chunk-size line is next.
    Size,
    /// This many bytes of the current chunk are still to come.
    Data(u64),
    /// The line end after a chunk's data is next.
    DataEnd,
    /// Trailer lines, up to an empty one.
    Trailers,
}

/// What decoding the buffered bytes gave.
enum Step {
    Data(Bytes),
    NeedMore,
    Done,
}

/// A body's decoding: where it is, and what it has used of the bounds on what is not
/// data (chunk extensions, trailers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Decoder {
    state: State,
    extensions: u64,
    trailers: u64,
}

impl Decoder {
    fn new(state: State) -> Self {
        Decoder {
            state,
            extensions: 0,
            trailers: 0,
        }
    }

    fn is_done(&self) -> bool {
        matches!(self.state, State::Done | State::Length(0))
    }

    /// Decodes from the front of `buf`: the next piece of body, or what is missing.
    fn step(&mut self, buf: &mut BytesMut) -> io::Result<Step> {
        loop {
            match &mut self.state {
                State::Done | State::Length(0) => {
                    self.state = State::Done;
                    return Ok(Step::Done);
                }
                State::UntilClose if buf.is_empty() => return Ok(Step::NeedMore),
                State::UntilClose => return Ok(Step::Data(buf.split().freeze())),
                State::Length(rem) | State::Chunked(Chunk::Data(rem)) => {
                    if buf.is_empty() {
                        return Ok(Step::NeedMore);
                    }
                    let n = (*rem).min(buf.len() as u64);
                    *rem -= n;
                    let data = buf.split_to(n as usize).freeze();
                    match self.state {
                        State::Length(0) => self.state = State::Done,
                        State::Chunked(Chunk::Data(0)) => {
                            self.state = State::Chunked(Chunk::DataEnd)
                        }
                        _ => {}
                    }
                    return Ok(Step::Data(data));
                }
                State::Chunked(Chunk::Size) => {
                    let Some(line) = take_line(buf, MAX_LINE as u64)? else {
                        return Ok(Step::NeedMore);
                    };
                    let (size, extensions) = chunk_size(&line)?;
                    self.extensions += extensions;
                    if self.extensions > MAX_EXTENSIONS {
                        return Err(invalid(format!(
                            "the upstream's chunked body has over {} KiB of chunk extensions",
                            MAX_EXTENSIONS / 1024
                        )));
                    }
                    self.state = if size == 0 {
                        State::Chunked(Chunk::Trailers)
                    } else {
                        State::Chunked(Chunk::Data(size))
                    };
                }
                State::Chunked(Chunk::DataEnd) => {
                    if buf.starts_with(b"\r\n") {
                        buf.advance(2);
                    } else if buf.starts_with(b"\n") {
                        buf.advance(1);
                    } else if buf.is_empty() || &buf[..] == b"\r" {
                        return Ok(Step::NeedMore);
                    } else {
                        return Err(invalid(
                            "the upstream's chunked body has data past a chunk's end",
                        ));
                    }
                    self.state = State::Chunked(Chunk::Size);
                }
                State::Chunked(Chunk::Trailers) => {
                    let room = MAX_TRAILERS - self.trailers;
                    let Some(line) = take_line(buf, room)? else {
                        return Ok(Step::NeedMore);
                    };
                    // The line and its `\r\n`.
                    self.trailers += line.len() as u64 + 2;
                    if line.is_empty() {
                        self.state = State::Done;
                    } else if self.trailers > MAX_TRAILERS {
                        return Err(over_trailers());
                    }
                }
            }
        }
    }

    /// How much room to make in the read buffer before the next read.
    fn read_size(&self) -> usize {
        match self.state {
            State::Length(rem) | State::Chunked(Chunk::Data(rem)) => {
                rem.clamp(READ_MIN as u64, READ_MAX as u64) as usize
            }
            _ => READ_MIN,
        }
    }
}

fn over_trailers() -> io::Error {
    invalid(format!(
        "the upstream's chunked body has trailers over {} KiB",
        MAX_TRAILERS / 1024
    ))
}

/// Takes one line (without its `\r\n` or `\n`) off the front of `buf`, if a whole one is
/// there; a line longer than `max` is an error.
fn take_line(buf: &mut BytesMut, max: u64) -> io::Result<Option<BytesMut>> {
    match memchr::memchr(b'\n', buf) {
        Some(end) if end as u64 > max => Err(long_line(max)),
        Some(end) => {
            let mut line = buf.split_to(end + 1);
            line.truncate(end);
            if line.ends_with(b"\r") {
                line.truncate(end - 1);
            }
            Ok(Some(line))
        }
        None if buf.len() as u64 > max => Err(long_line(max)),
        None => Ok(None),
    }
}

fn long_line(max: u64) -> io::Error {
    if max == MAX_LINE as u64 {
        invalid(format!(
            "the upstream's chunked body has a line over {} KiB",
            MAX_LINE / 1024
        ))
    } else {
        over_trailers()
    }
}

/// The size on a chunk-size line (hex digits, then maybe `;extensions`), and how many
/// bytes of extensions the line has.
fn chunk_size(line: &[u8]) -> io::Result<(u64, u64)> {
    let (digits, extensions) = match memchr::memchr(b';', line) {
        Some(i) => (&line[..i], (line.len() - i) as u64),
        None => (line, 0),
    };
    let digits = digits.trim_ascii();
    let bad = || invalid("the upstream's chunked body has a bad chunk size");
    if digits.is_empty() || digits.len() > 15 {
        return Err(bad());
    }
    let mut size = 0u64;
    for &d in digits {
        let v = (d as char).to_digit(16).ok_or_else(bad)?;
        size = size * 16 + u64::from(v);
    }
    Ok((size, extensions))
}

/// A response body read from the connection it came on; the connection goes back to
/// the pool when the body has been read to its end (and the request written whole).
pub(crate) struct DrivenBody<D: Dial = Tcp> {
    /// `None` once the body ended or failed.
    conn: Option<Conn<D::Io>>,
    decoder: Decoder,
    keep_alive: bool,
    /// Only with a read idle timeout or a request not written whole (kept out of the
    /// way of the common case).
    watch: Option<Box<Watch>>,
    pool: Arc<H1Pool<D>>,
    key: String,
}

/// What a body watches besides its reads.
struct Watch {
    /// The rest of a request the upstream answered before it had all of it.
    unsent: Option<Out>,
    read_timer: IdleTimer,
    write_timer: IdleTimer,
}

impl<D: Dial> std::fmt::Debug for DrivenBody<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrivenBody")
            .field("decoder", &self.decoder)
            .finish_non_exhaustive()
    }
}

impl<D: Dial> DrivenBody<D> {
    /// The body ended: the connection rests in the pool, if it can carry another call.
    fn finish(&mut self) {
        self.decoder.state = State::Done;
        if let Some(conn) = self.conn.take() {
            let unsent = self.watch.as_ref().is_some_and(|w| w.unsent.is_some());
            if self.keep_alive && !unsent {
                self.pool.checkin(std::mem::take(&mut self.key), conn);
            }
        }
    }

    /// Writes on the rest of the request, if the upstream answered before it had it
    /// all. Writing stops (and the connection will not be reused) when the upstream
    /// breaks the connection or takes nothing for the write idle timeout: it answered
    /// already.
    fn poll_unsent(&mut self, cx: &mut Context<'_>) {
        let (Some(watch), Some(conn)) = (self.watch.as_deref_mut(), self.conn.as_mut()) else {
            return;
        };
        let Some(out) = watch.unsent.as_mut() else {
            return;
        };
        match out.poll_write(&mut conn.io, &mut watch.write_timer, cx) {
            Poll::Ready(Ok(())) => watch.unsent = None,
            Poll::Pending if !watch.write_timer.poll_expired(cx) => {}
            Poll::Ready(Err(_)) | Poll::Pending => {
                self.keep_alive = false;
                watch.unsent = None;
            }
        }
    }
}

impl<D: Dial> Body for DrivenBody<D> {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        if this.watch.is_some() {
            this.poll_unsent(cx);
        }
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match this.decoder.step(&mut conn.buf) {
                Ok(Step::Data(data)) => {
                    if this.decoder.state == State::Done {
                        this.finish();
                    }
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Step::Done) => {
                    this.finish();
                    return Poll::Ready(None);
                }
                Ok(Step::NeedMore) => {}
                Err(e) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
            let room = this.decoder.read_size();
            if conn.buf.capacity() - conn.buf.len() < room / 2 {
                conn.buf.reserve(room);
            }
            match tokio_util::io::poll_read_buf(Pin::new(&mut conn.io), cx, &mut conn.buf) {
                Poll::Pending
                    if this
                        .watch
                        .as_deref_mut()
                        .is_some_and(|w| w.read_timer.poll_expired(cx)) =>
                {
                    this.conn = None;
                    return Poll::Ready(Some(Err(read_stalled(
                        this.watch.as_ref().and_then(|w| w.read_timer.limit),
                    ))));
                }
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    this.conn = None;
                    if this.decoder.state == State::UntilClose {
                        this.decoder.state = State::Done;
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the upstream closed the connection before the response body ended",
                    ))));
                }
                Poll::Ready(Ok(_)) => {
                    if let Some(watch) = this.watch.as_deref_mut() {
                        watch.read_timer.progress();
                    }
                }
                Poll::Ready(Err(e)) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.state {
            State::Length(n) => SizeHint::with_exact(n),
            State::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
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
            let pool = H1Pool::new(8, Duration::from_secs(5), Timeouts::default());
            // Credentials in the URL stay out of the Host header and the pool key.
            let url = format!("http://user:pw@{addr}/v1/chat/completions");
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

    /// Decodes `wire` fed `step` bytes at a time: the body and how decoding ended.
    fn decode(state: State, wire: &[u8], step: usize) -> (Vec<u8>, io::Result<State>) {
        let mut state = Decoder::new(state);
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        for piece in wire.chunks(step) {
            buf.extend_from_slice(piece);
            loop {
                match state.step(&mut buf) {
                    Ok(Step::Data(d)) => body.extend_from_slice(&d),
                    Ok(Step::NeedMore) => break,
                    Ok(Step::Done) => return (body, Ok(State::Done)),
                    Err(e) => return (body, Err(e)),
                }
            }
        }
        (body, Ok(state.state))
    }

    #[test]
    fn chunked_bodies_decode_however_the_bytes_arrive() {
        let wire =
            b"5;name=value\r\nhello\r\n6\r\n world\r\nA\n, and more\n0\r\nx-trailer: 1\r\n\r\n";
        for step in [1, 2, 3, 7, wire.len()] {
            let (body, end) = decode(State::Chunked(Chunk::Size), wire, step);
            assert_eq!(body, b"hello world, and more", "step {step}");
            assert_eq!(end.expect("decoded"), State::Done, "step {step}");
        }
        // Up to the last byte, the body is not over.
        let (body, end) = decode(State::Chunked(Chunk::Size), &wire[..wire.len() - 1], 4);
        assert_eq!(body, b"hello world, and more");
        assert_eq!(end.expect("partial"), State::Chunked(Chunk::Trailers));
        // A body with a length ends after that many bytes, whatever follows.
        let mut buf = BytesMut::from(&b"abcdef"[..]);
        let mut state = Decoder::new(State::Length(4));
        assert!(matches!(state.step(&mut buf), Ok(Step::Data(d)) if d == "abcd"));
        assert_eq!(state.state, State::Done);
        assert_eq!(&buf[..], b"ef");
    }

    #[test]
    fn malformed_chunked_bodies_are_errors() {
        for wire in [
            &b"zz\r\n"[..],
            b"\r\n",
            b"1234567890abcdef0\r\n",
            b"3\r\nabcXY",
        ] {
            let (_, end) = decode(State::Chunked(Chunk::Size), wire, 1);
            let e = end.expect_err("malformed");
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{wire:?}: {e}");
        }
        let long = vec![b'1'; MAX_LINE + 2];
        let (_, end) = decode(State::Chunked(Chunk::Size), &long, long.len());
        assert!(end.expect_err("too long").to_string().contains("line over"));
    }

    fn head(wire: &str) -> io::Result<Option<(usize, Head)>> {
        parse_head(wire.as_bytes())
    }

    #[test]
    fn response_heads_set_the_framing_and_the_reuse() {
        let wire = "HTTP/1.1 200 OK\r\ncontent-length: 12\r\nx-a: b\r\n\r\nrest";
        let (used, h) = head(wire).expect("parsed").expect("complete");
        assert_eq!(used, wire.len() - "rest".len());
        assert_eq!(
            (h.status, h.framing, h.keep_alive),
            (StatusCode::OK, State::Length(12), true)
        );
        assert_eq!(h.headers["x-a"], "b");

        for (wire, framing, keep_alive) in [
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
                State::Chunked(Chunk::Size),
                true,
            ),
            // Both framings: the transfer coding frames the body, and the connection
            // is closed after it (RFC 9112, section 6.3).
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\ncontent-length: 3\r\n\r\n",
                State::Chunked(Chunk::Size),
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: identity\r\n\r\n",
                State::UntilClose,
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\nconnection: close\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n",
                State::Length(1),
                false,
            ),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
                State::UntilClose,
                false,
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", State::UntilClose, false),
            (
                "HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n",
                State::Length(0),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\nConnection: Close\r\ncontent-length: 1\r\n\r\n",
                State::Length(1),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n",
                State::Length(1),
                false,
            ),
            (
                "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n",
                State::Length(1),
                true,
            ),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 4, 4\r\n\r\n",
                State::Length(4),
                true,
            ),
        ] {
            let h = head(wire).expect("parsed").expect("complete").1;
            assert_eq!((h.framing, h.keep_alive), (framing, keep_alive), "{wire:?}");
        }

        assert!(head("HTTP/1.1 200 OK\r\ncontent-")
            .expect("partial")
            .is_none());
        for bad in [
            "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -3\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 0x3\r\n\r\n",
            "SSH-2.0-OpenSSH_9.6\r\n\r\n",
        ] {
            let e = head(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} is refused"));
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{bad:?}");
        }
        let huge = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD));
        assert!(head(&huge)
            .err()
            .expect("too large")
            .to_string()
            .contains("KiB"));
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

    #[test]
    fn what_is_not_data_is_bounded() {
        // Trailers: lines of 1 KiB each, 17 of them.
        let line = format!("x-t: {}\r\n", "a".repeat(1000));
        let mut wire = b"1\r\na\r\n0\r\n".to_vec();
        for _ in 0..17 {
            wire.extend_from_slice(line.as_bytes());
        }
        wire.extend_from_slice(b"\r\n");
        let (_, end) = decode(State::Chunked(Chunk::Size), &wire, 100);
        let e = end.expect_err("too many trailers");
        assert!(e.to_string().contains("trailers over 16 KiB"), "{e}");
        // One trailer line past the budget, never ended.
        let mut wire = b"0\r\nx-t: ".to_vec();
        wire.extend(std::iter::repeat_n(b'a', 17 * 1024));
        let (_, end) = decode(State::Chunked(Chunk::Size), &wire, 512);
        assert!(end
            .expect_err("unbounded")
            .to_string()
            .contains("trailers over"));
        // Within the budget, trailers are fine.
        let mut wire = b"1\r\na\r\n0\r\n".to_vec();
        for _ in 0..15 {
            wire.extend_from_slice(line.as_bytes());
        }
        wire.extend_from_slice(b"\r\n");
        let (body, end) = decode(State::Chunked(Chunk::Size), &wire, 100);
        assert_eq!((body, end.expect("decoded")), (b"a".to_vec(), State::Done));

        // Chunk extensions: 1 KiB on each of 17 chunks.
        let ext = format!(";e={}", "b".repeat(1020));
        let mut wire = Vec::new();
        for _ in 0..17 {
            wire.extend_from_slice(format!("1{ext}\r\nz\r\n").as_bytes());
        }
        wire.extend_from_slice(b"0\r\n\r\n");
        let (body, end) = decode(State::Chunked(Chunk::Size), &wire, 64);
        assert!(body.len() < 17);
        let e = end.expect_err("too many extensions");
        assert!(e.to_string().contains("chunk extensions"), "{e}");
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

    /// One response of the differential test, and how its bytes reach the client.
    #[derive(Debug, Clone)]
    struct Wire {
        interim: Vec<u16>,
        http10: bool,
        status: u16,
        headers: Vec<(String, String)>,
        connection: Option<&'static str>,
        framing: Framing,
        body: Vec<u8>,
        /// Sizes of the pieces the upstream writes (cycled).
        pieces: Vec<usize>,
        /// Bytes the pipe holds each way.
        capacity: usize,
    }

    #[derive(Debug, Clone)]
    enum Framing {
        Length,
        /// Chunk sizes (cycled over the body), extensions, upper-case hex, trailers.
        Chunked {
            sizes: Vec<usize>,
            extension: Option<String>,
            upper: bool,
            trailers: Vec<(String, String)>,
        },
        UntilClose,
    }

    impl Wire {
        /// Whether the upstream keeps the connection open after this response.
        fn keeps_open(&self) -> bool {
            let persistent = match (self.http10, self.connection) {
                (_, Some("close")) => false,
                (true, Some("keep-alive")) => true,
                (http10, _) => !http10,
            };
            let no_body = matches!(self.status, 204 | 304);
            persistent && (no_body || !matches!(self.framing, Framing::UntilClose))
        }

        fn bytes(&self) -> Vec<u8> {
            let mut w = Vec::new();
            for code in &self.interim {
                w.extend_from_slice(
                    format!("HTTP/1.1 {code} Interim\r\nx-interim: 1\r\n\r\n").as_bytes(),
                );
            }
            let version = if self.http10 { "1.0" } else { "1.1" };
            w.extend_from_slice(format!("HTTP/{version} {} Whatever\r\n", self.status).as_bytes());
            for (name, value) in &self.headers {
                w.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
            }
            if let Some(c) = self.connection {
                w.extend_from_slice(format!("Connection: {c}\r\n").as_bytes());
            }
            let no_body = matches!(self.status, 204 | 304);
            match &self.framing {
                Framing::Length => {
                    w.extend_from_slice(
                        format!("Content-Length: {}\r\n\r\n", self.body.len()).as_bytes(),
                    );
                    if !no_body {
                        w.extend_from_slice(&self.body);
                    }
                }
                Framing::Chunked {
                    sizes,
                    extension,
                    upper,
                    trailers,
                } => {
                    w.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                    if no_body {
                        return w;
                    }
                    let mut rest = &self.body[..];
                    let mut size = sizes.iter().cycle();
                    while !rest.is_empty() {
                        let n = (*size.next().unwrap_or(&1)).clamp(1, rest.len());
                        let hex = if *upper {
                            format!("{n:X}")
                        } else {
                            format!("{n:x}")
                        };
                        w.extend_from_slice(hex.as_bytes());
                        if let Some(ext) = extension {
                            w.extend_from_slice(format!(";{ext}").as_bytes());
                        }
                        w.extend_from_slice(b"\r\n");
                        w.extend_from_slice(&rest[..n]);
                        w.extend_from_slice(b"\r\n");
                        rest = &rest[n..];
                    }
                    w.extend_from_slice(b"0\r\n");
                    for (name, value) in trailers {
                        w.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
                    }
                    w.extend_from_slice(b"\r\n");
                }
                Framing::UntilClose => {
                    w.extend_from_slice(b"\r\n");
                    if !no_body {
                        w.extend_from_slice(&self.body);
                    }
                }
            }
            w
        }

        /// Plays the upstream on one end of a pipe: reads the request, writes the
        /// response in pieces, then closes or holds the connection as it said.
        async fn serve(self, mut end: tokio::io::DuplexStream) {
            if read_request(&mut end).await.is_none() {
                return;
            }
            let wire = self.bytes();
            let mut rest = &wire[..];
            let mut piece = self.pieces.iter().cycle();
            while !rest.is_empty() {
                let n = (*piece.next().unwrap_or(&1)).clamp(1, rest.len());
                if end.write_all(&rest[..n]).await.is_err() {
                    return;
                }
                rest = &rest[n..];
            }
            if self.keeps_open() {
                // Held until the client lets go.
                let mut buf = [0u8; 64];
                while matches!(end.read(&mut buf).await, Ok(n) if n > 0) {}
            }
        }
    }

    /// What a client made of a response: status, version, headers, body, and whether
    /// the connection may carry another request.
    type Seen = (u16, Version, HeaderMap, Vec<u8>, bool);

    async fn through_h1pool(wire: Wire) -> Seen {
        let (pool, mut ends) = piped(wire.capacity, Timeouts::default());
        let upstream = tokio::spawn(async move {
            let end = ends.recv().await.expect("a connection");
            wire.serve(end).await;
        });
        let resp = pool
            .send(chat("http://upstream:8000/v1/chat/completions", false))
            .await
            .expect("h1pool: a response");
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("h1pool: the body").to_bytes();
        let reusable = idle_count(&pool) == 1;
        drop(pool);
        let _ = upstream.await;
        (
            parts.status.as_u16(),
            parts.version,
            parts.headers,
            body.to_vec(),
            reusable,
        )
    }

    async fn through_hyper(wire: Wire) -> Seen {
        let (ours, theirs) = tokio::io::duplex(wire.capacity);
        let upstream = tokio::spawn(wire.serve(theirs));
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(ours))
                .await
                .expect("hyper: handshake");
        let driver = tokio::spawn(conn);
        let req = Request::post("/v1/chat/completions")
            .header(header::HOST, "upstream:8000")
            .body(http_body_util::Full::new(Bytes::from_static(
                b"{\"model\":\"m\"}",
            )))
            .expect("request");
        let resp = sender.send_request(req).await.expect("hyper: a response");
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.expect("hyper: the body").to_bytes();
        let reusable = sender.ready().await.is_ok();
        drop(sender);
        let _ = driver.await;
        let _ = upstream.await;
        (
            parts.status.as_u16(),
            parts.version,
            parts.headers,
            body.to_vec(),
            reusable,
        )
    }

    fn token() -> impl proptest::strategy::Strategy<Value = String> {
        proptest::string::string_regex("[a-z][a-z0-9-]{0,8}").expect("regex")
    }

    fn wires() -> impl proptest::strategy::Strategy<Value = Wire> {
        use proptest::prelude::*;
        let chunked = (
            proptest::collection::vec(1usize..300, 1..6),
            proptest::option::of(("[a-z]{1,6}", "[a-z0-9]{0,6}").prop_map(|(k, v)| {
                if v.is_empty() {
                    k
                } else {
                    format!("{k}={v}")
                }
            })),
            any::<bool>(),
            proptest::collection::vec(
                (token().prop_map(|t| format!("x-t-{t}")), "[a-z0-9 ]{0,12}"),
                0..3,
            ),
        )
            .prop_map(|(sizes, extension, upper, trailers)| Framing::Chunked {
                sizes,
                extension,
                upper,
                trailers,
            });
        (
            proptest::collection::vec(prop_oneof![Just(100u16), Just(102), Just(103)], 0..3),
            prop_oneof![4 => Just(false), 1 => Just(true)],
            prop_oneof![
                Just(200u16),
                Just(201),
                Just(204),
                Just(304),
                Just(400),
                Just(404),
                Just(429),
                Just(500),
                Just(503)
            ],
            proptest::collection::vec(
                (token().prop_map(|t| format!("x-{t}")), "[ -~]{0,20}"),
                0..5,
            ),
            prop_oneof![
                Just(None),
                Just(Some("close")),
                Just(Some("keep-alive")),
                Just(Some("Keep-Alive, x-hop"))
            ],
            prop_oneof![Just(Framing::Length), chunked, Just(Framing::UntilClose)],
            proptest::collection::vec(any::<u8>(), 0..1500),
            proptest::collection::vec(1usize..200, 1..8),
            1usize..64,
        )
            .prop_map(
                |(
                    interim,
                    http10,
                    status,
                    headers,
                    connection,
                    mut framing,
                    body,
                    pieces,
                    capacity,
                )| {
                    // HTTP/1.0 has no transfer codings.
                    if http10 && matches!(framing, Framing::Chunked { .. }) {
                        framing = Framing::Length;
                    }
                    let connection = match connection {
                        Some("Keep-Alive, x-hop") => Some("keep-alive"),
                        c => c,
                    };
                    Wire {
                        interim,
                        http10,
                        status,
                        headers: headers
                            .into_iter()
                            .map(|(n, v)| (n, v.trim().to_owned()))
                            .collect(),
                        connection,
                        framing,
                        body,
                        pieces,
                        capacity,
                    }
                },
            )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 192,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// The hand-written client reads every framing as hyper's HTTP/1 client does:
        /// the same status, version, headers and body bytes, and the same verdict on
        /// whether the connection can carry another request, however the bytes are
        /// split and however small the pipe.
        #[test]
        fn h1pool_reads_responses_as_hyper_does(wire in wires()) {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let (ours, theirs) = rt.block_on(async {
                tokio::time::timeout(
                    Duration::from_secs(20),
                    async { (through_h1pool(wire.clone()).await, through_hyper(wire.clone()).await) },
                )
                .await
                .expect("both clients finished")
            });
            proptest::prop_assert_eq!(&ours, &theirs);
            proptest::prop_assert_eq!(ours.4, wire.keeps_open());
            if !matches!(wire.status, 204 | 304) {
                proptest::prop_assert_eq!(&ours.3, &wire.body);
            }
        }
    }
}
