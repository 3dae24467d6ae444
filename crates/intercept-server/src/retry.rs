//! Retry atomicity: replay of the last served response and coalescing of identical
//! attempts in flight, for SDK retries marked by `x-stainless-retry-count > 0`.
//!
//! Without it, a retry of a turn whose answer was lost in transit would sample again and
//! record a second turn; a retry arriving while the first attempt still computes would
//! start a second inference. Only non-streamed calls take part.
//!
//! The request path uses it at two points: `admit` (`server.rs`) asks [`replay`] before
//! any refusal and [`claim`] once the call is admitted; `serve_json` (`call.rs`) keeps
//! the served answer for later retries ([`FlightClaim::served`]).

use std::sync::Arc;

use blake2::digest::consts::U16;
use blake2::{Blake2b, Digest as _};
use bytes::Bytes;
use http::HeaderMap;
use tokio::sync::watch;

use crate::registry::Entry;

/// Bodies up to this size are matched byte for byte (the body is shared, not copied, and
/// nothing is hashed on the request path); larger ones by a BLAKE2b-128 digest, so a
/// session between turns never holds more than this much of its last request.
const COMPARE_LIMIT: usize = 64 * 1024;

/// Bodies larger than this are hashed on a blocking thread, off the request path.
const INLINE_HASH_LIMIT: usize = 1 << 20;

/// What identifies a request body, as the harness sent it, for retry matching.
#[derive(Debug, Clone)]
pub(crate) enum Fingerprint {
    /// A small body, compared byte for byte.
    Body(Bytes),
    /// A large body: its length and BLAKE2b-128 digest.
    Digest { len: usize, digest: [u8; 16] },
}

impl Fingerprint {
    /// The fingerprint of a body; large bodies are hashed, on a blocking thread above
    /// 1 MiB.
    pub(crate) async fn of(bytes: &Bytes) -> Self {
        if bytes.len() <= COMPARE_LIMIT {
            return Fingerprint::Body(bytes.clone());
        }
        let len = bytes.len();
        let digest = if len <= INLINE_HASH_LIMIT {
            hash(bytes)
        } else {
            let owned = bytes.clone();
            match tokio::task::spawn_blocking(move || hash(&owned)).await {
                Ok(d) => d,
                Err(_) => hash(bytes),
            }
        };
        Fingerprint::Digest { len, digest }
    }

    /// Whether two fingerprints are of the same body (bodies of different lengths never
    /// compare their bytes).
    fn same(&self, other: &Fingerprint) -> bool {
        match (self, other) {
            (Fingerprint::Body(a), Fingerprint::Body(b)) => a == b,
            (
                Fingerprint::Digest { len: a, digest: x },
                Fingerprint::Digest { len: b, digest: y },
            ) => a == b && x == y,
            _ => false,
        }
    }
}

/// Whether the request is an SDK retry (`x-stainless-retry-count` an integer above 0).
pub(crate) fn is_marked_retry(headers: &HeaderMap) -> bool {
    headers
        .get("x-stainless-retry-count")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok())
        .is_some_and(|n| n > 0)
}

fn hash(bytes: &[u8]) -> [u8; 16] {
    let mut h = Blake2b::<U16>::new();
    h.update(bytes);
    h.finalize().into()
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
    /// The request and response bodies of the last served non-streamed call.
    last: Option<(Fingerprint, Bytes)>,
    /// Attempts in flight (a handful per session at most: searched in order).
    inflight: Vec<InFlight>,
    /// Names the next attempt.
    next_id: u64,
}

/// One attempt in flight.
#[derive(Debug)]
struct InFlight {
    id: u64,
    request: Fingerprint,
    /// Made when the first identical retry waits for it (most attempts have none).
    waiters: Option<watch::Sender<Flight>>,
}

/// What to do with a non-streamed request.
#[derive(Debug)]
enum Decision {
    /// Wait for the identical attempt in flight.
    Coalesce(watch::Receiver<Flight>),
    /// Go upstream; resolve the claim with the outcome.
    Claim(FlightClaim),
}

/// A non-streamed call's identity for retry matching.
pub(crate) struct Attempt {
    fingerprint: Fingerprint,
    /// The SDK marked it a retry.
    marked: bool,
}

/// The retry stage's first half, before any refusal (a retried call that was served
/// gets its answer even if the rollout stopped since): `Err` is the body served to this
/// very request, replayed (the session's `on_replay` is told); otherwise the attempt,
/// for [`claim`] once the call is admitted (`None`: a streamed call, which takes no part).
pub(crate) async fn replay(
    entry: &Entry,
    headers: &HeaderMap,
    body: &intercept_core::JsonBody,
    stream: bool,
) -> Result<Option<Attempt>, Bytes> {
    if stream {
        return Ok(None);
    }
    let marked = is_marked_retry(headers);
    let fingerprint = Fingerprint::of(body.source()).await;
    match replay_served(entry, &fingerprint, marked) {
        Some(served) => {
            tracing::debug!(session = entry.session.id(), "intercept replay");
            entry.session.on_replay();
            Err(served)
        }
        None => Ok(Some(Attempt {
            fingerprint,
            marked,
        })),
    }
}

/// The retry stage's second half, once the call is admitted: the claim on a new attempt
/// (resolved by [`FlightClaim::served`], or as failed when dropped), or `Err`, an
/// identical attempt in flight that a marked retry joins ([`Joined::answer`]).
pub(crate) fn claim(
    entry: &Arc<Entry>,
    attempt: Option<Attempt>,
) -> Result<Option<FlightClaim>, Joined> {
    let Some(attempt) = attempt else {
        return Ok(None);
    };
    match coalesce_or_claim(entry, attempt.fingerprint, attempt.marked) {
        Decision::Claim(c) => Ok(Some(c)),
        Decision::Coalesce(rx) => {
            tracing::debug!(session = entry.session.id(), "intercept coalesce");
            Err(Joined {
                entry: entry.clone(),
                rx,
            })
        }
    }
}

/// An attempt in flight that a retry joined.
#[derive(Debug)]
pub(crate) struct Joined {
    entry: Arc<Entry>,
    rx: watch::Receiver<Flight>,
}

impl Joined {
    /// Waits for the joined attempt: the body it was served (the session's `on_replay`
    /// is told), or `None` if it failed.
    pub(crate) async fn answer(self) -> Option<Bytes> {
        let served = wait(self.rx).await;
        if served.is_some() {
            self.entry.session.on_replay();
        }
        served
    }
}

/// Replay check (before any refusal): a marked retry of the last served body gets the
/// recorded response. A fresh identical request supersedes the record.
fn replay_served(entry: &Entry, request: &Fingerprint, marked: bool) -> Option<Bytes> {
    let mut state = entry.retry.lock();
    match &state.last {
        Some((f, body)) if f.same(request) => {
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
fn coalesce_or_claim(entry: &Arc<Entry>, request: Fingerprint, marked: bool) -> Decision {
    let mut state = entry.retry.lock();
    if marked {
        if let Some(flight) = state.inflight.iter_mut().find(|f| f.request.same(&request)) {
            let rx = match &flight.waiters {
                Some(tx) => tx.subscribe(),
                None => {
                    let (tx, rx) = watch::channel(Flight::Pending);
                    flight.waiters = Some(tx);
                    rx
                }
            };
            return Decision::Coalesce(rx);
        }
    }
    let id = state.next_id;
    state.next_id += 1;
    state.inflight.push(InFlight {
        id,
        request,
        waiters: None,
    });
    Decision::Claim(FlightClaim {
        entry: entry.clone(),
        id,
        resolved: false,
    })
}

/// Ownership of an attempt in flight; resolves as failed if dropped unresolved.
#[derive(Debug)]
pub(crate) struct FlightClaim {
    entry: Arc<Entry>,
    id: u64,
    resolved: bool,
}

impl FlightClaim {
    /// The attempt was served with this body: it becomes the last served response.
    pub(crate) fn served(mut self, body: Bytes) {
        self.finish(Flight::Served(body));
    }

    fn finish(&mut self, flight: Flight) {
        self.resolved = true;
        let waiters = {
            let mut state = self.entry.retry.lock();
            let Some(at) = state.inflight.iter().position(|f| f.id == self.id) else {
                return;
            };
            let done = state.inflight.swap_remove(at);
            if let Flight::Served(body) = &flight {
                state.last = Some((done.request, body.clone()));
            }
            done.waiters
        };
        if let Some(tx) = waiters {
            tx.send_replace(flight);
        }
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
async fn wait(mut rx: watch::Receiver<Flight>) -> Option<Bytes> {
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

    async fn same(a: &[u8], b: &[u8]) -> bool {
        let a = Fingerprint::of(&Bytes::copy_from_slice(a)).await;
        let b = Fingerprint::of(&Bytes::copy_from_slice(b)).await;
        a.same(&b)
    }

    #[tokio::test]
    async fn small_bodies_are_compared_and_large_ones_hashed() {
        assert!(matches!(
            Fingerprint::of(&Bytes::from_static(b"{}")).await,
            Fingerprint::Body(_)
        ));
        let medium = vec![7u8; COMPARE_LIMIT + 1];
        let big = vec![7u8; INLINE_HASH_LIMIT + 1];
        match Fingerprint::of(&Bytes::from(big.clone())).await {
            Fingerprint::Digest { len, digest } => {
                assert_eq!(len, big.len());
                assert_eq!(digest, hash(&big));
            }
            other => panic!("a large body is digested, got {other:?}"),
        }
        assert!(same(b"a", b"a").await);
        assert!(!same(b"a", b"b").await);
        assert!(!same(b"a", b"ab").await);
        assert!(same(&medium, &medium).await);
        let mut other = medium.clone();
        other[100] = 8;
        assert!(!same(&medium, &other).await);
        // At the limit's edge the two kinds never match each other.
        assert!(!same(&medium[..COMPARE_LIMIT], &medium).await);
    }
}
