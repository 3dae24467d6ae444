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
//!
//! Here, the pool and its dialer; `write` puts the request on the wire, `head` reads the
//! response head while the request goes out, `decode` takes the body's framing off the
//! read buffer, `body` is the [`DrivenBody`] the call polls, and `timer` holds the idle
//! timeouts of reads and writes.

mod body;
mod decode;
mod head;
#[cfg(test)]
mod tests;
mod timer;
mod write;

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

pub(crate) use self::body::DrivenBody;
use self::head::{exchange, Failed};
use self::write::{encode_head, Out};
use crate::http_body::SliceBody;

/// Idle connections older than this are closed rather than reused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

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
                    return Ok(DrivenBody::response(self.clone(), key, conn, head, unsent));
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

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}
