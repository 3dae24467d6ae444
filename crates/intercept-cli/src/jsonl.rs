//! JSONL trace files: one [`CallRecord`] per line, appended as each call ends.
//!
//! A line is written with a single `write` of the whole line and its newline, so a crash
//! can tear at most the last line. [`read_trace_file`] skips such a torn line (and any
//! line that does not parse) and reports it, rather than merging it with the next one.
//! Re-opening a file whose last line is torn first ends that line, so records appended
//! later stay on lines of their own.
//!
//! When a session is released, [`write_episode`] writes its episode (the message graph,
//! see [`intercept_core::episode`]) next to the trace as `<id>.episode.json`, through a
//! temporary file and a rename, so a reader never sees half a document.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use intercept_core::{CallRecord, RecordSink, RolloutSession};
use parking_lot::Mutex;
use tracing::warn;

/// Writes `<dir>/<id>.episode.json` (the session's episode, pretty JSON) and returns its
/// path.
pub fn write_episode(dir: &Path, session: &RolloutSession) -> std::io::Result<PathBuf> {
    let id = &session.config().id;
    let path = dir.join(format!("{id}.episode.json"));
    let tmp = dir.join(format!(".{id}.episode.json.tmp"));
    let json = serde_json::to_vec(&session.episode()).map_err(std::io::Error::other)?;
    {
        let mut file = File::create(&tmp)?;
        file.write_all(&json)?;
        file.write_all(b"\n")?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Writes the episode file of a released session when there is a trace folder, and logs
/// a failure (the session is released either way).
pub(crate) fn save_episode(dir: Option<&Path>, session: &RolloutSession) {
    if let Some(dir) = dir {
        if let Err(e) = write_episode(dir, session) {
            warn!(session = %session.config().id, dir = %dir.display(), error = %e, "could not write the episode file");
        }
    }
}

/// A [`RecordSink`] that appends each record to a JSONL file as the call ends.
#[derive(Debug)]
pub struct JsonlSink {
    path: PathBuf,
    file: Mutex<File>,
}

impl JsonlSink {
    /// Opens (creating it if needed) `path` for appending.
    pub fn open(path: impl Into<PathBuf>) -> std::io::Result<Self> {
        let path = path.into();
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)?;
        let len = file.metadata()?.len();
        if len > 0 {
            let mut last = [0u8; 1];
            file.seek(SeekFrom::Start(len - 1))?;
            file.read_exact(&mut last)?;
            if last[0] != b'\n' {
                // A torn line from an earlier crash: end it so it stays on its own.
                file.write_all(b"\n")?;
            }
        }
        Ok(JsonlSink {
            path,
            file: Mutex::new(file),
        })
    }

    /// Creates `path` for appending; fails with [`std::io::ErrorKind::AlreadyExists`] if
    /// it exists (atomically: of two creators of one path, exactly one succeeds), so a
    /// session never appends to the trace file of an earlier rollout.
    pub fn create_new(path: impl Into<PathBuf>) -> std::io::Result<Self> {
        let path = path.into();
        let file = OpenOptions::new()
            .create_new(true)
            .read(true)
            .append(true)
            .open(&path)?;
        Ok(JsonlSink {
            path,
            file: Mutex::new(file),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Forces what was written to stable storage.
    pub fn sync(&self) -> std::io::Result<()> {
        self.file.lock().sync_data()
    }
}

impl RecordSink for JsonlSink {
    fn on_record(&self, record: &CallRecord) {
        let mut line = Vec::with_capacity(record.json_size_hint() + 1);
        record.write_json(&mut line);
        line.push(b'\n');
        if let Err(e) = self.file.lock().write_all(&line) {
            warn!(session = %record.session, seq = record.seq, path = %self.path.display(), error = %e, "could not append the call record to the trace file");
        }
    }
}

/// What [`read_trace_file`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceFile {
    /// The records of every complete, valid line, in file order.
    pub records: Vec<CallRecord>,
    /// 1-based numbers of the lines that were skipped (torn or not a record).
    pub skipped: Vec<usize>,
}

/// Reads a JSONL trace file, skipping a torn last line and any line that is not a
/// record.
pub fn read_trace_file(path: &Path) -> std::io::Result<TraceFile> {
    let text = std::fs::read(path)?;
    Ok(parse_trace(&text))
}

/// Parses JSONL trace text (see [`read_trace_file`]).
pub fn parse_trace(text: &[u8]) -> TraceFile {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64) -> CallRecord {
        serde_json::from_value(serde_json::json!({
            "session": "s", "seq": seq, "dialect": "chat_completions", "endpoint": "/chat/completions",
            "model": "m", "stream": false, "sampling": {}, "request": {"model": "m"},
            "response": null, "finish_reason": null, "usage": {"prompt_tokens": 1,
            "completion_tokens": 2, "cached_input_tokens": 0, "reasoning_tokens": 0},
            "status": 200, "started_at": 1.0, "ended_at": 2.0, "ttfb_ms": null, "error": null
        }))
        .unwrap()
    }

    #[test]
    fn appends_and_repairs_a_torn_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let sink = JsonlSink::open(&path).unwrap();
        sink.on_record(&record(0));
        sink.on_record(&record(1));
        sink.sync().unwrap();
        drop(sink);
        let t = read_trace_file(&path).unwrap();
        assert_eq!(t.records.iter().map(|r| r.seq).collect::<Vec<_>>(), [0, 1]);
        assert!(t.skipped.is_empty());

        // A crash mid-write leaves half a line.
        let mut torn = std::fs::read(&path).unwrap();
        let half = record(2).to_json_line();
        torn.extend_from_slice(&half.as_bytes()[..half.len() / 2]);
        std::fs::write(&path, &torn).unwrap();
        let t = read_trace_file(&path).unwrap();
        assert_eq!(t.records.len(), 2);
        assert_eq!(t.skipped, [3]);

        // Re-opened, the torn line is ended and later records stay whole.
        let sink = JsonlSink::open(&path).unwrap();
        sink.on_record(&record(3));
        let t = read_trace_file(&path).unwrap();
        assert_eq!(
            t.records.iter().map(|r| r.seq).collect::<Vec<_>>(),
            [0, 1, 3]
        );
        assert_eq!(t.skipped, [3]);
    }

    #[test]
    fn parse_edge_cases() {
        assert_eq!(parse_trace(b"").records.len(), 0);
        assert!(parse_trace(b"").skipped.is_empty());
        assert_eq!(parse_trace(b"{\"se").skipped, [1]);
        let line = record(5).to_json_line();
        let t = parse_trace(format!("{line}\nnot json\n\n{line}\n").as_bytes());
        assert_eq!(t.records.len(), 2);
        assert_eq!(t.skipped, [2]);
    }
}
