//! Pausing a whole pool: every server in step, one epoch for the pool.

use std::sync::Arc;

use intercept_core::{PauseMode, PauseStatus};
use parking_lot::Mutex;

use crate::member::PoolMember;

/// The pool's pause state: the mode while paused, and the epoch (plus one per resume).
#[derive(Debug, Default)]
pub(crate) struct PoolPause {
    state: Mutex<(Option<PauseMode>, u64)>,
}

impl PoolPause {
    /// Pauses every member. Members are listed under the pause lock, so a server that
    /// comes up concurrently is either listed here or paused by [`PoolPause::apply`].
    pub(crate) fn pause(&self, mode: PauseMode, members: impl Fn() -> Vec<Arc<dyn PoolMember>>) {
        let mut state = self.state.lock();
        state.0 = Some(mode);
        for m in &members() {
            m.sync_pause(state.0, state.1);
        }
    }

    /// Resumes every member in a new epoch (only if the pool was paused).
    pub(crate) fn resume(&self, members: impl Fn() -> Vec<Arc<dyn PoolMember>>) {
        let mut state = self.state.lock();
        if state.0.take().is_some() {
            state.1 += 1;
        }
        for m in &members() {
            m.sync_pause(None, state.1);
        }
    }

    /// Brings a server that just joined the pool into its pause state and epoch. Call
    /// it after the server is listed, without holding the pool's state lock.
    pub(crate) fn apply(&self, member: &dyn PoolMember) {
        let state = self.state.lock();
        if state.0.is_some() || state.1 > 0 {
            member.sync_pause(state.0, state.1);
        }
    }

    /// The pool's status: its mode and epoch, the members' in-flight and held calls.
    pub(crate) fn status(&self, members: &[Arc<dyn PoolMember>]) -> PauseStatus {
        let state = self.state.lock();
        let mut status = PauseStatus {
            paused: state.0.is_some(),
            mode: state.0.map(|m| m.kind()),
            epoch: state.1,
            inflight: 0,
            held: 0,
        };
        for m in members {
            let s = m.pause_status();
            status.inflight += s.inflight;
            status.held += s.held;
        }
        status
    }
}
