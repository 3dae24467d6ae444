//! What the integration tests share: the real Qwen3 tokenizer and the Python reference
//! (`oracle.py`, run by `$INTERCEPT_PYTHON`), each found through its environment
//! variable. Without them a test fails under `CI` and is skipped with a notice otherwise.

#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use intercept_tokens::Tokenizer;
use serde_json::Value;

/// How long one answer of the reference may take (its start loads `transformers`).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);

fn required(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(v) if !v.is_empty() => Some(v),
        _ => {
            if std::env::var_os("CI").is_some() {
                panic!("{var} is not set: CI must point it at {what}");
            }
            eprintln!("notice: {var} is not set ({what}); skipping this test");
            None
        }
    }
}

/// The real Qwen3 tokenizer, loaded once per test binary.
pub fn tokenizer() -> Option<Arc<Tokenizer>> {
    let dir = required(
        "INTERCEPT_QWEN3_TOKENIZER",
        "a folder with Qwen3's tokenizer.json and tokenizer_config.json",
    )?;
    Some(intercept_tokens::shared(dir).expect("the Qwen3 tokenizer loads"))
}

/// The Python reference: one process per test binary, answering one request at a time.
pub struct Oracle {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
}

impl Oracle {
    fn start(python: &str, tokenizer: &str) -> Oracle {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/oracle.py");
        let mut child = Command::new(python)
            .arg(script)
            .arg(tokenizer)
            .env("PYTHONIOENCODING", "utf-8")
            .env("TRANSFORMERS_VERBOSITY", "error")
            .env("TOKENIZERS_PARALLELISM", "false")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // Piped and passed on by a thread, not inherited: the process outlives the
            // test's (it ends at its input's end), and must not hold the test's stderr
            // open after the test.
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("reference: {line}");
            }
        });
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut oracle = Oracle {
            child,
            stdin,
            lines,
        };
        let ready = oracle.read();
        assert_eq!(ready["ready"], true, "the reference did not start: {ready}");
        let info = oracle.ask(r#"{"op":"info"}"#);
        assert_eq!(
            info["renderers"], "0.1.12",
            "the reference must be renderers==0.1.12: {info}"
        );
        eprintln!("reference: {info}");
        oracle
    }

    fn read(&mut self) -> Value {
        match self.lines.recv_timeout(ANSWER_TIMEOUT) {
            Ok(line) => serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("the reference wrote {line:?}: {e}")),
            Err(e) => {
                let status = self.child.try_wait();
                panic!("no answer from the reference within {ANSWER_TIMEOUT:?} ({e}; process: {status:?})")
            }
        }
    }

    /// Sends one request (a JSON object on one line) and reads its answer.
    pub fn ask(&mut self, request: &str) -> Value {
        assert!(!request.contains('\n'), "one line per request");
        writeln!(self.stdin, "{request}").expect("the reference reads its input");
        self.stdin.flush().expect("the reference reads its input");
        self.read()
    }
}

static ORACLE: OnceLock<Option<Mutex<Oracle>>> = OnceLock::new();

/// The reference, started on first use; `None` (after a notice) when the environment
/// lacks it outside CI.
pub fn oracle() -> Option<MutexGuard<'static, Oracle>> {
    let cell = ORACLE.get_or_init(|| {
        let python = required(
            "INTERCEPT_PYTHON",
            "a Python with renderers==0.1.12, transformers and verifiers==0.4.0",
        )?;
        let tokenizer = required(
            "INTERCEPT_QWEN3_TOKENIZER",
            "a folder with Qwen3's tokenizer.json and tokenizer_config.json",
        )?;
        Some(Mutex::new(Oracle::start(&python, &tokenizer)))
    });
    cell.as_ref()
        .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
}

/// A JSON string literal.
pub fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}

/// A JSON array of ids.
pub fn id_list(ids: &[u32]) -> String {
    serde_json::to_string(ids).expect("ids serialise")
}

/// The ids of a JSON array.
pub fn ids_of(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("an array of ids: {v}"))
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}
