//! The `intercept` binary: parse the command line, build a config value, call the library.

use std::process::ExitCode;

/// mimalloc: a streamed call allocates ~150 times (events, frames, the record); glibc's
/// allocator spent ~13 % of the proxy's instructions on them, mimalloc about a third of
/// that (docs/benchmarks.md), called through its fastest entry points
/// ([`intercept_alloc`]).
#[global_allocator]
static ALLOCATOR: intercept_alloc::MiMalloc = intercept_alloc::MiMalloc;

fn main() -> ExitCode {
    // Transparent huge pages off, objects over 4 MiB mapped for themselves (see there).
    intercept_alloc::configure_process();
    ExitCode::from(intercept_cli::run::run(std::env::args_os()))
}
