//! Sessions by secret: O(1), sharded, no global lock on the request path.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use intercept_core::{Secret, SecretStr, Session};
use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// One registered session.
pub(crate) struct Entry {
    pub(crate) session: Arc<dyn Session>,
    pub(crate) cancel: CancellationToken,
    pub(crate) model_secret: Secret,
    pub(crate) state_secret: Secret,
    seq: AtomicU64,
    inflight: AtomicUsize,
    drained: Notify,
    released: AtomicBool,
    sealed: AtomicBool,
    pub(crate) retry: crate::retry::RetryTable,
    /// What parsing the rollout's last request body left for parsing its next one
    /// (a conversation that grew is scanned from where it parts from the last).
    pub(crate) parse_memo: Mutex<intercept_core::internal::ParseMemo>,
    /// The session's token path, when it has a `tokens` setting.
    pub(crate) tito: Option<Arc<crate::tokens::Tito>>,
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry")
            .field("session", &self.session.id())
            .field("inflight", &self.inflight.load(Ordering::Relaxed))
            .field("released", &self.released.load(Ordering::Relaxed))
            .finish()
    }
}

impl Entry {
    pub(crate) fn new(session: Arc<dyn Session>, cancel: CancellationToken) -> Self {
        Entry {
            session,
            cancel,
            model_secret: Secret::generate(),
            state_secret: Secret::generate(),
            seq: AtomicU64::new(0),
            inflight: AtomicUsize::new(0),
            drained: Notify::new(),
            released: AtomicBool::new(false),
            sealed: AtomicBool::new(false),
            retry: Arc::new(Mutex::new(crate::retry::RetryState::default())),
            parse_memo: Mutex::new(Default::default()),
            tito: None,
        }
    }

    /// Registers an in-flight call; `None` once the session is released. While the
    /// returned guard lives, the session is not sealed.
    pub(crate) fn enter(self: &Arc<Self>) -> Option<InflightGuard> {
        self.inflight.fetch_add(1, Ordering::SeqCst);
        let guard = InflightGuard {
            entry: self.clone(),
        };
        if self.released.load(Ordering::SeqCst) {
            return None;
        }
        Some(guard)
    }

    pub(crate) fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::SeqCst)
    }

    pub(crate) fn inflight(&self) -> usize {
        self.inflight.load(Ordering::SeqCst)
    }

    /// Marks the entry released; returns false if it already was.
    fn mark_released(&self) -> bool {
        !self.released.swap(true, Ordering::SeqCst)
    }

    /// Waits until no call is in flight, then releases the session (once). Only after
    /// the entry was released (calls that end wake it only then).
    pub(crate) async fn seal(&self) {
        debug_assert!(self.is_released(), "an entry is sealed after its release");
        loop {
            let notified = self.drained.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.inflight.load(Ordering::SeqCst) == 0 {
                break;
            }
            notified.await;
        }
        self.seal_now();
    }

    /// Releases the session if nothing is in flight; returns whether it is sealed.
    pub(crate) fn try_seal(&self) -> bool {
        if self.inflight.load(Ordering::SeqCst) == 0 {
            self.seal_now();
            true
        } else {
            false
        }
    }

    fn seal_now(&self) {
        if !self.sealed.swap(true, Ordering::SeqCst) {
            self.session.on_release();
        }
    }
}

/// Keeps a session unsealed while a call is in flight.
#[derive(Debug)]
pub(crate) struct InflightGuard {
    entry: Arc<Entry>,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        // Only a released entry is waited on (`seal`): the wake (a lock) is skipped for
        // every other call. Both are sequentially consistent, and `seal` looks at the
        // count only after the entry is released: a guard that reads `released` as false
        // dropped the count before that look.
        if self.entry.inflight.fetch_sub(1, Ordering::SeqCst) == 1
            && self.entry.released.load(Ordering::SeqCst)
        {
            self.entry.drained.notify_waiters();
        }
    }
}

/// Every session of a server, by model secret, by state secret and by id. Secrets are
/// looked up as a [`SecretStr`] borrowed from the request (no allocation); the maps hash
/// with a random key and compare keys in constant time.
#[derive(Debug)]
pub(crate) struct Registry {
    by_model: DashMap<Secret, Arc<Entry>>,
    by_state: DashMap<Secret, Arc<Entry>>,
    by_id: DashMap<String, Arc<Entry>>,
    released: DashMap<Secret, ()>,
    released_order: Mutex<VecDeque<Secret>>,
    released_secrets: usize,
    load: AtomicUsize,
}

impl Registry {
    pub(crate) fn new(released_secrets: usize) -> Self {
        Registry {
            by_model: DashMap::new(),
            by_state: DashMap::new(),
            by_id: DashMap::new(),
            released: DashMap::new(),
            released_order: Mutex::new(VecDeque::new()),
            released_secrets,
            load: AtomicUsize::new(0),
        }
    }

    pub(crate) fn insert(&self, entry: Arc<Entry>) {
        // Count first, so a concurrent reader of `load` never sees fewer sessions than
        // are routable.
        self.load.fetch_add(1, Ordering::SeqCst);
        self.by_model
            .insert(entry.model_secret.clone(), entry.clone());
        self.by_state
            .insert(entry.state_secret.clone(), entry.clone());
        self.by_id.insert(entry.session.id().to_owned(), entry);
    }

    pub(crate) fn by_model(&self, secret: &SecretStr) -> Option<Arc<Entry>> {
        self.by_model.get(secret).map(|e| e.clone())
    }

    pub(crate) fn by_state(&self, secret: &SecretStr) -> Option<Arc<Entry>> {
        self.by_state.get(secret).map(|e| e.clone())
    }

    pub(crate) fn by_id(&self, id: &str) -> Option<Arc<Entry>> {
        self.by_id.get(id).map(|e| e.clone())
    }

    /// Whether a secret belonged to a session released recently.
    pub(crate) fn was_released(&self, secret: &SecretStr) -> bool {
        self.released.contains_key(secret)
    }

    pub(crate) fn load(&self) -> usize {
        self.load.load(Ordering::SeqCst)
    }

    /// Unregisters the entry and cancels its in-flight calls; returns false if it was
    /// released already.
    pub(crate) fn release(&self, entry: &Arc<Entry>) -> bool {
        if !entry.mark_released() {
            return false;
        }
        self.by_model.remove(&entry.model_secret);
        self.by_state.remove(&entry.state_secret);
        self.by_id
            .remove_if(entry.session.id(), |_, e| Arc::ptr_eq(e, entry));
        if self.released_secrets > 0 {
            let mut order = self.released_order.lock();
            for secret in [&entry.model_secret, &entry.state_secret] {
                self.released.insert(secret.clone(), ());
                order.push_back(secret.clone());
            }
            while order.len() > self.released_secrets {
                if let Some(old) = order.pop_front() {
                    self.released.remove(&old);
                }
            }
        }
        self.load.fetch_sub(1, Ordering::SeqCst);
        entry.cancel.cancel();
        true
    }

    /// Every registered entry.
    pub(crate) fn entries(&self) -> Vec<Arc<Entry>> {
        self.by_model.iter().map(|e| e.value().clone()).collect()
    }
}
