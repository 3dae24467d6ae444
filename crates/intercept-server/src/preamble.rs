//! What every request goes through before its route's work: the state the server's
//! handlers and calls share ([`Shared`], with its [`Stats`]), authentication by the
//! model secret ([`authenticate`]), the bounded read of the request body
//! ([`read_body`]), and what a request refused before its body was read answers
//! ([`refuse_unread`]). The routes (`server.rs`) and the calls (`call.rs`) both start here.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use http::Response;
use hyper::body::Incoming;
use intercept_core::{CallError, Dialect, Error, SecretStr};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::ServerConfig;
use crate::detach::ResponseBody;
use crate::registry::{Entry, InflightGuard, Registry};
use crate::upstream::{read_all, ReadError, UpstreamClient};

/// Counters of a server, readable at any time: kept per core (each loop counts in its own
/// slot), summed when read.
#[derive(Debug, Default)]
pub struct Stats {
    slots: crate::per_core::PerCore<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    calls: AtomicU64,
    failed: AtomicU64,
}

impl Stats {
    pub(crate) fn record(&self, error: &Option<CallError>) {
        let mine = self.slots.mine();
        mine.calls.fetch_add(1, Ordering::Relaxed);
        if error.is_some() {
            mine.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Calls recorded.
    pub fn calls(&self) -> u64 {
        self.slots
            .iter()
            .map(|c| c.calls.load(Ordering::Relaxed))
            .sum()
    }

    /// Calls recorded with an error.
    pub fn failed(&self) -> u64 {
        self.slots
            .iter()
            .map(|c| c.failed.load(Ordering::Relaxed))
            .sum()
    }
}

/// What the handlers and calls of one event loop use: the server's shared state (the
/// registry, the pause gate, the counters, behind `Arc`s every loop holds) and what the
/// loop owns alone (its upstream connections and caches, its task tracker). The server
/// keeps one more, for its control side (acquire, release, stop).
pub(crate) struct Shared {
    pub(crate) config: ServerConfig,
    pub(crate) registry: Arc<Registry>,
    /// This loop's upstream client: its own connection pool and URI cache.
    pub(crate) upstream: UpstreamClient,
    /// This loop's calls (and, on the control side, background seals).
    pub(crate) tasks: TaskTracker,
    /// Cancels every call (parent of each session's token).
    pub(crate) calls_cancel: CancellationToken,
    pub(crate) stats: Arc<Stats>,
    /// Admission of model calls (pause and resume).
    pub(crate) gate: Arc<crate::pause::PauseGate>,
    /// Engines marked down (session-sticky routing).
    pub(crate) engines: Arc<crate::engines::EngineHealth>,
    /// The dialects served, in the order routes are matched.
    pub(crate) dialects: Vec<Arc<dyn Dialect>>,
    /// The loops this one belongs to, held so that they run while its calls do.
    pub(crate) _loops: Option<Arc<crate::loops::Loops>>,
}

impl Shared {
    /// The state of one event loop of `loops`: the server's shared parts, and an upstream
    /// client and task tracker of its own.
    pub(crate) fn for_loop(&self, loops: &Arc<crate::loops::Loops>) -> Shared {
        Shared {
            config: self.config.clone(),
            registry: self.registry.clone(),
            upstream: self.upstream.for_loop(&self.config),
            tasks: TaskTracker::new(),
            calls_cancel: self.calls_cancel.clone(),
            stats: self.stats.clone(),
            gate: self.gate.clone(),
            engines: self.engines.clone(),
            dialects: self.dialects.clone(),
            _loops: Some(loops.clone()),
        }
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .field("load", &self.registry.load())
            .finish()
    }
}

/// Authenticates a request by its model secret: the rollout's entry, entered (the
/// in-flight guard keeps it unsealed until the request is done). An unknown secret is
/// 401, a released rollout's 409.
pub(crate) fn authenticate(
    shared: &Shared,
    secret: Option<&str>,
) -> Result<(Arc<Entry>, InflightGuard), Error> {
    let secret = SecretStr::new(secret.ok_or(Error::Unauthorized)?);
    let Some(entry) = shared.registry.by_model(secret) else {
        return Err(if shared.registry.was_released(secret) {
            Error::RolloutConcluded
        } else {
            Error::Unauthorized
        });
    };
    let guard = entry.enter().ok_or(Error::RolloutConcluded)?;
    Ok((entry, guard))
}

/// The base URL of the engine a session's call goes to: its pinned engine while that one
/// is up, else the next one up (the session's own `base_url` when none is).
pub(crate) fn engine_base_url<'a>(
    shared: &Shared,
    session: &'a dyn intercept_core::Session,
) -> &'a str {
    let upstream = session.upstream();
    let engines = upstream.engines();
    let engine = crate::routing::pick(session.id(), engines, |i| shared.engines.is_up(&engines[i]))
        .unwrap_or(0);
    engines
        .get(engine)
        .map_or(upstream.base_url.as_str(), String::as_str)
}

/// How much of a refused request's unread body is read and dropped, and for how long, so
/// that its connection stays usable ([`refuse_unread`]).
const DRAIN_LIMIT: usize = 64 * 1024;
const DRAIN_TIME: std::time::Duration = std::time::Duration::from_millis(200);

/// Answers `resp` to a request whose `body` was not read (refused before it: no secret,
/// a route that takes none). A connection must not carry the rest of a body into the
/// next request, and closing it with unread bytes in its buffer loses the answer to a
/// reset on some clients, or drops the connection under a client that reuses it: the
/// body is read and dropped, at most [`DRAIN_LIMIT`] bytes within [`DRAIN_TIME`] (a
/// peer that sends more, or dribbles, gets `Connection: close` instead).
pub(crate) async fn refuse_unread(
    body: Incoming,
    mut resp: Response<ResponseBody>,
) -> Response<ResponseBody> {
    use http_body_util::BodyExt as _;
    let drain = async {
        let mut body = body;
        let mut seen = 0usize;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { return false };
            if let Some(data) = frame.data_ref() {
                seen += data.len();
                if seen > DRAIN_LIMIT {
                    return false;
                }
            }
        }
        true
    };
    let drained = tokio::time::timeout(DRAIN_TIME, drain)
        .await
        .unwrap_or(false);
    if !drained {
        close_after(&mut resp);
    }
    resp
}

/// Marks `resp` as the connection's last (`Connection: close`): its request's body was
/// not read to its end.
pub(crate) fn close_after(resp: &mut Response<ResponseBody>) {
    resp.headers_mut().insert(
        http::header::CONNECTION,
        http::HeaderValue::from_static("close"),
    );
}

/// Reads a request body up to the configured limit; `what` names it in the error. With
/// `cancel`, the read ends with 409 when the rollout is released: a harness that stops
/// sending its body holds nothing.
pub(crate) async fn read_body(
    shared: &Shared,
    body: Incoming,
    cancel: Option<&CancellationToken>,
    what: &str,
) -> Result<bytes::Bytes, Error> {
    let limit = shared.config.body_limit;
    let read = match cancel {
        Some(cancel) => tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(Error::RolloutConcluded),
            r = read_all(body, limit) => r,
        },
        None => read_all(body, limit).await,
    };
    read.map_err(|e| match e {
        ReadError::TooLarge { .. } => Error::PayloadTooLarge { limit },
        ReadError::Body(e) => Error::invalid(format!("could not read {what}: {e}")),
    })
}
