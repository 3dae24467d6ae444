//! `bench-write`: what appending trace lines costs on this machine, with no proxy around
//! it (see [`intercept_bench::write_cost`]). Appends `--lines` lines of `--line-bytes`
//! bytes round-robin to `--files` new files in `--dir` (`--lines-per-write` at a time),
//! removes the files, and prints one JSON line: a
//! [`WriteCost`](intercept_bench::write_cost::WriteCost), `{"lines", "line_bytes",
//! "files", "lines_per_write", "user_us_per_line", "system_us_per_line",
//! "wall_us_per_line", "hints"}`.

// Measuring programs: they time real work on the process's clock, in and out of
// runtimes.
#![allow(clippy::disallowed_types)]

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::Parser;
use intercept_bench::write_cost::{measure, WriteCostConfig, PAGE_CACHE_HINT_EVERY};

/// The cost of appending trace lines, without a proxy.
#[derive(Debug, Parser)]
struct Args {
    /// A folder of its own for the files (created; removed at the end).
    #[arg(long)]
    dir: PathBuf,
    /// Files written in turn.
    #[arg(long, default_value_t = WriteCostConfig::FILES)]
    files: usize,
    /// Bytes per line, its newline included.
    #[arg(long, default_value_t = WriteCostConfig::LINE_BYTES)]
    line_bytes: usize,
    /// Lines written in all.
    #[arg(long, default_value_t = WriteCostConfig::LINES)]
    lines: u64,
    /// Lines appended to a file by one `write`.
    #[arg(long, default_value_t = 1)]
    lines_per_write: usize,
    /// Bytes appended to a file between two page-cache hints (0: none); the sidecar's
    /// by default.
    #[arg(long, default_value_t = PAGE_CACHE_HINT_EVERY)]
    hint_every: u64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let config = WriteCostConfig {
        files: args.files,
        line_bytes: args.line_bytes,
        lines: args.lines,
        lines_per_write: args.lines_per_write,
        hint_every: args.hint_every,
        ..WriteCostConfig::new(&args.dir)
    };
    let cost = measure(&config);
    let removed = std::fs::remove_dir_all(&args.dir);
    let cost = cost.with_context(|| format!("appending lines in {}", args.dir.display()))?;
    removed.with_context(|| format!("removing {}", args.dir.display()))?;
    println!("{}", serde_json::to_string(&cost)?);
    Ok(())
}
