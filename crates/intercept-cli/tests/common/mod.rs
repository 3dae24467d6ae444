//! The built `intercept serve` binary as the tests run it: started with piped output,
//! its ready line read, stopped with SIGTERM; one chat call through a session; and the
//! control API of an in-process sidecar ([`control`]).

#![allow(dead_code, unreachable_pub, clippy::unwrap_used)]

pub mod control;

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use http::Method;
use intercept_mock::harness::{HttpClient, HttpResponse};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::task::JoinHandle;

/// Bound on every wait of these tests.
pub const WAIT: Duration = Duration::from_secs(60);

/// `intercept serve --upstream <upstream> --model <model>` of the built binary, with an
/// empty environment; a test adds its flags and variables, then [`start`]s it.
pub fn serve(upstream: &str, model: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_intercept"));
    command
        .args(["serve", "--upstream", upstream, "--model", model])
        .env_clear();
    command
}

/// One chat call (the user message `text`) as a session's harness makes it, with the
/// session's `env` (`OPENAI_BASE_URL`, `OPENAI_API_KEY`).
pub async fn try_chat(
    client: &HttpClient,
    env: &Value,
    text: &str,
) -> anyhow::Result<HttpResponse> {
    let url = format!(
        "{}/chat/completions",
        env["OPENAI_BASE_URL"].as_str().unwrap()
    );
    let body = json!({"model": "x", "messages": [{"role": "user", "content": text}]});
    client
        .send(
            Method::POST,
            &url,
            env["OPENAI_API_KEY"].as_str(),
            Some(&body),
        )
        .await
}

/// A running `intercept serve` whose ready line has been read.
pub struct Serving {
    pub child: Child,
    /// The ready line.
    pub ready: Value,
    /// `ready.control_url`.
    pub control: String,
    /// `ready.token`.
    pub token: String,
    /// Standard output after the ready line.
    pub stdout: BufReader<ChildStdout>,
    /// All of standard error, once the process has closed it.
    pub stderr: JoinHandle<String>,
}

/// What an exited `intercept serve` left.
pub struct Exited {
    pub status: ExitStatus,
    /// Standard output after the ready line.
    pub stdout: String,
    /// All of standard error.
    pub logs: String,
}

/// Spawns `command` (the binary's `serve`, or a wrapper that runs it) with standard input
/// closed and both outputs piped, killed if the test drops it, and reads its ready line
/// (within [`WAIT`]).
pub async fn start(mut command: Command) -> Serving {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let stderr = tokio::spawn(async move {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s).await;
        s
    });
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::time::timeout(WAIT, stdout.read_line(&mut line))
        .await
        .expect("no ready line in time")
        .unwrap();
    let ready: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    Serving {
        child,
        control: ready["control_url"].as_str().unwrap().to_owned(),
        token: ready["token"].as_str().unwrap().to_owned(),
        ready,
        stdout,
        stderr,
    }
}

impl Serving {
    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        let pid = self.child.id().unwrap().to_string();
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(killed.success());
    }

    /// Waits (within [`WAIT`] each) for the exit, the rest of standard output and all of
    /// standard error.
    pub async fn exit(mut self) -> Exited {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .expect("the sidecar did not exit in time")
            .unwrap();
        let mut stdout = String::new();
        tokio::time::timeout(WAIT, self.stdout.read_to_string(&mut stdout))
            .await
            .expect("standard output was not closed in time")
            .unwrap();
        let logs = tokio::time::timeout(WAIT, self.stderr)
            .await
            .expect("standard error was not closed in time")
            .unwrap();
        Exited {
            status,
            stdout,
            logs,
        }
    }
}
