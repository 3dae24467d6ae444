//! The trace log on disk: each rollout's record as a file, written at proxy speed, read
//! back whole or torn, and exported for training.
//!
//! The log format itself (typed JSONL lines: `header`, `value`, `node`, `call`, `end`)
//! and the pure writer and reader live in [`intercept_core::log`]; this crate adds the
//! I/O (specified in `docs/traces.md`):
//!
//! - [`JsonlSink`]: one session's trace file, a [`RecordSink`](intercept_core::RecordSink)
//!   that appends the session's log lines ([`TraceFormat::Log`]) or, for readers that
//!   cannot change yet, one whole record per line ([`TraceFormat::Full`]);
//! - [`TraceWriter`] and [`QueuedSink`]: the same through one writer thread and a queue
//!   bounded in bytes, with a crash bound of one flush interval (`docs/sidecar.md`);
//! - [`read_log_file`], [`open_trace`] and [`read_trace_file`] (either format): the one
//!   reader of trace files (the CLI's and the Python package's too), which keeps every
//!   whole line of a crashed file and marks a log without its end line `incomplete`;
//!   [`trace_files`] lists the files of folders;
//! - [`stats`](stats::stats) and [`export::write_parquet`]: what a log holds, and its
//!   branches as Parquet rows (`token_ids`, `mask`, `logprobs`, the messages).
//!
//! A Rust trainer records to files with `intercept-core`, `intercept-server` and this
//! crate alone:
//!
//! ```
//! use std::sync::Arc;
//! use intercept_core::{RolloutSession, Session, SessionConfig, Upstream};
//! use intercept_trace::{read_log_file, JsonlSink, TraceWriter, WriterConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let writer = TraceWriter::start(WriterConfig::default())?;
//! let path = dir.path().join("rollout-1.jsonl");
//! let sink = Arc::new(writer.sink(JsonlSink::create_new(&path)?));
//! let session = RolloutSession::new(SessionConfig::new(
//!     "rollout-1", "policy", Upstream::new("http://127.0.0.1:8000/v1"),
//! ))
//! .with_calls_in_memory(false) // the file is the trace
//! .with_sink(sink);
//! // ... hand `Arc::new(session)` to an InterceptionServer; calls record as they end ...
//! session.on_release(); // the end line
//! writer.flush();
//! let log = read_log_file(&path)?;
//! assert!(!log.incomplete());
//! assert_eq!(log.session(), "rollout-1");
//! # Ok(())
//! # }
//! ```

pub mod export;
mod read;
pub mod stats;
mod writer;

pub use read::{
    is_log, open_trace, parse_trace, read_log_file, read_trace_file, trace_files, trace_of, Opened,
    ReadError, TraceFile,
};
pub use writer::{
    release_page_cache, save_episode, write_episode, JsonlSink, QueuedSink, TraceFormat,
    TraceWriter, WriterConfig, PAGE_CACHE_HINT_EVERY,
};
