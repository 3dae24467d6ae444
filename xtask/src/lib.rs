//! Project automation for intercept, run as `cargo xtask <task>` (the alias lives in
//! `.cargo/config.toml`). This library holds the tasks so that tests can call them too.
//!
//! - [`ci()`]: fmt check, clippy with warnings denied, unused dependencies
//!   (cargo-machete), the build without TLS, the test suite, doctests, tidy.
//! - [`tidy`]: the mechanical checks of the layering and hygiene rules
//!   (`docs/architecture.md` says why each rule exists).
//! - [`benchmark()`]: the load benchmark (`cargo xtask bench`): builds
//!   `intercept-bench` and `intercept-cli` in release mode and runs the `benchmark`
//!   program (direct vs `bench-proxy` vs `intercept serve` vs nginx, the growth case,
//!   scale figures, `target/bench/results.json`).
//! - [`demo()`], [`bench()`] and [`bench_pool()`]: thin wrappers over `cargo run`,
//!   `cargo bench` (`cargo xtask bench --micro`, the criterion micro-benchmarks) and
//!   `cargo test` (`cargo xtask bench --pool`, the pool seating measurement).
//!
//! ```no_run
//! // What `cargo xtask tidy` does, callable from a test:
//! let root = xtask::workspace_root();
//! let violations = xtask::tidy::check(&root)?;
//! assert!(violations.is_empty(), "{violations:?}");
//! # Ok::<(), anyhow::Error>(())
//! ```

// A build tool timing its steps, with no runtime: the process's clock.
#![allow(clippy::disallowed_types)]

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};

pub mod config_docs;
pub mod tidy;

/// The workspace root (the folder that holds the root `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    let xtask_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    xtask_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| xtask_dir.to_path_buf())
}

/// A `cargo` command: the cargo that runs us (`$CARGO`, set by `cargo run` and
/// `cargo test`) so the pinned toolchain is used throughout, else `cargo` from `PATH`.
pub fn cargo() -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut command = Command::new(cargo);
    // `cargo xtask` runs under `cargo run`, which sets the package's variables for it
    // (`CARGO_PKG_*`, `CARGO_MANIFEST_DIR`, ...). The cargo started here gets the
    // environment the shell gave `cargo xtask`, without them: cargo-machete reads
    // `CARGO_PKG_NAME` as a sign that cargo did not invoke it as a subcommand (and then
    // takes its own name and flags for paths), and a build script that watches one of
    // them (ring watches `CARGO_MANIFEST_DIR` and `CARGO_PKG_*`) would otherwise run again,
    // and rebuild what depends on it, whenever a build outside xtask (the Python wheel's)
    // follows one inside it.
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(set_by_cargo_run) {
            command.env_remove(key);
        }
    }
    command
}

/// Whether `cargo run` sets the variable `key` for the program it runs (beside `CARGO`,
/// which [`cargo()`] reads and cargo sets again for whatever it runs).
fn set_by_cargo_run(key: &str) -> bool {
    key.starts_with("CARGO_PKG_")
        || matches!(
            key,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
        )
}

/// Options of [`ci()`].
#[derive(Debug, Clone, Default)]
pub struct CiOptions {
    /// Run the tests with `cargo test` even when cargo-nextest is installed.
    pub no_nextest: bool,
}

/// One step of [`ci()`]: a command whose output is streamed, or tidy run in-process.
#[derive(Debug)]
enum StepKind {
    Cargo(Vec<&'static str>),
    Tidy,
}

#[derive(Debug)]
struct Step {
    name: &'static str,
    kind: StepKind,
}

impl Step {
    fn cargo(name: &'static str, args: &[&'static str]) -> Self {
        Step {
            name,
            kind: StepKind::Cargo(args.to_vec()),
        }
    }

    fn describe(&self) -> String {
        match &self.kind {
            StepKind::Cargo(args) => format!("cargo {}", args.join(" ")),
            StepKind::Tidy => "cargo xtask tidy (in-process)".to_owned(),
        }
    }
}

/// Whether `cargo nextest` is installed.
pub fn has_nextest() -> bool {
    has_cargo_tool("nextest")
}

/// Whether `cargo <tool> --version` works (the tool is installed).
fn has_cargo_tool(tool: &str) -> bool {
    cargo()
        .args([tool, "--version"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs every check CI runs, in order, streaming each command's output and stopping at
/// the first failure:
///
/// 1. `fmt`: `cargo fmt --all --check`
/// 2. `clippy`: `cargo clippy --workspace --all-targets --locked -- -D warnings`
/// 3. `machete`: `cargo machete`, which fails on a declared but unused dependency
///    (skipped with a note when cargo-machete is not installed, except under CI, where
///    `.ci/run` installs it)
/// 4. `no-tls`: `cargo check -p intercept-pool --no-default-features --locked`, which
///    builds the pool, the server and the tunnels without their `tls` feature
/// 5. `test`: `cargo nextest run --workspace --locked` when cargo-nextest is installed,
///    else `cargo test --workspace --locked`
/// 6. `doctest`: `cargo test --workspace --doc --locked` (only after nextest, which
///    does not run doctests; `cargo test` already ran them in step 5)
/// 7. `tidy`: [`tidy::run`]
///
/// The error names the step that failed.
pub fn ci(root: &Path, options: &CiOptions) -> Result<()> {
    let nextest = !options.no_nextest && has_nextest();
    let mut steps = vec![
        Step::cargo("fmt", &["fmt", "--all", "--check"]),
        Step::cargo(
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--locked",
                "--",
                "-D",
                "warnings",
            ],
        ),
    ];
    if has_cargo_tool("machete") {
        steps.push(Step::cargo("machete", &["machete"]));
    } else if std::env::var_os("CI").is_some() {
        bail!("cargo-machete is not installed (CI requires it: `cargo install cargo-machete --locked`)");
    } else {
        println!(
            "xtask ci: cargo-machete is not installed; unused dependencies are not checked \
             (`cargo install cargo-machete --locked`)"
        );
    }
    steps.push(Step::cargo(
        "no-tls",
        &[
            "check",
            "-p",
            "intercept-pool",
            "--no-default-features",
            "--locked",
        ],
    ));
    if nextest {
        steps.push(Step::cargo(
            "test",
            &["nextest", "run", "--workspace", "--locked"],
        ));
        steps.push(Step::cargo(
            "doctest",
            &["test", "--workspace", "--doc", "--locked"],
        ));
    } else {
        if !options.no_nextest {
            println!("xtask ci: cargo-nextest is not installed; the tests run with cargo test");
        }
        steps.push(Step::cargo("test", &["test", "--workspace", "--locked"]));
    }
    steps.push(Step {
        name: "tidy",
        kind: StepKind::Tidy,
    });

    let total = steps.len();
    let started = Instant::now();
    let mut timings = Vec::with_capacity(total);
    for (i, step) in steps.iter().enumerate() {
        println!(
            "\n==> ci [{}/{total}] {}: {}",
            i + 1,
            step.name,
            step.describe()
        );
        let t = Instant::now();
        let result = match &step.kind {
            StepKind::Cargo(args) => {
                let mut cmd = cargo();
                cmd.args(args).current_dir(root);
                run_streaming(&mut cmd)
            }
            StepKind::Tidy => tidy::run(root),
        };
        let took = t.elapsed();
        if let Err(e) = result {
            print_timings(&timings);
            bail!(
                "ci failed at step `{}` ({}) after {}: {e:#}",
                step.name,
                step.describe(),
                secs(took)
            );
        }
        println!(
            "==> ci [{}/{total}] {} passed in {}",
            i + 1,
            step.name,
            secs(took)
        );
        timings.push((step.name, took));
    }
    print_timings(&timings);
    println!("ci passed in {}", secs(started.elapsed()));
    Ok(())
}

fn print_timings(timings: &[(&str, Duration)]) {
    if timings.is_empty() {
        return;
    }
    println!("\nci step timings:");
    for (name, took) in timings {
        println!("  {name:<8} {:>9}", secs(*took));
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// Runs the release demo: `cargo run --release -p intercept-cli --bin intercept -- demo
/// <args>`, with the terminal attached.
pub fn demo(root: &Path, args: &[OsString]) -> Result<()> {
    let mut cmd = cargo();
    cmd.args([
        "run",
        "--release",
        "-p",
        "intercept-cli",
        "--bin",
        "intercept",
        "--",
        "demo",
    ])
    .args(args)
    .current_dir(root);
    run_streaming(&mut cmd).context("the demo failed")
}

/// The load benchmark: builds `intercept-bench`'s programs and the `intercept` binary in
/// release mode (unless `no_build`) and runs its `benchmark` program with `args` (its options, which it
/// declares and checks), which starts the others from the same folder (see
/// `crates/intercept-bench/src/bin/benchmark/main.rs`).
pub fn benchmark(root: &Path, no_build: bool, args: &[OsString]) -> Result<()> {
    let meta = metadata(root)?;
    let target_dir = meta
        .get("target_directory")
        .and_then(serde_json::Value::as_str)
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    if !no_build {
        let mut cmd = cargo();
        // The bench programs, and the `intercept` binary that is one of the targets.
        cmd.args([
            "build",
            "--release",
            "-p",
            "intercept-bench",
            "-p",
            "intercept-cli",
            "--bins",
        ])
        .current_dir(root);
        run_streaming(&mut cmd).context("building the bench programs failed")?;
    }
    let program = target_dir.join("release").join("benchmark");
    let mut cmd = Command::new(&program);
    cmd.args(args).current_dir(root);
    run_streaming(&mut cmd).with_context(|| format!("{} failed", program.display()))
}

/// `cargo xtask bench --pool`: the pool seating measurement (elastic pool against a
/// serial baseline, fake 1 s tunnel starts, simulated time), printed as a table.
pub fn bench_pool(root: &Path) -> Result<()> {
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--release",
        "--locked",
        "-p",
        "intercept-pool",
        "--test",
        "pool_seat",
        "--",
        "--nocapture",
    ])
    .current_dir(root);
    run_streaming(&mut cmd).context("the pool seating measurement failed")
}

/// Runs `cargo bench --workspace <args>` and says where the results went.
///
/// This runs whatever benchmark targets the crates declare (criterion writes its
/// reports under `<target-dir>/criterion/`). The load test of a running server is
/// [`benchmark()`].
pub fn bench(root: &Path, args: &[OsString]) -> Result<()> {
    let meta = metadata(root)?;
    let benches = bench_targets(&meta);
    if benches.is_empty() {
        println!(
            "xtask bench: no crate declares a benchmark target yet; `cargo bench` will \
             only build the libraries in the bench profile and run their (empty) bench \
             harnesses."
        );
    } else {
        println!("xtask bench: benchmark targets: {}", benches.join(", "));
    }
    let mut cmd = cargo();
    cmd.args(["bench", "--workspace"])
        .args(args)
        .current_dir(root);
    run_streaming(&mut cmd).context("cargo bench failed")?;
    let target_dir = meta
        .get("target_directory")
        .and_then(serde_json::Value::as_str)
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let criterion = target_dir.join("criterion");
    if criterion.is_dir() {
        println!(
            "xtask bench: criterion results are in {} (HTML report: {})",
            criterion.display(),
            criterion.join("report").join("index.html").display()
        );
    } else {
        println!(
            "xtask bench: no criterion results were written (criterion would write them \
             to {}); the numbers above are all there is",
            criterion.display()
        );
    }
    Ok(())
}

/// `package/target` names of every benchmark target in the workspace.
fn bench_targets(meta: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for pkg in packages(meta) {
        let name = pkg.get("name").and_then(|v| v.as_str()).unwrap_or("?");
        for target in pkg
            .get("targets")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
        {
            let is_bench = target
                .get("kind")
                .and_then(|k| k.as_array())
                .is_some_and(|k| k.iter().any(|k| k == "bench"));
            if is_bench {
                let t = target.get("name").and_then(|v| v.as_str()).unwrap_or("?");
                out.push(format!("{name}/{t}"));
            }
        }
    }
    out
}

/// `cargo metadata --no-deps` of the workspace, parsed.
pub(crate) fn metadata(root: &Path) -> Result<serde_json::Value> {
    let out = capture(
        cargo()
            .args(["metadata", "--no-deps", "--format-version", "1"])
            .current_dir(root),
    )?;
    serde_json::from_str(&out).context("cargo metadata printed something that is not JSON")
}

/// The workspace members' package objects of a `cargo metadata` document.
pub(crate) fn packages(meta: &serde_json::Value) -> impl Iterator<Item = &serde_json::Value> {
    meta.get("packages")
        .and_then(|p| p.as_array())
        .into_iter()
        .flatten()
}

/// Runs a command with the terminal's stdout and stderr; fails unless it exits 0.
fn run_streaming(cmd: &mut Command) -> Result<()> {
    let line = command_line(cmd);
    let status = cmd
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("could not start `{line}`"))?;
    check_status(status, &line)
}

/// Runs a command and returns its stdout; on failure the error carries its stderr.
pub(crate) fn capture(cmd: &mut Command) -> Result<String> {
    let line = command_line(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start `{line}`"))?;
    if !out.status.success() {
        bail!(
            "`{line}` failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("`{line}` printed invalid UTF-8"))
}

fn check_status(status: ExitStatus, line: &str) -> Result<()> {
    if status.success() {
        Ok(())
    } else {
        bail!("`{line}` failed ({status})")
    }
}

fn command_line(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program())
        .file_name()
        .unwrap_or(OsStr::new("?"))
        .to_string_lossy()
        .into_owned();
    std::iter::once(program)
        .chain(cmd.get_args().map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variables_cargo_run_sets_for_xtask_are_not_passed_on() {
        for key in [
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_CRATE_NAME",
            "CARGO_BIN_NAME",
        ] {
            assert!(set_by_cargo_run(key), "{key}");
        }
        for key in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "PATH",
        ] {
            assert!(!set_by_cargo_run(key), "{key}");
        }
    }

    #[test]
    fn command_line_names_the_program_without_its_folder() {
        let mut cmd = Command::new("/opt/bin/cargo");
        cmd.args(["fmt", "--all"]);
        assert_eq!(command_line(&cmd), "cargo fmt --all");
    }

    #[test]
    fn bench_targets_are_listed_from_metadata() {
        let meta = serde_json::json!({"packages": [
            {"name": "a", "targets": [{"name": "a", "kind": ["lib"]}, {"name": "hot", "kind": ["bench"]}]},
            {"name": "b", "targets": [{"name": "b", "kind": ["bin"]}]}
        ]});
        assert_eq!(bench_targets(&meta), vec!["a/hot".to_owned()]);
    }

    #[test]
    fn workspace_root_holds_the_root_manifest() {
        let root = workspace_root();
        assert!(root.join("Cargo.toml").is_file());
        assert!(root.join("xtask").join("Cargo.toml").is_file());
    }
}
