//! Fake pool members with scripted start latency, start failures, health and teardown
//! failures, for tests under paused tokio time.

#![allow(dead_code, unreachable_pub)]

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use intercept_core::{
    Error, Health, RolloutSession, Secret, Session, SessionConfig, Slot, SlotGuard, SlotRelease,
    Upstream,
};
use intercept_pool::{PoolMember, ServerFactory};
use parking_lot::Mutex;
use tokio::sync::watch;

/// A session with this id.
pub fn session(id: impl Into<String>) -> Arc<dyn Session> {
    Arc::new(RolloutSession::new(SessionConfig::new(
        id,
        "policy",
        Upstream::new("http://127.0.0.1:9/v1"),
    )))
}

/// A retryable tunnel failure.
pub fn tunnel_down() -> Error {
    Error::Tunnel {
        message: "tunnel service unavailable (503): try again".into(),
        retryable: true,
    }
}

/// Makes [`FakeMember`]s.
#[derive(Debug)]
pub struct FakeFactory {
    /// Start latency of every server unless overridden per index.
    pub latency: Duration,
    latency_for: Mutex<HashMap<u64, Duration>>,
    /// Outcomes of the next start calls, in order; an empty script means success.
    script: Mutex<VecDeque<Error>>,
    fail_stop: Mutex<HashSet<u64>>,
    stop_latency: Mutex<HashMap<u64, Duration>>,
    /// Every member made, in creation order.
    pub members: Mutex<Vec<Arc<FakeMember>>>,
    /// Calls to `start_server`.
    pub start_calls: AtomicUsize,
    in_flight: AtomicUsize,
    /// Most starts in flight at once.
    pub max_in_flight: AtomicUsize,
    /// Indices of members stopped, in the order of their teardown.
    stopped: watch::Sender<Vec<u64>>,
}

impl FakeFactory {
    /// Every start takes `latency`.
    pub fn new(latency: Duration) -> Arc<Self> {
        Arc::new(FakeFactory {
            latency,
            latency_for: Mutex::new(HashMap::new()),
            script: Mutex::new(VecDeque::new()),
            fail_stop: Mutex::new(HashSet::new()),
            stop_latency: Mutex::new(HashMap::new()),
            members: Mutex::new(Vec::new()),
            start_calls: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            stopped: watch::channel(Vec::new()).0,
        })
    }

    /// Server `index` takes `latency` to start.
    pub fn set_latency(&self, index: u64, latency: Duration) {
        self.latency_for.lock().insert(index, latency);
    }

    /// The next `n` start calls fail with `error`.
    pub fn fail_next(&self, n: usize, error: Error) {
        let mut s = self.script.lock();
        for _ in 0..n {
            s.push_back(error.clone());
        }
    }

    /// Drops the outcomes still scripted: every start succeeds from now on.
    pub fn heal(&self) {
        self.script.lock().clear();
    }

    /// Tearing server `index` down fails.
    pub fn fail_stop_of(&self, index: u64) {
        self.fail_stop.lock().insert(index);
    }

    /// Tearing server `index` down takes `latency` (`Duration::MAX`: it never ends).
    pub fn set_stop_latency(&self, index: u64, latency: Duration) {
        self.stop_latency.lock().insert(index, latency);
    }

    /// The member made for server `index`.
    pub fn member(&self, index: u64) -> Arc<FakeMember> {
        self.members
            .lock()
            .iter()
            .find(|m| m.index == index)
            .cloned()
            .expect("no such member")
    }

    /// Indices stopped so far, in teardown order.
    pub fn stopped(&self) -> Vec<u64> {
        self.stopped.borrow().clone()
    }

    /// Waits until `n` members have been stopped.
    pub async fn wait_stopped(&self, n: usize) -> Vec<u64> {
        let mut rx = self.stopped.subscribe();
        let stopped = rx
            .wait_for(|v| v.len() >= n)
            .await
            .expect("factory dropped")
            .clone();
        stopped
    }
}

#[async_trait]
impl ServerFactory for FakeFactory {
    async fn start_server(&self, index: u64) -> Result<Arc<dyn PoolMember>, Error> {
        self.start_calls.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let latency = self
            .latency_for
            .lock()
            .get(&index)
            .copied()
            .unwrap_or(self.latency);
        tokio::time::sleep(latency).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        if let Some(error) = self.script.lock().pop_front() {
            return Err(error);
        }
        let member = Arc::new(FakeMember {
            index,
            sessions: Arc::new(Mutex::new(HashSet::new())),
            health: Mutex::new(Health::Healthy),
            stopped: AtomicBool::new(false),
            fail_stop: self.fail_stop.lock().contains(&index),
            stop_latency: self.stop_latency.lock().get(&index).copied(),
            repairable: AtomicBool::new(false),
            repairs: AtomicUsize::new(0),
            stopped_log: self.stopped.clone(),
        });
        self.members.lock().push(member.clone());
        Ok(member)
    }
}

/// A fake server: remembers its sessions, reports scripted health.
#[derive(Debug)]
pub struct FakeMember {
    /// Creation index.
    pub index: u64,
    /// Ids of the sessions registered and not released.
    pub sessions: Arc<Mutex<HashSet<String>>>,
    health: Mutex<Health>,
    /// Whether `stop` was called.
    pub stopped: AtomicBool,
    fail_stop: bool,
    stop_latency: Option<Duration>,
    repairable: AtomicBool,
    /// Calls to `repair`.
    pub repairs: AtomicUsize,
    stopped_log: watch::Sender<Vec<u64>>,
}

impl FakeMember {
    /// Makes the endpoint report unhealthy.
    pub fn kill(&self) {
        *self.health.lock() = Health::Unhealthy("frpc exited".into());
    }

    /// Whether `repair` brings the endpoint back (as a restarted frpc on the same
    /// registration would) or fails (the default).
    pub fn set_repairable(&self, yes: bool) {
        self.repairable.store(yes, Ordering::SeqCst);
    }

    /// Sessions registered now.
    pub fn live(&self) -> usize {
        self.sessions.lock().len()
    }
}

#[derive(Debug)]
struct FakeRelease {
    sessions: Arc<Mutex<HashSet<String>>>,
    id: String,
}

#[async_trait]
impl SlotRelease for FakeRelease {
    fn release_now(&self) {
        self.sessions.lock().remove(&self.id);
    }

    async fn release(&self) {
        self.sessions.lock().remove(&self.id);
    }
}

#[async_trait]
impl PoolMember for FakeMember {
    async fn acquire(&self, session: Arc<dyn Session>) -> Result<SlotGuard, Error> {
        if self.stopped.load(Ordering::SeqCst) {
            return Err(Error::Conflict("server stopped".into()));
        }
        let id = session.id().to_owned();
        assert!(
            self.sessions.lock().insert(id.clone()),
            "session {id} registered twice"
        );
        let slot = Slot {
            base_url: format!("http://fake-{}.invalid", self.index),
            model_secret: Secret::generate(),
            state_secret: Secret::generate(),
        };
        Ok(SlotGuard::new(
            slot,
            Box::new(FakeRelease {
                sessions: self.sessions.clone(),
                id,
            }),
        ))
    }

    fn load(&self) -> usize {
        self.live()
    }

    async fn health(&self) -> Health {
        self.health.lock().clone()
    }

    async fn repair(&self) -> Result<(), Error> {
        self.repairs.fetch_add(1, Ordering::SeqCst);
        if !self.repairable.load(Ordering::SeqCst) {
            return Err(tunnel_down());
        }
        *self.health.lock() = Health::Healthy;
        Ok(())
    }

    async fn stop(&self) -> Result<(), Error> {
        if let Some(latency) = self.stop_latency {
            if latency == Duration::MAX {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(latency).await;
        }
        assert!(
            !self.stopped.swap(true, Ordering::SeqCst),
            "server {} stopped twice",
            self.index
        );
        self.sessions.lock().clear();
        self.stopped_log.send_modify(|v| v.push(self.index));
        if self.fail_stop {
            return Err(Error::Tunnel {
                message: format!("tunnel of server {} could not be deleted (500)", self.index),
                retryable: true,
            });
        }
        Ok(())
    }
}

/// Wraps a real [`ServerFactory`] and tells when the pool stops each server it made, so a
/// test can await a retirement instead of polling for it.
#[derive(Debug)]
pub struct Watched {
    inner: Arc<dyn ServerFactory>,
    stopped: watch::Sender<Vec<u64>>,
}

impl Watched {
    /// Watches the servers `inner` makes.
    pub fn new(inner: Arc<dyn ServerFactory>) -> Arc<Self> {
        Arc::new(Watched {
            inner,
            stopped: watch::channel(Vec::new()).0,
        })
    }

    /// Waits until the pool has begun to stop server `index`.
    pub async fn stopping(&self, index: u64) {
        let mut rx = self.stopped.subscribe();
        rx.wait_for(|v| v.contains(&index))
            .await
            .expect("factory dropped");
    }
}

#[async_trait]
impl ServerFactory for Watched {
    async fn start_server(&self, index: u64) -> Result<Arc<dyn PoolMember>, Error> {
        let inner = self.inner.start_server(index).await?;
        Ok(Arc::new(WatchedMember {
            index,
            inner,
            stopped: self.stopped.clone(),
        }))
    }
}

/// A member of a [`Watched`] factory: the real one, whose `stop` is reported.
#[derive(Debug)]
struct WatchedMember {
    index: u64,
    inner: Arc<dyn PoolMember>,
    stopped: watch::Sender<Vec<u64>>,
}

#[async_trait]
impl PoolMember for WatchedMember {
    async fn acquire(&self, session: Arc<dyn Session>) -> Result<SlotGuard, Error> {
        self.inner.acquire(session).await
    }

    fn load(&self) -> usize {
        self.inner.load()
    }

    async fn health(&self) -> Health {
        self.inner.health().await
    }

    async fn stop(&self) -> Result<(), Error> {
        self.stopped.send_modify(|v| v.push(self.index));
        self.inner.stop().await
    }

    async fn repair(&self) -> Result<(), Error> {
        self.inner.repair().await
    }

    async fn dead(&self) {
        self.inner.dead().await;
    }

    fn base_url(&self) -> Option<String> {
        self.inner.base_url()
    }
}
