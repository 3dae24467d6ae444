//! `cargo xtask`: the one automation entry point of the intercept workspace. CI runs
//! `cargo xtask ci`; see the library docs for what each task does.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

/// Project automation for intercept.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", version, about)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Run every CI check in order: fmt, clippy, tests, doctests, tidy. Stops at the
    /// first failure and names the step.
    Ci(CiArgs),
    /// Check the layering and hygiene rules (listed in docs/architecture.md).
    Tidy,
    /// Rewrite the settings table of docs/configuration.md from the settings of
    /// `intercept serve` (tidy fails while the committed table differs).
    ConfigDocs,
    /// Run the demo on the embedded mock model (release build); extra arguments go to
    /// `intercept demo`.
    Demo(PassThrough),
    /// Load benchmark: direct vs intercept vs nginx, scale figures, JSON under
    /// target/bench/. With --micro, the criterion micro-benchmarks instead (extra
    /// arguments go to `cargo bench`).
    Bench(BenchArgs),
}

#[derive(Debug, Args)]
struct CiArgs {
    /// Run the tests with `cargo test` even when cargo-nextest is installed.
    #[arg(long)]
    no_nextest: bool,
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// A short smoke run (a few seconds per case).
    #[arg(long)]
    quick: bool,
    /// Also run the slow-stream ramp: 1000, 2500, 5000 and 10,000 concurrent slow streams,
    /// direct, through intercept and through nginx (about 6 minutes more).
    #[arg(long)]
    scale: bool,
    /// Run only the slow-stream ramp, at these concurrencies (e.g. 1000,2500,5000,10000);
    /// with --scale, the ramp of the full run uses them.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    streams: Option<Vec<usize>>,
    /// Skip nginx even when it is installed.
    #[arg(long)]
    no_nginx: bool,
    /// Use the release binaries already built.
    #[arg(long)]
    no_build: bool,
    /// Rounds per load case, targets measured in turn in each (default: 1 with --quick,
    /// else 3); the median round of each target is reported.
    #[arg(long)]
    rounds: Option<usize>,
    /// Run the criterion micro-benchmarks (`cargo bench --workspace`) instead.
    #[arg(long)]
    micro: bool,
    /// Time to seat 1,000 rollouts on an elastic pool whose tunnels take 1 s to start,
    /// against a serial grow-under-one-lock baseline (simulated time), instead.
    #[arg(long)]
    pool: bool,
    /// With --micro: arguments passed to `cargo bench`.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<OsString>,
}

#[derive(Debug, Args)]
struct PassThrough {
    /// Arguments passed through unchanged.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<OsString>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let root = xtask::workspace_root();
    let result = match cli.task {
        Task::Ci(args) => xtask::ci(
            &root,
            &xtask::CiOptions {
                no_nextest: args.no_nextest,
            },
        ),
        Task::Tidy => xtask::tidy::run(&root),
        Task::ConfigDocs => xtask::config_docs::write(&root),
        Task::Demo(p) => xtask::demo(&root, &p.args),
        Task::Bench(b) if b.micro => xtask::bench(&root, &b.args),
        Task::Bench(b) if b.pool => xtask::bench_pool(&root),
        Task::Bench(b) => xtask::benchmark(
            &root,
            &xtask::BenchOptions {
                quick: b.quick,
                scale: b.scale,
                streams: b.streams,
                no_nginx: b.no_nginx,
                no_build: b.no_build,
                rounds: b.rounds,
            },
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
