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
    /// `intercept serve` (intercept-cli's `config_docs` test fails while the committed
    /// table differs).
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
    /// Use the release binaries already built.
    #[arg(long)]
    no_build: bool,
    /// Run the criterion micro-benchmarks (`cargo bench --workspace`) instead.
    #[arg(long)]
    micro: bool,
    /// Time to seat 1,000 rollouts on an elastic pool whose tunnels take 1 s to start,
    /// against a serial grow-under-one-lock baseline (simulated time), instead.
    #[arg(long)]
    pool: bool,
    /// The load benchmark's own options, passed on to `intercept-bench`'s `benchmark`
    /// program, which declares them: `--quick`, `--agentic`, `--scale`, `--streams N,N,..`,
    /// `--no-nginx`, `--rounds N`, `--growth-secs S` (see `cargo xtask bench --
    /// --help`). With --micro: arguments passed to `cargo bench`.
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
        Task::Bench(b) => {
            let (no_build, args) = own_flag(b.no_build, b.args, "--no-build");
            xtask::benchmark(&root, no_build, &args)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Takes xtask's own `flag` out of the arguments passed on, also where it follows the
/// first of them (`cargo xtask bench --quick --no-build`).
fn own_flag(set: bool, args: Vec<OsString>, flag: &str) -> (bool, Vec<OsString>) {
    let before = args.len();
    let rest: Vec<OsString> = args.into_iter().filter(|a| a != flag).collect();
    (set || rest.len() != before, rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench(line: &[&str]) -> (bool, Vec<OsString>) {
        let cli = Cli::try_parse_from(["xtask", "bench"].iter().chain(line)).unwrap();
        let Task::Bench(b) = cli.task else {
            panic!("not bench: {:?}", cli.task)
        };
        own_flag(b.no_build, b.args, "--no-build")
    }

    #[test]
    fn the_benchmark_options_pass_through_and_no_build_is_taken_anywhere() {
        let os = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(bench(&[]), (false, vec![]));
        assert_eq!(
            bench(&["--quick", "--rounds", "2", "--streams", "1000,2500"]),
            (
                false,
                os(&["--quick", "--rounds", "2", "--streams", "1000,2500"])
            )
        );
        assert_eq!(
            bench(&["--no-build", "--no-nginx"]),
            (true, os(&["--no-nginx"]))
        );
        assert_eq!(bench(&["--scale", "--no-build"]), (true, os(&["--scale"])));
    }
}
