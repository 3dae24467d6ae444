//! The `prime` backend: Prime Intellect's tunnel service (an HTTP API that registers a
//! tunnel, plus an `frpc` child process that carries the traffic).
//!
//! One [`PrimeTunnel::expose`] call, per attempt: find or install frpc, take a slot from
//! the host-wide [`RateLimiter`], register (`POST /api/v1/tunnel`), write the frpc TOML
//! (`~/.prime/tunnels/<id>.toml`, dir 0700, file 0600, values escaped), start frpc and
//! classify its output until it connects (30 s by default). Any failure cleans up
//! everything (kill frpc, `DELETE` the registration, remove the file); retryable
//! failures are retried 3 times with jittered exponential backoff.
//!
//! The [`PrimeEndpoint`] owns the frpc process (killed when the endpoint is dropped, and on
//! Linux when this process dies, even by SIGKILL) and
//! the registration (deleted on [`Endpoint::teardown`], or in the background when the
//! endpoint is dropped). Its health is "frpc runs, frpc did not report the tunnel gone, and
//! the registration is not expired/terminated" — the API is asked at most once per
//! [`PrimeConfig::health_ttl`], and an API that cannot be reached counts as healthy (a flaky
//! API must not mass-kill tunnels). [`Endpoint::refresh`] heals: a dead frpc with a live
//! registration is restarted (same URL); a gone registration is replaced by a new tunnel
//! (new URL, through the rate limiter).
//!
//! A tunnel the service reaped can keep its frpc running and its registration listed
//! while the edge answers every request to its URL with 404 [`REAPED`] ("Tunnel not
//! found or no longer active"). The health check therefore also asks the public URL
//! (`GET /`, no credentials, once per TTL), and a harness that saw that answer can say
//! so ([`Endpoint::report_failure`], reached through `SlotGuard::report_tunnel_failure`):
//! either way the endpoint counts as dead, [`Endpoint::dead`] resolves, and
//! [`Endpoint::refresh`] mints a new tunnel instead of restarting frpc.

pub mod account;
mod api;
pub mod frpc;
pub mod install;

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use intercept_core::{Endpoint, Error, Health, Tunnel};
use serde::{Deserialize, Serialize};
use serde_with::{As, DurationSecondsWithFrac};
use tokio::sync::{watch, Mutex};
use tokio::time::Instant;

pub use account::{PrimeAccount, PrimeEnv};
pub use api::{shows_reaped, TunnelInfo, REAPED};
pub use frpc::FrpcEvent;
pub use install::FrpcInstall;

use api::PrimeApi;
use frpc::Frpc;

use crate::error::TunnelError;
use crate::limiter::{RateLimit, RateLimiter};

/// Configuration of the `prime` backend. Every field has a default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PrimeConfig {
    /// The frpc binary; `None` uses `$FRPC_PATH`, then `~/.prime/bin/frpc` (installed on
    /// demand).
    pub frpc_path: Option<PathBuf>,
    /// How frpc is downloaded when missing.
    pub frpc: FrpcInstall,
    /// The address frpc forwards to (the server binds it too). Default `127.0.0.1`.
    pub local_addr: IpAddr,
    /// How long frpc may take to connect (seconds). Default 30.
    #[serde(with = "As::<DurationSecondsWithFrac<f64>>")]
    pub connection_timeout: Duration,
    /// How long an API health answer is trusted (seconds). Default 60.
    #[serde(with = "As::<DurationSecondsWithFrac<f64>>")]
    pub health_ttl: Duration,
    /// Timeout of one API request (seconds). Default 30.
    #[serde(with = "As::<DurationSecondsWithFrac<f64>>")]
    pub api_timeout: Duration,
    /// Retries after a failed attempt (only retryable failures are retried). Default 3.
    pub retries: u32,
    /// First backoff between attempts (seconds), doubled each time, jittered, capped at
    /// 30 s. Default 0.5.
    #[serde(with = "As::<DurationSecondsWithFrac<f64>>")]
    pub initial_backoff: Duration,
    /// frpc's log level. Default `info` (frpc's connection lines are at info level).
    pub log_level: String,
    /// An optional name for the registrations.
    pub name: Option<String>,
    /// The host-wide creation rate limit (512 starts a minute by default).
    pub rate_limit: RateLimit,
}

impl Default for PrimeConfig {
    fn default() -> Self {
        PrimeConfig {
            frpc_path: None,
            frpc: FrpcInstall::default(),
            local_addr: IpAddr::from([127, 0, 0, 1]),
            connection_timeout: Duration::from_secs(30),
            health_ttl: Duration::from_secs(60),
            api_timeout: Duration::from_secs(30),
            retries: 3,
            initial_backoff: Duration::from_millis(500),
            log_level: "info".into(),
            name: None,
            rate_limit: RateLimit::default(),
        }
    }
}

/// The jittered exponential backoff before retry `attempt` (1-based): `initial * 2^(n-1)`
/// capped at 30 s, scaled by `0.5 + jitter / 2` with `jitter` in `[0, 1)`.
pub fn backoff(initial: Duration, attempt: u32, jitter: f64) -> Duration {
    let base = initial
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
        .min(Duration::from_secs(30));
    base.mul_f64(0.5 + jitter.clamp(0.0, 1.0) / 2.0)
}

/// The longest a registration delete may take at teardown (as the Python system).
pub const DELETE_TIMEOUT: Duration = Duration::from_secs(5);

/// What [`PrimeEndpoint::status`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrimeStatus {
    /// The tunnel id.
    pub tunnel_id: String,
    /// The registration's status (lower case), or `None` when it no longer exists.
    pub registration: Option<String>,
    /// Whether the tunnel is gone for good (no registration, expired, terminated, or frpc
    /// said so).
    pub gone: bool,
    /// Whether frpc is running.
    pub frpc_running: bool,
}

/// Shared by a tunnel and its endpoints.
struct Shared {
    config: PrimeConfig,
    env: PrimeEnv,
    api: PrimeApi,
    limiter: RateLimiter,
}

/// The Prime tunnel backend. Construct it once and share it; each
/// [`expose`](Tunnel::expose) creates a tunnel.
#[derive(Clone)]
pub struct PrimeTunnel {
    shared: Arc<Shared>,
}

impl fmt::Debug for PrimeTunnel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrimeTunnel")
            .field("api", &self.shared.api)
            .field("limiter", &self.shared.limiter)
            .finish()
    }
}

impl PrimeTunnel {
    /// A Prime tunnel configured from the process environment and `~/.prime`. Fails when
    /// no API key is configured.
    pub fn new(config: PrimeConfig) -> Result<Self, TunnelError> {
        PrimeTunnel::with_env(config, PrimeEnv::from_process())
    }

    /// A Prime tunnel configured from `env` (tests inject a home and variables).
    pub fn with_env(config: PrimeConfig, env: PrimeEnv) -> Result<Self, TunnelError> {
        let account = PrimeAccount::resolve(&env)?;
        let limiter =
            RateLimiter::new(&config.rate_limit, &format!("prime-{}", account.key_tag()))?;
        let api = PrimeApi::new(account, config.api_timeout)?;
        Ok(PrimeTunnel {
            shared: Arc::new(Shared {
                config,
                env,
                api,
                limiter,
            }),
        })
    }

    /// The resolved account (the API key is not printable).
    pub fn account(&self) -> &PrimeAccount {
        self.shared.api.account()
    }

    /// The rate limiter every creation goes through.
    pub fn limiter(&self) -> &RateLimiter {
        &self.shared.limiter
    }

    /// Creates a tunnel to `local_port`, with retries.
    pub async fn open(&self, local_port: u16) -> Result<PrimeEndpoint, TunnelError> {
        let live = self.shared.start_with_retries(local_port).await?;
        Ok(PrimeEndpoint {
            shared: Arc::clone(&self.shared),
            local_port,
            url: StdMutex::new(live.info.url.trim_end_matches('/').to_string()),
            state: Mutex::new(State {
                live: Some(live),
                checked: None,
            }),
            reaped: watch::channel(None).0,
        })
    }
}

#[async_trait]
impl Tunnel for PrimeTunnel {
    fn kind(&self) -> &'static str {
        "prime"
    }

    fn bind_addr(&self) -> intercept_core::BindAddr {
        intercept_core::BindAddr {
            host: self.shared.config.local_addr,
            port: 0,
        }
    }

    async fn expose(&self, port: u16) -> Result<Arc<dyn Endpoint>, Error> {
        Ok(Arc::new(self.open(port).await?))
    }
}

impl Shared {
    fn tunnels_dir(&self) -> PathBuf {
        self.env.prime_dir().join("tunnels")
    }

    async fn start_with_retries(self: &Arc<Self>, local_port: u16) -> Result<Live, TunnelError> {
        let label = format!("host tunnel (port {local_port})");
        let mut attempt = 0;
        loop {
            match self.start_once(local_port).await {
                Ok(live) => return Ok(live),
                Err(e) if e.retryable() && attempt < self.config.retries => {
                    attempt += 1;
                    let delay = backoff(self.config.initial_backoff, attempt, fastrand::f64());
                    tracing::warn!(error = %e, attempt, ?delay, "{label}: retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(e) => {
                    tracing::error!(error = %e, "{label} failed");
                    return Err(e);
                }
            }
        }
    }

    /// One attempt: everything it created is cleaned up when it fails.
    async fn start_once(self: &Arc<Self>, local_port: u16) -> Result<Live, TunnelError> {
        let binary = install::ensure_frpc(
            self.config.frpc_path.as_deref(),
            &self.env,
            &self.config.frpc,
        )
        .await?;
        let permit = self.limiter.acquire().await?;
        let created = self
            .api
            .create(local_port, self.config.name.as_deref())
            .await;
        // The slot counts until the registration request completed (plus the margin).
        permit.complete().await;
        let info = created?;
        let mut live = Live {
            shared: Arc::clone(self),
            binary,
            info,
            config: None,
            frpc: None,
            stopped: false,
        };
        match live.launch().await {
            Ok(()) => {
                tracing::info!(url = %live.info.url, tunnel_id = %live.info.tunnel_id, "prime tunnel up");
                Ok(live)
            }
            Err(e) => {
                let _ = live.stop().await;
                Err(e)
            }
        }
    }
}

/// One registration with its config file and frpc process. Dropping it without
/// [`Live::stop`] still kills frpc, removes the file and deletes the registration in the
/// background.
struct Live {
    shared: Arc<Shared>,
    binary: PathBuf,
    info: TunnelInfo,
    config: Option<PathBuf>,
    frpc: Option<Frpc>,
    stopped: bool,
}

impl Live {
    /// Writes the config (first time) and starts frpc, waiting for it to connect.
    async fn launch(&mut self) -> Result<(), TunnelError> {
        let path = match &self.config {
            Some(p) => p.clone(),
            None => {
                let text = frpc::render_config(
                    &self.info,
                    &self.shared.config.local_addr.to_string(),
                    &self.shared.config.log_level,
                );
                let dir = self.shared.tunnels_dir();
                let id = self.info.tunnel_id.clone();
                let path =
                    tokio::task::spawn_blocking(move || frpc::write_config(&dir, &id, &text))
                        .await
                        .map_err(|e| TunnelError::Io(format!("config writer failed: {e}")))??;
                self.config = Some(path.clone());
                path
            }
        };
        if let Some(old) = self.frpc.take() {
            old.stop().await;
        }
        let mut process = Frpc::spawn(&self.binary, &path, &self.info.tunnel_id)?;
        let result = process
            .wait_connected(self.shared.config.connection_timeout)
            .await;
        self.frpc = Some(process);
        result
    }

    fn frpc_running(&self) -> bool {
        self.frpc.as_ref().is_some_and(Frpc::running)
    }

    fn frpc_gone(&self) -> bool {
        self.frpc.as_ref().is_some_and(Frpc::gone)
    }

    /// Kills frpc first (so nothing outlives us even when the API is down), removes the
    /// config, then deletes the registration within [`DELETE_TIMEOUT`]; a failed or slow
    /// delete is returned (the registration then expires on Prime's side).
    async fn stop(&mut self) -> Result<(), TunnelError> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        if let Some(p) = self.frpc.take() {
            p.stop().await;
        }
        if let Some(path) = self.config.take() {
            let _ = std::fs::remove_file(path);
        }
        let id = &self.info.tunnel_id;
        let result = match tokio::time::timeout(DELETE_TIMEOUT, self.shared.api.delete(id)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(TunnelError::Timeout(format!(
                "deleting tunnel {id} did not finish within {DELETE_TIMEOUT:?}; it expires on \
                 Prime's side"
            ))),
        };
        if let Err(e) = &result {
            tracing::warn!(tunnel_id = %id, error = %e, "could not delete the tunnel registration");
        }
        result
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if self.stopped {
            return;
        }
        // frpc dies with its handle (kill_on_drop).
        drop(self.frpc.take());
        if let Some(path) = self.config.take() {
            let _ = std::fs::remove_file(path);
        }
        let api = self.shared.api.clone();
        let id = self.info.tunnel_id.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                // Best effort, bounded: nothing else can own a cleanup that outlives us.
                handle.spawn(async move {
                    let _ = tokio::time::timeout(DELETE_TIMEOUT, api.delete(&id)).await;
                });
            }
            Err(_) => {
                tracing::warn!(tunnel_id = %id, "prime tunnel dropped outside a runtime; its registration expires on its own");
            }
        }
    }
}

struct State {
    live: Option<Live>,
    /// The last API health answer and when it was taken.
    checked: Option<(Instant, Option<String>)>,
}

/// A live Prime tunnel. See the [module docs](self) for health and healing.
pub struct PrimeEndpoint {
    shared: Arc<Shared>,
    local_port: u16,
    url: StdMutex<String>,
    state: Mutex<State>,
    /// Why the current tunnel counts as reaped (its URL answered [`REAPED`]), if it does.
    reaped: watch::Sender<Option<String>>,
}

impl fmt::Debug for PrimeEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrimeEndpoint")
            .field("url", &self.url())
            .field("local_port", &self.local_port)
            .finish()
    }
}

/// Registration statuses that mean the tunnel is gone for good.
fn terminal(status: &str) -> bool {
    matches!(status, "expired" | "terminated")
}

impl PrimeEndpoint {
    /// The current tunnel id (`None` after teardown).
    pub async fn tunnel_id(&self) -> Option<String> {
        let state = self.state.lock().await;
        state.live.as_ref().map(|l| l.info.tunnel_id.clone())
    }

    /// The frpc process id (`None` after teardown).
    pub async fn frpc_pid(&self) -> Option<u32> {
        let state = self.state.lock().await;
        state
            .live
            .as_ref()
            .and_then(|l| l.frpc.as_ref())
            .and_then(Frpc::pid)
    }

    /// The config file frpc runs with (`None` after teardown).
    pub async fn config_path(&self) -> Option<PathBuf> {
        let state = self.state.lock().await;
        state.live.as_ref().and_then(|l| l.config.clone())
    }

    /// Resolves when the current frpc process exits (at once if none runs); returns how
    /// it exited. For supervisors and tests that want to react to a dead frpc.
    pub async fn frpc_exited(&self) -> String {
        let rx = {
            let state = self.state.lock().await;
            state
                .live
                .as_ref()
                .and_then(|l| l.frpc.as_ref())
                .map(Frpc::exit_watch)
        };
        let Some(mut rx) = rx else {
            return "no frpc running".into();
        };
        let exit = match rx.wait_for(Option::is_some).await {
            Ok(e) => e.clone().unwrap_or_default(),
            Err(_) => "frpc supervisor ended".into(),
        };
        exit
    }

    /// Resolves when the current frpc reports the tunnel gone (deleted, expired or
    /// disconnected too long), or exits. For supervisors that react to a dead tunnel
    /// instead of polling [`Endpoint::health`].
    pub async fn gone_or_exited(&self) {
        let watches = {
            let state = self.state.lock().await;
            state
                .live
                .as_ref()
                .and_then(|l| l.frpc.as_ref())
                .map(|f| (f.gone_watch(), f.exit_watch()))
        };
        let Some((mut gone, mut exit)) = watches else {
            return;
        };
        tokio::select! {
            _ = gone.wait_for(|g| *g) => {}
            _ = exit.wait_for(Option::is_some) => {}
        }
    }

    /// Asks the API for the registration now (no caching).
    pub async fn status(&self) -> Result<PrimeStatus, TunnelError> {
        let state = self.state.lock().await;
        let live = state
            .live
            .as_ref()
            .ok_or_else(|| TunnelError::Connection("the tunnel was torn down".into()))?;
        let record = self.shared.api.get(&live.info.tunnel_id).await?;
        let registration = record
            .and_then(|r| r.status)
            .map(|s| s.to_ascii_lowercase());
        let gone = match &registration {
            None => true,
            Some(s) => terminal(s),
        } || live.frpc_gone();
        Ok(PrimeStatus {
            tunnel_id: live.info.tunnel_id.clone(),
            registration,
            gone,
            frpc_running: live.frpc_running(),
        })
    }

    /// Restarts frpc with the same registration and config (same URL). Cannot revive a
    /// gone tunnel: that fails with [`TunnelError::Gone`]; use [`Endpoint::refresh`].
    pub async fn restart(&self) -> Result<(), TunnelError> {
        let mut state = self.state.lock().await;
        let live = state
            .live
            .as_mut()
            .ok_or_else(|| TunnelError::Connection("the tunnel was torn down".into()))?;
        if live.frpc_gone() {
            return Err(TunnelError::Gone(format!(
                "tunnel {} is gone; a restart cannot revive it",
                live.info.tunnel_id
            )));
        }
        let result = live.launch().await;
        state.checked = None;
        result
    }

    /// Why the tunnel is unhealthy, from local facts only (frpc state).
    fn local_problem(live: &Live) -> Option<String> {
        if live.frpc_gone() {
            return Some(format!(
                "tunnel {} is gone (frpc said so)",
                live.info.tunnel_id
            ));
        }
        if !live.frpc_running() {
            return Some(format!(
                "frpc for tunnel {} is not running",
                live.info.tunnel_id
            ));
        }
        None
    }

    /// The registration's problem per the API, asked at most once per TTL. An API failure
    /// counts as no problem.
    async fn api_problem(&self, state: &mut State) -> Option<String> {
        let live = state.live.as_ref()?;
        let ttl = self.shared.config.health_ttl;
        if let Some((at, verdict)) = &state.checked {
            if at.elapsed() < ttl {
                return verdict.clone();
            }
        }
        let id = live.info.tunnel_id.clone();
        let verdict = match self.shared.api.get(&id).await {
            Ok(None) => Some(format!("tunnel {id} no longer exists")),
            Ok(Some(info)) => match info.status.map(|s| s.to_ascii_lowercase()) {
                Some(s) if terminal(&s) => Some(format!("tunnel {id} is {s}")),
                // The registration looks fine: does the edge still route the URL?
                _ => match self.shared.api.edge_reaped(&live.info.url).await {
                    Some(true) => {
                        let why = format!(
                            "tunnel {id} was reaped by the service: its URL answers 404 \"{REAPED}\""
                        );
                        self.reaped.send_replace(Some(why.clone()));
                        Some(why)
                    }
                    _ => None,
                },
            },
            Err(e) => {
                tracing::warn!(tunnel_id = %id, error = %e, "tunnel health check failed; assuming healthy");
                None
            }
        };
        state.checked = Some((Instant::now(), verdict.clone()));
        verdict
    }

    fn set_url(&self, url: &str) {
        *self.url.lock().unwrap_or_else(PoisonError::into_inner) =
            url.trim_end_matches('/').to_string();
    }
}

#[async_trait]
impl Endpoint for PrimeEndpoint {
    fn url(&self) -> String {
        self.url
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn health(&self) -> Health {
        let mut state = self.state.lock().await;
        let Some(live) = state.live.as_ref() else {
            return Health::Unhealthy("prime tunnel torn down".into());
        };
        if let Some(why) = self.reaped.borrow().clone() {
            return Health::Unhealthy(why);
        }
        if let Some(problem) = Self::local_problem(live) {
            return Health::Unhealthy(problem);
        }
        match self.api_problem(&mut state).await {
            Some(problem) => Health::Unhealthy(problem),
            None => Health::Healthy,
        }
    }

    async fn refresh(&self) -> Result<String, Error> {
        let mut state = self.state.lock().await;
        let Some(live) = state.live.as_ref() else {
            return Err(TunnelError::Gone("the prime tunnel was torn down".into()).into());
        };
        let local = Self::local_problem(live);
        let reaped = self.reaped.borrow().clone();
        let remote = if reaped.is_some() {
            reaped
        } else if local.is_none() || !live.frpc_gone() {
            self.api_problem(&mut state).await
        } else {
            None
        };
        if local.is_none() && remote.is_none() {
            return Ok(self.url());
        }
        // Only frpc died and the registration is fine: restart it, same URL.
        let gone = remote.is_some() || state.live.as_ref().is_some_and(Live::frpc_gone);
        if !gone {
            if let Some(live) = state.live.as_mut() {
                tracing::warn!(tunnel_id = %live.info.tunnel_id, reason = ?local, "restarting frpc");
                match live.launch().await {
                    Ok(()) => {
                        state.checked = None;
                        return Ok(self.url());
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "frpc restart failed; replacing the tunnel")
                    }
                }
            }
        }
        // Replace the tunnel: clean the old one up, then mint a new one.
        if let Some(mut old) = state.live.take() {
            tracing::warn!(tunnel_id = %old.info.tunnel_id, reason = ?local.or(remote), "replacing the prime tunnel");
            let _ = old.stop().await;
        }
        state.checked = None;
        let live = self.shared.start_with_retries(self.local_port).await?;
        self.set_url(&live.info.url);
        state.live = Some(live);
        self.reaped.send_replace(None);
        Ok(self.url())
    }

    /// Resolves when the tunnel counts as reaped, or its frpc reports it gone or exits;
    /// at once while that lasts, and after teardown.
    async fn dead(&self) {
        let mut reaped = self.reaped.subscribe();
        tokio::select! {
            _ = reaped.wait_for(Option::is_some) => {}
            () = self.gone_or_exited() => {}
        }
    }

    /// Recognises the edge's answer for a reaped tunnel ([`REAPED`]) in `text`; when `url`
    /// is still this endpoint's URL, the tunnel counts as reaped from then on.
    fn report_failure(&self, url: &str, text: &str) -> bool {
        if !shows_reaped(text) {
            return false;
        }
        if url.trim_end_matches('/') == self.url() {
            tracing::warn!(
                url,
                "a harness reports the prime tunnel reaped by the service"
            );
            self.reaped.send_replace(Some(format!(
                "a harness reports the tunnel at {url} reaped by the service (404 \"{REAPED}\")"
            )));
        }
        true
    }

    async fn teardown(&self) -> Result<(), Error> {
        let mut state = self.state.lock().await;
        if let Some(mut live) = state.live.take() {
            live.stop().await?;
            tracing::info!(tunnel_id = %live.info.tunnel_id, "prime tunnel down");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_exponential_jittered_and_capped() {
        let i = Duration::from_millis(500);
        assert_eq!(backoff(i, 1, 1.0), Duration::from_millis(500));
        assert_eq!(backoff(i, 1, 0.0), Duration::from_millis(250));
        assert_eq!(backoff(i, 2, 1.0), Duration::from_secs(1));
        assert_eq!(backoff(i, 3, 1.0), Duration::from_secs(2));
        assert_eq!(backoff(i, 10, 1.0), Duration::from_secs(30));
        assert_eq!(backoff(i, 100, 0.0), Duration::from_secs(15));
        for n in 1..20 {
            for j in [0.0, 0.3, 0.99] {
                let d = backoff(i, n, j);
                assert!(d <= Duration::from_secs(30) && d >= Duration::from_millis(250));
            }
        }
    }

    #[test]
    fn config_defaults_and_serde() {
        let c: PrimeConfig =
            serde_json::from_str(r#"{"connection_timeout": 5, "retries": 0}"#).unwrap();
        assert_eq!(c.connection_timeout, Duration::from_secs(5));
        assert_eq!(c.retries, 0);
        assert_eq!(c.health_ttl, Duration::from_secs(60));
        assert_eq!(c.rate_limit.rate, 512);
        assert!(serde_json::from_str::<PrimeConfig>(r#"{"bogus": 1}"#).is_err());
    }

    #[test]
    fn construction_needs_an_api_key() {
        let home = tempfile::tempdir().unwrap();
        let err = PrimeTunnel::with_env(PrimeConfig::default(), PrimeEnv::with_home(home.path()))
            .unwrap_err();
        assert_eq!(err.kind(), crate::TunnelErrorKind::Config);
        let t = PrimeTunnel::with_env(
            PrimeConfig::default(),
            PrimeEnv::with_home(home.path()).var("PRIME_API_KEY", "k"),
        )
        .unwrap();
        assert_eq!(t.kind(), "prime");
        assert!(t.bind_addr().host.is_loopback());
        assert!(!format!("{t:?}").contains("\"k\""));
    }
}
