//! [`ElasticPool`]: servers of `multiplex` sessions each that warm up, grow with the load
//! without head-of-line blocking, heal when an endpoint dies and shrink when idle.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use intercept_core::{Error, Health};
use parking_lot::{Mutex, MutexGuard};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::member::{PoolMember, ServerFactory};
use crate::policy::{self, Demand, IdleServer};

mod config;
mod interception;

pub use config::{ElasticConfig, ServerInfo, ServerPhase, SettingNames};

/// The least time a repair of an unhealthy endpoint may take before the server drains.
const REPAIR_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one server's teardown may take at `Interception::stop`; a longer one is
/// abandoned (its tunnel's helper processes are killed when it drops) and reported.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// An elastic pool of interception servers: `multiplex` sessions per server, servers
/// started concurrently as acquires need them, retired when their endpoint dies, shrunk
/// when idle. See `docs/pools.md` for the behaviour in full.
///
/// - An acquire that fits on a ready server takes its seat at once, whatever is starting.
/// - An acquire that does not fit waits in FIFO order for a seat; the pool starts
///   `ceil(uncovered waiters / multiplex)` servers (bounded by `max_concurrent_starts`
///   and `max_servers`), counting the full capacity of servers already starting.
/// - A start that fails is retried with exponential backoff; after `start_attempts` (or
///   at once for a non-retryable error) the waiters its server was to seat get its error.
/// - At `max_servers` an acquire waits up to `wait_timeout`, then fails with an error
///   naming the cap.
/// - Every background task is owned by the pool and ends at `Interception::stop` (or
///   when the pool is dropped).
pub struct ElasticPool {
    inner: Arc<Inner>,
}

struct Inner {
    config: ElasticConfig,
    min_servers: usize,
    factory: Arc<dyn ServerFactory>,
    state: Mutex<State>,
    tasks: TaskTracker,
    cancel: CancellationToken,
    /// Signalled when a draining server may have become empty.
    drained: Notify,
    /// Signalled when a ready server's endpoint reports itself dead: the maintenance loop
    /// runs a round at once.
    wake: Notify,
    /// Maintenance rounds finished so far.
    rounds: tokio::sync::watch::Sender<u64>,
    pause: crate::pause::PoolPause,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lifecycle {
    New,
    Running,
    Stopped,
}

struct State {
    lifecycle: Lifecycle,
    next_index: u64,
    servers: Vec<Server>,
    waiters: VecDeque<Waiter>,
    next_waiter: u64,
    /// Set while server starts keep failing (the tunnel service is down): no new start
    /// before `until`.
    outage: Option<Outage>,
    /// Rounds of server starts that failed for good, since the pool was made.
    failed_rounds: u64,
}

/// Consecutive failed rounds and when the next may begin.
struct Outage {
    rounds: u32,
    until: Instant,
    wakeup_armed: bool,
}

struct Server {
    index: u64,
    phase: ServerPhase,
    member: Option<Arc<dyn PoolMember>>,
    load: usize,
    empty_since: Option<Instant>,
    /// Cancelled when the server stops being ready (draining, shrinking, torn down): ends
    /// the task that watches its endpoint.
    retired: CancellationToken,
}

struct Waiter {
    id: u64,
    tx: oneshot::Sender<Result<Seat, Error>>,
}

/// A session's seat on one server; dropping it frees the seat.
struct Seat {
    inner: Arc<Inner>,
    index: u64,
    member: Arc<dyn PoolMember>,
}

impl fmt::Debug for Seat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Seat").field("server", &self.index).finish()
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut state = self.inner.state.lock();
        if let Some(server) = state.servers.iter_mut().find(|s| s.index == self.index) {
            server.load = server.load.saturating_sub(1);
            if server.load == 0 {
                server.empty_since = Some(Instant::now());
                if server.phase == ServerPhase::Draining {
                    self.inner.drained.notify_waiters();
                }
            }
        }
        self.inner.clone().settle(state);
    }
}

/// Deliveries decided under the lock, made after it is released (a refused delivery
/// drops its seat, and dropping a seat takes the lock).
type Deliveries = Vec<(oneshot::Sender<Result<Seat, Error>>, Result<Seat, Error>)>;

fn state_starting(servers: &[Server]) -> usize {
    servers
        .iter()
        .filter(|s| s.phase == ServerPhase::Starting)
        .count()
}

fn fastrand_f64() -> f64 {
    fastrand::f64()
}

fn deliver(deliveries: Deliveries) {
    for (tx, value) in deliveries {
        // A waiter that gave up drops its receiver; the seat then frees itself.
        let _ = tx.send(value);
    }
}

impl fmt::Debug for ElasticPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ElasticPool")
            .field("config", &self.inner.config)
            .field("servers", &self.servers())
            .finish()
    }
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inner")
            .field("config", &self.config)
            .finish()
    }
}

impl ElasticPool {
    /// A pool (not started) whose servers come from `factory`. `min_servers: None` is
    /// read as 0. Fails on inconsistent knobs (`multiplex`, `max_servers` or
    /// `max_concurrent_starts` of 0, `min_servers` above `max_servers`).
    pub fn new(config: ElasticConfig, factory: Arc<dyn ServerFactory>) -> Result<Self, Error> {
        let min_servers = config.min_servers.unwrap_or(0);
        if config.multiplex == 0 {
            return Err(Error::invalid("elastic pool: multiplex must be at least 1"));
        }
        if config.max_servers == 0 || config.max_concurrent_starts == 0 {
            return Err(Error::invalid(
                "elastic pool: max_servers and max_concurrent_starts must be at least 1",
            ));
        }
        if min_servers > config.max_servers {
            return Err(Error::invalid(format!(
                "elastic pool: min_servers ({min_servers}) exceeds max_servers ({})",
                config.max_servers
            )));
        }
        Ok(ElasticPool {
            inner: Arc::new(Inner {
                config,
                min_servers,
                factory,
                state: Mutex::new(State {
                    lifecycle: Lifecycle::New,
                    next_index: 0,
                    servers: Vec::new(),
                    waiters: VecDeque::new(),
                    next_waiter: 0,
                    outage: None,
                    failed_rounds: 0,
                }),
                pause: crate::pause::PoolPause::default(),
                tasks: TaskTracker::new(),
                cancel: CancellationToken::new(),
                drained: Notify::new(),
                wake: Notify::new(),
                rounds: tokio::sync::watch::channel(0).0,
            }),
        })
    }

    /// The pool's knobs.
    pub fn config(&self) -> &ElasticConfig {
        &self.inner.config
    }

    /// Every server the pool holds, in creation order.
    pub fn servers(&self) -> Vec<ServerInfo> {
        self.inner
            .state
            .lock()
            .servers
            .iter()
            .map(|s| ServerInfo {
                index: s.index,
                phase: s.phase,
                load: s.load,
            })
            .collect()
    }

    /// Acquires waiting for a seat.
    pub fn waiting(&self) -> usize {
        self.inner.state.lock().waiters.len()
    }

    /// Servers created so far (started or not, alive or not).
    pub fn created(&self) -> u64 {
        self.inner.state.lock().next_index
    }

    /// Rounds of server starts that failed for good (every attempt of one server start
    /// failed) since the pool was made: a count that climbs while the tunnel service is
    /// down. The pool backs off between such rounds.
    pub fn failed_start_rounds(&self) -> u64 {
        self.inner.failed_rounds()
    }

    /// Runs one maintenance round now (health probes, retirements, idle shrink, floor)
    /// instead of waiting for the next `health_interval` tick.
    pub async fn maintain(&self) {
        self.inner.clone().maintain().await;
    }
}

impl Drop for ElasticPool {
    fn drop(&mut self) {
        // Background tasks end; servers not stopped are dropped with them.
        self.inner.cancel.cancel();
    }
}

impl Inner {
    /// Every server that is up (ready or draining).
    fn members(&self) -> Vec<Arc<dyn PoolMember>> {
        self.state
            .lock()
            .servers
            .iter()
            .filter_map(|s| s.member.clone())
            .collect()
    }

    fn demand(&self, state: &State) -> Demand {
        let multiplex = self.config.multiplex;
        let mut d = Demand {
            waiting: state.waiters.len(),
            free_seats: 0,
            starting: 0,
            ready: 0,
            total: state.servers.len(),
            multiplex,
            min_servers: self.min_servers,
            max_servers: self.config.max_servers,
            max_concurrent_starts: self.config.max_concurrent_starts,
        };
        for s in &state.servers {
            match s.phase {
                ServerPhase::Starting => d.starting += 1,
                ServerPhase::Ready => {
                    d.ready += 1;
                    d.free_seats += multiplex.saturating_sub(s.load);
                }
                ServerPhase::Draining | ServerPhase::Stopping => {}
            }
        }
        d
    }

    /// Hands free seats to waiters (oldest first), then starts the servers the policy
    /// asks for. Consumes the lock; deliveries happen after it is released.
    fn settle(self: Arc<Self>, mut state: MutexGuard<'_, State>) {
        if state.lifecycle != Lifecycle::Running {
            return;
        }
        let mut deliveries: Deliveries = Vec::new();
        while !state.waiters.is_empty() {
            let Some(seat) = self.take_seat(&mut state) else {
                break;
            };
            if let Some(waiter) = state.waiters.pop_front() {
                deliveries.push((waiter.tx, Ok(seat)));
            }
        }
        let mut n = policy::servers_to_start(self.demand(&state));
        let mut wakeup = None;
        let starting = state_starting(&state.servers);
        if let Some(outage) = state.outage.as_mut() {
            let now = Instant::now();
            if now < outage.until {
                // Backing off: nothing new starts before the round's time; a wakeup
                // settles again then.
                if n > 0 && !outage.wakeup_armed {
                    outage.wakeup_armed = true;
                    wakeup = Some(outage.until);
                }
                n = 0;
            } else {
                // One probing start at a time until a server comes up again.
                n = n.min(usize::from(starting == 0));
            }
        }
        let mut new = Vec::with_capacity(n);
        for _ in 0..n {
            let index = state.next_index;
            state.next_index += 1;
            state.servers.push(Server {
                index,
                phase: ServerPhase::Starting,
                member: None,
                load: 0,
                empty_since: None,
                retired: self.cancel.child_token(),
            });
            new.push(index);
        }
        if n > 0 {
            debug!(
                starting = n,
                servers = state.servers.len(),
                waiting = state.waiters.len(),
                "elastic pool: growing"
            );
        }
        drop(state);
        for index in new {
            self.tasks.spawn(self.clone().run_start(index));
        }
        if let Some(at) = wakeup {
            let inner = self.clone();
            self.tasks.spawn(async move {
                tokio::select! {
                    _ = inner.cancel.cancelled() => {}
                    _ = tokio::time::sleep_until(at) => {
                        let mut state = inner.state.lock();
                        if let Some(o) = state.outage.as_mut() {
                            o.wakeup_armed = false;
                        }
                        inner.clone().settle(state);
                    }
                }
            });
        }
        deliver(deliveries);
    }

    /// Rounds of server starts that failed for good since the pool was made.
    fn failed_rounds(&self) -> u64 {
        self.state.lock().failed_rounds
    }

    /// Reserves a seat on the oldest ready server with room.
    fn take_seat(self: &Arc<Self>, state: &mut State) -> Option<Seat> {
        let loads: Vec<Option<usize>> = state
            .servers
            .iter()
            .map(|s| (s.phase == ServerPhase::Ready).then_some(s.load))
            .collect();
        let i = policy::first_fit(&loads, self.config.multiplex)?;
        let server = &mut state.servers[i];
        let member = server.member.clone()?;
        server.load += 1;
        server.empty_since = None;
        Some(Seat {
            inner: self.clone(),
            index: server.index,
            member,
        })
    }

    async fn run_start(self: Arc<Self>, index: u64) {
        let mut attempt: u32 = 0;
        loop {
            attempt += 1;
            let result = self.factory.start_server(index).await;
            match result {
                Ok(member) => {
                    // A server that comes up during a pause is paused, in the pool's
                    // epoch, before any session can reach it.
                    self.pause.apply(&*member);
                    let joined = member.clone();
                    let mut state = self.state.lock();
                    let running = state.lifecycle == Lifecycle::Running;
                    let Some(server) = state.servers.iter_mut().find(|s| s.index == index) else {
                        return;
                    };
                    server.phase = ServerPhase::Ready;
                    server.member = Some(member);
                    server.empty_since = Some(Instant::now());
                    let retired = server.retired.clone();
                    if let Some(outage) = state.outage.take() {
                        warn!(
                            server = index,
                            failed_rounds = outage.rounds,
                            "elastic pool: servers start again; backoff between rounds ended"
                        );
                    }
                    if running {
                        info!(
                            server = index,
                            servers = state.servers.len(),
                            multiplex = self.config.multiplex,
                            "elastic pool: server up"
                        );
                    }
                    // When stopping, the server stays listed and stop() tears it down.
                    self.clone().settle(state);
                    if running {
                        self.tasks.spawn(self.clone().watch_endpoint(
                            index,
                            joined.clone(),
                            retired,
                        ));
                    }
                    // Again now that it is listed: a pause that ran in between did not
                    // see it.
                    self.pause.apply(&*joined);
                    return;
                }
                Err(error) => {
                    let give_up = attempt >= self.config.start_attempts.max(1)
                        || !error.retryable()
                        || self.cancel.is_cancelled();
                    if self.state.lock().outage.is_some() {
                        // Already reported when the outage began.
                        debug!(server = index, attempt, %error, give_up, "elastic pool: server start failed");
                    } else {
                        warn!(server = index, attempt, %error, give_up, "elastic pool: server start failed");
                    }
                    if give_up {
                        self.give_up(index, error);
                        return;
                    }
                    let delay =
                        policy::backoff(attempt, self.config.backoff_base, self.config.backoff_max);
                    tokio::select! {
                        _ = self.cancel.cancelled() => {
                            self.give_up(index, error);
                            return;
                        }
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }

    /// A server will not come up: drop its entry and fail the waiters nothing else covers.
    fn give_up(self: &Arc<Self>, index: u64, error: Error) {
        let mut state = self.state.lock();
        state.servers.retain(|s| s.index != index);
        state.failed_rounds += 1;
        let rounds = state.outage.as_ref().map_or(0, |o| o.rounds) + 1;
        let delay = policy::round_backoff(
            rounds,
            self.config.backoff_base,
            self.config.backoff_max,
            fastrand_f64(),
        );
        if rounds == 1 {
            warn!(
                server = index,
                %error,
                "elastic pool: a server could not be started; backing off between further \
                 rounds (up to {:?})",
                self.config.backoff_max
            );
        } else {
            debug!(
                server = index,
                rounds,
                ?delay,
                "elastic pool: another round of server starts failed"
            );
        }
        state.outage = Some(Outage {
            rounds,
            until: Instant::now() + delay,
            wakeup_armed: false,
        });
        let d = self.demand(&state);
        let n = policy::uncovered_waiters(d.waiting, d.free_seats, d.starting, d.multiplex);
        let deliveries: Deliveries = state
            .waiters
            .drain(..n)
            .map(|w| (w.tx, Err(error.clone())))
            .collect();
        self.clone().settle(state);
        deliver(deliveries);
    }

    /// One maintenance round: probe endpoints, retire the unhealthy, shrink the idle,
    /// top the floor up.
    async fn maintain(self: Arc<Self>) {
        self.clone().maintain_round().await;
        self.rounds.send_modify(|n| *n += 1);
    }

    /// Waits for the endpoint of ready server `index` to report itself dead, then wakes
    /// the maintenance loop, so a dead endpoint is probed (and its server retired) at once
    /// rather than at the next `health_interval` tick. At most one wake per maintenance
    /// round; ends when the server stops being ready or the pool stops.
    async fn watch_endpoint(
        self: Arc<Self>,
        index: u64,
        member: Arc<dyn PoolMember>,
        retired: CancellationToken,
    ) {
        loop {
            tokio::select! {
                _ = retired.cancelled() => return,
                () = member.dead() => {}
            }
            let mut rounds = self.rounds.subscribe();
            let seen = *rounds.borrow_and_update();
            debug!(
                server = index,
                "elastic pool: endpoint reports itself dead; probing it now"
            );
            self.wake.notify_one();
            tokio::select! {
                _ = retired.cancelled() => return,
                _ = rounds.wait_for(|n| *n > seen) => {}
            }
        }
    }

    async fn maintain_round(self: Arc<Self>) {
        let ready: Vec<(u64, Arc<dyn PoolMember>)> = {
            let state = self.state.lock();
            if state.lifecycle != Lifecycle::Running {
                return;
            }
            state
                .servers
                .iter()
                .filter(|s| s.phase == ServerPhase::Ready)
                .filter_map(|s| s.member.clone().map(|m| (s.index, m)))
                .collect()
        };
        let probe_timeout = self.config.health_interval.max(Duration::from_millis(1));
        let repair_timeout = probe_timeout.max(REPAIR_TIMEOUT);
        let probes = join_all(ready.iter().map(|(index, m)| async move {
            let probe = || async {
                tokio::time::timeout(probe_timeout, m.health())
                    .await
                    .unwrap_or_else(|_| Health::Unhealthy("health probe timed out".into()))
            };
            let Health::Unhealthy(why) = probe().await else {
                return Health::Healthy;
            };
            // Repair in place first (same registration, same URL); drain only if that
            // fails.
            match tokio::time::timeout(repair_timeout, m.repair()).await {
                Ok(Ok(())) => match probe().await {
                    Health::Healthy => {
                        warn!(server = index, reason = %why, "elastic pool: endpoint was unhealthy; repaired in place");
                        Health::Healthy
                    }
                    still => still,
                },
                Ok(Err(e)) => Health::Unhealthy(format!("{why}; repair failed: {e}")),
                Err(_) => Health::Unhealthy(format!("{why}; repair timed out after {repair_timeout:?}")),
            }
        }))
        .await;
        let mut state = self.state.lock();
        if state.lifecycle != Lifecycle::Running {
            return;
        }
        for ((index, member), health) in ready.into_iter().zip(probes) {
            if let Health::Unhealthy(why) = health {
                if let Some(s) = state
                    .servers
                    .iter_mut()
                    .find(|s| s.index == index && s.phase == ServerPhase::Ready)
                {
                    warn!(server = index, reason = %why, load = s.load, "elastic pool: endpoint unhealthy; draining the server");
                    s.phase = ServerPhase::Draining;
                    s.retired.cancel();
                    self.tasks.spawn(self.clone().retire(index, member));
                }
            }
        }
        let now = Instant::now();
        let ready_idx: Vec<usize> = (0..state.servers.len())
            .filter(|i| state.servers[*i].phase == ServerPhase::Ready)
            .collect();
        let idle: Vec<IdleServer> = ready_idx
            .iter()
            .map(|i| {
                let s = &state.servers[*i];
                IdleServer {
                    load: s.load,
                    idle_for: s.empty_since.map(|t| now.saturating_duration_since(t)),
                }
            })
            .collect();
        let shrink = policy::idle_to_shrink(
            &idle,
            self.config.idle_timeout,
            self.min_servers,
            state.waiters.len(),
        );
        for k in shrink {
            let s = &mut state.servers[ready_idx[k]];
            s.phase = ServerPhase::Stopping;
            s.retired.cancel();
            if let Some(member) = s.member.clone() {
                info!(server = s.index, "elastic pool: shrinking an idle server");
                self.tasks.spawn(self.clone().teardown(s.index, member));
            }
        }
        self.clone().settle(state);
    }

    /// Waits for a draining server to empty (up to `drain_timeout`), then tears it down.
    async fn retire(self: Arc<Self>, index: u64, member: Arc<dyn PoolMember>) {
        let deadline = Instant::now() + self.config.drain_timeout;
        loop {
            let notified = self.drained.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let empty = {
                let state = self.state.lock();
                state
                    .servers
                    .iter()
                    .find(|s| s.index == index)
                    .is_none_or(|s| s.load == 0)
            };
            if empty {
                break;
            }
            tokio::select! {
                _ = self.cancel.cancelled() => return, // stop() tears it down
                _ = tokio::time::sleep_until(deadline) => {
                    warn!(server = index, "elastic pool: drain timed out; tearing the server down");
                    break;
                }
                _ = &mut notified => {}
            }
        }
        {
            let mut state = self.state.lock();
            if let Some(s) = state.servers.iter_mut().find(|s| s.index == index) {
                s.phase = ServerPhase::Stopping;
            }
        }
        self.teardown(index, member).await;
    }

    /// Tears one server down and forgets it.
    async fn teardown(self: Arc<Self>, index: u64, member: Arc<dyn PoolMember>) {
        if let Err(error) = member.stop().await {
            warn!(server = index, %error, "elastic pool: server teardown failed");
        }
        let mut state = self.state.lock();
        state.servers.retain(|s| {
            if s.index == index {
                s.retired.cancel();
            }
            s.index != index
        });
        self.clone().settle(state);
    }

    async fn maintenance_loop(self: Arc<Self>) {
        let period = self.config.health_interval.max(Duration::from_millis(1));
        loop {
            tokio::select! {
                _ = self.cancel.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
                // An endpoint reported itself dead: probe now.
                _ = self.wake.notified() => {}
            }
            self.clone().maintain().await;
        }
    }

    fn cap_error(&self, state: &State) -> Error {
        let c = &self.config;
        let n = &c.setting_names;
        if state.servers.len() >= c.max_servers {
            Error::Unavailable(format!(
                "elastic pool is at {} = {} ({} sessions per server, all taken): \
                 no seat freed within {:?}; raise {} or {}, or {}",
                n.max_servers,
                c.max_servers,
                c.multiplex,
                c.wait_timeout,
                n.max_servers,
                n.multiplex,
                n.wait_timeout
            ))
        } else {
            Error::Unavailable(format!(
                "elastic pool: no server came up within {:?} ({} server(s), {} = {}); \
                 check the tunnel backend or raise {}",
                c.wait_timeout,
                state.servers.len(),
                n.max_servers,
                c.max_servers,
                n.wait_timeout
            ))
        }
    }

    async fn seat(self: &Arc<Self>) -> Result<Seat, Error> {
        let (id, rx) = {
            let mut state = self.state.lock();
            match state.lifecycle {
                Lifecycle::New => {
                    return Err(Error::Conflict(
                        "the elastic pool is not started: call start() first".into(),
                    ))
                }
                Lifecycle::Stopped => {
                    return Err(Error::Cancelled("the elastic pool was stopped".into()))
                }
                Lifecycle::Running => {}
            }
            // With waiters queued there is no free seat (settle hands them out first),
            // so taking one here never jumps the queue.
            if let Some(seat) = self.take_seat(&mut state) {
                return Ok(seat);
            }
            let id = state.next_waiter;
            state.next_waiter += 1;
            let (tx, rx) = oneshot::channel();
            state.waiters.push_back(Waiter { id, tx });
            self.clone().settle(state);
            (id, rx)
        };
        let mut queued = Queued {
            inner: self,
            id,
            rx: Some(rx),
        };
        let rx = queued
            .rx
            .as_mut()
            .ok_or_else(|| Error::Internal("lost the waiter".into()))?;
        match tokio::time::timeout(self.config.wait_timeout, rx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(Error::Cancelled("the elastic pool was stopped".into())),
            Err(_) => {
                let mut state = self.state.lock();
                state.waiters.retain(|w| w.id != id);
                // A seat may have arrived just as the wait ended.
                if let Some(Ok(Ok(seat))) = queued.rx.take().map(|mut rx| rx.try_recv()) {
                    return Ok(seat);
                }
                Err(self.cap_error(&state))
            }
        }
    }
}

/// A queued acquire; if the acquire is dropped while waiting, its place in the queue
/// goes too.
struct Queued<'a> {
    inner: &'a Arc<Inner>,
    id: u64,
    rx: Option<oneshot::Receiver<Result<Seat, Error>>>,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let mut state = self.inner.state.lock();
        let id = self.id;
        state.waiters.retain(|w| w.id != id);
        drop(state);
        // A seat already sent to us is dropped (and freed) with the receiver.
        drop(self.rx.take());
    }
}
