//! Rust errors as Python exceptions: `intercept.InterceptError` and its subclass per
//! error kind (defined in `intercept/_errors.py`), carrying kind, status and message.
//! The module's `ERROR_KINDS` lists every [`ErrorKind`] with its status, blame and doc:
//! `_errors.py` gives each class its kind's defaults from it.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

use intercept_core::{Error, ErrorKind};

static FROM_NATIVE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Adds `ERROR_KINDS`: a `(kind, status, blame, doc)` tuple per error kind, in the
/// order Rust declares them.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let kinds: Vec<(&str, u16, &str, &str)> = ErrorKind::ALL
        .iter()
        .map(|k| (k.as_str(), k.status(), k.blame().as_str(), k.doc()))
        .collect();
    m.add("ERROR_KINDS", kinds)
}

/// The Python exception for `e` (takes the GIL briefly).
pub(crate) fn to_py(e: &Error) -> PyErr {
    // Through the gate: while the interpreter exits, a plain (lazily built) RuntimeError.
    crate::bridge::with_python(|py| {
        exception(
            py,
            e.kind().as_str(),
            e.status(),
            &e.to_string(),
            e.blame().as_str(),
            e.retryable(),
        )
    })
    .unwrap_or_else(|| PyRuntimeError::new_err(e.to_string()))
}

/// An `InterceptError` of kind `invalid_request` (status 400) with `message`.
pub(crate) fn invalid(message: impl Into<String>) -> PyErr {
    to_py(&Error::invalid(message))
}

fn exception(
    py: Python<'_>,
    kind: &str,
    status: u16,
    message: &str,
    blame: &str,
    retryable: bool,
) -> PyErr {
    let made = FROM_NATIVE
        .get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            Ok(py
                .import("intercept._errors")?
                .getattr("_from_native")?
                .unbind())
        })
        .and_then(|f| f.bind(py).call1((kind, status, message, blame, retryable)));
    match made {
        Ok(value) => PyErr::from_value(value),
        Err(e) => PyRuntimeError::new_err(format!(
            "{message} (and intercept._errors could not build the exception: {e})"
        )),
    }
}
