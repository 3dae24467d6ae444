//! Retry atomicity: replay of the last served response and coalescing of identical
//! attempts in flight, for SDK retries marked by `x-stainless-retry-count > 0`, and for
//! calls named by an `Idempotency-Key` header.
//!
//! Without it, a retry of a turn whose answer was lost in transit would sample again and
//! record a second turn; a retry arriving while the first attempt still computes would
//! start a second inference. Marked retries: only non-streamed calls take part, and only
//! while their body names one logical request (see [`RetryState`]). Keyed calls: streamed
//! ones too (a replayed stream is re-made from the recorded response).
//!
//! The request path uses it at two points: `admit` (`server.rs`) asks [`replay`] before
//! any refusal and [`claim`] once the call is admitted; `serve_json` and the stream's
//! finish (`call.rs`) keep the served answer for later retries ([`FlightClaim::served`],
//! [`KeyClaim::served`]).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use std::sync::OnceLock;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue};
use intercept_core::Error;
use tokio::sync::watch;
use tokio::time::Instant;

use intercept_core::Session;
use parking_lot::Mutex;

/// Bodies up to this size are matched byte for byte: the body is shared, not copied (a
/// session keeps its last request for parsing the next one anyway, see
/// `JsonBody::parse_after`), and nothing is hashed on the request path; bodies compare
/// their bytes only when their lengths are equal. Larger ones are matched by their length
/// and an XXH3-128 digest, so a session between turns never holds more than this much of
/// its last request for retries.
const COMPARE_LIMIT: usize = 16 << 20;

/// Bodies larger than this are hashed on a blocking thread, off the request path.
const INLINE_HASH_LIMIT: usize = 1 << 20;

/// What identifies a request body, as the harness sent it, for retry matching.
#[derive(Debug, Clone)]
pub(crate) enum Fingerprint {
    /// A small body, compared byte for byte.
    Body(Bytes),
    /// A large body: its length and XXH3-128 digest (seeded per process).
    Digest { len: usize, digest: [u8; 16] },
}

impl Fingerprint {
    /// The fingerprint of a body; large bodies are hashed, on a blocking thread above
    /// 1 MiB.
    pub(crate) async fn of(bytes: &Bytes) -> Self {
        if bytes.len() <= COMPARE_LIMIT {
            return Fingerprint::Body(bytes.clone());
        }
        Fingerprint::digest(bytes).await
    }

    /// The digest of a body, whatever its size (kept for as long as an idempotency key
    /// is remembered, so never a copy of the body).
    async fn digest(bytes: &Bytes) -> Self {
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

/// XXH3-128 with a seed drawn once per process: a digest matches requests of one
/// session, so it needs speed (it runs on every large non-streamed call: ~10 GB/s against
/// BLAKE2b's ~0.7) rather than resistance to an attacker; the seed, which a harness
/// cannot see, keeps a harness from crafting two bodies with one digest, and a collision
/// would only replay the harness's own rollout's last answer to it.
fn hash(bytes: &[u8]) -> [u8; 16] {
    static SEED: OnceLock<u64> = OnceLock::new();
    let seed = *SEED.get_or_init(|| {
        use std::hash::BuildHasher as _;
        std::collections::hash_map::RandomState::new().hash_one(0x7265_7472_795f_u64)
    });
    xxhash_rust::xxh3::xxh3_128_with_seed(bytes, seed).to_le_bytes()
}

/// The state of an attempt in flight.
#[derive(Debug, Clone)]
pub(crate) enum Flight {
    Pending,
    Served(Answer),
    Failed,
}

/// An answer served to a call, kept for its replays.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    /// A non-streamed call's body, as served, and its content type.
    Json {
        body: Bytes,
        content_type: Option<HeaderValue>,
    },
    /// A streamed call's response (one JSON document, as recorded, or as the response
    /// hook rewrote it): replayed as a minimal valid stream of the dialect.
    Stream(Bytes),
}

/// A session's retry state, shared with the claims of its calls in flight.
pub(crate) type RetryTable = Arc<Mutex<RetryState>>;

/// Per-session retry state.
///
/// **Generations.** A body names one logical request only while the harness sent it
/// once: two unmarked requests with the same body are two requests, and a marked retry
/// of that body could be a retry of either. Each body the state holds (the last served
/// one, those in flight) counts its *generations*, the unmarked requests with that body
/// that reached the upstream while it was held; a marked retry is replayed or coalesced
/// only while the count is 1, and goes upstream otherwise.
#[derive(Debug, Default)]
pub(crate) struct RetryState {
    /// The last served non-streamed call: its request, answer and generations.
    last: Option<Last>,
    /// Attempts in flight (a handful per session at most: searched in order).
    inflight: Vec<InFlight>,
    /// Names the next attempt.
    next_id: u64,
    /// Calls named by an `Idempotency-Key`.
    keys: KeyStore,
}

/// The last served non-streamed call.
#[derive(Debug)]
struct Last {
    request: Fingerprint,
    body: Bytes,
    generations: u32,
}

/// One attempt in flight.
#[derive(Debug)]
struct InFlight {
    id: u64,
    request: Fingerprint,
    /// Unmarked requests with this body that went upstream while it was held.
    generations: u32,
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

/// How a call takes part in retry matching, once past [`replay`].
pub(crate) enum Plan {
    /// By the SDK's retry marker (`None`: a streamed call, which takes no part).
    Marked(Option<Attempt>),
    /// Named by an `Idempotency-Key`: the claim on the key, already taken.
    Keyed(KeyClaim),
}

/// What [`replay`] answers at once, instead of admitting the call.
pub(crate) enum Early {
    /// The answer served to this very request, replayed.
    Replayed(Answer),
    /// The same keyed call in flight, to wait for.
    Join(Joined),
    /// A key reused with a different request (400).
    Refused(Error),
}

/// The header naming one logical call.
pub(crate) const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// How long a completed keyed call is remembered.
pub(crate) const KEY_TTL: Duration = Duration::from_secs(600);

/// Completed keyed calls remembered per session (the oldest is forgotten first).
pub(crate) const KEY_CAPACITY: usize = 64;

/// The retry stage's first half, before any refusal (a retried call that was served
/// gets its answer even if the rollout stopped since).
///
/// A call with an `Idempotency-Key` is matched by its key alone, whatever its retry
/// marker: a completed call with that key is replayed, one in flight is joined, a key
/// used with another path or body is refused; else the key is claimed. Any other call
/// is matched by its retry marker and body: a marked retry of the last served body is
/// replayed (the session's `on_replay` is told); otherwise the attempt, for [`claim`]
/// once the call is admitted.
pub(crate) async fn replay(
    table: &RetryTable,
    session: &Arc<dyn Session>,
    path: &'static str,
    headers: &HeaderMap,
    body: &intercept_core::JsonBody,
    stream: bool,
) -> Result<Plan, Early> {
    if let Some(key) = headers.get(IDEMPOTENCY_KEY) {
        let key = String::from_utf8_lossy(key.as_bytes());
        let request = Fingerprint::digest(body.source()).await;
        return match keyed(table, &key, path, request) {
            Keyed::Claim(c) => Ok(Plan::Keyed(c)),
            Keyed::Replay(answer) => {
                tracing::debug!(session = session.id(), "intercept replay (idempotency key)");
                session.on_replay();
                Err(Early::Replayed(answer))
            }
            Keyed::Join(rx) => {
                tracing::debug!(
                    session = session.id(),
                    "intercept coalesce (idempotency key)"
                );
                Err(Early::Join(Joined {
                    session: session.clone(),
                    rx,
                }))
            }
            Keyed::Mismatch => {
                let shown: String = key.chars().take(128).collect();
                Err(Early::Refused(Error::invalid(format!(
                    "Idempotency-Key `{shown}` was already used with a different request \
                     (another path or body) in this rollout; send a new key for a new request"
                ))))
            }
        };
    }
    if stream {
        return Ok(Plan::Marked(None));
    }
    let marked = is_marked_retry(headers);
    let fingerprint = Fingerprint::of(body.source()).await;
    match replay_served(table, &fingerprint, marked) {
        Some(served) => {
            tracing::debug!(session = session.id(), "intercept replay");
            session.on_replay();
            Err(Early::Replayed(Answer::Json {
                body: served,
                content_type: None,
            }))
        }
        None => Ok(Plan::Marked(Some(Attempt {
            fingerprint,
            marked,
        }))),
    }
}

/// A call's claim on its answer: resolved when it is served, failed when dropped.
#[derive(Debug)]
pub(crate) enum Claim {
    /// A non-streamed attempt (retry marker matching).
    Flight(FlightClaim),
    /// An idempotency key.
    Key(KeyClaim),
}

impl Claim {
    /// The call was served this answer.
    pub(crate) fn served(self, answer: Answer) {
        match self {
            Claim::Flight(c) => {
                if let Answer::Json { body, .. } = answer {
                    c.served(body);
                }
            }
            Claim::Key(c) => c.served(answer),
        }
    }
}

/// The retry stage's second half, once the call is admitted: the claim on a new attempt
/// (resolved by [`Claim::served`], or as failed when dropped), or `Err`, an identical
/// attempt in flight that a marked retry joins ([`Joined::answer`]).
pub(crate) fn claim(
    table: &RetryTable,
    session: &Arc<dyn Session>,
    plan: Plan,
) -> Result<Option<Claim>, Joined> {
    let attempt = match plan {
        Plan::Keyed(c) => return Ok(Some(Claim::Key(c))),
        Plan::Marked(None) => return Ok(None),
        Plan::Marked(Some(attempt)) => attempt,
    };
    match coalesce_or_claim(table, attempt.fingerprint, attempt.marked) {
        Decision::Claim(c) => Ok(Some(Claim::Flight(c))),
        Decision::Coalesce(rx) => {
            tracing::debug!(session = session.id(), "intercept coalesce");
            Err(Joined {
                session: session.clone(),
                rx,
            })
        }
    }
}

/// An attempt in flight that a retry joined.
#[derive(Debug)]
pub(crate) struct Joined {
    session: Arc<dyn Session>,
    rx: watch::Receiver<Flight>,
}

impl Joined {
    /// Waits for the joined attempt: the answer it was served (the session's
    /// `on_replay` is told), or `None` if it failed.
    pub(crate) async fn answer(self) -> Option<Answer> {
        let served = wait(self.rx).await;
        if served.is_some() {
            self.session.on_replay();
        }
        served
    }
}

/// Replay check (before any refusal): a marked retry of the last served body gets the
/// recorded response, while that body names one logical request.
fn replay_served(table: &RetryTable, request: &Fingerprint, marked: bool) -> Option<Bytes> {
    if !marked {
        return None;
    }
    let state = table.lock();
    match &state.last {
        Some(last) if last.generations == 1 && last.request.same(request) => {
            Some(last.body.clone())
        }
        _ => None,
    }
}

/// Coalesce with an attempt in flight (marked retries of a body that names one logical
/// request) or claim a new one. An unmarked request is one more generation of its body.
fn coalesce_or_claim(table: &RetryTable, request: Fingerprint, marked: bool) -> Decision {
    let mut state = table.lock();
    let state = &mut *state;
    let held = state
        .last
        .as_ref()
        .filter(|l| l.request.same(&request))
        .map(|l| l.generations)
        .into_iter()
        .chain(
            state
                .inflight
                .iter()
                .filter(|f| f.request.same(&request))
                .map(|f| f.generations),
        )
        .max()
        .unwrap_or(0);
    if marked {
        if let Some(flight) = state
            .inflight
            .iter_mut()
            .find(|f| f.generations == 1 && f.request.same(&request))
        {
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
    // A marked retry that joins nothing keeps the count (ambiguous stays ambiguous).
    let generations = if marked { held.max(1) } else { held + 1 };
    if generations > 1 {
        if let Some(last) = state.last.as_mut().filter(|l| l.request.same(&request)) {
            last.generations = generations;
        }
        for f in state
            .inflight
            .iter_mut()
            .filter(|f| f.request.same(&request))
        {
            f.generations = generations;
        }
    }
    let id = state.next_id;
    state.next_id += 1;
    state.inflight.push(InFlight {
        id,
        request,
        generations,
        waiters: None,
    });
    Decision::Claim(FlightClaim {
        table: table.clone(),
        id,
        resolved: false,
    })
}

/// Ownership of an attempt in flight; resolves as failed if dropped unresolved.
#[derive(Debug)]
pub(crate) struct FlightClaim {
    table: RetryTable,
    id: u64,
    resolved: bool,
}

impl FlightClaim {
    /// The attempt was served with this body: it becomes the last served response.
    pub(crate) fn served(mut self, body: Bytes) {
        self.finish(Flight::Served(Answer::Json {
            body,
            content_type: None,
        }));
    }

    fn finish(&mut self, flight: Flight) {
        self.resolved = true;
        let waiters = {
            let mut state = self.table.lock();
            let Some(at) = state.inflight.iter().position(|f| f.id == self.id) else {
                return;
            };
            let done = state.inflight.swap_remove(at);
            if let Flight::Served(Answer::Json { body, .. }) = &flight {
                state.last = Some(Last {
                    request: done.request,
                    body: body.clone(),
                    generations: done.generations,
                });
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

/// Waits for a coalesced attempt: its answer, or `None` if it failed.
async fn wait(mut rx: watch::Receiver<Flight>) -> Option<Answer> {
    match rx.wait_for(|f| !matches!(f, Flight::Pending)).await {
        Ok(f) => match &*f {
            Flight::Served(a) => Some(a.clone()),
            _ => None,
        },
        Err(_) => None,
    }
}

/// The calls of a session named by an `Idempotency-Key`: those in flight, and up to
/// [`KEY_CAPACITY`] completed ones for [`KEY_TTL`] (oldest first).
#[derive(Debug, Default)]
struct KeyStore {
    entries: VecDeque<KeyEntry>,
    next_id: u64,
}

/// One keyed call.
#[derive(Debug)]
struct KeyEntry {
    id: u64,
    key: Box<str>,
    path: &'static str,
    request: Fingerprint,
    state: KeyState,
}

#[derive(Debug)]
enum KeyState {
    /// In flight: callers with the same key wait on it.
    Pending(watch::Sender<Flight>),
    /// Served at `at`.
    Done { answer: Answer, at: Instant },
}

/// What a key names.
enum Keyed {
    Replay(Answer),
    Join(watch::Receiver<Flight>),
    Mismatch,
    Claim(KeyClaim),
}

impl KeyStore {
    /// Forgets completed calls older than [`KEY_TTL`].
    fn expire(&mut self, now: Instant) {
        self.entries.retain(
            |e| !matches!(&e.state, KeyState::Done { at, .. } if now.duration_since(*at) >= KEY_TTL),
        );
    }

    /// Keeps `answer` for the key of the call `id` (gone if the store forgot it), and
    /// forgets the oldest completed calls past [`KEY_CAPACITY`]; the waiters of the call.
    fn complete(&mut self, id: u64, answer: Option<Answer>) -> Option<watch::Sender<Flight>> {
        let at = self.entries.iter().position(|e| e.id == id)?;
        let mut done = self.entries.remove(at)?;
        let waiters = match std::mem::replace(
            &mut done.state,
            KeyState::Done {
                answer: Answer::Stream(Bytes::new()),
                at: Instant::now(),
            },
        ) {
            KeyState::Pending(tx) => Some(tx),
            KeyState::Done { .. } => None,
        };
        if let Some(answer) = answer {
            done.state = KeyState::Done {
                answer,
                at: Instant::now(),
            };
            self.entries.push_back(done);
            let completed = |e: &KeyEntry| matches!(e.state, KeyState::Done { .. });
            let mut excess = self
                .entries
                .iter()
                .filter(|e| completed(e))
                .count()
                .saturating_sub(KEY_CAPACITY);
            self.entries.retain(|e| {
                if excess > 0 && completed(e) {
                    excess -= 1;
                    false
                } else {
                    true
                }
            });
        }
        waiters
    }
}

/// Looks a key up: its completed answer, the call in flight, a mismatch, or a new claim.
fn keyed(table: &RetryTable, key: &str, path: &'static str, request: Fingerprint) -> Keyed {
    let mut state = table.lock();
    let store = &mut state.keys;
    store.expire(Instant::now());
    if let Some(found) = store.entries.iter().find(|e| &*e.key == key) {
        if found.path != path || !found.request.same(&request) {
            return Keyed::Mismatch;
        }
        return match &found.state {
            KeyState::Pending(tx) => Keyed::Join(tx.subscribe()),
            KeyState::Done { answer, .. } => Keyed::Replay(answer.clone()),
        };
    }
    let id = store.next_id;
    store.next_id += 1;
    let (tx, _) = watch::channel(Flight::Pending);
    store.entries.push_back(KeyEntry {
        id,
        key: key.into(),
        path,
        request,
        state: KeyState::Pending(tx),
    });
    Keyed::Claim(KeyClaim {
        table: table.clone(),
        id,
        resolved: false,
    })
}

/// Ownership of a keyed call in flight; resolves as failed if dropped unresolved (the
/// key is then forgotten, so the harness's next attempt goes upstream).
#[derive(Debug)]
pub(crate) struct KeyClaim {
    table: RetryTable,
    id: u64,
    resolved: bool,
}

impl KeyClaim {
    /// The call was served this answer: kept for the key's later calls.
    pub(crate) fn served(mut self, answer: Answer) {
        self.finish(Some(answer));
    }

    fn finish(&mut self, answer: Option<Answer>) {
        self.resolved = true;
        let flight = match &answer {
            Some(a) => Flight::Served(a.clone()),
            None => Flight::Failed,
        };
        let waiters = self.table.lock().keys.complete(self.id, answer);
        if let Some(tx) = waiters {
            tx.send_replace(flight);
        }
    }
}

impl Drop for KeyClaim {
    fn drop(&mut self) {
        if !self.resolved {
            self.finish(None);
        }
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
        // Agent-sized bodies are compared, not hashed.
        let medium = vec![7u8; INLINE_HASH_LIMIT + 1];
        assert!(matches!(
            Fingerprint::of(&Bytes::from(medium.clone())).await,
            Fingerprint::Body(_)
        ));
        let big = vec![7u8; COMPARE_LIMIT + 1];
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
        assert!(!same(&big[..COMPARE_LIMIT], &big).await);
    }

    fn done(id: u64, at: Instant) -> KeyEntry {
        KeyEntry {
            id,
            key: format!("k{id}").into(),
            path: "/chat/completions",
            request: Fingerprint::Digest {
                len: 0,
                digest: [0; 16],
            },
            state: KeyState::Done {
                answer: Answer::Stream(Bytes::new()),
                at,
            },
        }
    }

    #[test]
    fn completed_keys_live_ten_minutes() {
        let now = Instant::now();
        let mut store = KeyStore::default();
        store.entries.push_back(done(0, now));
        store
            .entries
            .push_back(done(1, now + Duration::from_secs(1)));
        store.expire(now + KEY_TTL - Duration::from_millis(1));
        assert_eq!(store.entries.len(), 2);
        store.expire(now + KEY_TTL);
        assert_eq!(store.entries.len(), 1, "the older one expired");
        assert_eq!(store.entries[0].id, 1);
        store.expire(now + KEY_TTL + Duration::from_secs(1));
        assert!(store.entries.is_empty());
    }
}
