//! Reading trace files, the one place that does: a log whole ([`read_log_file`]), a
//! file of either format ([`open_trace`], [`read_trace_file`]: a log's records rebuilt,
//! or the lines of [`TraceFormat::Full`](crate::TraceFormat::Full)), a session's
//! [`Trace`] from either ([`trace_of`]), and the files a list of files and folders names
//! ([`trace_files`]).

use std::path::{Path, PathBuf};

use intercept_core::log::{LogError, LogReader};
use intercept_core::{CallRecord, Trace};

/// What can go wrong reading a trace file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
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
    /// A log was asked for and the file holds full records.
    #[error(
        "{path} is not a trace log (its first line is not a log header); a file of \
         trace_format = full already holds one record per line: read it as JSON lines"
    )]
    NotALog {
        /// The file.
        path: String,
    },
    /// A folder named as a trace could not be listed.
    #[error("cannot list the trace folder {path}: {source}")]
    Folder {
        /// The folder.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

fn io_error(path: &Path, source: std::io::Error) -> ReadError {
    ReadError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The trace files `paths` name, in order: a file as it is, a folder as every `*.jsonl`
/// file directly inside it, sorted by name (an episode's `*.episode.json` and other
/// files are left out). A path that does not exist is kept, so that reading it says so.
pub fn trace_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ReadError> {
    let mut out = Vec::with_capacity(paths.len());
    for path in paths {
        if !path.is_dir() {
            out.push(path.clone());
            continue;
        }
        let folder = |source| ReadError::Folder {
            path: path.display().to_string(),
            source,
        };
        let mut found = Vec::new();
        for entry in std::fs::read_dir(path).map_err(folder)? {
            let file = entry.map_err(folder)?.path();
            if file.extension().is_some_and(|e| e == "jsonl") && !file.is_dir() {
                found.push(file);
            }
        }
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

/// A trace file as read ([`open_trace`]): a log, or the text of a file of full records.
#[derive(Debug)]
#[non_exhaustive]
pub enum Opened {
    /// A log (its first line is a header), read.
    Log(Box<LogReader>),
    /// One whole record per line ([`TraceFormat::Full`](crate::TraceFormat::Full)), as
    /// it stands.
    Full(Vec<u8>),
}

/// Reads a trace file of either format: a log read whole (a torn last line left out),
/// or a full-record file's text.
pub fn open_trace(path: &Path) -> Result<Opened, ReadError> {
    let text = std::fs::read(path).map_err(|e| io_error(path, e))?;
    if !text.is_empty() && !is_log(&text) {
        return Ok(Opened::Full(text));
    }
    LogReader::from_bytes(&text)
        .map(|log| Opened::Log(Box::new(log)))
        .map_err(|source| ReadError::Log {
            path: path.display().to_string(),
            source,
        })
}

/// A session's [`Trace`] from trace text of either format: a log's records rebuilt (its
/// end line's `stop_condition` and `replays` when it has one, else the arguments'), or a
/// full-record file's lines. Lines that cannot be read are left out.
pub fn trace_of(
    text: &[u8],
    id: &str,
    stop_condition: Option<String>,
    replays: u64,
) -> Result<Trace, LogError> {
    if !is_log(text) {
        return Ok(Trace {
            id: id.to_owned(),
            stop_condition,
            calls: parse_full(text).records,
            replays,
        });
    }
    let log = LogReader::from_bytes(text)?;
    let (stop_condition, replays) = match log.end() {
        Some(end) => (end.stop_condition.clone(), end.replays),
        None => (stop_condition, replays),
    };
    Ok(Trace {
        id: id.to_owned(),
        stop_condition,
        calls: log.records()?,
        replays,
    })
}

/// Reads a log file (see [`intercept_core::log`]): a torn last line is left out and the
/// log reads as incomplete; lines that cannot be read are skipped and listed. A file of
/// full records is refused ([`ReadError::NotALog`]); an empty file is an empty log.
pub fn read_log_file(path: &Path) -> Result<LogReader, ReadError> {
    match open_trace(path)? {
        Opened::Log(log) => Ok(*log),
        Opened::Full(_) => Err(ReadError::NotALog {
            path: path.display().to_string(),
        }),
    }
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
