//! The interception server: accept loop, routing, lifecycle.

use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use intercept_core::internal::join_errors;
use intercept_core::{
    CallInfo, ChatDialect, CompletionsDialect, Dialect, Endpoint, Error, HookAction, Interception,
    JsonBody, MessagesDialect, PauseMode, PauseStatus, ResponsesDialect, SecretStr, Session, Slot,
    SlotGuard, SlotRelease,
};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::call::Call;
use crate::config::ServerConfig;
use crate::detach::ResponseBody;
use crate::detach::{error_response, event_stream, flat_error, json_response, plain_error};
use crate::preamble::{authenticate, close_after, read_body, refuse_unread, Shared, Stats};
use crate::registry::{Entry, InflightGuard, Registry};
use crate::upstream::{read_all, UpstreamClient};

#[derive(Debug)]
struct Running {
    local_addr: SocketAddr,
    endpoint: Option<Arc<dyn Endpoint>>,
    stop_accepting: CancellationToken,
    /// The accept loops, one per event loop.
    accept_loop: TaskTracker,
    /// Each event loop's state (its calls are tracked there).
    loops: Vec<Arc<Shared>>,
}

impl Drop for Running {
    /// A server dropped without [`Interception::stop`] stops accepting; its connections
    /// end as at shutdown (idle ones at once, busy ones when their work is done).
    fn drop(&mut self) {
        self.stop_accepting.cancel();
    }
}

/// One HTTP server that multiplexes many rollouts: each acquired slot gets fresh model
/// and state secrets, and every call is routed by its secret.
///
/// ```no_run
/// use std::sync::Arc;
/// use intercept_core::{Interception, RolloutSession, SessionConfig, Upstream};
/// use intercept_server::{InterceptionServer, ServerConfig};
///
/// # async fn run() -> Result<(), intercept_core::Error> {
/// let server = InterceptionServer::new(ServerConfig::default())?;
/// server.start().await?;
/// let upstream = Upstream::new("http://127.0.0.1:8000/v1");
/// let session = Arc::new(RolloutSession::new(SessionConfig::new("rollout-1", "policy", upstream)));
/// let guard = server.acquire(session.clone()).await?;
/// // Start the harness with guard.harness_env(); when it exits:
/// guard.close().await;
/// println!("{} calls", session.trace().calls.len());
/// server.stop().await
/// # }
/// ```
#[derive(Clone)]
pub struct InterceptionServer {
    shared: Arc<Shared>,
    running: Arc<Mutex<Option<Running>>>,
}

impl fmt::Debug for InterceptionServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InterceptionServer")
            .field("local_addr", &self.local_addr())
            .field("load", &self.shared.registry.load())
            .finish()
    }
}

impl InterceptionServer {
    /// A server that is not started yet.
    pub fn new(config: ServerConfig) -> Result<Self, Error> {
        let upstream = UpstreamClient::new(&config)?;
        let shared = Shared {
            registry: Arc::new(Registry::new(config.released_secrets)),
            upstream,
            tasks: TaskTracker::new(),
            calls_cancel: CancellationToken::new(),
            stats: Arc::new(Stats::default()),
            gate: Arc::new(crate::pause::PauseGate::new()),
            engines: Arc::new(crate::engines::EngineHealth::new(config.engine_retry_after)),
            dialects: vec![
                Arc::new(ChatDialect),
                Arc::new(ResponsesDialect),
                Arc::new(MessagesDialect),
                Arc::new(CompletionsDialect),
            ],
            config,
            _loops: None,
        };
        Ok(InterceptionServer {
            shared: Arc::new(shared),
            running: Arc::new(Mutex::new(None)),
        })
    }

    /// Starts serving on a listener the caller bound (tests, sidecars). With a tunnel,
    /// the listener's port is exposed through it. Every event loop accepts on this one
    /// socket (see [`ServerConfig::workers`]).
    pub async fn start_on(&self, listener: TcpListener) -> Result<(), Error> {
        let listener = listener
            .into_std()
            .map_err(|e| Error::Internal(format!("cannot take over the listener: {e}")))?;
        let listeners = crate::loops::share(listener, self.workers())
            .map_err(|e| Error::Internal(format!("cannot share the listener: {e}")))?;
        self.start_with(listeners).await
    }

    /// The event loops this server runs on: [`ServerConfig::workers`], or one per core
    /// the process may use.
    fn workers(&self) -> usize {
        match self.shared.config.workers {
            0 => crate::loops::default_workers(),
            n => n,
        }
    }

    /// Starts one accept loop per listener, each on an event loop of its own.
    async fn start_with(&self, listeners: Vec<std::net::TcpListener>) -> Result<(), Error> {
        if self.running.lock().is_some() {
            return Err(Error::Conflict("the server is already started".into()));
        }
        let local_addr = listeners
            .first()
            .ok_or_else(|| Error::Internal("no listener to serve".into()))?
            .local_addr()
            .map_err(|e| Error::Internal(format!("listener has no address: {e}")))?;
        let group = crate::loops::group(listeners.len())
            .map_err(|e| Error::Internal(format!("cannot start the server's event loops: {e}")))?;
        let stop_accepting = CancellationToken::new();
        let accept_loop = TaskTracker::new();
        // Connections count against `max_connections` across every loop.
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut loops = Vec::with_capacity(listeners.len());
        for (listener, runtime) in listeners.into_iter().zip(group.handles()) {
            let shared = Arc::new(self.shared.for_loop(&group));
            loops.push(shared.clone());
            accept_loop.spawn_on(
                accept(
                    listener,
                    shared,
                    stop_accepting.clone(),
                    connections.clone(),
                ),
                runtime,
            );
        }
        accept_loop.close();
        let endpoint = match &self.shared.config.tunnel {
            Some(tunnel) => match tunnel.expose(local_addr.port()).await {
                Ok(e) => Some(e),
                Err(e) => {
                    stop_accepting.cancel();
                    accept_loop.wait().await;
                    return Err(e);
                }
            },
            None => None,
        };
        let running = Running {
            local_addr,
            endpoint,
            stop_accepting,
            accept_loop,
            loops,
        };
        let url = running
            .endpoint
            .as_ref()
            .map(|e| e.url())
            .unwrap_or_else(|| format!("http://{local_addr}"));
        info!(%url, loops = running.loops.len(), "interception up");
        *self.running.lock() = Some(running);
        Ok(())
    }

    /// The local address, once started.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.running.lock().as_ref().map(|r| r.local_addr)
    }

    /// The public base URL (the tunnel's current URL, or `http://<local addr>`).
    pub fn base_url(&self) -> Option<String> {
        let running = self.running.lock();
        let r = running.as_ref()?;
        Some(match &r.endpoint {
            Some(e) => e.url(),
            None => format!("http://{}", r.local_addr),
        })
    }

    /// The tunnel endpoint, if the server is exposed through one.
    pub fn endpoint(&self) -> Option<Arc<dyn Endpoint>> {
        self.running
            .lock()
            .as_ref()
            .and_then(|r| r.endpoint.clone())
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Sets the pause state and epoch outright: pools use it to keep every server in
    /// step (a server started during a pause starts paused, in the pool's epoch).
    pub fn sync_pause(&self, mode: Option<PauseMode>, epoch: u64) -> PauseStatus {
        self.shared.gate.sync(mode, epoch)
    }

    /// Pause state, epoch, admitted calls in flight and held calls.
    pub fn pause_status(&self) -> PauseStatus {
        self.shared.gate.status()
    }

    /// Waits until no admitted model call is in flight (streams still relaying count).
    /// Paired with [`Interception::pause`]: once this returns, no call is being
    /// served and none is admitted until resume.
    pub async fn wait_idle(&self) {
        self.shared.gate.idle().await
    }

    /// Calls in flight across all sessions.
    pub fn inflight(&self) -> usize {
        self.shared
            .registry
            .entries()
            .iter()
            .map(|e| e.inflight())
            .sum()
    }
}

#[async_trait]
impl Interception for InterceptionServer {
    async fn start(&self) -> Result<(), Error> {
        let addr = match (self.shared.config.listen, &self.shared.config.tunnel) {
            (Some(addr), _) => addr,
            (None, Some(t)) => {
                let b = t.bind_addr();
                SocketAddr::new(b.host, b.port)
            }
            (None, None) => SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let listeners = crate::loops::listen(addr, self.workers())
            .map_err(|e| Error::Internal(format!("cannot listen on {addr}: {e}")))?;
        self.start_with(listeners).await
    }

    async fn stop(&self) -> Result<(), Error> {
        let Some(running) = self.running.lock().take() else {
            return Ok(());
        };
        running.stop_accepting.cancel();
        let grace = self.shared.config.shutdown_grace;
        // The calls of every loop, and the control side's background seals.
        let trackers: Vec<TaskTracker> = std::iter::once(&self.shared)
            .chain(&running.loops)
            .map(|s| s.tasks.clone())
            .collect();
        for tasks in &trackers {
            tasks.close();
        }
        let all_done = || async {
            for tasks in &trackers {
                tasks.wait().await;
            }
        };
        if tokio::time::timeout(grace, all_done()).await.is_err() {
            warn!(
                grace_s = grace.as_secs_f64(),
                "calls still in flight after the grace period; cancelling them"
            );
            self.shared.calls_cancel.cancel();
            all_done().await;
        }
        for entry in self.shared.registry.entries() {
            self.shared.registry.release(&entry);
            entry.seal().await;
        }
        let mut errors = Vec::new();
        if let Some(endpoint) = &running.endpoint {
            if let Err(e) = endpoint.teardown().await {
                errors.push(e);
            }
        }
        // Connections still open (idle keep-alive) end with the accept loop.
        running.accept_loop.wait().await;
        info!(addr = %running.local_addr, "interception down");
        join_errors(errors)
    }

    async fn acquire(&self, session: Arc<dyn Session>) -> Result<SlotGuard, Error> {
        let base_url = match self.endpoint() {
            Some(endpoint) => endpoint.refresh().await?,
            None => self.base_url().ok_or_else(|| {
                Error::Conflict("the server is not started: call start() first".into())
            })?,
        };
        let tito = match session.tokens() {
            Some(config) => {
                let config = config.clone();
                let loaded =
                    tokio::task::spawn_blocking(move || crate::tokens::Tito::load(&config))
                        .await
                        .map_err(|e| {
                            Error::Internal(format!("loading the tokenizer failed: {e}"))
                        })??;
                Some(Arc::new(loaded))
            }
            None => None,
        };
        let mut entry = Entry::new(session, self.shared.calls_cancel.child_token());
        entry.tito = tito;
        let entry = Arc::new(entry);
        if let Some(existing) = self.shared.registry.by_id(entry.session.id()) {
            if !existing.is_released() {
                debug!(
                    session = entry.session.id(),
                    "a session with this id is already registered"
                );
            }
        }
        self.shared.registry.insert(entry.clone());
        let slot = Slot {
            base_url,
            model_secret: entry.model_secret.clone(),
            state_secret: entry.state_secret.clone(),
        };
        debug!(
            session = entry.session.id(),
            load = self.shared.registry.load(),
            "session registered"
        );
        let guard = SlotGuard::new(
            slot,
            Box::new(Release {
                shared: self.shared.clone(),
                entry,
            }),
        );
        Ok(match self.endpoint() {
            Some(endpoint) => guard.with_endpoint(endpoint),
            None => guard,
        })
    }

    fn load(&self) -> usize {
        self.shared.registry.load()
    }

    /// This server, once started: its base URL, load, and its endpoint's health (true
    /// without a tunnel). Empty before start and after stop.
    async fn servers(&self) -> Vec<intercept_core::ServerStatus> {
        let Some(base_url) = self.base_url() else {
            return Vec::new();
        };
        let healthy = match self.endpoint() {
            Some(endpoint) => endpoint.health().await.is_healthy(),
            None => true,
        };
        vec![intercept_core::ServerStatus {
            base_url: Some(base_url),
            load: self.shared.registry.load(),
            healthy,
        }]
    }

    fn inflight(&self) -> usize {
        InterceptionServer::inflight(self)
    }

    /// Pauses new model calls; returns at once (never fails). Await
    /// [`InterceptionServer::wait_idle`] to know when no call is being served.
    async fn pause(&self, mode: PauseMode) -> Result<PauseStatus, Error> {
        let status = self.shared.gate.pause(mode);
        info!(mode = ?mode.kind(), inflight = status.inflight, epoch = status.epoch, "model calls paused");
        Ok(status)
    }

    /// Resumes model calls; the pause epoch goes up by one if the server was paused
    /// (never fails).
    async fn resume(&self) -> Result<PauseStatus, Error> {
        let status = self.shared.gate.resume();
        info!(
            epoch = status.epoch,
            held = status.held,
            "model calls resumed"
        );
        Ok(status)
    }

    fn pause_status(&self) -> PauseStatus {
        InterceptionServer::pause_status(self)
    }
}

/// Frees one slot.
#[derive(Debug)]
struct Release {
    shared: Arc<Shared>,
    entry: Arc<Entry>,
}

#[async_trait]
impl SlotRelease for Release {
    fn release_now(&self) {
        self.shared.registry.release(&self.entry);
        if !self.entry.try_seal() {
            let entry = self.entry.clone();
            // The tracker may already be closed during shutdown; spawning still works and
            // stop() seals every entry itself.
            self.shared.tasks.spawn(async move { entry.seal().await });
        }
    }

    async fn release(&self) {
        self.shared.registry.release(&self.entry);
        self.entry.seal().await;
    }
}

/// One event loop's accept loop: serves the connections `listener` accepts, on this loop,
/// until `stop`; `connections` counts those of every loop against `max_connections`.
async fn accept(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    stop: CancellationToken,
    connections: Arc<std::sync::atomic::AtomicUsize>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            warn!(error = %e, "an event loop cannot accept on the server's socket");
            return;
        }
    };
    let options = crate::serve::ServeOptions {
        header_read_timeout: shared.config.header_read_timeout,
        max_connections: shared.config.max_connections,
    };
    // The request's future is boxed: hyper's dispatcher would otherwise copy it by value
    // as it stores it. It is ~3 KiB, a model call's stages up to handing the call over
    // (`handle` boxes its rarer, larger routes, so that they do not set its size).
    let service = move |connection: &crate::serve::Connection| {
        let shared = shared.clone();
        let connection = connection.clone();
        service_fn(move |req| {
            let shared = shared.clone();
            let connection = connection.clone();
            Box::pin(async move { Ok::<_, Infallible>(handle(shared, connection, req).await) })
        })
    };
    crate::serve::serve_counted(
        listener,
        service,
        options,
        stop.cancelled_owned(),
        connections,
    )
    .await
}

async fn handle(
    shared: Arc<Shared>,
    connection: crate::serve::Connection,
    req: Request<Incoming>,
) -> Response<ResponseBody> {
    let path = req.uri().path();
    let method = req.method().clone();
    for dialect in &shared.dialects {
        if dialect.routes().contains(&path) {
            let dialect = dialect.clone();
            if is_websocket_upgrade(req.headers()) {
                // Codex's default provider tries the Responses WebSocket transport first;
                // 426 makes it use HTTP at once (a 405 makes it retry the upgrade).
                let resp = error_response(
                    &*dialect,
                    &Error::UpgradeRequired {
                        path: path.to_owned(),
                    },
                );
                return refuse_unread(req.into_body(), resp).await;
            }
            if method != Method::POST {
                let e = Error::MethodNotAllowed {
                    method: method.to_string(),
                    path: path.to_owned(),
                };
                let resp = error_response(&*dialect, &e);
                return refuse_unread(req.into_body(), resp).await;
            }
            return model_call(shared, dialect, connection, req)
                .await
                .unwrap_or_else(|answer| answer);
        }
        if let Some((_, upstream_path)) = dialect
            .aux_routes()
            .iter()
            .find(|(route, _)| *route == path)
        {
            let dialect = dialect.clone();
            if method != Method::POST {
                let e = Error::MethodNotAllowed {
                    method: method.to_string(),
                    path: path.to_owned(),
                };
                let resp = error_response(&*dialect, &e);
                return refuse_unread(req.into_body(), resp).await;
            }
            // Boxed, as the other routes below: a future is as large as its largest
            // branch, and every request's future is moved into a box (see `accept`).
            return Box::pin(crate::call::aux_call(shared, dialect, upstream_path, req)).await;
        }
    }
    match (path, &method) {
        ("/v1/models" | "/models", &Method::GET) => Box::pin(models(shared, req)).await,
        ("/state", &Method::GET | &Method::PUT) | ("/task", &Method::GET) => {
            Box::pin(state_route(shared, req)).await
        }
        ("/tool", &Method::POST) => Box::pin(tool_route(shared, req)).await,
        ("/healthz", &Method::GET) => {
            refuse_unread(
                req.into_body(),
                json_response(StatusCode::OK, &b"{\"status\":\"ok\"}"[..]),
            )
            .await
        }
        _ => {
            let resp = plain_error(&Error::NotFound {
                method: method.to_string(),
                path: path.to_owned(),
            });
            Box::pin(refuse_unread(req.into_body(), resp)).await
        }
    }
}

/// Whether a request asks to switch to WebSocket (`Upgrade: websocket`, any case).
fn is_websocket_upgrade(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim().eq_ignore_ascii_case("websocket"))
}

/// The header naming the session when a shared tool server reaches `/state` with a
/// service secret.
pub const STATE_ROUTE_HEADER: &str = "x-intercept-state-route";

/// The Python implementation's name for [`STATE_ROUTE_HEADER`], accepted too so existing
/// shared tool servers work unchanged.
const LEGACY_STATE_ROUTE_HEADER: &str = "x-verifiers-state-route";

/// `GET /state`, `PUT /state`, `GET /task`: the state capability (the state secret, never
/// the model secret).
async fn state_route(shared: Arc<Shared>, req: Request<Incoming>) -> Response<ResponseBody> {
    let bearer = intercept_core::internal::bearer(req.headers()).map(SecretStr::new);
    let is_state = req.uri().path() == "/state";
    let entry = match &bearer {
        None => None,
        Some(secret) => shared.registry.by_state(secret).or_else(|| {
            // Shared tool servers: a service secret plus the session id in a header.
            let service = shared
                .config
                .service_secrets
                .iter()
                .any(|s| s.matches(secret.expose()));
            let route = req
                .headers()
                .get(STATE_ROUTE_HEADER)
                .or_else(|| req.headers().get(LEGACY_STATE_ROUTE_HEADER))
                .and_then(|v| v.to_str().ok());
            match (is_state && service, route) {
                (true, Some(id)) => shared.registry.by_id(id),
                _ => None,
            }
        }),
    };
    let Some(entry) = entry else {
        let released = bearer
            .as_ref()
            .is_some_and(|s| shared.registry.was_released(s));
        let resp = flat_error(&if released {
            Error::RolloutConcluded
        } else {
            Error::Unauthorized
        });
        return refuse_unread(req.into_body(), resp).await;
    };
    let Some(_guard) = entry.enter() else {
        return refuse_unread(req.into_body(), flat_error(&Error::RolloutConcluded)).await;
    };
    let session = entry.session.clone();
    let ok = |v: serde_json::Value| {
        json_response(StatusCode::OK, serde_json::to_vec(&v).unwrap_or_default())
    };
    match (req.uri().path(), req.method()) {
        ("/task", _) => match session.task_body() {
            Ok(body) => refuse_unread(req.into_body(), ok(body)).await,
            Err(e) => refuse_unread(req.into_body(), flat_error(&e)).await,
        },
        (_, &Method::GET) => refuse_unread(req.into_body(), ok(session.state())).await,
        _ => {
            let bytes = match read_body(&shared, req.into_body(), None, "the body").await {
                Ok(b) => b,
                Err(e) => {
                    let mut resp = flat_error(&e);
                    close_after(&mut resp);
                    return resp;
                }
            };
            let value: serde_json::Value = match serde_json::from_slice(&bytes) {
                Ok(v) => v,
                Err(e) => {
                    return flat_error(&Error::invalid(format!(
                        "invalid state PUT: the body is not valid JSON: {e}"
                    )))
                }
            };
            match session.set_state(value) {
                Ok(()) => ok(serde_json::json!({ "ok": true })),
                Err(e) => flat_error(&e),
            }
        }
    }
}

/// `POST /tool`: the session's tool channel ([`Session::tool`]), on the model secret
/// (`Authorization: Bearer` only; the state secret is not a tool capability). The
/// session's answer is awaited while the rollout is live: a release (409) or the server's
/// shutdown drops it.
async fn tool_route(shared: Arc<Shared>, req: Request<Incoming>) -> Response<ResponseBody> {
    let (entry, _guard) =
        match authenticate(&shared, intercept_core::internal::bearer(req.headers())) {
            Ok(a) => a,
            Err(e) => return refuse_unread(req.into_body(), flat_error(&e)).await,
        };
    let bytes = match read_body(&shared, req.into_body(), Some(&entry.cancel), "the body").await {
        Ok(b) => b,
        Err(e) => {
            let mut resp = flat_error(&e);
            close_after(&mut resp);
            return resp;
        }
    };
    let session = entry.session.clone();
    let answer = tokio::select! {
        biased;
        _ = entry.cancel.cancelled() => Err(if entry.is_released() {
            Error::RolloutConcluded
        } else {
            Error::Cancelled("the server is shutting down; retry on another server".into())
        }),
        answer = session.tool(&bytes) => answer,
    };
    match answer {
        Ok(v) => json_response(StatusCode::OK, serde_json::to_vec(&v).unwrap_or_default()),
        Err(e) => flat_error(&e),
    }
}

/// `GET /v1/models`: the session's upstream listing (`GET <base_url>/models`), relayed
/// with the session's model added when the listing does not name it; on any upstream
/// failure, or past `models_timeout`, the session's model alone. Any dialect's auth
/// (`Authorization: Bearer` or `x-api-key`); never recorded.
async fn models(shared: Arc<Shared>, req: Request<Incoming>) -> Response<ResponseBody> {
    let anthropic = req.headers().contains_key("x-api-key");
    let (entry, _guard) = match authenticate(&shared, MessagesDialect.secret(req.headers())) {
        Ok(a) => a,
        Err(e) => return plain_error(&e),
    };
    let session = &entry.session;
    let relay = async {
        tokio::time::timeout(
            shared.config.models_timeout,
            upstream_models(&shared, &entry, anthropic),
        )
        .await
        .unwrap_or_else(|_| {
            Err(Error::UpstreamTimeout(format!(
                "no listing within models_timeout ({} s)",
                shared.config.models_timeout.as_secs_f64()
            )))
        })
    };
    let listed = tokio::select! {
        biased;
        _ = entry.cancel.cancelled() => return plain_error(&Error::RolloutConcluded),
        r = relay => r,
    };
    let body = match listed {
        Ok(listing) => with_session_model(listing, session.model()),
        Err(e) => {
            let redactor = crate::redact::Redactor::new(session.upstream().api_key.as_deref());
            warn!(session = session.id(), error = ?redactor.str(&e.to_string()), "the upstream's model listing is unavailable; listing the session's model alone");
            serde_json::json!({"object": "list", "data": [model_entry(session.model())]})
        }
    };
    json_response(
        StatusCode::OK,
        serde_json::to_vec(&body).unwrap_or_default(),
    )
}

/// The largest model listing read from an upstream.
const MODELS_BODY_LIMIT: u64 = 4 << 20;

/// The upstream's listing: a JSON object with a `data` array, or why there is none.
async fn upstream_models(
    shared: &Shared,
    entry: &Entry,
    anthropic: bool,
) -> Result<serde_json::Value, Error> {
    let session = &entry.session;
    let upstream = session.upstream();
    let base_url = crate::preamble::engine_base_url(shared, &**session);
    let dialect: &dyn Dialect = if anthropic {
        &MessagesDialect
    } else {
        &ChatDialect
    };
    let req = shared
        .upstream
        .get(dialect, upstream, base_url, "/models")?;
    let resp = shared.upstream.send(req).await?;
    let status = resp.status();
    let body = read_all(resp.into_body(), MODELS_BODY_LIMIT)
        .await
        .map_err(|_| Error::UpstreamMalformed("the listing was unreadable or over 4 MiB".into()))?;
    if !status.is_success() {
        return Err(Error::upstream_status(
            status.as_u16(),
            String::from_utf8_lossy(&body).into_owned(),
            None,
        ));
    }
    let redacted = crate::redact::Redactor::new(upstream.api_key.as_deref()).bytes(body);
    match serde_json::from_slice::<serde_json::Value>(&redacted) {
        Ok(v) if v.get("data").is_some_and(serde_json::Value::is_array) => Ok(v),
        _ => Err(Error::UpstreamMalformed(
            "the listing is not a JSON object with a `data` array".into(),
        )),
    }
}

/// One entry of a model listing, for the session's model.
fn model_entry(model: &str) -> serde_json::Value {
    let created = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    serde_json::json!({"id": model, "object": "model", "created": created, "owned_by": "intercept"})
}

/// The upstream's listing as it is, with the session's model appended when no entry's
/// `id` names it (every call is sent with that model, so a harness looking its model up
/// finds it).
fn with_session_model(mut listing: serde_json::Value, model: &str) -> serde_json::Value {
    if let Some(data) = listing.get_mut("data").and_then(|d| d.as_array_mut()) {
        if !data
            .iter()
            .any(|m| m.get("id").and_then(|i| i.as_str()) == Some(model))
        {
            data.push(model_entry(model));
        }
    }
    listing
}

/// Admits a model call: the pause gate (wait for resume, or be refused), a retry's
/// replay (non-streamed calls; before any refusal, so a retried call that was served
/// gets its answer), the rollout's refusals (released, stopped, limits), then retry
/// coalescing. `Err` is the answer: an error, or a replayed or coalesced reply.
async fn admit(
    shared: &Shared,
    dialect: &dyn Dialect,
    entry: Arc<Entry>,
    guard: InflightGuard,
    headers: &http::HeaderMap,
    body: &JsonBody,
    stream: bool,
) -> Result<crate::call::Admitted, Response<ResponseBody>> {
    let fail = |e: Error| error_response(dialect, &e);
    let session = &entry.session;
    let admission = shared
        .gate
        .admit(&entry.cancel, || {
            if entry.is_released() {
                Error::RolloutConcluded
            } else {
                Error::Cancelled("the server is shutting down; retry on another server".into())
            }
        })
        .await
        .map_err(|e| {
            debug!(session = session.id(), error = ?e.to_string(), "call not admitted");
            fail(e)
        })?;
    let path = dialect.upstream_path();
    let plan = match crate::retry::replay(&entry.retry, session, path, headers, body, stream).await
    {
        Ok(plan) => plan,
        Err(crate::retry::Early::Replayed(answer)) => return Err(replayed(answer, dialect)),
        Err(crate::retry::Early::Refused(e)) => return Err(fail(e)),
        Err(crate::retry::Early::Join(joined)) => {
            // A joined call does not keep the rollout unsealed while it waits.
            drop(guard);
            return Err(joined_answer(dialect, joined).await);
        }
    };
    if entry.is_released() {
        return Err(fail(Error::RolloutConcluded));
    }
    if let Some(reason) = session.stop_reason() {
        return Err(fail(Error::RolloutStopped(reason)));
    }
    let claim = match crate::retry::claim(&entry.retry, session, plan) {
        Ok(claim) => claim,
        Err(joined) => {
            drop(guard);
            return Err(joined_answer(dialect, joined).await);
        }
    };
    if let Err(reason) = session.check() {
        return Err(fail(Error::RolloutStopped(reason)));
    }
    Ok(crate::call::Admitted {
        entry,
        guard,
        admission,
        claim,
    })
}

/// The answer of a call that joined an identical one in flight: its answer, or 503
/// `upstream attempt failed`.
async fn joined_answer(
    dialect: &dyn Dialect,
    joined: crate::retry::Joined,
) -> Response<ResponseBody> {
    match joined.answer().await {
        Some(answer) => replayed(answer, dialect),
        None => error_response(
            dialect,
            &Error::UpstreamUnavailable("upstream attempt failed".into()),
        ),
    }
}

/// A served answer given again (a replay, or the answer of a joined attempt): the JSON
/// body, or the dialect's minimal stream carrying the response.
fn replayed(answer: crate::retry::Answer, dialect: &dyn Dialect) -> Response<ResponseBody> {
    match answer {
        crate::retry::Answer::Json { body, content_type } => {
            let mut resp = json_response(http::StatusCode::OK, body);
            if let Some(ct) = content_type {
                resp.headers_mut().insert(http::header::CONTENT_TYPE, ct);
            }
            resp
        }
        crate::retry::Answer::Stream(response) => {
            let value = serde_json::from_slice(&response).unwrap_or_default();
            let events = dialect.synthesize_stream(&value);
            let mut out = Vec::with_capacity(events.iter().map(Bytes::len).sum());
            for ev in &events {
                out.extend_from_slice(ev);
            }
            event_stream(ResponseBody::full(out))
        }
    }
}

/// Prepares an admitted call's request: the session's request hook (which may rewrite
/// it or stop the rollout), network-policy mediation, and token capture.
async fn prepare(
    dialect: &dyn Dialect,
    session: &dyn Session,
    info: &CallInfo,
    body: &mut JsonBody,
) -> Result<
    (
        Option<intercept_core::PolicyEvent>,
        Option<intercept_core::internal::TokenCollector>,
    ),
    Error,
> {
    match session.on_request(info, body).await {
        Ok(HookAction::Stop(reason)) => return Err(crate::call::stopped_by_hook(session, reason)),
        Ok(_) => {}
        Err(e) => return Err(Error::from_hook("request hook failed", e)),
    }
    let policy = crate::network::mediate(dialect, session.network(), session.id(), body)?;
    // A token-path session whose mismatches go to the chat endpoint captures the ids
    // the engine answers there.
    let chat_mismatch = session
        .tokens()
        .is_some_and(|t| t.on_mismatch == intercept_core::OnMismatch::Chat);
    let capture = match session.capture_tokens() || chat_mismatch {
        true => dialect.capture_tokens(body)?,
        false => None,
    };
    Ok((policy, capture))
}

/// A model call, as stages: authenticate, read and parse, admit, prepare; then the
/// [`Call`] sends, relays and records (`call.rs`). `Err` is an answer given without a
/// call: a refusal, or a retry's replayed or joined answer.
async fn model_call(
    shared: Arc<Shared>,
    dialect: Arc<dyn Dialect>,
    connection: crate::serve::Connection,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, Response<ResponseBody>> {
    let fail = |e: Error| error_response(&*dialect, &e);
    let (entry, guard) = match authenticate(&shared, dialect.secret(req.headers())) {
        Ok(a) => a,
        Err(e) => return Err(refuse_unread(req.into_body(), fail(e)).await),
    };
    let session = entry.session.clone();
    let (mut parts, body) = req.into_parts();
    let bytes = read_body(&shared, body, Some(&entry.cancel), "the request body")
        .await
        .map_err(|e| {
            let mut resp = fail(e);
            close_after(&mut resp);
            resp
        })?;
    let mut body = parse_body(&entry, bytes).map_err(fail)?;
    let requested_model = body.str("model");
    let prepared = dialect
        .prepare(&mut body, session.model(), &session.sampling())
        .map_err(fail)?;
    let admitted = admit(
        &shared,
        &*dialect,
        entry,
        guard,
        &parts.headers,
        &body,
        prepared.stream,
    )
    .await?;
    let seq = admitted.entry.next_seq();
    let info = CallInfo {
        dialect: dialect.kind(),
        stream: prepared.stream,
        seq,
        headers: take_hook_headers(session.hook_headers(), &mut parts.headers),
    };
    let (policy, capture) = prepare(&*dialect, &*session, &info, &mut body)
        .await
        .map_err(fail)?;
    debug!(session = session.id(), seq, stream = prepared.stream, path = %parts.uri.path(), "intercept");
    let call = Call::new(
        shared.clone(),
        dialect.clone(),
        admitted,
        crate::call::Outgoing {
            prepared,
            seq,
            body,
            headers: parts.headers,
            hook_headers: info.headers,
            requested_model,
            policy,
            capture,
        },
    );
    let (tx, rx) = oneshot::channel();
    let tx = crate::call::Reply::new(tx, connection.busy());
    // The call runs in this task (the harness's connection): here until the response
    // head exists, then in the response body. Dropped unfinished (the harness went
    // away), it goes on as a task of the server's tracker, to its record.
    let call = crate::detach::Detachable::new(call.run(tx), &shared.tasks);
    crate::detach::answer(call, rx)
        .await
        .ok_or_else(|| fail(Error::Internal("the call ended without an answer".into())))
}

/// Takes the headers a session consumes out of a request (they are not forwarded
/// upstream): their values, one per name (the last sent), in the session's order. The
/// headers of [`intercept_core::SECRET_HEADERS`] are never taken.
fn take_hook_headers(names: &[String], headers: &mut http::HeaderMap) -> Vec<(String, String)> {
    let mut taken = Vec::new();
    for name in names {
        let name = name.to_ascii_lowercase();
        if intercept_core::SECRET_HEADERS.contains(&name.as_str()) {
            continue;
        }
        let Ok(key) = http::HeaderName::from_bytes(name.as_bytes()) else {
            continue;
        };
        let value = headers
            .get_all(&key)
            .iter()
            .next_back()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        if let Some(value) = value {
            headers.remove(&key);
            taken.push((name, value));
        }
    }
    taken
}

/// A model call's body, parsed after the rollout's last one: the memo is taken for the
/// parse (a parallel call parses its body whole) and the new one put back.
fn parse_body(entry: &crate::registry::Entry, bytes: bytes::Bytes) -> Result<JsonBody, Error> {
    let mut memo = std::mem::take(&mut *entry.parse_memo.lock());
    let body = JsonBody::parse_after(bytes, &mut memo);
    *entry.parse_memo.lock() = memo;
    body
}
