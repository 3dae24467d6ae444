//! `slow-upstream`: the cheap slow-stream upstream of the 10k-streams rig
//! ([`intercept_bench::slow_upstream`]) on `127.0.0.1`, on ONE thread (pin it to a core
//! with `taskset`). Prints `{"addr", "base_url", "pid", "chunks", "chunk_delay_ms"}` as
//! one JSON line, then answers `stats` on stdin with `{"requests", "connections",
//! "open_connections", "streams_started", "streams_completed", "streams_failed",
//! "live_streams", "stalled_writes", "ticks", "tick_late_max_us", "tick_busy_max_us",
//! "tick_busy_total_us", "bad_requests"}` (the two maxima are since the previous
//! `stats`) and stops on `quit` or at the end of stdin.

// Measuring programs: they time real work on the process's clock, in and out of
// runtimes.
#![allow(clippy::disallowed_types)]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use intercept_bench::control;
use intercept_bench::slow_upstream::{listen, SlowConfig, SlowUpstream};
use serde_json::json;

/// A slow-stream upstream with one shared ticker.
#[derive(Debug, Parser)]
struct Args {
    /// Port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Content chunks per stream.
    #[arg(long, default_value_t = 200)]
    chunks: usize,
    /// Time between two chunks (one tick), in milliseconds.
    #[arg(long, default_value_t = 50)]
    chunk_delay_ms: u64,
    /// Largest request body accepted, in MiB.
    #[arg(long, default_value_t = 64)]
    max_body_mib: usize,
    /// Accept queue length asked for (the kernel caps it at net.core.somaxconn).
    #[arg(long, default_value_t = 16384)]
    backlog: u32,
}

fn main() -> Result<()> {
    let args = Args::parse();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let listener = listen(
        SocketAddr::from((Ipv4Addr::LOCALHOST, args.port)),
        args.backlog,
    )?;
    let upstream = SlowUpstream::start(
        listener,
        SlowConfig {
            chunks: args.chunks,
            interval: Duration::from_millis(args.chunk_delay_ms.max(1)),
            max_body_bytes: args.max_body_mib << 20,
        },
    )?;
    control::announce(&json!({
        "addr": upstream.addr().to_string(),
        "base_url": upstream.base_url(),
        "pid": std::process::id(),
        "chunks": args.chunks,
        "chunk_delay_ms": args.chunk_delay_ms,
    }));
    let stats = upstream.stats().clone();
    control::serve(|| {
        let s = stats.snapshot();
        async move { s }
    })
    .await?;
    upstream.shutdown().await;
    Ok(())
}
