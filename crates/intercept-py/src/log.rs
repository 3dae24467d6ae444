//! Trace logs read from Python: a session's log in memory or a log file, each record
//! rebuilt when asked for.

use pyo3::prelude::*;

use intercept_core::log::LogReader;
use intercept_core::Error;

use crate::errors::to_py;

/// A trace log, read once; records are rebuilt one at a time ([`NativeLog::record_json`]).
#[pyclass(module = "intercept._native", frozen)]
#[derive(Debug)]
pub(crate) struct NativeLog {
    log: LogReader,
}

impl NativeLog {
    pub(crate) fn new(text: &[u8]) -> PyResult<Self> {
        LogReader::from_bytes(text)
            .map(|log| NativeLog { log })
            .map_err(|e| to_py(&Error::InvalidRequest(e.to_string())))
    }
}

#[pymethods]
impl NativeLog {
    /// Reads a log's text.
    #[staticmethod]
    fn from_bytes(py: Python<'_>, text: Vec<u8>) -> PyResult<Self> {
        py.detach(move || NativeLog::new(&text))
    }

    /// Reads a log file (intercept-trace's reader: a full-record file is refused).
    #[staticmethod]
    fn read(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Self> {
        py.detach(move || {
            intercept_trace::read_log_file(&path)
                .map(|log| NativeLog { log })
                .map_err(|e| {
                    to_py(&Error::InvalidRequest(format!(
                        "cannot read the trace log: {e}"
                    )))
                })
        })
    }

    /// The session id.
    #[getter]
    fn session(&self) -> String {
        self.log.session().to_owned()
    }

    /// The header line's fields as JSON (`null` without one).
    fn header_json(&self) -> String {
        self.log
            .header()
            .map_or_else(|| "null".to_owned(), |h| h.to_string())
    }

    /// The end line as JSON (`null` without one).
    fn end_json(&self) -> String {
        self.log.end().map_or_else(
            || "null".to_owned(),
            |e| serde_json::to_string(e).unwrap_or_else(|_| "null".into()),
        )
    }

    /// Whether the log has no end line (crashed, or still running) or a torn last line.
    #[getter]
    fn incomplete(&self) -> bool {
        self.log.incomplete()
    }

    /// Lines skipped: (1-based number, why).
    fn skipped(&self) -> Vec<(usize, String)> {
        self.log.skipped().to_vec()
    }

    /// Calls in the log.
    fn calls_len(&self) -> usize {
        self.log.calls().len()
    }

    /// Call `index`'s full record as JSON.
    fn record_json(&self, index: usize) -> PyResult<String> {
        let record = self
            .log
            .record(index)
            .map_err(|e| to_py(&Error::InvalidRequest(e.to_string())))?;
        String::from_utf8(record.to_json_vec()).map_err(|e| to_py(&Error::Internal(e.to_string())))
    }

    /// The episode as JSON.
    fn episode_json(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| serde_json::to_string(&self.log.episode()))
            .map_err(|e| to_py(&Error::Internal(format!("episode not serialisable: {e}"))))
    }
}

/// Adds `CALL_FIELDS` to the module: every field of a call's JSON as (name, when a line
/// leaves it out: `never`, `in_log` or `when_default`, its default as JSON text), in
/// line order: the one table the Rust writers follow (`intercept_core::record::CALL_FIELDS`),
/// which the Python records read.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    use intercept_core::record::{Omit, CALL_FIELDS};
    let fields: Vec<(&str, &str, &str)> = CALL_FIELDS
        .iter()
        .map(|f| {
            let omit = match f.omit {
                Omit::Never => "never",
                Omit::InLog => "in_log",
                _ => "when_default",
            };
            (f.name, omit, f.default)
        })
        .collect();
    m.add("CALL_FIELDS", fields)
}
