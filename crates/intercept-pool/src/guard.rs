//! The slot guard a pool hands out: the member's own guard plus the pool's seat.

use std::fmt;

use async_trait::async_trait;
use intercept_core::{SlotGuard, SlotRelease};
use parking_lot::Mutex;

/// Frees a pooled slot: first the member's guard (the session is released on its
/// server), then the pool's seat (the server's load as the pool counts it).
pub(crate) struct PoolRelease<S: Send + Sync + fmt::Debug + 'static> {
    guard: Mutex<Option<SlotGuard>>,
    seat: Mutex<Option<S>>,
}

impl<S: Send + Sync + fmt::Debug + 'static> PoolRelease<S> {
    /// Wraps a member's guard and the seat it occupies.
    pub(crate) fn wrap(guard: SlotGuard, seat: S) -> SlotGuard {
        let slot = guard.slot().clone();
        let endpoint = guard.endpoint().cloned();
        let pooled = SlotGuard::new(
            slot,
            Box::new(PoolRelease {
                guard: Mutex::new(Some(guard)),
                seat: Mutex::new(Some(seat)),
            }),
        );
        match endpoint {
            Some(endpoint) => pooled.with_endpoint(endpoint),
            None => pooled,
        }
    }
}

impl<S: Send + Sync + fmt::Debug + 'static> fmt::Debug for PoolRelease<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolRelease")
            .field("seat", &*self.seat.lock())
            .finish()
    }
}

#[async_trait]
impl<S: Send + Sync + fmt::Debug + 'static> SlotRelease for PoolRelease<S> {
    fn release_now(&self) {
        let guard = self.guard.lock().take();
        drop(guard);
        let seat = self.seat.lock().take();
        drop(seat);
    }

    async fn release(&self) {
        let guard = self.guard.lock().take();
        if let Some(guard) = guard {
            guard.close().await;
        }
        let seat = self.seat.lock().take();
        drop(seat);
    }
}
