//! `intercept trace`: reading trace files from the command line (`cat`, `stats`,
//! `export`), and the control API's answers rebuilt from a log.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use intercept_core::log::LogReader;
use intercept_trace::{read_log_file, Opened};

/// The records of trace text (a log, or full records) as one trace object (`{"id",
/// "stop_condition", "replays", "calls": [...]}`), as the control API answers it.
/// `stop_condition` and `replays` come from a log's end line when it has one, else from
/// the arguments.
pub fn trace_json(
    text: &[u8],
    id: &str,
    stop_condition: Option<String>,
    replays: u64,
) -> Result<Vec<u8>, String> {
    intercept_trace::trace_of(text, id, stop_condition, replays)
        .map(|trace| trace.to_json_vec())
        .map_err(|e| e.to_string())
}

/// The episode of a log, as JSON.
pub fn episode_json(log: &[u8]) -> Result<Vec<u8>, String> {
    let read = LogReader::from_bytes(log).map_err(|e| e.to_string())?;
    serde_json::to_vec(&read.episode())
        .map_err(|e| format!("the episode cannot be serialised: {e}"))
}

/// The files `paths` name (a folder: its `*.jsonl` files, sorted).
fn files(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    Ok(intercept_trace::trace_files(paths)?)
}

fn warn_skipped(path: &Path, log: &LogReader, err: &mut impl Write) -> std::io::Result<()> {
    for (line, why) in log.skipped() {
        writeln!(err, "{}: line {line} skipped: {why}", path.display())?;
    }
    if log.incomplete() {
        writeln!(
            err,
            "{}: incomplete (no end line: the session crashed or is still running)",
            path.display()
        )?;
    }
    Ok(())
}

/// `intercept trace cat PATH...`: one full record per call, one per line, in the record
/// schema of `docs/sidecar.md`. Full-record files are printed as they are; a folder is
/// its `*.jsonl` files, sorted.
pub fn cat(paths: &[PathBuf], out: &mut impl Write, err: &mut impl Write) -> anyhow::Result<()> {
    for path in &files(paths)? {
        let log = match intercept_trace::open_trace(path)? {
            Opened::Full(text) => {
                out.write_all(&text)?;
                continue;
            }
            Opened::Log(log) => log,
            _ => continue,
        };
        warn_skipped(path, &log, err)?;
        for (i, call) in log.calls().iter().enumerate() {
            match log.record(i) {
                Ok(record) => {
                    let mut line = record.to_json_vec();
                    line.push(b'\n');
                    out.write_all(&line)?;
                }
                Err(e) => writeln!(err, "{}: line {}: {e}", path.display(), call.line)?,
            }
        }
    }
    Ok(())
}

/// `intercept trace stats PATH...`: one JSON object per log file (calls, nodes,
/// branches, bytes, and bytes per byte of unique content, for the log and for full
/// records); a folder is its `*.jsonl` files, sorted.
pub fn stats(paths: &[PathBuf], out: &mut impl Write, err: &mut impl Write) -> anyhow::Result<()> {
    for path in &files(paths)? {
        let log = read_log_file(path)?;
        warn_skipped(path, &log, err)?;
        let stats = intercept_trace::stats::stats(&log);
        let mut value = serde_json::to_value(&stats)?;
        value["file"] = serde_json::Value::String(path.display().to_string());
        writeln!(out, "{value}")?;
    }
    Ok(())
}

/// `intercept trace export --format parquet --out PATH PATH...`: one row per branch of
/// every log file's episode; a folder is its `*.jsonl` files, sorted.
pub fn export(paths: &[PathBuf], out: &Path, err: &mut impl Write) -> anyhow::Result<usize> {
    let files = files(paths)?;
    let mut episodes = Vec::with_capacity(files.len());
    for path in &files {
        let log = read_log_file(path)?;
        warn_skipped(path, &log, err)?;
        episodes.push(log.episode());
    }
    intercept_trace::export::write_parquet(&episodes, out)
        .with_context(|| format!("cannot write {}", out.display()))
}
