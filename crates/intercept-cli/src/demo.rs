//! `intercept demo`: the main job end to end, offline.
//!
//! An in-process sidecar (the same path as `intercept serve`) runs on the embedded mock
//! model; simulated harnesses — one per rollout, all at once — create their session
//! through the control API, talk Chat Completions over real HTTP (multi-turn, about half
//! streaming, some calling a tool and sending its result back), then release the session
//! and compare the returned trace with what they did. Each session's trace is written as
//! JSONL under the trace directory.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use anyhow::{anyhow, bail, Context as _};
use http::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::task::JoinSet;

use crate::config::{ServeConfig, UpstreamSetting};
use crate::sidecar::Sidecar;
use intercept_mock::harness::{parse_completion, parse_stream, Assistant, HttpClient};

/// Options of the demo.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Concurrent rollouts (default 64).
    pub rollouts: usize,
    /// User turns per rollout; `None` varies them between 3 and 5.
    pub turns: Option<usize>,
    /// Where the JSONL traces go; `None` makes a fresh directory under the system temp
    /// directory.
    pub trace_dir: Option<PathBuf>,
}

impl Default for DemoOptions {
    fn default() -> Self {
        DemoOptions {
            rollouts: 64,
            turns: None,
            trace_dir: None,
        }
    }
}

/// What one rollout did.
#[derive(Debug, Clone)]
struct RolloutOutcome {
    calls: usize,
    latencies: Vec<Duration>,
    error: Option<String>,
}

/// The demo's results.
#[derive(Debug, Clone)]
pub struct DemoSummary {
    /// Rollouts run.
    pub rollouts: usize,
    /// Rollouts that failed (a call failed, or the trace did not match).
    pub failed_rollouts: usize,
    /// Model calls made by the harnesses.
    pub calls: usize,
    /// Failures: each failed rollout (a failed call or a trace mismatch), plus a failed
    /// shutdown.
    pub errors: usize,
    /// Calls recorded on the traces returned by the control API.
    pub recorded_calls: usize,
    /// Median call latency seen by the harnesses.
    pub latency_p50: Duration,
    /// 99th percentile call latency.
    pub latency_p99: Duration,
    /// Wall time of the rollouts.
    pub wall: Duration,
    /// Where the JSONL traces were written.
    pub trace_dir: PathBuf,
    /// Calls made per rollout, by session id.
    pub calls_by_session: Vec<(String, usize)>,
    /// The first few failures, for the report.
    pub failures: Vec<String>,
}

impl DemoSummary {
    /// Calls per second of wall time.
    pub fn calls_per_second(&self) -> f64 {
        let secs = self.wall.as_secs_f64();
        if secs > 0.0 {
            self.calls as f64 / secs
        } else {
            0.0
        }
    }

    /// Whether every rollout succeeded.
    pub fn ok(&self) -> bool {
        self.failed_rollouts == 0 && self.errors == 0
    }
}

impl fmt::Display for DemoSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
        let rows = [
            (
                "rollouts",
                format!("{} ({} failed)", self.rollouts, self.failed_rollouts),
            ),
            ("calls", self.calls.to_string()),
            ("recorded", self.recorded_calls.to_string()),
            ("errors", self.errors.to_string()),
            ("latency p50", ms(self.latency_p50)),
            ("latency p99", ms(self.latency_p99)),
            ("calls/s", format!("{:.0}", self.calls_per_second())),
            ("wall time", ms(self.wall)),
        ];
        writeln!(f, "intercept demo")?;
        writeln!(f, "+--------------+----------------------+")?;
        for (name, value) in rows {
            writeln!(f, "| {name:<12} | {value:>20} |")?;
        }
        writeln!(f, "+--------------+----------------------+")?;
        for failure in &self.failures {
            writeln!(f, "failure: {failure}")?;
        }
        write!(
            f,
            "traces: {} (one <session id>.jsonl trace log per rollout; \
             `intercept trace stats` and `intercept trace cat` read them)",
            self.trace_dir.display()
        )
    }
}

fn fresh_dir() -> anyhow::Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("intercept-demo-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Runs the demo and returns its summary (print it with `{}`).
pub async fn run(options: DemoOptions) -> anyhow::Result<DemoSummary> {
    if options.rollouts == 0 {
        bail!("--rollouts must be at least 1");
    }
    if options.turns == Some(0) {
        bail!("--turns must be at least 1");
    }
    let trace_dir = match options.trace_dir.clone() {
        Some(dir) => dir,
        None => fresh_dir()?,
    };
    let sidecar = Sidecar::start(ServeConfig {
        upstream: Some(UpstreamSetting::Mock),
        trace_dir: Some(trace_dir.clone()),
        ..ServeConfig::default()
    })
    .await?;
    let control = sidecar.control_url();
    let token = sidecar.token().expose().to_owned();
    let client = HttpClient::new();
    let started = Instant::now();
    let mut set = JoinSet::new();
    for i in 0..options.rollouts {
        let client = client.clone();
        let control = control.clone();
        let token = token.clone();
        let turns = options.turns.unwrap_or(3 + i % 3);
        set.spawn(async move {
            let id = format!("demo-{i:04}");
            let outcome = rollout(&client, &control, &token, &id, i, turns).await;
            (id, outcome)
        });
    }
    let mut outcomes = Vec::with_capacity(options.rollouts);
    while let Some(joined) = set.join_next().await {
        outcomes.push(joined.context("a rollout task panicked")?);
    }
    let wall = started.elapsed();
    let shutdown = sidecar.shutdown().await;
    outcomes.sort_by(|a, b| a.0.cmp(&b.0));
    let mut latencies: Vec<Duration> = outcomes
        .iter()
        .flat_map(|(_, o)| o.latencies.iter().copied())
        .collect();
    latencies.sort();
    let mut failures: Vec<String> = outcomes
        .iter()
        .filter_map(|(id, o)| o.error.as_ref().map(|e| format!("{id}: {e}")))
        .collect();
    if let Err(e) = shutdown {
        failures.push(format!("shutdown: {e:#}"));
    }
    let failed_rollouts = outcomes.iter().filter(|(_, o)| o.error.is_some()).count();
    let summary = DemoSummary {
        rollouts: options.rollouts,
        failed_rollouts,
        calls: outcomes.iter().map(|(_, o)| o.calls).sum(),
        errors: failures.len(),
        recorded_calls: outcomes
            .iter()
            .filter(|(_, o)| o.error.is_none())
            .map(|(_, o)| o.calls)
            .sum(),
        latency_p50: percentile(&latencies, 50.0),
        latency_p99: percentile(&latencies, 99.0),
        wall,
        trace_dir,
        calls_by_session: outcomes
            .iter()
            .map(|(id, o)| (id.clone(), o.calls))
            .collect(),
        failures: failures.into_iter().take(5).collect(),
    };
    Ok(summary)
}

/// One simulated harness: create the session, talk, release, check the trace.
async fn rollout(
    client: &HttpClient,
    control: &str,
    token: &str,
    id: &str,
    index: usize,
    turns: usize,
) -> RolloutOutcome {
    let mut outcome = RolloutOutcome {
        calls: 0,
        latencies: Vec::new(),
        error: None,
    };
    let created = client
        .send(
            Method::POST,
            &format!("{control}/v1/sessions"),
            Some(token),
            Some(&json!({"id": id, "sampling": {"temperature": 0.7}})),
        )
        .await;
    let env = match created.and_then(|r| {
        if r.status != StatusCode::CREATED {
            bail!("POST /v1/sessions answered {}", r.status);
        }
        r.json()
    }) {
        Ok(v) => v["env"].clone(),
        Err(e) => {
            outcome.error = Some(format!("{e:#}"));
            return outcome;
        }
    };
    let talked = talk(client, &env, index, turns, &mut outcome).await;
    // Release whatever happened, and compare the final trace with what was done.
    let released = client
        .send(
            Method::DELETE,
            &format!("{control}/v1/sessions/{id}"),
            Some(token),
            None,
        )
        .await
        .and_then(|r| r.json());
    let checked = talked.and_then(|()| {
        let trace = released?;
        let calls = trace["calls"]
            .as_array()
            .ok_or_else(|| anyhow!("the released trace has no calls"))?;
        if calls.len() != outcome.calls {
            bail!(
                "the trace holds {} calls, the harness made {}",
                calls.len(),
                outcome.calls
            );
        }
        if let Some(bad) = calls.iter().find(|c| !c["error"].is_null()) {
            bail!("a recorded call failed: {}", bad["error"]);
        }
        Ok(())
    });
    if let Err(e) = checked {
        outcome.error = Some(format!("{e:#}"));
    }
    outcome
}

async fn talk(
    client: &HttpClient,
    env: &Value,
    index: usize,
    turns: usize,
    outcome: &mut RolloutOutcome,
) -> anyhow::Result<()> {
    let base = env["OPENAI_BASE_URL"]
        .as_str()
        .ok_or_else(|| anyhow!("the session has no OPENAI_BASE_URL"))?;
    let key = env["OPENAI_API_KEY"]
        .as_str()
        .ok_or_else(|| anyhow!("the session has no OPENAI_API_KEY"))?;
    let url = format!("{base}/chat/completions");
    let stream = index % 2 == 1;
    let tools = index.is_multiple_of(4);
    let mut messages = vec![json!({"role": "system", "content": "You are a demo agent."})];
    for turn in 0..turns {
        let text = if tools && turn == 1 {
            format!("rollout {index}: please use a tool to look this up")
        } else {
            format!("rollout {index} turn {turn}")
        };
        messages.push(json!({"role": "user", "content": text}));
        let reply = call(client, &url, key, &messages, stream, tools, outcome).await?;
        messages.push(reply.to_message());
        if reply.tool_calls.is_empty() {
            if reply.content != format!("echo: {text}") {
                bail!("turn {turn}: unexpected reply {:?}", reply.content);
            }
            continue;
        }
        for tc in &reply.tool_calls {
            messages.push(json!({"role": "tool", "tool_call_id": tc.id,
                "content": format!("result of {} for rollout {index}", tc.name)}));
        }
        let after = call(client, &url, key, &messages, stream, tools, outcome).await?;
        if !after.content.starts_with("tool said: ") {
            bail!(
                "turn {turn}: unexpected reply to the tool result {:?}",
                after.content
            );
        }
        messages.push(after.to_message());
    }
    Ok(())
}

async fn call(
    client: &HttpClient,
    url: &str,
    key: &str,
    messages: &[Value],
    stream: bool,
    tools: bool,
    outcome: &mut RolloutOutcome,
) -> anyhow::Result<Assistant> {
    let mut body = json!({"model": "gpt-4o-mini", "messages": messages});
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    if tools {
        body["tools"] = json!([{"type": "function", "function": {"name": "lookup",
            "description": "Looks something up.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}]);
    }
    let started = Instant::now();
    outcome.calls += 1;
    let resp = client
        .send(Method::POST, url, Some(key), Some(&body))
        .await?;
    outcome.latencies.push(started.elapsed());
    if resp.status != StatusCode::OK {
        bail!(
            "the call answered {}: {}",
            resp.status,
            String::from_utf8_lossy(&resp.body)
        );
    }
    if stream {
        parse_stream(&resp.body)
    } else {
        parse_completion(&resp.json()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&v, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
        assert_eq!(percentile(&v[..1], 99.0), Duration::from_millis(1));
    }
}
