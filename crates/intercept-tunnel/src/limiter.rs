//! A rolling-window rate limiter for tunnel creation, shared by a host or by a fleet.
//!
//! Tunnel services cap how many tunnels an account may start per minute (Prime: 512), and
//! every process of the account shares that budget. [`RateLimiter`] enforces *at most
//! `rate` starts in any window of `window` length* (60 s by default) across processes.
//! Where the starts of the current window live is the [`Backend`]:
//!
//! - [`Backend::File`] (the default): a small text file under the user's cache directory,
//!   read and rewritten under an exclusive file lock. It covers the processes of one host.
//! - [`Backend::Redis`]: a hash in a Redis server, keyed by account, read and rewritten
//!   by one Lua script per reservation (atomic on the server) with "now" taken from the
//!   Redis server's clock (`TIME`), so hosts with skewed clocks still agree. It covers a
//!   fleet of hosts sharing one account. When Redis cannot be reached or does not answer
//!   within [`RateLimit::timeout`] (5 s), the limiter **fails closed**: the start fails
//!   with [`TunnelError::LimiterUnavailable`] (a 503 to whoever waits for it), counted
//!   by [`limiter_unavailable_total`]; no start goes out unchecked.
//!
//! Both apply the same policy:
//!
//! - The window is measured the way the provider counts: a start holds its slot from its
//!   reservation until the request *completed* ([`Permit::complete`]), plus a safety
//!   margin ([`RateLimit::margin`], 2 s by default). A new start is allowed only when fewer
//!   than `rate` starts are in flight or ended less than one window before it, so the
//!   provider, whenever between reservation and completion it counts a request, never
//!   sees more than `rate` in any window.
//! - A burst of up to the whole budget goes out at once; a caller beyond the budget
//!   reserves the earliest time at which the window allows it and sleeps until then
//!   (while the whole budget is in flight it polls until a start completes).
//! - The lock (or the script) is held only while the window is read and rewritten, never
//!   while waiting, and the async runtime is never blocked (file I/O runs in
//!   `spawn_blocking`).
//! - A caller that would have to wait longer than [`RateLimit::max_wait`] fails fast with
//!   [`TunnelError::RateLimited`] and reserves nothing.
//! - A permit dropped without [`Permit::complete`] (a cancelled start) completes at the
//!   drop. A start in flight longer than [`IN_FLIGHT_LEASE`] (a process that died holding
//!   it) counts as having ended at its lease.
//! - Times are wall-clock milliseconds since the Unix epoch, so reservations made by other
//!   processes (and before a restart) are honoured.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_with::{As, DurationSecondsWithFrac};

use crate::error::TunnelError;

mod redis;

pub use redis::limiter_unavailable_total;

/// Prime's service limit: tunnel starts per minute per API token.
pub const PRIME_STARTS_PER_MINUTE: u32 = 512;

/// The longest a start counts as in flight; one still open after that (its process died)
/// counts as ended at `start + IN_FLIGHT_LEASE`.
pub const IN_FLIGHT_LEASE: Duration = Duration::from_secs(600);

/// How often a caller blocked by starts in flight looks again.
const POLL: Duration = Duration::from_millis(100);

/// Where a [`RateLimiter`] keeps the starts of its window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// A file under the user's cache directory, shared by the processes of one host
    /// under an exclusive lock (the default).
    #[default]
    File,
    /// A Redis server shared by a fleet of hosts ([`RateLimit::url`]): one Lua script
    /// reserves atomically, on the Redis server's clock.
    Redis,
}

/// Configuration of a [`RateLimiter`].
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimit {
    /// Whether the limiter is on.
    pub enabled: bool,
    /// Starts allowed in any window.
    pub rate: u32,
    /// Window length (60 s by default).
    #[serde(with = "As::<DurationSecondsWithFrac<f64>>")]
    pub window: Duration,
    /// A caller that would wait longer than this fails fast (300 s by default).
    #[serde(with = "As::<DurationSecondsWithFrac<f64>>")]
    pub max_wait: Duration,
    /// Added to each start's completion time before it counts as ended (2 s by default):
    /// covers the provider counting a little later than the client saw the answer.
    #[serde(with = "As::<DurationSecondsWithFrac<f64>>")]
    pub margin: Duration,
    /// Where the window lives: a host-wide file (the default) or a fleet-wide Redis.
    pub backend: Backend,
    /// The window file ([`Backend::File`]). `None` uses the user's cache directory
    /// (`$XDG_CACHE_HOME` or `~/.cache`, then the temp dir) plus
    /// `intercept/limiter/<name>.window`.
    pub path: Option<PathBuf>,
    /// The Redis server ([`Backend::Redis`]): `redis://[user:password@]host[:port][/db]`
    /// or `redis+unix:///path`.
    pub url: Option<String>,
    /// The Redis key of the window ([`Backend::Redis`]). `None` uses
    /// `intercept:limiter:<name>`, where the name carries the account, so that the hosts
    /// of one account share a budget and different accounts do not.
    pub key: Option<String>,
    /// The longest one Redis round trip (connecting included) may take before the
    /// limiter fails closed (5 s by default).
    #[serde(with = "As::<DurationSecondsWithFrac<f64>>")]
    pub timeout: Duration,
}

impl fmt::Debug for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("enabled", &self.enabled)
            .field("rate", &self.rate)
            .field("window", &self.window)
            .field("max_wait", &self.max_wait)
            .field("margin", &self.margin)
            .field("backend", &self.backend)
            .field("path", &self.path)
            .field("url", &self.url.as_deref().map(redact_url))
            .field("key", &self.key)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            enabled: true,
            rate: PRIME_STARTS_PER_MINUTE,
            window: Duration::from_secs(60),
            max_wait: Duration::from_secs(300),
            margin: Duration::from_secs(2),
            backend: Backend::File,
            path: None,
            url: None,
            key: None,
            timeout: Duration::from_secs(5),
        }
    }
}

impl RateLimit {
    /// A configuration that turns the limiter off.
    pub fn off() -> Self {
        RateLimit {
            enabled: false,
            ..RateLimit::default()
        }
    }
}

/// A URL with its user info (user and password) replaced by `***`, for messages and logs.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// The user's cache directory: `$XDG_CACHE_HOME`, `~/Library/Caches` (macOS) or
/// `~/.cache`, and the temp dir when there is no home.
pub fn user_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) if cfg!(target_os = "macos") => PathBuf::from(home).join("Library/Caches"),
        Some(home) => PathBuf::from(home).join(".cache"),
        None => std::env::temp_dir(),
    }
}

/// Where "now" comes from: the wall clock, or (in tests) tokio's clock offset from a
/// fixed wall time so that paused time drives the limiter.
#[derive(Clone)]
enum Clock {
    System,
    #[cfg(test)]
    Tokio {
        base_ms: u64,
        base: tokio::time::Instant,
    },
}

impl Clock {
    fn now_ms(&self) -> u64 {
        match self {
            Clock::System => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
            #[cfg(test)]
            Clock::Tokio { base_ms, base } => base_ms + base.elapsed().as_millis() as u64,
        }
    }
}

/// A rolling-window rate limiter shared by every process on the host (the file backend)
/// or by a fleet of hosts (the Redis backend). Cheap to clone; clones share nothing but
/// the window, which is what makes processes cooperate.
#[derive(Clone)]
pub struct RateLimiter {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    rate: u32,
    window: Duration,
    max_wait: Duration,
    margin: Duration,
    store: Store,
}

/// Where the window lives.
enum Store {
    /// A locked file; `clock` gives "now".
    File { path: PathBuf, clock: Clock },
    /// A Redis hash; "now" is the Redis server's clock.
    Redis(Box<redis::RedisWindow>),
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            None => f.write_str("RateLimiter(off)"),
            Some(inner) => {
                let mut d = f.debug_struct("RateLimiter");
                match &inner.store {
                    Store::File { path, .. } => d.field("path", path),
                    Store::Redis(r) => d.field("redis", r),
                };
                d.field("rate", &inner.rate)
                    .field("window", &inner.window)
                    .field("max_wait", &inner.max_wait)
                    .finish()
            }
        }
    }
}

/// What [`RateLimiter::acquire`] granted: one start slot, held until
/// [`Permit::complete`] (or the drop) records when the start ended.
pub struct Permit {
    /// The reserved start time (wall clock, ms since the Unix epoch; with the Redis
    /// backend, the Redis server's clock); `acquire` returns no earlier than this. 0 when
    /// the limiter is off.
    pub at_ms: u64,
    /// How long the caller had to wait.
    pub waited: Duration,
    held: Option<(Arc<Inner>, u64)>,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("at_ms", &self.at_ms)
            .field("waited", &self.waited)
            .field("held", &self.held.is_some())
            .finish()
    }
}

impl Permit {
    fn free(waited: Duration) -> Self {
        Permit {
            at_ms: 0,
            waited,
            held: None,
        }
    }

    /// Records that the start's request completed (now, plus the margin): from then on
    /// the slot frees one window later. Errors recording it are logged; the start then
    /// counts as in flight until its lease ends, which errs on the safe side.
    pub async fn complete(mut self) {
        if let Some((inner, id)) = self.held.take() {
            if let Err(e) = inner.complete(id).await {
                tracing::warn!(error = %e, "tunnel rate limiter: could not record a completed start");
            }
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let Some((inner, id)) = self.held.take() else {
            return;
        };
        // A cancelled start: record its end now.
        match &inner.store {
            // A short, local file write.
            Store::File { .. } => {
                if let Err(e) = inner.complete_file(id) {
                    tracing::warn!(error = %e, "tunnel rate limiter: could not record a cancelled start");
                }
            }
            // A round trip: on the runtime, when there is one (otherwise the start counts
            // as in flight until its lease ends).
            Store::Redis(_) => {
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        if let Err(e) = inner.complete(id).await {
                            tracing::warn!(error = %e, "tunnel rate limiter: could not record a cancelled start");
                        }
                    });
                }
            }
        }
    }
}

impl RateLimiter {
    /// A limiter that never waits.
    pub fn off() -> Self {
        RateLimiter { inner: None }
    }

    /// A limiter from its configuration; `name` names the default window file or Redis
    /// key (e.g. `prime-<account hash>`), so that different accounts do not share a
    /// budget.
    ///
    /// Fails with [`TunnelError::Config`] when the Redis backend has no URL or a URL that
    /// cannot be parsed. Nothing is connected here: the first [`RateLimiter::acquire`]
    /// connects.
    pub fn new(config: &RateLimit, name: &str) -> Result<Self, TunnelError> {
        if !config.enabled || config.rate == 0 {
            return Ok(RateLimiter::off());
        }
        let store = match config.backend {
            Backend::File => Store::File {
                path: config.path.clone().unwrap_or_else(|| {
                    user_cache_dir()
                        .join("intercept")
                        .join("limiter")
                        .join(format!("{name}.window"))
                }),
                clock: Clock::System,
            },
            Backend::Redis => {
                let url = config
                    .url
                    .as_deref()
                    .filter(|u| !u.trim().is_empty())
                    .ok_or_else(|| {
                        TunnelError::Config(
                        "tunnel rate limiter: backend = \"redis\" needs `url` (redis://host:port)"
                            .into(),
                    )
                    })?;
                let key = config
                    .key
                    .clone()
                    .unwrap_or_else(|| format!("intercept:limiter:{name}"));
                if config.timeout.is_zero() {
                    return Err(TunnelError::Config(
                        "tunnel rate limiter: `timeout` must be positive".into(),
                    ));
                }
                Store::Redis(Box::new(redis::RedisWindow::new(url, key, config.timeout)?))
            }
        };
        Ok(RateLimiter {
            inner: Some(Arc::new(Inner {
                rate: config.rate,
                window: config.window,
                max_wait: config.max_wait,
                margin: config.margin,
                store,
            })),
        })
    }

    #[cfg(test)]
    fn with_tokio_clock(config: &RateLimit, base_ms: u64) -> Self {
        let mut limiter = RateLimiter::new(config, "test").unwrap_or_else(|_| RateLimiter::off());
        if let Some(Store::File { clock, .. }) = limiter
            .inner
            .as_mut()
            .and_then(Arc::get_mut)
            .map(|i| &mut i.store)
        {
            *clock = Clock::Tokio {
                base_ms,
                base: tokio::time::Instant::now(),
            };
        }
        limiter
    }

    /// Whether the limiter is on.
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// The window file, when the limiter is on with the file backend.
    pub fn path(&self) -> Option<&Path> {
        match &self.inner.as_ref()?.store {
            Store::File { path, .. } => Some(path.as_path()),
            Store::Redis(_) => None,
        }
    }

    /// The backend, when the limiter is on.
    pub fn backend(&self) -> Option<Backend> {
        self.inner.as_ref().map(|i| match i.store {
            Store::File { .. } => Backend::File,
            Store::Redis(_) => Backend::Redis,
        })
    }

    /// Reserves one start and waits until it is due. Hold the permit until the start's
    /// request completed, then call [`Permit::complete`].
    ///
    /// Fails fast with [`TunnelError::RateLimited`] (reserving nothing) when the wait would
    /// exceed the bound, with [`TunnelError::Io`] when the window file cannot be used, and
    /// with [`TunnelError::LimiterUnavailable`] when the Redis server cannot be reached or
    /// does not answer within the timeout: the limiter fails closed, it never lets a
    /// start through unchecked.
    pub async fn acquire(&self) -> Result<Permit, TunnelError> {
        let Some(inner) = self.inner.clone() else {
            return Ok(Permit::free(Duration::ZERO));
        };
        let started = tokio::time::Instant::now();
        loop {
            let budget = inner.max_wait.saturating_sub(started.elapsed());
            match inner.reserve(budget).await? {
                Reserved::At { id, at_ms, wait } => {
                    // The permit exists before the wait, so a cancelled wait frees the slot.
                    let mut permit = Permit {
                        at_ms,
                        waited: Duration::ZERO,
                        held: Some((Arc::clone(&inner), id)),
                    };
                    if !wait.is_zero() {
                        tracing::debug!(?wait, "tunnel rate limiter: waiting for a start slot");
                        tokio::time::sleep(wait).await;
                    }
                    permit.waited = started.elapsed();
                    return Ok(permit);
                }
                Reserved::Blocked => {
                    let waited = started.elapsed();
                    if waited >= inner.max_wait {
                        return Err(TunnelError::RateLimited {
                            wait: waited + POLL,
                            bound: inner.max_wait,
                        });
                    }
                    tokio::time::sleep(POLL.min(inner.max_wait - waited)).await;
                }
            }
        }
    }
}

/// What one look at the window decided.
pub(crate) enum Reserved {
    /// A slot at `at_ms`, `wait` from now, recorded as in flight under `id`.
    At { id: u64, at_ms: u64, wait: Duration },
    /// The whole budget is in flight: look again later.
    Blocked,
}

/// The numbers one reservation is decided with, in milliseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params {
    pub(crate) window_ms: u64,
    pub(crate) rate: u32,
    pub(crate) lease_ms: u64,
    /// How far ahead a reservation may be (the wait bound left to this caller).
    pub(crate) budget_ms: u64,
    /// How far ahead any recorded start can legitimately be: `max_wait`.
    pub(crate) horizon_ms: u64,
    pub(crate) margin_ms: u64,
}

impl Params {
    /// How long an untouched window can still matter: the longest an entry can count.
    pub(crate) fn ttl_ms(&self) -> u64 {
        self.horizon_ms + self.lease_ms + self.margin_ms + self.window_ms
    }
}

impl Inner {
    fn params(&self, budget: Duration) -> Params {
        Params {
            window_ms: self.window.as_millis() as u64,
            rate: self.rate,
            lease_ms: IN_FLIGHT_LEASE.as_millis() as u64,
            budget_ms: budget.as_millis() as u64,
            horizon_ms: self.max_wait.as_millis() as u64,
            margin_ms: self.margin.as_millis() as u64,
        }
    }

    /// One look at the window: prune, decide, record. Fails with `RateLimited` when the
    /// slot is further than `budget` away (recording nothing).
    async fn reserve(self: &Arc<Self>, budget: Duration) -> Result<Reserved, TunnelError> {
        match &self.store {
            Store::File { .. } => {
                let job = Arc::clone(self);
                tokio::task::spawn_blocking(move || job.reserve_file(budget))
                    .await
                    .map_err(|e| TunnelError::Io(format!("rate limiter thread failed: {e}")))?
            }
            Store::Redis(redis) => redis.reserve(self.params(budget), self.max_wait).await,
        }
    }

    /// Marks start `id` ended at now + margin.
    async fn complete(self: &Arc<Self>, id: u64) -> Result<(), TunnelError> {
        match &self.store {
            Store::File { .. } => {
                let job = Arc::clone(self);
                tokio::task::spawn_blocking(move || job.complete_file(id))
                    .await
                    .map_err(|e| TunnelError::Io(format!("rate limiter thread failed: {e}")))?
            }
            Store::Redis(redis) => redis.complete(id, self.params(Duration::ZERO)).await,
        }
    }

    /// [`Inner::reserve`] on the window file, under its lock.
    fn reserve_file(&self, budget: Duration) -> Result<Reserved, TunnelError> {
        self.locked(|entries, now| {
            let window_ms = self.window.as_millis() as u64;
            let lease_ms = IN_FLIGHT_LEASE.as_millis() as u64;
            match schedule(entries, now, window_ms, self.rate as usize, lease_ms) {
                Decision::Blocked => Ok(Reserved::Blocked),
                Decision::At(at) => {
                    let wait = Duration::from_millis(at - now);
                    if wait > budget {
                        return Err(TunnelError::RateLimited {
                            wait,
                            bound: self.max_wait,
                        });
                    }
                    let id = fastrand::u64(1..);
                    entries.push(Entry {
                        id,
                        start: at,
                        end: None,
                    });
                    Ok(Reserved::At {
                        id,
                        at_ms: at,
                        wait,
                    })
                }
            }
        })
    }

    /// [`Inner::complete`] on the window file, under its lock.
    fn complete_file(&self, id: u64) -> Result<(), TunnelError> {
        let margin = self.margin.as_millis() as u64;
        self.locked(|entries, now| {
            if let Some(e) = entries.iter_mut().find(|e| e.id == id) {
                e.end = Some(now.saturating_add(margin).max(e.start));
            }
            Ok(())
        })
    }

    /// Reads the window file's entries under the lock, lets `f` change them, writes them
    /// back.
    fn locked<T>(
        &self,
        f: impl FnOnce(&mut Vec<Entry>, u64) -> Result<T, TunnelError>,
    ) -> Result<T, TunnelError> {
        let Store::File { path, clock } = &self.store else {
            return Err(TunnelError::Io(
                "tunnel rate limiter: not a file-backed window".into(),
            ));
        };
        let file = open_locked(path)?;
        let result = (|| {
            let mut file = &file;
            let io = |e: std::io::Error| TunnelError::io("tunnel rate limiter window file", &e);
            let mut text = String::new();
            file.read_to_string(&mut text).map_err(io)?;
            let now = clock.now_ms();
            let mut entries = parse_entries(&text);
            // A start is never reserved further ahead than the bound; one that is means the
            // wall clock went back (or the file is junk): forget it rather than stall.
            let horizon = now.saturating_add(self.max_wait.as_millis() as u64);
            entries.retain(|e| e.start <= horizon);
            let out = f(&mut entries, now)?;
            let mut text = String::with_capacity(entries.len() * 40);
            for e in &entries {
                text.push_str(&e.to_line());
                text.push('\n');
            }
            file.seek(SeekFrom::Start(0)).map_err(io)?;
            file.set_len(0).map_err(io)?;
            file.write_all(text.as_bytes()).map_err(io)?;
            file.flush().map_err(io)?;
            Ok(out)
        })();
        // Unlocking also happens on close; do it explicitly to release promptly.
        let _ = fs4::FileExt::unlock(&file);
        result
    }
}

fn open_locked(path: &Path) -> Result<File, TunnelError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| TunnelError::io(&format!("cannot create {}", dir.display()), &e))?;
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| TunnelError::io(&format!("cannot open {}", path.display()), &e))?;
    fs4::FileExt::lock(&file)
        .map_err(|e| TunnelError::io(&format!("cannot lock {}", path.display()), &e))?;
    Ok(file)
}

/// One start in the window file: `<id> <start ms> <end ms or ->`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Names the start so that its completion can find it.
    pub(crate) id: u64,
    /// When it was allowed to go out.
    pub(crate) start: u64,
    /// When it ended (completion plus margin); `None` while in flight.
    pub(crate) end: Option<u64>,
}

impl Entry {
    fn to_line(self) -> String {
        match self.end {
            Some(end) => format!("{} {} {end}", self.id, self.start),
            None => format!("{} {} -", self.id, self.start),
        }
    }
}

/// Reads one entry per line; a bare number (an older file) is a start that ended then;
/// anything unreadable is ignored.
fn parse_entries(text: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let first: u64 = parts.next()?.parse().ok()?;
            match (parts.next(), parts.next()) {
                (None, _) => Some(Entry {
                    id: 0,
                    start: first,
                    end: Some(first),
                }),
                (Some(start), Some(end)) => {
                    let start = start.parse().ok()?;
                    let end = match end {
                        "-" => None,
                        n => Some(n.parse().ok()?),
                    };
                    Some(Entry {
                        id: first,
                        start,
                        end,
                    })
                }
                (Some(_), None) => None,
            }
        })
        .collect()
}

/// What [`schedule`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The earliest allowed start.
    At(u64),
    /// `rate` starts are in flight: no time can be given until one completes.
    Blocked,
}

/// The pure scheduling policy. A start at `a` is allowed when fewer than `rate` recorded
/// starts are in flight or ended after `a - window`. Entries that can no longer count
/// (ended a window ago, or in flight past their lease) are pruned from `entries`.
///
/// Why this bounds what the provider sees: let it count each request at some instant
/// between the request's reservation and its end. Take any window of its count and the
/// request in it decided last; every other request in that window ended after the
/// window began, so after that request's start minus one window, and was recorded (in
/// flight or ended) when it was decided. So that decision counted all of them: at most
/// `rate - 1` others.
pub(crate) fn schedule(
    entries: &mut Vec<Entry>,
    now: u64,
    window_ms: u64,
    rate: usize,
    lease_ms: u64,
) -> Decision {
    for e in entries.iter_mut() {
        if e.end.is_none() && e.start.saturating_add(lease_ms) < now {
            e.end = Some(e.start.saturating_add(lease_ms));
        }
    }
    entries.retain(|e| e.end.is_none_or(|end| end.saturating_add(window_ms) > now));
    let in_flight = entries.iter().filter(|e| e.end.is_none()).count();
    if in_flight >= rate {
        return Decision::Blocked;
    }
    let mut ends: Vec<u64> = entries.iter().filter_map(|e| e.end).collect();
    let n = in_flight + ends.len();
    if n < rate {
        return Decision::At(now);
    }
    ends.sort_unstable();
    // Drop the `n - rate + 1` earliest ends out of the window: wait for the last of them.
    Decision::At(now.max(ends[n - rate].saturating_add(window_ms)))
}

#[cfg(test)]
mod tests;
