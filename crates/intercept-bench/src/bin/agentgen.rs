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

use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use intercept_bench::agentic::{self, AgenticConfig};

/// Agent-shaped load generator.
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    target: intercept_bench::TargetArgs,
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
}

fn main() -> Result<()> {
    let args = Args::parse();
    intercept_bench::runtime(args.target.threads)?.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    let secrets = args.target.secrets()?;
    let config = AgenticConfig {
        first_rollout: args.first_rollout,
        sessions: args.sessions,
        turns: args.turns,
        duration: Duration::from_secs_f64(args.duration),
        max_waves: args.waves,
        cpu_pids: args.cpu_pid,
        timeout: Duration::from_secs_f64(args.target.timeout),
        ..AgenticConfig::new(args.target.url.parse()?, secrets)
    };
    let report = agentic::run(&config).await?;
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
