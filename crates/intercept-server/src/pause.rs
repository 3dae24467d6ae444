//! Pause and resume of model calls (weight sync), lock-light.
//!
//! The request path touches two atomics: it counts itself in flight, then checks the
//! `paused` flag (both sequentially consistent, and `pause` does the reverse: set the
//! flag, then read the count), so a call either sees the pause or is counted before the
//! pause reads the count. Only a call that meets a pause goes to the slow path, which
//! waits on a `watch` channel. The count is kept per core (a call counts in its thread's
//! slot and leaves from it), summed when read; a call that ends wakes the waiters of
//! [`PauseGate::idle`] only when there are some.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use intercept_core::{Error, PauseMode, PauseStatus};
use parking_lot::Mutex;
use tokio::sync::{watch, Notify};

use crate::per_core::PerCore;
use tokio_util::sync::CancellationToken;

/// The admission gate of one server.
#[derive(Debug)]
pub(crate) struct PauseGate {
    paused: AtomicBool,
    /// Admitted calls in flight, per core.
    inflight: PerCore<AtomicUsize>,
    /// Tasks in [`PauseGate::idle`].
    idle_waiters: AtomicUsize,
    held: AtomicUsize,
    epoch: AtomicU64,
    mode: watch::Sender<Option<PauseMode>>,
    idle: Notify,
    /// Serialises pause and resume (control path only).
    control: Mutex<()>,
}

/// One admitted model call: counted in flight until dropped.
#[derive(Debug)]
pub(crate) struct Admission {
    gate: Arc<PauseGate>,
    /// The slot of the in-flight count it is counted in.
    slot: usize,
    pub(crate) epoch: u64,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.gate.leave(self.slot);
    }
}

/// Decrements the held count on every exit from the slow path.
struct Holding<'a>(&'a AtomicUsize);

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn whole_secs(d: std::time::Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

impl PauseGate {
    pub(crate) fn new() -> Self {
        PauseGate {
            paused: AtomicBool::new(false),
            inflight: PerCore::default(),
            idle_waiters: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
            mode: watch::Sender::new(None),
            idle: Notify::new(),
            control: Mutex::new(()),
        }
    }

    fn leave(&self, slot: usize) {
        if self.inflight.at(slot).fetch_sub(1, Ordering::SeqCst) == 1
            && self.idle_waiters.load(Ordering::SeqCst) > 0
        {
            self.idle.notify_waiters();
        }
    }

    /// Admitted calls in flight, every core's.
    fn inflight(&self) -> usize {
        self.inflight.iter().map(|n| n.load(Ordering::SeqCst)).sum()
    }

    fn try_admit(self: &Arc<Self>) -> Option<Admission> {
        let slot = crate::per_core::slot();
        self.inflight.at(slot).fetch_add(1, Ordering::SeqCst);
        if !self.paused.load(Ordering::SeqCst) {
            return Some(Admission {
                gate: self.clone(),
                slot,
                epoch: self.epoch.load(Ordering::SeqCst),
            });
        }
        self.leave(slot);
        None
    }

    /// Admits a call now, or when the pause ends. `cancel` ends a held wait (the
    /// rollout was released or the server is stopping) with `on_cancel()`.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        cancel: &CancellationToken,
        on_cancel: impl FnOnce() -> Error,
    ) -> Result<Admission, Error> {
        if let Some(a) = self.try_admit() {
            return Ok(a);
        }
        self.held.fetch_add(1, Ordering::SeqCst);
        let _holding = Holding(&self.held);
        let mut rx = self.mode.subscribe();
        let mut deadline: Option<tokio::time::Instant> = None;
        loop {
            let mode = *rx.borrow_and_update();
            match mode {
                None => {
                    if let Some(a) = self.try_admit() {
                        return Ok(a);
                    }
                    // Paused again between the two reads: the new mode is on its way.
                }
                Some(PauseMode::Reject { retry_after }) => {
                    return Err(Error::Paused {
                        retry_after_secs: whole_secs(retry_after).max(1),
                        held: false,
                    })
                }
                Some(PauseMode::Hold { timeout }) => {
                    let until =
                        *deadline.get_or_insert_with(|| tokio::time::Instant::now() + timeout);
                    tokio::select! {
                        biased;
                        _ = cancel.cancelled() => return Err(on_cancel()),
                        _ = tokio::time::sleep_until(until) => {
                            return Err(Error::Paused { retry_after_secs: 1, held: true })
                        }
                        changed = rx.changed() => {
                            if changed.is_err() {
                                return Err(Error::Internal("the pause gate went away".into()));
                            }
                            continue;
                        }
                    }
                }
                // A mode this server does not know: refuse like `reject`.
                Some(_) => {
                    return Err(Error::Paused {
                        retry_after_secs: 1,
                        held: false,
                    })
                }
            }
            if rx.changed().await.is_err() {
                return Err(Error::Internal("the pause gate went away".into()));
            }
        }
    }

    pub(crate) fn pause(&self, mode: PauseMode) -> PauseStatus {
        let _control = self.control.lock();
        self.paused.store(true, Ordering::SeqCst);
        self.mode.send_replace(Some(mode));
        self.status()
    }

    pub(crate) fn resume(&self) -> PauseStatus {
        let _control = self.control.lock();
        if self.paused.load(Ordering::SeqCst) {
            self.epoch.fetch_add(1, Ordering::SeqCst);
            self.paused.store(false, Ordering::SeqCst);
            self.mode.send_replace(None);
        }
        self.status()
    }

    /// Sets the pause state and epoch outright (a pool keeps its servers in step).
    pub(crate) fn sync(&self, mode: Option<PauseMode>, epoch: u64) -> PauseStatus {
        let _control = self.control.lock();
        // The epoch first: calls released by a resume are admitted in the new epoch.
        self.epoch.store(epoch, Ordering::SeqCst);
        self.paused.store(mode.is_some(), Ordering::SeqCst);
        self.mode.send_replace(mode);
        self.status()
    }

    pub(crate) fn status(&self) -> PauseStatus {
        let mode = *self.mode.borrow();
        PauseStatus {
            paused: self.paused.load(Ordering::SeqCst),
            mode: mode.map(|m| m.kind()),
            epoch: self.epoch.load(Ordering::SeqCst),
            inflight: self.inflight(),
            held: self.held.load(Ordering::SeqCst),
        }
    }

    /// Waits until no admitted call is in flight.
    pub(crate) async fn idle(&self) {
        /// Counts the waiter while it waits.
        struct Waiting<'a>(&'a AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.idle_waiters.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.idle_waiters);
        // A call that leaves after this count is seen reads it and wakes; one that left
        // before is not counted below.
        loop {
            let notified = self.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.inflight() == 0 {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cancelled() -> Error {
        Error::Cancelled("test".into())
    }

    #[tokio::test(start_paused = true)]
    async fn hold_waits_for_resume_and_times_out() {
        let gate = Arc::new(PauseGate::new());
        let token = CancellationToken::new();
        let a = gate.admit(&token, cancelled).await.expect("open");
        assert_eq!((a.epoch, gate.status().inflight), (0, 1));
        gate.pause(PauseMode::hold(Duration::from_secs(5)));
        let held = {
            let gate = gate.clone();
            let token = token.clone();
            tokio::spawn(async move { gate.admit(&token, cancelled).await.map(|a| a.epoch) })
        };
        for _ in 0..100 {
            if gate.status().held == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(gate.status().held, 1);
        drop(a);
        gate.idle().await;
        let s = gate.resume();
        assert!(!s.paused);
        assert_eq!(s.epoch, 1);
        assert_eq!(held.await.expect("join").expect("admitted"), 1);
        gate.pause(PauseMode::hold(Duration::from_secs(5)));
        let e = gate.admit(&token, cancelled).await.expect_err("timed out");
        assert_eq!(e.status(), 503);
        gate.pause(PauseMode::reject(Duration::from_millis(1500)));
        let e = gate.admit(&token, cancelled).await.expect_err("rejected");
        assert_eq!((e.status(), e.retry_after().as_deref()), (429, Some("2")));
        let s = gate.status();
        assert_eq!((s.inflight, s.held), (0, 0));
        token.cancel();
        gate.pause(PauseMode::hold(Duration::from_secs(5)));
        let e = gate.admit(&token, cancelled).await.expect_err("cancelled");
        assert_eq!(e.kind(), intercept_core::ErrorKind::Cancelled);
    }
}
