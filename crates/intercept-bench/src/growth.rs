//! The figures of the growth case: a sidecar that records every call, under steady load
//! for a minute. Does throughput hold as the records pile up (req/s of the last
//! seconds against the first), and how much memory does each recorded call keep
//! against the bytes the call itself carried (its request and response bodies)?

use std::collections::BTreeMap;

use serde::Serialize;

use crate::load::Intervals;
use crate::procfs::CLOCK_TICKS_PER_SECOND;

/// The growth case's goal for flatness: the last window's req/s at least this fraction
/// of the first's.
pub const FLATNESS_GOAL: f64 = 0.90;
/// The growth case's goal for memory: RSS growth per recorded call at most this many
/// times the call's request + response body bytes.
pub const MEMORY_GOAL: f64 = 1.3;

/// The window compared at each end of a run of `duration_s`: 10 s, or a third of a
/// shorter run, in whole intervals of `width_s` (at least one).
pub fn window_s(duration_s: f64, width_s: f64) -> f64 {
    let wanted = 10.0_f64.min(duration_s / 3.0);
    if width_s <= 0.0 {
        return wanted;
    }
    (wanted / width_s).floor().max(1.0) * width_s
}

/// What the growth case measured, and its ratios.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Growth {
    /// Seconds compared at each end.
    pub window_s: f64,
    /// req/s over the first window.
    pub first_rps: f64,
    /// req/s over the last window.
    pub last_rps: f64,
    /// `last_rps / first_rps`.
    pub last_over_first: f64,
    /// The sidecar's RSS before the load (sessions made), in KiB.
    pub rss_start_kib: u64,
    /// Its RSS after the load, in KiB.
    pub rss_end_kib: u64,
    /// Calls the sidecar recorded during the run.
    pub calls: u64,
    /// RSS growth divided by the calls recorded, in bytes.
    pub rss_bytes_per_call: f64,
    /// Request body + response body bytes of one call.
    pub raw_bytes_per_call: f64,
    /// `rss_bytes_per_call / raw_bytes_per_call`.
    pub memory_over_raw: f64,
    /// RSS (KiB) and calls recorded at the end of the first window, when read.
    pub first_window_end: Option<(u64, u64)>,
    /// RSS growth from the end of the first window to the end, divided by the calls
    /// recorded in between: what a further call keeps, without what the first calls set
    /// up once.
    pub after_first_window_bytes_per_call: Option<f64>,
}

impl Growth {
    /// The figures from the run's intervals, the sidecar's RSS before and after, the
    /// calls it recorded and the bytes of one call.
    pub fn new(
        intervals: &Intervals,
        window_s: f64,
        rss_kib: (u64, u64),
        calls: u64,
        raw_bytes_per_call: f64,
    ) -> Growth {
        let first_rps = intervals.window_rps(window_s, false).unwrap_or(f64::NAN);
        let last_rps = intervals.window_rps(window_s, true).unwrap_or(f64::NAN);
        let (rss_start_kib, rss_end_kib) = rss_kib;
        let rss_bytes_per_call =
            (rss_end_kib.saturating_sub(rss_start_kib) * 1024) as f64 / calls.max(1) as f64;
        Growth {
            window_s,
            first_rps,
            last_rps,
            // No requests in the first window: no ratio (and not flat).
            last_over_first: if first_rps > 0.0 {
                last_rps / first_rps
            } else {
                f64::NAN
            },
            rss_start_kib,
            rss_end_kib,
            calls,
            rss_bytes_per_call,
            raw_bytes_per_call,
            memory_over_raw: rss_bytes_per_call / raw_bytes_per_call,
            first_window_end: None,
            after_first_window_bytes_per_call: None,
        }
    }

    /// Adds the RSS (KiB) and calls read at the end of the first window.
    pub fn with_mid(self, mid: Option<(u64, u64)>) -> Growth {
        let after = mid.and_then(|(rss, calls)| {
            let further = self.calls.checked_sub(calls).filter(|&n| n > 0)?;
            Some((self.rss_end_kib.saturating_sub(rss) * 1024) as f64 / further as f64)
        });
        Growth {
            first_window_end: mid,
            after_first_window_bytes_per_call: after,
            ..self
        }
    }

    /// Whether the last window kept [`FLATNESS_GOAL`] of the first's throughput.
    pub fn flat(&self) -> bool {
        self.last_over_first >= FLATNESS_GOAL
    }

    /// Whether a recorded call kept at most [`MEMORY_GOAL`] × its bytes.
    pub fn lean(&self) -> bool {
        self.calls > 0 && self.memory_over_raw <= MEMORY_GOAL
    }
}

/// Bytes one call carries: the request body sent, and the response bodies read divided
/// by the successful calls (`None` when none succeeded).
pub fn raw_bytes_per_call(request_body_bytes: u64, response_bytes: u64, ok: u64) -> Option<f64> {
    (ok > 0).then(|| request_body_bytes as f64 + response_bytes as f64 / ok as f64)
}

/// The CPU one thread name of the sidecar spent per request over a window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ThreadCpu {
    /// The thread name (`tokio-rt-worker`, `trace-writer`, …).
    pub thread: String,
    /// User CPU µs per request.
    pub user_us: f64,
    /// System CPU µs per request.
    pub sys_us: f64,
}

/// CPU per request of each thread name between two samples of
/// [`crate::procfs::thread_times`] (`(utime, stime)` ticks by name), over the `requests`
/// completed in between; names that spent nothing are left out, and nothing is
/// reported for no requests.
pub fn thread_cpu_per_request(
    before: &BTreeMap<String, (u64, u64)>,
    after: &BTreeMap<String, (u64, u64)>,
    requests: u64,
) -> Vec<ThreadCpu> {
    if requests == 0 {
        return Vec::new();
    }
    let us = |ticks: u64| ticks as f64 * 1e6 / CLOCK_TICKS_PER_SECOND as f64 / requests as f64;
    after
        .iter()
        .filter_map(|(name, &(user, sys))| {
            let (user0, sys0) = before.get(name).copied().unwrap_or_default();
            let (user, sys) = (user.saturating_sub(user0), sys.saturating_sub(sys0));
            (user + sys > 0).then(|| ThreadCpu {
                thread: name.clone(),
                user_us: us(user),
                sys_us: us(sys),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_ten_seconds_or_a_third_of_a_short_run() {
        assert_eq!(window_s(60.0, 1.0), 10.0);
        assert_eq!(window_s(12.0, 1.0), 4.0);
        assert_eq!(window_s(10.0, 1.0), 3.0);
        assert_eq!(window_s(2.0, 1.0), 1.0);
        assert_eq!(window_s(12.0, 0.5), 4.0);
        assert_eq!(window_s(12.0, 0.0), 4.0);
    }

    #[test]
    fn growth_compares_the_ends_and_divides_memory_by_calls() {
        let intervals = Intervals {
            width_s: 1.0,
            window_s: 6.0,
            ok: vec![1000, 1000, 950, 900, 900, 880],
        };
        // 10 MiB more RSS over 4096 calls of 2048 + 512 bytes each.
        let g = Growth::new(&intervals, 2.0, (20 * 1024, 30 * 1024), 4096, 2560.0);
        assert_eq!(g.first_rps, 1000.0);
        assert_eq!(g.last_rps, 890.0);
        assert!((g.last_over_first - 0.89).abs() < 1e-9);
        assert!(!g.flat());
        assert_eq!(g.rss_bytes_per_call, 2560.0);
        assert_eq!(g.memory_over_raw, 1.0);
        assert!(g.lean());

        let g = Growth::new(&intervals, 1.0, (30 * 1024, 20 * 1024), 0, 2560.0);
        assert!((g.last_over_first - 0.88).abs() < 1e-9);
        // RSS that shrank counts as no growth; no calls is never lean.
        assert_eq!(g.rss_bytes_per_call, 0.0);
        assert!(!g.lean());

        let g = Growth::new(&intervals, 4.0, (0, 1), 1, 1.0);
        assert!((g.last_over_first - 3630.0 / 3850.0).abs() < 1e-9);
        assert!(g.flat());
        let short = Growth::new(&intervals, 7.0, (0, 0), 1, 1.0);
        assert!(short.first_rps.is_nan() && !short.flat());
        let idle_start = Intervals {
            width_s: 1.0,
            window_s: 2.0,
            ok: vec![0, 10],
        };
        let g = Growth::new(&idle_start, 1.0, (0, 0), 10, 1.0);
        assert!(g.last_over_first.is_nan() && !g.flat(), "{g:?}");
    }

    #[test]
    fn growth_after_the_first_window_leaves_the_setup_out() {
        let intervals = Intervals {
            width_s: 1.0,
            window_s: 2.0,
            ok: vec![10, 10],
        };
        // 8 MiB at start, 12 MiB after 1024 calls, 16 MiB after 3072.
        let g = Growth::new(&intervals, 1.0, (8 * 1024, 16 * 1024), 3072, 1024.0)
            .with_mid(Some((12 * 1024, 1024)));
        assert_eq!(g.first_window_end, Some((12 * 1024, 1024)));
        assert_eq!(g.after_first_window_bytes_per_call, Some(2048.0));
        assert!((g.rss_bytes_per_call - 8.0 * 1024.0 * 1024.0 / 3072.0).abs() < 1e-9);
        let none = Growth::new(&intervals, 1.0, (0, 1), 5, 1.0).with_mid(Some((1, 5)));
        assert_eq!(none.after_first_window_bytes_per_call, None);
        let unread = Growth::new(&intervals, 1.0, (0, 1), 5, 1.0).with_mid(None);
        assert_eq!(unread.after_first_window_bytes_per_call, None);
    }

    #[test]
    fn thread_cpu_is_the_difference_per_request_by_name() {
        let before = BTreeMap::from([
            ("tokio-rt-worker".to_owned(), (100, 50)),
            ("trace-writer".to_owned(), (1, 2)),
            ("idle".to_owned(), (7, 7)),
        ]);
        let after = BTreeMap::from([
            ("tokio-rt-worker".to_owned(), (200, 150)),
            ("trace-writer".to_owned(), (1, 12)),
            ("idle".to_owned(), (7, 7)),
            ("new".to_owned(), (0, 1)),
        ]);
        // 100 ticks = 1 s over 10,000 requests = 100 µs each.
        let cpu = thread_cpu_per_request(&before, &after, 10_000);
        let by = |n: &str| cpu.iter().find(|c| c.thread == n).cloned();
        assert_eq!(cpu.len(), 3, "{cpu:?}");
        assert_eq!(
            by("tokio-rt-worker").map(|c| (c.user_us, c.sys_us)),
            Some((100.0, 100.0))
        );
        assert_eq!(
            by("trace-writer").map(|c| (c.user_us, c.sys_us)),
            Some((0.0, 10.0))
        );
        assert_eq!(by("new").map(|c| (c.user_us, c.sys_us)), Some((0.0, 1.0)));
        assert!(by("idle").is_none());
        assert!(thread_cpu_per_request(&before, &after, 0).is_empty());
    }

    #[test]
    fn raw_bytes_are_the_request_plus_the_mean_response() {
        assert_eq!(raw_bytes_per_call(2048, 7000, 10), Some(2748.0));
        assert_eq!(raw_bytes_per_call(2048, 0, 0), None);
    }
}
