//! The sidecar: one interception plus a loopback control API, started in-process.
//!
//! [`Sidecar::start`] brings up (in order) the embedded mock model when the upstream is
//! `mock`, the interception (one server, a static pool or an elastic pool, with the
//! configured tunnel, built by `intercept_pool::make_interception_with`), and the control
//! API; [`Sidecar::shutdown`] stops accepting sessions, lets in-flight calls finish (up to
//! the configured grace), tears the servers and tunnels down, releases every session,
//! syncs the trace files and stops the control API.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use bytes::Bytes;
use hyper::service::service_fn;
use intercept_core::{
    Interception, NetworkPolicy, RolloutSession, Secret, ServerStatus, SessionStatus, SlotGuard,
    Totals, Upstream,
};
use intercept_mock::{MockConfig, MockUpstream};
use intercept_server::ServerConfig;
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::config::{ServeConfig, TunnelSetting, UpstreamSetting};
use crate::metrics::{Gauges, Metrics};
use crate::tunnel::{CountedTunnels, TunnelCounters};
use intercept_trace::{QueuedSink, TraceWriter};

/// The model name sessions get with the mock upstream when none is configured.
pub const MOCK_MODEL: &str = "mock-model";

/// One session the control API created.
#[derive(Debug)]
pub(crate) struct Held {
    /// The live session; `None` once its release finished (then [`Held::last`] keeps
    /// what stays readable), so a released session's records do not stay in memory.
    pub(crate) session: Option<Arc<RolloutSession>>,
    /// `None` while the slot is being acquired and after release.
    pub(crate) guard: Option<SlotGuard>,
    pub(crate) sink: Option<Arc<QueuedSink>>,
    pub(crate) released: bool,
    /// Set once the release finished: every `DELETE` waits for it, so each answers the
    /// final trace (also when `released_retention` forgets the session at once).
    pub(crate) done: Arc<Done>,
    pub(crate) last: Option<Arc<Last>>,
    /// The session's token-in/token-out (`GET /v1/sessions/{id}` shows it, also once
    /// released).
    pub(crate) tokens: Option<Box<intercept_core::TokensConfig>>,
}

impl Held {
    pub(crate) fn new(session: Arc<RolloutSession>, sink: Option<Arc<QueuedSink>>) -> Self {
        Held {
            tokens: intercept_core::Session::tokens(&*session)
                .cloned()
                .map(Box::new),
            session: Some(session),
            guard: None,
            sink,
            released: false,
            done: Arc::default(),
            last: None,
        }
    }

    /// The number of recorded calls.
    pub(crate) fn calls(&self) -> usize {
        match (&self.session, &self.last) {
            (Some(s), _) => s.calls(),
            (None, Some(l)) => l.calls,
            (None, None) => 0,
        }
    }

    /// The session's status (`Released` once `DELETE` began).
    pub(crate) fn status(&self) -> SessionStatus {
        match &self.session {
            Some(s) if !self.released => s.status(),
            _ => SessionStatus::Released,
        }
    }

    /// Why the rollout stopped, if it did.
    pub(crate) fn stop_condition(&self) -> Option<String> {
        match (&self.session, &self.last) {
            (Some(s), _) => intercept_core::Session::stop_condition(&**s),
            (None, Some(l)) => l.stop_condition.clone(),
            (None, None) => None,
        }
    }

    /// Turn and token totals.
    pub(crate) fn totals(&self) -> Totals {
        match (&self.session, &self.last) {
            (Some(s), _) => s.totals(),
            (None, Some(l)) => l.totals,
            (None, None) => Totals::default(),
        }
    }
}

/// The end of a release, for the `DELETE`s waiting on it.
#[derive(Debug, Default)]
pub(crate) struct Done {
    /// Cancelled once `last` is set (or the session was dropped without a release).
    pub(crate) token: CancellationToken,
    pub(crate) last: std::sync::OnceLock<Arc<Last>>,
}

/// What stays of a released session once its release finished.
#[derive(Debug)]
pub(crate) struct Last {
    pub(crate) calls: usize,
    pub(crate) stop_condition: Option<String>,
    pub(crate) totals: Totals,
    pub(crate) replays: u64,
    /// Without a trace directory: the session's log (its trace and episode are rebuilt
    /// from it when asked), until the bound on retained bytes evicts it (`None` then).
    /// With one, the trace file is read back instead.
    pub(crate) kept: Mutex<Option<Bytes>>,
}

/// The released sessions still remembered, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Retired {
    /// Every remembered released session (bounded by `released_retention`).
    order: VecDeque<String>,
    /// Those whose trace is held in memory, with its bytes (bounded by
    /// `released_trace_bytes`); a subsequence of `order`.
    in_memory: VecDeque<(String, usize)>,
    bytes: usize,
}

/// State shared by the control API's handlers.
pub(crate) struct ControlState {
    pub(crate) config: ServeConfig,
    pub(crate) default_upstream: Option<Upstream>,
    pub(crate) default_model: Option<String>,
    /// The network policy of sessions created without one (`network_*`).
    pub(crate) default_network: NetworkPolicy,
    /// The interception (any shape), started.
    pub(crate) server: Arc<dyn Interception>,
    /// The trace files' writer (with a trace directory).
    pub(crate) writer: Option<Arc<TraceWriter>>,
    pub(crate) tunnels: Arc<TunnelCounters>,
    pub(crate) sessions: Mutex<HashMap<String, Held>>,
    pub(crate) retired: Mutex<Retired>,
    /// Releases begun by `DELETE`, each in a task of its own; shutdown waits for them.
    pub(crate) releases: TaskTracker,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) token: Secret,
    pub(crate) accepting: AtomicBool,
    pub(crate) next_id: AtomicU64,
    /// 8 hex digits drawn at start: generated ids are `session-<run_id>-<n>`, unique
    /// across runs sharing a trace directory.
    pub(crate) run_id: String,
}

impl fmt::Debug for ControlState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlState")
            .field("config", &self.config)
            .field("sessions", &self.sessions.lock().len())
            .finish_non_exhaustive()
    }
}

impl ControlState {
    pub(crate) async fn gauges(&self) -> Gauges {
        Gauges {
            active_sessions: self.server.load(),
            inflight_calls: self.server.inflight(),
            servers: self.server.servers().await.len(),
            tunnel_starts: self.tunnels.starts(),
            tunnel_failures: self.tunnels.failures(),
            limiter_unavailable: intercept_tunnel::limiter_unavailable_total(),
            released_sessions: self.retained().0,
            released_trace_bytes: self.retained().1,
            trace_queue_bytes: self.writer.as_ref().map_or(0, |w| w.queued_bytes()),
            trace_lines_lost: self.writer.as_ref().map_or(0, |w| w.lost_lines()),
            trace_queue_waits: self.writer.as_ref().map_or(0, |w| w.room_waits().0),
            trace_queue_wait_seconds: self
                .writer
                .as_ref()
                .map_or(0.0, |w| w.room_waits().1.as_secs_f64()),
            endpoint_lost_sessions: self
                .sessions
                .lock()
                .values()
                .filter(|h| h.guard.as_ref().is_some_and(|g| g.endpoint_lost()))
                .count(),
        }
    }

    /// Released sessions remembered, and the bytes of their traces held in memory.
    pub(crate) fn retained(&self) -> (usize, usize) {
        let retired = self.retired.lock();
        (retired.order.len(), retired.bytes)
    }

    /// Remembers a released session whose kept trace takes `bytes` in memory: forgets
    /// the oldest beyond `released_retention`, and drops the oldest kept traces beyond
    /// `released_trace_bytes` (their ids stay remembered).
    pub(crate) fn retire(&self, id: &str, bytes: usize) {
        let mut forget = Vec::new();
        let mut evict = Vec::new();
        {
            let mut retired = self.retired.lock();
            retired.order.push_back(id.to_owned());
            if bytes > 0 {
                retired.in_memory.push_back((id.to_owned(), bytes));
                retired.bytes += bytes;
            }
            // The newest trace stays, even alone over the bound: its DELETEs answer it.
            while retired.bytes > self.config.released_trace_bytes && retired.in_memory.len() > 1 {
                let Some((old, b)) = retired.in_memory.pop_front() else {
                    break;
                };
                retired.bytes -= b;
                evict.push(old);
            }
            while retired.order.len() > self.config.released_retention {
                let Some(old) = retired.order.pop_front() else {
                    break;
                };
                // Both queues are in release order: the oldest remembered session is
                // the oldest kept trace, if its trace is still kept.
                if retired.in_memory.front().is_some_and(|(i, _)| *i == old) {
                    if let Some((_, b)) = retired.in_memory.pop_front() {
                        retired.bytes -= b;
                    }
                }
                forget.push(old);
            }
        }
        let mut sessions = self.sessions.lock();
        for old in evict {
            if let Some(last) = sessions.get(&old).and_then(|h| h.last.clone()) {
                *last.kept.lock() = None;
            }
        }
        for old in forget {
            if sessions.get(&old).is_some_and(|h| h.released) {
                sessions.remove(&old);
            }
        }
    }

    /// Waits until the trace writer wrote every line handed in so far (nothing without a
    /// trace directory).
    pub(crate) async fn flush_traces(&self) {
        if let Some(writer) = self.writer.clone() {
            if let Err(e) = tokio::task::spawn_blocking(move || writer.flush()).await {
                warn!(error = %e, "could not flush the trace writer");
            }
        }
    }

    /// Finishes a release begun by taking `guard` (`DELETE` or shutdown): frees the slot
    /// (in-flight calls are cancelled and record), writes the session's queued lines,
    /// writes the episode, syncs and closes the trace file, keeps what stays readable and
    /// wakes every `DELETE` waiting.
    pub(crate) async fn finish_release(
        &self,
        id: &str,
        session: Arc<RolloutSession>,
        guard: SlotGuard,
    ) {
        guard.close().await;
        self.metrics.session_released();
        self.flush_traces().await;
        let dir = self.config.trace_dir.as_deref();
        intercept_trace::save_episode(dir, self.config.trace_format, &session);
        let kept = dir.is_none().then(|| Bytes::from(session.log()));
        let bytes = kept.as_ref().map_or(0, Bytes::len);
        let last = Arc::new(Last {
            calls: session.calls(),
            stop_condition: intercept_core::Session::stop_condition(&*session),
            totals: session.totals(),
            replays: session.replays(),
            kept: Mutex::new(kept),
        });
        let sink = {
            let mut sessions = self.sessions.lock();
            match sessions.get_mut(id) {
                Some(held) => {
                    held.session = None;
                    let _ = held.done.last.set(last.clone());
                    held.last = Some(last);
                    held.done.token.cancel();
                    held.sink.take()
                }
                None => None,
            }
        };
        if let Some(sink) = sink {
            if let Err(e) = sink.sync() {
                warn!(path = %sink.path().display(), error = %e, "could not sync a trace file");
            }
        }
        info!(session = %id, calls = session.calls(), "session released");
        drop(session);
        self.retire(id, bytes);
    }
}

/// A running sidecar.
pub struct Sidecar {
    state: Arc<ControlState>,
    control_addr: SocketAddr,
    control_stop: CancellationToken,
    control_tasks: TaskTracker,
    mock: Option<MockUpstream>,
}

impl fmt::Debug for Sidecar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sidecar")
            .field("control_addr", &self.control_addr)
            .field("interception", &self.state.server)
            .finish_non_exhaustive()
    }
}

impl Sidecar {
    /// Starts the sidecar with `config` (see the module docs).
    pub async fn start(config: ServeConfig) -> anyhow::Result<Self> {
        config.check()?;
        if let Some(dir) = &config.trace_dir {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create the trace directory {}", dir.display()))?;
        }
        let api_key = env_secret(
            config.upstream_api_key_env.as_deref(),
            "upstream_api_key_env",
        )?;
        check_tokens_default(&config)?;
        let (mock, default_upstream, default_model) = start_upstream(&config, api_key).await?;
        let tunnels = Arc::new(TunnelCounters::default());
        let server = start_interception(&config, tunnels.clone()).await?;
        let listener = bind_control(&config, &server).await?;
        let control_addr = listener.local_addr()?;
        let writer = start_writer(&config)?;
        let token = config
            .control_token
            .clone()
            .unwrap_or_else(Secret::generate);
        let state = Arc::new(ControlState {
            default_network: config.network()?,
            config,
            default_upstream,
            default_model,
            server,
            writer,
            tunnels,
            sessions: Mutex::new(HashMap::new()),
            retired: Mutex::new(Retired::default()),
            releases: TaskTracker::new(),
            metrics: Arc::new(Metrics::default()),
            token,
            accepting: AtomicBool::new(true),
            next_id: AtomicU64::new(1),
            run_id: run_id(),
        });
        let control_stop = CancellationToken::new();
        let control_tasks = TaskTracker::new();
        control_tasks.spawn(accept(listener, state.clone(), control_stop.clone()));
        control_tasks.close();
        info!(
            control = %control_addr,
            shape = state.config.interception.as_str(),
            tunnel = state.config.tunnel.as_str(),
            servers = ?state.server.servers().await.iter().map(|s| s.base_url.clone()).collect::<Vec<_>>(),
            "sidecar ready"
        );
        Ok(Sidecar {
            state,
            control_addr,
            control_stop,
            control_tasks,
            mock,
        })
    }

    /// The control API's URL, `http://127.0.0.1:<port>`.
    pub fn control_url(&self) -> String {
        format!("http://{}", self.control_addr)
    }

    /// The control API token. Never log it.
    pub fn token(&self) -> &Secret {
        &self.state.token
    }

    /// The one line printed on stdout when the sidecar is ready:
    /// `{"event":"ready","control_url":"...","token":"..."}`.
    pub fn ready_line(&self) -> String {
        serde_json::json!({
            "event": "ready",
            "control_url": self.control_url(),
            "token": self.state.token.expose(),
        })
        .to_string()
    }

    /// The base URL of the interception's first server (`None` while it has none: an
    /// elastic pool starts servers on demand).
    pub async fn interception_url(&self) -> Option<String> {
        self.servers().await.into_iter().find_map(|s| s.base_url)
    }

    /// The interception's servers as they are now (what `GET /v1/interception` reports).
    pub async fn servers(&self) -> Vec<ServerStatus> {
        self.state.server.servers().await
    }

    /// The interception (one server or a pool).
    pub fn interception(&self) -> &Arc<dyn Interception> {
        &self.state.server
    }

    /// The trace directory, if trace files are written.
    pub fn trace_dir(&self) -> Option<PathBuf> {
        self.state.config.trace_dir.clone()
    }

    /// Stops the sidecar (see the module docs).
    pub async fn shutdown(self) -> anyhow::Result<()> {
        info!("shutting down: no new sessions; waiting for calls in flight");
        self.state.accepting.store(false, Ordering::SeqCst);
        let stopped = self.state.server.stop().await;
        let releases: Vec<_> = {
            let mut sessions = self.state.sessions.lock();
            sessions
                .iter_mut()
                .filter_map(|(id, h)| {
                    h.released = true;
                    let guard = h.guard.take()?;
                    Some((id.clone(), h.session.clone()?, guard))
                })
                .collect()
        };
        for (id, session, guard) in releases {
            self.state.finish_release(&id, session, guard).await;
        }
        // Releases begun by a DELETE just before: their episodes and file syncs too.
        self.state.releases.close();
        let grace = self.state.config.shutdown_grace + crate::control::RELEASE_WAIT_MARGIN;
        if tokio::time::timeout(grace, self.state.releases.wait())
            .await
            .is_err()
        {
            warn!("releases begun by DELETE did not finish in time; their trace files may not be synced");
        }
        // Lines of calls recorded after their session's release (none is expected).
        if let Some(writer) = self.state.writer.clone() {
            let _ = tokio::task::spawn_blocking(move || writer.close()).await;
        }
        self.control_stop.cancel();
        self.control_tasks.wait().await;
        if let Some(mock) = self.mock {
            mock.shutdown().await;
        }
        info!("sidecar down");
        stopped.context("the interception did not stop cleanly")
    }
}

/// Reads the secret in the environment variable `var` named by the setting `setting`
/// (`None` without one); an error when it is not set.
fn env_secret(var: Option<&str>, setting: &str) -> anyhow::Result<Option<String>> {
    match var {
        Some(var) => Some(std::env::var(var).with_context(|| {
            format!("the environment variable {var} named by {setting} is not set")
        }))
        .transpose(),
        None => Ok(None),
    }
}

/// The `tokens` default's tokenizer is there. The server loads it (and checks the
/// renderer and engine) when a session is acquired; a wrong path fails the start rather
/// than every session.
fn check_tokens_default(config: &ServeConfig) -> anyhow::Result<()> {
    if let Some(tokens) = &config.tokens {
        std::fs::metadata(&tokens.tokenizer).with_context(|| {
            format!(
                "setting `tokens`: the tokenizer {:?} cannot be read; give a folder holding \
                 tokenizer.json (and tokenizer_config.json), or the tokenizer.json file",
                tokens.tokenizer
            )
        })?;
    }
    Ok(())
}

/// Starts the embedded mock model when the upstream is `mock`; answers it with the
/// default upstream and model of sessions.
async fn start_upstream(
    config: &ServeConfig,
    api_key: Option<String>,
) -> anyhow::Result<(Option<MockUpstream>, Option<Upstream>, Option<String>)> {
    match &config.upstream {
        Some(UpstreamSetting::Mock) => {
            let mock = MockUpstream::start_with(MockConfig {
                log_requests: false,
                ..MockConfig::default()
            })
            .await
            .context("cannot start the embedded mock model")?;
            let upstream = Upstream::new(mock.base_url());
            let model = config.model.clone().unwrap_or_else(|| MOCK_MODEL.into());
            Ok((Some(mock), Some(upstream), Some(model)))
        }
        Some(UpstreamSetting::Url(url)) => {
            let mut upstream = Upstream::new(url.clone());
            upstream.api_key = api_key;
            Ok((None, Some(upstream), config.model.clone()))
        }
        None => Ok((None, None, config.model.clone())),
    }
}

/// Builds the interception (its tunnel counted in `tunnels`) and starts it.
async fn start_interception(
    config: &ServeConfig,
    tunnels: Arc<TunnelCounters>,
) -> anyhow::Result<Arc<dyn Interception>> {
    let bore_secret = env_secret(config.bore_secret_env.as_deref(), "bore_secret_env")?;
    let spec = CountedTunnels {
        config: config.tunnel_config(bore_secret)?,
        counters: tunnels,
    };
    let server = intercept_pool::make_interception_with(
        &config.interception_config(spec),
        config.tunnel != TunnelSetting::None,
        ServerConfig {
            shutdown_grace: config.shutdown_grace,
            upstream_write_idle: config.upstream_write_idle,
            upstream_read_idle: config.upstream_read_idle,
            stream_heartbeat: config.stream_heartbeat,
            models_timeout: config.models_timeout,
            header_read_timeout: config.header_read_timeout,
            max_response_bytes: config.max_response_bytes,
            max_connections: config.max_connections,
            workers: config.workers,
            ..ServerConfig::default()
        },
    )
    .with_context(|| {
        format!(
            "cannot create the interception (interception = {}, tunnel = {})",
            config.interception.as_str(),
            config.tunnel.as_str()
        )
    })?;
    server.start().await.with_context(|| {
        format!(
            "cannot start the interception (interception = {}, tunnel = {})",
            config.interception.as_str(),
            config.tunnel.as_str()
        )
    })?;
    Ok(server)
}

/// Listens on the control API's address; stops `server` when it cannot.
async fn bind_control(
    config: &ServeConfig,
    server: &Arc<dyn Interception>,
) -> anyhow::Result<TcpListener> {
    match TcpListener::bind(config.control).await {
        Ok(l) => Ok(l),
        Err(e) => {
            let _ = server.stop().await;
            Err(e)
                .with_context(|| format!("cannot listen on {} for the control API", config.control))
        }
    }
}

/// Starts the trace writer (only with a trace directory).
fn start_writer(config: &ServeConfig) -> anyhow::Result<Option<Arc<TraceWriter>>> {
    let writer = match &config.trace_dir {
        Some(_) => Some(
            TraceWriter::start(intercept_trace::WriterConfig {
                max_queued_bytes: usize::try_from(config.trace_queue_bytes).unwrap_or(usize::MAX),
                flush_interval: config.trace_flush,
            })
            .context("cannot start the trace writer")?,
        ),
        None => None,
    };
    Ok(writer)
}

/// 8 random hex digits (from the operating system's generator, through
/// [`Secret::generate`]).
fn run_id() -> String {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    Secret::generate().expose().hash(&mut hasher);
    format!("{:08x}", hasher.finish() as u32)
}

/// Runs the sidecar until `shutdown` resolves: prints the ready line on stdout once
/// ready, then nothing else.
pub async fn serve(
    config: ServeConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let sidecar = Sidecar::start(config).await?;
    {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", sidecar.ready_line())?;
        out.flush()?;
    }
    shutdown.await;
    sidecar.shutdown().await
}

async fn accept(listener: TcpListener, state: Arc<ControlState>, stop: CancellationToken) {
    let options = intercept_server::ServeOptions {
        header_read_timeout: state.config.header_read_timeout,
        max_connections: state.config.max_connections,
    };
    let service = service_fn(move |req| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(crate::control::handle(state, req).await) }
    });
    let serve = intercept_server::serve_connections(
        listener,
        move |_: &intercept_server::Connection| service.clone(),
        options,
        stop.cancelled_owned(),
    );
    tracing::Instrument::instrument(serve, tracing::info_span!("control_api")).await
}
