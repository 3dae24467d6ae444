//! The `intercept` command of the wheel: the Rust CLI, run in-process.

use pyo3::prelude::*;

/// Runs the `intercept` command line `argv` (program name first) and returns its exit
/// status. The GIL is released for the whole run.
#[pyfunction]
pub(crate) fn cli_main(py: Python<'_>, argv: Vec<String>) -> u8 {
    py.detach(|| intercept_cli::run::run(argv))
}
