//! The lifecycle every interception shape shares (one server, a static pool, an elastic
//! pool), and the guard a rollout holds while it runs.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::Error;
use crate::session::Session;
use crate::slot::Slot;

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
}

impl SlotGuard {
    /// Wraps a slot and what frees it.
    pub fn new(slot: Slot, release: Box<dyn SlotRelease>) -> Self {
        SlotGuard {
            slot,
            release: Some(release),
        }
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
