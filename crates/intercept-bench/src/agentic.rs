//! Agent-shaped load: rollouts run tool loops against a chat completions URL, the way
//! coding agents drive a model. Every call carries ~20 KB of tool definitions and the
//! whole conversation so far; each turn adds the model's answer and a ~2 KB tool result,
//! so a request grows from ~25 KB at turn 1 to ~105 KB at turn 40 (contexts of ~5 KB to
//! ~100 KB); every other call is streamed.
//!
//! Rollouts run in waves of [`AgenticConfig::sessions`], in lock-step: every rollout of
//! a wave sends its turn `t`, and turn `t + 1` starts when all of them have their answer.
//! Around each turn the on-CPU time of the target's processes
//! ([`AgenticConfig::cpu_pids`], nanosecond [`procfs::run_ns`]) is read, so the report
//! holds the target's CPU per call at each turn: whether matching a prompt against what
//! a session already holds costs what the new messages cost or what the whole context
//! costs. Each rollout of the run uses its own secret (one session of `intercept serve`
//! each) while there are secrets enough.
//!
//! ```no_run
//! use std::time::Duration;
//! use intercept_bench::agentic::{self, AgenticConfig};
//!
//! # async fn run() -> anyhow::Result<()> {
//! let config = AgenticConfig {
//!     duration: Duration::from_secs(10),
//!     ..AgenticConfig::new(
//!         "http://127.0.0.1:8000/v1/chat/completions".parse()?,
//!         vec!["secret".into()],
//!     )
//! };
//! let report = agentic::run(&config).await?;
//! println!("{:.0} calls/s, {:?} ns of CPU per call at turn 40", report.rps, report.cpu_ns_last);
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Context as _, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::{json, Value};

use crate::load::Percentiles;
use crate::procfs;
use crate::trace_size::{text, tools};

/// Turns averaged for the first and the last figures of [`AgenticReport`].
pub const EDGE_TURNS: usize = 5;

/// What to run.
#[derive(Debug, Clone)]
pub struct AgenticConfig {
    /// The chat completions URL (`http://host:port/v1/chat/completions`).
    pub url: Uri,
    /// Bearer secrets; rollout `i` uses `secrets[i % len]`.
    pub secrets: Vec<String>,
    /// The number of the run's first rollout: a later run on the same sessions starts
    /// where the last one ended, so that no session sees a conversation twice.
    pub first_rollout: usize,
    /// Rollouts per wave (in flight at once).
    pub sessions: usize,
    /// Calls per rollout.
    pub turns: usize,
    /// No wave starts after this long (a started wave runs to its end).
    pub duration: Duration,
    /// At most this many waves.
    pub max_waves: usize,
    /// Processes whose on-CPU time is read around each turn (the target's).
    pub cpu_pids: Vec<u32>,
    /// Per-call timeout.
    pub timeout: Duration,
}

impl AgenticConfig {
    /// 16 rollouts per wave, 40 turns, 10 s.
    pub fn new(url: Uri, secrets: Vec<String>) -> Self {
        AgenticConfig {
            url,
            secrets,
            first_rollout: 0,
            sessions: 16,
            turns: 40,
            duration: Duration::from_secs(10),
            max_waves: usize::MAX,
            cpu_pids: Vec::new(),
            timeout: Duration::from_secs(60),
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AgenticReport {
    /// Rollouts per wave.
    pub sessions: usize,
    /// Calls per rollout.
    pub turns: usize,
    /// Waves run.
    pub waves: usize,
    /// Rollouts run (waves × sessions).
    pub rollouts: usize,
    /// Whether a secret served more than one rollout (too few secrets for the run).
    pub secrets_reused: bool,
    /// Calls answered 200 and parsed.
    pub calls: u64,
    /// Calls that failed (a rollout ends at its first failure).
    pub errors: u64,
    /// Failures by kind.
    pub error_kinds: BTreeMap<String, u64>,
    /// Wall time of the waves.
    pub elapsed_s: f64,
    /// `calls / elapsed_s`.
    pub rps: f64,
    /// Request body bytes sent.
    pub request_bytes: u64,
    /// Response body bytes received.
    pub response_bytes: u64,
    /// Mean request body at turn 1 and at the last turn.
    pub request_bytes_first: f64,
    /// See `request_bytes_first`.
    pub request_bytes_last: f64,
    /// Call latency (request sent to response read), µs.
    pub latency_us: Percentiles,
    /// The target's on-CPU time over all turns (`None` without `cpu_pids`).
    pub cpu_ns: Option<u64>,
    /// `cpu_ns / calls`.
    pub cpu_ns_per_call: Option<f64>,
    /// The target's CPU per call at each turn, ns.
    pub cpu_ns_by_turn: Vec<f64>,
    /// The target's CPU per call over the first [`EDGE_TURNS`] turns, ns.
    pub cpu_ns_first: Option<f64>,
    /// The target's CPU per call over the last [`EDGE_TURNS`] turns, ns.
    pub cpu_ns_last: Option<f64>,
    /// `cpu_ns_last / cpu_ns_first`: how CPU per call grows with the context.
    pub cpu_growth: Option<f64>,
}

/// One rollout of a wave: its connection and its conversation, each message serialized
/// once.
struct Rollout {
    seed: usize,
    auth: HeaderValue,
    messages: Vec<Vec<u8>>,
    sender: Option<SendRequest<Full<Bytes>>>,
    failed: bool,
}

/// One call's outcome.
struct Outcome {
    latency: Duration,
    request_bytes: usize,
    response_bytes: usize,
}

/// A request body: the tools (serialized once per run) and the conversation, joined.
fn body(model_and_tools: &[u8], stream: bool, messages: &[Vec<u8>]) -> Bytes {
    let len = model_and_tools.len() + messages.iter().map(|m| m.len() + 1).sum::<usize>() + 40;
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(model_and_tools);
    out.extend_from_slice(if stream {
        br#","stream":true,"messages":["#
    } else {
        br#","stream":false,"messages":["#
    });
    for (i, m) in messages.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(m);
    }
    out.extend_from_slice(b"]}");
    Bytes::from(out)
}

async fn connect(addr: SocketAddr) -> Result<SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

impl Rollout {
    fn new(seed: usize, secret: &str) -> Result<Rollout> {
        let messages = [
            json!({"role": "system", "content": "You are a coding agent. Work step by step."}),
            json!({"role": "user", "content": format!("{} Fix the failing test; use a tool.", text(seed, 5000))}),
        ]
        .iter()
        .map(serde_json::to_vec)
        .collect::<Result<_, _>>()?;
        Ok(Rollout {
            seed,
            auth: HeaderValue::try_from(format!("Bearer {secret}"))
                .context("a secret is not a valid header value")?,
            messages,
            sender: None,
            failed: false,
        })
    }

    /// Sends turn `turn` and adds the answer and a tool result to the conversation.
    async fn step(&mut self, shared: &Shared, turn: usize) -> Result<Outcome> {
        let stream = turn % 2 == 1;
        let body = body(&shared.model_and_tools, stream, &self.messages);
        let request_bytes = body.len();
        if self.sender.as_ref().is_none_or(SendRequest::is_closed) {
            self.sender = Some(connect(shared.addr).await.context("connect")?);
        }
        let sender = self
            .sender
            .as_mut()
            .ok_or_else(|| anyhow!("no connection"))?;
        sender.ready().await.context("connection")?;
        let req = Request::builder()
            .method(Method::POST)
            .uri(shared.path.as_str())
            .header(http::header::HOST, shared.host.clone())
            .header(http::header::AUTHORIZATION, self.auth.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))?;
        let t0 = Instant::now();
        let answer = tokio::time::timeout(shared.timeout, async {
            let resp = sender.send_request(req).await.context("send")?;
            let status = resp.status();
            let bytes = resp.into_body().collect().await.context("body")?.to_bytes();
            ensure!(status.is_success(), "status {}", status.as_u16());
            Ok(bytes)
        })
        .await
        .map_err(|_| anyhow!("timeout"))??;
        let latency = t0.elapsed();
        let assistant = if stream {
            intercept_mock::harness::parse_stream(&answer)?
        } else {
            intercept_mock::harness::parse_completion(&serde_json::from_slice(&answer)?)?
        };
        self.messages
            .push(serde_json::to_vec(&assistant.to_message())?);
        let next: Value = match assistant.tool_calls.first() {
            Some(call) => {
                json!({"role": "tool", "tool_call_id": call.id, "content": text(self.seed * 100 + turn, 2000)})
            }
            None => {
                json!({"role": "user", "content": format!("Continue with step {turn}; use a tool.")})
            }
        };
        self.messages.push(serde_json::to_vec(&next)?);
        Ok(Outcome {
            latency,
            request_bytes,
            response_bytes: answer.len(),
        })
    }
}

/// What every rollout of a run shares.
struct Shared {
    addr: SocketAddr,
    host: HeaderValue,
    path: String,
    /// `{"model":"policy","tools":[...]` (no closing brace).
    model_and_tools: Vec<u8>,
    timeout: Duration,
}

fn on_cpu(pids: &[u32]) -> Option<u64> {
    if pids.is_empty() {
        return None;
    }
    pids.iter().map(|p| procfs::run_ns(*p)).sum()
}

/// Per-turn sums of a run.
#[derive(Default, Clone, Copy)]
struct TurnTally {
    calls: u64,
    cpu_ns: u64,
    request_bytes: u64,
}

/// Runs waves until the time or the waves are up. Fails only when the target cannot be
/// reached at all.
pub async fn run(config: &AgenticConfig) -> Result<AgenticReport> {
    ensure!(!config.secrets.is_empty(), "no secrets to send");
    ensure!(
        config.sessions > 0 && config.turns > 0,
        "no rollouts to run"
    );
    let authority = config
        .url
        .authority()
        .ok_or_else(|| anyhow!("{} has no host", config.url))?;
    let addr = tokio::net::lookup_host(authority.as_str())
        .await?
        .next()
        .ok_or_else(|| anyhow!("{authority} resolves to nothing"))?;
    let mut model_and_tools = br#"{"model":"policy","tools":"#.to_vec();
    model_and_tools.extend_from_slice(&serde_json::to_vec(&tools())?);
    let shared = std::sync::Arc::new(Shared {
        addr,
        host: HeaderValue::try_from(authority.as_str())?,
        path: config
            .url
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
        model_and_tools,
        timeout: config.timeout,
    });
    let mut latency = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3)?;
    let mut report = AgenticReport {
        sessions: config.sessions,
        turns: config.turns,
        ..AgenticReport::default()
    };
    let mut turns = vec![TurnTally::default(); config.turns];
    let started = Instant::now();
    let deadline = started + config.duration;
    while report.waves < config.max_waves && Instant::now() < deadline {
        let mut rollouts = Vec::with_capacity(config.sessions);
        for i in 0..config.sessions {
            let n = config.first_rollout + report.rollouts + i;
            report.secrets_reused |= n >= config.secrets.len();
            rollouts.push(Rollout::new(n, &config.secrets[n % config.secrets.len()])?);
        }
        report.rollouts += config.sessions;
        report.waves += 1;
        for (turn, tally) in turns.iter_mut().enumerate() {
            let before = on_cpu(&config.cpu_pids);
            let mut set = tokio::task::JoinSet::new();
            for mut rollout in rollouts.drain(..) {
                let shared = shared.clone();
                set.spawn(async move {
                    let outcome = if rollout.failed {
                        None
                    } else {
                        Some(rollout.step(&shared, turn).await)
                    };
                    (rollout, outcome)
                });
            }
            while let Some(done) = set.join_next().await {
                let (mut rollout, outcome) = done.context("a rollout panicked")?;
                match outcome {
                    Some(Ok(o)) => {
                        tally.calls += 1;
                        tally.request_bytes += o.request_bytes as u64;
                        report.calls += 1;
                        report.request_bytes += o.request_bytes as u64;
                        report.response_bytes += o.response_bytes as u64;
                        latency.saturating_record(o.latency.as_micros() as u64);
                    }
                    Some(Err(e)) => {
                        rollout.failed = true;
                        report.errors += 1;
                        *report.error_kinds.entry(format!("{e:#}")).or_default() += 1;
                    }
                    None => {}
                }
                rollouts.push(rollout);
            }
            if let (Some(b), Some(a)) = (before, on_cpu(&config.cpu_pids)) {
                tally.cpu_ns += a.saturating_sub(b);
            }
        }
        if report.calls == 0 {
            let kinds: Vec<&String> = report.error_kinds.keys().collect();
            anyhow::bail!("no call succeeded: {kinds:?}");
        }
    }
    report.elapsed_s = started.elapsed().as_secs_f64();
    report.rps = report.calls as f64 / report.elapsed_s.max(1e-9);
    report.latency_us = Percentiles::of(&latency);
    let mean = |t: &TurnTally, v: u64| v as f64 / t.calls.max(1) as f64;
    report.request_bytes_first = mean(&turns[0], turns[0].request_bytes);
    let last = &turns[config.turns - 1];
    report.request_bytes_last = mean(last, last.request_bytes);
    if !config.cpu_pids.is_empty() {
        let cpu: u64 = turns.iter().map(|t| t.cpu_ns).sum();
        report.cpu_ns = Some(cpu);
        report.cpu_ns_per_call = Some(cpu as f64 / report.calls.max(1) as f64);
        report.cpu_ns_by_turn = turns.iter().map(|t| mean(t, t.cpu_ns)).collect();
        let edge = EDGE_TURNS.min(config.turns);
        let over = |ts: &[TurnTally]| {
            let calls: u64 = ts.iter().map(|t| t.calls).sum();
            let cpu: u64 = ts.iter().map(|t| t.cpu_ns).sum();
            cpu as f64 / calls.max(1) as f64
        };
        let first = over(&turns[..edge]);
        let last = over(&turns[config.turns - edge..]);
        report.cpu_ns_first = Some(first);
        report.cpu_ns_last = Some(last);
        report.cpu_growth = Some(last / first.max(1.0));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_the_tools_and_the_conversation_as_json() {
        let messages = vec![
            br#"{"role":"user","content":"a"}"#.to_vec(),
            br#"{"role":"assistant","content":"b"}"#.to_vec(),
        ];
        for stream in [false, true] {
            let v: Value = serde_json::from_slice(&body(
                br#"{"model":"policy","tools":[]"#,
                stream,
                &messages,
            ))
            .unwrap();
            assert_eq!(
                v,
                json!({"model": "policy", "tools": [], "stream": stream, "messages": [
                    {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})
            );
        }
    }
}
