//! `bench-scale`: memory and time per registered session, in-process. Registers N idle
//! sessions on an `InterceptionServer`, reads `VmRSS` before and after, times acquire
//! and release, then times N acquire+release cycles. Prints one JSON line.
//!
//! The resident size counts everything a caller keeps per session: the server's registry
//! entry, the session object and the `SlotGuard` the caller holds.

// Measuring programs: they time real work on the process's clock, in and out of
// runtimes.
#![allow(clippy::disallowed_types)]

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use clap::{Parser, ValueEnum};
use intercept_bench::{procfs, CountingSession};
use intercept_core::{Interception, RolloutSession, Session, SessionConfig, Upstream};
use intercept_server::{InterceptionServer, ServerConfig};
use serde_json::json;

/// The allocator of the `intercept` binary, whose memory per session this measures.
#[global_allocator]
static ALLOCATOR: intercept_alloc::MiMalloc = intercept_alloc::MiMalloc;

/// Which session type is registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Kind {
    /// The ready `RolloutSession` (config, in-memory trace, limits).
    Rollout,
    /// The bench crate's `CountingSession` (the smallest useful session).
    Count,
}

/// Memory and time per registered session.
#[derive(Debug, Parser)]
struct Args {
    /// Sessions registered at once.
    #[arg(long, default_value_t = 100_000)]
    sessions: usize,
    /// Session type.
    #[arg(long, value_enum, default_value_t = Kind::Rollout)]
    kind: Kind,
}

fn main() -> Result<()> {
    intercept_bench::no_transparent_huge_pages();
    let args = Args::parse();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

fn session(kind: Kind, i: usize, upstream: &Upstream) -> Arc<dyn Session> {
    let id = format!("rollout-{i:08}");
    match kind {
        Kind::Rollout => Arc::new(RolloutSession::new(SessionConfig::new(
            id,
            "policy-model",
            upstream.clone(),
        ))),
        Kind::Count => Arc::new(CountingSession::new(id, "policy-model", upstream.clone())),
    }
}

async fn run(args: Args) -> Result<()> {
    let n = args.sessions.max(1);
    let server = InterceptionServer::new(ServerConfig::default())?;
    server.start().await?;
    let upstream = Upstream::new("http://127.0.0.1:9/v1");
    // Warm the allocator and the registry's maps a little, then measure.
    for i in 0..64 {
        server
            .acquire(session(args.kind, i, &upstream))
            .await?
            .close()
            .await;
    }
    let mut guards = Vec::with_capacity(n);
    let rss_before = procfs::self_rss_kib().unwrap_or(0);
    let t = Instant::now();
    for i in 0..n {
        guards.push(server.acquire(session(args.kind, i, &upstream)).await?);
    }
    let acquire = t.elapsed();
    let rss_after = procfs::self_rss_kib().unwrap_or(0);
    let load = server.load();
    let t = Instant::now();
    for g in guards.drain(..) {
        g.close().await;
    }
    let release = t.elapsed();
    let t = Instant::now();
    for i in 0..n {
        server
            .acquire(session(args.kind, n + i, &upstream))
            .await?
            .close()
            .await;
    }
    let cycle = t.elapsed();
    server.stop().await?;
    let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / n as f64;
    println!(
        "{}",
        json!({
            "kind": format!("{:?}", args.kind).to_lowercase(),
            "sessions": n,
            "load": load,
            "rss_before_kib": rss_before,
            "rss_after_kib": rss_after,
            "bytes_per_session": (rss_after.saturating_sub(rss_before) * 1024) as f64 / n as f64,
            "acquire_us": per(acquire),
            "release_us": per(release),
            "acquire_release_cycle_us": per(cycle),
        })
    );
    Ok(())
}
