//! The `intercept` binary: parse the command line, build a config value, call the library.

use std::process::ExitCode;

/// mimalloc: a streamed call allocates ~150 times (events, frames, the record); glibc's
/// allocator spent ~13 % of the proxy's instructions on them, mimalloc about a third of
/// that (docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Transparent huge pages off for this process. With them, memory that grows (traces
/// kept in memory) is faulted in 2 MiB at a time, each fault zeroing 2 MiB in the middle
/// of a call: recording into in-memory traces ran at p99 5.6 ms instead of 0.9 ms, with a
/// quarter more CPU per call (docs/benchmarks.md). mimalloc is built not to ask for them
/// (`no_thp`); this also covers hosts whose kernel gives them unasked (`enabled =
/// always`). A host that refuses the request keeps its default.
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}

fn main() -> ExitCode {
    no_transparent_huge_pages();
    ExitCode::from(intercept_cli::run::run(std::env::args_os()))
}
