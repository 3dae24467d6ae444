//! Time to first token on the token path (`bench-tito-ttft`): the same engine answers,
//! with a fixed first-token delay, a Chat Completions tool loop sent through
//! `intercept serve` with `tokens` (rendered on a loop's first turn, bridged on the
//! others) and, right after each call, the exact engine request intercept made, sent to
//! the engine directly. The difference per pair is what the token path adds before the
//! first token reaches the harness: reading and keying the conversation, rendering or
//! bridging it, the proxy's hops, and parsing the first ids back into a delta.
//!
//! The engine is [`intercept_mock`]'s vLLM `/inference/v1/generate` with Qwen3's real
//! tokenizer, in this process; it waits `first_token` before its answer's headers, then
//! streams the completion at once. Each scripted turn is text (its first token is the
//! first delta) followed by one tool call; the loop appends the call's result (about
//! `tool_result_chars` characters) and calls again.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{Method, Request};
use http_body_util::{BodyExt as _, Full};
use intercept_mock::{MockConfig, MockUpstream, Reply, ToolCall};
use serde::Serialize;
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt as _;
use tokio::net::TcpStream;

use crate::load::Percentiles;
use crate::serve_api::{ControlClient, Ready};

/// What to measure.
#[derive(Debug, Clone)]
pub struct TtftConfig {
    /// The `intercept` binary (`intercept serve` is started from it).
    pub intercept: PathBuf,
    /// Qwen3's tokenizer folder (`tokenizer.json`, `tokenizer_config.json`).
    pub tokenizer: PathBuf,
    /// Tool loops, each in a session of its own.
    pub loops: usize,
    /// Calls per loop.
    pub turns: usize,
    /// How long the engine waits before its first token.
    pub first_token: Duration,
    /// About how long each tool result is, in characters.
    pub tool_result_chars: usize,
}

impl TtftConfig {
    /// 5 loops of 40 turns, a 20 ms first token, 600-character tool results.
    pub fn new(intercept: PathBuf, tokenizer: PathBuf) -> Self {
        TtftConfig {
            intercept,
            tokenizer,
            loops: 5,
            turns: 40,
            first_token: Duration::from_millis(20),
            tool_result_chars: 600,
        }
    }
}

/// Times to first token in µs, directly and through intercept, over the same calls.
#[derive(Debug, Clone, Serialize)]
pub struct TtftReport {
    /// Measured pairs (a call through intercept and its engine request sent directly).
    pub pairs: u64,
    /// The engine's first-token delay, ms.
    pub first_token_ms: f64,
    /// To the engine directly.
    pub direct_us: Percentiles,
    /// Through `intercept serve` with `tokens`.
    pub through_us: Percentiles,
    /// Through minus direct, per pair.
    pub added_us: Percentiles,
    /// Added per pair on the loops' first turns (rendered whole).
    pub added_rendered_us: Percentiles,
    /// Added per pair on the other turns (bridged).
    pub added_bridged_us: Percentiles,
    /// How many calls took each token path (`rendered`, `bridged`), from the records.
    pub paths: BTreeMap<String, u64>,
    /// The longest prompt sent, in ids.
    pub max_prompt_ids: usize,
}

impl TtftReport {
    /// Through p50 over direct p50.
    pub fn ratio_p50(&self) -> f64 {
        ratio(self.through_us.p50, self.direct_us.p50)
    }

    /// Through p99 over direct p99.
    pub fn ratio_p99(&self) -> f64 {
        ratio(self.through_us.p99, self.direct_us.p99)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    a as f64 / (b.max(1)) as f64
}

/// Histograms of the run, in µs.
struct Tally {
    direct: Histogram<u64>,
    through: Histogram<u64>,
    added: Histogram<u64>,
    rendered: Histogram<u64>,
    bridged: Histogram<u64>,
}

impl Tally {
    fn new() -> Result<Tally> {
        let h = || Histogram::<u64>::new(3).map_err(|e| anyhow!("histogram: {e}"));
        Ok(Tally {
            direct: h()?,
            through: h()?,
            added: h()?,
            rendered: h()?,
            bridged: h()?,
        })
    }

    fn add(&mut self, direct: Duration, through: Duration, first_turn: bool) -> Result<()> {
        let us = |d: Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
        let added = us(through.saturating_sub(direct));
        self.direct.record(us(direct))?;
        self.through.record(us(through))?;
        self.added.record(added)?;
        if first_turn {
            self.rendered.record(added)?;
        } else {
            self.bridged.record(added)?;
        }
        Ok(())
    }
}

/// A started `intercept serve`, killed when dropped.
struct Serve {
    _child: tokio::process::Child,
    ready: Ready,
}

impl Serve {
    async fn start(
        program: &std::path::Path,
        upstream: &str,
        trace: &std::path::Path,
    ) -> Result<Serve> {
        let mut child = tokio::process::Command::new(program)
            .args([
                "serve",
                "--upstream",
                upstream,
                "--model",
                "policy",
                "--log",
                "warn",
            ])
            .arg("--trace-dir")
            .arg(trace)
            // The bench's own variable is not a setting of intercept's.
            .env_remove("INTERCEPT_QWEN3_TOKENIZER")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {} serve", program.display()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(60),
            tokio::io::BufReader::new(stdout).read_line(&mut line),
        )
        .await
        .context("intercept serve printed no ready line within 60 s")??;
        let ready = Ready::parse(&line)?;
        Ok(Serve {
            _child: child,
            ready,
        })
    }
}

/// One HTTP/1.1 keep-alive connection that times a streamed answer.
struct Conn {
    addr: SocketAddr,
    sender: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>>,
}

impl Conn {
    fn new(addr: SocketAddr) -> Conn {
        Conn { addr, sender: None }
    }

    /// POSTs `body` to `path`, and reads the whole streamed answer: its bytes and when
    /// (since the request was sent) a frame first held what `first` looks for.
    async fn stream(
        &mut self,
        path: &str,
        bearer: Option<&str>,
        body: Bytes,
        first: fn(&[u8]) -> bool,
    ) -> Result<(Vec<u8>, Duration)> {
        let sender = match self.sender.take() {
            Some(s) if !s.is_closed() => s,
            _ => {
                let tcp = TcpStream::connect(self.addr).await?;
                tcp.set_nodelay(true)?;
                let (sender, conn) =
                    hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                        .await?;
                tokio::spawn(conn);
                sender
            }
        };
        let mut sender = sender;
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(http::header::HOST, self.addr.to_string())
            .header(http::header::CONTENT_TYPE, "application/json");
        if let Some(token) = bearer {
            req = req.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let req = req.body(Full::new(body))?;
        sender.ready().await?;
        let t0 = Instant::now();
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let mut body = resp.into_body();
        let mut all = Vec::new();
        let mut at = None;
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                all.extend_from_slice(&data);
                if at.is_none() && first(&all) {
                    at = Some(t0.elapsed());
                }
            }
        }
        self.sender = Some(sender);
        if !status.is_success() {
            bail!("{path}: {status}: {}", String::from_utf8_lossy(&all));
        }
        let at = at.ok_or_else(|| {
            anyhow!(
                "{path}: no first token in the answer: {}",
                String::from_utf8_lossy(&all)
            )
        })?;
        Ok((all, at))
    }
}

/// A vLLM stream chunk with ids in it: `"token_ids":[` and a digit.
fn engine_first(all: &[u8]) -> bool {
    find_then(all, b"\"token_ids\":[", |c| c.is_ascii_digit())
}

/// A Chat Completions delta with text in it: `"content":"` or `"reasoning_content":"`
/// and a character other than the closing quote.
fn chat_first(all: &[u8]) -> bool {
    find_then(all, b"\"content\":\"", |c| c != b'"')
        || find_then(all, b"\"reasoning_content\":\"", |c| c != b'"')
}

/// Whether `needle` occurs in `hay` followed by a byte that passes `next`.
fn find_then(hay: &[u8], needle: &[u8], next: impl Fn(u8) -> bool) -> bool {
    hay.windows(needle.len() + 1)
        .any(|w| w[..needle.len()] == *needle && next(w[needle.len()]))
}

/// A system prompt of an agent's size, made of distinct lines.
fn system_prompt() -> String {
    let mut s = String::from(
        "You are a coding agent. Work in the repository, run commands, read files, and report.\n",
    );
    for i in 0..60 {
        s.push_str(&format!(
            "- Rule {i}: keep changes minimal, run the tests after edit {i}, and say what changed in file_{i}.rs.\n"
        ));
    }
    s
}

fn tools() -> Value {
    let tool = |name: &str, what: &str, arg: &str| {
        json!({"type": "function", "function": {"name": name, "description": what,
            "parameters": {"type": "object", "properties": {arg: {"type": "string"}}, "required": [arg]}}})
    };
    json!([
        tool(
            "shell",
            "Run a shell command and return its output.",
            "command"
        ),
        tool("read_file", "Read a file of the repository.", "path"),
        tool("search", "Search the repository for a pattern.", "pattern"),
    ])
}

/// A tool result of about `chars` characters, different on every turn.
fn tool_result(turn: usize, chars: usize) -> String {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < chars {
        s.push_str(&format!(
            "src/module_{turn}_{i}.rs:{}: fn item_{i}() -> u32 {{ {} }}\n",
            10 + i,
            turn * 31 + i
        ));
        i += 1;
    }
    s
}

/// Runs the measurement.
pub async fn run(config: &TtftConfig) -> Result<TtftReport> {
    let tokenizer = intercept_tokens::shared(&config.tokenizer).with_context(|| {
        format!(
            "cannot load the tokenizer at {}",
            config.tokenizer.display()
        )
    })?;
    let engine = MockUpstream::start_with(MockConfig {
        tokenizer: Some(tokenizer),
        header_delay: config.first_token,
        chunks: 8,
        ..MockConfig::default()
    })
    .await?;
    let trace = tempfile::tempdir()?;
    let serve = Serve::start(&config.intercept, &engine.base_url(), trace.path()).await?;
    let mut control = ControlClient::connect(&serve.ready).await?;
    let mut direct = Conn::new(engine.addr());
    let mut tally = Tally::new()?;
    let mut paths = BTreeMap::new();
    let mut max_prompt_ids = 0;
    let mut pairs = 0;
    let tokenizer_dir = config.tokenizer.to_string_lossy().into_owned();
    for l in 0..config.loops {
        let created = control
            .post(
                "/v1/sessions",
                json!({"id": format!("ttft-{l}"),
                       "tokens": {"renderer": "qwen3", "tokenizer": tokenizer_dir}}),
            )
            .await?;
        let base = created["env"]["OPENAI_BASE_URL"]
            .as_str()
            .context("no OPENAI_BASE_URL")?;
        let uri: http::Uri = format!("{}/chat/completions", base.trim_end_matches('/')).parse()?;
        let addr: SocketAddr = uri
            .authority()
            .context("no authority")?
            .as_str()
            .parse()
            .context("the session's base URL is not an IP address and port")?;
        let chat_path = uri.path().to_owned();
        let secret = created["model_secret"]
            .as_str()
            .context("no model_secret")?
            .to_owned();
        let mut through = Conn::new(addr);
        let mut messages = vec![
            json!({"role": "system", "content": system_prompt()}),
            json!({"role": "user", "content": format!("Find where item_{l} is defined and fix its test.")}),
        ];
        for turn in 0..config.turns {
            let reply = || {
                Reply::text(format!("Looking at step {turn} of the task.")).with_tool_call(
                    ToolCall::new(
                        "shell",
                        format!(r#"{{"command": "grep -rn item_{turn} src"}}"#),
                    ),
                )
            };
            // Through intercept.
            engine.push(reply());
            let body = json!({"model": "policy", "messages": messages, "tools": tools(), "stream": true,
                              "max_tokens": 256});
            let (answer, t_through) = through
                .stream(
                    &chat_path,
                    Some(&secret),
                    serde_json::to_vec(&body)?.into(),
                    chat_first,
                )
                .await?;
            // Calls run one at a time: the engine's last request is intercept's.
            let sent = engine.last_request().context("the engine got no request")?;
            let sent_body = sent
                .json()
                .context("the engine request is not JSON")?
                .clone();
            max_prompt_ids =
                max_prompt_ids.max(sent_body["token_ids"].as_array().map_or(0, Vec::len));
            // The same engine request, directly.
            engine.push(reply());
            let (_, t_direct) = direct
                .stream(
                    &sent.path,
                    None,
                    serde_json::to_vec(&sent_body)?.into(),
                    engine_first,
                )
                .await?;
            tally.add(t_direct, t_through, turn == 0)?;
            pairs += 1;
            let assistant = intercept_mock::harness::parse_stream(&answer)?;
            let Some(call) = assistant.tool_calls.first() else {
                bail!("turn {turn}: the answer made no tool call");
            };
            let id = call.id.clone();
            // The message as a harness sends it back: its text and its call.
            messages.push(json!({"role": "assistant", "content": assistant.content,
                "tool_calls": [{"id": call.id, "type": "function",
                                "function": {"name": call.name, "arguments": call.arguments}}]}));
            messages.push(json!({"role": "tool", "tool_call_id": id,
                                 "content": tool_result(turn, config.tool_result_chars)}));
        }
        let trace = control.get(&format!("/v1/sessions/ttft-{l}/trace")).await?;
        for call in trace["calls"].as_array().into_iter().flatten() {
            let path = call["token_path"].as_str().unwrap_or("none").to_owned();
            *paths.entry(path).or_insert(0) += 1;
        }
    }
    drop(serve);
    engine.shutdown().await;
    Ok(TtftReport {
        pairs,
        first_token_ms: config.first_token.as_secs_f64() * 1e3,
        direct_us: Percentiles::of(&tally.direct),
        through_us: Percentiles::of(&tally.through),
        added_us: Percentiles::of(&tally.added),
        added_rendered_us: Percentiles::of(&tally.rendered),
        added_bridged_us: Percentiles::of(&tally.bridged),
        paths,
        max_prompt_ids,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_token_is_found_in_either_stream() {
        assert!(!engine_first(br#"data: {"choices":[{"token_ids":[],"#));
        assert!(engine_first(br#"data: {"choices":[{"token_ids":[151667,"#));
        assert!(!chat_first(
            br#"data: {"choices":[{"delta":{"role":"assistant","content":""}}]}"#
        ));
        assert!(chat_first(
            br#"data: {"choices":[{"delta":{"content":"Look"}}]}"#
        ));
        assert!(chat_first(
            br#"data: {"choices":[{"delta":{"reasoning_content":"Hm"}}]}"#
        ));
    }

    #[test]
    fn tool_results_have_the_asked_size_and_differ_by_turn() {
        let a = tool_result(1, 600);
        assert!((600..700).contains(&a.len()), "{}", a.len());
        assert_ne!(a, tool_result(2, 600));
    }
}
