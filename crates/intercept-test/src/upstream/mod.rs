//! A scriptable mock of an OpenAI-compatible model server (vLLM-like).
//!
//! [`MockUpstream`] is a real HTTP server on `127.0.0.1` (HTTP/1.1 with keep-alive, and
//! h2c) that answers `POST /v1/chat/completions`. With nothing scripted it *echoes*:
//!
//! - the reply is `echo: <text of the last user message>`;
//! - if the last message is a `tool` message, the reply is `tool said: <its content>`;
//! - if the request offers `tools` and the last user message contains `use a tool` (any
//!   case), the reply is one call of the first tool, id `call_N`, arguments
//!   `{"query":"<last user text>"}`, content `null`, finish reason `tool_calls`;
//! - usage counts whitespace-separated words: prompt = words of every message's text +
//!   4 per message, completion = words of the reply (content, reasoning, tool-call names
//!   and arguments);
//! - ids are `chatcmpl-mock-N`, `created` is [`MockConfig::created`], `model` is the
//!   request's (or [`MockConfig::default_model`]).
//!
//! A request with `"stream": true` gets `text/event-stream`: a chunk with
//! `delta: {"role":"assistant","content":""}`, the reasoning (`delta.reasoning_content`)
//! and content split into [`MockConfig::chunks`] pieces, each tool call as OpenAI streams
//! it (a head delta with index, id, type, name and empty arguments, then argument
//! fragments), a chunk with the finish reason, a usage chunk with empty `choices` when
//! `stream_options.include_usage` is true, and `data: [DONE]`.
//!
//! [`MockUpstream::push`] queues [`Reply`]s. Every `POST`, whatever its path, takes the
//! next one (FIFO); with the queue empty the echo applies to `/v1/chat/completions`,
//! other paths get a 404 and other methods a 405 (an OpenAI-shaped error either way),
//! and a body the echo cannot read gets a 400 with type `invalid_request_error`.
//!
//! Every request is counted and (unless [`MockConfig::log_requests`] is off) logged as a
//! [`ReceivedRequest`]; accepted TCP connections are counted too, so tests can see
//! whether a client reused connections.
//!
//! The server's tasks (accept loop, connections, HTTP/2 streams) belong to the
//! `MockUpstream`: [`MockUpstream::shutdown`] stops them and waits for them, dropping the
//! value stops them without waiting. Either way open connections are closed at once:
//! streams in flight are cut and [`Reply::hang`] requests see the connection close.

mod body;
mod chat;
mod config;
mod log;
mod reply;
mod server;

use std::collections::VecDeque;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use config::MockConfig;
pub use log::{ReceivedRequest, RequestBody};
pub use reply::{Reply, ToolCall, Usage, CONTEXT_LENGTH_MESSAGE};

/// The path of the Chat Completions route.
pub const CHAT_COMPLETIONS_PATH: &str = "/v1/chat/completions";

/// A running mock model server. See the [module docs](self) for what it answers.
///
/// ```
/// use intercept_test::{MockUpstream, Reply};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::io::Result<()> {
/// let upstream = MockUpstream::start().await?;
/// upstream.push_many([Reply::error(503, "warming up").with_retry_after(1), Reply::text("ready")]);
/// assert_eq!(upstream.base_url(), format!("http://{}/v1", upstream.addr()));
/// // ... point a client at upstream.base_url() ...
/// upstream.shutdown().await;
/// # Ok(())
/// # }
/// ```
pub struct MockUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    tracker: TaskTracker,
}

/// State shared by the handle, the accept loop and the request handlers.
pub(crate) struct Shared {
    config: MockConfig,
    queue: Mutex<VecDeque<Reply>>,
    /// Length of `queue`, readable without the lock (the echo path skips the lock).
    queued: AtomicUsize,
    log: Mutex<Vec<ReceivedRequest>>,
    requests: AtomicUsize,
    connections: AtomicUsize,
    open_connections: AtomicUsize,
    completion_ids: AtomicU64,
    call_ids: AtomicU64,
    /// Tasks in `wait_until`; `notify` is only touched when this is non-zero.
    waiters: AtomicUsize,
    notify: Notify,
    /// Cancelled on shutdown or drop: stops every task of the server.
    token: CancellationToken,
}

impl Shared {
    fn new(config: MockConfig) -> Self {
        Self {
            config,
            queue: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
            log: Mutex::new(Vec::new()),
            requests: AtomicUsize::new(0),
            connections: AtomicUsize::new(0),
            open_connections: AtomicUsize::new(0),
            completion_ids: AtomicU64::new(0),
            call_ids: AtomicU64::new(0),
            waiters: AtomicUsize::new(0),
            notify: Notify::new(),
            token: CancellationToken::new(),
        }
    }

    fn pop_reply(&self) -> Option<Reply> {
        if self.queued.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut queue = self.queue.lock();
        let reply = queue.pop_front();
        self.queued.store(queue.len(), Ordering::Release);
        reply
    }

    /// Wakes the tasks in `wait_until` after a counter changed (SeqCst, see there).
    fn wake(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }

    /// Waits until `done()` holds; `done` must read counters that are changed (SeqCst)
    /// before `wake` is called.
    async fn wait_until(&self, done: impl Fn() -> bool) {
        struct Registered<'a>(&'a AtomicUsize);
        impl Drop for Registered<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Register with `notify` before announcing ourselves in `waiters`, and announce
            // before checking: a change either is seen by `done()` or sees `waiters > 0`
            // and finds us registered.
            notified.as_mut().enable();
            self.waiters.fetch_add(1, Ordering::SeqCst);
            let _registered = Registered(&self.waiters);
            if done() {
                return;
            }
            notified.await;
        }
    }
}

impl MockUpstream {
    /// Starts a mock with the default [`MockConfig`] on `127.0.0.1` and a free port.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with(MockConfig::default()).await
    }

    /// Starts a mock with `config` on `127.0.0.1` and a free port.
    pub async fn start_with(config: MockConfig) -> std::io::Result<Self> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        Self::from_listener(listener, config)
    }

    /// Serves on a listener bound by the caller. Must be called inside a tokio runtime.
    pub fn from_listener(listener: TcpListener, config: MockConfig) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(config));
        let tracker = TaskTracker::new();
        tracker.spawn(server::accept_loop(
            listener,
            Arc::clone(&shared),
            tracker.clone(),
        ));
        tracker.close();
        Ok(Self {
            addr,
            shared,
            tracker,
        })
    }

    /// The address the mock listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The OpenAI base URL, `http://127.0.0.1:<port>/v1` (what `OPENAI_BASE_URL` takes).
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The URL of the Chat Completions route, `<base_url>/chat/completions`.
    pub fn chat_completions_url(&self) -> String {
        format!("http://{}{CHAT_COMPLETIONS_PATH}", self.addr)
    }

    /// The configuration the mock runs with.
    pub fn config(&self) -> &MockConfig {
        &self.shared.config
    }

    /// Queues a reply for a later request (FIFO).
    pub fn push(&self, reply: Reply) {
        self.push_many([reply]);
    }

    /// Queues several replies, in order.
    pub fn push_many(&self, replies: impl IntoIterator<Item = Reply>) {
        let mut queue = self.shared.queue.lock();
        queue.extend(replies);
        self.shared.queued.store(queue.len(), Ordering::Release);
    }

    /// Number of queued replies not yet used.
    pub fn pending_replies(&self) -> usize {
        self.shared.queued.load(Ordering::Acquire)
    }

    /// Drops every queued reply; later requests get the echo.
    pub fn clear_replies(&self) {
        let mut queue = self.shared.queue.lock();
        queue.clear();
        self.shared.queued.store(0, Ordering::Release);
    }

    /// A copy of the request log, oldest first (empty when
    /// [`MockConfig::log_requests`] is off).
    pub fn requests(&self) -> Vec<ReceivedRequest> {
        self.shared.log.lock().clone()
    }

    /// Takes the request log, leaving it empty. [`request_count`](Self::request_count)
    /// is not reset.
    pub fn take_requests(&self) -> Vec<ReceivedRequest> {
        std::mem::take(&mut *self.shared.log.lock())
    }

    /// The most recent logged request.
    pub fn last_request(&self) -> Option<ReceivedRequest> {
        self.shared.log.lock().last().cloned()
    }

    /// Number of requests received so far (counted once the body is read, before the
    /// reply is made; with or without the log).
    pub fn request_count(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` requests were received. When it returns with the log on,
    /// the first `n` requests are in the log (unless taken).
    pub async fn wait_for_requests(&self, n: usize) {
        let shared = &self.shared;
        shared
            .wait_until(|| shared.requests.load(Ordering::SeqCst) >= n)
            .await;
    }

    /// Number of TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Number of TCP connections open now.
    pub fn open_connections(&self) -> usize {
        self.shared.open_connections.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` TCP connections were accepted.
    pub async fn wait_for_connections(&self, n: usize) {
        let shared = &self.shared;
        shared
            .wait_until(|| shared.connections.load(Ordering::SeqCst) >= n)
            .await;
    }

    /// Stops the server: no more connections are accepted, open connections are closed
    /// (streams in flight are cut, hanging requests released), and every task of the
    /// server has ended when this returns.
    pub async fn shutdown(self) {
        self.shared.token.cancel();
        self.tracker.wait().await;
    }
}

impl Drop for MockUpstream {
    /// Stops the server's tasks (without waiting for them to end).
    fn drop(&mut self) {
        self.shared.token.cancel();
    }
}

impl fmt::Debug for MockUpstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockUpstream")
            .field("addr", &self.addr)
            .field("requests", &self.request_count())
            .field("connections", &self.connections())
            .field("pending_replies", &self.pending_replies())
            .field("config", &self.shared.config)
            .finish()
    }
}
