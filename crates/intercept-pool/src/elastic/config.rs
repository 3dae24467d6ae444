//! The pool's knobs and what it reports of its servers.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_with::{As, DurationSecondsWithFrac};

/// Knobs of an [`ElasticPool`](super::ElasticPool). `Default` gives the documented
/// defaults; in config files durations are written in seconds (fractions allowed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ElasticConfig {
    /// Sessions per server, and so per tunnel (default 32, at least 1).
    pub multiplex: usize,
    /// Servers kept up (warmed at start, regrown after a retirement, never shrunk below).
    /// `None` means 1 when a tunnel is required, else 0 (resolved by
    /// [`crate::make_interception`]; [`ElasticPool::new`](super::ElasticPool::new) reads
    /// `None` as 0).
    pub min_servers: Option<usize>,
    /// Cap on servers, draining ones included (default 256).
    pub max_servers: usize,
    /// Servers starting at once (default 16). The tunnel backend's rate limiter bounds
    /// starts further.
    pub max_concurrent_starts: usize,
    /// How long an acquire waits for a seat (all servers full and the pool at
    /// `max_servers`, or servers still starting) before it fails (default 300 s).
    #[serde(with = "As::<DurationSecondsWithFrac<f64>>")]
    pub wait_timeout: Duration,
    /// Servers empty this long beyond `min_servers` are torn down, newest first
    /// (default 300 s).
    #[serde(with = "As::<DurationSecondsWithFrac<f64>>")]
    pub idle_timeout: Duration,
    /// How often endpoints are probed and idle servers looked for (default 10 s).
    #[serde(with = "As::<DurationSecondsWithFrac<f64>>")]
    pub health_interval: Duration,
    /// An unhealthy server's sessions may finish for this long before it is torn down
    /// anyway (default 120 s).
    #[serde(with = "As::<DurationSecondsWithFrac<f64>>")]
    pub drain_timeout: Duration,
    /// Attempts to start one server before its error is surfaced to the waiting acquires
    /// (default 4). Errors that say retrying cannot help are surfaced at once.
    pub start_attempts: u32,
    /// Delay after the first failed start; doubles per attempt (default 0.5 s).
    #[serde(with = "As::<DurationSecondsWithFrac<f64>>")]
    pub backoff_base: Duration,
    /// Largest delay between start attempts (default 30 s).
    #[serde(with = "As::<DurationSecondsWithFrac<f64>>")]
    pub backoff_max: Duration,
    /// How the pool's error messages name the settings they suggest raising; the
    /// defaults are this struct's field names. A front end with its own spelling (the
    /// sidecar's `--wait-timeout-secs`) sets its own. Not part of config files.
    #[serde(skip)]
    pub setting_names: SettingNames,
}

/// How an [`ElasticPool`](super::ElasticPool)'s error messages name the settings a user
/// can change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettingNames {
    /// [`ElasticConfig::max_servers`].
    pub max_servers: &'static str,
    /// [`ElasticConfig::multiplex`].
    pub multiplex: &'static str,
    /// [`ElasticConfig::wait_timeout`].
    pub wait_timeout: &'static str,
}

impl Default for SettingNames {
    fn default() -> Self {
        SettingNames {
            max_servers: "max_servers",
            multiplex: "multiplex",
            wait_timeout: "wait_timeout",
        }
    }
}

impl Default for ElasticConfig {
    fn default() -> Self {
        ElasticConfig {
            multiplex: 32,
            min_servers: None,
            max_servers: 256,
            max_concurrent_starts: 16,
            wait_timeout: Duration::from_secs(300),
            idle_timeout: Duration::from_secs(300),
            health_interval: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(120),
            start_attempts: 4,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            setting_names: SettingNames::default(),
        }
    }
}

/// Where one server of the pool is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerPhase {
    /// Being started (or backing off between attempts).
    Starting,
    /// Taking sessions.
    Ready,
    /// Its endpoint is unhealthy: no new sessions; torn down once empty.
    Draining,
    /// Being torn down.
    Stopping,
}

/// One server of an [`ElasticPool`](super::ElasticPool), as
/// [`ElasticPool::servers`](super::ElasticPool::servers) reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// Creation number (0 for the first server the pool ever made).
    pub index: u64,
    /// Its phase.
    pub phase: ServerPhase,
    /// Sessions on it (seats reserved by acquires in progress included).
    pub load: usize,
}
