//! What a rollout's trace costs on disk and in memory, on agent-shaped traffic.
//!
//! Sessions run tool loops through a real [`InterceptionServer`] over real HTTP against
//! the mock model ([`Workload`]): every call carries ~20 KB of tool definitions and the
//! whole conversation so far; each turn adds the model's answer and a ~2 KB tool result
//! (or, in the screenshot case, a ~20 KB base64 image that every later request carries
//! again; or, in the short case, one small tool and messages of a few words, as
//! `intercept demo` sends); every other call is streamed. Each session records through
//! the sidecar's writer ([`intercept_trace::TraceWriter`]) into a folder, once as the
//! trace log and once in the full format, and the report compares both with the unique
//! content ([`intercept_trace::stats::unique_content`]) and with the session's memory.

use std::path::Path;
use std::sync::Arc;

use anyhow::{ensure, Context, Result};
use http::Method;
use intercept_core::{Interception, RecordSink, RolloutSession, SessionConfig, Upstream};
use intercept_mock::harness::{parse_completion, parse_stream, HttpClient};
use intercept_server::{InterceptionServer, ServerConfig};
use intercept_trace::{JsonlSink, TraceFormat, TraceWriter, WriterConfig};
use serde::Serialize;
use serde_json::{json, Value};

/// What each call of a session carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Workload {
    /// An agent's: ~20 KB of tools, ~2 KB tool results, a ~3 KB task.
    #[default]
    Agent,
    /// Screenshots instead of tool results: each turn adds a user message with a ~20 KB
    /// image, and every request carries all earlier ones.
    Screenshots,
    /// Short messages (a few words each) and one small tool, as `intercept demo` sends.
    Short,
}

/// A workload.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// Concurrent sessions.
    pub sessions: usize,
    /// Calls per session.
    pub turns: usize,
    /// What each call carries.
    pub workload: Workload,
}

/// What one run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    /// Sessions.
    pub sessions: usize,
    /// Calls per session.
    pub turns: usize,
    /// What each call carried.
    pub workload: Workload,
    /// Calls recorded.
    pub calls: u64,
    /// Request and response bytes the calls carried (what the harnesses sent and got).
    pub raw_bytes: u64,
    /// Distinct content of the calls (the unit of the ratios).
    pub unique_bytes: u64,
    /// The trace logs' bytes on disk.
    pub log_bytes: u64,
    /// The full-format files' bytes on disk (the records and the episode files).
    pub full_bytes: u64,
    /// The full format's records alone (without the episode files).
    pub records_bytes: u64,
    /// `log_bytes / unique_bytes`.
    pub log_ratio: f64,
    /// `full_bytes / unique_bytes`.
    pub full_ratio: f64,
    /// `full_bytes / log_bytes`: how much smaller the log is.
    pub reduction: f64,
    /// `log_bytes / records_bytes`.
    pub log_per_record: f64,
    /// Log bytes written per call.
    pub log_bytes_per_call: f64,
    /// Full-format bytes written per call.
    pub full_bytes_per_call: f64,
    /// Heap bytes a session holds for its record with the log in memory (no trace
    /// folder), per recorded call.
    pub memory_per_call: f64,
    /// `memory_per_call` / raw bytes per call.
    pub memory_ratio: f64,
}

/// ~20 KB of tool definitions.
pub(crate) fn tools() -> Value {
    let tools: Vec<Value> = (0..10)
        .map(|i| {
            json!({"type": "function", "function": {
                "name": format!("tool_{i}"),
                "description": format!("Tool {i}. ") + &"Runs a step of the task and reports what it found. ".repeat(38),
                "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "what to look for"}}, "required": ["query"]}
            }})
        })
        .collect();
    Value::Array(tools)
}

/// Deterministic filler text of `len` bytes.
pub(crate) fn text(seed: usize, len: usize) -> String {
    let words = [
        "alpha", "beta", "gamma", "delta", "file.rs", "line", "ok", "error:", "fn", "42",
    ];
    let mut out = String::with_capacity(len + 8);
    let mut i = seed.wrapping_mul(2_654_435_761);
    while out.len() < len {
        i = i
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        out.push_str(words[(i >> 33) % words.len()]);
        out.push(if (i >> 20).is_multiple_of(9) {
            '\n'
        } else {
            ' '
        });
    }
    out
}

/// A ~20 KB base64 "screenshot", different per step.
fn screenshot(session: usize, step: usize) -> String {
    use base64::Engine as _;
    let bytes: Vec<u8> = text(session * 1000 + step, 15_000).into_bytes();
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// One small tool, as the demo's.
fn small_tools() -> Value {
    json!([{"type": "function", "function": {"name": "lookup", "description": "Looks something up.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}])
}

/// One session's loop; returns the request and response bytes it carried.
async fn rollout(client: &HttpClient, url: &str, key: &str, case: Case, s: usize) -> Result<u64> {
    let short = case.workload == Workload::Short;
    let images = case.workload == Workload::Screenshots;
    let tools = if short { small_tools() } else { tools() };
    let mut messages = if short {
        vec![
            json!({"role": "system", "content": "You are a demo agent."}),
            json!({"role": "user", "content": format!("rollout {s}: look this up")}),
        ]
    } else {
        vec![
            json!({"role": "system", "content": "You are a coding agent. Work step by step."}),
            json!({"role": "user", "content": format!("{} Fix the failing test; use a tool.", text(s, 3000))}),
        ]
    };
    let mut raw = 0u64;
    for turn in 0..case.turns {
        let stream = turn % 2 == 1;
        let mut body = json!({"model": "policy", "messages": messages, "stream": stream});
        if !images {
            body["tools"] = tools.clone();
        }
        raw += serde_json::to_vec(&body)?.len() as u64;
        let resp = client
            .send(Method::POST, url, Some(key), Some(&body))
            .await?;
        ensure!(
            resp.status.is_success(),
            "call failed: {} {:?}",
            resp.status,
            resp.body
        );
        raw += resp.body.len() as u64;
        let answer = if stream {
            parse_stream(&resp.body)?
        } else {
            parse_completion(&resp.json()?)?
        };
        messages.push(answer.to_message());
        if images {
            messages.push(json!({"role": "user", "content": [
                {"type": "text", "text": format!("step {turn}: the screen now")},
                {"type": "image_url", "image_url": {"url": screenshot(s, turn)}},
            ]}));
        } else if let Some(call) = answer.tool_calls.first() {
            let result = if short {
                format!("result {turn} for rollout {s}")
            } else {
                text(s * 100 + turn, 2000)
            };
            messages.push(json!({"role": "tool", "tool_call_id": call.id, "content": result}));
        } else {
            messages.push(json!({"role": "user", "content": format!("Continue with step {turn}; use a tool.")}));
        }
    }
    Ok(raw)
}

/// Runs `case` once, recording into `dir` in `format` (or in memory only without `dir`);
/// returns the raw bytes carried, the calls, and the sessions.
async fn run(
    case: Case,
    dir: Option<(&Path, TraceFormat)>,
) -> Result<(u64, u64, Vec<Arc<RolloutSession>>)> {
    let mock = intercept_test::MockUpstream::start().await?;
    let server = InterceptionServer::new(ServerConfig::default())?;
    server.start().await?;
    let writer = TraceWriter::start(WriterConfig::default())?;
    let client = HttpClient::new();
    let mut tasks = Vec::new();
    let mut sessions = Vec::new();
    for s in 0..case.sessions {
        let id = format!("rollout-{s}");
        let mut session = RolloutSession::new(SessionConfig::new(
            id.clone(),
            "policy",
            Upstream::new(mock.base_url()),
        ));
        if let Some((dir, format)) = dir {
            let sink = writer
                .sink(JsonlSink::create_new(dir.join(format!("{id}.jsonl")))?.with_format(format));
            session = session
                .with_calls_in_memory(false)
                .with_sink(Arc::new(sink) as Arc<dyn RecordSink>);
        }
        let session = Arc::new(session);
        let guard = server.acquire(session.clone()).await?;
        sessions.push(session);
        let url = format!("{}/v1/chat/completions", guard.slot().base_url);
        let key = guard.slot().model_secret.expose().to_owned();
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let raw = rollout(&client, &url, &key, case, s).await;
            guard.close().await;
            raw
        }));
    }
    let mut raw = 0;
    for t in tasks {
        raw += t.await.context("a rollout panicked")??;
    }
    writer.flush();
    for session in &sessions {
        if let Some((dir, TraceFormat::Full)) = dir {
            intercept_trace::save_episode(Some(dir), TraceFormat::Full, session);
        }
    }
    let calls = sessions.iter().map(|s| s.calls() as u64).sum();
    server.stop().await?;
    mock.shutdown().await;
    Ok((raw, calls, sessions))
}

/// Bytes of the files in `dir` whose names end with `suffix`.
fn dir_bytes(dir: &Path, suffix: &str) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().ends_with(suffix) {
            total += entry.metadata()?.len();
        }
    }
    Ok(total)
}

/// Measures `case`: the log and the full format on disk, the log in memory.
pub async fn measure(case: Case) -> Result<Report> {
    let log_dir = tempfile::tempdir()?;
    let full_dir = tempfile::tempdir()?;
    let (raw, calls, _) = run(case, Some((log_dir.path(), TraceFormat::Log))).await?;
    let (_, full_calls, _) = run(case, Some((full_dir.path(), TraceFormat::Full))).await?;
    ensure!(
        calls == full_calls,
        "the two runs recorded {calls} and {full_calls} calls"
    );
    let (_, _, in_memory) = run(case, None).await?;
    let memory: usize = in_memory.iter().map(|s| s.record_heap_bytes()).sum();
    let mut unique = 0;
    for entry in std::fs::read_dir(log_dir.path())? {
        let log = intercept_trace::read_log_file(&entry?.path())?;
        ensure!(
            !log.incomplete() && log.skipped().is_empty(),
            "a log did not read back whole"
        );
        unique += intercept_trace::stats::unique_content(&log.records()?);
    }
    let log_bytes = dir_bytes(log_dir.path(), "")?;
    let full_bytes = dir_bytes(full_dir.path(), "")?;
    let records_bytes = dir_bytes(full_dir.path(), ".jsonl")?;
    let per = |b: u64| b as f64 / calls.max(1) as f64;
    Ok(Report {
        sessions: case.sessions,
        turns: case.turns,
        workload: case.workload,
        calls,
        raw_bytes: raw,
        unique_bytes: unique,
        log_bytes,
        full_bytes,
        records_bytes,
        log_ratio: log_bytes as f64 / unique.max(1) as f64,
        full_ratio: full_bytes as f64 / unique.max(1) as f64,
        reduction: full_bytes as f64 / log_bytes.max(1) as f64,
        log_per_record: log_bytes as f64 / records_bytes.max(1) as f64,
        log_bytes_per_call: per(log_bytes),
        full_bytes_per_call: per(full_bytes),
        memory_per_call: memory as f64 / calls.max(1) as f64,
        memory_ratio: memory as f64 / raw.max(1) as f64,
    })
}
