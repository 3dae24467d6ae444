//! The accept loop shared by the interception server and other HTTP front ends (the
//! sidecar's control API).

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use intercept_core::{ChatDialect, Error};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

/// How long the loop backs off after a first failed `accept` (out of file descriptors
/// and the like) before accepting again; doubled on each failure in a row, up to
/// [`ACCEPT_BACKOFF_MAX`], and reset by the next success.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(5);

/// The longest back-off between failed `accept`s.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Once the work a [`Busy`] mark stands for is cancelled, its answer may still reach
/// the peer for this long; then the connection is dropped.
pub const CANCEL_DRAIN: Duration = Duration::from_secs(1);

/// Settings of [`serve_connections`]. `Default` gives the documented defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// An HTTP/1 connection whose request head is not complete this long after the
    /// connection opened (or after the previous answer, on a kept-alive connection) is
    /// closed (default 30 s). `None`: no limit.
    pub header_read_timeout: Option<Duration>,
    /// Connections served at once (default 16,384). One beyond it has its request head
    /// read, is answered `503` with `Retry-After: 1` and closed, all within 1 s; it is
    /// never served. `None`: no cap.
    pub max_connections: Option<usize>,
}

/// The default of [`ServeOptions::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 16_384;

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            header_read_timeout: Some(Duration::from_secs(30)),
            max_connections: Some(DEFAULT_MAX_CONNECTIONS),
        }
    }
}

/// Connections over [`ServeOptions::max_connections`] being turned away at once; past
/// this many, further ones are closed without an answer.
const MAX_REFUSING: usize = 1024;

/// How long a turned-away connection may take to send its request head and read its 503.
const REFUSE_TIMEOUT: Duration = Duration::from_secs(1);

/// The answer of a connection over the cap: an [`Error::Unavailable`] rendered by
/// [`crate::respond::render`] like every error (OpenAI shape, marker header), written as
/// bytes because the connection is never handed to hyper; it adds when to come back
/// (`retry-after: 1`, `x-should-retry: true`) and that the connection closes.
fn over_capacity(limit: usize) -> Vec<u8> {
    let error = Error::Unavailable(format!(
        "the server is at max_connections ({limit} connections at once); retry shortly"
    ));
    let resp = crate::respond::render(&error, crate::respond::Shape::Dialect(&ChatDialect));
    let status = resp.status();
    let mut out = format!(
        "HTTP/1.1 {} {}\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    )
    .into_bytes();
    for (name, value) in resp.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let body = resp.into_body();
    out.extend_from_slice(
        format!(
            "retry-after: 1\r\n{}: true\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
            crate::respond::SHOULD_RETRY_HEADER,
            body.len()
        )
        .as_bytes(),
    );
    out.extend_from_slice(&body);
    out
}

/// Answers a connection over the cap with `answer` and closes it, bounded in time: the
/// request head is read first (so that clients, which expect no answer before their
/// request, take it), then the answer goes out and the connection is closed.
async fn refuse(mut stream: tokio::net::TcpStream, answer: Arc<Vec<u8>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = tokio::time::timeout(REFUSE_TIMEOUT, async {
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        stream.write_all(&answer).await?;
        stream.shutdown().await?;
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// The connection a request came on: every request served by [`serve_connections`]
/// carries one in its extensions.
///
/// A handler marks the connection [busy](Connection::busy) while it does work that
/// shutdown should wait for. The mark also names what cancels that work: once it is
/// cancelled, the answer has [`CANCEL_DRAIN`] to reach the peer, then the connection is
/// dropped, whether or not the peer reads.
#[derive(Clone, Debug)]
pub struct Connection(Arc<Control>);

#[derive(Debug, Default)]
struct Control {
    marks: Mutex<Vec<Mark>>,
    next: AtomicU64,
    /// Requests seen on the connection.
    requests: AtomicU64,
}

struct Mark {
    id: u64,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl std::fmt::Debug for Mark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mark").field("id", &self.id).finish()
    }
}

impl Connection {
    /// Marks the connection busy until the returned guard is dropped: shutdown lets
    /// it finish (a connection with no mark is closed at once). When `cancel` fires
    /// while the guard lives, the connection is dropped [`CANCEL_DRAIN`] later.
    pub fn busy(&self, cancel: CancellationToken) -> Busy {
        let id = self.0.next.fetch_add(1, Ordering::Relaxed);
        self.0.marks.lock().push(Mark {
            id,
            cancelled: Box::pin(cancel.cancelled_owned()),
        });
        Busy {
            control: self.0.clone(),
            id,
        }
    }

    fn is_busy(&self) -> bool {
        !self.0.marks.lock().is_empty()
    }

    /// Whether the work of a mark was cancelled; registers `cx` otherwise.
    fn poll_cancelled(&self, cx: &mut Context<'_>) -> bool {
        let mut marks = self.0.marks.lock();
        marks
            .iter_mut()
            .any(|m| m.cancelled.as_mut().poll(cx).is_ready())
    }
}

/// A [`Connection`] marked busy; dropping it removes the mark.
#[derive(Debug)]
pub struct Busy {
    control: Arc<Control>,
    id: u64,
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.control.marks.lock().retain(|m| m.id != self.id);
    }
}

/// Serves every connection accepted on `listener` with a clone of `service` until
/// `shutdown` resolves, then shuts down gracefully and returns.
///
/// - Each connection speaks HTTP/1.1 or HTTP/2 (prior knowledge), whichever the client
///   opens with, and has `TCP_NODELAY` set.
/// - A failed `accept` (out of file descriptors and the like) backs off: 5 ms, doubled
///   per failure in a row up to 1 s, reset by the next success; one warning when the
///   failures start and one line when they end, not one per failure.
/// - An HTTP/1 request head must be complete within `options.header_read_timeout`,
///   counted from the connection's start or the previous answer, else the connection
///   is closed: neither a dribbled head nor a silent connection holds it.
/// - At most `options.max_connections` connections are served at once; one beyond it
///   is answered `503 Service Unavailable` with `Retry-After: 1` and closed at once.
/// - Each request carries the [`Connection`] it came on in its extensions. A
///   connection whose [busy](Connection::busy) work is cancelled is dropped
///   [`CANCEL_DRAIN`] later if its answer has not gone out by then, so a peer that
///   stops reading never holds that work.
/// - `shutdown` is checked before every accept. Once it resolves, the listener is
///   closed (no new connections); connections marked busy finish their work (streamed
///   answers included) and then close; every other one (idle, half a head, a request
///   body still arriving) is closed at once. The
///   function returns only after every connection task has ended: no task outlives it.
///
/// Run it as a task its owner awaits (a `TaskTracker`, a `JoinHandle`). Logs go to the
/// caller's `tracing` span.
///
/// ```
/// use std::convert::Infallible;
///
/// use bytes::Bytes;
/// use http::Response;
/// use http_body_util::Full;
/// use hyper::service::service_fn;
/// use tokio::io::{AsyncReadExt, AsyncWriteExt};
/// use tokio::net::{TcpListener, TcpStream};
/// use tokio_util::sync::CancellationToken;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let listener = TcpListener::bind("127.0.0.1:0").await?;
/// let addr = listener.local_addr()?;
/// let service = service_fn(|_req| async {
///     Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
/// });
/// let stop = CancellationToken::new();
/// let server = tokio::spawn(intercept_server::serve_connections(
///     listener,
///     service,
///     intercept_server::ServeOptions::default(),
///     stop.clone().cancelled_owned(),
/// ));
///
/// let mut tcp = TcpStream::connect(addr).await?;
/// tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await?;
/// let mut response = String::new();
/// tcp.read_to_string(&mut response).await?;
/// assert!(response.starts_with("HTTP/1.1 200 OK") && response.ends_with("ok"));
///
/// stop.cancel();
/// server.await.expect("the accept loop ended");
/// # Ok(())
/// # }
/// ```
pub async fn serve_connections<S, B>(
    listener: TcpListener,
    service: S,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout);
    // Every connection task is owned here and awaited before the loop returns.
    let connections = TaskTracker::new();
    let refusing = TaskTracker::new();
    let refusal = Arc::new(over_capacity(options.max_connections.unwrap_or(0)));
    let closing = CancellationToken::new();
    tokio::pin!(shutdown);
    let mut acceptor = Acceptor::new(listener);
    while let Some((stream, peer)) = acceptor.next(shutdown.as_mut()).await {
        if options
            .max_connections
            .is_some_and(|max| connections.len() >= max)
        {
            if refusing.len() < MAX_REFUSING {
                refusing.spawn(refuse(stream, refusal.clone()));
            }
            debug!(%peer, "connection refused: max_connections reached");
            continue;
        }
        let _ = stream.set_nodelay(true);
        let control = Connection(Arc::default());
        let marked = control.clone();
        let service = service.clone();
        let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            marked.0.requests.fetch_add(1, Ordering::Relaxed);
            req.extensions_mut().insert(marked.clone());
            service.call(req)
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let closing = closing.clone().cancelled_owned();
        connections.spawn(async move {
            let first_head = options.header_read_timeout;
            match watch(
                conn,
                |c| c.graceful_shutdown(),
                control,
                closing,
                first_head,
            )
            .await
            {
                Ended::Served(Err(e)) => {
                    debug!(%peer, error = %e, "connection ended with an error")
                }
                Ended::Served(Ok(())) => {}
                Ended::Dropped(why) => debug!(%peer, "connection dropped: {why}"),
            }
        });
    }
    drop(acceptor);
    // Idle and partial connections close now; busy ones finish their work.
    closing.cancel();
    connections.close();
    refusing.close();
    connections.wait().await;
    refusing.wait().await;
}

/// Accepts connections. Failed accepts in a row (out of file descriptors) give one
/// warning when they start, one line when they end, and a growing pause between
/// attempts, never a spin.
struct Acceptor {
    listener: TcpListener,
    /// Failed accepts in a row.
    failures: u64,
    backoff: Duration,
}

impl Acceptor {
    fn new(listener: TcpListener) -> Self {
        Acceptor {
            listener,
            failures: 0,
            backoff: ACCEPT_BACKOFF,
        }
    }

    /// The next connection, or `None` once `shutdown` completes.
    async fn next(
        &mut self,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> Option<(tokio::net::TcpStream, std::net::SocketAddr)> {
        loop {
            let accepted = tokio::select! {
                biased;
                _ = &mut shutdown => return None,
                r = self.listener.accept() => r,
            };
            match accepted {
                Ok(c) => {
                    if self.failures > 0 {
                        info!(failures = self.failures, "accepting connections again");
                        self.failures = 0;
                        self.backoff = ACCEPT_BACKOFF;
                    }
                    return Some(c);
                }
                Err(e) => {
                    if self.failures == 0 {
                        warn!(
                            error = %e,
                            "cannot accept connections (out of file descriptors?); \
                             retrying with back-off until one succeeds"
                        );
                    }
                    self.failures += 1;
                }
            }
            tokio::select! {
                biased;
                _ = &mut shutdown => return None,
                _ = tokio::time::sleep(self.backoff) => {}
            }
            self.backoff = (self.backoff * 2).min(ACCEPT_BACKOFF_MAX);
        }
    }
}

/// How a connection task ended.
enum Ended<E> {
    Served(Result<(), E>),
    Dropped(&'static str),
}

/// Serves `conn` until it ends, it is shut down while not busy, or the work of one of
/// its busy marks was cancelled and [`CANCEL_DRAIN`] passed.
async fn watch<C, E>(
    conn: C,
    shut_down: impl Fn(Pin<&mut C>),
    control: Connection,
    closing: WaitForCancellationFutureOwned,
    first_head: Option<Duration>,
) -> Ended<E>
where
    C: Future<Output = Result<(), E>>,
{
    tokio::pin!(conn);
    tokio::pin!(closing);
    let mut shutting_down = false;
    let mut drain: Option<Pin<Box<tokio::time::Sleep>>> = None;
    // The protocol is told by the first bytes, before HTTP/1's own header timeout runs:
    // a connection that sends nothing is bounded here.
    let opening = tokio::time::sleep(first_head.unwrap_or(Duration::MAX));
    tokio::pin!(opening);
    let mut opened = first_head.is_none();
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = conn.as_mut().poll(cx) {
            return Poll::Ready(Ended::Served(r));
        }
        if !opened {
            if control.0.requests.load(Ordering::Relaxed) > 0 {
                opened = true;
            } else if opening.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ended::Dropped("no request head within the timeout"));
            }
        }
        if !shutting_down && closing.as_mut().poll(cx).is_ready() {
            shutting_down = true;
            shut_down(conn.as_mut());
            // The graceful shutdown may have ended an idle connection already.
            if let Poll::Ready(r) = conn.as_mut().poll(cx) {
                return Poll::Ready(Ended::Served(r));
            }
        }
        if shutting_down && !control.is_busy() {
            return Poll::Ready(Ended::Dropped("the server is shutting down"));
        }
        if drain.is_none() && control.poll_cancelled(cx) {
            drain = Some(Box::pin(tokio::time::sleep(CANCEL_DRAIN)));
            // The cancelled answer is the connection's last.
            shut_down(conn.as_mut());
        }
        if let Some(d) = &mut drain {
            if !control.is_busy() {
                drain = None;
            } else if d.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ended::Dropped(
                    "its work was cancelled and the peer did not take the answer",
                ));
            }
        }
        Poll::Pending
    })
    .await
}
