//! Python callables that own a session's `/state` document (`NativeSession.set_state_hook`).
//!
//! `GET /state` calls `get()` (JSON bytes of the document) and `PUT /state` calls
//! `put(body)` (the JSON bytes the tool server sent; it returns `None`, or a message that
//! answers 400). Both run synchronously on the server thread that serves the route, with
//! the GIL: keep them short (a serialisation, a validation, an assignment).

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use intercept_core::Error;

/// The two callables.
pub(crate) struct StateHook {
    get: Py<PyAny>,
    put: Py<PyAny>,
}

impl StateHook {
    pub(crate) fn new(get: Py<PyAny>, put: Py<PyAny>) -> Self {
        StateHook { get, put }
    }

    /// The document, as `get()` gives it (`null` if it fails).
    pub(crate) fn state(&self) -> serde_json::Value {
        let bytes = crate::bridge::with_python(|py| -> PyResult<Vec<u8>> {
            let out = self.get.bind(py).call0()?;
            out.extract::<Vec<u8>>()
        });
        match bytes {
            Some(Ok(b)) => serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null),
            _ => serde_json::Value::Null,
        }
    }

    /// Hands `state` to `put`; a message it returns (or an exception it raises) is a 400.
    pub(crate) fn set_state(&self, state: &serde_json::Value) -> Result<(), Error> {
        let body = serde_json::to_vec(state).map_err(|e| Error::invalid(e.to_string()))?;
        let outcome = crate::bridge::with_python(|py| -> PyResult<Option<String>> {
            let out = self.put.bind(py).call1((PyBytes::new(py, &body),))?;
            out.extract::<Option<String>>()
        });
        match outcome {
            Some(Ok(None)) => Ok(()),
            Some(Ok(Some(message))) => Err(Error::invalid(message)),
            Some(Err(e)) => Err(Error::invalid(format!("invalid state PUT: {e}"))),
            None => Err(Error::Internal(
                "the Python interpreter is shutting down".into(),
            )),
        }
    }
}
