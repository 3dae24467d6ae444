//! `intercept serve` as a load target: the release `intercept` binary beside the bench
//! programs, started as a user starts it (`intercept serve --upstream <url> --model
//! bench --trace-dir <dir> --log warn`), pinned to core 0 like the other proxies, its
//! sessions made through its control API (`POST /v1/sessions`, as many as
//! `bench-proxy` registers). What it recorded is read back from the control API
//! (`GET /v1/sessions`: calls per session) and from its trace files (one line per call).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use intercept_bench::procfs;
use intercept_bench::serve_api::{trace_lines, ControlClient, Ready};
use serde_json::{json, Value};

use super::{reap, Env};

/// The prefix of the sessions' ids (`bench-0`, `bench-1`, …).
const SESSIONS: &str = "bench";

/// A running `intercept serve` with its sessions; stopped (SIGTERM, then killed if it
/// lingers) and its trace folder removed when dropped.
pub(super) struct Sidecar {
    child: Child,
    /// Kept open so the sidecar's stdout never becomes a closed pipe.
    _stdout: BufReader<ChildStdout>,
    rt: tokio::runtime::Runtime,
    client: ControlClient,
    /// Its chat completions URL.
    pub(super) url: String,
    /// The sessions' model secrets (JSON array), for loadgen.
    pub(super) secrets: PathBuf,
    trace_dir: PathBuf,
    sessions: usize,
}

impl std::fmt::Debug for Sidecar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sidecar")
            .field("pid", &self.child.id())
            .field("url", &self.url)
            .field("trace_dir", &self.trace_dir)
            .finish_non_exhaustive()
    }
}

/// What the sidecar recorded, read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Recorded {
    /// Calls its sessions recorded (control API).
    pub(super) calls: u64,
    /// Calls in its trace files (a log's call lines).
    pub(super) trace_lines: u64,
    /// Trace files in its trace folder.
    pub(super) trace_files: usize,
    /// Bytes in its trace files.
    pub(super) trace_bytes: u64,
}

impl Recorded {
    /// Whether it recorded exactly `expected` calls, in its sessions and in its files.
    pub(super) fn is(&self, expected: u64) -> bool {
        self.calls == expected && self.trace_lines == expected
    }

    /// Trace bytes written per recorded call.
    pub(super) fn bytes_per_call(&self) -> f64 {
        self.trace_bytes as f64 / self.calls.max(1) as f64
    }

    pub(super) fn to_json(self) -> Value {
        json!({
            "trace_bytes_per_call": self.bytes_per_call(),
            "calls": self.calls,
            "trace_lines": self.trace_lines,
            "trace_files": self.trace_files,
            "trace_bytes": self.trace_bytes,
        })
    }
}

impl Sidecar {
    /// Starts `intercept serve` for `upstream_base` with a fresh trace folder
    /// `target/bench/serve-<tag>/` and makes `sessions` sessions.
    pub(super) fn start(
        env: &Env,
        upstream_base: &str,
        sessions: usize,
        tag: &str,
    ) -> Result<Sidecar> {
        let program = env.bin.join("intercept");
        Sidecar::start_program(env, &program, upstream_base, sessions, tag)
    }

    /// [`Sidecar::start`] with the `intercept` binary at `program` (another build's).
    pub(super) fn start_program(
        env: &Env,
        program: &std::path::Path,
        upstream_base: &str,
        sessions: usize,
        tag: &str,
    ) -> Result<Sidecar> {
        let trace_dir = env.out.join(format!("serve-{tag}"));
        if trace_dir.exists() {
            std::fs::remove_dir_all(&trace_dir)
                .with_context(|| format!("cannot empty {}", trace_dir.display()))?;
        }
        std::fs::create_dir_all(&trace_dir)?;
        let mut cmd = env.command_at(program, 0);
        cmd.args(["serve", "--upstream", upstream_base, "--model", "bench"])
            .arg("--trace-dir")
            .arg(&trace_dir)
            .args(["--log", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().context("cannot start intercept serve")?;
        // From here on the child is stopped on every error path.
        let (stdout, ready) = match ready_line(&mut child) {
            Ok(s) => s,
            Err(e) => {
                stop(&mut child);
                return Err(e);
            }
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let made = within(&rt, "making its sessions", async {
            let mut client = ControlClient::connect(&ready).await?;
            let made = client.create_sessions(sessions, SESSIONS).await?;
            anyhow::Ok((client, made))
        });
        let (client, made) = match made {
            Ok(m) => m,
            Err(e) => {
                stop(&mut child);
                return Err(e.context("making the sessions of intercept serve"));
            }
        };
        let secrets = env.out.join(format!("secrets-serve-{tag}.json"));
        std::fs::write(&secrets, serde_json::to_vec(&made.secrets)?)?;
        Ok(Sidecar {
            child,
            _stdout: stdout,
            rt,
            client,
            url: format!(
                "{}/v1/chat/completions",
                made.base_url.trim_end_matches('/')
            ),
            secrets,
            trace_dir,
            sessions,
        })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its resident set size now, in KiB (0 where `/proc` cannot say).
    pub(super) fn rss_kib(&self) -> u64 {
        procfs::status_kib(self.pid(), "VmRSS").unwrap_or(0)
    }

    /// Calls its sessions have recorded so far (control API only).
    pub(super) fn calls(&mut self) -> Result<u64> {
        Ok(within(
            &self.rt,
            "listing its sessions",
            self.client.recorded_calls(),
        )?
        .0)
    }

    /// What it has recorded so far.
    pub(super) fn recorded(&mut self) -> Result<Recorded> {
        let (calls, listed) = within(
            &self.rt,
            "listing its sessions",
            self.client.recorded_calls(),
        )?;
        if listed != self.sessions {
            bail!(
                "intercept serve lists {listed} sessions, {} were made",
                self.sessions
            );
        }
        let files = trace_lines(&self.trace_dir)?;
        Ok(Recorded {
            calls,
            trace_lines: files.lines,
            trace_files: files.files,
            trace_bytes: files.bytes,
        })
    }

    /// What it recorded once it has recorded `expected` calls in its sessions and its
    /// files, or after 5 s (a call's record may be written just after its response).
    /// The files are read only once the sessions count `expected` calls (or at the
    /// deadline), after the sidecar was asked to write its queued lines: they hold
    /// gigabytes after a long run, and reading them can outlast the deadline.
    pub(super) fn settle(&mut self, expected: u64) -> Result<Recorded> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.calls()? != expected && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        within(
            &self.rt,
            "asking it to write its queued trace lines",
            self.client.flush_traces(&format!("{SESSIONS}-0")),
        )?;
        loop {
            let r = self.recorded()?;
            if r.is(expected) || Instant::now() >= deadline {
                return Ok(r);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Longest wait for the sidecar's ready line and for each control API exchange.
const CONTROL_WAIT: Duration = Duration::from_secs(120);

/// `fut` on `rt`, an error if it takes longer than [`CONTROL_WAIT`].
fn within<T>(
    rt: &tokio::runtime::Runtime,
    what: &str,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    rt.block_on(async {
        tokio::time::timeout(CONTROL_WAIT, fut)
            .await
            .map_err(|_| anyhow!("intercept serve: {what} took more than {CONTROL_WAIT:?}"))?
    })
}

/// Reads `child`'s ready line (within [`CONTROL_WAIT`]; a thread reads, so a silent child
/// cannot hold the bench), and keeps its stdout.
fn ready_line(child: &mut Child) -> Result<(BufReader<ChildStdout>, Ready)> {
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow!("intercept serve has no stdout"))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        let read = stdout.read_line(&mut line).map(|n| (stdout, line, n));
        let _ = tx.send(read);
    });
    let (stdout, line, n) = rx
        .recv_timeout(CONTROL_WAIT)
        .map_err(|_| anyhow!("intercept serve wrote no ready line within {CONTROL_WAIT:?}"))??;
    if n == 0 {
        bail!("intercept serve exited before its ready line");
    }
    Ok((stdout, Ready::parse(&line)?))
}

/// SIGTERM (its graceful shutdown), then killed if it has not stopped within 15 s.
fn stop(child: &mut Child) {
    #[cfg(target_os = "linux")]
    if let Some(pid) = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
    }
    reap(child, Duration::from_secs(15));
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        stop(&mut self.child);
        let _ = std::fs::remove_dir_all(&self.trace_dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorded_must_match_in_sessions_and_files() {
        let r = Recorded {
            calls: 10,
            trace_lines: 10,
            trace_files: 3,
            trace_bytes: 1000,
        };
        assert!(r.is(10));
        assert!(!r.is(11));
        assert!(!Recorded {
            trace_lines: 9,
            ..r
        }
        .is(10));
        assert_eq!(r.to_json()["trace_lines"], 10);
    }
}
