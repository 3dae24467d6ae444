//! Test helpers for the Python suite (cargo feature `testing`): the scriptable mock model
//! server of `intercept-test` (with a tokenizer, its token routes: vLLM's
//! `POST /inference/v1/generate`, SGLang's `POST /generate`) and an in-process bore
//! server, as `intercept._native` classes. Release wheels are built without them.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

use intercept_test::{MockConfig, MockUpstream, Reply, ToolCall};
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
    /// Starts a mock; resolves to it. `tokenizer` (a folder holding `tokenizer.json` and
    /// `tokenizer_config.json`) serves the token routes: scripted replies become its ids.
    #[staticmethod]
    #[pyo3(signature = (tokenizer = None))]
    fn start(py: Python<'_>, tokenizer: Option<String>) -> PyResult<Bound<'_, PyAny>> {
        let tokenizer = tokenizer
            .map(|path| {
                intercept_tokens::shared(&path).map_err(|e| {
                    PyRuntimeError::new_err(format!("mock: the tokenizer at {path:?}: {e}"))
                })
            })
            .transpose()?;
        let config = MockConfig {
            tokenizer,
            ..MockConfig::default()
        };
        crate::bridge::awaitable(py, async move {
            let mock = MockUpstream::start_with(config)
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

    /// Queues a completion: `content` (on the token routes: `raw` sends it as is, with no
    /// think block or tool-call layout), `reasoning`, `tool_calls` as `(name, arguments)`
    /// pairs and a `finish_reason` (`"length"`: cut before the stop id).
    #[pyo3(signature = (content = None, reasoning = None, tool_calls = Vec::new(), finish_reason = None, raw = false))]
    fn push_completion(
        &self,
        content: Option<&str>,
        reasoning: Option<&str>,
        tool_calls: Vec<(String, String)>,
        finish_reason: Option<&str>,
        raw: bool,
    ) -> PyResult<()> {
        let mut reply = match (raw, content) {
            (true, content) => Reply::raw_completion(content.unwrap_or_default()),
            (false, Some(content)) => Reply::text(content),
            (false, None) if !tool_calls.is_empty() => Reply::tool_calls([]),
            (false, None) => Reply::text(""),
        };
        for (name, arguments) in tool_calls {
            reply = reply.with_tool_call(ToolCall::new(name, arguments));
        }
        if let Some(reasoning) = reasoning {
            reply = reply.with_reasoning(reasoning);
        }
        if let Some(reason) = finish_reason {
            reply = reply.with_finish_reason(reason);
        }
        self.with(|m| m.push(reply))
    }

    /// The JSON bodies of the requests received on `path` so far (`None` for one that
    /// was not JSON), as JSON text.
    fn bodies(&self, path: &str) -> PyResult<String> {
        let bodies: Vec<Option<serde_json::Value>> = self.with(|m| {
            m.requests()
                .into_iter()
                .filter(|r| r.path == path)
                .map(|r| r.json().cloned())
                .collect()
        })?;
        serde_json::to_string(&bodies).map_err(|e| PyRuntimeError::new_err(format!("mock: {e}")))
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
