//! Values kept per core, read as a whole: each thread writes to its own slot (its own
//! cache line), so counters bumped on every call never bounce between cores; readers sum
//! the slots.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// One slot, alone on its cache lines (128 bytes: adjacent-line prefetch pairs lines).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

/// A `T` per slot; a thread uses the slot [`slot`] gives it.
#[derive(Debug)]
pub(crate) struct PerCore<T> {
    slots: Box<[Padded<T>]>,
}

impl<T: Default> Default for PerCore<T> {
    fn default() -> Self {
        PerCore {
            slots: (0..slots()).map(|_| Padded::default()).collect(),
        }
    }
}

impl<T> PerCore<T> {
    /// This thread's slot.
    pub(crate) fn mine(&self) -> &T {
        &self.slots[slot()].0
    }

    /// Slot `i` (as [`slot`] numbers them).
    pub(crate) fn at(&self, i: usize) -> &T {
        &self.slots[i % self.slots.len()].0
    }

    /// Every slot.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().map(|p| &p.0)
    }
}

/// Slots per value: the cores the process may use, as a power of two (at least 4, at
/// most 256), so that threads numbered in turn mostly get slots of their own.
fn slots() -> usize {
    static SLOTS: OnceLock<usize> = OnceLock::new();
    *SLOTS.get_or_init(|| {
        crate::loops::default_workers()
            .next_power_of_two()
            .clamp(4, 256)
    })
}

/// The slot of the calling thread: threads are numbered in the order they first ask,
/// modulo the slot count.
pub(crate) fn slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed) % slots();
    }
    SLOT.with(|s| *s)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    #[test]
    fn each_thread_counts_in_its_slot_and_the_sum_sees_all() {
        let counts: PerCore<AtomicU64> = PerCore::default();
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..1000 {
                        counts.mine().fetch_add(1, Ordering::Relaxed);
                    }
                });
            }
        });
        let total: u64 = counts.iter().map(|c| c.load(Ordering::Relaxed)).sum();
        assert_eq!(total, 8000);
        assert_eq!(slot(), slot(), "a thread keeps its slot");
        assert!(std::mem::align_of::<Padded<AtomicU64>>() >= 128);
    }
}
