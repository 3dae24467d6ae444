//! The `intercept` binary: parse the command line, build a config value, call the library.

use std::process::ExitCode;

/// mimalloc: a streamed call allocates ~150 times (events, frames, the record); glibc's
/// allocator spent ~13 % of the proxy's instructions on them, mimalloc about a third of
/// that (docs/benchmarks.md), called through its fastest entry points
/// ([`intercept_alloc`]).
#[global_allocator]
static ALLOCATOR: intercept_alloc::MiMalloc = intercept_alloc::MiMalloc;

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

/// `mi_option_arena_max_object_size` in mimalloc's `mi_option_e` (its header numbers the
/// options; the test below checks that this one reads mimalloc's default, 2 GiB in KiB).
const MI_OPTION_ARENA_MAX_OBJECT_SIZE: libmimalloc_sys::mi_option_t = 45;

/// Objects above this many KiB come straight from the OS and go back to it when freed.
const OS_OBJECTS_ABOVE_KIB: std::ffi::c_long = 4 * 1024;

/// Objects over 4 MiB are mapped for themselves and unmapped when freed, instead of living
/// in mimalloc's arenas (its default is 2 GiB). Only a runaway answer (a body read up to
/// `max_response_bytes`, 256 MiB) makes such objects; unmapped at once, its memory
/// returns to the system as the call is released, and the allocator keeps its default
/// purge delay (1,000 ms) for everything else. A purge delay of 1 ms returned the runaway's
/// memory too, but purged and faulted the pages of ordinary calls again and again: 1.26
/// page faults per recorded call and ~3 µs of CPU, against 0.25 (docs/sidecar.md,
/// "Memory of a runaway answer"). `MIMALLOC_ARENA_MAX_OBJECT_SIZE` in the environment
/// still wins.
fn huge_objects_from_the_os() {
    if std::env::var_os("MIMALLOC_ARENA_MAX_OBJECT_SIZE").is_some() {
        return;
    }
    // SAFETY: `mi_option_set` stores an integer in mimalloc's option table, which is
    // valid to do at any time from any thread; the option is a valid `mi_option_t`.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_MAX_OBJECT_SIZE, OS_OBJECTS_ABOVE_KIB);
    }
}

fn main() -> ExitCode {
    no_transparent_huge_pages();
    huge_objects_from_the_os();
    ExitCode::from(intercept_cli::run::run(std::env::args_os()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arena_object_size_option_is_the_one_named() {
        // SAFETY: reading an option of mimalloc's table.
        #[allow(unsafe_code)]
        let get = || unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_ARENA_MAX_OBJECT_SIZE) };
        if std::env::var_os("MIMALLOC_ARENA_MAX_OBJECT_SIZE").is_none() {
            assert_eq!(
                get(),
                2 << 20,
                "mimalloc's default arena object limit is 2 GiB, in KiB"
            );
        }
        huge_objects_from_the_os();
        if std::env::var_os("MIMALLOC_ARENA_MAX_OBJECT_SIZE").is_none() {
            assert_eq!(get(), OS_OBJECTS_ABOVE_KIB);
        }
    }
}
