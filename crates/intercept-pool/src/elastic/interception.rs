//! The pool as an [`Interception`]: start, stop, acquire, load, pause.

use std::sync::Arc;

use async_trait::async_trait;
use futures_util::future::join_all;
use intercept_core::internal::join_errors;
use intercept_core::{
    Error, Interception, PauseMode, PauseStatus, ServerStatus, Session, SlotGuard,
};
use tracing::{info, warn};

use super::{deliver, Deliveries, ElasticPool, Lifecycle, ServerPhase, STOP_TIMEOUT};
use crate::guard::PoolRelease;
use crate::member::PoolMember;

#[async_trait]
impl Interception for ElasticPool {
    /// Starts the background maintenance and warms `min_servers` servers in the
    /// background; returns at once. Acquires made meanwhile wait for the warm servers
    /// instead of starting more.
    async fn start(&self) -> Result<(), Error> {
        let inner = &self.inner;
        let state = {
            let mut state = inner.state.lock();
            match state.lifecycle {
                Lifecycle::Running => {
                    return Err(Error::Conflict(
                        "the elastic pool is already started".into(),
                    ))
                }
                Lifecycle::Stopped => {
                    return Err(Error::Conflict(
                        "the elastic pool was stopped; make a new one".into(),
                    ))
                }
                Lifecycle::New => state.lifecycle = Lifecycle::Running,
            }
            state
        };
        inner.tasks.spawn(inner.clone().maintenance_loop());
        info!(
            multiplex = inner.config.multiplex,
            min_servers = inner.min_servers,
            max_servers = inner.config.max_servers,
            "elastic interception pool up"
        );
        inner.clone().settle(state);
        Ok(())
    }

    /// Fails waiting acquires, ends every background task (a server start in flight is
    /// let finish), then tears every server down at once, each within [`STOP_TIMEOUT`],
    /// going on past failures and reporting all of them.
    async fn stop(&self) -> Result<(), Error> {
        let inner = &self.inner;
        let deliveries: Deliveries = {
            let mut state = inner.state.lock();
            if state.lifecycle == Lifecycle::Stopped {
                return Ok(());
            }
            state.lifecycle = Lifecycle::Stopped;
            state
                .waiters
                .drain(..)
                .map(|w| {
                    (
                        w.tx,
                        Err(Error::Cancelled("the elastic pool is stopping".into())),
                    )
                })
                .collect()
        };
        deliver(deliveries);
        inner.cancel.cancel();
        inner.tasks.close();
        inner.tasks.wait().await;
        let members: Vec<(u64, Arc<dyn PoolMember>)> = {
            let mut state = inner.state.lock();
            std::mem::take(&mut state.servers)
                .into_iter()
                .filter_map(|s| s.member.map(|m| (s.index, m)))
                .collect()
        };
        // Every server at once (newest first in the log), each bounded: a tunnel API that
        // hangs cannot hold the stop up.
        let results = join_all(members.iter().rev().map(|(index, member)| async move {
            match tokio::time::timeout(STOP_TIMEOUT, member.stop()).await {
                Ok(result) => (*index, result),
                Err(_) => (
                    *index,
                    Err(Error::Tunnel {
                        retryable: true,
                        message: format!(
                            "server {index}: teardown did not end within {STOP_TIMEOUT:?}"
                        ),
                    }),
                ),
            }
        }))
        .await;
        let mut errors = Vec::new();
        for (index, result) in results {
            if let Err(e) = result {
                warn!(server = index, error = %e, "elastic pool: server teardown failed");
                errors.push(e);
            }
        }
        info!(
            servers = members.len(),
            failed = errors.len(),
            "elastic interception pool down"
        );
        join_errors(errors)
    }

    async fn acquire(&self, session: Arc<dyn Session>) -> Result<SlotGuard, Error> {
        let seat = self.inner.seat().await?;
        let member = seat.member.clone();
        let guard = member.acquire(session).await?;
        Ok(PoolRelease::wrap(guard, seat))
    }

    fn load(&self) -> usize {
        self.inner.state.lock().servers.iter().map(|s| s.load).sum()
    }

    /// Every server that is up (ready, draining or stopping), in creation order; servers
    /// still starting are left out. `healthy` is the pool's verdict from its last health
    /// round (a ready server is healthy, a draining or stopping one is not), so this never
    /// probes an endpoint.
    async fn servers(&self) -> Vec<ServerStatus> {
        self.inner
            .state
            .lock()
            .servers
            .iter()
            .filter_map(|s| {
                let member = s.member.as_ref()?;
                Some(ServerStatus {
                    base_url: member.base_url(),
                    load: s.load,
                    healthy: s.phase == ServerPhase::Ready,
                })
            })
            .collect()
    }

    /// Pauses every server (servers started later start paused); one epoch for the
    /// whole pool.
    async fn pause(&self, mode: PauseMode) -> Result<PauseStatus, Error> {
        self.inner.pause.pause(mode, || self.inner.members());
        Ok(self.inner.pause.status(&self.inner.members()))
    }

    /// Resumes every server in a new epoch.
    async fn resume(&self) -> Result<PauseStatus, Error> {
        self.inner.pause.resume(|| self.inner.members());
        Ok(self.inner.pause.status(&self.inner.members()))
    }

    fn pause_status(&self) -> PauseStatus {
        self.inner.pause.status(&self.inner.members())
    }

    fn inflight(&self) -> usize {
        let members: Vec<Arc<dyn PoolMember>> = self
            .inner
            .state
            .lock()
            .servers
            .iter()
            .filter_map(|s| s.member.clone())
            .collect();
        members.iter().map(|m| m.inflight()).sum()
    }
}
