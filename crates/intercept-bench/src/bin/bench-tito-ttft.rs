//! `bench-tito-ttft`: the time to first token `intercept serve` with `tokens` adds in
//! front of an engine (see `intercept_bench::tito_ttft`). Prints a table and, with
//! `--json`, the report as one JSON object.

// Measuring programs: they time real work on the process's clock, in and out of
// runtimes.
#![allow(clippy::disallowed_types)]

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use intercept_bench::load::Percentiles;
use intercept_bench::tito_ttft::{run, TtftConfig};

/// Time to first token through the token path against the engine directly.
#[derive(Debug, Parser)]
struct Args {
    /// The `intercept` binary to measure.
    #[arg(long, default_value = "target/release/intercept")]
    intercept: PathBuf,
    /// Qwen3's tokenizer folder (default: `INTERCEPT_QWEN3_TOKENIZER`).
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Tool loops (one session each).
    #[arg(long, default_value_t = 5)]
    loops: usize,
    /// Calls per loop.
    #[arg(long, default_value_t = 40)]
    turns: usize,
    /// The engine's delay before its first token, in milliseconds.
    #[arg(long, default_value_t = 20)]
    first_token_ms: u64,
    /// The report as JSON instead of the table.
    #[arg(long)]
    json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let tokenizer = match args.tokenizer {
        Some(dir) => dir,
        None => std::env::var_os("INTERCEPT_QWEN3_TOKENIZER")
            .map(PathBuf::from)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "name Qwen3's tokenizer folder: --tokenizer or INTERCEPT_QWEN3_TOKENIZER"
                )
            })?,
    };
    let config = TtftConfig {
        loops: args.loops,
        turns: args.turns,
        first_token: Duration::from_millis(args.first_token_ms),
        ..TtftConfig::new(args.intercept, tokenizer)
    };
    let r = run(&config).await?;
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    let ms = |us: u64| us as f64 / 1e3;
    println!(
        "{} pairs, first token after {} ms, prompts up to {} ids, token paths {:?}",
        r.pairs, r.first_token_ms, r.max_prompt_ids, r.paths
    );
    println!("| TTFT | p50 | p99 |");
    println!("|---|---:|---:|");
    let row = |name: &str, p: &Percentiles| {
        println!("| {name} | {:.2} ms | {:.2} ms |", ms(p.p50), ms(p.p99));
    };
    row("engine directly", &r.direct_us);
    row("through intercept (tokens)", &r.through_us);
    println!("| ratio | {:.3}x | {:.3}x |", r.ratio_p50(), r.ratio_p99());
    row("added per call", &r.added_us);
    row("added, first turns (rendered)", &r.added_rendered_us);
    row("added, other turns (bridged)", &r.added_bridged_us);
    Ok(())
}
