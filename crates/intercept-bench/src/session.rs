//! A [`Session`] for long load runs: it imposes a model like [`RolloutSession`] does,
//! but its [`Session::record`] only counts, so memory stays flat however many calls
//! go through and a run measures the proxy rather than trace storage.
//! [`CountingSession::with_episode`] also commits every record to an episode graph
//! ([`EpisodeBuilder`]), as a `RolloutSession` does, so that a run against plain
//! counting sessions measures what building the graph costs and nothing else.
//!
//! [`RolloutSession`]: intercept_core::RolloutSession

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use async_trait::async_trait;
use intercept_core::{CallRecord, EpisodeBuilder, Session, Upstream};

/// A session that counts its records (and their errors) and keeps nothing else.
#[derive(Debug)]
pub struct CountingSession {
    id: String,
    model: String,
    upstream: Upstream,
    records: AtomicU64,
    errors: AtomicU64,
    episode: Option<Mutex<EpisodeBuilder>>,
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
            episode: None,
        }
    }

    /// The same, also committing every record to an episode graph that it keeps.
    pub fn with_episode(
        id: impl Into<String>,
        model: impl Into<String>,
        upstream: Upstream,
    ) -> Self {
        CountingSession {
            episode: Some(Mutex::new(EpisodeBuilder::new())),
            ..CountingSession::new(id, model, upstream)
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

    fn record(&self, mut record: CallRecord) {
        self.records.fetch_add(1, Ordering::Relaxed);
        if record.error.is_some() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(episode) = &self.episode {
            episode
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .commit_taking(&mut record);
        }
    }
}
