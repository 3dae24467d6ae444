//! The control API's state: the sessions it created and what stays of released ones,
//! the interception, the trace writer and the counters. Its fields are the control
//! module's; the sidecar makes it, reads its settings and shuts it down.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use intercept_core::{
    Error, Interception, NetworkPolicy, RolloutSession, Secret, SessionStatus, SlotGuard, Totals,
    Upstream,
};
use intercept_trace::{QueuedSink, TraceWriter};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::config::ServeConfig;
use crate::metrics::{Gauges, Metrics};
use crate::tunnel::TunnelCounters;

/// One session the control API created.
#[derive(Debug)]
pub(crate) struct Held {
    /// The live session; `None` once its release finished (then [`Held::last`] keeps
    /// what stays readable), so a released session's records do not stay in memory.
    pub(super) session: Option<Arc<RolloutSession>>,
    /// `None` while the slot is being acquired and after release.
    pub(super) guard: Option<SlotGuard>,
    pub(super) sink: Option<Arc<QueuedSink>>,
    pub(super) released: bool,
    /// Set once the release finished: every `DELETE` waits for it, so each answers the
    /// final trace (also when `released_retention` forgets the session at once).
    pub(super) done: Arc<Done>,
    pub(super) last: Option<Arc<Last>>,
    /// The session's token-in/token-out (`GET /v1/sessions/{id}` shows it, also once
    /// released).
    pub(super) tokens: Option<Box<intercept_core::TokensConfig>>,
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
    pub(super) token: CancellationToken,
    pub(super) last: std::sync::OnceLock<Arc<Last>>,
}

/// What stays of a released session once its release finished.
#[derive(Debug)]
pub(crate) struct Last {
    pub(super) calls: usize,
    pub(super) stop_condition: Option<String>,
    pub(super) totals: Totals,
    pub(super) replays: u64,
    /// Without a trace directory: the session's log (its trace and episode are rebuilt
    /// from it when asked), until the bound on retained bytes evicts it (`None` then).
    /// With one, the trace file is read back instead.
    pub(super) kept: Mutex<Option<Bytes>>,
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
    pub(super) config: ServeConfig,
    pub(super) default_upstream: Option<Upstream>,
    pub(super) default_model: Option<String>,
    /// The network policy of sessions created without one (`network_*`).
    pub(super) default_network: NetworkPolicy,
    /// The interception (any shape), started.
    pub(super) server: Arc<dyn Interception>,
    /// The trace files' writer (with a trace directory).
    pub(super) writer: Option<Arc<TraceWriter>>,
    pub(super) tunnels: Arc<TunnelCounters>,
    pub(super) sessions: Mutex<HashMap<String, Held>>,
    pub(super) retired: Mutex<Retired>,
    /// Releases begun by `DELETE`, each in a task of its own; shutdown waits for them.
    pub(super) releases: TaskTracker,
    pub(super) metrics: Arc<Metrics>,
    pub(super) token: Secret,
    pub(super) accepting: AtomicBool,
    pub(super) next_id: AtomicU64,
    /// 8 hex digits drawn at start: generated ids are `session-<run_id>-<n>`, unique
    /// across runs sharing a trace directory.
    pub(super) run_id: String,
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
    /// The state of a control API over a started interception: sessions get
    /// `default_upstream` and `default_model` unless they name theirs; `writer` writes the
    /// trace files (with a trace directory).
    pub(crate) fn new(
        config: ServeConfig,
        default_upstream: Option<Upstream>,
        default_model: Option<String>,
        server: Arc<dyn Interception>,
        writer: Option<Arc<TraceWriter>>,
        tunnels: Arc<TunnelCounters>,
    ) -> anyhow::Result<Self> {
        let token = config
            .control_token
            .clone()
            .unwrap_or_else(Secret::generate);
        Ok(ControlState {
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
        })
    }

    /// The settings the sidecar runs with.
    pub(crate) fn config(&self) -> &ServeConfig {
        &self.config
    }

    /// The interception (any shape), started.
    pub(crate) fn server(&self) -> &Arc<dyn Interception> {
        &self.server
    }

    /// The control API's token.
    pub(crate) fn token(&self) -> &Secret {
        &self.token
    }

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

    /// Stops the interception and every session, as the sidecar shuts down: no new
    /// sessions, calls in flight finish (up to the grace), every session is released and
    /// its trace written, releases begun by `DELETE` are waited for, the trace writer is
    /// closed. Answers whether the interception stopped cleanly.
    pub(crate) async fn shut_down(&self) -> Result<(), Error> {
        self.accepting.store(false, Ordering::SeqCst);
        let stopped = self.server.stop().await;
        let releases: Vec<_> = {
            let mut sessions = self.sessions.lock();
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
            self.finish_release(&id, session, guard).await;
        }
        // Releases begun by a DELETE just before: their episodes and file syncs too.
        self.releases.close();
        let grace = self.config.shutdown_grace + super::RELEASE_WAIT_MARGIN;
        if tokio::time::timeout(grace, self.releases.wait())
            .await
            .is_err()
        {
            warn!("releases begun by DELETE did not finish in time; their trace files may not be synced");
        }
        // Lines of calls recorded after their session's release (none is expected).
        if let Some(writer) = self.writer.clone() {
            let _ = tokio::task::spawn_blocking(move || writer.close()).await;
        }
        stopped
    }
}

/// 8 random hex digits (from the operating system's generator, through
/// [`Secret::generate`]).
fn run_id() -> String {
    use std::hash::{Hash as _, Hasher as _};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    Secret::generate().expose().hash(&mut hasher);
    format!("{:08x}", hasher.finish() as u32)
}
