//! Real harness programs train token-exact through the built `intercept serve`: Codex CLI
//! (the Responses API) and Claude Code (Anthropic Messages), each run non-interactively
//! against a session created with `tokens` (Qwen3's renderer), whose upstream is the mock
//! engine serving vLLM's `/inference/v1/generate` with Qwen3's real tokenizer.
//!
//! The engine answers first with a call of the harness's own shell tool (`cat` of a file
//! only the tool can read), then with a final text. The record must show every model call
//! on the token path, the tool-result turn `bridged` (its prompt ids start with the
//! previous prompt ids plus the completion ids), the engine receiving exactly the record's
//! prompt ids with the tool's output in them, and the harness printing the final answer.
//!
//! The programs come from npm (`@openai/codex`, `@anthropic-ai/claude-code`; `.ci/run`
//! installs them) and are found through `INTERCEPT_CODEX` and `INTERCEPT_CLAUDE`; the
//! tokenizer through `INTERCEPT_QWEN3_TOKENIZER`. Without them these tests fail under `CI`
//! and are skipped with a notice otherwise. Each program runs with loopback only in mind:
//! its telemetry, update checks and other traffic are turned off, and it is killed when it
//! outlives [`PROGRAM_WAIT`].

// Helpers outside #[test] functions panic on purpose, like the tests themselves.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use intercept_core::{CallRecord, TokenPath};
use intercept_mock::harness::HttpClient;
use intercept_test::{MockConfig, MockUpstream, Reply};
use intercept_tokens::Tokenizer;
use serde_json::{json, Value};
use tokio::process::Command;

/// How long a harness program may run before it is killed (a stuck program fails the
/// test instead of hanging it).
const PROGRAM_WAIT: Duration = Duration::from_secs(180);

/// What the file only the tool can read holds: found in the engine's prompt ids, it
/// proves the harness ran the tool and sent its output back.
const MARKER: &str = "harness-marker-5c1e";

/// The final answer the engine gives; the harness must print it.
const FINAL: &str = "The marker file holds the expected text.";

/// `var` names a file (a tokenizer folder or a program), or `None` with a notice outside
/// CI; under `CI` its absence fails the test.
fn required(var: &str, what: &str) -> Option<PathBuf> {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => {
            let path = PathBuf::from(v);
            assert!(
                path.exists(),
                "{var} names {}, which is not there",
                path.display()
            );
            Some(path)
        }
        _ if std::env::var_os("CI").is_some() => {
            panic!("{var} must name {what} under CI (.ci/run installs it)")
        }
        _ => {
            eprintln!("notice: {var} is not set ({what}); skipping this test");
            None
        }
    }
}

/// The engine, `intercept serve` in front of it, and a session with `tokens`.
struct Rig {
    engine: MockUpstream,
    tokenizer: Arc<Tokenizer>,
    serving: common::Serving,
    http: HttpClient,
    /// The session's `POST /v1/sessions` answer (`env`, `model_secret`, ...).
    session: Value,
    id: String,
    /// Holds the trace directory, the harness's home and its working directory.
    dir: tempfile::TempDir,
}

impl Rig {
    /// Starts the engine with `replies` scripted, `intercept serve` on it with a trace
    /// directory, and the session `id` with Qwen3's `tokens`.
    async fn start(tokenizer_dir: &Path, id: &str, replies: Vec<Reply>) -> Rig {
        let tokenizer = intercept_tokens::shared(tokenizer_dir).unwrap();
        let engine = MockUpstream::start_with(MockConfig {
            tokenizer: Some(tokenizer.clone()),
            ..MockConfig::default()
        })
        .await
        .unwrap();
        engine.push_many(replies);
        let dir = tempfile::tempdir().unwrap();
        for sub in ["trace", "home", "work"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        std::fs::write(dir.path().join("work/marker.txt"), format!("{MARKER}\n")).unwrap();
        let mut command = common::serve(&engine.base_url(), "policy");
        command.args(["--trace-dir", dir.path().join("trace").to_str().unwrap()]);
        let serving = common::start(command).await;
        let http = HttpClient::new();
        let created = http
            .send(
                Method::POST,
                &format!("{}/v1/sessions", serving.control),
                Some(&serving.token),
                Some(&json!({
                    "id": id,
                    "tokens": {"renderer": "qwen3", "tokenizer": tokenizer_dir},
                })),
            )
            .await
            .unwrap();
        assert_eq!(
            created.status,
            StatusCode::CREATED,
            "{}",
            String::from_utf8_lossy(&created.body)
        );
        Rig {
            engine,
            tokenizer,
            serving,
            http,
            session: created.json().unwrap(),
            id: id.to_owned(),
            dir,
        }
    }

    /// The session's `env` value `key`.
    fn env(&self, key: &str) -> String {
        self.session["env"][key].as_str().unwrap().to_owned()
    }

    fn secret(&self) -> String {
        self.session["model_secret"].as_str().unwrap().to_owned()
    }

    fn path(&self, sub: &str) -> PathBuf {
        self.dir.path().join(sub)
    }

    /// `program` with an empty environment but `PATH` (its tool runs shell commands),
    /// a fresh `HOME`, standard input closed, and the working directory holding the file.
    fn command(&self, program: &Path) -> Command {
        let mut command = Command::new(program);
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", self.path("home"))
            .env("NO_COLOR", "1")
            .current_dir(self.path("work"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    /// The session's records, from the control API and, once it is released, from its
    /// trace file: the two must agree.
    async fn records(&self) -> Vec<CallRecord> {
        let control = &self.serving.control;
        let trace = self
            .http
            .send(
                Method::GET,
                &format!("{control}/v1/sessions/{}/trace", self.id),
                Some(&self.serving.token),
                None,
            )
            .await
            .unwrap();
        assert_eq!(trace.status, StatusCode::OK);
        let calls: Vec<CallRecord> =
            serde_json::from_value(trace.json().unwrap()["calls"].clone()).unwrap();
        let released = self
            .http
            .send(
                Method::DELETE,
                &format!("{control}/v1/sessions/{}", self.id),
                Some(&self.serving.token),
                None,
            )
            .await
            .unwrap();
        assert_eq!(released.status, StatusCode::OK);
        let file = self.path("trace").join(format!("{}.jsonl", self.id));
        let logged = intercept_trace::read_trace_file(&file).unwrap();
        assert!(logged.skipped.is_empty());
        let logged: Vec<Value> = logged
            .records
            .iter()
            .map(|c| serde_json::to_value(c).unwrap())
            .collect();
        let served: Vec<Value> = calls
            .iter()
            .map(|c| serde_json::to_value(c).unwrap())
            .collect();
        assert_eq!(logged, served, "the trace file and the control API differ");
        calls
    }

    async fn stop(self) {
        self.serving.sigterm();
        let exited = self.serving.exit().await;
        assert!(exited.status.success(), "{}", exited.logs);
        self.engine.shutdown().await;
    }
}

/// Runs a harness program to its end within [`PROGRAM_WAIT`] (killed otherwise).
async fn run(mut command: Command, name: &str) -> Output {
    let child = command.spawn().unwrap();
    match tokio::time::timeout(PROGRAM_WAIT, child.wait_with_output()).await {
        Ok(output) => output.unwrap(),
        // Dropping the future drops the child, which kills it (`kill_on_drop`).
        Err(_) => panic!("{name} did not finish within {PROGRAM_WAIT:?}; it was killed"),
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// What every harness must show: `main` model calls (the first rendered, each later one
/// bridged from the one before), all of the session's calls on the token path, the engine
/// receiving exactly the record's prompt ids, and the tool's output in the bridged prompt.
fn assert_token_exact(rig: &Rig, calls: &[CallRecord], main: usize, output: &Output) {
    let sent: Vec<Vec<u32>> = rig
        .engine
        .requests()
        .iter()
        .map(|r| {
            assert!(r.path.ends_with("/inference/v1/generate"), "{}", r.path);
            serde_json::from_value(r.json().unwrap()["token_ids"].clone()).unwrap()
        })
        .collect();
    let report = || {
        format!(
            "stdout:\n{}\nstderr:\n{}\ncalls: {:?}",
            text(&output.stdout),
            text(&output.stderr),
            calls
                .iter()
                .map(|c| (
                    &c.endpoint,
                    c.status,
                    c.token_path,
                    c.token_reason.as_deref()
                ))
                .collect::<Vec<_>>()
        )
    };
    assert_eq!(calls.len(), main, "{}", report());
    assert_eq!(sent.len(), calls.len(), "{}", report());
    for (i, (call, sent)) in calls.iter().zip(&sent).enumerate() {
        assert_eq!(call.status, 200, "call {i}: {}", report());
        let prompt = call.prompt_token_ids.as_ref().unwrap();
        assert_eq!(
            prompt, sent,
            "call {i}: the engine got other ids than the record"
        );
        let completion = call.completion_token_ids.as_ref().unwrap();
        assert!(!completion.is_empty(), "call {i}");
        assert_eq!(
            call.completion_logprobs.as_ref().map(Vec::len),
            Some(completion.len()),
            "call {i}"
        );
    }
    assert_eq!(
        calls[0].token_path,
        Some(TokenPath::Rendered),
        "{}",
        report()
    );
    assert_eq!(calls[0].token_reason.as_deref(), Some("first_turn"));
    for i in 1..main {
        assert_eq!(
            (calls[i].token_path, calls[i].token_reason.as_deref()),
            (Some(TokenPath::Bridged), None),
            "call {i}: {}",
            report()
        );
        let previous = calls[i - 1].prompt_token_ids.as_ref().unwrap();
        let completion = calls[i - 1].completion_token_ids.as_ref().unwrap();
        let prompt = calls[i].prompt_token_ids.as_ref().unwrap();
        assert!(prompt.len() > previous.len() + completion.len());
        assert_eq!(&prompt[..previous.len()], &previous[..], "call {i}");
        assert_eq!(
            &prompt[previous.len()..previous.len() + completion.len()],
            &completion[..],
            "call {i}: the prompt does not continue the sampled ids"
        );
    }
    // The tool ran: its output reached the engine in the bridged turn, and only there.
    let first = calls[0].prompt_token_ids.as_ref().unwrap();
    assert!(!rig.tokenizer.decode(first).contains(MARKER));
    let bridged = calls[1].prompt_token_ids.as_ref().unwrap();
    let tail = rig.tokenizer.decode(&bridged[first.len()..]);
    assert!(
        tail.contains(MARKER),
        "no tool output in the bridged turn: {tail}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_cli_trains_token_exact_through_the_token_path() {
    let Some(tokenizer) = required("INTERCEPT_QWEN3_TOKENIZER", "Qwen3's tokenizer folder") else {
        return;
    };
    let Some(codex) = required("INTERCEPT_CODEX", "the `codex` program of @openai/codex") else {
        return;
    };
    // Codex offers its shell as `exec_command` (`cmd`: a command line).
    let rig = Rig::start(
        &tokenizer,
        "codex",
        vec![
            Reply::tool_call("exec_command", json!({"cmd": "cat marker.txt"}).to_string())
                .with_reasoning("Read the marker file with the shell."),
            Reply::text(FINAL).with_reasoning("The tool printed the marker."),
        ],
    )
    .await;
    let home = rig.path("codex-home");
    std::fs::create_dir(&home).unwrap();
    std::fs::write(
        home.join("config.toml"),
        format!(
            r#"model = "policy"
model_provider = "intercept"
check_for_update_on_startup = false

[model_providers.intercept]
name = "intercept"
base_url = {base_url}
env_key = "INTERCEPT_MODEL_SECRET"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
"#,
            base_url = toml::Value::String(rig.env("OPENAI_BASE_URL")),
        ),
    )
    .unwrap();
    let mut command = rig.command(&codex);
    command
        .env("CODEX_HOME", &home)
        .env("INTERCEPT_MODEL_SECRET", rig.secret())
        .args([
            "exec",
            "--strict-config",
            "--ephemeral",
            "--skip-git-repo-check",
        ])
        // The engine is scripted; the tool runs unsandboxed in the test's directory.
        .args(["--sandbox", "danger-full-access", "--color", "never"])
        .arg("Print what marker.txt holds.");
    let output = run(command, "codex").await;
    let calls = rig.records().await;
    assert!(
        output.status.success(),
        "codex failed: {}\n{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    assert!(
        text(&output.stdout).contains(FINAL),
        "codex did not print the final answer: {}\n{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    assert_token_exact(&rig, &calls, 2, &output);
    assert!(calls.iter().all(|c| c.endpoint.ends_with("/responses")));
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_trains_token_exact_through_the_token_path() {
    let Some(tokenizer) = required("INTERCEPT_QWEN3_TOKENIZER", "Qwen3's tokenizer folder") else {
        return;
    };
    let Some(claude) = required(
        "INTERCEPT_CLAUDE",
        "the `claude` program of @anthropic-ai/claude-code",
    ) else {
        return;
    };
    // Claude Code offers its shell as `Bash` (`command`, `description`).
    let rig = Rig::start(
        &tokenizer,
        "claude",
        vec![
            Reply::tool_call(
                "Bash",
                json!({"command": "cat marker.txt", "description": "Print the marker file"})
                    .to_string(),
            )
            .with_reasoning("Read the marker file with the shell."),
            Reply::text(FINAL).with_reasoning("The tool printed the marker."),
        ],
    )
    .await;
    let mut command = rig.command(&claude);
    command
        .env("ANTHROPIC_BASE_URL", rig.env("ANTHROPIC_BASE_URL"))
        .env("ANTHROPIC_API_KEY", rig.secret())
        .env("CLAUDE_CONFIG_DIR", rig.path("home/.claude"))
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        .env("DISABLE_NON_ESSENTIAL_MODEL_CALLS", "1")
        .env("API_TIMEOUT_MS", "120000")
        .args(["-p", "--output-format", "text", "--no-session-persistence"])
        .arg("--allowedTools=Bash")
        .arg("Print what marker.txt holds.");
    let output = run(command, "claude").await;
    let calls = rig.records().await;
    assert!(
        output.status.success(),
        "claude failed: {}\n{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    assert!(
        text(&output.stdout).contains(FINAL),
        "claude did not print the final answer: {}\n{}",
        text(&output.stdout),
        text(&output.stderr)
    );
    assert_token_exact(&rig, &calls, 2, &output);
    assert!(calls.iter().all(|c| c.endpoint.contains("/messages")));
    rig.stop().await;
}
