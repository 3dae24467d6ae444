//! A host-wide rolling-window rate limiter for tunnel creation.
//!
//! Tunnel services cap how many tunnels an account may start per minute (Prime: 512), and
//! every process of the user on the host shares that budget. [`RateLimiter`] enforces *at
//! most `rate` starts in any window of `window` length* (60 s by default) across processes:
//! the start times of the current window live in a small text file under the user's cache
//! directory, read and rewritten under an exclusive file lock.
//!
//! - A burst of up to the whole budget goes out at once; a caller beyond the budget
//!   reserves the earliest time at which the window allows it and sleeps until then.
//! - The lock is held only while the file is read and rewritten (in a blocking thread, via
//!   `spawn_blocking`), never while waiting, and the async runtime is never blocked.
//! - A caller that would have to wait longer than [`RateLimit::max_wait`] fails fast with
//!   [`TunnelError::RateLimited`] and reserves nothing.
//! - A reservation is kept even if the waiting caller is cancelled (it may already count
//!   against the service's budget from the point of view of other processes); this errs on
//!   the safe side.
//! - Times are wall-clock milliseconds since the Unix epoch, so reservations made by other
//!   processes (and before a restart) are honoured.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::TunnelError;

/// Prime's service limit: tunnel starts per minute per API token.
pub const PRIME_STARTS_PER_MINUTE: u32 = 512;

/// Configuration of a [`RateLimiter`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RateLimit {
    /// Whether the limiter is on.
    pub enabled: bool,
    /// Starts allowed in any window.
    pub rate: u32,
    /// Window length (60 s by default).
    #[serde(with = "secs")]
    pub window: Duration,
    /// A caller that would wait longer than this fails fast (300 s by default).
    #[serde(with = "secs")]
    pub max_wait: Duration,
    /// The window file. `None` uses the user's cache directory
    /// (`$XDG_CACHE_HOME` or `~/.cache`, then the temp dir) plus
    /// `intercept/limiter/<name>.window`.
    pub path: Option<PathBuf>,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            enabled: true,
            rate: PRIME_STARTS_PER_MINUTE,
            window: Duration::from_secs(60),
            max_wait: Duration::from_secs(300),
            path: None,
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

mod secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
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

/// A host-wide rolling-window rate limiter. Cheap to clone; clones share nothing but the
/// window file, which is what makes processes cooperate.
#[derive(Clone)]
pub struct RateLimiter {
    inner: Option<Arc<Inner>>,
}

struct Inner {
    path: PathBuf,
    rate: u32,
    window: Duration,
    max_wait: Duration,
    clock: Clock,
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            None => f.write_str("RateLimiter(off)"),
            Some(inner) => f
                .debug_struct("RateLimiter")
                .field("path", &inner.path)
                .field("rate", &inner.rate)
                .field("window", &inner.window)
                .field("max_wait", &inner.max_wait)
                .finish(),
        }
    }
}

/// What [`RateLimiter::acquire`] granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permit {
    /// The reserved start time (wall clock, ms since the Unix epoch); `acquire` returns no
    /// earlier than this. 0 when the limiter is off.
    pub at_ms: u64,
    /// How long the caller had to wait.
    pub waited: Duration,
}

impl RateLimiter {
    /// A limiter that never waits.
    pub fn off() -> Self {
        RateLimiter { inner: None }
    }

    /// A limiter from its configuration; `name` names the default window file (e.g.
    /// `prime-<account hash>`), so that different accounts do not share a budget.
    pub fn new(config: &RateLimit, name: &str) -> Self {
        if !config.enabled || config.rate == 0 {
            return RateLimiter::off();
        }
        let path = config.path.clone().unwrap_or_else(|| {
            user_cache_dir()
                .join("intercept")
                .join("limiter")
                .join(format!("{name}.window"))
        });
        RateLimiter {
            inner: Some(Arc::new(Inner {
                path,
                rate: config.rate,
                window: config.window,
                max_wait: config.max_wait,
                clock: Clock::System,
            })),
        }
    }

    #[cfg(test)]
    fn with_tokio_clock(config: &RateLimit, base_ms: u64) -> Self {
        let mut limiter = RateLimiter::new(config, "test");
        if let Some(inner) = limiter.inner.as_mut().and_then(Arc::get_mut) {
            inner.clock = Clock::Tokio {
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

    /// The window file, when the limiter is on.
    pub fn path(&self) -> Option<&Path> {
        self.inner.as_ref().map(|i| i.path.as_path())
    }

    /// Reserves one start and waits until it is due.
    ///
    /// Fails fast with [`TunnelError::RateLimited`] (reserving nothing) when the wait would
    /// exceed the bound, and with [`TunnelError::Io`] when the window file cannot be used.
    pub async fn acquire(&self) -> Result<Permit, TunnelError> {
        let Some(inner) = self.inner.clone() else {
            return Ok(Permit {
                at_ms: 0,
                waited: Duration::ZERO,
            });
        };
        let started = tokio::time::Instant::now();
        let job = Arc::clone(&inner);
        let reserved = tokio::task::spawn_blocking(move || job.reserve())
            .await
            .map_err(|e| TunnelError::Io(format!("rate limiter thread failed: {e}")))??;
        let (at_ms, wait) = reserved;
        if !wait.is_zero() {
            tracing::debug!(?wait, "tunnel rate limiter: waiting for a start slot");
            tokio::time::sleep(wait).await;
        }
        Ok(Permit {
            at_ms,
            waited: started.elapsed(),
        })
    }
}

impl Inner {
    /// Under the file lock: prune, pick the earliest allowed start, record it. Returns the
    /// reserved time and how long to wait for it.
    fn reserve(&self) -> Result<(u64, Duration), TunnelError> {
        let file = open_locked(&self.path)?;
        let result = self.reserve_in(&file);
        // Unlocking also happens on close; do it explicitly to release promptly.
        let _ = fs4::FileExt::unlock(&file);
        result
    }

    fn reserve_in(&self, mut file: &File) -> Result<(u64, Duration), TunnelError> {
        let io = |e: std::io::Error| TunnelError::io("tunnel rate limiter window file", &e);
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(io)?;
        let now = self.clock.now_ms();
        let window_ms = self.window.as_millis() as u64;
        let mut starts = parse_starts(&text);
        // A reservation is never further ahead than the bound; one that is means the
        // wall clock went back (or the file is junk): forget it rather than stall.
        let horizon = now.saturating_add(self.max_wait.as_millis() as u64);
        starts.retain(|&s| s <= horizon);
        let (at, keep) = schedule(&mut starts, now, window_ms, self.rate as usize);
        let wait = Duration::from_millis(at - now);
        if wait > self.max_wait {
            return Err(TunnelError::RateLimited {
                wait,
                bound: self.max_wait,
            });
        }
        let mut out = String::with_capacity((keep.len() + 1) * 14);
        for start in keep.iter().chain(std::iter::once(&at)) {
            out.push_str(&start.to_string());
            out.push('\n');
        }
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.set_len(0).map_err(io)?;
        file.write_all(out.as_bytes()).map_err(io)?;
        file.flush().map_err(io)?;
        Ok((at, wait))
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

/// Reads one start time (ms) per line; ignores anything unreadable.
fn parse_starts(text: &str) -> Vec<u64> {
    text.lines()
        .filter_map(|l| l.trim().parse::<u64>().ok())
        .collect()
}

/// The pure scheduling policy. Given recorded starts, `now`, the window and the rate,
/// returns the earliest start time that keeps every window at `rate` starts or fewer, and
/// the recorded starts still relevant (inside the window ending at `now`, or in the
/// future).
///
/// With `n` relevant starts sorted ascending: if `n < rate` the new start can go now;
/// otherwise it goes `window` after the start `rate - 1` places before the last one, so
/// that any window containing it holds at most `rate - 1` others.
pub(crate) fn schedule(
    starts: &mut Vec<u64>,
    now: u64,
    window_ms: u64,
    rate: usize,
) -> (u64, &[u64]) {
    starts.retain(|&s| s.saturating_add(window_ms) > now);
    starts.sort_unstable();
    let n = starts.len();
    let at = if n < rate {
        now
    } else {
        now.max(starts[n - rate].saturating_add(window_ms))
    };
    (at, starts.as_slice())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 1_700_000_000_000;

    fn config(dir: &Path, rate: u32, window_s: u64, max_wait_s: u64) -> RateLimit {
        RateLimit {
            enabled: true,
            rate,
            window: Duration::from_secs(window_s),
            max_wait: Duration::from_secs(max_wait_s),
            path: Some(dir.join("limiter").join("t.window")),
        }
    }

    /// At most `rate` of `times` in any half-open window `(x - w, x]`.
    fn max_in_any_window(times: &[u64], w: u64) -> usize {
        let mut t = times.to_vec();
        t.sort_unstable();
        let mut best = 0;
        for (i, &end) in t.iter().enumerate() {
            let count = t[..=i].iter().filter(|&&s| s + w > end).count();
            best = best.max(count);
        }
        best
    }

    #[test]
    fn schedule_policy() {
        let mut s = vec![];
        assert_eq!(schedule(&mut s, 100, 60, 2).0, 100);
        let mut s = vec![100];
        assert_eq!(schedule(&mut s, 100, 60, 2).0, 100);
        let mut s = vec![100, 100];
        assert_eq!(schedule(&mut s, 100, 60, 2).0, 160);
        let mut s = vec![100, 100, 160];
        assert_eq!(schedule(&mut s, 110, 60, 2).0, 160);
        let mut s = vec![100, 100, 160, 160];
        assert_eq!(schedule(&mut s, 110, 60, 2).0, 220);
        // Old entries are pruned: a start exactly one window old no longer counts.
        let mut s = vec![40, 50];
        let (at, keep) = schedule(&mut s, 110, 60, 2);
        assert_eq!((at, keep.len()), (110, 0));
    }

    proptest::proptest! {
        /// For any arrival pattern, rate and window, the scheduled starts never exceed
        /// the rate in any window and never precede their arrival.
        #[test]
        fn schedule_never_exceeds_cap_for_any_arrivals(
            rate in 1usize..6,
            w in 10u64..100,
            gaps in proptest::collection::vec(0u64..30, 1..60),
        ) {
            let mut starts = Vec::new();
            let mut all = Vec::new();
            let mut now = 0;
            for gap in gaps {
                now += gap;
                let (at, keep) = schedule(&mut starts, now, w, rate);
                proptest::prop_assert!(at >= now);
                let mut next = keep.to_vec();
                next.push(at);
                starts = next;
                all.push(at);
            }
            proptest::prop_assert!(max_in_any_window(&all, w) <= rate, "{:?}", all);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn burst_goes_out_at_once_then_waits_for_the_window() {
        let dir = tempfile::tempdir().unwrap();
        let limiter = RateLimiter::with_tokio_clock(&config(dir.path(), 4, 60, 300), BASE);
        let t0 = tokio::time::Instant::now();
        for _ in 0..4 {
            let p = limiter.acquire().await.unwrap();
            assert_eq!(p.at_ms, BASE);
            assert_eq!(p.waited, Duration::ZERO);
        }
        assert_eq!(t0.elapsed(), Duration::ZERO);
        // The fifth start must wait until the first leaves the window.
        let p = limiter.acquire().await.unwrap();
        assert_eq!(p.at_ms, BASE + 60_000);
        assert_eq!(t0.elapsed(), Duration::from_secs(60));
        // A later burst after the window has rolled goes out at once again.
        tokio::time::advance(Duration::from_secs(60)).await;
        let before = tokio::time::Instant::now();
        for _ in 0..3 {
            limiter.acquire().await.unwrap();
        }
        assert_eq!(before.elapsed(), Duration::ZERO);
        let text = std::fs::read_to_string(limiter.path().unwrap()).unwrap();
        // The start at +60 s left the window at +120 s: only the new burst remains.
        assert_eq!(
            text.lines().count(),
            3,
            "pruned to the current window: {text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_waiters_are_spread_over_windows() {
        let dir = tempfile::tempdir().unwrap();
        let limiter = RateLimiter::with_tokio_clock(&config(dir.path(), 3, 60, 1000), BASE);
        let mut tasks = Vec::new();
        for _ in 0..9 {
            let l = limiter.clone();
            tasks.push(tokio::spawn(
                async move { l.acquire().await.unwrap().at_ms },
            ));
        }
        let mut at = Vec::new();
        for t in tasks {
            at.push(t.await.unwrap());
        }
        at.sort_unstable();
        assert_eq!(
            at,
            [0, 0, 0, 60, 60, 60, 120, 120, 120].map(|s| BASE + s * 1000)
        );
        assert!(max_in_any_window(&at, 60_000) <= 3);
    }

    #[tokio::test(start_paused = true)]
    async fn fails_fast_beyond_the_bound_and_reserves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let limiter = RateLimiter::with_tokio_clock(&config(dir.path(), 2, 60, 30), BASE);
        limiter.acquire().await.unwrap();
        limiter.acquire().await.unwrap();
        let t0 = tokio::time::Instant::now();
        let err = limiter.acquire().await.unwrap_err();
        assert_eq!(t0.elapsed(), Duration::ZERO, "failing fast must not wait");
        match &err {
            TunnelError::RateLimited { wait, bound } => {
                assert_eq!(*wait, Duration::from_secs(60));
                assert_eq!(*bound, Duration::from_secs(30));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(err.to_string().contains("rate limit"));
        let text = std::fs::read_to_string(limiter.path().unwrap()).unwrap();
        assert_eq!(text.lines().count(), 2);
        // Within the bound it waits instead.
        tokio::time::advance(Duration::from_secs(40)).await;
        let p = limiter.acquire().await.unwrap();
        assert_eq!(p.at_ms, BASE + 60_000);
        assert_eq!(p.waited, Duration::from_secs(20));
    }

    #[tokio::test(start_paused = true)]
    async fn off_never_waits_and_touches_no_file() {
        let limiter = RateLimiter::new(&RateLimit::off(), "x");
        assert!(!limiter.is_enabled());
        assert!(limiter.path().is_none());
        for _ in 0..1000 {
            assert_eq!(limiter.acquire().await.unwrap().waited, Duration::ZERO);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn corrupt_file_is_treated_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path(), 1, 60, 300);
        let path = cfg.path.clone().unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "garbage\n\u{0}\nnot a number").unwrap();
        let limiter = RateLimiter::with_tokio_clock(&cfg, BASE);
        assert_eq!(limiter.acquire().await.unwrap().at_ms, BASE);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{BASE}\n"));
    }

    #[tokio::test(start_paused = true)]
    async fn impossible_future_reservations_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path(), 1, 60, 300);
        let path = cfg.path.clone().unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // As if the clock had gone back a day after this reservation was made.
        std::fs::write(&path, format!("{}\n", BASE + 86_400_000)).unwrap();
        let limiter = RateLimiter::with_tokio_clock(&cfg, BASE);
        let p = limiter.acquire().await.unwrap();
        assert_eq!((p.at_ms, p.waited), (BASE, Duration::ZERO));
    }

    #[test]
    fn default_path_is_under_the_user_cache() {
        let limiter = RateLimiter::new(&RateLimit::default(), "prime-abc");
        let path = limiter.path().unwrap();
        assert!(path.starts_with(user_cache_dir()));
        assert!(path.ends_with("intercept/limiter/prime-abc.window"));
    }

    #[test]
    fn config_serde_in_seconds() {
        let cfg: RateLimit =
            serde_json::from_str(r#"{"rate": 100, "window": 1.5, "max_wait": 0}"#).unwrap();
        assert_eq!(cfg.rate, 100);
        assert!(cfg.enabled);
        assert_eq!(cfg.window, Duration::from_millis(1500));
        assert_eq!(cfg.max_wait, Duration::ZERO);
    }

    /// Several independent limiters (each opening its own file handle, as separate
    /// processes would) on several OS threads share one window file; with the real clock
    /// and a short window, the reserved starts never exceed the cap in any window and
    /// every caller returns no earlier than its reservation.
    #[test]
    fn separate_handles_on_threads_never_exceed_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = RateLimit {
            enabled: true,
            rate: 5,
            window: Duration::from_millis(400),
            max_wait: Duration::from_secs(30),
            path: Some(dir.path().join("shared.window")),
        };
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let cfg = cfg.clone();
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async move {
                        let limiter = RateLimiter::new(&cfg, "unused");
                        let mut out = Vec::new();
                        for _ in 0..5 {
                            let p = limiter.acquire().await.unwrap();
                            let returned = Clock::System.now_ms();
                            assert!(returned >= p.at_ms, "returned before its slot");
                            out.push(p.at_ms);
                        }
                        out
                    })
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in threads {
            all.extend(t.join().unwrap());
        }
        assert_eq!(all.len(), 20);
        assert!(max_in_any_window(&all, 400) <= 5, "{all:?}");
        // 20 starts at 5 per window need at least 3 full windows after the first burst.
        let (min, max) = (all.iter().min().unwrap(), all.iter().max().unwrap());
        assert!(max - min >= 3 * 400, "{min}..{max}");
    }
}
