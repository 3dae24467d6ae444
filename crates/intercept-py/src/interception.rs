//! `intercept.Server`, `StaticPool` and `ElasticPool`'s native half: any
//! [`Interception`] built from its configuration, and the slots it hands out.

use std::future::Future as _;
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use intercept_core::{Interception, PauseMode, SlotGuard};
use intercept_pool::{make_interception_with, server_config, InterceptionConfig};
use intercept_tunnel::TunnelConfig;

use crate::errors::{invalid, to_py};
use crate::runtime;
use crate::session::NativeSession;

fn secs(name: &str, v: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(v).map_err(|_| {
        invalid(format!(
            "{name}: expected a non-negative number of seconds, got {v}"
        ))
    })
}

/// A setting refused by serde: `TypeError` when its value has the wrong type (serde's
/// `invalid type: ..., expected ...`, which names both), `InvalidRequestError` otherwise.
fn type_or_invalid(message: String) -> PyErr {
    if message.contains("invalid type: ") {
        PyTypeError::new_err(message)
    } else {
        invalid(message)
    }
}

/// One interception of any shape (see `python/intercept/_interception.py`).
#[pyclass(frozen, module = "intercept._native")]
pub(crate) struct NativeInterception {
    inner: Arc<dyn Interception>,
}

/// Every interception made in this process and not yet dropped, for [`crate::at_exit`].
static LIVE: Mutex<Vec<Weak<dyn Interception>>> = Mutex::new(Vec::new());

/// A live interception, as `at_exit` stops it.
pub(crate) struct Live(Arc<dyn Interception>);

impl Live {
    /// Stops it, reporting nothing (the interpreter is exiting).
    pub(crate) async fn stop_now(&self) {
        let _ = self.0.stop().await;
    }
}

/// The interceptions still alive.
pub(crate) fn live() -> Vec<Live> {
    let mut all = LIVE.lock();
    all.retain(|w| w.strong_count() > 0);
    all.iter().filter_map(Weak::upgrade).map(Live).collect()
}

fn pause_json(status: intercept_core::PauseStatus) -> String {
    serde_json::to_string(&status).unwrap_or_else(|_| "{}".into())
}

#[pymethods]
impl NativeInterception {
    /// `config_json`: an `InterceptionConfig` (`{"type": "server" | "static" |
    /// "elastic", ...}`); `settings_json`: server settings, an object of
    /// `ServerConfig`'s fields (see [`intercept_pool::server_config`]).
    #[new]
    fn new(config_json: &str, requires_tunnel: bool, settings_json: &str) -> PyResult<Self> {
        let config: InterceptionConfig<TunnelConfig> = serde_json::from_str(config_json)
            .map_err(|e| type_or_invalid(format!("interception: {e}")))?;
        let settings: serde_json::Map<String, serde_json::Value> =
            serde_json::from_str(settings_json)
                .map_err(|e| invalid(format!("server settings: {e}")))?;
        let server = server_config(&settings).map_err(type_or_invalid)?;
        let _rt = runtime().enter();
        let inner =
            make_interception_with(&config, requires_tunnel, server).map_err(|e| to_py(&e))?;
        {
            let mut all = LIVE.lock();
            all.retain(|w| w.strong_count() > 0);
            all.push(Arc::downgrade(&inner));
        }
        Ok(NativeInterception { inner })
    }

    /// Brings the servers (and tunnels) up.
    fn start<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        crate::bridge::awaitable(
            py,
            async move { inner.start().await.map_err(|e| to_py(&e)) },
        )
    }

    /// Tears every server and tunnel down.
    fn stop<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        crate::bridge::awaitable(py, async move { inner.stop().await.map_err(|e| to_py(&e)) })
    }

    /// Registers `session` and resolves to its slot.
    fn acquire<'py>(
        &self,
        py: Python<'py>,
        session: &NativeSession,
    ) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        let session: Arc<dyn intercept_core::Session> = session.inner.clone();
        crate::bridge::awaitable(py, async move {
            let guard = inner.acquire(session).await.map_err(|e| to_py(&e))?;
            Ok(NativeSlot::new(guard))
        })
    }

    /// Sessions holding a slot.
    fn load(&self) -> usize {
        self.inner.load()
    }

    /// Model calls in flight.
    fn inflight(&self) -> usize {
        self.inner.inflight()
    }

    /// Resolves to the servers as JSON (`[{"base_url", "load", "healthy"}]`).
    fn servers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        crate::bridge::awaitable(py, async move {
            Ok(serde_json::to_string(&inner.servers().await).unwrap_or_else(|_| "[]".into()))
        })
    }

    /// Pauses new model calls: `mode` is `hold` (wait up to `seconds`) or `reject`
    /// (429 with `Retry-After: seconds`). Resolves to the pause status as JSON.
    fn pause<'py>(&self, py: Python<'py>, mode: &str, seconds: f64) -> PyResult<Bound<'py, PyAny>> {
        let d = secs("pause", seconds)?;
        let mode = match mode {
            "hold" => PauseMode::hold(d),
            "reject" => PauseMode::reject(d),
            other => {
                return Err(invalid(format!(
                    "pause mode {other:?}: expected \"hold\" or \"reject\""
                )))
            }
        };
        let inner = self.inner.clone();
        crate::bridge::awaitable(py, async move {
            inner
                .pause(mode)
                .await
                .map(pause_json)
                .map_err(|e| to_py(&e))
        })
    }

    /// Resumes model calls. Resolves to the pause status as JSON.
    fn resume<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.clone();
        crate::bridge::awaitable(py, async move {
            inner.resume().await.map(pause_json).map_err(|e| to_py(&e))
        })
    }

    /// The pause status as JSON.
    fn pause_status(&self) -> String {
        pause_json(self.inner.pause_status())
    }
}

/// A slot: where the harness goes, and the hold on it.
#[pyclass(frozen, module = "intercept._native")]
pub(crate) struct NativeSlot {
    base_url: String,
    model_secret: String,
    state_secret: String,
    env: Vec<(&'static str, String)>,
    guard: Mutex<Option<SlotGuard>>,
}

impl NativeSlot {
    fn new(guard: SlotGuard) -> Self {
        NativeSlot {
            base_url: guard.base_url.clone(),
            model_secret: guard.model_secret.expose().to_owned(),
            state_secret: guard.state_secret.expose().to_owned(),
            env: guard.harness_env(),
            guard: Mutex::new(Some(guard)),
        }
    }
}

#[pymethods]
impl NativeSlot {
    /// The server's base URL (no `/v1`).
    #[getter]
    fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The harness's API key.
    #[getter]
    fn model_secret(&self) -> &str {
        &self.model_secret
    }

    /// The key of the `/state` and `/task` routes.
    #[getter]
    fn state_secret(&self) -> &str {
        &self.state_secret
    }

    /// `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`.
    fn env<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in &self.env {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Hands intercept a harness's failure text for this slot (its stderr, an exception
    /// message): true when the slot's tunnel backend recognises its tunnel dead in it
    /// (Prime: `404 Tunnel not found or no longer active`), which heals the server at once.
    fn report_tunnel_failure(&self, text: &str) -> bool {
        self.guard
            .lock()
            .as_ref()
            .is_some_and(|g| g.report_tunnel_failure(text))
    }

    /// Whether the slot's `base_url` is gone for good (its tunnel moved to a new URL).
    #[getter]
    fn endpoint_lost(&self) -> bool {
        self.guard
            .lock()
            .as_ref()
            .is_some_and(SlotGuard::endpoint_lost)
    }

    /// Whether the slot was released.
    #[getter]
    fn released(&self) -> bool {
        self.guard.lock().is_none()
    }

    /// Frees the slot and resolves once in-flight calls recorded and the trace is
    /// sealed. Releasing twice resolves at once.
    fn release<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let guard = self.guard.lock().take();
        // Usually done at once (nothing in flight); otherwise the rest runs as its own
        // task, so cancelling the awaiting Python task leaves no half-released slot.
        let mut close = guard.map(|g| Box::pin(g.close()));
        if let Some(c) = close.as_mut() {
            let _rt = runtime().enter();
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            if c.as_mut().poll(&mut cx).is_ready() {
                close = None;
            }
        }
        let release = close.map(|c| runtime().spawn(c));
        crate::bridge::awaitable(py, async move {
            if let Some(release) = release {
                let _ = release.await;
            }
            Ok(())
        })
    }

    /// Frees the slot at once without waiting (in-flight calls are cancelled and
    /// recorded in the background).
    fn release_now(&self) {
        let guard = self.guard.lock().take();
        if let Some(guard) = guard {
            let _rt = runtime().enter();
            drop(guard);
        }
    }
}

impl Drop for NativeSlot {
    fn drop(&mut self) {
        if let Some(guard) = self.guard.get_mut().take() {
            let _rt = runtime().enter();
            drop(guard);
        }
    }
}
