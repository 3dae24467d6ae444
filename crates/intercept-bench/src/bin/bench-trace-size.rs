//! `bench-trace-size`: what a rollout's trace costs on disk and in memory, for agent loops
//! of 1, 3 and 5 calls (short sessions, where a log's own lines weigh most) and of 10, 20,
//! 40 and 80 turns, a 50-step loop of screenshots, and sessions of 1, 3 and 5 calls of
//! short messages, as the demo's (see `intercept_bench::trace_size`). Prints one table
//! and, with `--json`, one JSON object per case.

// Measuring programs: they time real work on the process's clock, in and out of
// runtimes.
#![allow(clippy::disallowed_types)]

use clap::Parser;
use intercept_bench::trace_size::{measure, Case, Workload};

/// Trace size on agent-shaped traffic, the log against the full format.
#[derive(Debug, Parser)]
struct Args {
    /// Sessions per case.
    #[arg(long, default_value_t = 8)]
    sessions: usize,
    /// Turns of the agent loops.
    #[arg(long, value_delimiter = ',', default_value = "1,3,5,10,20,40,80")]
    turns: Vec<usize>,
    /// Steps of the screenshot loop (0: none).
    #[arg(long, default_value_t = 50)]
    screenshots: usize,
    /// Calls of the sessions of short messages (empty: none).
    #[arg(long, value_delimiter = ',', default_value = "1,3,5")]
    short: Vec<usize>,
    /// One JSON object per case on stdout instead of the table.
    #[arg(long)]
    json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut cases: Vec<Case> = args
        .turns
        .iter()
        .map(|&turns| Case {
            sessions: args.sessions,
            turns,
            workload: Workload::Agent,
        })
        .collect();
    if args.screenshots > 0 {
        cases.push(Case {
            sessions: args.sessions,
            turns: args.screenshots,
            workload: Workload::Screenshots,
        });
    }
    cases.extend(args.short.iter().map(|&turns| Case {
        sessions: args.sessions,
        turns,
        workload: Workload::Short,
    }));
    if !args.json {
        println!(
            "| case | calls | unique | log | full | records | log/unique | full/unique | full/log | log/records | log B/call | full B/call | memory/raw |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    }
    for case in cases {
        let r = measure(case).await?;
        if args.json {
            println!("{}", serde_json::to_string(&r)?);
            continue;
        }
        let mb = |b: u64| {
            if b < 100_000 {
                format!("{:.1} KB", b as f64 / 1e3)
            } else {
                format!("{:.2} MB", b as f64 / 1e6)
            }
        };
        let name = match r.workload {
            Workload::Agent => format!("{} × {} turns", r.sessions, r.turns),
            Workload::Screenshots => format!("{} × {} screenshot steps", r.sessions, r.turns),
            Workload::Short => format!("{} × {} short turns", r.sessions, r.turns),
        };
        println!(
            "| {name} | {} | {} | {} | {} | {} | {:.2}× | {:.1}× | {:.1}× | {:.2}× | {:.0} | {:.0} | {:.3}× |",
            r.calls,
            mb(r.unique_bytes),
            mb(r.log_bytes),
            mb(r.full_bytes),
            mb(r.records_bytes),
            r.log_ratio,
            r.full_ratio,
            r.reduction,
            r.log_per_record,
            r.log_bytes_per_call,
            r.full_bytes_per_call,
            r.memory_ratio,
        );
    }
    Ok(())
}
