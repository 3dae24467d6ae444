//! Load-test programs for intercept's benchmarks (`cargo xtask bench`): the driver that
//! runs the others, measures and reports (`benchmark`), a fast mock upstream
//! (`bench-upstream`), an interception server with many registered sessions
//! (`bench-proxy`), a load generator (`loadgen`), in-process scale figures
//! (`bench-scale`), and the slow-stream rig: a cheap paced upstream (`slow-upstream`)
//! and a lean streaming client (`slowgen`). The driver also measures the `intercept`
//! binary itself (`intercept serve`, sessions made through its control API:
//! [`serve_api`]), how it holds up as its records pile up ([`growth`]), and what
//! appending its trace lines costs with no proxy around it ([`write_cost`],
//! `bench-write`), and how it carries agent-shaped traffic: 40-turn tool loops whose
//! contexts grow to ~100 KB ([`agentic`], `agentgen`), and the time to first token the
//! token path adds in front of an engine ([`tito_ttft`], `bench-tito-ttft`). This
//! library holds what the binaries share, so tests can drive every piece in-process.
//!
//! ```no_run
//! use std::time::Duration;
//! use intercept_bench::{bodies, load::{self, LoadConfig}};
//!
//! # async fn run() -> anyhow::Result<()> {
//! let config = LoadConfig {
//!     connections: 16,
//!     requests: 10_000,
//!     duration: Duration::from_secs(5),
//!     ..LoadConfig::new(
//!         "http://127.0.0.1:8000/v1/chat/completions".parse()?,
//!         vec!["secret".into()],
//!         bodies::chat_request(false, 2048).into(),
//!     )
//! };
//! let report = load::run(&config).await?;
//! println!("{:.0} req/s, p99 {} µs", report.rps, report.latency_us.p99);
//! # Ok(())
//! # }
//! ```

// Measuring programs: they time real work on the process's clock, in and out of
// runtimes.
#![allow(clippy::disallowed_types)]

pub mod bodies;
pub mod control;

/// Transparent huge pages off for this process, as the `intercept` binary does: with
/// them, growing memory is faulted in 2 MiB at a time, each fault zeroing 2 MiB in the
/// middle of a call. Called first thing by the programs that stand in for `intercept`.
pub fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}
pub mod agentic;
pub mod growth;
pub mod http1;
pub mod load;
pub mod procfs;
pub mod serve_api;
pub mod session;
pub mod slow_streams;
pub mod slow_upstream;
pub mod tito_ttft;
pub mod trace_size;
pub mod write_cost;

pub use session::CountingSession;

/// A multi-threaded runtime with `threads` workers (default: one per CPU the process may
/// run on), for the bench programs' `--threads`.
pub fn runtime(threads: Option<usize>) -> std::io::Result<tokio::runtime::Runtime> {
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        rt.worker_threads(n.max(1));
    }
    rt.enable_all().build()
}

/// What every load generator is pointed at: the URL, the secrets and its runtime.
#[derive(Debug, Clone, clap::Args)]
pub struct TargetArgs {
    /// Full URL of the chat completions route.
    #[arg(long)]
    pub url: String,
    /// JSON array of bearer secrets.
    #[arg(long)]
    pub secrets_file: Option<std::path::PathBuf>,
    /// One bearer secret (when there is no secrets file).
    #[arg(long, default_value = "bench")]
    pub secret: String,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,
    /// Runtime worker threads (default: one per CPU the process may run on).
    #[arg(long)]
    pub threads: Option<usize>,
}

impl TargetArgs {
    /// The secrets ([`read_secrets`]).
    pub fn secrets(&self) -> anyhow::Result<Vec<String>> {
        read_secrets(self.secrets_file.as_deref(), &self.secret)
    }
}

/// The bearer secrets of a load generator: the JSON array of strings in `file`, or `one`.
pub fn read_secrets(file: Option<&std::path::Path>, one: &str) -> anyhow::Result<Vec<String>> {
    use anyhow::Context as _;
    match file {
        Some(path) => serde_json::from_slice(
            &std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?,
        )
        .with_context(|| format!("{} is not a JSON array of strings", path.display())),
        None => Ok(vec![one.to_owned()]),
    }
}
