//! Test helpers for the Python suite (cargo feature `testing`): the scriptable mock model
//! server of `intercept-test` and an in-process bore server, as `intercept._native`
//! classes. Release wheels are built without them.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use intercept_test::{MockUpstream, Reply};
use intercept_tunnel::BoreServer;

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<NativeMock>()?;
    m.add_class::<NativeBoreServer>()?;
    Ok(())
}

fn gone() -> PyErr {
    PyRuntimeError::new_err("the mock was shut down")
}

/// A running mock model server on `127.0.0.1` (echoes by default).
#[pyclass(frozen, module = "intercept._native")]
pub(crate) struct NativeMock {
    mock: Arc<Mutex<Option<Arc<MockUpstream>>>>,
    addr: SocketAddr,
}

impl NativeMock {
    fn with<R>(&self, f: impl FnOnce(&MockUpstream) -> R) -> PyResult<R> {
        let mock = self.mock.lock().clone().ok_or_else(gone)?;
        Ok(f(&mock))
    }
}

#[pymethods]
impl NativeMock {
    /// Starts a mock; resolves to it.
    #[staticmethod]
    fn start(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
        crate::bridge::awaitable(py, async move {
            let mock = MockUpstream::start()
                .await
                .map_err(|e| PyRuntimeError::new_err(format!("mock: {e}")))?;
            let addr = mock.addr();
            Ok(NativeMock {
                mock: Arc::new(Mutex::new(Some(Arc::new(mock)))),
                addr,
            })
        })
    }

    /// `http://127.0.0.1:<port>/v1`.
    #[getter]
    fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Queues a reply that never answers (until the connection closes).
    fn push_hang(&self) -> PyResult<()> {
        self.with(|m| m.push(Reply::hang()))
    }

    /// Queues an error status with an OpenAI-shaped body.
    fn push_error(&self, status: u16, message: &str) -> PyResult<()> {
        self.with(|m| m.push(Reply::error(status, message)))
    }

    /// Queues a text reply, optionally slow: `header_delay` before the head,
    /// `chunk_delay` between stream chunks (seconds).
    #[pyo3(signature = (text, chunks = None, chunk_delay = None, header_delay = None))]
    fn push_text(
        &self,
        text: &str,
        chunks: Option<usize>,
        chunk_delay: Option<f64>,
        header_delay: Option<f64>,
    ) -> PyResult<()> {
        let mut reply = Reply::text(text);
        if let Some(n) = chunks {
            reply = reply.with_chunks(n);
        }
        if let Some(d) = chunk_delay {
            reply = reply.with_chunk_delay(Duration::from_secs_f64(d));
        }
        if let Some(d) = header_delay {
            reply = reply.with_header_delay(Duration::from_secs_f64(d));
        }
        self.with(|m| m.push(reply))
    }

    /// Requests received so far.
    fn request_count(&self) -> PyResult<usize> {
        self.with(MockUpstream::request_count)
    }

    /// Resolves once at least `n` requests arrived.
    fn wait_for_requests<'py>(&self, py: Python<'py>, n: usize) -> PyResult<Bound<'py, PyAny>> {
        let mock = self.mock.lock().clone().ok_or_else(gone)?;
        crate::bridge::awaitable(py, async move {
            mock.wait_for_requests(n).await;
            Ok(())
        })
    }

    /// Stops the mock (open connections are closed).
    fn shutdown<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let mock = self.mock.lock().take();
        crate::bridge::awaitable(py, async move {
            if let Some(mock) = mock {
                match Arc::try_unwrap(mock) {
                    Ok(mock) => mock.shutdown().await,
                    Err(shared) => drop(shared),
                }
            }
            Ok(())
        })
    }
}

/// An in-process bore server on `127.0.0.1` (for the bore tunnel).
#[pyclass(frozen, module = "intercept._native")]
pub(crate) struct NativeBoreServer {
    server: Mutex<Option<BoreServer>>,
    port: u16,
}

#[pymethods]
impl NativeBoreServer {
    /// Starts one on a free port; resolves to it.
    #[staticmethod]
    #[pyo3(signature = (secret = None))]
    fn start(py: Python<'_>, secret: Option<String>) -> PyResult<Bound<'_, PyAny>> {
        crate::bridge::awaitable(py, async move {
            let server = BoreServer::bind((Ipv4Addr::LOCALHOST, 0).into(), secret.as_deref())
                .await
                .map_err(|e| PyRuntimeError::new_err(format!("bore server: {e}")))?;
            let port = server.control_addr().port();
            Ok(NativeBoreServer {
                server: Mutex::new(Some(server)),
                port,
            })
        })
    }

    /// Its control port.
    #[getter]
    fn control_port(&self) -> u16 {
        self.port
    }

    /// Stops it.
    fn shutdown<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let server = self.server.lock().take();
        crate::bridge::awaitable(py, async move {
            if let Some(server) = server {
                server.shutdown().await;
            }
            Ok(())
        })
    }
}
