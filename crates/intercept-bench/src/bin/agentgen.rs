//! `agentgen`: agent-shaped load ([`intercept_bench::agentic`]): waves of rollouts
//! running 40-turn tool loops in lock-step against a chat completions URL, the target's
//! on-CPU time read around each turn. Prints one JSON report on stdout.
//!
//! ```text
//! agentgen --url http://127.0.0.1:4100/v1/chat/completions --secrets-file s.json \
//!          --sessions 16 --turns 40 --duration 10 [--cpu-pid PID]...
//! ```

// Measuring programs: they time real work on the process's clock, in and out of
// runtimes.
#![allow(clippy::disallowed_types)]

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use intercept_bench::agentic::{self, AgenticConfig};

/// Agent-shaped load generator.
#[derive(Debug, Parser)]
struct Args {
    /// Full URL of the chat completions route.
    #[arg(long)]
    url: String,
    /// JSON array of bearer secrets (rollout i uses secret i).
    #[arg(long)]
    secrets_file: Option<PathBuf>,
    /// One bearer secret (when there is no secrets file).
    #[arg(long, default_value = "bench")]
    secret: String,
    /// The number of the first rollout (the secret and the content it uses).
    #[arg(long, default_value_t = 0)]
    first_rollout: usize,
    /// Rollouts per wave.
    #[arg(long, default_value_t = 16)]
    sessions: usize,
    /// Calls per rollout.
    #[arg(long, default_value_t = 40)]
    turns: usize,
    /// No wave starts after this many seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// At most this many waves.
    #[arg(long, default_value_t = usize::MAX)]
    waves: usize,
    /// A process of the target whose on-CPU time is read around each turn (repeat for
    /// several).
    #[arg(long)]
    cpu_pid: Vec<u32>,
    /// Per-call timeout in seconds.
    #[arg(long, default_value_t = 60.0)]
    timeout: f64,
    /// Runtime worker threads (default: one per CPU the process may run on).
    #[arg(long)]
    threads: Option<usize>,
}

fn main() -> Result<()> {
    let args = Args::parse();
    intercept_bench::runtime(args.threads)?.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let secrets = intercept_bench::read_secrets(args.secrets_file.as_deref(), &args.secret)?;
    let config = AgenticConfig {
        first_rollout: args.first_rollout,
        sessions: args.sessions,
        turns: args.turns,
        duration: Duration::from_secs_f64(args.duration),
        max_waves: args.waves,
        cpu_pids: args.cpu_pid,
        timeout: Duration::from_secs_f64(args.timeout),
        ..AgenticConfig::new(args.url.parse()?, secrets)
    };
    let report = agentic::run(&config).await?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
