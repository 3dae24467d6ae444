//! Pool policy as plain functions: which server takes a session, how many servers to
//! start, which idle servers to shrink, how long to back off. No I/O, no clocks: the pools
//! feed these the numbers they see under their lock, and the property tests feed them
//! everything else.

use std::time::Duration;

/// Index of the least-loaded server among those that accept sessions, ties broken
/// round-robin: the first tied server at or after `cursor` (wrapping) wins, so equal
/// servers take turns. `None` when no server is eligible.
///
/// `loads[i]` is `None` for a server that takes no sessions (starting, draining).
pub fn least_loaded(loads: &[Option<usize>], cursor: usize) -> Option<usize> {
    let n = loads.len();
    if n == 0 {
        return None;
    }
    let start = cursor % n;
    let mut best: Option<(usize, usize)> = None;
    for k in 0..n {
        let i = (start + k) % n;
        if let Some(load) = loads[i] {
            if best.is_none_or(|(_, b)| load < b) {
                best = Some((i, load));
            }
        }
    }
    best.map(|(i, _)| i)
}

/// Index of the first (oldest) server with a free seat, given each server's load (`None`
/// for a server that takes no sessions) and the seats per server. Filling the oldest
/// servers first keeps the newest ones empty, so they are the ones idle shrink removes.
pub fn first_fit(loads: &[Option<usize>], multiplex: usize) -> Option<usize> {
    loads
        .iter()
        .position(|l| matches!(l, Some(load) if *load < multiplex))
}

/// What the elastic pool sees when it decides whether to start servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    /// Acquires waiting for a seat.
    pub waiting: usize,
    /// Free seats on servers that take sessions now.
    pub free_seats: usize,
    /// Servers starting (or backing off between start attempts).
    pub starting: usize,
    /// Servers that take sessions now.
    pub ready: usize,
    /// Every server that exists: starting, ready, draining, being torn down.
    pub total: usize,
    /// Seats per server.
    pub multiplex: usize,
    /// Floor of ready-or-starting servers.
    pub min_servers: usize,
    /// Cap on `total`.
    pub max_servers: usize,
    /// Cap on `starting`.
    pub max_concurrent_starts: usize,
}

/// How many servers to start now.
///
/// Capacity is reserved: waiting acquires are first covered by free seats, then by the
/// full capacity of servers already starting, and only the rest asks for new servers,
/// `ceil(rest / multiplex)` of them. A burst of N acquires therefore starts
/// `ceil(N / multiplex)` servers, never more. The floor (`min_servers`) tops up ready plus
/// starting servers. The result never makes `total` exceed `max_servers` nor `starting`
/// exceed `max_concurrent_starts`.
pub fn servers_to_start(d: Demand) -> usize {
    let multiplex = d.multiplex.max(1);
    let covered = d
        .free_seats
        .saturating_add(d.starting.saturating_mul(multiplex));
    let uncovered = d.waiting.saturating_sub(covered);
    let for_demand = uncovered.div_ceil(multiplex);
    let for_floor = d.min_servers.saturating_sub(d.ready + d.starting);
    let wanted = for_demand.max(for_floor);
    let room_cap = d.max_servers.saturating_sub(d.total);
    let room_starts = d.max_concurrent_starts.saturating_sub(d.starting);
    wanted.min(room_cap).min(room_starts)
}

/// How many waiting acquires can no longer be served by capacity that is ready or
/// coming: after a start gives up, this many of the longest-waiting acquires are failed
/// with its error (the rest keep waiting for the servers still starting).
pub fn uncovered_waiters(
    waiting: usize,
    free_seats: usize,
    starting: usize,
    multiplex: usize,
) -> usize {
    let covered = free_seats.saturating_add(starting.saturating_mul(multiplex.max(1)));
    waiting.saturating_sub(covered)
}

/// One server as idle shrink sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleServer {
    /// Sessions on it (reserved seats included).
    pub load: usize,
    /// How long it has been empty, if it is.
    pub idle_for: Option<Duration>,
}

/// Which servers to tear down for idleness: empty for at least `idle_timeout`, newest
/// first (highest index: `servers` is in creation order), keeping at least `min_servers`
/// of them. Nothing shrinks while acquires wait (`waiting > 0`). Returns indices into
/// `servers`, newest first.
pub fn idle_to_shrink(
    servers: &[IdleServer],
    idle_timeout: Duration,
    min_servers: usize,
    waiting: usize,
) -> Vec<usize> {
    if waiting > 0 {
        return Vec::new();
    }
    let removable = servers.len().saturating_sub(min_servers);
    servers
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, s)| s.load == 0 && s.idle_for.is_some_and(|d| d >= idle_timeout))
        .map(|(i, _)| i)
        .take(removable)
        .collect()
}

/// Delay before start attempt `attempt + 1` after `attempt` failures (1-based):
/// `base * 2^(attempt - 1)`, capped at `max`.
pub fn backoff(attempt: u32, base: Duration, max: Duration) -> Duration {
    let exp = attempt.saturating_sub(1).min(20);
    base.saturating_mul(1u32 << exp).min(max)
}

/// The pause between failed rounds of server starts (every attempt of a start failed)
/// while a tunnel service is down: [`backoff`] of the round, scaled by `jitter` in
/// `[0, 1]` to between half and all of it, so that many pools do not retry in step.
pub fn round_backoff(round: u32, base: Duration, max: Duration, jitter: f64) -> Duration {
    backoff(round, base, max).mul_f64(0.5 + jitter.clamp(0.0, 1.0) / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_backoff_grows_is_capped_and_jittered(round in 1u32..40, jitter in 0.0f64..=1.0) {
            let (base, max) = (Duration::from_millis(500), Duration::from_secs(30));
            let d = round_backoff(round, base, max, jitter);
            prop_assert!(d <= max);
            prop_assert!(d >= backoff(round, base, max) / 2);
            prop_assert!(round_backoff(round + 1, base, max, 0.0) >= round_backoff(round, base, max, 0.0));
        }
    }

    fn demand(waiting: usize) -> Demand {
        Demand {
            waiting,
            free_seats: 0,
            starting: 0,
            ready: 0,
            total: 0,
            multiplex: 32,
            min_servers: 0,
            max_servers: 1_000,
            max_concurrent_starts: 1_000,
        }
    }

    #[test]
    fn least_loaded_picks_minimum_and_rotates_ties() {
        let loads = [Some(3), Some(1), None, Some(1)];
        assert_eq!(least_loaded(&loads, 0), Some(1));
        assert_eq!(least_loaded(&loads, 2), Some(3));
        assert_eq!(least_loaded(&loads, 4), Some(1));
        assert_eq!(least_loaded(&[None, None], 0), None);
        assert_eq!(least_loaded(&[], 3), None);
    }

    #[test]
    fn first_fit_skips_full_and_closed() {
        assert_eq!(first_fit(&[Some(2), None, Some(1)], 2), Some(2));
        assert_eq!(first_fit(&[Some(2), Some(2)], 2), None);
    }

    #[test]
    fn burst_reserves_exactly_ceil() {
        assert_eq!(servers_to_start(demand(1_000)), 32);
        assert_eq!(servers_to_start(demand(1)), 1);
        assert_eq!(servers_to_start(demand(0)), 0);
        let covered = Demand {
            starting: 2,
            ..demand(64)
        };
        assert_eq!(servers_to_start(covered), 0);
        let capped = Demand {
            max_concurrent_starts: 8,
            ..demand(1_000)
        };
        assert_eq!(servers_to_start(capped), 8);
        let at_cap = Demand {
            total: 4,
            max_servers: 4,
            ..demand(1_000)
        };
        assert_eq!(servers_to_start(at_cap), 0);
    }

    #[test]
    fn floor_is_topped_up() {
        let d = Demand {
            min_servers: 2,
            ..demand(0)
        };
        assert_eq!(servers_to_start(d), 2);
        let d = Demand {
            min_servers: 2,
            ready: 1,
            total: 2,
            ..demand(0)
        };
        assert_eq!(servers_to_start(d), 1);
    }

    #[test]
    fn shrink_newest_first_keeping_floor() {
        let idle = |s| IdleServer {
            load: 0,
            idle_for: Some(Duration::from_secs(s)),
        };
        let busy = IdleServer {
            load: 1,
            idle_for: None,
        };
        let servers = [idle(600), busy, idle(600), idle(10), idle(400)];
        let t = Duration::from_secs(300);
        assert_eq!(idle_to_shrink(&servers, t, 0, 0), vec![4, 2, 0]);
        assert_eq!(idle_to_shrink(&servers, t, 3, 0), vec![4, 2]);
        assert_eq!(idle_to_shrink(&servers, t, 5, 0), Vec::<usize>::new());
        assert_eq!(idle_to_shrink(&servers, t, 0, 1), Vec::<usize>::new());
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Duration::from_millis(500);
        let m = Duration::from_secs(30);
        assert_eq!(backoff(1, b, m), Duration::from_millis(500));
        assert_eq!(backoff(2, b, m), Duration::from_secs(1));
        assert_eq!(backoff(4, b, m), Duration::from_secs(4));
        assert_eq!(backoff(40, b, m), m);
    }

    /// A pure model of the elastic pool built from these functions, driven by arbitrary
    /// events: the invariants the real pool relies on.
    #[derive(Debug, Clone)]
    enum Event {
        Acquire,
        Release(usize),
        StartDone(bool),
        Unhealthy(usize),
        TeardownDone,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            4 => Just(Event::Acquire),
            2 => any::<usize>().prop_map(Event::Release),
            3 => any::<bool>().prop_map(Event::StartDone),
            1 => any::<usize>().prop_map(Event::Unhealthy),
            1 => Just(Event::TeardownDone),
        ]
    }

    #[derive(Debug, PartialEq)]
    enum St {
        Starting,
        Ready,
        Draining,
    }

    #[derive(Debug)]
    struct Model {
        servers: Vec<(St, Vec<u64>)>,
        waiting: Vec<u64>,
        next: u64,
        multiplex: usize,
        min_servers: usize,
        max_servers: usize,
        max_starts: usize,
    }

    impl Model {
        fn loads(&self) -> Vec<Option<usize>> {
            self.servers
                .iter()
                .map(|(s, l)| (*s == St::Ready).then_some(l.len()))
                .collect()
        }

        fn settle(&mut self) {
            while !self.waiting.is_empty() {
                let Some(i) = first_fit(&self.loads(), self.multiplex) else {
                    break;
                };
                let id = self.waiting.remove(0);
                self.servers[i].1.push(id);
            }
            let ready: Vec<_> = self
                .servers
                .iter()
                .filter(|(s, _)| *s == St::Ready)
                .collect();
            let d = Demand {
                waiting: self.waiting.len(),
                free_seats: ready.iter().map(|(_, l)| self.multiplex - l.len()).sum(),
                starting: self
                    .servers
                    .iter()
                    .filter(|(s, _)| *s == St::Starting)
                    .count(),
                ready: ready.len(),
                total: self.servers.len(),
                multiplex: self.multiplex,
                min_servers: self.min_servers,
                max_servers: self.max_servers,
                max_concurrent_starts: self.max_starts,
            };
            for _ in 0..servers_to_start(d) {
                self.servers.push((St::Starting, Vec::new()));
            }
        }

        fn apply(&mut self, e: Event) {
            match e {
                Event::Acquire => {
                    self.waiting.push(self.next);
                    self.next += 1;
                }
                Event::Release(k) => {
                    let seated: Vec<(usize, usize)> = self
                        .servers
                        .iter()
                        .enumerate()
                        .flat_map(|(i, (_, l))| (0..l.len()).map(move |j| (i, j)))
                        .collect();
                    if !seated.is_empty() {
                        let (i, j) = seated[k % seated.len()];
                        self.servers[i].1.remove(j);
                    }
                }
                Event::StartDone(ok) => {
                    if let Some(i) = self.servers.iter().position(|(s, _)| *s == St::Starting) {
                        if ok {
                            self.servers[i].0 = St::Ready;
                        } else {
                            self.servers.remove(i);
                            let starting = self
                                .servers
                                .iter()
                                .filter(|(s, _)| *s == St::Starting)
                                .count();
                            let n =
                                uncovered_waiters(self.waiting.len(), 0, starting, self.multiplex);
                            self.waiting.drain(..n);
                        }
                    }
                }
                Event::Unhealthy(k) => {
                    let ready: Vec<usize> = (0..self.servers.len())
                        .filter(|i| self.servers[*i].0 == St::Ready)
                        .collect();
                    if !ready.is_empty() {
                        self.servers[ready[k % ready.len()]].0 = St::Draining;
                    }
                }
                Event::TeardownDone => {
                    // A drained server goes away; its sessions ended with it.
                    if let Some(i) = self.servers.iter().position(|(s, _)| *s == St::Draining) {
                        self.servers.remove(i);
                    }
                }
            }
            self.settle();
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

        #[test]
        fn pool_model_invariants(
            events in proptest::collection::vec(event(), 0..200),
            multiplex in 1usize..6,
            min_servers in 0usize..3,
            max_servers in 1usize..6,
            max_starts in 1usize..4,
        ) {
            let mut m = Model {
                servers: Vec::new(),
                waiting: Vec::new(),
                next: 0,
                multiplex,
                min_servers,
                max_servers,
                max_starts,
            };
            m.settle();
            for e in events {
                m.apply(e);
                prop_assert!(m.servers.len() <= max_servers);
                let starting = m.servers.iter().filter(|(s, _)| *s == St::Starting).count();
                prop_assert!(starting <= max_starts);
                let mut seen = std::collections::HashSet::new();
                for (st, sessions) in &m.servers {
                    prop_assert!(sessions.len() <= multiplex);
                    if *st == St::Starting {
                        prop_assert!(sessions.is_empty());
                    }
                    for s in sessions {
                        prop_assert!(seen.insert(*s), "session {} on two servers", s);
                    }
                }
                for w in &m.waiting {
                    prop_assert!(!seen.contains(w));
                }
                // Waiters exist only when no ready server has a free seat.
                if !m.waiting.is_empty() {
                    prop_assert_eq!(first_fit(&m.loads(), multiplex), None);
                }
            }
        }

        #[test]
        fn burst_starts_ceil_servers(n in 1usize..1_500, multiplex in 1usize..64, starts in 1usize..40) {
            // Acquires arrive one by one; servers come up in start-order batches.
            let mut m = Model {
                servers: Vec::new(),
                waiting: Vec::new(),
                next: 0,
                multiplex,
                min_servers: 0,
                max_servers: usize::MAX,
                max_starts: starts,
            };
            for _ in 0..n {
                m.apply(Event::Acquire);
            }
            let mut guard = 0;
            while m.servers.iter().any(|(s, _)| *s == St::Starting) && guard < 10_000 {
                m.apply(Event::StartDone(true));
                guard += 1;
            }
            prop_assert_eq!(m.servers.len(), n.div_ceil(multiplex));
            prop_assert!(m.waiting.is_empty());
        }

        #[test]
        fn least_loaded_is_minimal(loads in proptest::collection::vec(proptest::option::of(0usize..50), 0..20), cursor in 0usize..40) {
            match least_loaded(&loads, cursor) {
                Some(i) => {
                    let min = loads.iter().flatten().min().copied();
                    prop_assert_eq!(loads[i], min);
                }
                None => prop_assert!(loads.iter().all(Option::is_none)),
            }
        }
    }
}
