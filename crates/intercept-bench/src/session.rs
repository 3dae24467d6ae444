//! A [`Session`] for long load runs: it imposes a model like [`RolloutSession`] does,
//! but its [`Session::record`] only counts, so memory stays flat however many calls
//! go through and a run measures the proxy rather than trace storage.
//!
//! [`RolloutSession`]: intercept_core::RolloutSession

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use intercept_core::{CallRecord, Session, Upstream};

/// A session that counts its records (and their errors) and keeps nothing else.
#[derive(Debug)]
pub struct CountingSession {
    id: String,
    model: String,
    upstream: Upstream,
    records: AtomicU64,
    errors: AtomicU64,
}

impl CountingSession {
    /// A session `id` imposing `model`, calling `upstream`.
    pub fn new(id: impl Into<String>, model: impl Into<String>, upstream: Upstream) -> Self {
        CountingSession {
            id: id.into(),
            model: model.into(),
            upstream,
            records: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }

    /// Calls recorded.
    pub fn records(&self) -> u64 {
        self.records.load(Ordering::Relaxed)
    }

    /// Calls recorded with an error.
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
}

#[async_trait]
impl Session for CountingSession {
    fn id(&self) -> &str {
        &self.id
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    fn record(&self, record: CallRecord) {
        self.records.fetch_add(1, Ordering::Relaxed);
        if record.error.is_some() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}
