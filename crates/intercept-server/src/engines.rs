//! Health of upstream engines, for session-sticky routing with fail-over.
//!
//! An engine that refuses connections (or whose connection breaks) is marked down for a
//! while; sessions pinned to it go to the next engine in their rendezvous order
//! ([`crate::routing`]) until the mark expires. The next call after that tries
//! the engine again (passive recovery): success clears the mark, failure renews it for
//! twice as long (up to 32x the base).

use std::time::Duration;

use dashmap::DashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::time::Instant;

#[derive(Debug, Clone, Copy)]
struct Down {
    until: Instant,
    failures: u32,
}

/// Engines currently marked down, by base URL.
#[derive(Debug)]
pub(crate) struct EngineHealth {
    down: DashMap<Box<str>, Down>,
    /// Entries in `down` (so the common case, nothing down, skips the map).
    marked: AtomicUsize,
    base: Duration,
}

impl EngineHealth {
    pub(crate) fn new(base: Duration) -> Self {
        EngineHealth {
            down: DashMap::new(),
            marked: AtomicUsize::new(0),
            base,
        }
    }

    /// Whether new calls may go to the engine.
    pub(crate) fn is_up(&self, engine: &str) -> bool {
        self.is_up_at(engine, Instant::now())
    }

    fn is_up_at(&self, engine: &str, now: Instant) -> bool {
        if self.marked.load(Ordering::Relaxed) == 0 {
            return true;
        }
        self.down.get(engine).is_none_or(|d| now >= d.until)
    }

    /// The engine failed: skip it until a backoff elapses.
    pub(crate) fn mark_down(&self, engine: &str) {
        self.mark_down_at(engine, Instant::now());
    }

    fn mark_down_at(&self, engine: &str, now: Instant) {
        let mut entry = self.down.entry(engine.into()).or_insert_with(|| {
            self.marked.fetch_add(1, Ordering::Relaxed);
            Down {
                until: now,
                failures: 0,
            }
        });
        if entry.failures > 0 && now < entry.until {
            // Already down: concurrent failures of one outage do not stretch the wait.
            return;
        }
        entry.failures = entry.failures.saturating_add(1);
        let factor = 1u32 << (entry.failures - 1).min(5);
        entry.until = now + self.base * factor;
    }

    /// The engine answered: clear its mark.
    pub(crate) fn mark_up(&self, engine: &str) {
        if self.marked.load(Ordering::Relaxed) == 0 {
            return;
        }
        if self.down.remove(engine).is_some() {
            self.marked.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn down_engines_recover_after_a_growing_backoff() {
        let h = EngineHealth::new(Duration::from_secs(2));
        let t0 = Instant::now();
        assert!(h.is_up_at("a", t0));
        h.mark_down_at("a", t0);
        assert!(!h.is_up_at("a", t0 + Duration::from_secs(1)));
        assert!(h.is_up_at("b", t0));
        // More failures of the same outage (calls in flight) do not stretch it.
        h.mark_down_at("a", t0 + Duration::from_millis(500));
        assert!(h.is_up_at("a", t0 + Duration::from_secs(2)));
        // Failing again on the probe doubles the wait.
        h.mark_down_at("a", t0 + Duration::from_secs(2));
        assert!(!h.is_up_at("a", t0 + Duration::from_secs(5)));
        assert!(h.is_up_at("a", t0 + Duration::from_secs(6)));
        h.mark_up("a");
        assert!(h.is_up_at("a", t0));
        assert_eq!(h.marked.load(Ordering::Relaxed), 0);
    }
}
