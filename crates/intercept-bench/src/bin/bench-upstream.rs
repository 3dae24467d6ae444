//! `bench-upstream`: the mock model server of `intercept-test` in its fast mode (no
//! request log), on `127.0.0.1`. Prints `{"addr", "base_url", "pid"}` as one JSON line,
//! then answers `stats` on stdin with `{"requests", "connections", "open_connections"}`
//! and stops on `quit` or at the end of stdin.

// Measuring programs: they time real work on the process's clock, in and out of
// runtimes.
#![allow(clippy::disallowed_types)]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Parser;
use intercept_bench::control;
use intercept_test::{MockConfig, MockUpstream};
use serde_json::json;

/// A fast mock upstream for load tests.
#[derive(Debug, Parser)]
struct Args {
    /// Port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Pieces each streamed reply is split into.
    #[arg(long, default_value_t = 16)]
    chunks: usize,
    /// Pause between two stream events, in milliseconds.
    #[arg(long, default_value_t = 0)]
    chunk_delay_ms: u64,
    /// Largest request body accepted, in MiB.
    #[arg(long, default_value_t = 64)]
    max_body_mib: usize,
    /// Runtime worker threads (default: one per CPU the process may run on).
    #[arg(long)]
    threads: Option<usize>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    intercept_bench::runtime(args.threads)?.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, args.port));
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let config = MockConfig {
        chunks: args.chunks,
        chunk_delay: Duration::from_millis(args.chunk_delay_ms),
        max_body_bytes: args.max_body_mib << 20,
        ..MockConfig::fast()
    };
    let upstream = MockUpstream::from_listener(listener, config)?;
    control::announce(&json!({
        "addr": upstream.addr().to_string(),
        "base_url": upstream.base_url(),
        "pid": std::process::id(),
    }));
    control::serve(|| {
        let stats = json!({
            "requests": upstream.request_count(),
            "connections": upstream.connections(),
            "open_connections": upstream.open_connections(),
        });
        async move { stats }
    })
    .await?;
    upstream.shutdown().await;
    Ok(())
}
