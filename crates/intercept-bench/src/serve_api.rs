//! The `intercept serve` binary as a bench target, driven the way a user drives it: its
//! ready line (`{"event":"ready","control_url","token"}` on stdout), its control API
//! (`POST /v1/sessions` to make sessions, `GET /v1/sessions` for the calls each has
//! recorded) and its trace folder (one JSONL line per recorded call).
//!
//! The client speaks HTTP/1.1 on one keep-alive connection, one request at a time, and
//! opens a new one when the sidecar has closed it (an idle connection is closed after
//! the server's header read timeout).

use std::path::Path;

use anyhow::{anyhow, bail, Context as _, Result};
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tokio::net::TcpStream;

/// What the sidecar's ready line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ready {
    /// Base URL of the control API, e.g. `http://127.0.0.1:4100`.
    pub control_url: String,
    /// Bearer token of the control API.
    pub token: String,
}

impl Ready {
    /// Reads the ready line (`{"event":"ready","control_url":…,"token":…}`).
    pub fn parse(line: &str) -> Result<Ready> {
        let v: Value = serde_json::from_str(line.trim())
            .with_context(|| format!("the ready line is not JSON: `{}`", line.trim()))?;
        if v["event"] != "ready" {
            bail!("not a ready line: {v}");
        }
        let field = |k: &str| {
            v[k].as_str()
                .map(str::to_owned)
                .ok_or_else(|| anyhow!("the ready line has no {k}: {v}"))
        };
        Ok(Ready {
            control_url: field("control_url")?.trim_end_matches('/').to_owned(),
            token: field("token")?,
        })
    }
}

/// Sessions made through the control API.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sessions {
    /// The model base URL the sessions' harnesses call (the same for all of them).
    pub base_url: String,
    /// Their model secrets, in the order they were made.
    pub secrets: Vec<String>,
}

/// One `POST /v1/sessions` answer: `(base_url, model_secret)`.
pub fn parse_created(answer: &Value) -> Result<(String, String)> {
    let field = |k: &str| {
        answer[k]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| anyhow!("the created session has no {k}: {answer}"))
    };
    Ok((field("base_url")?, field("model_secret")?))
}

/// The calls recorded by all sessions of a `GET /v1/sessions` answer
/// (`{"sessions": [{id, status, calls}]}`), and how many sessions it lists.
pub fn sum_calls(list: &Value) -> Result<(u64, usize)> {
    let sessions = list["sessions"]
        .as_array()
        .ok_or_else(|| anyhow!("not a session list: {list}"))?;
    let mut calls = 0;
    for s in sessions {
        calls += s["calls"]
            .as_u64()
            .ok_or_else(|| anyhow!("a session without a call count: {s}"))?;
    }
    Ok((calls, sessions.len()))
}

/// What the trace files of a folder hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceFiles {
    /// `.jsonl` files.
    pub files: usize,
    /// Recorded calls: the `call` lines of logs, every complete line of full-record files.
    pub lines: u64,
    /// Bytes in all of them.
    pub bytes: u64,
}

/// The trace files in `dir` (logs or full records): how many, the calls they record,
/// their bytes.
pub fn trace_lines(dir: &Path) -> Result<TraceFiles> {
    use std::io::BufRead as _;
    let mut out = TraceFiles::default();
    // One buffer for every file: the files of a long run hold gigabytes.
    let mut line = Vec::with_capacity(1 << 16);
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some("jsonl") {
            continue;
        }
        let file = std::fs::File::open(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
        out.files += 1;
        let mut log = None;
        loop {
            line.clear();
            let n = reader
                .read_until(b'\n', &mut line)
                .with_context(|| format!("cannot read {}", path.display()))?;
            if n == 0 {
                break;
            }
            out.bytes += n as u64;
            if line.last() != Some(&b'\n') {
                continue; // torn
            }
            let is_log = *log.get_or_insert_with(|| line.starts_with(b"{\"type\":\"header\""));
            if !is_log || line.starts_with(b"{\"type\":\"call\"") {
                out.lines += 1;
            }
        }
    }
    Ok(out)
}

/// A control API client on one connection.
pub struct ControlClient {
    token: HeaderValue,
    authority: HeaderValue,
    addr: std::net::SocketAddr,
    base: String,
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl std::fmt::Debug for ControlClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl ControlClient {
    /// Connects to the control API of a ready sidecar.
    pub async fn connect(ready: &Ready) -> Result<ControlClient> {
        let uri: Uri = ready
            .control_url
            .parse()
            .with_context(|| format!("bad control URL {}", ready.control_url))?;
        let (authority, addr) = crate::load::resolve(&uri).await?;
        Ok(ControlClient {
            token: HeaderValue::try_from(format!("Bearer {}", ready.token))
                .context("the control token is not a header value")?,
            authority: HeaderValue::try_from(authority.as_str())?,
            addr,
            base: ready.control_url.clone(),
            sender: open(addr).await?,
        })
    }

    /// `POST {path}` with a JSON `body`: its JSON answer (fails unless it is 2xx).
    pub async fn post(&mut self, path: &str, body: Value) -> Result<Value> {
        self.call(Method::POST, path, Some(body)).await
    }

    /// `GET {path}`: its JSON answer (fails unless it is 2xx).
    pub async fn get(&mut self, path: &str) -> Result<Value> {
        self.call(Method::GET, path, None).await
    }

    /// Sends one request and reads its JSON answer; fails unless it is 2xx. A `GET`
    /// that fails on the way (the connection closed as it was sent) is sent once more
    /// on a new connection.
    async fn call(&mut self, method: Method, path: &str, body: Option<Value>) -> Result<Value> {
        if self.sender.is_closed() {
            self.sender = open(self.addr).await?;
        }
        match self.call_once(method.clone(), path, body.clone()).await {
            Err(Sent::Transport(_)) if method == Method::GET => {
                self.sender = open(self.addr).await?;
                self.call_once(method, path, body)
                    .await
                    .map_err(Sent::into_error)
            }
            other => other.map_err(Sent::into_error),
        }
    }

    async fn call_once(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Sent> {
        let context = format!("{method} {}{path}", self.base);
        self.send(method, path, body)
            .await
            .map_err(|e| e.context(context))
    }

    async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Sent> {
        let bytes = body.map_or_else(Bytes::new, |b| Bytes::from(b.to_string()));
        let mut req = Request::builder()
            .method(method.clone())
            .uri(path)
            .header(http::header::HOST, self.authority.clone())
            .header(http::header::AUTHORIZATION, self.token.clone());
        if !bytes.is_empty() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(bytes))
            .map_err(|e| Sent::Answer(e.into()))?;
        self.sender
            .ready()
            .await
            .map_err(|e| Sent::Transport(e.into()))?;
        let resp = self
            .sender
            .send_request(req)
            .await
            .map_err(|e| Sent::Transport(e.into()))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| Sent::Transport(e.into()))?
            .to_bytes();
        if !status.is_success() {
            return Err(Sent::Answer(anyhow!(
                "{status}: {}",
                String::from_utf8_lossy(&body)
            )));
        }
        serde_json::from_slice(&body)
            .map_err(|e| Sent::Answer(anyhow!(e).context("the answer is not JSON")))
    }

    /// Makes `n` sessions with the sidecar's default upstream and model, ids
    /// `<prefix>-0` … `<prefix>-<n-1>`.
    pub async fn create_sessions(&mut self, n: usize, prefix: &str) -> Result<Sessions> {
        let mut out = Sessions::default();
        for i in 0..n {
            let created = self
                .call(
                    Method::POST,
                    "/v1/sessions",
                    Some(json!({"id": format!("{prefix}-{i}")})),
                )
                .await?;
            let (base_url, secret) = parse_created(&created)?;
            if out.base_url.is_empty() {
                out.base_url = base_url;
            } else if out.base_url != base_url {
                bail!(
                    "sessions answer different base URLs ({} and {base_url}); the bench \
                     sends every request to one",
                    out.base_url
                );
            }
            out.secrets.push(secret);
        }
        Ok(out)
    }

    /// Has the sidecar write every trace line it has queued, by reading the live trace
    /// of session `id` (a read of a trace kept in a file writes the whole queue first).
    pub async fn flush_traces(&mut self, id: &str) -> Result<()> {
        self.call(Method::GET, &format!("/v1/sessions/{id}/trace"), None)
            .await
            .map(drop)
    }

    /// Calls recorded so far by all sessions, and how many sessions there are.
    pub async fn recorded_calls(&mut self) -> Result<(u64, usize)> {
        let list = self.call(Method::GET, "/v1/sessions", None).await?;
        sum_calls(&list)
    }
}

/// Why a request failed: on the way (the connection), or in its answer.
#[derive(Debug)]
enum Sent {
    Transport(anyhow::Error),
    Answer(anyhow::Error),
}

impl Sent {
    fn context(self, context: String) -> Sent {
        match self {
            Sent::Transport(e) => Sent::Transport(e.context(context)),
            Sent::Answer(e) => Sent::Answer(e.context(context)),
        }
    }

    fn into_error(self) -> anyhow::Error {
        match self {
            Sent::Transport(e) | Sent::Answer(e) => e,
        }
    }
}

/// A new HTTP/1.1 connection to the control API.
async fn open(
    addr: std::net::SocketAddr,
) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>> {
    let tcp = TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot connect to the control API at {addr}"))?;
    tcp.set_nodelay(true)?;
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ready_line_gives_the_control_url_and_token() {
        let r = Ready::parse(
            "{\"event\":\"ready\",\"control_url\":\"http://127.0.0.1:4100/\",\"token\":\"t0k\"}\n",
        )
        .expect("ready");
        assert_eq!(
            r,
            Ready {
                control_url: "http://127.0.0.1:4100".into(),
                token: "t0k".into()
            }
        );
        assert!(Ready::parse("{\"event\":\"started\"}").is_err());
        assert!(Ready::parse("{\"event\":\"ready\",\"token\":\"t\"}").is_err());
        assert!(Ready::parse("listening on 4100").is_err());
    }

    #[test]
    fn created_sessions_and_call_counts_are_read() {
        let created = json!({"id": "b-0", "base_url": "http://127.0.0.1:9/v1", "model_secret": "s", "state_secret": "x", "env": {}});
        assert_eq!(
            parse_created(&created).expect("created"),
            ("http://127.0.0.1:9/v1".into(), "s".into())
        );
        assert!(parse_created(&json!({"id": "b-0"})).is_err());
        let list = json!({"sessions": [
            {"id": "b-0", "status": "active", "calls": 3},
            {"id": "b-1", "status": "active", "calls": 0},
            {"id": "b-2", "status": "stopped", "calls": 7},
        ]});
        assert_eq!(sum_calls(&list).expect("sum"), (10, 3));
        assert_eq!(sum_calls(&json!({"sessions": []})).expect("sum"), (0, 0));
        assert!(sum_calls(&json!({"sessions": [{"id": "b-0"}]})).is_err());
        assert!(sum_calls(&json!({"error": {}})).is_err());
    }

    #[test]
    fn trace_lines_count_complete_lines_of_jsonl_files() {
        let dir = std::env::temp_dir().join(format!(
            "intercept-bench-trace-lines-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("a.jsonl"), "{}\n{}\n").expect("a");
        std::fs::write(dir.join("b.jsonl"), "").expect("b");
        // A torn last line is not a recorded call; other files are not traces.
        std::fs::write(dir.join("c.jsonl"), "{}\n{\"x\"").expect("c");
        std::fs::write(dir.join("c.episode.json"), "{}\n{}\n").expect("episode");
        assert_eq!(
            trace_lines(&dir).expect("count"),
            TraceFiles {
                files: 3,
                lines: 3,
                bytes: 6 + 7
            }
        );
        std::fs::remove_dir_all(&dir).expect("cleanup");
        assert!(trace_lines(&dir).is_err());
    }
}
