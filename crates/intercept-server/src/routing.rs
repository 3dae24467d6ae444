//! Session-sticky engine choice by rendezvous (highest-random-weight) hashing.
//!
//! Each (session, engine) pair gets a pseudo-random score from a stable 64-bit hash; a
//! session goes to the engine with the highest score among those usable. So a session
//! always lands on the same engine (its prefix cache stays warm), sessions spread evenly,
//! and adding or removing one of N engines moves only the ~1/N sessions whose best engine
//! changed. When the best engine is down, the session fails over to its second best, and
//! so on: its *preference order* ([`preference`]).
//!
//! ```
//! use intercept_server::routing::{pick, preference};
//!
//! let engines = ["http://a:8000/v1", "http://b:8000/v1", "http://c:8000/v1"];
//! let order = preference("rollout-7", &engines);
//! assert_eq!(pick("rollout-7", &engines, |_| true), Some(order[0]));
//! // With its first engine down, the session goes to its second one.
//! assert_eq!(pick("rollout-7", &engines, |i| i != order[0]), Some(order[1]));
//! ```

/// A stable 64-bit hash of a string (FNV-1a, then the murmur3 finaliser). Stable across
/// builds and platforms, so assignments survive restarts.
pub fn stable_hash(text: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    fmix64(h)
}

fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// The score of one (session, engine) pair from their [`stable_hash`]es.
pub fn score(session_hash: u64, engine_hash: u64) -> u64 {
    fmix64(session_hash ^ fmix64(engine_hash ^ 0x9e37_79b9_7f4a_7c15))
}

/// The usable engine with the highest score for `session`, as an index into `engines`;
/// `None` when no engine is usable. No allocation: this runs on every call.
pub fn pick<S: AsRef<str>>(
    session: &str,
    engines: &[S],
    mut usable: impl FnMut(usize) -> bool,
) -> Option<usize> {
    let s = stable_hash(session);
    let mut best: Option<(u64, usize)> = None;
    for (i, engine) in engines.iter().enumerate() {
        if !usable(i) {
            continue;
        }
        let score = score(s, stable_hash(engine.as_ref()));
        if best.is_none_or(|(b, _)| score > b) {
            best = Some((score, i));
        }
    }
    best.map(|(_, i)| i)
}

/// Every engine index, best first: the order in which `session` fails over.
pub fn preference<S: AsRef<str>>(session: &str, engines: &[S]) -> Vec<usize> {
    let s = stable_hash(session);
    let mut scored: Vec<(u64, usize)> = engines
        .iter()
        .enumerate()
        .map(|(i, e)| (score(s, stable_hash(e.as_ref())), i))
        .collect();
    scored.sort_unstable_by(|a, b| b.cmp(a));
    scored.into_iter().map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_session_fails_over_to_its_second_engine() {
        let engines = ["http://a:8000/v1", "http://b:8000/v1", "http://c:8000/v1"];
        let order = preference("rollout-7", &engines);
        assert_eq!(pick("rollout-7", &engines, |_| true), Some(order[0]));
        assert_eq!(
            pick("rollout-7", &engines, |i| i != order[0]),
            Some(order[1])
        );
    }

    fn engines(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("http://10.0.0.{i}:8000/v1"))
            .collect()
    }

    fn sessions(seed: u64, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("rollout-{seed}-{i}")).collect()
    }

    #[test]
    fn hash_is_stable() {
        // Pinned values: a change here moves every session of a running deployment.
        assert_eq!(stable_hash(""), fmix64(0xcbf2_9ce4_8422_2325));
        assert_eq!(stable_hash("rollout-1"), stable_hash("rollout-1"));
        assert_ne!(stable_hash("rollout-1"), stable_hash("rollout-2"));
    }

    #[test]
    fn no_engine_no_pick() {
        assert_eq!(pick::<String>("s", &[], |_| true), None);
        assert_eq!(pick("s", &engines(3), |_| false), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Same inputs, same engine; the pick is the head of the preference order, and a
        /// down engine sends the session to the next one in that order.
        #[test]
        fn stable_and_fails_over_in_preference_order(id in "[a-z0-9-]{1,24}", n in 1usize..12, down in 0usize..12) {
            let e = engines(n);
            let order = preference(&id, &e);
            prop_assert_eq!(order.len(), n);
            prop_assert_eq!(pick(&id, &e, |_| true), Some(order[0]));
            prop_assert_eq!(pick(&id, &e, |_| true), pick(&id, &e.clone(), |_| true));
            let down = down % n;
            let expected = order.iter().copied().find(|i| *i != down);
            prop_assert_eq!(pick(&id, &e, |i| i != down), expected);
        }

        /// 10,000 sessions over N engines: every engine within 10% of the mean share.
        #[test]
        fn balanced(n in 2usize..9, seed in 0u64..1000) {
            let e = engines(n);
            let mut counts = vec![0usize; n];
            let total = 10_000;
            for s in sessions(seed, total) {
                counts[pick(&s, &e, |_| true).unwrap_or(0)] += 1;
            }
            let mean = total as f64 / n as f64;
            for c in &counts {
                prop_assert!((*c as f64 - mean).abs() < 0.10 * mean, "counts {:?}", counts);
            }
        }

        /// Adding an engine moves ~1/(N+1) of the sessions, all of them to the new engine;
        /// removing one moves exactly the sessions that were on it.
        #[test]
        fn membership_change_moves_about_one_in_n(n in 2usize..9, seed in 0u64..1000) {
            let before = engines(n);
            let after = engines(n + 1);
            let total = 10_000;
            let mut moved = 0usize;
            for s in sessions(seed, total) {
                let a = pick(&s, &before, |_| true).unwrap_or(0);
                let b = pick(&s, &after, |_| true).unwrap_or(0);
                if a != b {
                    prop_assert_eq!(b, n, "moved to an old engine");
                    moved += 1;
                }
                // Removing engine 0: only its sessions move.
                let without: Vec<&String> = before.iter().skip(1).collect();
                let c = pick(&s, &without, |_| true).map(|i| i + 1).unwrap_or(0);
                if a != 0 {
                    prop_assert_eq!(a, c);
                }
            }
            let expected = total as f64 / (n + 1) as f64;
            prop_assert!((moved as f64 - expected).abs() < 0.15 * expected, "moved {} of {}, expected ~{}", moved, total, expected);
        }
    }
}
