//! The native core of **intercept**'s Python package (PyPI `intercept-rl`, import
//! `intercept`): the Rust server, pools and tunnels run in-process on their own tokio
//! runtime, driven from asyncio.
//!
//! This crate is the extension module `intercept._native`; the Python API around it
//! (`intercept.Server`, `StaticPool`, `ElasticPool`, `Session`, typed records, errors,
//! the sync facade and the verifiers compatibility classes) lives in `python/intercept`
//! and is documented in `docs/python.md`. Python objects stop at this crate's boundary:
//! the server sees a [`intercept_core::Session`] like any other.
//!
//! ```text
//! import intercept
//!
//! async with intercept.Server() as ic:
//!     session = intercept.Session(id="r1", model="policy", upstream="http://127.0.0.1:8000/v1")
//!     async with ic.acquire(session) as slot:
//!         await run_harness(env=slot.env)
//!     trace = session.trace()
//! ```
//!
//! Contracts:
//!
//! - Serving never holds the GIL. It is taken only to run a Python hook (scheduled on
//!   the event loop that acquired the session, then awaited without the GIL), to build a
//!   Python exception, and to hand results back.
//! - Every awaitable returned here is a tokio task; cancelling it from Python (e.g.
//!   `asyncio.wait_for`) drops the Rust future: an acquire cancelled after it got its slot
//!   frees the slot at once.
//! - A slot object that is garbage collected without `release()` frees its slot
//!   (release-now semantics: in-flight calls are cancelled and recorded).

use pyo3::prelude::*;

mod bridge;
mod cli;
mod errors;
mod hooks;
mod interception;
mod log;
mod record_hook;
mod session;
mod state_hook;
#[cfg(feature = "testing")]
mod testing;

/// The module's Rust allocations use mimalloc, as the `intercept` binary does (the
/// Python interpreter keeps its own allocator).
#[global_allocator]
static ALLOCATOR: intercept_alloc::MiMalloc = intercept_alloc::MiMalloc;

/// The tokio runtime every server of the process runs on (built on first use).
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

/// Registered with `atexit` by the package: stops every interception still running (its
/// calls in flight are cancelled and recorded), then closes the gate through which server
/// threads call into Python and waits until none is inside, so that no server thread is
/// in Python while the interpreter finalises. Waits at most `timeout` seconds for each.
#[pyfunction]
fn at_exit(py: Python<'_>, timeout: f64) {
    let limit = std::time::Duration::try_from_secs_f64(timeout).unwrap_or_default();
    let live = interception::live();
    if !live.is_empty() {
        py.detach(|| {
            runtime().block_on(async move {
                let stops = async {
                    for ic in &live {
                        ic.stop_now().await;
                    }
                };
                let _ = tokio::time::timeout(limit, stops).await;
            })
        });
    }
    bridge::close_gate(py, limit);
}

/// Sends the Rust side's logs (`tracing`) to stderr, filtered like `RUST_LOG`
/// (e.g. `"info"`, `"intercept_server=debug"`). Returns false if logging was already set
/// up in this process.
#[pyfunction]
#[pyo3(signature = (filter = "info"))]
fn enable_logging(filter: &str) -> bool {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .try_init()
        .is_ok()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all().thread_name("intercept-rt");
    pyo3_async_runtimes::tokio::init(builder);
    m.add_class::<session::NativeSession>()?;
    m.add_class::<log::NativeLog>()?;
    m.add_class::<interception::NativeInterception>()?;
    m.add_class::<interception::NativeSlot>()?;
    m.add_class::<hooks::HookDone>()?;
    m.add_class::<bridge::AbortOnCancel>()?;
    m.add_function(wrap_pyfunction!(cli::cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(enable_logging, m)?)?;
    m.add_function(wrap_pyfunction!(at_exit, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("TESTING", cfg!(feature = "testing"))?;
    errors::register(m)?;
    log::register(m)?;
    #[cfg(feature = "testing")]
    testing::register(m)?;
    Ok(())
}
