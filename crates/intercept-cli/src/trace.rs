//! `intercept trace`: reading trace files from the command line (`cat`, `stats`,
//! `export`), and the control API's answers rebuilt from a log.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use intercept_core::log::LogReader;
use intercept_core::Trace;

/// The records of a log as one trace object (`{"id", "stop_condition", "replays",
/// "calls": [...]}`), as the control API answers it. `stop_condition` and `replays`
/// come from the end line when the log has one, else from the arguments.
pub fn trace_json(
    log: &[u8],
    id: &str,
    stop_condition: Option<String>,
    replays: u64,
) -> Result<Vec<u8>, String> {
    let read = LogReader::from_bytes(log).map_err(|e| e.to_string())?;
    let (stop_condition, replays) = match read.end() {
        Some(end) => (end.stop_condition.clone(), end.replays),
        None => (stop_condition, replays),
    };
    let calls = read.records().map_err(|e| e.to_string())?;
    Ok(Trace {
        id: id.to_owned(),
        stop_condition,
        calls,
        replays,
    }
    .to_json_vec())
}

/// The episode of a log, as JSON.
pub fn episode_json(log: &[u8]) -> Result<Vec<u8>, String> {
    let read = LogReader::from_bytes(log).map_err(|e| e.to_string())?;
    serde_json::to_vec(&read.episode())
        .map_err(|e| format!("the episode cannot be serialised: {e}"))
}

fn read(path: &Path) -> anyhow::Result<LogReader> {
    let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if !intercept_trace::is_log(&text) {
        bail!(
            "{} is not a trace log (its first line is not a log header); a file of \
             trace_format = full already holds one record per line",
            path.display()
        );
    }
    LogReader::from_bytes(&text).with_context(|| format!("cannot read {}", path.display()))
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

/// `intercept trace cat FILE...`: one full record per call, one per line, in the record
/// schema of `docs/sidecar.md`. Full-record files are printed as they are.
pub fn cat(files: &[PathBuf], out: &mut impl Write, err: &mut impl Write) -> anyhow::Result<()> {
    for path in files {
        let text =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        if !intercept_trace::is_log(&text) {
            out.write_all(&text)?;
            continue;
        }
        let log = read(path)?;
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

/// `intercept trace stats FILE...`: one JSON object per file (calls, nodes, branches,
/// bytes, and bytes per byte of unique content, for the log and for full records).
pub fn stats(files: &[PathBuf], out: &mut impl Write, err: &mut impl Write) -> anyhow::Result<()> {
    for path in files {
        let log = read(path)?;
        warn_skipped(path, &log, err)?;
        let stats = intercept_trace::stats::stats(&log);
        let mut value = serde_json::to_value(&stats)?;
        value["file"] = serde_json::Value::String(path.display().to_string());
        writeln!(out, "{value}")?;
    }
    Ok(())
}

/// `intercept trace export --format parquet --out PATH FILE...`: one row per branch of
/// every file's episode.
pub fn export(files: &[PathBuf], out: &Path, err: &mut impl Write) -> anyhow::Result<usize> {
    let mut episodes = Vec::with_capacity(files.len());
    for path in files {
        let log = read(path)?;
        warn_skipped(path, &log, err)?;
        episodes.push(log.episode());
    }
    intercept_trace::export::write_parquet(&episodes, out)
        .with_context(|| format!("cannot write {}", out.display()))
}
