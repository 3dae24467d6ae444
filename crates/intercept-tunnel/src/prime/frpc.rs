//! The frpc child process: its TOML config (every key `prime_tunnel` 0.1.15 writes), its
//! launch, and the continuous classification of its output (the phrases that client
//! looks for).

use std::collections::VecDeque;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::Command;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::api::TunnelInfo;
use crate::error::TunnelError;

/// How many output lines are kept for error messages.
const KEPT_LINES: usize = 50;

/// What a frpc output line means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrpcEvent {
    /// The proxy started: traffic flows.
    Connected,
    /// The tunnel was deleted, expired or disconnected too long; only a new one helps.
    Gone,
    /// The server rejected the token or binding secret.
    Rejected,
    /// The server refused to start the proxy.
    ProxyRefused,
}

/// Classifies one frpc output line (case-insensitive substring tests, the phrases
/// `prime_tunnel` 0.1.15 looks for).
pub fn classify(line: &str) -> Option<FrpcEvent> {
    let l = line.to_ascii_lowercase();
    if l.contains("start proxy success") {
        return Some(FrpcEvent::Connected);
    }
    let start_error = l.contains("start error");
    if !(start_error || l.contains("connect to server error")) {
        return None;
    }
    if l.contains("tunnel is inactive") || l.contains("tunnel not registered") {
        return Some(FrpcEvent::Gone);
    }
    if start_error {
        return Some(FrpcEvent::ProxyRefused);
    }
    if l.contains("invalid binding secret")
        || l.contains("invalid authentication token")
        || l.contains("token in login doesn't match")
    {
        return Some(FrpcEvent::Rejected);
    }
    None
}

/// Removes ANSI escape sequences (`ESC [ ... letter`).
pub(crate) fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                for c in chars.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The level letter and message of a frp log line
/// (`YYYY-MM-DD HH:MM:SS.mmm [L] [caller] message`), if it has that shape.
pub(crate) fn parse_level(line: &str) -> Option<(char, &str)> {
    let open = line.find(" [")?;
    let rest = &line[open + 2..];
    let mut chars = rest.chars();
    let level = chars.next()?;
    if chars.next() != Some(']') || !"EWIDT".contains(level) {
        return None;
    }
    let msg = rest[2..].trim_start();
    // Drop the `[caller]` part.
    let msg = match msg
        .strip_prefix('[')
        .and_then(|m| m.find("] ").map(|i| &m[i + 2..]))
    {
        Some(m) => m,
        None => msg,
    };
    Some((level, msg))
}

/// Escapes a TOML basic string (quotes included).
pub fn toml_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04X}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The frpc TOML for a registration (every key `prime_tunnel` 0.1.15 writes, values
/// escaped).
pub fn render_config(info: &TunnelInfo, local_addr: &str, log_level: &str) -> String {
    let s = toml_string;
    format!(
        "serverAddr = {server}\n\
         serverPort = {port}\n\
         user = {id}\n\
         loginFailExit = false\n\
         auth.method = \"token\"\n\
         auth.token = {token}\n\
         metadatas.binding_secret = {binding}\n\
         transport.tcpMux = true\n\
         transport.tcpMuxKeepaliveInterval = 30\n\
         transport.poolCount = 10\n\
         transport.dialServerKeepalive = 60\n\
         log.to = \"console\"\n\
         log.level = {level}\n\
         \n\
         [[proxies]]\n\
         name = {id}\n\
         type = \"http\"\n\
         localIP = {local}\n\
         localPort = {local_port}\n\
         subdomain = {id}\n",
        server = s(&info.server_host),
        port = info.server_port,
        id = s(&info.tunnel_id),
        token = s(&info.frp_token),
        binding = s(&info.binding_secret),
        level = s(log_level),
        local = s(local_addr),
        local_port = info.local_port,
    )
}

/// Writes `text` to `dir/<name>.toml`: the directory becomes 0700, the file is created
/// 0600 (truncating an old one).
pub(crate) fn write_config(dir: &Path, name: &str, text: &str) -> Result<PathBuf, TunnelError> {
    use std::io::Write;
    let io = |what: &str, e: std::io::Error| {
        TunnelError::Io(format!("cannot write the frpc config ({what}): {e}"))
    };
    std::fs::create_dir_all(dir).map_err(|e| io("create dir", e))?;
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let path = dir.join(format!("{safe}.toml"));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io("chmod dir", e))?;
        opts.mode(0o600);
    }
    let mut file = opts.open(&path).map_err(|e| io("open", e))?;
    #[cfg(unix)]
    {
        // An existing file keeps its old mode on open; force it.
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| io("chmod file", e))?;
    }
    file.write_all(text.as_bytes())
        .map_err(|e| io("write", e))?;
    Ok(path)
}

/// What the output readers share.
struct Output {
    lines: Mutex<VecDeque<String>>,
    last_problem: Mutex<Option<String>>,
    gone: watch::Sender<bool>,
}

/// A running frpc. Dropping it kills the process (`kill_on_drop`) and stops the readers.
pub(crate) struct Frpc {
    pid: Option<u32>,
    output: Arc<Output>,
    first: watch::Receiver<Option<FrpcEvent>>,
    exit: watch::Receiver<Option<String>>,
    kill: Option<oneshot::Sender<()>>,
    tasks: Vec<JoinHandle<()>>,
}

impl fmt::Debug for Frpc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Frpc").field("pid", &self.pid).finish()
    }
}

impl Drop for Frpc {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Makes the child get SIGKILL when its parent dies (`PR_SET_PDEATHSIG`), so that no
/// frpc outlives this process, even when a supervisor kills it with SIGKILL and no
/// teardown runs.
///
/// Linux ties the signal to the *thread* that forked the child, not to the process:
/// frpc is spawned from async code, on a runtime thread, and the runtime's threads live
/// until it shuts down (by which time every tunnel was torn down). A parent that died
/// between the fork and the `prctl` would be missed, so the child checks that its
/// parent is still the process that spawned it, and fails the spawn otherwise.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    use rustix::process::{getpid, getppid, set_parent_process_death_signal, Signal};
    let parent = getpid();
    // SAFETY: the closure runs in the forked child before `exec`. It makes only the
    // `prctl` and `getppid` system calls, which are async-signal-safe, allocates nothing,
    // and touches no lock or state shared with the parent.
    unsafe {
        cmd.pre_exec(move || {
            set_parent_process_death_signal(Some(Signal::KILL))?;
            if getppid() != Some(parent) {
                return Err(rustix::io::Errno::SRCH.into());
            }
            Ok(())
        });
    }
}

impl Frpc {
    /// Starts `frpc -c <config>` with piped output, a minimal environment and
    /// `kill_on_drop`; on Linux it also dies with this process, even one killed with
    /// SIGKILL (see [`die_with_parent`]). This is the one place a frpc process is
    /// created.
    pub(crate) fn spawn(
        binary: &Path,
        config: &Path,
        tunnel_id: &str,
    ) -> Result<Self, TunnelError> {
        let mut cmd = Command::new(binary);
        cmd.arg("-c")
            .arg(config)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        #[cfg(target_os = "linux")]
        die_with_parent(&mut cmd);
        for key in ["PATH", "HOME", "TZ", "LANG"] {
            if let Some(v) = std::env::var_os(key) {
                cmd.env(key, v);
            }
        }
        let mut child = cmd.spawn().map_err(|e| {
            TunnelError::Connection(format!(
                "failed to start frpc ({}): {e}; set the frpc path or FRPC_PATH",
                binary.display()
            ))
        })?;
        let pid = child.id();
        let output = Arc::new(Output {
            lines: Mutex::new(VecDeque::new()),
            last_problem: Mutex::new(None),
            gone: watch::Sender::new(false),
        });
        let (first_tx, first) = watch::channel(None);
        let first_tx = Arc::new(first_tx);
        let (exit_tx, exit) = watch::channel(None);
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let mut tasks = Vec::new();
        if let Some(out) = child.stdout.take() {
            tasks.push(tokio::spawn(read_lines(
                out,
                tunnel_id.to_string(),
                Arc::clone(&output),
                Arc::clone(&first_tx),
            )));
        }
        if let Some(err) = child.stderr.take() {
            tasks.push(tokio::spawn(read_lines(
                err,
                tunnel_id.to_string(),
                Arc::clone(&output),
                Arc::clone(&first_tx),
            )));
        }
        // The waiter owns the child: aborting it drops the child, which kills it.
        tasks.push(tokio::spawn(async move {
            let status = tokio::select! {
                status = child.wait() => status,
                _ = kill_rx => {
                    let _ = child.start_kill();
                    child.wait().await
                }
            };
            let text = match status {
                Ok(s) => match s.code() {
                    Some(c) => format!("exit code {c}"),
                    None => format!("{s}"),
                },
                Err(e) => format!("wait failed: {e}"),
            };
            let _ = exit_tx.send(Some(text));
        }));
        Ok(Frpc {
            pid,
            output,
            first,
            exit,
            kill: Some(kill_tx),
            tasks,
        })
    }

    /// The process id.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Whether the process still runs.
    pub(crate) fn running(&self) -> bool {
        self.exit.borrow().is_none()
    }

    /// A receiver that turns `Some(exit description)` when the process exits.
    pub(crate) fn exit_watch(&self) -> watch::Receiver<Option<String>> {
        self.exit.clone()
    }

    /// Whether frpc said the tunnel is gone (at any time).
    pub(crate) fn gone(&self) -> bool {
        *self.output.gone.borrow()
    }

    /// A receiver that turns `true` when frpc reports the tunnel gone.
    pub(crate) fn gone_watch(&self) -> watch::Receiver<bool> {
        self.output.gone.subscribe()
    }

    /// The last kept output lines.
    pub(crate) fn output(&self) -> String {
        let lines = self
            .output
            .lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    fn failure_message(&self, exit: Option<&str>) -> String {
        if let Some(p) = self
            .output
            .last_problem
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return p;
        }
        let out = self.output();
        let out = if out.is_empty() {
            "(no output captured)".into()
        } else {
            out
        };
        match exit {
            Some(code) => format!("frpc process failed ({code}): {out}"),
            None => out,
        }
    }

    /// Waits for the first meaningful event: `Ok` on connection, a typed error on any
    /// other event, on exit, or after `timeout`.
    pub(crate) async fn wait_connected(&mut self, timeout: Duration) -> Result<(), TunnelError> {
        let mut first = self.first.clone();
        let mut exit = self.exit.clone();
        let outcome = tokio::time::timeout(timeout, async {
            let event = tokio::select! {
                ev = first.wait_for(Option::is_some) => ev.ok().and_then(|e| *e),
                _ = exit.wait_for(Option::is_some) => None,
            };
            match event {
                Some(event) => Some(Ok(event)),
                // Exited, or its output closed (it is exiting): report the exit.
                None => {
                    let code = exit
                        .wait_for(Option::is_some)
                        .await
                        .ok()
                        .and_then(|e| e.clone())
                        .unwrap_or_else(|| "exit status unknown".into());
                    Some(Err(code))
                }
            }
        })
        .await;
        match outcome {
            Ok(Some(Ok(FrpcEvent::Connected))) => Ok(()),
            Ok(Some(Ok(event))) => Err(self.event_error(event)),
            Ok(Some(Err(code))) => {
                // Let the readers drain what the process printed before it exited.
                let readers: Vec<_> = self
                    .tasks
                    .drain(..self.tasks.len().saturating_sub(1))
                    .collect();
                for r in readers {
                    let _ = tokio::time::timeout(Duration::from_secs(1), r).await;
                }
                let first = *self.first.borrow();
                match first {
                    Some(FrpcEvent::Gone) => Err(self.event_error(FrpcEvent::Gone)),
                    Some(e @ (FrpcEvent::Rejected | FrpcEvent::ProxyRefused)) => {
                        Err(self.event_error(e))
                    }
                    _ => Err(TunnelError::Connection(format!(
                        "frpc exited before connecting: {}",
                        self.failure_message(Some(&code))
                    ))),
                }
            }
            Ok(None) => Err(TunnelError::Connection(
                "frpc output ended unexpectedly".into(),
            )),
            Err(_) => Err(TunnelError::Timeout(format!(
                "tunnel connection timed out after {timeout:?}; frpc output:\n{}",
                self.failure_message(None)
            ))),
        }
    }

    fn event_error(&self, event: FrpcEvent) -> TunnelError {
        let msg = self.failure_message(None);
        match event {
            FrpcEvent::Gone => TunnelError::Gone(format!(
                "the tunnel is gone (deleted, expired or disconnected too long): {msg}"
            )),
            FrpcEvent::Rejected => TunnelError::Rejected(format!(
                "the tunnel server rejected frpc's credentials: {msg}"
            )),
            FrpcEvent::ProxyRefused => TunnelError::ProxyRefused(format!(
                "the tunnel server refused to start the proxy: {msg}"
            )),
            FrpcEvent::Connected => TunnelError::Connection(msg),
        }
    }

    /// Kills the process and waits (at most 2 s) until it has exited.
    pub(crate) async fn stop(mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        let mut exit = self.exit.clone();
        let _ = tokio::time::timeout(Duration::from_secs(2), exit.wait_for(Option::is_some)).await;
    }
}

async fn read_lines(
    stream: impl AsyncRead + Unpin,
    tunnel_id: String,
    output: Arc<Output>,
    first: Arc<watch::Sender<Option<FrpcEvent>>>,
) {
    // Bytes, not `lines()`: a line that is not UTF-8 must not end the reading (frpc
    // would then block on a full pipe).
    let mut reader = BufReader::new(stream);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let raw = String::from_utf8_lossy(&buf);
        let line = strip_ansi(&raw);
        let line = line.trim_end();
        if line.is_empty() {
            continue;
        }
        match parse_level(line) {
            // frpc's text goes in a `Debug` field: escaped, it cannot forge a log line.
            Some(('E', msg)) => {
                tracing::error!(tunnel_id = %tunnel_id, line = ?msg, "frpc");
                set_problem(&output, msg);
            }
            Some(('W', msg)) => {
                tracing::warn!(tunnel_id = %tunnel_id, line = ?msg, "frpc");
                set_problem(&output, msg);
            }
            Some(('I', msg)) => tracing::info!(tunnel_id = %tunnel_id, line = ?msg, "frpc"),
            Some((_, msg)) => tracing::debug!(tunnel_id = %tunnel_id, line = ?msg, "frpc"),
            None => tracing::info!(tunnel_id = %tunnel_id, line = ?line, "frpc"),
        }
        {
            let mut kept = output.lines.lock().unwrap_or_else(PoisonError::into_inner);
            if kept.len() == KEPT_LINES {
                kept.pop_front();
            }
            kept.push_back(line.to_string());
        }
        if let Some(event) = classify(line) {
            if event == FrpcEvent::Gone {
                output.gone.send_replace(true);
            }
            first.send_if_modified(|f| {
                if f.is_none() {
                    *f = Some(event);
                    true
                } else {
                    false
                }
            });
        }
    }
}

fn set_problem(output: &Output, msg: &str) {
    *output
        .last_problem
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = Some(msg.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn output_that_is_not_utf8_does_not_end_the_reading() {
        let output = Arc::new(Output {
            lines: Mutex::new(VecDeque::new()),
            last_problem: Mutex::new(None),
            gone: watch::Sender::new(false),
        });
        let (first_tx, first) = watch::channel(None);
        let text: &[u8] = b"\xff\xfe not utf-8 \x00\n2025-01-01 10:00:00.000 [I] [client/control.go:168] [t1] [t1] start proxy success\n";
        read_lines(text, "t1".into(), Arc::clone(&output), Arc::new(first_tx)).await;
        assert_eq!(*first.borrow(), Some(FrpcEvent::Connected));
        let kept = output.lines.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(kept.len(), 2, "{kept:?}");
        assert!(kept[0].contains('\u{fffd}'), "{kept:?}");
    }

    #[test]
    fn classification() {
        let c = classify;
        assert_eq!(
            c("2025-01-01 10:00:00.000 [I] [client/control.go:168] [t1] [t1] start proxy success"),
            Some(FrpcEvent::Connected)
        );
        assert_eq!(
            c("[E] [t1] start error: Tunnel is INACTIVE"),
            Some(FrpcEvent::Gone)
        );
        assert_eq!(
            c("[W] connect to server error: tunnel not registered"),
            Some(FrpcEvent::Gone)
        );
        assert_eq!(
            c("[W] [t1] start error: proxy [t1] already exists"),
            Some(FrpcEvent::ProxyRefused)
        );
        assert_eq!(
            c("[W] connect to server error: invalid authentication token"),
            Some(FrpcEvent::Rejected)
        );
        assert_eq!(
            c("[W] connect to server error: token in login doesn't match token from configuration"),
            Some(FrpcEvent::Rejected)
        );
        assert_eq!(
            c("[W] connect to server error: dial tcp: i/o timeout"),
            None
        );
        assert_eq!(c("[I] login to server success"), None);
        assert_eq!(
            c("invalid authentication token"),
            None,
            "only relevant lines count"
        );
    }

    #[test]
    fn ansi_and_levels() {
        let raw =
            "\u{1b}[1;34m2025-01-01 10:00:00.000 [W] [client/service.go:295] login failed\u{1b}[0m";
        let line = strip_ansi(raw);
        assert_eq!(
            line,
            "2025-01-01 10:00:00.000 [W] [client/service.go:295] login failed"
        );
        assert_eq!(parse_level(&line), Some(('W', "login failed")));
        assert_eq!(parse_level("no level here"), None);
        assert_eq!(parse_level("2025 [X] [a] b"), None);
    }

    #[test]
    fn toml_escaping_round_trips() {
        for v in [
            "plain",
            "quo\"te",
            "back\\slash",
            "new\nline",
            "tab\t\u{1}\u{7f}",
            "ünï",
        ] {
            let doc = format!("k = {}\n", toml_string(v));
            let parsed: toml::Table = toml::from_str(&doc).unwrap();
            assert_eq!(parsed["k"].as_str(), Some(v), "{doc}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_string_survives_toml_escaping(v in "\\PC*|[\\x00-\\x7f]*") {
            let doc = format!("k = {}\n", toml_string(&v));
            let parsed: toml::Table = toml::from_str(&doc).unwrap();
            proptest::prop_assert_eq!(parsed["k"].as_str(), Some(v.as_str()));
        }

        #[test]
        fn classification_ignores_case_and_ansi(upper in proptest::bool::ANY, colour in proptest::bool::ANY) {
            let mut line = "2025-01-01 10:00:00.000 [W] [c.go:1] [t] start error: tunnel is inactive".to_string();
            if upper {
                line = line.to_uppercase();
            }
            if colour {
                line = format!("\u{1b}[1;33m{line}\u{1b}[0m");
            }
            proptest::prop_assert_eq!(classify(&strip_ansi(&line)), Some(FrpcEvent::Gone));
        }
    }

    #[test]
    fn config_has_every_key_and_survives_hostile_values() {
        let info = TunnelInfo {
            tunnel_id: "t1\"\nx = 1".into(),
            frp_token: "tok\\\"en".into(),
            binding_secret: "bs".into(),
            server_host: "frps.example".into(),
            server_port: 7001,
            local_port: 8123,
            ..TunnelInfo::default()
        };
        let text = render_config(&info, "127.0.0.1", "info");
        let doc: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(doc["serverAddr"].as_str(), Some("frps.example"));
        assert_eq!(doc["serverPort"].as_integer(), Some(7001));
        assert_eq!(doc["user"].as_str(), Some(info.tunnel_id.as_str()));
        assert_eq!(doc["loginFailExit"].as_bool(), Some(false));
        assert_eq!(doc["auth"]["method"].as_str(), Some("token"));
        assert_eq!(doc["auth"]["token"].as_str(), Some("tok\\\"en"));
        assert_eq!(doc["metadatas"]["binding_secret"].as_str(), Some("bs"));
        let t = &doc["transport"];
        assert_eq!(t["tcpMux"].as_bool(), Some(true));
        assert_eq!(t["tcpMuxKeepaliveInterval"].as_integer(), Some(30));
        assert_eq!(t["poolCount"].as_integer(), Some(10));
        assert_eq!(t["dialServerKeepalive"].as_integer(), Some(60));
        assert_eq!(doc["log"]["to"].as_str(), Some("console"));
        assert_eq!(doc["log"]["level"].as_str(), Some("info"));
        assert!(doc.get("x").is_none(), "no injected key");
        let p = &doc["proxies"].as_array().unwrap()[0];
        assert_eq!(p["name"].as_str(), Some(info.tunnel_id.as_str()));
        assert_eq!(p["type"].as_str(), Some("http"));
        assert_eq!(p["localIP"].as_str(), Some("127.0.0.1"));
        assert_eq!(p["localPort"].as_integer(), Some(8123));
        assert_eq!(p["subdomain"].as_str(), Some(info.tunnel_id.as_str()));
    }

    #[cfg(unix)]
    #[test]
    fn config_file_permissions() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let tunnels = dir.path().join("tunnels");
        std::fs::create_dir_all(&tunnels).unwrap();
        std::fs::set_permissions(&tunnels, std::fs::Permissions::from_mode(0o755)).unwrap();
        let old = tunnels.join("t_1.toml");
        std::fs::write(&old, "old old old old").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path = write_config(&tunnels, "t/1", "new").unwrap();
        assert_eq!(path, old, "unsafe characters in the name are replaced");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&tunnels), 0o700);
        assert_eq!(mode(&path), 0o600);
    }
}
