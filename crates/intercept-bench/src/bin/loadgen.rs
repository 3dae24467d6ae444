//! `loadgen`: a closed-loop load generator for chat completions (see
//! [`intercept_bench::load`]). Prints one JSON report on stdout.
//!
//! ```text
//! loadgen --url http://127.0.0.1:4100/v1/chat/completions --secrets-file s.json \
//!         --connections 16 --duration 10 --warmup 2 [--stream] [--body-bytes 2048] \
//!         [--interval 1]
//! ```

// Measuring programs: they time real work on the process's clock, in and out of
// runtimes.
#![allow(clippy::disallowed_types)]

use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use intercept_bench::{bodies, load};

/// Load generator for chat completions.
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    target: intercept_bench::TargetArgs,
    /// Connections.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// Requests in flight per connection (HTTP/2 only).
    #[arg(long, default_value_t = 1)]
    per_connection: usize,
    /// Speak HTTP/2 (h2c with prior knowledge).
    #[arg(long)]
    http2: bool,
    /// Stop after this many requests.
    #[arg(long, default_value_t = u64::MAX)]
    requests: u64,
    /// Measured seconds (after the warmup).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Warmup seconds (sent, not measured).
    #[arg(long, default_value_t = 0.0)]
    warmup: f64,
    /// Ask for a stream.
    #[arg(long)]
    stream: bool,
    /// Request body size in bytes.
    #[arg(long, default_value_t = 2048)]
    body_bytes: usize,
    /// Also count the successful requests completed in each interval of this many
    /// seconds of the measured window (`intervals` in the report; 0: none).
    #[arg(long, default_value_t = 0.0)]
    interval: f64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    intercept_bench::runtime(args.target.threads)?.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let secrets = args.target.secrets()?;
    let body = bodies::chat_request(args.stream, args.body_bytes);
    let config = load::LoadConfig {
        stream: args.stream,
        connections: args.connections,
        per_connection: args.per_connection,
        http2: args.http2,
        requests: args.requests,
        duration: Duration::from_secs_f64(args.duration),
        warmup: Duration::from_secs_f64(args.warmup),
        timeout: Duration::from_secs_f64(args.target.timeout),
        interval: (args.interval > 0.0).then(|| Duration::from_secs_f64(args.interval)),
        ..load::LoadConfig::new(args.target.url.parse()?, secrets, body.into())
    };
    let report = load::run(&config).await?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
