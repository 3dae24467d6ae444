//! The agentic case: `agentgen` (waves of 16 rollouts running 40-turn tool loops in
//! lock-step, contexts growing from ~5 KB to ~100 KB, ~20 KB of tools on every call,
//! every other call streamed; see `intercept_bench::agentic`) against the mock model
//! directly, through `intercept serve --trace-dir` and through nginx, targets in turn
//! for each round. agentgen reads the target's on-CPU time (schedstat, nanoseconds)
//! around every turn, so each target has a CPU per call at turn 1 to 5 and at turn 36
//! to 40. `intercept serve` gets one session per rollout while its sessions last, and
//! what it recorded is checked against what the upstream received; its RSS growth per
//! recorded call is set against the bytes a call carried.

use std::path::Path;

use anyhow::{bail, Context as _, Result};
use intercept_bench::procfs;
use serde_json::{json, Value};

use super::sidecar::Sidecar;
use super::{start_nginx, Env, Group, Helper, NginxTuning, Target, BEFORE, SERVE, SESSIONS};

/// Rollouts per wave.
const WAVE: usize = 16;
/// Calls per rollout.
const TURNS: usize = 40;

/// One target's figures over its rounds.
#[derive(Debug, Default, Clone)]
struct Tally {
    calls: u64,
    errors: u64,
    elapsed_s: f64,
    cpu_ns: u64,
    /// Per turn: (calls, cpu ns).
    by_turn: Vec<(u64, f64)>,
    raw_bytes: u64,
    p99_us: Vec<u64>,
    reused: bool,
    rollouts: usize,
}

impl Tally {
    fn add(&mut self, r: &Value) {
        let n = |k: &str| r[k].as_u64().unwrap_or(0);
        self.calls += n("calls");
        self.errors += n("errors");
        self.elapsed_s += r["elapsed_s"].as_f64().unwrap_or(0.0);
        self.cpu_ns += n("cpu_ns");
        self.raw_bytes += n("request_bytes") + n("response_bytes");
        self.p99_us
            .push(r["latency_us"]["p99"].as_u64().unwrap_or(0));
        self.reused |= r["secrets_reused"].as_bool().unwrap_or(false);
        self.rollouts += r["rollouts"].as_u64().unwrap_or(0) as usize;
        // Per-turn CPU per call, weighted back into sums by the turn's calls (each wave
        // runs every turn once, so a turn's calls are the run's waves times its rollouts).
        let per_turn_calls = n("waves") * n("sessions");
        if let Some(turns) = r["cpu_ns_by_turn"].as_array() {
            if self.by_turn.len() < turns.len() {
                self.by_turn.resize(turns.len(), (0, 0.0));
            }
            for (slot, t) in self.by_turn.iter_mut().zip(turns) {
                slot.0 += per_turn_calls;
                slot.1 += t.as_f64().unwrap_or(0.0) * per_turn_calls as f64;
            }
        }
    }

    fn rps(&self) -> f64 {
        self.calls as f64 / self.elapsed_s.max(1e-9)
    }

    fn cpu_us_per_call(&self) -> Option<f64> {
        (self.cpu_ns > 0).then(|| self.cpu_ns as f64 / 1000.0 / self.calls.max(1) as f64)
    }

    /// CPU per call over `turns`, µs.
    fn cpu_us_over(&self, turns: std::ops::Range<usize>) -> Option<f64> {
        let slice = self.by_turn.get(turns)?;
        let calls: u64 = slice.iter().map(|t| t.0).sum();
        let cpu: f64 = slice.iter().map(|t| t.1).sum();
        (calls > 0 && cpu > 0.0).then(|| cpu / 1000.0 / calls as f64)
    }

    fn first(&self) -> Option<f64> {
        self.cpu_us_over(0..5)
    }

    fn last(&self) -> Option<f64> {
        self.cpu_us_over(TURNS - 5..TURNS)
    }

    fn growth(&self) -> Option<f64> {
        Some(self.last()? / self.first()?)
    }

    fn to_json(&self) -> Value {
        json!({
            "calls": self.calls,
            "errors": self.errors,
            "rollouts": self.rollouts,
            "secrets_reused": self.reused,
            "rps": self.rps(),
            "cpu_us_per_call": self.cpu_us_per_call(),
            "cpu_us_turns_1_5": self.first(),
            "cpu_us_turns_36_40": self.last(),
            "cpu_growth": self.growth(),
            "cpu_us_by_turn": self.by_turn.iter().map(|t| t.1 / 1000.0 / t.0.max(1) as f64).collect::<Vec<_>>(),
            "raw_bytes_per_call": self.raw_bytes as f64 / self.calls.max(1) as f64,
            "p99_us_by_round": self.p99_us,
        })
    }
}

/// Runs agentgen once against `url`, the target's CPU read from `pids`.
fn agentgen(env: &Env, url: &str, secrets: &Path, first: usize, pids: &[u32]) -> Result<Value> {
    let secs = if env.quick { 3.0 } else { 10.0 } / env.rounds.max(1) as f64;
    let mut cmd = env.command("agentgen", 1);
    cmd.args(["--url", url])
        .arg("--secrets-file")
        .arg(secrets)
        .args([
            "--sessions",
            &WAVE.to_string(),
            "--turns",
            &TURNS.to_string(),
        ])
        .args(["--duration", &secs.to_string()])
        .args(["--first-rollout", &first.to_string()])
        .args(["--timeout", "30"]);
    for pid in pids {
        cmd.args(["--cpu-pid", &pid.to_string()]);
    }
    let out = cmd
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("cannot run agentgen")?;
    if !out.status.success() {
        bail!("agentgen failed ({})", out.status);
    }
    serde_json::from_slice(&out.stdout).context("agentgen printed something that is not JSON")
}

fn requests(upstream: &mut Helper) -> Result<u64> {
    Ok(upstream.stats()?["requests"].as_u64().unwrap_or(0))
}

/// What the case measured: its JSON and its targets.
pub(super) struct Agentic {
    pub(super) json: Value,
    pub(super) targets: Vec<Target>,
}

/// Runs the case against the upstream `upstream` (its `addr` and `base_url`), with nginx
/// when it is on the PATH.
pub(super) fn run(env: &Env, upstream: &mut Helper, nginx_on_path: bool) -> Result<Agentic> {
    let upstream_addr = upstream.field("addr")?;
    let upstream_base = upstream.field("base_url")?;
    println!(
        "\nagentic: waves of {WAVE} rollouts x {TURNS} turns in lock-step (tools ~20 KB on \
         every call, contexts ~5 KB -> ~100 KB, every other call streamed); targets: direct, \
         {SERVE}{}",
        if nginx_on_path { ", nginx" } else { "" }
    );
    let direct_url = format!("http://{upstream_addr}/v1/chat/completions");
    let mut sidecar = Sidecar::start(env, &upstream_base, SESSIONS, "agentic")?;
    let mut earlier = match &env.before {
        Some(program) => Some(Sidecar::start_program(
            env,
            program,
            &upstream_base,
            SESSIONS,
            "agentic-before",
        )?),
        None => None,
    };
    let nginx = if nginx_on_path {
        Some(start_nginx(
            env,
            &upstream_addr,
            "nginx-agentic",
            NginxTuning::LOAD,
        )?)
    } else {
        None
    };
    let nginx_pids: Vec<u32> = nginx
        .as_ref()
        .map(|n| {
            let pid = n.child.id();
            std::iter::once(pid).chain(procfs::children(pid)).collect()
        })
        .unwrap_or_default();
    let rss0 = sidecar.rss_kib();
    let secrets = sidecar.secrets.clone();
    let (mut direct, mut serve, mut via_nginx) =
        (Tally::default(), Tally::default(), Tally::default());
    let mut serve_before = Tally::default();
    let mut before_upstream = 0u64;
    let mut serve_upstream = 0u64;
    let mut upstream_equal = true;
    for _ in 0..env.rounds.max(1) {
        let before = requests(upstream)?;
        let r = agentgen(env, &direct_url, &secrets, direct.rollouts, &[])?;
        direct.add(&r);
        upstream_equal &= requests(upstream)? - before == r["calls"].as_u64().unwrap_or(0);

        let before = requests(upstream)?;
        let r = agentgen(
            env,
            &sidecar.url,
            &secrets,
            serve.rollouts,
            &[sidecar.pid()],
        )?;
        serve.add(&r);
        let received = requests(upstream)? - before;
        serve_upstream += received;
        upstream_equal &= received == r["calls"].as_u64().unwrap_or(0);

        if let Some(b) = &earlier {
            let before = requests(upstream)?;
            let r = agentgen(env, &b.url, &b.secrets, serve_before.rollouts, &[b.pid()])?;
            serve_before.add(&r);
            let received = requests(upstream)? - before;
            before_upstream += received;
            upstream_equal &= received == r["calls"].as_u64().unwrap_or(0);
        }

        if let Some(n) = &nginx {
            let before = requests(upstream)?;
            let r = agentgen(env, &n.url, &secrets, via_nginx.rollouts, &nginx_pids)?;
            via_nginx.add(&r);
            upstream_equal &= requests(upstream)? - before == r["calls"].as_u64().unwrap_or(0);
        }
    }
    let recorded = sidecar.settle(serve_upstream)?;
    let rss1 = sidecar.rss_kib();
    drop(sidecar);
    if let Some(b) = earlier.as_mut() {
        upstream_equal &= b.settle(before_upstream)?.is(before_upstream);
    }
    drop(earlier);
    drop(nginx);
    let recorded_all = recorded.is(serve_upstream) && upstream_equal && serve.errors == 0;
    let rss_per_call = (rss1.saturating_sub(rss0) * 1024) as f64 / serve.calls.max(1) as f64;
    let raw_per_call = serve.raw_bytes as f64 / serve.calls.max(1) as f64;

    println!(
        "  {:<22} {:>7} {:>9} {:>12} {:>13} {:>14} {:>8} {:>9}",
        "target",
        "calls",
        "calls/s",
        "CPU µs/call",
        "turns 1-5 µs",
        "turns 36-40 µs",
        "growth",
        "p99 ms"
    );
    let fmt = |v: Option<f64>, p: usize| v.map_or("-".to_owned(), |v| format!("{v:.p$}"));
    for (name, t) in [
        ("direct", &direct),
        (SERVE, &serve),
        (BEFORE, &serve_before),
        ("nginx", &via_nginx),
    ] {
        if t.calls == 0 {
            continue;
        }
        let p99 = t.p99_us.iter().copied().max().unwrap_or(0) as f64 / 1000.0;
        println!(
            "  {name:<22} {:>7} {:>9.0} {:>12} {:>13} {:>14} {:>8} {:>9.2}",
            t.calls,
            t.rps(),
            fmt(t.cpu_us_per_call(), 1),
            fmt(t.first(), 1),
            fmt(t.last(), 1),
            fmt(t.growth(), 2),
            p99
        );
    }
    println!(
        "  {SERVE} recorded {} calls in {} trace files ({:.0} bytes written per call, {:.0} \
         bytes carried per call); the upstream received {serve_upstream} from it ({}); RSS \
         grew {:.0} bytes per recorded call ({:.3}x the bytes a call carried){}",
        recorded.calls,
        recorded.trace_files,
        recorded.bytes_per_call(),
        raw_per_call,
        if recorded_all { "equal" } else { "NOT equal" },
        rss_per_call,
        rss_per_call / raw_per_call.max(1.0),
        if serve.reused {
            "; sessions were reused (more rollouts than sessions)"
        } else {
            ""
        }
    );

    let mut targets = Vec::new();
    let have_nginx = via_nginx.calls > 0;
    let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
    let rps_ratio = have_nginx.then(|| serve.rps() / via_nginx.rps());
    targets.push(Target::new(
        "agentic: req/s vs nginx",
        ">= 1.0x",
        fmt(rps_ratio, 2) + "x",
        rps_ratio.map(|r| r >= 1.0),
    ));
    let cpu_ratio = ratio(serve.cpu_us_per_call(), via_nginx.cpu_us_per_call());
    targets.push(Target::new(
        "agentic: CPU per call vs nginx",
        "<= 1.1x",
        fmt(cpu_ratio, 2) + "x",
        cpu_ratio.map(|r| r <= 1.1),
    ));
    let growth = (serve.growth(), via_nginx.growth());
    targets.push(Target::new(
        "agentic: CPU growth turn 1-5 -> 36-40",
        "<= nginx's",
        format!("{} vs nginx {}", fmt(growth.0, 2), fmt(growth.1, 2)),
        match growth {
            (Some(a), Some(b)) => Some(a <= b),
            _ => None,
        },
    ));
    targets.push(Target::new(
        "agentic: RSS per recorded call",
        "<= 0.3x its raw bytes",
        format!("{:.3}x", rss_per_call / raw_per_call.max(1.0)),
        Some(rss_per_call <= 0.3 * raw_per_call && recorded_all),
    ));
    let targets = targets
        .into_iter()
        .map(|t| t.in_group(Group::Recording))
        .collect();
    Ok(Agentic {
        json: json!({
            "wave": WAVE,
            "turns": TURNS,
            "direct": direct.to_json(),
            "serve": serve.to_json(),
            "serve_before": (serve_before.calls > 0).then(|| serve_before.to_json()),
            "nginx": have_nginx.then(|| via_nginx.to_json()),
            "serve_recorded": recorded.to_json(),
            "serve_upstream_requests": serve_upstream,
            "recorded_all": recorded_all,
            "serve_rss_bytes_per_call": rss_per_call,
            "serve_raw_bytes_per_call": raw_per_call,
        }),
        targets,
    })
}
