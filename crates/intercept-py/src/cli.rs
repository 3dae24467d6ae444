//! The `intercept` command of the wheel: the Rust CLI, run in-process.

use pyo3::prelude::*;

/// Runs the `intercept` command line `argv` (program name first) and returns its exit
/// status. The GIL is released for the whole run.
///
/// The command owns its process (the wheel's `intercept` script, `python -m intercept`),
/// so it first applies the binary's process-wide settings
/// ([`intercept_alloc::configure_process`]: transparent huge pages off, objects over
/// 4 MiB mapped for themselves); the module's allocator is the binary's already. A trainer
/// that imports `intercept` and never runs the command keeps its own settings.
#[pyfunction]
pub(crate) fn cli_main(py: Python<'_>, argv: Vec<String>) -> u8 {
    intercept_alloc::configure_process();
    py.detach(|| intercept_cli::run::run(argv))
}
