//! Retry atomicity: replay of the last served response and coalescing of identical
//! attempts in flight, for SDK retries marked by `x-stainless-retry-count > 0`.
//!
//! Without it, a retry of a turn whose answer was lost in transit would sample again and
//! record a second turn; a retry arriving while the first attempt still computes would
//! start a second inference. Only non-streamed calls take part.

use std::collections::HashMap;
use std::sync::Arc;

use blake2::digest::consts::U16;
use blake2::{Blake2b, Digest as _};
use bytes::Bytes;
use http::HeaderMap;
use tokio::sync::watch;

use crate::registry::Entry;

/// BLAKE2b-128 of a request body as the harness sent it.
pub(crate) type Digest = [u8; 16];

/// Bodies larger than this are hashed on a blocking thread, off the request path.
const INLINE_HASH_LIMIT: usize = 1 << 20;

/// Whether the request is an SDK retry (`x-stainless-retry-count` an integer above 0).
pub(crate) fn is_marked_retry(headers: &HeaderMap) -> bool {
    headers
        .get("x-stainless-retry-count")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok())
        .is_some_and(|n| n > 0)
}

fn hash(bytes: &[u8]) -> Digest {
    let mut h = Blake2b::<U16>::new();
    h.update(bytes);
    h.finalize().into()
}

/// Digest of a body; large bodies are hashed on a blocking thread.
pub(crate) async fn digest(bytes: &Bytes) -> Digest {
    if bytes.len() <= INLINE_HASH_LIMIT {
        return hash(bytes);
    }
    let owned = bytes.clone();
    match tokio::task::spawn_blocking(move || hash(&owned)).await {
        Ok(d) => d,
        Err(_) => hash(bytes),
    }
}

/// The state of an attempt in flight.
#[derive(Debug, Clone)]
pub(crate) enum Flight {
    Pending,
    Served(Bytes),
    Failed,
}

/// Per-session retry state.
#[derive(Debug, Default)]
pub(crate) struct RetryState {
    /// Digest and body of the last served non-streamed response.
    last: Option<(Digest, Bytes)>,
    inflight: HashMap<Digest, Arc<watch::Sender<Flight>>>,
}

/// What to do with a non-streamed request.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Wait for the identical attempt in flight.
    Coalesce(watch::Receiver<Flight>),
    /// Go upstream; resolve the claim with the outcome.
    Claim(FlightClaim),
}

/// Replay check (before any refusal): a marked retry of the last served body gets the
/// recorded response. A fresh identical request supersedes the record.
pub(crate) fn replay(entry: &Entry, digest: &Digest, marked: bool) -> Option<Bytes> {
    let mut state = entry.retry.lock();
    match &state.last {
        Some((d, body)) if d == digest => {
            if marked {
                return Some(body.clone());
            }
            state.last = None;
            None
        }
        _ => None,
    }
}

/// Coalesce with an attempt in flight (marked retries only) or claim a new one.
pub(crate) fn coalesce_or_claim(entry: &Arc<Entry>, digest: Digest, marked: bool) -> Decision {
    let mut state = entry.retry.lock();
    if marked {
        if let Some(flight) = state.inflight.get(&digest) {
            return Decision::Coalesce(flight.subscribe());
        }
    }
    let (tx, _rx) = watch::channel(Flight::Pending);
    let tx = Arc::new(tx);
    state.inflight.insert(digest, tx.clone());
    Decision::Claim(FlightClaim {
        entry: entry.clone(),
        digest,
        tx,
        resolved: false,
    })
}

/// Ownership of an attempt in flight; resolves as failed if dropped unresolved.
#[derive(Debug)]
pub(crate) struct FlightClaim {
    entry: Arc<Entry>,
    digest: Digest,
    tx: Arc<watch::Sender<Flight>>,
    resolved: bool,
}

impl FlightClaim {
    /// The attempt was served with this body: it becomes the last served response.
    pub(crate) fn served(mut self, body: Bytes) {
        self.finish(Flight::Served(body.clone()));
        self.entry.retry.lock().last = Some((self.digest, body));
    }

    fn finish(&mut self, flight: Flight) {
        self.resolved = true;
        {
            let mut state = self.entry.retry.lock();
            if state
                .inflight
                .get(&self.digest)
                .is_some_and(|t| Arc::ptr_eq(t, &self.tx))
            {
                state.inflight.remove(&self.digest);
            }
        }
        self.tx.send_replace(flight);
    }
}

impl Drop for FlightClaim {
    fn drop(&mut self) {
        if !self.resolved {
            self.finish(Flight::Failed);
        }
    }
}

/// Waits for a coalesced attempt: its body, or `None` if it failed.
pub(crate) async fn wait(mut rx: watch::Receiver<Flight>) -> Option<Bytes> {
    match rx.wait_for(|f| !matches!(f, Flight::Pending)).await {
        Ok(f) => match &*f {
            Flight::Served(b) => Some(b.clone()),
            _ => None,
        },
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_retries() {
        let mut h = HeaderMap::new();
        assert!(!is_marked_retry(&h));
        h.insert("x-stainless-retry-count", "0".parse().expect("value"));
        assert!(!is_marked_retry(&h));
        h.insert("x-stainless-retry-count", "2".parse().expect("value"));
        assert!(is_marked_retry(&h));
        h.insert("x-stainless-retry-count", "two".parse().expect("value"));
        assert!(!is_marked_retry(&h));
    }

    #[tokio::test]
    async fn large_bodies_hash_like_small_ones() {
        let big = Bytes::from(vec![7u8; (1 << 20) + 1]);
        assert_eq!(digest(&big).await, hash(&big));
        assert_ne!(
            digest(&Bytes::from_static(b"a")).await,
            digest(&Bytes::from_static(b"b")).await
        );
    }
}
