//! Reading trace files: a log whole ([`read_log_file`]), or the records of a file of
//! either format ([`read_trace_file`]: a log's rebuilt, or the lines of
//! [`TraceFormat::Full`](crate::TraceFormat::Full)).

use std::path::Path;

use intercept_core::log::{LogError, LogReader};
use intercept_core::CallRecord;

/// What can go wrong reading a trace file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The log is not one this reader can read.
    #[error("{path}: {source}")]
    Log {
        /// The file.
        path: String,
        /// Why.
        source: LogError,
    },
}

/// Reads a log file (see [`intercept_core::log`]): a torn last line is left out and the
/// log reads as incomplete; lines that cannot be read are skipped and listed.
pub fn read_log_file(path: &Path) -> Result<LogReader, ReadError> {
    let text = std::fs::read(path).map_err(|source| ReadError::Io {
        path: path.display().to_string(),
        source,
    })?;
    LogReader::from_bytes(&text).map_err(|source| ReadError::Log {
        path: path.display().to_string(),
        source,
    })
}

/// Whether `text` starts with a log's header line (rather than a full record).
pub fn is_log(text: &[u8]) -> bool {
    let first = text.split(|b| *b == b'\n').next().unwrap_or_default();
    serde_json::from_slice::<serde_json::Value>(first)
        .ok()
        .is_some_and(|v| v.get("type").and_then(|t| t.as_str()) == Some("header"))
}

/// What [`read_trace_file`] found in a full-record file.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceFile {
    /// The records of every complete, valid line, in file order.
    pub records: Vec<CallRecord>,
    /// 1-based numbers of the lines that were skipped (torn or not a record).
    pub skipped: Vec<usize>,
}

/// Reads a trace file of either format: a log's calls rebuilt, or a full-record file's
/// lines. A torn last line and any line that is not read are skipped and listed (in a
/// log, also a call that cannot be rebuilt). A log of an unknown schema is an error
/// ([`std::io::ErrorKind::InvalidData`]).
pub fn read_trace_file(path: &Path) -> std::io::Result<TraceFile> {
    let text = std::fs::read(path)?;
    parse_trace(&text)
}

/// Parses trace text of either format (see [`read_trace_file`]).
pub fn parse_trace(text: &[u8]) -> std::io::Result<TraceFile> {
    if !is_log(text) {
        return Ok(parse_full(text));
    }
    let log = LogReader::from_bytes(text)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let mut out = TraceFile {
        records: Vec::with_capacity(log.calls().len()),
        skipped: log.skipped().iter().map(|(n, _)| *n).collect(),
    };
    for (i, call) in log.calls().iter().enumerate() {
        match log.record(i) {
            Ok(r) => out.records.push(r),
            Err(_) => out.skipped.push(call.line),
        }
    }
    out.skipped.sort_unstable();
    Ok(out)
}

/// Parses full-record JSONL text: one [`CallRecord`] per line.
fn parse_full(text: &[u8]) -> TraceFile {
    let mut out = TraceFile {
        records: Vec::new(),
        skipped: Vec::new(),
    };
    if text.is_empty() {
        return out;
    }
    let complete = text.ends_with(b"\n");
    let lines: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
    // `split` yields a trailing empty piece after the final newline.
    let n = if complete {
        lines.len() - 1
    } else {
        lines.len()
    };
    for (i, line) in lines.iter().take(n).enumerate() {
        let torn = !complete && i + 1 == n;
        if line.iter().all(u8::is_ascii_whitespace) && !torn {
            continue;
        }
        match serde_json::from_slice::<CallRecord>(line) {
            Ok(r) if !torn => out.records.push(r),
            _ => out.skipped.push(i + 1),
        }
    }
    out
}
