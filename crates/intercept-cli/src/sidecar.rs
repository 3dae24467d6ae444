//! The sidecar: one interception plus a loopback control API, started in-process.
//!
//! [`Sidecar::start`] brings up (in order) the embedded mock model when the upstream is
//! `mock`, the interception (one server, a static pool or an elastic pool, with the
//! configured tunnel, built by `intercept_pool::make_interception_with`), and the control
//! API; [`Sidecar::shutdown`] stops accepting sessions, lets in-flight calls finish (up to
//! the configured grace), tears the servers and tunnels down, releases every session,
//! syncs the trace files and stops the control API.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use intercept_core::{Interception, Secret, ServerStatus, Upstream};
use intercept_mock::{MockConfig, MockUpstream};
use intercept_server::ServerConfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::info;

use crate::config::{ServeConfig, TunnelSetting, UpstreamSetting};
use crate::control::ControlState;
use crate::tunnel::{CountedTunnels, TunnelCounters};
use intercept_trace::TraceWriter;

/// The model name sessions get with the mock upstream when none is configured.
pub const MOCK_MODEL: &str = "mock-model";

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
            .field("interception", self.state.server())
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
        let state = Arc::new(ControlState::new(
            config,
            default_upstream,
            default_model,
            server,
            writer,
            tunnels,
        )?);
        let control_stop = CancellationToken::new();
        let control_tasks = TaskTracker::new();
        control_tasks.spawn(crate::control::serve_api(
            listener,
            state.clone(),
            control_stop.clone(),
        ));
        control_tasks.close();
        info!(
            control = %control_addr,
            shape = state.config().interception.as_str(),
            tunnel = state.config().tunnel.as_str(),
            servers = ?state.server().servers().await.iter().map(|s| s.base_url.clone()).collect::<Vec<_>>(),
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
        self.state.token()
    }

    /// The one line printed on stdout when the sidecar is ready:
    /// `{"event":"ready","control_url":"...","token":"..."}`.
    pub fn ready_line(&self) -> String {
        serde_json::json!({
            "event": "ready",
            "control_url": self.control_url(),
            "token": self.state.token().expose(),
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
        self.state.server().servers().await
    }

    /// The interception (one server or a pool).
    pub fn interception(&self) -> &Arc<dyn Interception> {
        self.state.server()
    }

    /// The trace directory, if trace files are written.
    pub fn trace_dir(&self) -> Option<PathBuf> {
        self.state.config().trace_dir.clone()
    }

    /// Stops the sidecar (see the module docs).
    pub async fn shutdown(self) -> anyhow::Result<()> {
        info!("shutting down: no new sessions; waiting for calls in flight");
        let stopped = self.state.shut_down().await;
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
