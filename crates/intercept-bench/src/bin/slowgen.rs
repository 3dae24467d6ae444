//! `slowgen`: the lean streaming client of the 10k-streams rig
//! ([`intercept_bench::slow_streams`]), on ONE thread (pin it with `taskset`).
//!
//! ```text
//! slowgen --url http://127.0.0.1:4100/v1/chat/completions --secrets-file s.json \
//!         --streams 10000 [--http2 --per-connection 100] [--waves 2 | --control]
//! ```
//!
//! Without `--control` it runs `--waves` waves and prints one JSON report per wave.
//! With `--control` it prints `{"pid", "connections"}` once connected, then runs one
//! wave per `wave` line on stdin (printing its report), answers `stats` with
//! `{"connections"}`, and stops on `quit` or at the end of stdin.

// Measuring programs: they time real work on the process's clock, in and out of
// runtimes.
#![allow(clippy::disallowed_types)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result};
use clap::Parser;
use intercept_bench::bodies;
use intercept_bench::slow_streams::{StreamClient, StreamsConfig};
use serde_json::json;
use tokio::io::{AsyncBufReadExt as _, BufReader};

/// Many concurrent slow streams, in waves.
#[derive(Debug, Parser)]
struct Args {
    /// Full URL of the chat completions route.
    #[arg(long)]
    url: String,
    /// JSON array of bearer secrets (used round robin).
    #[arg(long)]
    secrets_file: Option<PathBuf>,
    /// One bearer secret (when there is no secrets file).
    #[arg(long, default_value = "bench")]
    secret: String,
    /// Concurrent streams per wave.
    #[arg(long, default_value_t = 1000)]
    streams: usize,
    /// Speak HTTP/2 (h2c with prior knowledge); otherwise one HTTP/1.1 connection per
    /// stream.
    #[arg(long)]
    http2: bool,
    /// HTTP/2 streams per connection.
    #[arg(long, default_value_t = 100)]
    per_connection: usize,
    /// Spread the stream starts of a wave over this many milliseconds.
    #[arg(long, default_value_t = 1000)]
    start_over_ms: u64,
    /// Streams not finished this many seconds after the last one started fail.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
    /// Look at the network at most every this many microseconds (the thread sleeps in
    /// between instead of being woken per arriving frame; 0: woken as data arrives).
    #[arg(long, default_value_t = 1000)]
    coalesce_us: u64,
    /// Request body size in bytes.
    #[arg(long, default_value_t = 2048)]
    body_bytes: usize,
    /// Waves to run (without --control).
    #[arg(long, default_value_t = 1)]
    waves: usize,
    /// Wait for `wave` commands on stdin.
    #[arg(long)]
    control: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let secrets: Vec<String> = match &args.secrets_file {
        Some(path) => serde_json::from_slice(
            &std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?,
        )
        .with_context(|| format!("{} is not a JSON array of strings", path.display()))?,
        None => vec![args.secret.clone()],
    };
    let mut client = StreamClient::connect(StreamsConfig {
        url: args.url.parse()?,
        secrets,
        body: bodies::chat_request(true, args.body_bytes).into(),
        streams: args.streams,
        http2: args.http2,
        per_connection: args.per_connection,
        start_over: Duration::from_millis(args.start_over_ms),
        timeout: Duration::from_secs_f64(args.timeout),
        coalesce: Duration::from_micros(args.coalesce_us),
    })
    .await?;
    if !args.control {
        for _ in 0..args.waves {
            println!("{}", serde_json::to_string(&client.wave().await?)?);
        }
        return Ok(());
    }
    println!(
        "{}",
        json!({"pid": std::process::id(), "connections": client.connections_opened()})
    );
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        match line.trim() {
            "wave" => println!("{}", serde_json::to_string(&client.wave().await?)?),
            "stats" => println!("{}", json!({"connections": client.connections_opened()})),
            "quit" => break,
            "" => {}
            other => println!(
                "{}",
                json!({"error": format!("unknown command `{other}`; use wave, stats or quit")})
            ),
        }
    }
    Ok(())
}
