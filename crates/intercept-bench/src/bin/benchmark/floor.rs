//! The floor under recording: what appending one trace line costs this machine with no
//! proxy around it (`bench-write`, [`intercept_bench::write_cost`]), set beside nginx's
//! CPU per request and the recording group's CPU goal. The line is the json c16 case's
//! mean trace line; `bench-write` runs pinned like the proxies, writing round-robin to as
//! many files as there are sessions, three times (the median is reported: the first
//! touch of fresh memory on a VM makes single runs jump).

use std::process::Stdio;

use anyhow::{bail, Context as _, Result};
use intercept_bench::write_cost::WriteCost;
use serde_json::{json, Value};

use super::{find, Env, Row, SERVE_CPU_GOAL};

/// Runs of `bench-write`; the median is reported.
const RUNS: usize = 3;

/// The floor of one run.
#[derive(Debug, Clone, Copy)]
pub(super) struct Floor {
    /// The median run (by CPU per line).
    pub(super) median: WriteCost,
    /// CPU µs per line of every run, in the order run.
    pub(super) runs: [f64; RUNS],
}

/// Runs `bench-write` [`RUNS`] times with lines of `line_bytes` over `files` files.
pub(super) fn measure(env: &Env, files: usize, line_bytes: usize) -> Result<Floor> {
    let lines: u64 = if env.quick { 50_000 } else { 400_000 };
    let dir = env.out.join("write-floor");
    let mut costs = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let mut cmd = env.command("bench-write", 0);
        cmd.arg("--dir")
            .arg(&dir)
            .args(["--files", &files.to_string()])
            .args(["--line-bytes", &line_bytes.to_string()])
            .args(["--lines", &lines.to_string()]);
        let out = cmd
            .stderr(Stdio::inherit())
            .output()
            .context("cannot run bench-write")?;
        if !out.status.success() {
            bail!("bench-write failed ({})", out.status);
        }
        costs.push(
            serde_json::from_slice::<WriteCost>(&out.stdout).context("bench-write's report")?,
        );
    }
    let runs = std::array::from_fn(|i| costs[i].cpu_us_per_line());
    costs.sort_by(|a, b| a.cpu_us_per_line().total_cmp(&b.cpu_us_per_line()));
    Ok(Floor {
        median: costs[RUNS / 2],
        runs,
    })
}

/// The mean trace line of a case's `intercept serve`, from its recorded figures.
pub(super) fn mean_line_bytes(recorded: &Value) -> Option<usize> {
    let bytes = recorded["trace_bytes"].as_u64()?;
    let lines = recorded["trace_lines"].as_u64().filter(|&n| n > 0)?;
    usize::try_from(bytes.div_ceil(lines)).ok()
}

/// What the floor means against nginx's json c16 CPU per request, as printed lines and
/// as `results.json`'s `recording_floor`.
pub(super) fn report(floor: &Floor, rows: &[Row]) -> (Vec<String>, Value) {
    let cost = &floor.median;
    let cpu = cost.cpu_us_per_line();
    let mut lines = vec![format!(
        "one {}-byte trace line (json c16's mean) appended round-robin to {} files, no proxy: \
         {cpu:.2} µs of CPU (system {:.2}, user {:.2}); median of {RUNS} runs: {}",
        cost.line_bytes,
        cost.files,
        cost.system_us_per_line,
        cost.user_us_per_line,
        floor
            .runs
            .iter()
            .map(|c| format!("{c:.2}"))
            .collect::<Vec<_>>()
            .join(", "),
    )];
    let mut json = json!({
        "line_bytes": cost.line_bytes,
        "files": cost.files,
        "lines": cost.lines,
        "cpu_us_per_line": cpu,
        "system_us_per_line": cost.system_us_per_line,
        "user_us_per_line": cost.user_us_per_line,
        "wall_us_per_line": cost.wall_us_per_line,
        "cpu_us_per_line_runs": floor.runs,
    });
    let nginx = find(rows, "json c16", "nginx").and_then(|n| n.cpu_us_per_req);
    let proxy = find(rows, "json c16", super::PROXY).and_then(|n| n.cpu_us_per_req);
    if let Some(n) = nginx {
        let margin = (SERVE_CPU_GOAL - 1.0) * n;
        lines.push(format!(
            "nginx spends {n:.1} µs per json c16 request: the line alone is {:.2}× of it; the \
             CPU goal of ≤ {SERVE_CPU_GOAL:.2}× leaves {margin:.1} µs per request beyond nginx's \
             for everything a recording proxy adds, this write included ({:.0} % of it)",
            cpu / n,
            100.0 * cpu / margin,
        ));
        json["nginx_json_c16_cpu_us"] = json!(n);
        json["goal_margin_us"] = json!(margin);
        if let Some(p) = proxy {
            lines.push(format!(
                "{} spends {p:.1} µs ({:.2}× nginx's) proxying it and recording nothing; with \
                 the line: {:.1} µs, {:.2}× nginx's",
                super::PROXY,
                p / n,
                p + cpu,
                (p + cpu) / n,
            ));
            json["proxy_json_c16_cpu_us"] = json!(p);
            json["proxy_plus_line_over_nginx"] = json!((p + cpu) / n);
        }
    }
    (lines, json)
}

#[cfg(test)]
mod tests {
    use super::super::{Case, CASES, PROXY};
    use super::*;

    fn cost(cpu: f64) -> WriteCost {
        WriteCost {
            lines: 1000,
            line_bytes: 3300,
            files: 1000,
            lines_per_write: 1,
            user_us_per_line: 0.0,
            system_us_per_line: cpu,
            wall_us_per_line: cpu,
            hints: 0,
        }
    }

    fn row(case: Case, mode: &'static str, cpu: f64) -> Row {
        Row {
            case,
            mode,
            report: json!({"rps": 1.0, "ok": 1, "errors": 0}),
            cpu_us_per_req: Some(cpu),
            upstream_requests: 1,
        }
    }

    #[test]
    fn the_floor_is_set_beside_nginx_and_the_goal() {
        let floor = Floor {
            median: cost(2.5),
            runs: [2.5, 7.0, 2.0],
        };
        let rows = [
            row(CASES[1], "nginx", 10.0),
            row(CASES[1], PROXY, 14.0),
            row(CASES[2], "nginx", 99.0),
        ];
        let (lines, json) = report(&floor, &rows);
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].contains("2.50 µs of CPU"), "{}", lines[0]);
        assert!(lines[0].contains("2.50, 7.00, 2.00"), "{}", lines[0]);
        // ≤ 1.25× of 10 µs leaves 2.5 µs: the line takes all of it.
        assert!(lines[1].contains("0.25× of it"), "{}", lines[1]);
        assert!(lines[1].contains("leaves 2.5 µs"), "{}", lines[1]);
        assert!(lines[1].contains("(100 %"), "{}", lines[1]);
        assert!(lines[2].contains("1.40× nginx's"), "{}", lines[2]);
        assert!(lines[2].contains("16.5 µs, 1.65×"), "{}", lines[2]);
        assert_eq!(json["goal_margin_us"], 2.5);
        assert_eq!(json["proxy_plus_line_over_nginx"], 1.65);

        // Without nginx there is nothing to set it beside.
        let (lines, json) = report(&floor, &rows[1..2]);
        assert_eq!(lines.len(), 1);
        assert!(json.get("goal_margin_us").is_none());
    }

    #[test]
    fn the_line_size_is_derived_from_what_was_recorded() {
        let recorded = json!({"trace_bytes": 10_001, "trace_lines": 3});
        assert_eq!(mean_line_bytes(&recorded), Some(3334));
        assert_eq!(
            mean_line_bytes(&json!({"trace_bytes": 1, "trace_lines": 0})),
            None
        );
    }
}
