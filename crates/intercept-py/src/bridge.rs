//! Rust futures as asyncio awaitables, and the one gate through which server threads call
//! into Python.
//!
//! [`awaitable`] does what `pyo3_async_runtimes::tokio::future_into_py` does (an asyncio
//! future on the running loop, resolved from a tokio task; cancelling it aborts the task)
//! with one difference: the resolution goes through [`with_python`], which interpreter
//! exit can close and drain. A thread still inside Python while the interpreter finalises
//! aborts the process (`PyGILState_Release: thread state must be current`); the
//! `atexit` handler ([`crate::at_exit`]) closes the gate and waits until no server thread
//! is inside it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::IntoPyObjectExt as _;
use tokio::task::AbortHandle;

use crate::runtime;

static EXITING: AtomicBool = AtomicBool::new(false);
static INSIDE: AtomicUsize = AtomicUsize::new(0);
static RESOLVE: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Whether the interpreter is exiting: server threads no longer call into Python.
pub(crate) fn exiting() -> bool {
    EXITING.load(Ordering::SeqCst)
}

struct Inside;

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs `f` with the GIL from a server thread, unless the interpreter is exiting (or
/// cannot be attached to): then `None`.
pub(crate) fn with_python<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
    INSIDE.fetch_add(1, Ordering::SeqCst);
    let _inside = Inside;
    if exiting() {
        return None;
    }
    Python::try_attach(f)
}

/// Closes the gate and waits (without the GIL) until no server thread is inside it, at
/// most `limit`.
pub(crate) fn close_gate(py: Python<'_>, limit: Duration) {
    EXITING.store(true, Ordering::SeqCst);
    py.detach(|| wait_outside(limit));
}

/// Waits until no server thread is inside the gate, at most `limit`: on Python's exiting
/// thread, outside any runtime, so on the process's clock.
#[allow(clippy::disallowed_types)]
fn wait_outside(limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    while INSIDE.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Aborts the tokio task when its asyncio future is cancelled.
#[pyclass(frozen)]
pub(crate) struct AbortOnCancel {
    handle: AbortHandle,
}

#[pymethods]
impl AbortOnCancel {
    fn __call__(&self, fut: &Bound<'_, PyAny>) -> PyResult<()> {
        if fut.call_method0("cancelled")?.is_truthy()? {
            self.handle.abort();
        }
        Ok(())
    }
}

/// An asyncio future (on the running loop) resolved with `fut`'s outcome.
pub(crate) fn awaitable<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let resolve = RESOLVE
        .get_or_try_init(py, || -> PyResult<Py<PyAny>> {
            Ok(py.import("intercept._hooks")?.getattr("resolve")?.unbind())
        })?
        .clone_ref(py);
    let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
    let py_fut = event_loop.call_method0("create_future")?;
    // Most calls (acquire on a server with room, release with nothing in flight) are
    // ready at once: poll once here and hand back a finished future, with no thread hop.
    let mut fut = Box::pin(fut);
    let first = {
        let _rt = runtime().enter();
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        fut.as_mut().poll(&mut cx)
    };
    if let std::task::Poll::Ready(result) = first {
        match result {
            Ok(v) => py_fut.call_method1("set_result", (v,))?,
            Err(e) => py_fut.call_method1("set_exception", (e.into_value(py),))?,
        };
        return Ok(py_fut);
    }
    let target = py_fut.clone().unbind();
    let loop_ref = event_loop.unbind();
    let handle = runtime().spawn(async move {
        let result = fut.await;
        with_python(move |py| {
            let (ok, value) = match result {
                Ok(v) => match v.into_py_any(py) {
                    Ok(v) => (true, v),
                    Err(e) => (false, e.into_value(py).into_any()),
                },
                Err(e) => (false, e.into_value(py).into_any()),
            };
            // A closed loop (asyncio.run returned) raises: nobody waits any more.
            let _ = loop_ref
                .bind(py)
                .call_method1("call_soon_threadsafe", (resolve, target, ok, value));
        });
    });
    py_fut.call_method1(
        "add_done_callback",
        (Py::new(
            py,
            AbortOnCancel {
                handle: handle.abort_handle(),
            },
        )?,),
    )?;
    Ok(py_fut)
}
