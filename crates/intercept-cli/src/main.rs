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

/// `mi_option_purge_delay` in mimalloc's `mi_option_e` (its header numbers the options;
/// the test below checks that this one reads mimalloc's default of 1,000 ms).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Freed memory goes back to the system after 1 ms instead of mimalloc's 1,000 ms. With the
/// default, a call cut off at `max_response_bytes` (256 MiB) peaked at 2x the cap and
/// its memory stayed resident after the release; with 1 ms the peak is 1.04x the cap
/// and RSS returns to where it was, at no measured cost in throughput
/// (docs/sidecar.md, "Memory of a runaway answer"). `MIMALLOC_PURGE_DELAY` in the
/// environment still wins.
fn prompt_purge() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: `mi_option_set` stores an integer in mimalloc's option table, which is
    // valid to do at any time from any thread; the option is a valid `mi_option_t`.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 1);
    }
}

fn main() -> ExitCode {
    no_transparent_huge_pages();
    prompt_purge();
    ExitCode::from(intercept_cli::run::run(std::env::args_os()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_option_is_the_one_named() {
        // SAFETY: reading an option of mimalloc's table.
        #[allow(unsafe_code)]
        let get = || unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(get(), 1000, "mimalloc's default purge delay is 1,000 ms");
        }
        prompt_purge();
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(get(), 1);
        }
    }
}
