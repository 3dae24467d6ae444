//! [`StaticPool`]: a fixed list of servers, all started up front; each acquire goes to the
//! least-loaded one.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::future::join_all;
use intercept_core::internal::join_errors;
use intercept_core::{
    Error, Interception, PauseMode, PauseStatus, ServerStatus, Session, SlotGuard,
};
use parking_lot::Mutex;
use tracing::{info, warn};

use crate::guard::PoolRelease;
use crate::member::{PoolMember, ServerFactory};
use crate::policy;
use crate::HEALTH_PROBE_TIMEOUT;

/// A fixed list of servers (each with its own tunnel choice), all started by
/// [`Interception::start`]. [`Interception::acquire`] registers the session on the
/// least-loaded server, ties taking turns, and counts it before returning, so concurrent
/// acquires see each other's load. There is no capacity cap.
pub struct StaticPool {
    factories: Vec<Arc<dyn ServerFactory>>,
    inner: Arc<StaticInner>,
}

struct StaticInner {
    state: Mutex<StaticState>,
    pause: crate::pause::PoolPause,
}

#[derive(Default)]
struct StaticState {
    members: Vec<(Arc<dyn PoolMember>, usize)>,
    cursor: usize,
    started: bool,
    /// Bumped by every stop, so that seats of an earlier run free nothing.
    generation: u64,
}

impl fmt::Debug for StaticPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.inner.state.lock();
        f.debug_struct("StaticPool")
            .field("servers", &self.factories.len())
            .field("started", &state.started)
            .field(
                "loads",
                &state.members.iter().map(|(_, l)| *l).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A session's seat on one server of a static pool.
#[derive(Debug)]
struct StaticSeat {
    inner: Arc<StaticInner>,
    index: usize,
    generation: u64,
}

impl fmt::Debug for StaticInner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StaticInner")
    }
}

impl Drop for StaticSeat {
    fn drop(&mut self) {
        let mut state = self.inner.state.lock();
        if state.generation == self.generation {
            if let Some((_, load)) = state.members.get_mut(self.index) {
                *load = load.saturating_sub(1);
            }
        }
    }
}

impl StaticPool {
    /// A pool of one server per factory (not started yet). Fails if `factories` is empty.
    pub fn new(factories: Vec<Arc<dyn ServerFactory>>) -> Result<Self, Error> {
        if factories.is_empty() {
            return Err(Error::invalid(
                "a static pool needs at least one server: list them under `servers`",
            ));
        }
        Ok(StaticPool {
            factories,
            inner: Arc::new(StaticInner {
                state: Mutex::new(StaticState::default()),
                pause: crate::pause::PoolPause::default(),
            }),
        })
    }

    /// Each server's load as the pool counts it, in creation order (empty before start).
    fn members(&self) -> Vec<Arc<dyn PoolMember>> {
        self.inner
            .state
            .lock()
            .members
            .iter()
            .map(|(m, _)| m.clone())
            .collect()
    }

    /// The number of sessions on each server, in order.
    pub fn loads(&self) -> Vec<usize> {
        self.inner
            .state
            .lock()
            .members
            .iter()
            .map(|(_, l)| *l)
            .collect()
    }
}

#[async_trait]
impl Interception for StaticPool {
    /// Starts every server concurrently. If one fails, the ones that started are torn
    /// down (newest first) and the first failure is returned.
    async fn start(&self) -> Result<(), Error> {
        if self.inner.state.lock().started {
            return Err(Error::Conflict("the static pool is already started".into()));
        }
        let results = join_all(
            self.factories
                .iter()
                .enumerate()
                .map(|(i, f)| f.start_server(i as u64)),
        )
        .await;
        let mut started = Vec::new();
        let mut first_error = None;
        for result in results {
            match result {
                Ok(member) => started.push(member),
                Err(e) => {
                    warn!(error = %e, "static pool: a server failed to start");
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(error) = first_error {
            for member in started.iter().rev() {
                if let Err(e) = member.stop().await {
                    warn!(error = %e, "static pool: teardown after a failed start failed");
                }
            }
            return Err(error);
        }
        let mut state = self.inner.state.lock();
        state.members = started.into_iter().map(|m| (m, 0)).collect();
        state.started = true;
        info!(servers = state.members.len(), "static interception pool up");
        Ok(())
    }

    /// Stops every server, newest first, going on past failures; reports all of them.
    async fn stop(&self) -> Result<(), Error> {
        let members = {
            let mut state = self.inner.state.lock();
            state.started = false;
            state.generation += 1;
            std::mem::take(&mut state.members)
        };
        let mut errors = Vec::new();
        for (member, _) in members.iter().rev() {
            if let Err(e) = member.stop().await {
                warn!(error = %e, "static pool: server teardown failed");
                errors.push(e);
            }
        }
        join_errors(errors)
    }

    async fn acquire(&self, session: Arc<dyn Session>) -> Result<SlotGuard, Error> {
        let (member, seat) = {
            let mut state = self.inner.state.lock();
            if !state.started {
                return Err(Error::Conflict(
                    "the static pool is not started: call start() first".into(),
                ));
            }
            let loads: Vec<Option<usize>> = state.members.iter().map(|(_, l)| Some(*l)).collect();
            let index = policy::least_loaded(&loads, state.cursor)
                .ok_or_else(|| Error::Internal("static pool has no servers".into()))?;
            state.cursor = index + 1;
            state.members[index].1 += 1;
            let seat = StaticSeat {
                inner: self.inner.clone(),
                index,
                generation: state.generation,
            };
            (state.members[index].0.clone(), seat)
        };
        let guard = member.acquire(session).await?;
        Ok(PoolRelease::wrap(guard, seat))
    }

    fn load(&self) -> usize {
        self.inner
            .state
            .lock()
            .members
            .iter()
            .map(|(_, l)| *l)
            .sum()
    }

    /// Every server in order, with the pool's count of its sessions and a probe of its
    /// endpoint (a probe slower than [`HEALTH_PROBE_TIMEOUT`] counts as unhealthy).
    /// Empty before start and after stop.
    async fn servers(&self) -> Vec<ServerStatus> {
        let members: Vec<(Arc<dyn PoolMember>, usize)> = self.inner.state.lock().members.clone();
        join_all(members.into_iter().map(|(member, load)| async move {
            let healthy = tokio::time::timeout(HEALTH_PROBE_TIMEOUT, member.health())
                .await
                .is_ok_and(|h| h.is_healthy());
            ServerStatus {
                base_url: member.base_url(),
                load,
                healthy,
            }
        }))
        .await
    }

    /// Pauses every server of the pool; one epoch for the whole pool.
    async fn pause(&self, mode: PauseMode) -> Result<PauseStatus, Error> {
        self.inner.pause.pause(mode, || self.members());
        Ok(self.inner.pause.status(&self.members()))
    }

    /// Resumes every server in a new epoch.
    async fn resume(&self) -> Result<PauseStatus, Error> {
        self.inner.pause.resume(|| self.members());
        Ok(self.inner.pause.status(&self.members()))
    }

    fn pause_status(&self) -> PauseStatus {
        self.inner.pause.status(&self.members())
    }

    fn inflight(&self) -> usize {
        let members: Vec<Arc<dyn PoolMember>> = self
            .inner
            .state
            .lock()
            .members
            .iter()
            .map(|(m, _)| m.clone())
            .collect();
        members.iter().map(|m| m.inflight()).sum()
    }
}
