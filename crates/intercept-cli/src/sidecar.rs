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
use hyper::service::service_fn;
use intercept_core::{Interception, RolloutSession, Secret, ServerStatus, SlotGuard, Upstream};
use intercept_server::ServerConfig;
use intercept_test::{MockConfig, MockUpstream};
use parking_lot::Mutex;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::config::{ServeConfig, TunnelSetting, UpstreamSetting};
use crate::jsonl::JsonlSink;
use crate::metrics::{Gauges, Metrics};
use crate::tunnel::{CountedTunnels, TunnelCounters};

/// The model name sessions get with the mock upstream when none is configured.
pub const MOCK_MODEL: &str = "mock-model";

/// One session the control API created.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) session: Arc<RolloutSession>,
    /// `None` while the slot is being acquired and after release.
    pub(crate) guard: Option<SlotGuard>,
    pub(crate) sink: Option<Arc<JsonlSink>>,
    pub(crate) released: bool,
}

/// State shared by the control API's handlers.
pub(crate) struct ControlState {
    pub(crate) config: ServeConfig,
    pub(crate) default_upstream: Option<Upstream>,
    pub(crate) default_model: Option<String>,
    /// The interception (any shape), started.
    pub(crate) server: Arc<dyn Interception>,
    pub(crate) tunnels: Arc<TunnelCounters>,
    pub(crate) sessions: Mutex<HashMap<String, Held>>,
    pub(crate) released_order: Mutex<VecDeque<String>>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) token: Secret,
    pub(crate) accepting: AtomicBool,
    pub(crate) next_id: AtomicU64,
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
            endpoint_lost_sessions: self
                .sessions
                .lock()
                .values()
                .filter(|h| h.guard.as_ref().is_some_and(|g| g.endpoint_lost()))
                .count(),
        }
    }

    /// Remembers a released session, forgetting the oldest beyond the retention.
    pub(crate) fn retire(&self, id: &str) {
        let mut order = self.released_order.lock();
        order.push_back(id.to_owned());
        while order.len() > self.config.released_retention {
            let Some(old) = order.pop_front() else {
                break;
            };
            let mut sessions = self.sessions.lock();
            if sessions.get(&old).is_some_and(|h| h.released) {
                sessions.remove(&old);
            }
        }
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
        let api_key = match &config.upstream_api_key_env {
            Some(var) => Some(std::env::var(var).with_context(|| {
                format!("the environment variable {var} named by upstream_api_key_env is not set")
            })?),
            None => None,
        };
        let (mock, default_upstream, default_model) = match &config.upstream {
            Some(UpstreamSetting::Mock) => {
                let mock = MockUpstream::start_with(MockConfig {
                    log_requests: false,
                    ..MockConfig::default()
                })
                .await
                .context("cannot start the embedded mock model")?;
                let upstream = Upstream::new(mock.base_url());
                let model = config.model.clone().unwrap_or_else(|| MOCK_MODEL.into());
                (Some(mock), Some(upstream), Some(model))
            }
            Some(UpstreamSetting::Url(url)) => {
                let mut upstream = Upstream::new(url.clone());
                upstream.api_key = api_key;
                (None, Some(upstream), config.model.clone())
            }
            None => (None, None, config.model.clone()),
        };
        let bore_secret = match &config.bore_secret_env {
            Some(var) => Some(std::env::var(var).with_context(|| {
                format!("the environment variable {var} named by bore_secret_env is not set")
            })?),
            None => None,
        };
        let tunnels = Arc::new(TunnelCounters::default());
        let spec = CountedTunnels {
            config: config.tunnel_config(bore_secret)?,
            counters: tunnels.clone(),
        };
        let server = intercept_pool::make_interception_with(
            &config.interception_config(spec),
            config.tunnel != TunnelSetting::None,
            ServerConfig {
                shutdown_grace: config.shutdown_grace,
                upstream_write_idle: config.upstream_write_idle,
                upstream_read_idle: config.upstream_read_idle,
                header_read_timeout: config.header_read_timeout,
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
        let listener = match TcpListener::bind(config.control).await {
            Ok(l) => l,
            Err(e) => {
                let _ = server.stop().await;
                return Err(e).with_context(|| {
                    format!("cannot listen on {} for the control API", config.control)
                });
            }
        };
        let control_addr = listener.local_addr()?;
        let token = config
            .control_token
            .clone()
            .unwrap_or_else(Secret::generate);
        let state = Arc::new(ControlState {
            config,
            default_upstream,
            default_model,
            server,
            tunnels,
            sessions: Mutex::new(HashMap::new()),
            released_order: Mutex::new(VecDeque::new()),
            metrics: Arc::new(Metrics::default()),
            token,
            accepting: AtomicBool::new(true),
            next_id: AtomicU64::new(1),
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
        let (guards, sinks): (Vec<_>, Vec<_>) = {
            let mut sessions = self.state.sessions.lock();
            sessions
                .values_mut()
                .map(|h| {
                    h.released = true;
                    (
                        h.guard.take().map(|g| (g, h.session.clone())),
                        h.sink.clone(),
                    )
                })
                .unzip()
        };
        for (guard, session) in guards.into_iter().flatten() {
            guard.close().await;
            crate::jsonl::save_episode(self.state.config.trace_dir.as_deref(), &session);
        }
        for sink in sinks.into_iter().flatten() {
            if let Err(e) = sink.sync() {
                warn!(path = %sink.path().display(), error = %e, "could not sync a trace file");
            }
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
    };
    let service = service_fn(move |req| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(crate::control::handle(state, req).await) }
    });
    let serve =
        intercept_server::serve_connections(listener, service, options, stop.cancelled_owned());
    tracing::Instrument::instrument(serve, tracing::info_span!("control_api")).await
}
