//! The `bore` backend: a self-hosted TCP tunnel through a [bore](https://github.com/ekzhang/bore)
//! server, run in-process.
//!
//! The client speaks bore 0.6's wire protocol (null-delimited JSON frames, optional
//! HMAC-SHA256 challenge auth) using the `bore-cli` crate's protocol types
//! ([`bore_cli::shared`], [`bore_cli::auth`]). It does not use `bore_cli::client::Client`
//! or `bore_cli::server::Server` directly, because those fix the control port at 7835,
//! spawn detached tasks that nothing can cancel, and do not report when the control
//! connection dies. Here every task belongs to the endpoint (aborted on teardown or drop),
//! the control port is configurable, and the endpoint reports unhealthy as soon as the
//! control connection closes or stops sending heartbeats; [`Endpoint::refresh`] then mints
//! a new tunnel (through the rate limiter).
//!
//! [`BoreServer`] is a small in-process bore server with the same protocol (compatible with
//! `bore local`), used by tests and usable for self-hosting from Rust.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bore_cli::auth::Authenticator;
use bore_cli::shared::{ClientMessage, Delimited, ServerMessage, CONTROL_PORT};
use intercept_core::{Endpoint, Error, Health, Tunnel};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch, Mutex};
use tokio::task::{JoinHandle, JoinSet};
use uuid::Uuid;

use crate::error::TunnelError;
use crate::limiter::RateLimiter;

/// How long connecting to the bore server, and each of its first messages, may take by
/// default.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the control connection may stay silent before it counts as dead, by default.
/// The server sends a heartbeat twice a second, so this is ten missed heartbeats.
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);

/// A tunnel through a bore server: the public URL is `http://<server>:<remote port>`.
#[derive(Debug, Clone)]
pub struct BoreTunnel {
    server: String,
    control_port: u16,
    secret: Option<String>,
    secret_source: String,
    local_host: String,
    heartbeat_timeout: Duration,
    connect_timeout: Duration,
    repair_backoff: (Duration, Duration),
    limiter: RateLimiter,
}

impl BoreTunnel {
    /// A tunnel through the bore server at `server` (host name or IP), control port 7835,
    /// no secret, no rate limit.
    pub fn new(server: &str) -> Self {
        BoreTunnel {
            server: server.trim().to_string(),
            control_port: CONTROL_PORT,
            secret: None,
            secret_source: "the tunnel's `secret`".into(),
            local_host: "127.0.0.1".into(),
            heartbeat_timeout: DEFAULT_HEARTBEAT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            repair_backoff: (Duration::from_millis(500), Duration::from_secs(30)),
            limiter: RateLimiter::off(),
        }
    }

    /// Uses another control port than bore's 7835.
    pub fn with_control_port(mut self, port: u16) -> Self {
        self.control_port = port;
        self
    }

    /// Authenticates with the server's secret (`bore server --secret`).
    pub fn with_secret(mut self, secret: Option<String>) -> Self {
        self.secret = secret.filter(|s| !s.is_empty());
        self
    }

    /// Names where the secret is set, for error messages (default "the tunnel's
    /// `secret`"; the sidecar says `--bore-secret-env`).
    pub fn with_secret_source(mut self, source: &str) -> Self {
        self.secret_source = source.to_string();
        self
    }

    /// Declares the control connection dead when the server sends nothing (it sends a
    /// heartbeat twice a second) for this long. 5 s by default
    /// ([`DEFAULT_HEARTBEAT_TIMEOUT`]).
    pub fn with_heartbeat_timeout(mut self, timeout: Duration) -> Self {
        self.heartbeat_timeout = timeout;
        self
    }

    /// Bounds connecting to the bore server and each of its first answers (the
    /// authentication challenge, the hello): a server that accepts and stays silent fails
    /// an attempt after this long. 5 s by default ([`DEFAULT_CONNECT_TIMEOUT`]).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The delays between repair attempts of a dead tunnel: `base` after the first
    /// failure, doubling (with jitter) up to `max`. 0.5 s and 30 s by default.
    pub fn with_repair_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.repair_backoff = (base, max.max(base));
        self
    }

    /// Passes every creation (and re-creation) through `limiter`.
    pub fn with_limiter(mut self, limiter: RateLimiter) -> Self {
        self.limiter = limiter;
        self
    }

    /// Opens a control connection asking for `remote_port` (0: any free port).
    async fn mint(&self, local_port: u16, remote_port: u16) -> Result<Session, MintError> {
        let permit = self.limiter.acquire().await?;
        let result = self.hello(remote_port).await;
        permit.complete().await;
        let (control, port) = result?;
        let auth = self.secret.as_deref().map(Authenticator::new).map(Arc::new);
        let url = format!("http://{}:{port}", url_host(&self.server));
        let (dead_tx, dead_rx) = watch::channel(None);
        let forwarder = Forwarder {
            server: self.server.clone(),
            control_port: self.control_port,
            auth,
            local_host: self.local_host.clone(),
            local_port,
            secret_source: self.secret_source.clone(),
            connect_timeout: self.connect_timeout,
        };
        let task = tokio::spawn(run_control(
            control,
            forwarder,
            self.heartbeat_timeout,
            dead_tx,
        ));
        tracing::info!(%url, local_port, "bore tunnel up");
        Ok(Session {
            url,
            port,
            dead: dead_rx,
            task,
        })
    }

    /// Connects, authenticates and says hello; returns the control connection and the
    /// public port the server granted.
    async fn hello(&self, remote_port: u16) -> Result<(Delimited<TcpStream>, u16), MintError> {
        let to = format!("{}:{}", self.server, self.control_port);
        let auth = self.secret.as_deref().map(Authenticator::new);
        let within = self.connect_timeout;
        let mut control = connect(
            &self.server,
            self.control_port,
            auth.as_ref(),
            &self.secret_source,
            within,
        )
        .await?;
        let answer = tokio::time::timeout(within, async {
            control
                .send(ClientMessage::Hello(remote_port))
                .await
                .map_err(|e| conn_err(&to, &e))?;
            control
                .recv::<ServerMessage>()
                .await
                .map_err(|e| conn_err(&to, &e))
        })
        .await
        .map_err(|_| {
            TunnelError::Timeout(format!(
                "bore server at {to} does not answer (no reply to hello within \
                 {within:?}); is it overloaded or frozen?"
            ))
        })??;
        match answer {
            Some(ServerMessage::Hello(port)) => Ok((control, port)),
            Some(ServerMessage::Error(message)) if message.contains("secret") => {
                Err(TunnelError::Rejected(format!(
                    "bore server {to} refused the tunnel: {message}; check the bore secret ({})",
                    self.secret_source
                ))
                .into())
            }
            Some(ServerMessage::Error(message)) if remote_port != 0 => {
                Err(MintError::PortUnavailable(message))
            }
            Some(ServerMessage::Error(message)) => Err(TunnelError::Rejected(format!(
                "bore server {to} refused the tunnel: {message}"
            ))
            .into()),
            Some(ServerMessage::Challenge(_)) => Err(TunnelError::Rejected(format!(
                "bore server {to} requires a secret; set {}",
                self.secret_source
            ))
            .into()),
            Some(_) => Err(TunnelError::Connection(format!(
                "bore server {to} sent an unexpected first message"
            ))
            .into()),
            None => Err(TunnelError::Connection(format!(
                "bore server {to} closed the control connection"
            ))
            .into()),
        }
    }

    /// A new tunnel on `remote_port` when the server still grants it, else on any port.
    /// Returns the session and whether it moved to another port.
    async fn remint(
        &self,
        local_port: u16,
        remote_port: u16,
    ) -> Result<(Session, bool), TunnelError> {
        match self.mint(local_port, remote_port).await {
            Ok(session) => Ok((session, false)),
            Err(MintError::PortUnavailable(why)) => {
                tracing::warn!(
                    remote_port,
                    reason = %why,
                    "bore server no longer grants the tunnel's port; opening one on a new port \
                     (sessions holding the old URL lose their endpoint)"
                );
                match self.mint(local_port, 0).await {
                    Ok(session) => Ok((session, true)),
                    Err(e) => Err(e.into_tunnel()),
                }
            }
            Err(MintError::Tunnel(e)) => Err(e),
        }
    }
}

/// Why a mint failed.
enum MintError {
    /// The server refused the requested port (taken, out of its range).
    PortUnavailable(String),
    /// Anything else.
    Tunnel(TunnelError),
}

impl MintError {
    fn into_tunnel(self) -> TunnelError {
        match self {
            MintError::PortUnavailable(why) => {
                TunnelError::Rejected(format!("bore server refused the tunnel: {why}"))
            }
            MintError::Tunnel(e) => e,
        }
    }
}

impl From<TunnelError> for MintError {
    fn from(e: TunnelError) -> Self {
        MintError::Tunnel(e)
    }
}

#[async_trait]
impl Tunnel for BoreTunnel {
    fn kind(&self) -> &'static str {
        "bore"
    }

    async fn expose(&self, port: u16) -> Result<Arc<dyn Endpoint>, Error> {
        let endpoint = BoreEndpoint::open(self.clone(), port).await?;
        Ok(Arc::new(endpoint))
    }
}

/// One control connection and its forwarding tasks.
struct Session {
    url: String,
    port: u16,
    dead: watch::Receiver<Option<String>>,
    task: JoinHandle<()>,
}

impl Session {
    fn death(&self) -> Option<String> {
        if self.task.is_finished() && self.dead.borrow().is_none() {
            return Some("bore control task ended".into());
        }
        self.dead.borrow().clone()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A live bore tunnel. Dropping it (or [`Endpoint::teardown`]) closes the control
/// connection and every forwarded connection.
///
/// It heals itself: when the control connection dies (the server restarted, the network
/// dropped), a repair task reconnects with exponential backoff and jitter, asking the
/// server for the *same* public port, so the URL handed out before the outage works
/// again. Only when the server no longer grants that port does the tunnel move to a new
/// one; [`Endpoint::url`] then changes and [`BoreEndpoint::moves`] counts it.
pub struct BoreEndpoint {
    inner: Arc<EndpointInner>,
    repair: JoinHandle<()>,
}

struct EndpointInner {
    tunnel: BoreTunnel,
    local_port: u16,
    session: Mutex<Option<Session>>,
    url: parking_url::Url,
    moves: AtomicU64,
    repairs: watch::Sender<u64>,
    torn_down: AtomicBool,
}

mod parking_url {
    use std::sync::{Mutex, PoisonError};

    /// The current URL, readable synchronously.
    pub(super) struct Url(Mutex<String>);

    impl Url {
        pub(super) fn new(url: String) -> Self {
            Url(Mutex::new(url))
        }
        pub(super) fn get(&self) -> String {
            self.0
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone()
        }
        pub(super) fn set(&self, url: String) {
            *self.0.lock().unwrap_or_else(PoisonError::into_inner) = url;
        }
    }
}

impl fmt::Debug for BoreEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoreEndpoint")
            .field("url", &self.inner.url.get())
            .field("local_port", &self.inner.local_port)
            .finish()
    }
}

impl BoreEndpoint {
    /// Opens a tunnel for `local_port`.
    pub async fn open(tunnel: BoreTunnel, local_port: u16) -> Result<Self, TunnelError> {
        let session = tunnel
            .mint(local_port, 0)
            .await
            .map_err(MintError::into_tunnel)?;
        let inner = Arc::new(EndpointInner {
            url: parking_url::Url::new(session.url.clone()),
            tunnel,
            local_port,
            session: Mutex::new(Some(session)),
            moves: AtomicU64::new(0),
            repairs: watch::channel(0).0,
            torn_down: AtomicBool::new(false),
        });
        let repair = tokio::spawn(repair_loop(Arc::clone(&inner)));
        Ok(BoreEndpoint { inner, repair })
    }

    /// Resolves when the current control connection is dead (closed by the server, no
    /// heartbeat, or torn down). Returns the reason.
    pub async fn closed(&self) -> String {
        let mut rx = match self.inner.session.lock().await.as_ref() {
            Some(s) => s.dead.clone(),
            None => return "torn down".into(),
        };
        let reason = match rx.wait_for(|d| d.is_some()).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => "bore control task ended".into(),
        };
        reason
    }

    /// How many times the tunnel moved to a new public port (a repair whose old port the
    /// server no longer granted). Every move invalidates the URLs handed out before it.
    pub fn moves(&self) -> u64 {
        self.inner.moves.load(Ordering::Relaxed)
    }

    /// Counts the repairs (in place or moved) so far; wait on it to see the next one.
    pub fn repairs(&self) -> watch::Receiver<u64> {
        self.inner.repairs.subscribe()
    }
}

impl EndpointInner {
    /// Repairs a dead session (same port first); `Ok(url)` when the tunnel works.
    async fn repair(&self) -> Result<String, TunnelError> {
        let mut guard = self.session.lock().await;
        let port = match guard.as_ref() {
            None => return Err(TunnelError::Gone("bore tunnel was torn down".into())),
            Some(s) => match s.death() {
                None => return Ok(s.url.clone()),
                Some(reason) => {
                    tracing::debug!(url = %s.url, %reason, "bore tunnel dead; repairing on the same port");
                    // Stop what is left of it before a new one starts.
                    s.task.abort();
                    s.port
                }
            },
        };
        let (session, moved) = self.tunnel.remint(self.local_port, port).await?;
        let url = session.url.clone();
        if moved {
            self.moves.fetch_add(1, Ordering::Relaxed);
        }
        self.url.set(url.clone());
        *guard = Some(session);
        self.repairs.send_modify(|n| *n += 1);
        Ok(url)
    }
}

/// Waits for the control connection to die, then repairs it with backoff; one warning
/// when the tunnel goes down, one when it is back.
async fn repair_loop(inner: Arc<EndpointInner>) {
    let (base, max) = inner.tunnel.repair_backoff;
    loop {
        let rx = match inner.session.lock().await.as_ref() {
            Some(s) => s.dead.clone(),
            None => return,
        };
        let mut rx = rx;
        let reason = match rx.wait_for(|d| d.is_some()).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => "bore control task ended".into(),
        };
        if inner.torn_down.load(Ordering::Relaxed) {
            return;
        }
        let still_dead = match inner.session.lock().await.as_ref() {
            Some(s) => s.death().is_some(),
            None => return,
        };
        if !still_dead {
            // Someone else (`refresh`) repaired it already.
            continue;
        }
        tracing::warn!(url = %inner.url.get(), %reason, "bore tunnel down; repairing in place");
        let mut attempt = 0u32;
        loop {
            match inner.repair().await {
                Ok(url) => {
                    tracing::warn!(%url, attempts = attempt + 1, "bore tunnel repaired");
                    break;
                }
                Err(e) if !e.retryable() && e.kind() == crate::TunnelErrorKind::Gone => return,
                Err(e) => {
                    attempt = attempt.saturating_add(1);
                    let delay = crate::prime::backoff(base, attempt, fastrand::f64()).min(max);
                    tracing::debug!(error = %e, attempt, ?delay, "bore tunnel repair failed; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }
}

impl Drop for BoreEndpoint {
    fn drop(&mut self) {
        self.repair.abort();
    }
}

#[async_trait]
impl Endpoint for BoreEndpoint {
    fn url(&self) -> String {
        self.inner.url.get()
    }

    async fn health(&self) -> Health {
        // A repair in progress holds the lock: the tunnel is down until it ends.
        let Ok(guard) = self.inner.session.try_lock() else {
            return Health::Unhealthy("bore tunnel is being repaired".into());
        };
        match guard.as_ref() {
            None => Health::Unhealthy("bore tunnel torn down".into()),
            Some(s) => match s.death() {
                None => Health::Healthy,
                Some(reason) => Health::Unhealthy(reason),
            },
        }
    }

    async fn refresh(&self) -> Result<String, Error> {
        Ok(self.inner.repair().await?)
    }

    /// Resolves when the current control connection is dead (closed, silent for the
    /// heartbeat timeout) or the tunnel was torn down; at once while it stays dead.
    async fn dead(&self) {
        self.closed().await;
    }

    async fn teardown(&self) -> Result<(), Error> {
        self.inner.torn_down.store(true, Ordering::Relaxed);
        self.repair.abort();
        if let Some(session) = self.inner.session.lock().await.take() {
            session.task.abort();
            tracing::info!(url = %session.url, "bore tunnel down");
        }
        Ok(())
    }
}

/// What a forwarded connection needs.
struct Forwarder {
    server: String,
    control_port: u16,
    auth: Option<Arc<Authenticator>>,
    local_host: String,
    local_port: u16,
    secret_source: String,
    connect_timeout: Duration,
}

impl Forwarder {
    async fn forward(&self, id: Uuid) -> Result<(), TunnelError> {
        let mut remote = connect(
            &self.server,
            self.control_port,
            self.auth.as_deref(),
            &self.secret_source,
            self.connect_timeout,
        )
        .await?;
        let to = format!("{}:{}", self.server, self.control_port);
        remote
            .send(ClientMessage::Accept(id))
            .await
            .map_err(|e| conn_err(&to, &e))?;
        let mut local = TcpStream::connect((self.local_host.as_str(), self.local_port))
            .await
            .map_err(|e| {
                TunnelError::Connection(format!(
                    "cannot reach the local server at {}:{}: {e}",
                    self.local_host, self.local_port
                ))
            })?;
        let mut parts = remote.into_parts();
        local
            .write_all(&parts.read_buf)
            .await
            .map_err(|e| TunnelError::io("bore forward", &e))?;
        let _ = tokio::io::copy_bidirectional(&mut local, &mut parts.io).await;
        Ok(())
    }
}

/// Reads the control connection until it dies; forwards each announced connection.
async fn run_control(
    mut control: Delimited<TcpStream>,
    forwarder: Forwarder,
    heartbeat_timeout: Duration,
    dead: watch::Sender<Option<String>>,
) {
    let forwarder = Arc::new(forwarder);
    let mut conns = JoinSet::new();
    let reason = loop {
        tokio::select! {
            msg = tokio::time::timeout(heartbeat_timeout, control.recv::<ServerMessage>()) => {
                match msg {
                    Err(_) => break format!("bore server sent nothing for {heartbeat_timeout:?}"),
                    Ok(Err(e)) => break format!("bore control connection failed: {e}"),
                    Ok(Ok(None)) => break "bore server closed the control connection".to_string(),
                    Ok(Ok(Some(ServerMessage::Connection(id)))) => {
                        let f = Arc::clone(&forwarder);
                        conns.spawn(async move {
                            if let Err(e) = f.forward(id).await {
                                tracing::warn!(%id, error = %e, "bore forwarded connection failed");
                            }
                        });
                    }
                    Ok(Ok(Some(ServerMessage::Error(e)))) => {
                        tracing::warn!(error = %e, "bore server error");
                    }
                    Ok(Ok(Some(_))) => {}
                }
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    };
    tracing::warn!(%reason, "bore tunnel control connection ended");
    let _ = dead.send(Some(reason));
    // Dropping `conns` aborts the forwarded connections.
}

async fn connect(
    host: &str,
    port: u16,
    auth: Option<&Authenticator>,
    secret_source: &str,
    within: Duration,
) -> Result<Delimited<TcpStream>, TunnelError> {
    let to = format!("{host}:{port}");
    let stream = tokio::time::timeout(within, TcpStream::connect((host, port)))
        .await
        .map_err(|_| {
            TunnelError::Timeout(format!(
                "bore server at {to} does not answer (connecting timed out after {within:?})"
            ))
        })?
        .map_err(|e| {
            TunnelError::Connection(format!(
                "cannot connect to bore server {to}: {e}; is `bore server` running there?"
            ))
        })?;
    let mut stream = Delimited::new(stream);
    if let Some(auth) = auth {
        client_handshake(&mut stream, auth, &to, secret_source, within).await?;
    }
    Ok(stream)
}

/// bore's challenge-response, with the failures told apart: silence is a retryable
/// timeout (a frozen or overloaded server), only an explicit refusal is an auth error.
async fn client_handshake(
    stream: &mut Delimited<TcpStream>,
    auth: &Authenticator,
    to: &str,
    secret_source: &str,
    within: Duration,
) -> Result<(), TunnelError> {
    let first = tokio::time::timeout(within, stream.recv::<ServerMessage>())
        .await
        .map_err(|_| {
            TunnelError::Timeout(format!(
                "bore server at {to} does not answer (no authentication challenge within \
                 {within:?}); is it overloaded or frozen?"
            ))
        })?
        .map_err(|e| conn_err(to, &e))?;
    let challenge = match first {
        Some(ServerMessage::Challenge(challenge)) => challenge,
        Some(ServerMessage::Error(message)) => {
            return Err(TunnelError::Rejected(format!(
                "bore server {to} refused the connection: {message}; check the bore secret \
                 ({secret_source})"
            )))
        }
        Some(_) => {
            return Err(TunnelError::Rejected(format!(
                "bore server {to} asked for no secret but one is set ({secret_source}); \
                 remove it or start the server with --secret"
            )))
        }
        None => {
            return Err(TunnelError::Connection(format!(
                "bore server {to} closed the connection before its authentication challenge"
            )))
        }
    };
    stream
        .send(ClientMessage::Authenticate(auth.answer(&challenge)))
        .await
        .map_err(|e| conn_err(to, &e))
}

fn conn_err(to: &str, e: &dyn fmt::Display) -> TunnelError {
    TunnelError::Connection(format!("bore server {to}: {e}"))
}

fn url_host(host: &str) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
        _ => host.to_string(),
    }
}

/// An in-process bore server (protocol-compatible with `bore server` 0.6): clients open a
/// control connection, each gets a public TCP port on the server's IP, and connections to
/// that port are handed to the client.
///
/// All its tasks belong to it: [`BoreServer::shutdown`] (or dropping it) closes the
/// control listener, every control connection and every public port.
pub struct BoreServer {
    control_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    frozen: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl fmt::Debug for BoreServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoreServer")
            .field("control_addr", &self.control_addr)
            .finish()
    }
}

type Pending = Arc<std::sync::Mutex<HashMap<Uuid, TcpStream>>>;

impl BoreServer {
    /// Binds the control port at `addr` (port 0 for an ephemeral one); public ports are
    /// opened on the same IP. With a `secret`, clients must authenticate.
    pub async fn bind(addr: SocketAddr, secret: Option<&str>) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let control_addr = listener.local_addr()?;
        let auth = secret.map(Authenticator::new).map(Arc::new);
        let (stop, stopped) = oneshot::channel();
        let (frozen, frozen_rx) = watch::channel(false);
        let task = tokio::spawn(serve(listener, auth, frozen_rx, stopped));
        Ok(BoreServer {
            control_addr,
            stop: Some(stop),
            frozen,
            task,
        })
    }

    /// Freezes the server (`true`) as a hung or overloaded one: it still accepts
    /// connections (the kernel does) and keeps every connection and public port open, but
    /// its control connections send nothing: no heartbeats, no answers to new clients, no
    /// new forwarded connections (those already forwarded keep flowing). `false` thaws it.
    pub fn freeze(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }

    /// The control address clients connect to.
    pub fn control_addr(&self) -> SocketAddr {
        self.control_addr
    }

    /// Stops the server and closes every connection and public port, waiting until they
    /// are closed (a port is free to bind again when this returns).
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for BoreServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(
    listener: TcpListener,
    auth: Option<Arc<Authenticator>>,
    frozen: watch::Receiver<bool>,
    mut stop: oneshot::Receiver<()>,
) {
    let pending: Pending = Arc::default();
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stop => {
                drop(listener);
                // Every control connection ends, and its public port is closed, before
                // the server reports itself stopped.
                conns.shutdown().await;
                return;
            }
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let auth = auth.clone();
                let pending = Arc::clone(&pending);
                let frozen = frozen.clone();
                let ip = listener.local_addr().map(|a| a.ip());
                conns.spawn(async move {
                    if let Ok(ip) = ip {
                        if let Err(e) = serve_control(stream, ip, auth, frozen, pending).await {
                            tracing::debug!(error = %e, "bore server connection ended");
                        }
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
}

async fn serve_control(
    stream: TcpStream,
    ip: IpAddr,
    auth: Option<Arc<Authenticator>>,
    mut frozen: watch::Receiver<bool>,
    pending: Pending,
) -> Result<(), String> {
    thawed(&mut frozen).await;
    let mut stream = Delimited::new(stream);
    if let Some(auth) = auth {
        if let Err(e) = auth.server_handshake(&mut stream).await {
            let _ = stream.send(ServerMessage::Error(e.to_string())).await;
            return Ok(());
        }
    }
    match stream.recv_timeout().await.map_err(|e| e.to_string())? {
        Some(ClientMessage::Hello(port)) => {
            let listener = match TcpListener::bind((ip, port)).await {
                Ok(l) => l,
                Err(e) => {
                    let _ = stream.send(ServerMessage::Error(e.to_string())).await;
                    return Ok(());
                }
            };
            let port = listener.local_addr().map_err(|e| e.to_string())?.port();
            stream
                .send(ServerMessage::Hello(port))
                .await
                .map_err(|e| e.to_string())?;
            // Connections announced to this client are dropped when it goes away.
            let mut mine = Announced {
                pending: Arc::clone(&pending),
                ids: Vec::new(),
            };
            loop {
                thawed(&mut frozen).await;
                stream
                    .send(ServerMessage::Heartbeat)
                    .await
                    .map_err(|e| e.to_string())?;
                if let Ok(accepted) =
                    tokio::time::timeout(Duration::from_millis(500), listener.accept()).await
                {
                    let (conn, _) = accepted.map_err(|e| e.to_string())?;
                    let id = Uuid::new_v4();
                    lock(&pending).insert(id, conn);
                    mine.ids.push(id);
                    if mine.ids.len() > 64 {
                        // Forget ids the client has long since accepted.
                        let map = lock(&pending);
                        mine.ids.retain(|i| map.contains_key(i));
                    }
                    stream
                        .send(ServerMessage::Connection(id))
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        Some(ClientMessage::Accept(id)) => {
            let conn = lock(&pending).remove(&id);
            if let Some(mut conn) = conn {
                let mut parts = stream.into_parts();
                conn.write_all(&parts.read_buf)
                    .await
                    .map_err(|e| e.to_string())?;
                let _ = tokio::io::copy_bidirectional(&mut parts.io, &mut conn).await;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Waits while the server is frozen ([`BoreServer::freeze`]).
async fn thawed(frozen: &mut watch::Receiver<bool>) {
    // The sender lives as long as the server, whose tasks end with it.
    let _ = frozen.wait_for(|f| !*f).await;
}

/// Ids announced on one control connection; dropping it drops their unaccepted
/// connections, so a public port of a dead client refuses rather than hangs.
struct Announced {
    pending: Pending,
    ids: Vec<Uuid>,
}

impl Drop for Announced {
    fn drop(&mut self) {
        let mut map = lock(&self.pending);
        for id in &self.ids {
            map.remove(id);
        }
    }
}

fn lock(pending: &Pending) -> std::sync::MutexGuard<'_, HashMap<Uuid, TcpStream>> {
    pending
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_hosts_are_bracketed() {
        assert_eq!(url_host("::1"), "[::1]");
        assert_eq!(url_host("bore.example.com"), "bore.example.com");
        assert_eq!(url_host("10.0.0.1"), "10.0.0.1");
    }

    #[tokio::test]
    async fn wrong_secret_is_rejected_with_an_actionable_message() {
        let server = BoreServer::bind("127.0.0.1:0".parse().unwrap(), Some("right"))
            .await
            .unwrap();
        let tunnel = BoreTunnel::new("127.0.0.1")
            .with_control_port(server.control_addr().port())
            .with_secret(Some("wrong".into()));
        let err = BoreEndpoint::open(tunnel, 1).await.unwrap_err();
        assert_eq!(err.kind(), crate::TunnelErrorKind::Rejected, "{err}");
        assert!(err.to_string().contains("secret"), "{err}");
        let tunnel = BoreTunnel::new("127.0.0.1").with_control_port(server.control_addr().port());
        let err = BoreEndpoint::open(tunnel, 1).await.unwrap_err();
        assert!(err.to_string().contains("requires a secret"), "{err}");
        server.shutdown().await;
    }

    #[tokio::test]
    async fn unreachable_server_is_a_retryable_connection_error() {
        let probe = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let tunnel = BoreTunnel::new("127.0.0.1").with_control_port(port);
        let err = BoreEndpoint::open(tunnel, 1).await.unwrap_err();
        assert_eq!(err.kind(), crate::TunnelErrorKind::Connection);
        assert!(err.retryable());
        assert!(err.to_string().contains("bore server"), "{err}");
    }
}
