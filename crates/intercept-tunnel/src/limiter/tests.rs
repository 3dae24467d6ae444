//! The limiter's tests: the rolling window, the file and fleet backends, failing closed.

use super::*;

const BASE: u64 = 1_700_000_000_000;

fn config(dir: &Path, rate: u32, window_s: u64, max_wait_s: u64) -> RateLimit {
    RateLimit {
        enabled: true,
        rate,
        window: Duration::from_secs(window_s),
        max_wait: Duration::from_secs(max_wait_s),
        margin: Duration::ZERO,
        path: Some(dir.join("limiter").join("t.window")),
        ..RateLimit::default()
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

fn done(start: u64, end: u64) -> Entry {
    Entry {
        id: start,
        start,
        end: Some(end),
    }
}

fn open(start: u64) -> Entry {
    Entry {
        id: start + 1_000_000,
        start,
        end: None,
    }
}

#[test]
fn schedule_policy() {
    let at = |mut e: Vec<Entry>, now| schedule(&mut e, now, 60, 2, 1000);
    assert_eq!(at(vec![], 100), Decision::At(100));
    assert_eq!(at(vec![done(100, 100)], 100), Decision::At(100));
    assert_eq!(
        at(vec![done(100, 100), done(100, 100)], 100),
        Decision::At(160)
    );
    // The slot frees one window after the start *ended*, not after it began.
    assert_eq!(
        at(vec![done(100, 130), done(100, 130)], 110),
        Decision::At(190)
    );
    // In flight: counted, and with the whole budget in flight nothing is scheduled.
    assert_eq!(at(vec![open(100), done(100, 100)], 110), Decision::At(160));
    assert_eq!(at(vec![open(100), open(100)], 110), Decision::Blocked);
    // Old entries are pruned: an end exactly one window old no longer counts.
    let mut e = vec![done(40, 40), done(50, 50)];
    assert_eq!(schedule(&mut e, 110, 60, 2, 1000), Decision::At(110));
    assert!(e.is_empty());
    // An entry in flight past its lease counts as ended at the lease.
    let mut e = vec![open(0), open(0)];
    assert_eq!(schedule(&mut e, 1001, 60, 2, 1000), Decision::At(1060));
    assert_eq!(
        e,
        vec![done(0, 1000), done(0, 1000)]
            .into_iter()
            .map(|mut d| {
                d.id = 1_000_000;
                d
            })
            .collect::<Vec<_>>()
    );
}

#[test]
fn window_file_lines_round_trip() {
    let entries = vec![done(5, 9), open(7)];
    let text: String = entries.iter().map(|e| e.to_line() + "\n").collect();
    assert_eq!(parse_entries(&text), entries);
    // An older file holds bare start times: starts that ended then.
    assert_eq!(
        parse_entries("42\njunk\n1 2\n"),
        vec![Entry {
            id: 0,
            start: 42,
            end: Some(42)
        }]
    );
}

proptest::proptest! {
    /// The provider's view. Requests arrive to be reserved at random times; each one
    /// reaches the provider a random latency after its reserved start and completes
    /// a random time after that; the provider counts it on arrival. With any
    /// latencies, jitter and rate, no sliding window at the receiving end holds more
    /// than `rate` arrivals, and no start precedes its reservation request.
    #[test]
    fn receiving_end_never_sees_more_than_the_cap(
        rate in 1usize..6,
        w in 10u64..100,
        margin in 0u64..3,
        reqs in proptest::collection::vec((0u64..30, 0u64..40, 0u64..40), 1..60),
    ) {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        // Events: (time, order, kind, request); completions sort before reservations.
        let mut events = BinaryHeap::new();
        let mut t = 0;
        for (i, (gap, _, _)) in reqs.iter().enumerate() {
            t += gap;
            events.push(Reverse((t, 1u8, i)));
        }
        let mut entries = Vec::new();
        let mut arrivals = Vec::new();
        // Callers blocked by starts in flight look again when one completes.
        let mut blocked = Vec::new();
        while let Some(Reverse((now, kind, i))) = events.pop() {
            if kind == 0 {
                if let Some(e) = entries.iter_mut().find(|e: &&mut Entry| e.id == i as u64) {
                    e.end = Some(now + margin);
                }
                for b in blocked.drain(..) {
                    events.push(Reverse((now, 1, b)));
                }
                continue;
            }
            match schedule(&mut entries, now, w, rate, 1_000_000) {
                Decision::Blocked => blocked.push(i),
                Decision::At(at) => {
                    proptest::prop_assert!(at >= now);
                    entries.push(Entry { id: i as u64, start: at, end: None });
                    let (_, to_provider, to_answer) = reqs[i];
                    arrivals.push(at + to_provider);
                    events.push(Reverse((at + to_provider + to_answer, 0, i)));
                }
            }
        }
        proptest::prop_assert_eq!(arrivals.len(), reqs.len());
        proptest::prop_assert!(max_in_any_window(&arrivals, w) <= rate, "{:?}", arrivals);
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
    drop(p);
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
async fn a_slot_is_held_until_the_start_completed_plus_the_margin() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = RateLimit {
        margin: Duration::from_secs(2),
        ..config(dir.path(), 1, 60, 300)
    };
    let limiter = RateLimiter::with_tokio_clock(&cfg, BASE);
    let first = limiter.acquire().await.unwrap();
    assert_eq!(first.at_ms, BASE);
    // While it is in flight the next start cannot even be given a time: it waits.
    let next = tokio::spawn({
        let l = limiter.clone();
        async move { l.acquire().await.unwrap().at_ms }
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!next.is_finished(), "the only slot is in flight");
    // The request took 5 s: the slot frees a window after its end plus the margin.
    first.complete().await;
    assert_eq!(next.await.unwrap(), BASE + 5_000 + 2_000 + 60_000);
}

#[tokio::test(start_paused = true)]
async fn a_budget_stuck_in_flight_fails_after_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let limiter = RateLimiter::with_tokio_clock(&config(dir.path(), 1, 60, 10), BASE);
    let _held = limiter.acquire().await.unwrap();
    let t0 = tokio::time::Instant::now();
    let err = limiter.acquire().await.unwrap_err();
    assert_eq!(err.kind(), crate::TunnelErrorKind::RateLimited, "{err}");
    assert!(t0.elapsed() >= Duration::from_secs(10));
    assert!(t0.elapsed() < Duration::from_secs(11));
}

#[tokio::test(start_paused = true)]
async fn off_never_waits_and_touches_no_file() {
    let limiter = RateLimiter::new(&RateLimit::off(), "x").unwrap();
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
    let entries = parse_entries(&std::fs::read_to_string(&path).unwrap());
    assert_eq!(entries.len(), 1);
    assert_eq!((entries[0].start, entries[0].end), (BASE, Some(BASE)));
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
    let limiter = RateLimiter::new(&RateLimit::default(), "prime-abc").unwrap();
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
    assert_eq!(cfg.backend, Backend::File);
    let cfg: RateLimit = serde_json::from_str(
        r#"{"backend": "redis", "url": "redis://u:pw@10.0.0.1:6379/", "timeout": 0.5}"#,
    )
    .unwrap();
    assert_eq!(cfg.backend, Backend::Redis);
    assert_eq!(cfg.timeout, Duration::from_millis(500));
    let shown = format!("{cfg:?}");
    assert!(!shown.contains("pw"), "the password is hidden: {shown}");
    assert!(shown.contains("redis://***@10.0.0.1:6379/"), "{shown}");
}

#[test]
fn a_redis_backend_needs_a_usable_url() {
    let redis = |url: Option<&str>| RateLimit {
        backend: Backend::Redis,
        url: url.map(str::to_owned),
        ..RateLimit::default()
    };
    let err = RateLimiter::new(&redis(None), "x").unwrap_err();
    assert_eq!(err.kind(), crate::TunnelErrorKind::Config);
    assert!(err.to_string().contains("needs `url`"), "{err}");
    let err = RateLimiter::new(&redis(Some("http://:pw@h/")), "x").unwrap_err();
    assert!(err.to_string().contains("cannot use Redis URL"), "{err}");
    assert!(!err.to_string().contains("pw"), "{err}");
    let ok = RateLimiter::new(&redis(Some("redis://127.0.0.1:1/")), "x").unwrap();
    assert_eq!(ok.backend(), Some(Backend::Redis));
    assert!(ok.path().is_none());
    assert_eq!(redact_url("redis://h:1/"), "redis://h:1/");
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
        margin: Duration::ZERO,
        path: Some(dir.path().join("shared.window")),
        ..RateLimit::default()
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
                    let limiter = RateLimiter::new(&cfg, "unused").unwrap();
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
