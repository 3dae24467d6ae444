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
//! Only `http://` upstreams go through here (the RL case: engines on the same host or
//! network); `https://` ones use the general pooled client, with TLS and HTTP/2.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, Write as _};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf as _, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

use crate::http_body::SliceBody;

/// Idle connections older than this are closed rather than reused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Most response headers accepted.
const MAX_HEADERS: usize = 128;
/// Longest chunk-size or trailer line accepted.
const MAX_LINE: usize = 8 * 1024;
/// Room made in the read buffer before a read, and the most made for a long body.
const READ_MIN: usize = 8 * 1024;
const READ_MAX: usize = 64 * 1024;

/// A connection and the bytes read from it but not yet used.
struct Conn {
    io: TcpStream,
    buf: BytesMut,
}

/// One idle connection.
struct Idle {
    conn: Conn,
    since: Instant,
}

/// Why a request got no response.
#[derive(Debug)]
pub(crate) enum H1Error {
    /// No connection could be made (the request never left).
    Connect(io::Error),
    /// Connecting took longer than the connect timeout.
    ConnectTimeout,
    /// The exchange failed: the connection broke, or the answer is not HTTP/1.x.
    Exchange(io::Error),
}

/// The pool: idle connections per `host:port`, oldest first; the newest is taken first.
pub(crate) struct H1Pool {
    idle: Mutex<HashMap<String, VecDeque<Idle>>>,
    max_idle_per_host: usize,
    idle_timeout: Duration,
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
            idle_timeout: IDLE_TIMEOUT,
            connect_timeout,
        })
    }

    /// A live idle connection to `key`, if the pool has one.
    fn checkout(&self, key: &str) -> Option<Conn> {
        loop {
            let idle = {
                let mut map = self.idle.lock();
                map.get_mut(key)?.pop_back()?
            };
            if idle.since.elapsed() > self.idle_timeout {
                continue;
            }
            // Nothing may be readable on a resting connection: a close, a reset or
            // stray bytes all retire it.
            match idle.conn.io.try_read(&mut [0u8; 1]) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Some(idle.conn),
                _ => continue,
            }
        }
    }

    fn checkin(&self, key: String, conn: Conn) {
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

    async fn connect(&self, key: &str) -> Result<Conn, H1Error> {
        let io = match tokio::time::timeout(self.connect_timeout, TcpStream::connect(key)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(H1Error::Connect(e)),
            Err(_) => return Err(H1Error::ConnectTimeout),
        };
        let _ = io.set_nodelay(true);
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
    ) -> Result<Response<DrivenBody>, H1Error> {
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
        let head = encode_head(&parts, host, len);
        let chunks = body.into_chunks();
        let mut pooled = self.checkout(&key);
        loop {
            let reused = pooled.is_some();
            let mut conn = match pooled.take() {
                Some(c) => c,
                None => self.connect(&key).await?,
            };
            match exchange(&mut conn, &head, &chunks).await {
                Ok(head) => {
                    let mut resp = Response::new(DrivenBody {
                        conn: Some(conn),
                        state: head.framing,
                        keep_alive: head.keep_alive,
                        pool: self.clone(),
                        key,
                    });
                    *resp.status_mut() = head.status;
                    *resp.version_mut() = head.version;
                    *resp.headers_mut() = head.headers;
                    if resp.body().state.is_done() {
                        resp.body_mut().finish();
                    }
                    return Ok(resp);
                }
                Err(Failed { error, unsent }) => {
                    if reused && unsent {
                        continue;
                    }
                    return Err(H1Error::Exchange(error));
                }
            }
        }
    }
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

/// Writes the request and reads the response head.
async fn exchange(conn: &mut Conn, head: &[u8], body: &[Bytes]) -> Result<Head, Failed> {
    if let Err(error) = write_all(&mut conn.io, head, body).await {
        // An upstream may answer before it has read the whole request (a body it
        // refuses) and close: that answer is the response.
        if matches!(
            error.kind(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
        ) {
            if let Ok(Ok(mut head)) = tokio::time::timeout(EARLY_ANSWER_WAIT, read_head(conn)).await
            {
                head.keep_alive = false;
                return Ok(head);
            }
        }
        return Err(Failed {
            error,
            unsent: true,
        });
    }
    read_head(conn).await.map_err(|error| Failed {
        error,
        unsent: false,
    })
}

/// Reads the response head, skipping interim `1xx` answers.
async fn read_head(conn: &mut Conn) -> io::Result<Head> {
    loop {
        if !conn.buf.is_empty() {
            if let Some((used, head)) = parse_head(&conn.buf)? {
                conn.buf.advance(used);
                if head.status.is_informational() {
                    if head.status == StatusCode::SWITCHING_PROTOCOLS {
                        return Err(invalid("the upstream switched protocols on a model call"));
                    }
                    continue;
                }
                return Ok(head);
            }
        }
        conn.buf.reserve(READ_MIN);
        if read(&mut conn.io, &mut conn.buf).await? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the upstream closed the connection without answering",
            ));
        }
    }
}

async fn read(io: &mut TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    std::future::poll_fn(|cx| tokio_util::io::poll_read_buf(Pin::new(&mut *io), cx, buf)).await
}

/// Writes `head` and the body slices, in as few writes as the socket allows.
async fn write_all(io: &mut TcpStream, head: &[u8], body: &[Bytes]) -> io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(1 + body.len());
    slices.push(IoSlice::new(head));
    slices.extend(
        body.iter()
            .filter(|b| !b.is_empty())
            .map(|b| IoSlice::new(b)),
    );
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let n = io.write_vectored(rest).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
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
    let mut keep_alive = version == Version::HTTP_11;
    let mut chunked: Option<bool> = None;
    let mut length: Option<u64> = None;
    let mut headers = HeaderMap::with_capacity(resp.headers.len());
    for h in resp.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| invalid(format!("the upstream sent a bad header name `{}`", h.name)))?;
        let value = HeaderValue::from_bytes(h.value)
            .map_err(|_| invalid(format!("the upstream sent a bad `{name}` header value")))?;
        if name == header::TRANSFER_ENCODING {
            // The last coding decides: chunked is the only one that frames a body.
            if let Some(last) = h.value.rsplit(|&b| b == b',').next() {
                chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            }
        } else if name == header::CONTENT_LENGTH {
            for part in h.value.split(|&b| b == b',') {
                let n = std::str::from_utf8(part.trim_ascii())
                    .ok()
                    .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| invalid("the upstream sent a bad content-length"))?;
                if length.is_some_and(|l| l != n) {
                    return Err(invalid("the upstream sent two different content-lengths"));
                }
                length = Some(n);
            }
        } else if name == header::CONNECTION {
            for token in h.value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case(b"keep-alive") && version == Version::HTTP_10 {
                    keep_alive = true;
                }
            }
        }
        headers.append(name, value);
    }
    let framing = if status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        State::Length(0)
    } else if let Some(chunked) = chunked {
        if chunked {
            State::Chunked(Chunk::Size)
        } else {
            keep_alive = false;
            State::UntilClose
        }
    } else if let Some(n) = length {
        State::Length(n)
    } else {
        keep_alive = false;
        State::UntilClose
    };
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

impl State {
    fn is_done(&self) -> bool {
        matches!(self, State::Done | State::Length(0))
    }

    /// Decodes from the front of `buf`: the next piece of body, or what is missing.
    fn step(&mut self, buf: &mut BytesMut) -> io::Result<Step> {
        loop {
            match self {
                State::Done | State::Length(0) => {
                    *self = State::Done;
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
                    match self {
                        State::Length(0) => *self = State::Done,
                        State::Chunked(Chunk::Data(0)) => *self = State::Chunked(Chunk::DataEnd),
                        _ => {}
                    }
                    return Ok(Step::Data(data));
                }
                State::Chunked(Chunk::Size) => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(Step::NeedMore);
                    };
                    let size = chunk_size(&line)?;
                    *self = if size == 0 {
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
                    *self = State::Chunked(Chunk::Size);
                }
                State::Chunked(Chunk::Trailers) => {
                    let Some(line) = take_line(buf)? else {
                        return Ok(Step::NeedMore);
                    };
                    if line.is_empty() {
                        *self = State::Done;
                    }
                }
            }
        }
    }

    /// How much room to make in the read buffer before the next read.
    fn read_size(&self) -> usize {
        match self {
            State::Length(rem) | State::Chunked(Chunk::Data(rem)) => {
                (*rem).clamp(READ_MIN as u64, READ_MAX as u64) as usize
            }
            _ => READ_MIN,
        }
    }
}

/// Takes one line (without its `\r\n` or `\n`) off the front of `buf`, if a whole one is
/// there.
fn take_line(buf: &mut BytesMut) -> io::Result<Option<BytesMut>> {
    match memchr::memchr(b'\n', buf) {
        Some(end) => {
            let mut line = buf.split_to(end + 1);
            line.truncate(end);
            if line.ends_with(b"\r") {
                line.truncate(end - 1);
            }
            Ok(Some(line))
        }
        None if buf.len() > MAX_LINE => Err(invalid(format!(
            "the upstream's chunked body has a line over {} KiB",
            MAX_LINE / 1024
        ))),
        None => Ok(None),
    }
}

/// The size on a chunk-size line (hex digits, then maybe `;extensions`).
fn chunk_size(line: &[u8]) -> io::Result<u64> {
    let digits = line
        .split(|&b| b == b';')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    let bad = || invalid("the upstream's chunked body has a bad chunk size");
    if digits.is_empty() || digits.len() > 15 {
        return Err(bad());
    }
    let mut size = 0u64;
    for &d in digits {
        let v = (d as char).to_digit(16).ok_or_else(bad)?;
        size = size * 16 + u64::from(v);
    }
    Ok(size)
}

/// A response body read from the connection it came on; the connection goes back to
/// the pool when the body has been read to its end.
pub(crate) struct DrivenBody {
    /// `None` once the body ended or failed.
    conn: Option<Conn>,
    state: State,
    keep_alive: bool,
    pool: Arc<H1Pool>,
    key: String,
}

impl std::fmt::Debug for DrivenBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrivenBody")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl DrivenBody {
    /// The body ended: the connection rests in the pool, if it can carry another call.
    fn finish(&mut self) {
        self.state = State::Done;
        if let Some(conn) = self.conn.take() {
            if self.keep_alive {
                self.pool.checkin(std::mem::take(&mut self.key), conn);
            }
        }
    }
}

impl Body for DrivenBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        loop {
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match this.state.step(&mut conn.buf) {
                Ok(Step::Data(data)) => {
                    if this.state == State::Done {
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
            let room = this.state.read_size();
            if conn.buf.capacity() - conn.buf.len() < room / 2 {
                conn.buf.reserve(room);
            }
            match tokio_util::io::poll_read_buf(Pin::new(&mut conn.io), cx, &mut conn.buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) => {
                    this.conn = None;
                    if this.state == State::UntilClose {
                        this.state = State::Done;
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the upstream closed the connection before the response body ended",
                    ))));
                }
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.state.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.state {
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

    /// Decodes `wire` fed `step` bytes at a time: the body and how decoding ended.
    fn decode(mut state: State, wire: &[u8], step: usize) -> (Vec<u8>, io::Result<State>) {
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
        (body, Ok(state))
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
        let mut state = State::Length(4);
        assert!(matches!(state.step(&mut buf), Ok(Step::Data(d)) if d == "abcd"));
        assert_eq!(state, State::Done);
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
                "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\ncontent-length: 3\r\n\r\n",
                State::Chunked(Chunk::Size),
                true,
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
            let pool = H1Pool::new(8, Duration::from_secs(5));
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
            let pool = H1Pool::new(8, Duration::from_secs(5));
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
            let pool = H1Pool::new(8, Duration::from_secs(5));
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
            let pool = H1Pool::new(8, Duration::from_secs(5));
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
            let pool = H1Pool::new(8, Duration::from_secs(5));
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
                idle: Mutex::new(HashMap::new()),
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
}
