//! `benchmark`: the load benchmark, side by side in one run. Run it as `cargo xtask
//! bench [OPTIONS]`, which builds this crate's binaries in release mode and starts this
//! one from the same folder; run directly it expects its sibling programs next to it.
//!
//! It starts `bench-upstream` (the fast mock
//! model), `bench-proxy` (an interception server with many sessions whose records are
//! counted and dropped), the `intercept` binary as a user runs it (`intercept serve
//! --trace-dir`, sessions made through its control API, a fresh one per case: see
//! `sidecar.rs`) and, when `nginx` is on `PATH`, an nginx `proxy_pass` with upstream
//! keepalive (config, pid file and logs under `target/bench/nginx/`, one worker). Then
//! it runs `loadgen` with the same load against each target: direct to the upstream,
//! through `bench-proxy`, through `intercept serve`, through nginx; non-streaming at 1,
//! 16 and 64 connections and streaming (16 chunks) at 16 connections, spread over 1000
//! session secrets. With `taskset` the proxy (`bench-proxy`, `intercept serve` or
//! nginx) runs on core 0 and the load generator and upstream on core 1; `--unpinned`
//! pins nothing (nginx then runs a worker per core, as the intercept binaries run an
//! event loop per core).
//!
//! It reads the proxy's CPU time (`/proc/<pid>/stat` utime + stime, nginx's master and
//! worker summed) around each run, checks that the upstream received exactly as many
//! requests as completed and that the proxies recorded as many calls (`intercept
//! serve`: in its sessions and as lines of its trace files), prints a table with ratios
//! to direct and to nginx, evaluates the targets and writes everything to
//! `target/bench/results.json`.
//!
//! The growth case runs `intercept serve --trace-dir` under the json c16 load for 60 s
//! (`--growth-secs`; 12 s with `--quick`) and compares the req/s of its first and last
//! 10 s, or thirds of a shorter run (loadgen's per-second counts), and its RSS growth per
//! recorded call with the request and response bytes of a call; it also reports the
//! sidecar's CPU per request by thread over both windows.
//!
//! Then the floor under recording (`floor.rs`): `bench-write` appends the json c16
//! case's mean trace line to as many files as there are sessions, with no proxy,
//! pinned like the proxies; its CPU per line is set beside nginx's CPU per request and
//! the recording group's CPU goal.
//!
//! Scale figures follow: memory and acquire/release time per registered session (100k
//! sessions, `bench-scale`), peak RSS while proxying one 256 MiB request body, and with
//! `--scale` the slow-stream ramp: 1000 to 10,000 concurrent slow streams (200 chunks
//! 50 ms apart) direct, through intercept and through nginx, on a rig of its own (see
//! `streams.rs`). `--streams 1000,2500,…` runs only the ramp, at those points.
//!
//! `cargo xtask bench --micro` (the criterion micro-benchmarks) and `--pool` (the pool
//! seating measurement) are cargo commands that xtask runs itself.

// Measuring programs: they time real work on the process's clock, in and out of
// runtimes.
#![allow(clippy::disallowed_types)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use clap::Parser;
use intercept_bench::growth::{self, Growth};
use intercept_bench::load::Intervals;
use intercept_bench::procfs;
use serde_json::{json, Value};

mod agentic;
mod floor;
mod sidecar;
mod streams;

use sidecar::Sidecar;

/// The load benchmark: direct vs intercept vs nginx, scale figures, JSON under
/// target/bench/ (usually run as `cargo xtask bench`, whose options these are).
#[derive(Debug, Clone, Default, Parser)]
#[command(name = "benchmark", version, about)]
struct BenchOptions {
    /// A few seconds per case instead of 10 (a smoke run).
    #[arg(long)]
    quick: bool,
    /// Also run the slow-stream ramp at 1000, 2500, 5000 and 10,000 streams (or at
    /// `--streams`).
    #[arg(long)]
    scale: bool,
    /// Run the slow-stream ramp at these concurrencies (alone, unless `--scale`).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    streams: Option<Vec<usize>>,
    /// Run only the agentic case (40-turn tool loops against direct, `intercept serve
    /// --trace-dir` and nginx); a full run includes it after the load cases.
    #[arg(long)]
    agentic: bool,
    /// Skip nginx even when it is installed.
    #[arg(long)]
    no_nginx: bool,
    /// Pin nothing: the proxies, the load generator and the upstream share every core
    /// (`intercept serve` and `bench-proxy` then run an event loop per core, nginx
    /// `worker_processes auto`). By default, with `taskset`, the proxy runs alone on core
    /// 0 and the rig on core 1.
    #[arg(long)]
    unpinned: bool,
    /// A folder with another build's `intercept` binary (an earlier commit's
    /// `target/release`, copied aside): it runs as one more target of the load and
    /// agentic cases, `intercept-serve-before`, in the same rounds, so that a change is
    /// measured before and after in one run.
    #[arg(long, value_name = "DIR")]
    before: Option<PathBuf>,
    /// Rounds per load case (default: 1 quick, 3 full). Each round runs every target for
    /// its share of the case's time, targets one after another, so a slow spell of a
    /// shared machine hits all of them; each target's median round (by req/s) is
    /// reported.
    #[arg(long)]
    rounds: Option<usize>,
    /// Length of the growth case (`intercept serve --trace-dir` under json c16 load),
    /// in seconds (default: 60, 12 with `--quick`; 0 skips it).
    #[arg(long)]
    growth_secs: Option<f64>,
}

fn main() -> std::process::ExitCode {
    match run(&BenchOptions::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Sessions registered on the proxy; the load is spread over all of them.
const SESSIONS: usize = 1000;
/// Request body size of the load (a small chat request).
const BODY_BYTES: usize = 2048;

/// The in-process proxy whose sessions count records and drop them.
const PROXY: &str = "bench-proxy";
/// The `intercept` binary as users run it, with a trace folder.
const SERVE: &str = "intercept-serve";
/// The recording group's goal for `intercept serve --trace-dir`'s CPU per request, as a
/// multiple of nginx's.
const SERVE_CPU_GOAL: f64 = 1.25;
/// `intercept serve --trace-dir` of the build given by `--before`.
const BEFORE: &str = "intercept-serve-before";
/// The targets of every load case, in the order of the table.
const MODES: [&str; 5] = ["direct", PROXY, SERVE, BEFORE, "nginx"];

/// One load case.
#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    stream: bool,
    connections: usize,
}

const CASES: &[Case] = &[
    Case {
        name: "json c1",
        stream: false,
        connections: 1,
    },
    Case {
        name: "json c16",
        stream: false,
        connections: 16,
    },
    Case {
        name: "json c64",
        stream: false,
        connections: 64,
    },
    Case {
        name: "stream c16",
        stream: true,
        connections: 16,
    },
];

/// A helper process with the bench control protocol (ready line, `stats` on stdin).
struct Helper {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    ready: Value,
}

impl std::fmt::Debug for Helper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Helper")
            .field("name", &self.name)
            .field("pid", &self.child.id())
            .finish()
    }
}

impl Helper {
    fn spawn(name: &str, mut cmd: Command) -> Result<Helper> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("{name} has no stdout"))?;
        let mut helper = Helper {
            name: name.to_owned(),
            child,
            stdin,
            stdout: BufReader::new(stdout),
            ready: Value::Null,
        };
        helper.ready = helper.read_line()?;
        Ok(helper)
    }

    fn read_line(&mut self) -> Result<Value> {
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("{} exited before answering", self.name);
        }
        serde_json::from_str(&line).with_context(|| format!("{} printed `{line}`", self.name))
    }

    fn stats(&mut self) -> Result<Value> {
        self.command("stats")
    }

    /// Sends one command line and reads the one-line JSON answer.
    fn command(&mut self, command: &str) -> Result<Value> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("{} has no stdin", self.name))?;
        stdin.write_all(command.as_bytes())?;
        stdin.write_all(b"\n")?;
        stdin.flush()?;
        self.read_line()
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn field(&self, key: &str) -> Result<String> {
        self.ready
            .get(key)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("{} did not say its {key}: {}", self.name, self.ready))
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        // Closing stdin asks it to stop; kill in case it does not.
        drop(self.stdin.take());
        reap(&mut self.child, Duration::from_secs(3));
    }
}

/// Waits up to `within` for a child asked to stop, then kills it; either way it is reaped.
fn reap(child: &mut Child, within: Duration) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// nginx in the foreground (`daemon off`), owned by this value.
#[derive(Debug)]
struct Nginx {
    child: Child,
    url: String,
    prefix: PathBuf,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // `-s stop` makes the master stop its worker too (a killed master would leave the
        // worker behind); kill the master only if that did not work.
        let conf = self.prefix.join("nginx.conf");
        let _ = Command::new("nginx")
            .arg("-p")
            .arg(&self.prefix)
            .arg("-c")
            .arg(&conf)
            .args(["-s", "stop"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        reap(&mut self.child, Duration::from_secs(5));
    }
}

/// Everything a run needs to start programs.
#[derive(Debug)]
struct Env {
    bin: PathBuf,
    out: PathBuf,
    taskset: bool,
    rounds: usize,
    quick: bool,
    /// The `intercept` binary of `--before`, when given.
    before: Option<PathBuf>,
}

impl Env {
    /// A command for one of the bench binaries, pinned to `core` when taskset exists.
    fn command(&self, program: &str, core: u32) -> Command {
        self.command_at(&self.bin.join(program), core)
    }

    /// A command for the program at `path`, pinned to `core` when taskset exists.
    fn command_at(&self, path: &Path, core: u32) -> Command {
        let path = path.to_path_buf();
        if self.taskset {
            let mut cmd = Command::new("taskset");
            cmd.arg("-c").arg(core.to_string()).arg(path);
            cmd
        } else {
            Command::new(path)
        }
    }

    fn upstream(&self, extra: &[&str]) -> Result<Helper> {
        let mut cmd = self.command("bench-upstream", 1);
        cmd.args(extra);
        Helper::spawn("bench-upstream", cmd)
    }

    fn proxy(&self, upstream: &str, sessions: usize, record: &str, tag: &str) -> Result<Helper> {
        self.proxy_with(upstream, sessions, record, tag, &[])
    }

    fn proxy_with(
        &self,
        upstream: &str,
        sessions: usize,
        record: &str,
        tag: &str,
        extra: &[String],
    ) -> Result<Helper> {
        let mut cmd = self.command("bench-proxy", 0);
        cmd.args(extra);
        let secrets = self.out.join(format!("secrets-{tag}.json"));
        cmd.args(["--upstream", upstream, "--record", record])
            .arg("--sessions")
            .arg(sessions.to_string())
            .arg("--secrets-file")
            .arg(&secrets);
        Helper::spawn("bench-proxy", cmd)
    }

    /// Runs loadgen to the end and parses its report.
    fn loadgen(&self, args: &[String]) -> Result<Value> {
        finish_loadgen(self.start_loadgen(args)?)
    }

    /// Starts loadgen; [`finish_loadgen`] waits for it and parses its report.
    fn start_loadgen(&self, args: &[String]) -> Result<Child> {
        let mut cmd = self.command("loadgen", 1);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        cmd.spawn().context("cannot run loadgen")
    }

    /// Measured and warmup seconds of one round of one target.
    fn durations(&self) -> (f64, f64) {
        let (total, warmup) = if self.quick { (2.0, 0.5) } else { (10.0, 2.0) };
        let rounds = self.rounds.max(1) as f64;
        (total / rounds, (warmup / rounds).max(0.5))
    }
}

/// Waits for a loadgen started by [`Env::start_loadgen`] (it stops by itself after its
/// requests or its time) and parses its report.
fn finish_loadgen(child: Child) -> Result<Value> {
    let out = child.wait_with_output().context("cannot run loadgen")?;
    if !out.status.success() {
        bail!("loadgen failed ({})", out.status);
    }
    serde_json::from_slice(&out.stdout).context("loadgen printed something that is not JSON")
}

fn has_program(name: &str, arg: &str) -> bool {
    Command::new(name)
        .arg(arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn wait_for_port(port: u16, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("nothing listens on 127.0.0.1:{port} after {within:?}")
}

/// What differs between the nginx of the load cases and that of the slow streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct NginxTuning {
    /// Idle upstream connections the worker keeps (`keepalive` of the upstream block).
    keepalive: usize,
    /// Listen for h2c (HTTP/2 with prior knowledge) instead of HTTP/1.1.
    http2: bool,
}

impl NginxTuning {
    /// The load cases: HTTP/1.1, 256 idle upstream connections.
    const LOAD: NginxTuning = NginxTuning {
        keepalive: 256,
        http2: false,
    };
}

/// nginx's `worker_processes`: one on its pinned core, else one per core (`auto`).
fn nginx_workers(pinned: bool) -> &'static str {
    if pinned {
        "1"
    } else {
        "auto"
    }
}

/// The nginx configuration: one worker, upstream keepalive, no buffering of responses
/// (so streams flow event by event, as intercept relays them).
fn nginx_config(
    prefix: &Path,
    listen: u16,
    upstream: &str,
    tuning: NginxTuning,
    workers: &str,
) -> String {
    let p = prefix.display();
    let keepalive = tuning.keepalive;
    let http2 = if tuning.http2 { " http2" } else { "" };
    format!(
        "worker_processes {workers};\ndaemon off;\nmaster_process on;\npid {p}/nginx.pid;\n\
error_log {p}/error.log warn;\nevents {{ worker_connections 20000; }}\n\
http {{\n  access_log off;\n  client_body_temp_path {p}/client_body;\n  proxy_temp_path {p}/proxy;\n\
  fastcgi_temp_path {p}/fastcgi;\n  uwsgi_temp_path {p}/uwsgi;\n  scgi_temp_path {p}/scgi;\n\
  keepalive_requests 1000000;\n  keepalive_timeout 120s;\n  client_max_body_size 0;\n\
  client_body_buffer_size 1m;\n\
  upstream model {{\n    server {upstream};\n    keepalive {keepalive};\n    keepalive_requests 1000000;\n  }}\n\
  server {{\n    listen 127.0.0.1:{listen}{http2};\n\
    location / {{\n      proxy_pass http://model;\n      proxy_http_version 1.1;\n\
      proxy_set_header Connection \"\";\n      proxy_buffering off;\n    }}\n  }}\n}}\n"
    )
}

/// Starts nginx on core 0 with its files under `target/bench/<dir>/`.
fn start_nginx(env: &Env, upstream_addr: &str, dir: &str, tuning: NginxTuning) -> Result<Nginx> {
    let prefix = env.out.join(dir);
    std::fs::create_dir_all(&prefix)?;
    let port = free_port()?;
    let conf = prefix.join("nginx.conf");
    let workers = nginx_workers(env.taskset);
    std::fs::write(
        &conf,
        nginx_config(&prefix, port, upstream_addr, tuning, workers),
    )?;
    let mut cmd = if env.taskset {
        let mut c = Command::new("taskset");
        c.args(["-c", "0", "nginx"]);
        c
    } else {
        Command::new("nginx")
    };
    cmd.arg("-p")
        .arg(&prefix)
        .arg("-c")
        .arg(&conf)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let child = cmd.spawn().context("cannot start nginx")?;
    let nginx = Nginx {
        child,
        url: format!("http://127.0.0.1:{port}/v1/chat/completions"),
        prefix,
    };
    wait_for_port(port, Duration::from_secs(5))?;
    Ok(nginx)
}

/// CPU time of a process and its children (nginx's master and worker), in µs.
fn cpu_us(pid: u32) -> u64 {
    std::iter::once(pid)
        .chain(procfs::children(pid))
        .filter_map(procfs::cpu_time)
        .map(|d| d.as_micros() as u64)
        .sum()
}

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_f64().unwrap_or(f64::NAN)
}

/// One measured (case, target) pair.
#[derive(Debug, Clone)]
struct Row {
    case: Case,
    mode: &'static str,
    report: Value,
    cpu_us_per_req: Option<f64>,
    upstream_requests: u64,
}

/// The round with the median req/s (the lower middle one of an even count).
fn median_round<'a>(rounds: impl Iterator<Item = &'a Row>) -> Option<Row> {
    let mut v: Vec<&Row> = rounds.collect();
    v.sort_by(|a, b| a.rps().total_cmp(&b.rps()));
    v.get(v.len().saturating_sub(1) / 2).map(|r| (*r).clone())
}

impl Row {
    fn rps(&self) -> f64 {
        num(&self.report, &["rps"])
    }
    fn lat(&self, p: &str) -> f64 {
        num(&self.report, &["latency_us", p])
    }
    fn ttfb(&self, p: &str) -> f64 {
        num(&self.report, &["ttfb_us", p])
    }
    fn completed(&self) -> u64 {
        self.report["ok"].as_u64().unwrap_or(0) + self.report["errors"].as_u64().unwrap_or(0)
    }
    fn to_json(&self) -> Value {
        json!({
            "case": self.case.name,
            "mode": self.mode,
            "stream": self.case.stream,
            "connections": self.case.connections,
            "loadgen": self.report,
            "proxy_cpu_us_per_request": self.cpu_us_per_req,
            "upstream_requests": self.upstream_requests,
            "requests_completed": self.completed(),
        })
    }
}

fn measure(
    env: &Env,
    case: Case,
    mode: &'static str,
    url: &str,
    secrets: &Path,
    proxy_pid: Option<u32>,
    upstream: &mut Helper,
) -> Result<Row> {
    let (duration, warmup) = env.durations();
    let mut args = vec![
        "--url".to_owned(),
        url.to_owned(),
        "--secrets-file".to_owned(),
        secrets.display().to_string(),
        "--connections".to_owned(),
        case.connections.to_string(),
        "--duration".to_owned(),
        duration.to_string(),
        "--warmup".to_owned(),
        warmup.to_string(),
        "--body-bytes".to_owned(),
        BODY_BYTES.to_string(),
        "--timeout".to_owned(),
        "30".to_owned(),
    ];
    if case.stream {
        args.push("--stream".to_owned());
    }
    let before_up = upstream.stats()?["requests"].as_u64().unwrap_or(0);
    let before_cpu = proxy_pid.map(cpu_us);
    let report = env.loadgen(&args)?;
    let after_cpu = proxy_pid.map(cpu_us);
    let after_up = upstream.stats()?["requests"].as_u64().unwrap_or(0);
    let total = report["ok"].as_u64().unwrap_or(0).max(1);
    let cpu_us_per_req = match (before_cpu, after_cpu) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b) as f64 / total as f64),
        _ => None,
    };
    let row = Row {
        case,
        mode,
        report,
        cpu_us_per_req,
        upstream_requests: after_up - before_up,
    };
    let check = if row.upstream_requests == row.completed() {
        "ok"
    } else {
        "MISMATCH"
    };
    println!(
        "  {:<10} {:<15} {:>9.0} req/s  p50 {:>6.0} µs  p99 {:>6.0} µs  errors {}  upstream requests {} / completed {} ({check})",
        case.name,
        mode,
        row.rps(),
        row.lat("p50"),
        row.lat("p99"),
        row.report["errors"],
        row.upstream_requests,
        row.completed()
    );
    Ok(row)
}

/// Which part of the product a target measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Group {
    /// The proxy's speed and leanness, on `bench-proxy`.
    Proxy,
    /// Recording at proxy speed, on `intercept serve --trace-dir`.
    Recording,
}

impl Group {
    fn name(self) -> &'static str {
        match self {
            Group::Proxy => "proxy",
            Group::Recording => "recording",
        }
    }
}

/// One target, with its figure.
#[derive(Debug, Clone)]
struct Target {
    group: Group,
    name: String,
    goal: String,
    measured: String,
    met: Option<bool>,
}

impl Target {
    fn new(name: &str, goal: &str, measured: String, met: Option<bool>) -> Self {
        Target {
            group: Group::Proxy,
            name: name.to_owned(),
            goal: goal.to_owned(),
            measured,
            met,
        }
    }
    fn in_group(self, group: Group) -> Self {
        Target { group, ..self }
    }
    fn to_json(&self) -> Value {
        json!({"group": self.group.name(), "target": self.name, "goal": self.goal, "measured": self.measured, "met": self.met})
    }
    /// One line of the report: met, MISSED or n/a, then the figures.
    fn print(&self) {
        let mark = match self.met {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "n/a",
        };
        println!(
            "  [{mark:>6}] {:<48} goal {:<22} measured {}",
            self.name, self.goal, self.measured
        );
    }
}

/// Finds the bench programs (beside this one: `<target-dir>/release/`) and describes
/// the machine.
fn prepare(options: &BenchOptions) -> Result<(Env, bool, Value)> {
    let exe = std::env::current_exe().context("cannot tell where this program is")?;
    let bin = exe
        .parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| anyhow!("{} has no folder", exe.display()))?;
    for program in ["bench-upstream", "bench-proxy", "loadgen", "intercept"] {
        if !bin.join(program).is_file() {
            bail!(
                "{program} is not beside {} (build the bench programs first: `cargo build \
                 --release -p intercept-bench -p intercept-cli --bins`, or run `cargo xtask \
                 bench`)",
                exe.display()
            );
        }
    }
    let target_dir = bin.parent().map(Path::to_path_buf).unwrap_or(bin.clone());
    let out = target_dir.join("bench");
    std::fs::create_dir_all(&out)?;
    let env = Env {
        bin,
        out: out.clone(),
        taskset: !options.unpinned && has_program("taskset", "-V"),
        quick: options.quick,
        rounds: options
            .rounds
            .unwrap_or(if options.quick { 1 } else { 3 })
            .max(1),
        before: options.before.as_ref().map(|dir| dir.join("intercept")),
    };
    if let Some(before) = &env.before {
        if !before.is_file() {
            bail!("--before: {} is not a file", before.display());
        }
    }
    let nginx_on_path = !options.no_nginx && has_program("nginx", "-v");
    let machine = json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "cpu": cpu_model(),
        "taskset": env.taskset,
        "nginx": nginx_on_path,
        "loadavg_at_start": loadavg(),
    });
    Ok((env, nginx_on_path, machine))
}

/// `/proc/loadavg` (1, 5 and 15 minute load averages, runnable/total tasks).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Runs the load benchmark (see the module docs).
fn run(options: &BenchOptions) -> Result<()> {
    let (env, nginx_on_path, machine) = prepare(options)?;
    let out = env.out.clone();
    if let (Some(points), false) = (&options.streams, options.scale) {
        return streams::run_alone(&env, nginx_on_path, machine, points);
    }
    if options.agentic {
        return agentic_alone(&env, nginx_on_path, machine);
    }
    println!(
        "xtask bench: {} run; taskset {}; nginx {}; machine {}",
        if options.quick { "quick" } else { "full" },
        if env.taskset {
            "on (proxy on core 0, loadgen + upstream on core 1)"
        } else if options.unpinned {
            "off (--unpinned: every process on every core)"
        } else {
            "absent (no pinning)"
        },
        if nginx_on_path { "on" } else { "absent" },
        machine["cpu"]
    );

    let mut upstream = env.upstream(&["--chunks", "16"])?;
    let upstream_addr = upstream.field("addr")?;
    let upstream_base = upstream.field("base_url")?;
    let direct_url = format!("http://{upstream_addr}/v1/chat/completions");
    let mut proxy = env.proxy(&upstream_base, SESSIONS, "count", "count")?;
    let proxy_url = format!("{}/v1/chat/completions", proxy.field("base_url")?);
    let secrets = PathBuf::from(proxy.field("secrets_file")?);
    let nginx = if nginx_on_path {
        Some(start_nginx(
            &env,
            &upstream_addr,
            "nginx",
            NginxTuning::LOAD,
        )?)
    } else {
        None
    };
    let nginx_pid = nginx.as_ref().map(|n| n.child.id());

    println!(
        "\nload: {SESSIONS} sessions, {BODY_BYTES}-byte chat bodies; targets: direct, {PROXY} \
         (records counted and dropped), {SERVE} (the intercept binary with --trace-dir, \
         a fresh one per case){}",
        if nginx.is_some() { ", nginx" } else { "" }
    );
    if env.rounds > 1 {
        println!(
            "{} rounds per case, targets in turn; the median round of each is reported",
            env.rounds
        );
    }
    // Every run (for the proxied-requests checks), and the median round of each target.
    let mut all_rows: Vec<Row> = Vec::new();
    let mut rows: Vec<Row> = Vec::new();
    // What each case's `intercept serve` recorded, against what the upstream received.
    let mut serve_checks: Vec<Value> = Vec::new();
    let mut serve_recorded_all = true;
    for &case in CASES {
        let mut sidecar = Sidecar::start(&env, &upstream_base, SESSIONS, &case_tag(case))?;
        let before = match &env.before {
            Some(program) => Some(Sidecar::start_program(
                &env,
                program,
                &upstream_base,
                SESSIONS,
                &format!("{}-before", case_tag(case)),
            )?),
            None => None,
        };
        let mut rounds: Vec<Row> = Vec::new();
        for _ in 0..env.rounds {
            rounds.push(measure(
                &env,
                case,
                "direct",
                &direct_url,
                &secrets,
                None,
                &mut upstream,
            )?);
            rounds.push(measure(
                &env,
                case,
                PROXY,
                &proxy_url,
                &secrets,
                Some(proxy.pid()),
                &mut upstream,
            )?);
            rounds.push(measure(
                &env,
                case,
                SERVE,
                &sidecar.url,
                &sidecar.secrets,
                Some(sidecar.pid()),
                &mut upstream,
            )?);
            if let Some(b) = &before {
                rounds.push(measure(
                    &env,
                    case,
                    BEFORE,
                    &b.url,
                    &b.secrets,
                    Some(b.pid()),
                    &mut upstream,
                )?);
            }
            if let (Some(n), Some(pid)) = (&nginx, nginx_pid) {
                rounds.push(measure(
                    &env,
                    case,
                    "nginx",
                    &n.url,
                    &secrets,
                    Some(pid),
                    &mut upstream,
                )?);
            }
        }
        let proxied: u64 = rounds
            .iter()
            .filter(|r| r.mode == SERVE)
            .map(|r| r.upstream_requests)
            .sum();
        let recorded = sidecar.settle(proxied)?;
        let rss_kib = sidecar.rss_kib();
        drop(sidecar);
        if let Some(mut b) = before {
            let proxied: u64 = rounds
                .iter()
                .filter(|r| r.mode == BEFORE)
                .map(|r| r.upstream_requests)
                .sum();
            let recorded = b.settle(proxied)?;
            println!(
                "  {BEFORE} recorded {} calls; the upstream received {proxied} requests from                  it ({})",
                recorded.calls,
                if recorded.is(proxied) {
                    "equal"
                } else {
                    "NOT equal"
                }
            );
        }
        let equal = recorded.is(proxied);
        serve_recorded_all &= equal;
        println!(
            "  {SERVE} recorded {} calls ({} call lines in {} trace files, {:.0} bytes written \
             per call); the upstream received {proxied} requests from it ({}); RSS {:.0} MiB \
             at the end",
            recorded.calls,
            recorded.trace_lines,
            recorded.trace_files,
            recorded.bytes_per_call(),
            if equal { "equal" } else { "NOT equal" },
            rss_kib as f64 / 1024.0
        );
        let mut check = recorded.to_json();
        check["case"] = json!(case.name);
        check["upstream_requests"] = json!(proxied);
        check["rss_kib_at_end"] = json!(rss_kib);
        serve_checks.push(check);
        for mode in MODES {
            if let Some(median) = median_round(rounds.iter().filter(|r| r.mode == mode)) {
                rows.push(median);
            }
        }
        all_rows.extend(rounds);
    }
    let proxy_stats = proxy.stats()?;
    let calls = proxy_stats["calls"].as_u64().unwrap_or(0);
    let proxied: u64 = all_rows
        .iter()
        .filter(|r| r.mode == PROXY)
        .map(|r| r.upstream_requests)
        .sum();
    println!(
        "{PROXY} recorded {calls} calls; the upstream received {proxied} requests from it ({})",
        if calls == proxied {
            "equal"
        } else {
            "NOT equal"
        }
    );
    drop(proxy);
    drop(nginx);

    let agentic = agentic::run(&env, &mut upstream, nginx_on_path)?;

    // The floor under recording: the json c16 case's mean trace line, written alone.
    let floor = match serve_checks
        .iter()
        .find(|c| c["case"] == CASES[1].name)
        .and_then(floor::mean_line_bytes)
    {
        Some(line_bytes) => {
            println!("\nrecording floor: bench-write, {line_bytes}-byte lines, no proxy");
            Some(floor::measure(&env, SESSIONS, line_bytes)?)
        }
        None => None,
    };

    let growth_secs = options
        .growth_secs
        .unwrap_or(if options.quick { 12.0 } else { 60.0 });
    let growth = if growth_secs > 0.0 {
        let direct_json = find(&rows, CASES[1].name, "direct").map(|r| r.report.clone());
        Some(growth_case(
            &env,
            &upstream_base,
            &mut upstream,
            growth_secs,
            direct_json.as_ref(),
        )?)
    } else {
        None
    };

    // The ready RolloutSession keeps every call: the same json c16 load, and its memory.
    println!("\ntrace storage: json c16 through {PROXY} --record trace (RolloutSession, in-memory trace)");
    let mut trace_proxy = env.proxy(&upstream_base, SESSIONS, "trace", "trace")?;
    let trace_url = format!("{}/v1/chat/completions", trace_proxy.field("base_url")?);
    let trace_secrets = PathBuf::from(trace_proxy.field("secrets_file")?);
    let rss0 = trace_proxy.stats()?["rss_kib"].as_u64().unwrap_or(0);
    let trace_row = measure(
        &env,
        CASES[1],
        "bench-proxy+trace",
        &trace_url,
        &trace_secrets,
        Some(trace_proxy.pid()),
        &mut upstream,
    )?;
    let rss1 = trace_proxy.stats()?["rss_kib"].as_u64().unwrap_or(0);
    let trace_bytes_per_call =
        (rss1.saturating_sub(rss0) * 1024) as f64 / trace_row.completed().max(1) as f64;
    println!("  trace growth: {trace_bytes_per_call:.0} bytes of RSS per recorded call");
    drop(trace_proxy);
    drop(upstream);

    // Scale figures.
    println!("\nscale: 100,000 idle sessions (bench-scale)");
    let mut scale = Vec::new();
    for kind in ["rollout", "count"] {
        let mut cmd = env.command("bench-scale", 0);
        cmd.args(["--sessions", "100000", "--kind", kind]);
        let out = cmd.stderr(Stdio::inherit()).output()?;
        if !out.status.success() {
            bail!("bench-scale failed ({})", out.status);
        }
        let v: Value = serde_json::from_slice(&out.stdout)?;
        println!(
            "  {kind:<8} {:>6.0} bytes/session  acquire {:.2} µs  release {:.2} µs  acquire+release {:.2} µs",
            num(&v, &["bytes_per_session"]),
            num(&v, &["acquire_us"]),
            num(&v, &["release_us"]),
            num(&v, &["acquire_release_cycle_us"])
        );
        scale.push(v);
    }

    let big = big_body(&env)?;
    let streams = if options.scale {
        let points = options
            .streams
            .clone()
            .unwrap_or_else(|| streams::DEFAULT_POINTS.to_vec());
        Some(streams::ramp(&env, nginx_on_path, &points)?)
    } else {
        None
    };

    let all_equal = all_rows
        .iter()
        .all(|r| r.upstream_requests == r.completed());
    let mut targets = targets(
        &rows,
        &scale,
        &big,
        streams.as_ref(),
        all_equal && calls == proxied,
    );
    targets.extend(serve_targets(
        &rows,
        growth.as_ref().map(|g| &g.figures),
        all_equal && serve_recorded_all && growth.as_ref().is_none_or(|g| g.recorded_all),
    ));
    targets.extend(agentic.targets);
    print_table(&rows);
    for group in [Group::Proxy, Group::Recording] {
        println!(
            "\ntargets ({}{}):",
            group.name(),
            if group == Group::Recording {
                ", on intercept serve --trace-dir"
            } else {
                ", on bench-proxy"
            }
        );
        targets
            .iter()
            .filter(|t| t.group == group)
            .for_each(Target::print);
    }
    let floor_report = floor.map(|f| floor::report(&f, &rows));
    if let Some((lines, _)) = &floor_report {
        println!("\nrecording floor (what writing the trace line costs without a proxy):");
        for line in lines {
            println!("  {line}");
        }
    }
    let results = json!({
        "quick": options.quick,
        "machine": machine,
        "sessions": SESSIONS,
        "body_bytes": BODY_BYTES,
        "rounds": env.rounds,
        "rows": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
        "all_rounds": all_rows.iter().map(Row::to_json).collect::<Vec<_>>(),
        "trace": {"row": trace_row.to_json(), "rss_bytes_per_call": trace_bytes_per_call},
        "intercept_calls_recorded": calls,
        "intercept_upstream_requests": proxied,
        "serve_recorded": serve_checks,
        "growth": growth.as_ref().map(|g| g.json.clone()),
        "agentic": agentic.json,
        "recording_floor": floor_report.map(|(_, json)| json),
        "scale_sessions": scale,
        "big_body": big,
        "slow_streams": streams,
        "targets": targets.iter().map(Target::to_json).collect::<Vec<_>>(),
    });
    let path = out.join("results.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&results)?)?;
    println!("\nxtask bench: results written to {}", path.display());
    Ok(())
}

/// `--agentic`: the agentic case alone, its targets, `target/bench/agentic.json`.
fn agentic_alone(env: &Env, nginx_on_path: bool, machine: Value) -> Result<()> {
    let mut upstream = env.upstream(&["--chunks", "16"])?;
    let case = agentic::run(env, &mut upstream, nginx_on_path)?;
    println!("\ntargets (agentic, on intercept serve --trace-dir):");
    case.targets.iter().for_each(Target::print);
    let results = json!({
        "machine": machine,
        "rounds": env.rounds,
        "agentic": case.json,
        "targets": case.targets.iter().map(Target::to_json).collect::<Vec<_>>(),
    });
    let path = env.out.join("agentic.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&results)?)?;
    println!("\nxtask bench: results written to {}", path.display());
    Ok(())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Peak RSS of the proxy while it proxies one 256 MiB request body.
fn big_body(env: &Env) -> Result<Value> {
    const BODY: usize = 256 << 20;
    println!("\nscale: one 256 MiB request body through intercept");
    let mut upstream = env.upstream(&["--max-body-mib", "1024"])?;
    let mut proxy = env.proxy(&upstream.field("base_url")?, 1, "count", "big")?;
    let url = format!("{}/v1/chat/completions", proxy.field("base_url")?);
    let secrets = proxy.field("secrets_file")?;
    let before = proxy.stats()?;
    let report = env.loadgen(&[
        "--url".into(),
        url,
        "--secrets-file".into(),
        secrets,
        "--connections".into(),
        "1".into(),
        "--requests".into(),
        "1".into(),
        "--body-bytes".into(),
        BODY.to_string(),
        "--duration".into(),
        "120".into(),
        "--timeout".into(),
        "120".into(),
    ])?;
    let after = proxy.stats()?;
    let up = upstream.stats()?;
    let hwm = after["hwm_kib"].as_u64().unwrap_or(0) * 1024;
    let rss_before = before["rss_kib"].as_u64().unwrap_or(0) * 1024;
    let v = json!({
        "body_bytes": BODY,
        "ok": report["ok"],
        "latency_us": report["latency_us"]["max"],
        "rss_before_bytes": rss_before,
        "peak_rss_bytes": hwm,
        "peak_over_body": hwm as f64 / BODY as f64,
        "growth_over_body": hwm.saturating_sub(rss_before) as f64 / BODY as f64,
        "upstream_requests": up["requests"],
    });
    println!(
        "  ok {}  peak RSS {:.0} MiB = {:.2}× the body (growth {:.2}×)  in {:.2} s",
        report["ok"],
        hwm as f64 / (1 << 20) as f64,
        num(&v, &["peak_over_body"]),
        num(&v, &["growth_over_body"]),
        num(&report, &["latency_us", "max"]) / 1e6
    );
    Ok(v)
}

/// A case's name as a file name part (`json c16` → `json-c16`).
fn case_tag(case: Case) -> String {
    case.name.replace(' ', "-")
}

/// The growth case as run: its figures, everything as JSON, and whether every call
/// was proxied once and recorded.
#[derive(Debug)]
struct GrowthRun {
    figures: Growth,
    json: Value,
    recorded_all: bool,
}

/// The growth case: a fresh `intercept serve --trace-dir` under the json c16 load for
/// `secs` seconds, loadgen counting completions per second. `direct_json` (loadgen's
/// report of the json c16 case direct to the upstream) gives the response size the
/// upstream returns, for comparison with the one read through the sidecar.
fn growth_case(
    env: &Env,
    upstream_base: &str,
    upstream: &mut Helper,
    secs: f64,
    direct_json: Option<&Value>,
) -> Result<GrowthRun> {
    const INTERVAL_S: f64 = 1.0;
    let case = CASES[1];
    let window = growth::window_s(secs, INTERVAL_S);
    println!(
        "\ngrowth: {SERVE} (--trace-dir) under the {} load for {secs} s; req/s of the first \
         and last {window} s, RSS per recorded call",
        case.name
    );
    let mut sidecar = Sidecar::start(env, upstream_base, SESSIONS, "growth")?;
    let rss_start = sidecar.rss_kib();
    let args: Vec<String> = vec![
        "--url".into(),
        sidecar.url.clone(),
        "--secrets-file".into(),
        sidecar.secrets.display().to_string(),
        "--connections".into(),
        case.connections.to_string(),
        "--duration".into(),
        secs.to_string(),
        "--warmup".into(),
        "0".into(),
        "--requests".into(),
        // A bound far above what the time allows (≈ 60k req/s on the reference machine).
        ((secs * 1_000_000.0) as u64).max(1).to_string(),
        "--body-bytes".into(),
        BODY_BYTES.to_string(),
        "--timeout".into(),
        "30".into(),
        "--interval".into(),
        INTERVAL_S.to_string(),
    ];
    let before_up = upstream.stats()?["requests"].as_u64().unwrap_or(0);
    let before_cpu = cpu_us(sidecar.pid());
    // The sidecar's CPU by thread at each end of both windows.
    let mut threads = vec![procfs::thread_times(sidecar.pid())];
    let started = Instant::now();
    let loadgen = env.start_loadgen(&args)?;
    // RSS and calls at the end of the first window: the growth after it is what each
    // further call keeps, without what the first calls set up once.
    std::thread::sleep(Duration::from_secs_f64(window));
    threads.push(procfs::thread_times(sidecar.pid()));
    let mid = if started.elapsed().as_secs_f64() < secs {
        let rss = sidecar.rss_kib();
        sidecar.calls().ok().map(|calls| (rss, calls))
    } else {
        None
    };
    let last_start = Duration::from_secs_f64((secs - window).max(0.0));
    std::thread::sleep(last_start.saturating_sub(started.elapsed()));
    threads.push(procfs::thread_times(sidecar.pid()));
    // The end of the last window, before loadgen's in-flight calls drain and it exits.
    std::thread::sleep(Duration::from_secs_f64(secs).saturating_sub(started.elapsed()));
    threads.push(procfs::thread_times(sidecar.pid()));
    let report = finish_loadgen(loadgen)?;
    let after_cpu = cpu_us(sidecar.pid());
    let after_up = upstream.stats()?["requests"].as_u64().unwrap_or(0);
    let upstream_requests = after_up.saturating_sub(before_up);
    let recorded = sidecar.settle(upstream_requests)?;
    let rss_end = sidecar.rss_kib();
    drop(sidecar);

    let ok = report["ok"].as_u64().unwrap_or(0);
    let completed = ok + report["errors"].as_u64().unwrap_or(0);
    let intervals: Intervals = serde_json::from_value(report["intervals"].clone())
        .context("loadgen reported no intervals")?;
    let request_bytes = report["request_body_bytes"].as_u64().unwrap_or(0);
    let response_bytes = report["bytes_read"].as_u64().unwrap_or(0);
    let raw = growth::raw_bytes_per_call(request_bytes, response_bytes, ok).unwrap_or(f64::NAN);
    let direct_response = direct_json.and_then(|d| {
        let ok = d["ok"].as_u64().filter(|&n| n > 0)?;
        Some(d["bytes_read"].as_u64()? as f64 / ok as f64)
    });
    let figures = Growth::new(
        &intervals,
        window,
        (rss_start, rss_end),
        recorded.calls,
        raw,
    )
    .with_mid(mid);
    let recorded_all = upstream_requests == completed && recorded.is(upstream_requests);
    let cpu_us_per_req = after_cpu.saturating_sub(before_cpu) as f64 / ok.max(1) as f64;
    let ok_in = |from_end| intervals.window(window, from_end).map_or(0, |(n, _)| n);
    let (first_ok, last_ok) = (ok_in(false), ok_in(true));
    let thread_cpu = [
        growth::thread_cpu_per_request(&threads[0], &threads[1], first_ok),
        growth::thread_cpu_per_request(&threads[2], &threads[3], last_ok),
    ];
    println!(
        "  {ok} requests ({} errors) in {:.1} s; req/s per second: {}",
        report["errors"],
        num(&report, &["elapsed_s"]),
        intervals
            .ok
            .iter()
            .map(|n| format!("{:.0}", *n as f64 / intervals.width_s))
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "  first {window} s {:.0} req/s, last {window} s {:.0} req/s: {:.2}× (goal ≥ {:.2}×); \
         CPU {cpu_us_per_req:.1} µs/req",
        figures.first_rps,
        figures.last_rps,
        figures.last_over_first,
        growth::FLATNESS_GOAL
    );
    println!(
        "  RSS {:.1} MiB at start, {:.1} MiB at end: {:.0} bytes per recorded call against \
         {:.0} bytes of request ({request_bytes}) + response ({:.0}{}) body per call: {:.2}× \
         (goal ≤ {:.1}×)",
        rss_start as f64 / 1024.0,
        rss_end as f64 / 1024.0,
        figures.rss_bytes_per_call,
        raw,
        raw - request_bytes as f64,
        direct_response.map_or(String::new(), |d| format!(
            "; {d:.0} direct from the upstream"
        )),
        figures.memory_over_raw,
        growth::MEMORY_GOAL
    );
    println!(
        "  CPU µs/req by thread, first {window} s → last {window} s: {}",
        thread_cpu_lines(&thread_cpu[0], &thread_cpu[1])
    );
    println!(
        "  memory the run took: RSS +{:.0} MiB; trace files written: {:.0} MiB",
        rss_end.saturating_sub(rss_start) as f64 / 1024.0,
        recorded.trace_bytes as f64 / (1024.0 * 1024.0)
    );
    if let (Some((rss, calls)), Some(after)) = (mid, figures.after_first_window_bytes_per_call) {
        println!(
            "  after the first {window} s (RSS {:.1} MiB, {calls} calls): {after:.0} bytes per \
             further recorded call ({:.2}×)",
            rss as f64 / 1024.0,
            after / raw
        );
    }
    println!(
        "  recorded {} calls ({} lines in {} trace files); the upstream received {upstream_requests} \
         requests, loadgen completed {completed} ({})",
        recorded.calls,
        recorded.trace_lines,
        recorded.trace_files,
        if recorded_all { "equal" } else { "NOT equal" }
    );
    let json = json!({
        "case": case.name,
        "duration_s": secs,
        "figures": figures,
        "loadgen": report,
        "recorded": recorded.to_json(),
        "upstream_requests": upstream_requests,
        "requests_completed": completed,
        "proxy_cpu_us_per_request": cpu_us_per_req,
        "thread_cpu_us_per_request": {"first": thread_cpu[0], "last": thread_cpu[1]},
        "response_bytes_per_call_direct": direct_response,
    });
    Ok(GrowthRun {
        figures,
        json,
        recorded_all,
    })
}

/// `name user a → b, sys c → d` for each thread name of either window.
fn thread_cpu_lines(first: &[growth::ThreadCpu], last: &[growth::ThreadCpu]) -> String {
    let mut names: Vec<&str> = first
        .iter()
        .chain(last)
        .map(|c| c.thread.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    let get = |of: &[growth::ThreadCpu], name: &str| {
        of.iter()
            .find(|c| c.thread == name)
            .map_or((0.0, 0.0), |c| (c.user_us, c.sys_us))
    };
    names
        .iter()
        .map(|name| {
            let ((u0, s0), (u1, s1)) = (get(first, name), get(last, name));
            format!("{name} user {u0:.1} → {u1:.1}, sys {s0:.1} → {s1:.1}")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn find<'a>(rows: &'a [Row], case: &str, mode: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.case.name == case && r.mode == mode)
}

fn print_table(rows: &[Row]) {
    println!(
        "\n| case | target | req/s | p50 µs | p99 µs | TTFB p50 µs | proxy CPU µs/req | req/s ×direct | req/s ×nginx | CPU ×nginx | p99 added vs direct µs |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let direct = find(rows, r.case.name, "direct");
        let nginx = find(rows, r.case.name, "nginx");
        let ratio = |a: f64, b: Option<f64>| b.map_or("-".to_owned(), |b| format!("{:.2}", a / b));
        let cpu = r
            .cpu_us_per_req
            .map_or("-".to_owned(), |c| format!("{c:.1}"));
        let cpu_ratio = match (r.cpu_us_per_req, nginx.and_then(|n| n.cpu_us_per_req)) {
            (Some(a), Some(b)) => format!("{:.2}", a / b),
            _ => "-".into(),
        };
        let ttfb = if r.case.stream {
            format!("{:.0}", r.ttfb("p50"))
        } else {
            "-".into()
        };
        let added = direct.map_or("-".into(), |d| {
            format!("{:.0}", r.lat("p99") - d.lat("p99"))
        });
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} |",
            r.case.name,
            r.mode,
            r.rps(),
            r.lat("p50"),
            r.lat("p99"),
            ttfb,
            cpu,
            ratio(r.rps(), direct.map(Row::rps)),
            ratio(r.rps(), nginx.map(Row::rps)),
            cpu_ratio,
            added
        );
    }
}

fn targets(
    rows: &[Row],
    scale: &[Value],
    big: &Value,
    streams: Option<&Value>,
    proxied_equal: bool,
) -> Vec<Target> {
    let mut out = vs_nginx(rows, PROXY, "", 0.90, 1.5);
    if let (Some(i), Some(d)) = (
        find(rows, "json c16", PROXY),
        find(rows, "json c16", "direct"),
    ) {
        let added = i.lat("p99") - d.lat("p99");
        out.push(Target::new(
            "json c16: p99 added latency vs direct",
            "< 1000 µs",
            format!("{added:.0} µs ({:.0} vs {:.0})", i.lat("p99"), d.lat("p99")),
            Some(added < 1000.0),
        ));
    }
    if let (Some(i), Some(d)) = (
        find(rows, "stream c16", PROXY),
        find(rows, "stream c16", "direct"),
    ) {
        let added = i.ttfb("p50") - d.ttfb("p50");
        out.push(Target::new(
            "stream c16: TTFB p50 overhead vs direct",
            "< 300 µs",
            format!(
                "{added:.0} µs ({:.0} vs {:.0})",
                i.ttfb("p50"),
                d.ttfb("p50")
            ),
            Some(added < 300.0),
        ));
    }
    if let Some(s) = scale.first() {
        let b = num(s, &["bytes_per_session"]);
        out.push(Target::new(
            "idle session memory (RolloutSession, 100k)",
            "≤ 2048 B",
            format!("{b:.0} B"),
            Some(b <= 2048.0),
        ));
    }
    let peak = num(big, &["peak_over_body"]);
    out.push(Target::new(
        "peak RSS proxying a 256 MiB body",
        "≤ 1.3× body",
        format!("{peak:.2}×"),
        Some(peak <= 1.3 && big["ok"].as_u64() == Some(1)),
    ));
    out.push(streams::target(streams));
    out.push(Target::new(
        "every request really proxied",
        "upstream count = completed",
        if proxied_equal {
            "equal in every run, and intercept's records = its upstream requests".to_owned()
        } else {
            "MISMATCH in some run (see the lines above)".to_owned()
        },
        Some(proxied_equal),
    ));
    out
}

/// The json c16, json c64 and stream c16 targets of `mode` against nginx in the same
/// run: req/s at least `rps` times nginx's, CPU per request at most `cpu` times;
/// `label` goes before "throughput" and "CPU" in their names.
fn vs_nginx(rows: &[Row], mode: &str, label: &str, rps: f64, cpu: f64) -> Vec<Target> {
    let (rps_goal, cpu_goal) = (format!("≥ {rps:.2}×"), format!("≤ {cpu:.2}×"));
    let mut out = Vec::new();
    for case in ["json c16", "json c64", "stream c16"] {
        let Some(i) = find(rows, case, mode) else {
            continue;
        };
        let name = format!("{case}: {label}throughput vs nginx");
        let Some(n) = find(rows, case, "nginx") else {
            out.push(Target::new(&name, &rps_goal, "nginx absent".into(), None));
            continue;
        };
        let r = i.rps() / n.rps();
        out.push(Target::new(
            &name,
            &rps_goal,
            format!("{r:.2}× ({:.0} vs {:.0} req/s)", i.rps(), n.rps()),
            Some(r >= rps),
        ));
        if let (Some(a), Some(b)) = (i.cpu_us_per_req, n.cpu_us_per_req) {
            out.push(Target::new(
                &format!("{case}: {label}CPU per request vs nginx"),
                &cpu_goal,
                format!("{:.2}× ({a:.1} vs {b:.1} µs)", a / b),
                Some(a / b <= cpu),
            ));
        }
    }
    out
}

/// The recording targets, on `intercept serve --trace-dir`: its throughput and CPU against
/// nginx's, the growth case's flatness and memory per recorded call, and every call
/// proxied once and recorded.
fn serve_targets(rows: &[Row], growth: Option<&Growth>, recorded_all: bool) -> Vec<Target> {
    let mut out = vs_nginx(rows, SERVE, &format!("{SERVE} "), 0.95, SERVE_CPU_GOAL);
    match growth {
        Some(g) => {
            out.push(Target::new(
                "growth: req/s of the last window vs the first",
                &format!("≥ {:.2}×", growth::FLATNESS_GOAL),
                format!(
                    "{:.2}× ({:.0} vs {:.0} req/s, {} s windows)",
                    g.last_over_first, g.last_rps, g.first_rps, g.window_s
                ),
                Some(g.flat()),
            ));
            out.push(Target::new(
                "growth: RSS per recorded call vs its bytes",
                &format!("≤ {:.1}× request+response", growth::MEMORY_GOAL),
                format!(
                    "{:.2}× ({:.0} vs {:.0} bytes; RSS {:.0} → {:.0} MiB over {} calls)",
                    g.memory_over_raw,
                    g.rss_bytes_per_call,
                    g.raw_bytes_per_call,
                    g.rss_start_kib as f64 / 1024.0,
                    g.rss_end_kib as f64 / 1024.0,
                    g.calls
                ),
                Some(g.lean()),
            ));
        }
        None => {
            for name in [
                "growth: req/s of the last window vs the first",
                "growth: RSS per recorded call vs its bytes",
            ] {
                out.push(Target::new(
                    name,
                    "",
                    "not run (--growth-secs 0)".into(),
                    None,
                ));
            }
        }
    }
    out.push(Target::new(
        &format!("{SERVE}: every request proxied and recorded"),
        "upstream = completed = recorded",
        if recorded_all {
            "equal in every run: upstream requests, calls in its sessions, lines in its trace files"
                .to_owned()
        } else {
            "MISMATCH in some run (see the lines above)".to_owned()
        },
        Some(recorded_all),
    ));
    out.into_iter()
        .map(|t| t.in_group(Group::Recording))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_round_is_reported() {
        let row = |rps: f64| Row {
            case: CASES[1],
            mode: PROXY,
            report: json!({"rps": rps, "ok": 1, "errors": 0}),
            cpu_us_per_req: None,
            upstream_requests: 1,
        };
        let rounds = [row(300.0), row(100.0), row(200.0)];
        assert_eq!(median_round(rounds.iter()).map(|r| r.rps()), Some(200.0));
        assert_eq!(
            median_round(rounds[..2].iter()).map(|r| r.rps()),
            Some(100.0)
        );
        assert!(median_round(std::iter::empty()).is_none());
    }

    fn row(case: Case, mode: &'static str, rps: f64, cpu: f64) -> Row {
        Row {
            case,
            mode,
            report: json!({"rps": rps, "ok": 1, "errors": 0}),
            cpu_us_per_req: Some(cpu),
            upstream_requests: 1,
        }
    }

    #[test]
    fn serve_targets_compare_the_sidecar_with_nginx() {
        let rows = vec![
            row(CASES[1], SERVE, 95.0, 12.5),
            row(CASES[1], "nginx", 100.0, 10.0),
            row(CASES[2], SERVE, 94.0, 12.6),
            row(CASES[2], "nginx", 100.0, 10.0),
            row(CASES[3], PROXY, 200.0, 5.0),
        ];
        let g = Growth::new(
            &Intervals {
                width_s: 1.0,
                window_s: 3.0,
                ok: vec![100, 100, 95],
            },
            1.0,
            (1024, 2048),
            1024,
            800.0,
        );
        let t = serve_targets(&rows, Some(&g), true);
        assert!(t.iter().all(|t| t.group == Group::Recording));
        let met: Vec<(&str, Option<bool>)> = t.iter().map(|t| (t.name.as_str(), t.met)).collect();
        assert_eq!(
            met,
            [
                ("json c16: intercept-serve throughput vs nginx", Some(true)),
                (
                    "json c16: intercept-serve CPU per request vs nginx",
                    Some(true)
                ),
                ("json c64: intercept-serve throughput vs nginx", Some(false)),
                (
                    "json c64: intercept-serve CPU per request vs nginx",
                    Some(false)
                ),
                ("growth: req/s of the last window vs the first", Some(true)),
                // 1 MiB over 1024 calls of 800 bytes: 1.28×.
                ("growth: RSS per recorded call vs its bytes", Some(true)),
                (
                    "intercept-serve: every request proxied and recorded",
                    Some(true)
                ),
            ]
        );
        let t = serve_targets(&rows[..1], None, false);
        let met: Vec<Option<bool>> = t.iter().map(|t| t.met).collect();
        assert_eq!(met, [None, None, None, Some(false)]);
        assert_eq!(case_tag(CASES[3]), "stream-c16");
    }

    #[test]
    fn nginx_config_names_the_prefix_and_upstream() {
        let conf = nginx_config(
            Path::new("/tmp/b"),
            8081,
            "127.0.0.1:9000",
            NginxTuning::LOAD,
            nginx_workers(true),
        );
        assert!(conf.contains("server 127.0.0.1:9000;"));
        assert!(conf.contains("listen 127.0.0.1:8081;"));
        assert!(conf.contains("keepalive 256;"));
        assert!(conf.contains("pid /tmp/b/nginx.pid;"));
        assert!(conf.contains("worker_processes 1;"));
        let conf = nginx_config(
            Path::new("/tmp/b"),
            8081,
            "127.0.0.1:9000",
            NginxTuning {
                keepalive: 10_000,
                http2: true,
            },
            nginx_workers(false),
        );
        assert!(conf.contains("listen 127.0.0.1:8081 http2;"));
        assert!(conf.contains("worker_processes auto;"));
        assert!(conf.contains("keepalive 10000;"));
    }
}
