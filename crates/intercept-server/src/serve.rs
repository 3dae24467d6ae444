//! The accept loop shared by the interception server and other HTTP front ends (the
//! sidecar's control API).

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures_util::task::AtomicWaker;

use http::{Request, Response};
use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use intercept_core::{ChatDialect, Error};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::time::Instant;
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
    /// A connection with no request in progress this long after it opened (or after
    /// its previous answer, on a kept-alive connection) is closed (default 30 s): a
    /// request head must be complete within it. `None`: no limit.
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

/// The connection a request came on: [`serve_connections`] hands it to the function
/// that makes each connection's service.
///
/// A handler marks the connection [busy](Connection::busy) while it does work that
/// shutdown should wait for. A mark may also name what cancels that work
/// ([`Busy::cancelled_by`]): once that fires, the answer has [`CANCEL_DRAIN`] to reach
/// the peer, then the connection is dropped, whether or not the peer reads.
#[derive(Clone, Debug)]
pub struct Connection(Arc<Control>);

struct Control {
    /// Requests whose head was read (the service was called).
    requests: AtomicU64,
    /// Answers done: their body dropped (written out, or the request abandoned).
    answered: AtomicU64,
    /// When the last answer was done, in nanoseconds since `opened`.
    last_answer: AtomicU64,
    opened: Instant,
    /// Busy marks alive.
    busy: AtomicUsize,
    /// The marks that name what cancels their work, and how many there are.
    marks: Mutex<Vec<Mark>>,
    cancellable: AtomicUsize,
    next: AtomicU64,
    /// Set when a mark's cancellation may have fired, or a mark was added: the marks
    /// are polled (with `waker`) only then, not on every poll of the connection.
    signal: Arc<Signal>,
    waker: Waker,
    /// Whether the connection's task is polling it right now; a mark added from outside
    /// that poll wakes the task.
    polling: AtomicBool,
}

impl Default for Control {
    fn default() -> Self {
        let signal = Arc::new(Signal::default());
        Control {
            requests: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            last_answer: AtomicU64::new(0),
            opened: Instant::now(),
            busy: AtomicUsize::new(0),
            marks: Mutex::new(Vec::new()),
            cancellable: AtomicUsize::new(0),
            next: AtomicU64::new(0),
            waker: Waker::from(signal.clone()),
            signal,
            polling: AtomicBool::new(false),
        }
    }
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control")
            .field("requests", &self.requests)
            .field("answered", &self.answered)
            .field("busy", &self.busy)
            .finish_non_exhaustive()
    }
}

/// The waker the marks' cancellation futures are polled with: it flags the marks for a
/// poll and wakes the connection's task.
#[derive(Default)]
struct Signal {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Signal {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref()
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.task.wake();
    }
}

struct Mark {
    id: u64,
    cancelled: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl Connection {
    /// Marks the connection busy until the returned guard is dropped: shutdown lets
    /// it finish (a connection with no mark is closed at once).
    pub fn busy(&self) -> Busy {
        self.0.busy.fetch_add(1, Ordering::AcqRel);
        Busy {
            control: self.0.clone(),
            id: None,
        }
    }

    fn is_busy(&self) -> bool {
        self.0.busy.load(Ordering::Acquire) > 0
    }

    /// Whether the work of a mark was cancelled. Polls the marks' cancellation only if
    /// one woke (or a mark was added) since the last look.
    fn poll_cancelled(&self) -> bool {
        if !self.0.signal.woken.load(Ordering::Relaxed)
            || !self.0.signal.woken.swap(false, Ordering::SeqCst)
        {
            return false;
        }
        let mut cx = Context::from_waker(&self.0.waker);
        let mut marks = self.0.marks.lock();
        // Every mark is polled, so that each has its waker registered.
        marks.iter_mut().fold(false, |any, m| {
            m.cancelled.as_mut().poll(&mut cx).is_ready() | any
        })
    }

    /// The head of a request was read.
    fn request(&self) {
        self.0.requests.fetch_add(1, Ordering::AcqRel);
    }

    /// An answer is done (or abandoned).
    fn answered(&self) {
        let at = Instant::now().saturating_duration_since(self.0.opened);
        self.0.last_answer.store(
            at.as_nanos().min(u64::MAX as u128) as u64,
            Ordering::Release,
        );
        self.0.answered.fetch_add(1, Ordering::AcqRel);
    }

    /// Since when the connection has had no request in progress; `None` if one is.
    fn idle_since(&self) -> Option<Instant> {
        let answered = self.0.answered.load(Ordering::Acquire);
        if self.0.requests.load(Ordering::Acquire) > answered {
            return None;
        }
        let at = self.0.last_answer.load(Ordering::Acquire);
        Some(self.0.opened + Duration::from_nanos(at))
    }
}

/// A [`Connection`] marked busy; dropping it removes the mark.
#[derive(Debug)]
pub struct Busy {
    control: Arc<Control>,
    /// Set once the mark names what cancels its work.
    id: Option<u64>,
}

impl Busy {
    /// From now on, when `cancel` fires while this mark lives, the connection is
    /// dropped [`CANCEL_DRAIN`] later unless its answers are out by then.
    ///
    /// Work that answers with a body the connection writes while the work goes on (a
    /// stream) names its cancellation here: a peer that stops reading stops the
    /// connection from polling that body, so only the connection can end it. Work that
    /// ends its answer itself need not.
    pub fn cancelled_by(&mut self, cancel: CancellationToken) {
        let control = &self.control;
        let id = *self
            .id
            .get_or_insert_with(|| control.next.fetch_add(1, Ordering::Relaxed));
        control.marks.lock().push(Mark {
            id,
            cancelled: Box::pin(cancel.cancelled_owned()),
        });
        control.cancellable.fetch_add(1, Ordering::AcqRel);
        // The new mark is polled once, to register its waker: by the connection's
        // poll under way, or by one woken for it.
        control.signal.woken.store(true, Ordering::SeqCst);
        if !control.polling.load(Ordering::SeqCst) {
            control.signal.task.wake();
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            let mut marks = self.control.marks.lock();
            let before = marks.len();
            marks.retain(|m| m.id != id);
            let removed = before - marks.len();
            self.control
                .cancellable
                .fetch_sub(removed, Ordering::AcqRel);
        }
        self.control.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

pin_project_lite::pin_project! {
    /// An answer's body, which tells its connection when it is done (dropped).
    #[derive(Debug)]
    struct Counted<B> {
        #[pin]
        body: B,
        done: AnswerDone,
    }
}

impl<B: Body> Body for Counted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Counts an answer as done when dropped.
#[derive(Debug)]
struct AnswerDone(Connection);

impl Drop for AnswerDone {
    fn drop(&mut self) {
        self.0.answered();
    }
}

/// Serves every connection accepted on `listener` with the service `make_service`
/// makes for it, until `shutdown` resolves, then shuts down gracefully and returns.
///
/// - Each connection speaks HTTP/1.1 or HTTP/2 (prior knowledge), whichever the client
///   opens with, and has `TCP_NODELAY` set.
/// - `make_service` is called once per connection with the [`Connection`], which the
///   service may keep to mark the connection [busy](Connection::busy).
/// - A failed `accept` (out of file descriptors and the like) backs off: 5 ms, doubled
///   per failure in a row up to 1 s, reset by the next success; one warning when the
///   failures start and one line when they end, not one per failure.
/// - A request head must be complete within `options.header_read_timeout`, counted
///   from the connection's start or the end of the previous answer, else the connection
///   is closed: neither a dribbled head nor a silent or idle connection holds it. A
///   request in progress is never cut by it, however long its answer takes.
/// - At most `options.max_connections` connections are served at once; one beyond it
///   is answered `503 Service Unavailable` with `Retry-After: 1` and closed at once.
/// - A connection whose [busy](Connection::busy) work is
///   [cancelled](Busy::cancelled_by) is dropped [`CANCEL_DRAIN`] later if its answer
///   has not gone out by then, so a peer that stops reading never holds that work.
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
///     move |_connection: &intercept_server::Connection| service,
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
pub async fn serve_connections<M, S, B>(
    listener: TcpListener,
    make_service: M,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) where
    M: Fn(&Connection) -> S,
    S: Service<Request<Incoming>, Response = Response<B>> + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    let served = Arc::new(AtomicUsize::new(0));
    serve_counted(listener, make_service, options, shutdown, served).await
}

/// [`serve_connections`], with the connections served counted in `served`, which
/// several accept loops may share: [`ServeOptions::max_connections`] caps their sum.
pub(crate) async fn serve_counted<M, S, B>(
    listener: TcpListener,
    make_service: M,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
    served: Arc<AtomicUsize>,
) where
    M: Fn(&Connection) -> S,
    S: Service<Request<Incoming>, Response = Response<B>> + Send + Sync + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    // hyper's own header-read timeout is not used: it arms a timer for every request.
    // `watch` keeps one per connection, moved only when it fires.
    let builder = auto::Builder::new(TokioExecutor::new());
    // Every connection task is owned here and awaited before the loop returns.
    let connections = TaskTracker::new();
    let refusing = TaskTracker::new();
    let refusal = Arc::new(over_capacity(options.max_connections.unwrap_or(0)));
    let closing = CancellationToken::new();
    tokio::pin!(shutdown);
    let mut acceptor = Acceptor::new(listener);
    while let Some((stream, peer)) = acceptor.next(shutdown.as_mut()).await {
        let slot = ServedSlot::take(&served);
        if options
            .max_connections
            .is_some_and(|max| slot.before >= max)
        {
            drop(slot);
            if refusing.len() < MAX_REFUSING {
                refusing.spawn(refuse(stream, refusal.clone()));
            }
            debug!(%peer, "connection refused: max_connections reached");
            continue;
        }
        let _ = stream.set_nodelay(true);
        let control = Connection(Arc::default());
        let service = make_service(&control);
        let counted = control.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            counted.request();
            let done = AnswerDone(counted.clone());
            let answer = service.call(req);
            async move {
                let resp = answer.await?;
                Ok::<_, S::Error>(resp.map(|body| Counted { body, done }))
            }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let closing = closing.clone().cancelled_owned();
        connections.spawn(async move {
            let _slot = slot;
            match watch(
                conn,
                |c| c.graceful_shutdown(),
                control,
                closing,
                options.header_read_timeout,
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

/// A connection counted among those served (by every accept loop that shares the count)
/// until dropped.
struct ServedSlot {
    served: Arc<AtomicUsize>,
    /// Connections served before this one.
    before: usize,
}

impl ServedSlot {
    fn take(served: &Arc<AtomicUsize>) -> Self {
        ServedSlot {
            before: served.fetch_add(1, Ordering::AcqRel),
            served: served.clone(),
        }
    }
}

impl Drop for ServedSlot {
    fn drop(&mut self) {
        self.served.fetch_sub(1, Ordering::AcqRel);
    }
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

/// Serves `conn` until it ends, it is shut down while not busy, it has no request in
/// progress for `head_timeout`, or the work of one of its busy marks was cancelled and
/// [`CANCEL_DRAIN`] passed.
async fn watch<C, E>(
    conn: C,
    shut_down: impl Fn(Pin<&mut C>),
    control: Connection,
    closing: WaitForCancellationFutureOwned,
    head_timeout: Option<Duration>,
) -> Ended<E>
where
    C: Future<Output = Result<(), E>>,
{
    tokio::pin!(conn);
    tokio::pin!(closing);
    let mut shutting_down = false;
    let mut drain: Option<Pin<Box<tokio::time::Sleep>>> = None;
    // One timer per connection for the header-read timeout. It is not moved per
    // request: when it fires, it is set again from when the connection went idle, or
    // for a whole timeout if a request is in progress.
    let head = tokio::time::sleep(head_timeout.unwrap_or(Duration::MAX));
    tokio::pin!(head);
    let mut head_expired = head_timeout.is_none();
    let mut head_armed = false;
    let mut registered = false;
    std::future::poll_fn(|cx| loop {
        control.0.polling.store(true, Ordering::SeqCst);
        if let Some(ended) = watch_once(
            cx,
            conn.as_mut(),
            &shut_down,
            &control,
            closing.as_mut(),
            &mut shutting_down,
            &mut drain,
            (
                head.as_mut(),
                head_timeout,
                &mut head_expired,
                &mut head_armed,
            ),
        ) {
            return Poll::Ready(ended);
        }
        // The marks' waker wakes this task: registered once, and again on every poll
        // while a mark names a cancellation (a wake takes it).
        if !registered || control.0.cancellable.load(Ordering::Acquire) > 0 {
            control.0.signal.task.register(cx.waker());
            registered = true;
        }
        control.0.polling.store(false, Ordering::SeqCst);
        // A mark added from another task after the look at the marks: look again.
        if drain.is_some() || !control.0.signal.woken.load(Ordering::SeqCst) {
            return Poll::Pending;
        }
    })
    .await
}

/// One look at a connection for [`watch`]; `Some` once it has ended.
#[allow(clippy::too_many_arguments)]
fn watch_once<C, E>(
    cx: &mut Context<'_>,
    mut conn: Pin<&mut C>,
    shut_down: &impl Fn(Pin<&mut C>),
    control: &Connection,
    closing: Pin<&mut WaitForCancellationFutureOwned>,
    shutting_down: &mut bool,
    drain: &mut Option<Pin<Box<tokio::time::Sleep>>>,
    (mut head, head_timeout, head_expired, head_armed): (
        Pin<&mut tokio::time::Sleep>,
        Option<Duration>,
        &mut bool,
        &mut bool,
    ),
) -> Option<Ended<E>>
where
    C: Future<Output = Result<(), E>>,
{
    if let Poll::Ready(r) = conn.as_mut().poll(cx) {
        return Some(Ended::Served(r));
    }
    if let (false, Some(limit)) = (*head_expired, head_timeout) {
        // The timer is polled only when it may have fired (and once after each reset,
        // to register): its waker, this task's, does not change between polls.
        while (head.is_elapsed() || !*head_armed) && {
            *head_armed = true;
            head.as_mut().poll(cx).is_ready()
        } {
            let now = Instant::now();
            match control.idle_since() {
                Some(since) if now >= since + limit => {
                    if control.0.requests.load(Ordering::Acquire) == 0 {
                        return Some(Ended::Dropped("no request head within the timeout"));
                    }
                    // A kept-alive connection: closed now if it waits for a head (or
                    // has half of one), after the answer if that is still going out.
                    *head_expired = true;
                    shut_down(conn.as_mut());
                    if let Poll::Ready(r) = conn.as_mut().poll(cx) {
                        return Some(Ended::Served(r));
                    }
                    break;
                }
                Some(since) => head.as_mut().reset(since + limit),
                None => head.as_mut().reset(now + limit),
            }
            *head_armed = false;
        }
    }
    if !*shutting_down && closing.poll(cx).is_ready() {
        *shutting_down = true;
        shut_down(conn.as_mut());
        // The graceful shutdown may have ended an idle connection already.
        if let Poll::Ready(r) = conn.as_mut().poll(cx) {
            return Some(Ended::Served(r));
        }
    }
    if *shutting_down && !control.is_busy() {
        return Some(Ended::Dropped("the server is shutting down"));
    }
    if drain.is_none() && control.poll_cancelled() {
        *drain = Some(Box::pin(tokio::time::sleep(CANCEL_DRAIN)));
        // The cancelled answer is the connection's last.
        shut_down(conn.as_mut());
    }
    if let Some(d) = drain {
        if !control.is_busy() {
            *drain = None;
        } else if d.as_mut().poll(cx).is_ready() {
            return Some(Ended::Dropped(
                "its work was cancelled and the peer did not take the answer",
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use bytes::Bytes;
    use http_body::Frame;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    /// Generous bound for what must happen soon on a loaded machine.
    const BOUND: Duration = Duration::from_secs(20);

    /// A body that never ends and never sends a byte.
    fn endless(
    ) -> http_body_util::StreamBody<futures_util::stream::Pending<Result<Frame<Bytes>, Infallible>>>
    {
        http_body_util::StreamBody::new(futures_util::stream::pending())
    }

    /// Reads from `tcp` until the peer closes; how long that took.
    async fn closed_after(tcp: &mut TcpStream) -> Duration {
        let start = Instant::now();
        let mut buf = vec![0u8; 4096];
        tokio::time::timeout(BOUND, async {
            while !matches!(tcp.read(&mut buf).await, Ok(0) | Err(_)) {}
        })
        .await
        .expect("the server closed the connection");
        start.elapsed()
    }

    /// Reads one whole answer (a `content-length` body) from `tcp`.
    async fn read_answer(tcp: &mut TcpStream) -> String {
        let mut got = Vec::new();
        let mut buf = vec![0u8; 4096];
        tokio::time::timeout(BOUND, async {
            loop {
                let text = String::from_utf8_lossy(&got).into_owned();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length: "))
                        .and_then(|n| n.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if body.len() >= len {
                        return text;
                    }
                }
                let n = tcp.read(&mut buf).await.expect("read");
                assert!(n > 0, "closed mid-answer: {text:?}");
                got.extend_from_slice(&buf[..n]);
            }
        })
        .await
        .expect("the answer arrives")
    }

    /// A mark that names its cancellation from another task, while the connection's
    /// task sleeps, is still watched: once cancelled, the connection (whose answer
    /// never ends) is dropped after the drain.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mark_cancelled_from_another_task_ends_its_stuck_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let cancel = CancellationToken::new();
        let (marked_tx, mut marked) = tokio::sync::mpsc::unbounded_channel::<()>();
        let stop = CancellationToken::new();
        let token = cancel.clone();
        let holders = TaskTracker::new();
        let tasks = holders.clone();
        let server = tokio::spawn(serve_connections(
            listener,
            move |connection: &Connection| {
                let connection = connection.clone();
                let (token, marked_tx, tasks) = (token.clone(), marked_tx.clone(), tasks.clone());
                hyper::service::service_fn(move |_req: Request<Incoming>| {
                    let mut busy = connection.busy();
                    let (token, marked_tx) = (token.clone(), marked_tx.clone());
                    tasks.spawn(async move {
                        // Well after the answer's head went out: the connection's task
                        // is asleep, waiting for a body that never comes.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        busy.cancelled_by(token.clone());
                        let _ = marked_tx.send(());
                        token.cancelled().await;
                        // Still busy after the cancellation: only the drain ends it.
                        tokio::time::sleep(BOUND).await;
                        drop(busy);
                    });
                    async { Ok::<_, Infallible>(Response::new(endless())) }
                })
            },
            ServeOptions::default(),
            stop.clone().cancelled_owned(),
        ));
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8; 1];
            tcp.read_exact(&mut byte).await.expect("the answer's head");
            head.push(byte[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
        tokio::time::timeout(BOUND, marked.recv())
            .await
            .expect("the mark names its cancellation");
        // Not cancelled yet: the answer may go on for ever.
        let mut probe = [0u8; 1];
        assert!(
            tokio::time::timeout(Duration::from_millis(300), tcp.read(&mut probe))
                .await
                .is_err(),
            "the connection ended before its work was cancelled"
        );
        cancel.cancel();
        let took = closed_after(&mut tcp).await;
        assert!(
            took >= CANCEL_DRAIN - Duration::from_millis(100),
            "dropped before the drain: {took:?}"
        );
        stop.cancel();
        tokio::time::timeout(BOUND, server)
            .await
            .expect("the server stops")
            .expect("the accept loop");
        holders.close();
    }

    /// The header-read timeout counts from the end of the previous answer: requests
    /// that keep coming within it keep the connection, for many times the timeout; one
    /// that does not come closes it, no sooner than the timeout.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_head_timeout_counts_from_the_previous_answer() {
        let limit = Duration::from_millis(400);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let server = tokio::spawn(serve_connections(
            listener,
            |_: &Connection| {
                hyper::service::service_fn(|_req: Request<Incoming>| async {
                    Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                        Bytes::from_static(b"ok"),
                    )))
                })
            },
            ServeOptions {
                header_read_timeout: Some(limit),
                ..ServeOptions::default()
            },
            stop.clone().cancelled_owned(),
        ));
        let mut tcp = TcpStream::connect(addr).await.expect("connect");
        let start = Instant::now();
        let mut answers = 0;
        // Six times the timeout, a request every half of it.
        while start.elapsed() < limit * 6 {
            tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
                .await
                .expect("write");
            let answer = read_answer(&mut tcp).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
            answers += 1;
            tokio::time::sleep(limit / 2).await;
        }
        assert!(answers >= 6, "{answers} answers");
        // Half a head, then nothing: closed once the timeout has passed since the
        // previous answer.
        tcp.write_all(b"GET / HT").await.expect("write");
        let took = closed_after(&mut tcp).await;
        assert!(took >= limit / 2 - Duration::from_millis(50), "{took:?}");

        // HTTP/2 alike: a connection that served a request and then stays idle ends
        // once the timeout has passed, and not before.
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let (mut sender, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .expect("h2 handshake");
        let conn = tokio::spawn(conn);
        let req = Request::get(format!("http://{addr}/"))
            .body(http_body_util::Empty::<Bytes>::new())
            .expect("request");
        let resp = sender.send_request(req).await.expect("h2 answer");
        assert_eq!(resp.status(), 200);
        drop(resp);
        let idle_since = Instant::now();
        let ended = tokio::time::timeout(BOUND, conn)
            .await
            .expect("the idle HTTP/2 connection ends");
        assert!(ended.is_ok(), "{ended:?}");
        assert!(
            idle_since.elapsed() >= limit - Duration::from_millis(50),
            "closed before the timeout: {:?}",
            idle_since.elapsed()
        );
        stop.cancel();
        tokio::time::timeout(BOUND, server)
            .await
            .expect("the server stops")
            .expect("the accept loop");
    }
}
