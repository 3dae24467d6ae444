//! `bench-proxy`: an `InterceptionServer` on `127.0.0.1` with N registered sessions that
//! all call one upstream. Prints `{"base_url", "pid", "sessions", "secrets_file"}` as one
//! JSON line (the model secrets go to the file as a JSON array, or inline as `secrets`
//! without `--secrets-file`), then answers `stats` on stdin with
//! `{"calls", "failed", "inflight", "rss_kib", "hwm_kib"}` and stops on `quit` or at the
//! end of stdin.
//!
//! `--record count` registers [`CountingSession`]s whose records are only counted, so a
//! long run measures the proxy and not trace storage; `--record trace` registers the
//! ready `RolloutSession`, which keeps every call in memory (and builds its episode);
//! `--record episode` counts like `count` and also builds each session's episode graph,
//! so that `episode` against `count` is the graph's cost alone.

// Measuring programs: they time real work on the process's clock, in and out of
// runtimes.
#![allow(clippy::disallowed_types)]

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use clap::{Parser, ValueEnum};
use intercept_bench::{control, procfs, CountingSession};
use intercept_core::{Interception, RolloutSession, Session, SessionConfig, Upstream};
use intercept_server::{InterceptionServer, ServerConfig};
use serde_json::json;

/// The allocator of the `intercept` binary, which this program stands in for.
#[global_allocator]
static ALLOCATOR: intercept_alloc::MiMalloc = intercept_alloc::MiMalloc;

/// What the registered sessions do with call records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Record {
    /// Count them (flat memory).
    Count,
    /// Keep them in an in-memory trace (`RolloutSession`).
    Trace,
    /// Count them and commit each to the session's episode graph.
    Episode,
}

/// An interception server with many sessions, for load tests.
#[derive(Debug, Parser)]
struct Args {
    /// The upstream's OpenAI base URL, e.g. `http://127.0.0.1:8000/v1`.
    #[arg(long)]
    upstream: String,
    /// Sessions registered.
    #[arg(long, default_value_t = 1000)]
    sessions: usize,
    /// What sessions do with records.
    #[arg(long, value_enum, default_value_t = Record::Count)]
    record: Record,
    /// Write the model secrets here (JSON array) instead of into the ready line.
    #[arg(long)]
    secrets_file: Option<PathBuf>,
    /// Port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Idle upstream connections kept.
    #[arg(long, default_value_t = 1024)]
    upstream_idle: usize,
    /// The server's event loops (`ServerConfig::workers`) and the control runtime's
    /// threads (default: one per CPU the process may run on).
    #[arg(long)]
    threads: Option<usize>,
}

fn main() -> Result<()> {
    intercept_bench::no_transparent_huge_pages();
    let args = Args::parse();
    intercept_bench::runtime(args.threads)?.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let server = InterceptionServer::new(ServerConfig {
        listen: Some(SocketAddr::from((Ipv4Addr::LOCALHOST, args.port))),
        upstream_idle_per_host: args.upstream_idle,
        workers: args.threads.unwrap_or(0),
        ..ServerConfig::default()
    })?;
    server.start().await?;
    let upstream = Upstream::new(args.upstream.clone());
    let mut guards = Vec::with_capacity(args.sessions);
    let mut secrets = Vec::with_capacity(args.sessions);
    for i in 0..args.sessions.max(1) {
        let id = format!("bench-{i}");
        let session: Arc<dyn Session> = match args.record {
            Record::Count => Arc::new(CountingSession::new(id, "policy", upstream.clone())),
            Record::Episode => Arc::new(CountingSession::with_episode(
                id,
                "policy",
                upstream.clone(),
            )),
            Record::Trace => Arc::new(RolloutSession::new(SessionConfig::new(
                id,
                "policy",
                upstream.clone(),
            ))),
        };
        let guard = server.acquire(session).await?;
        secrets.push(guard.slot().model_secret.expose().to_owned());
        guards.push(guard);
    }
    let base_url = server
        .base_url()
        .context("the server has no base URL after start")?;
    let mut ready = json!({
        "base_url": base_url,
        "pid": std::process::id(),
        "sessions": guards.len(),
    });
    match &args.secrets_file {
        Some(path) => {
            std::fs::write(path, serde_json::to_vec(&secrets)?)
                .with_context(|| format!("cannot write {}", path.display()))?;
            ready["secrets_file"] = json!(path);
        }
        None => ready["secrets"] = json!(secrets),
    }
    drop(secrets);
    control::announce(&ready);
    let stats_server = server.clone();
    control::serve(move || {
        let s = &stats_server;
        let stats = json!({
            "calls": s.stats().calls(),
            "failed": s.stats().failed(),
            "inflight": s.inflight(),
            "rss_kib": procfs::self_rss_kib(),
            "hwm_kib": procfs::self_hwm_kib(),
        });
        async move { stats }
    })
    .await?;
    drop(guards);
    Ok(())
}
