//! The lifecycle every interception shape shares (one server, a static pool, an elastic
//! pool), and the guard a rollout holds while it runs.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Error;
use crate::session::Session;
use crate::slot::Slot;
use crate::tunnel::Endpoint;

/// One interception: a server or a pool of servers that rollouts acquire slots on.
#[async_trait]
pub trait Interception: Send + Sync + fmt::Debug {
    /// Brings the servers (and tunnels) up. A failing start tears down what it created.
    async fn start(&self) -> Result<(), Error>;

    /// Tears every server and tunnel down in reverse order of creation, going on past a
    /// failing teardown; the error reports every failure.
    async fn stop(&self) -> Result<(), Error>;

    /// Registers a session and returns its slot. The registration is visible (in
    /// [`Interception::load`]) before this returns; dropping or closing the guard frees
    /// the slot and releases the session.
    async fn acquire(&self, session: Arc<dyn Session>) -> Result<SlotGuard, Error>;

    /// Registered sessions across all servers.
    fn load(&self) -> usize;

    /// The servers behind this interception as they are now (for introspection: a
    /// sidecar's status route, metrics). Defaults to an empty list.
    async fn servers(&self) -> Vec<ServerStatus> {
        Vec::new()
    }

    /// Model calls in flight across all servers. Defaults to 0.
    fn inflight(&self) -> usize {
        0
    }

    /// Pauses new model calls (e.g. while the trainer swaps weights): with
    /// [`PauseMode::Hold`] they wait until [`Interception::resume`] (at most the hold
    /// timeout, then 503); with [`PauseMode::Reject`] they get 429 with `Retry-After` at
    /// once. Calls already admitted, streams already relaying included, finish. Pausing
    /// a paused interception changes its mode. Returns the status right after pausing.
    ///
    /// The default refuses: an interception that cannot pause must say so. A pool
    /// pauses every member server (and servers it starts while paused).
    async fn pause(&self, _mode: PauseMode) -> Result<PauseStatus, Error> {
        Err(Error::Conflict(
            "this interception cannot pause; pause its servers one by one".into(),
        ))
    }

    /// Resumes model calls: held calls proceed, the pause epoch goes up by one (so
    /// records tell which weights served them). Resuming an interception that is not
    /// paused changes nothing. Returns the status right after resuming.
    async fn resume(&self) -> Result<PauseStatus, Error> {
        Err(Error::Conflict(
            "this interception cannot pause or resume; resume its servers one by one".into(),
        ))
    }

    /// Whether new model calls are paused, the current epoch, and the calls in flight.
    /// The default reports "never paused, epoch 0" and [`Interception::inflight`].
    fn pause_status(&self) -> PauseStatus {
        PauseStatus {
            paused: false,
            mode: None,
            epoch: 0,
            inflight: self.inflight(),
            held: 0,
        }
    }
}

/// How an interception treats new model calls while paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PauseMode {
    /// New calls wait until resume; a call held longer than `timeout` gets 503 with
    /// `Retry-After`.
    Hold {
        /// The longest a call is held.
        timeout: Duration,
    },
    /// New calls get 429 with `Retry-After: <retry_after>` (whole seconds, at least 1) at
    /// once, which OpenAI and Anthropic SDKs honour when they retry.
    Reject {
        /// The wait suggested to the harness.
        retry_after: Duration,
    },
}

impl PauseMode {
    /// `hold` with a timeout.
    pub fn hold(timeout: Duration) -> Self {
        PauseMode::Hold { timeout }
    }

    /// `reject` with a suggested retry delay.
    pub fn reject(retry_after: Duration) -> Self {
        PauseMode::Reject { retry_after }
    }

    /// The mode's name.
    pub fn kind(&self) -> PauseKind {
        match self {
            PauseMode::Hold { .. } => PauseKind::Hold,
            PauseMode::Reject { .. } => PauseKind::Reject,
        }
    }
}

/// The name of a [`PauseMode`], as reported in a [`PauseStatus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PauseKind {
    /// See [`PauseMode::Hold`].
    Hold,
    /// See [`PauseMode::Reject`].
    Reject,
}

/// Pause state of an interception (`GET /v1/interception` of the sidecar shows it).
///
/// The trainer may swap weights once `paused` is true and `inflight` is 0: no call is
/// then being served, and none is admitted until resume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PauseStatus {
    /// Whether new model calls are paused.
    pub paused: bool,
    /// The mode, while paused.
    pub mode: Option<PauseKind>,
    /// The pause epoch: 0 at start, plus one at each resume. Every call record carries
    /// the epoch in which the call was admitted.
    pub epoch: u64,
    /// Model calls admitted and not yet finished (streams still relaying included).
    pub inflight: usize,
    /// Calls waiting for resume (mode `hold`).
    pub held: usize,
}

/// One server of an interception, as [`Interception::servers`] reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ServerStatus {
    /// Its public base URL (the tunnel's current URL, or `http://<local addr>`); `None`
    /// while it has none (not started).
    pub base_url: Option<String>,
    /// Sessions registered on it.
    pub load: usize,
    /// Whether its endpoint carries traffic (true when it has no tunnel and is running).
    pub healthy: bool,
}

/// What frees a slot. Implemented by each interception shape.
#[async_trait]
pub trait SlotRelease: Send + Sync + fmt::Debug {
    /// Frees the slot at once without waiting: the secrets stop working, in-flight calls
    /// are cancelled; they record, then the session is released in the background.
    fn release_now(&self);

    /// Frees the slot and waits until every in-flight call has recorded and the session
    /// was released.
    async fn release(&self);
}

/// A rollout's hold on a slot. Drop it (or call [`SlotGuard::close`]) when the rollout
/// ends: late calls then get 409 `rollout concluded` and in-flight calls are cancelled,
/// so no turn lands on a sealed trace.
#[derive(Debug)]
pub struct SlotGuard {
    slot: Slot,
    release: Option<Box<dyn SlotRelease>>,
    endpoint: Option<Arc<dyn Endpoint>>,
}

impl SlotGuard {
    /// Wraps a slot and what frees it.
    pub fn new(slot: Slot, release: Box<dyn SlotRelease>) -> Self {
        SlotGuard {
            slot,
            release: Some(release),
            endpoint: None,
        }
    }

    /// Ties the slot to the tunnel endpoint its `base_url` came from, so that
    /// [`SlotGuard::endpoint_lost`] can tell when that URL stopped being served.
    pub fn with_endpoint(mut self, endpoint: Arc<dyn Endpoint>) -> Self {
        self.endpoint = Some(endpoint);
        self
    }

    /// The endpoint set by [`SlotGuard::with_endpoint`].
    pub fn endpoint(&self) -> Option<&Arc<dyn Endpoint>> {
        self.endpoint.as_ref()
    }

    /// Whether the slot's `base_url` is dead for good: its endpoint was re-minted at a new
    /// URL (a tunnel that could not be repaired in place). The rollout's harness cannot
    /// reach the server through the URL it was given any more. False without an endpoint.
    pub fn endpoint_lost(&self) -> bool {
        self.endpoint
            .as_ref()
            .is_some_and(|e| e.url() != self.slot.base_url)
    }

    /// Hands intercept a harness's failure text (its stderr, an exception message) for
    /// this slot. Returns true when the slot's tunnel backend recognises in it its tunnel
    /// being dead for good (for Prime: `404 Tunnel not found or no longer active`); the
    /// endpoint then counts as dead ([`Endpoint::dead`] resolves), and a pool heals the
    /// server this slot came through at once, without waiting for its next health round:
    /// a new tunnel at a new URL ([`SlotGuard::endpoint_lost`] turns true), or, when that
    /// fails, the server is retired and a new one started. False for any other text, and
    /// without an endpoint.
    ///
    /// The rollout itself failed through no fault of its harness: retry it on a new slot.
    pub fn report_tunnel_failure(&self, text: &str) -> bool {
        self.endpoint
            .as_ref()
            .is_some_and(|e| e.report_failure(&self.slot.base_url, text))
    }

    /// The slot.
    pub fn slot(&self) -> &Slot {
        &self.slot
    }

    /// Frees the slot and waits until the session is released and its trace sealed.
    pub async fn close(mut self) {
        if let Some(r) = self.release.take() {
            r.release().await;
        }
    }
}

impl std::ops::Deref for SlotGuard {
    type Target = Slot;
    fn deref(&self) -> &Slot {
        &self.slot
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Some(r) = self.release.take() {
            r.release_now();
        }
    }
}

/// Errors gathered while tearing several resources down.
pub fn join_errors(errors: Vec<Error>) -> Result<(), Error> {
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors
            .into_iter()
            .next()
            .unwrap_or(Error::Internal(String::new()))),
        n => Err(Error::Internal(format!(
            "{n} teardowns failed: {}",
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        ))),
    }
}
