//! The global allocator of intercept's processes: [`MiMalloc`], mimalloc called the way
//! its own `malloc` is fastest, for the `intercept` binary, the Python module and the
//! bench's proxy; and [`configure_process`], the process-wide settings (mimalloc's
//! options, transparent huge pages) that a program owning its process applies first: the
//! binary's `main` and the wheel's `intercept` command. The Python module imported into a
//! trainer leaves them to the trainer.
//!
//! The `mimalloc` crate's allocator asks mimalloc for an *aligned* block at every
//! allocation (`mi_malloc_aligned`). That call takes a slower path than `mi_malloc`:
//! always for blocks over 1 KiB (request and response bodies, trace lines), and with an
//! over-allocation for some alignments. Every mimalloc block is aligned to 8 bytes, which
//! is the alignment of nearly every Rust allocation, so those go to `mi_malloc`,
//! `mi_zalloc` and `mi_realloc`; a larger alignment (tokio's cache-padded task cells)
//! still goes to the aligned calls. A JSON call through the proxy made ~67 allocations
//! when this was measured; it saved ~1,700 instructions of its ~73,700 (docs/benchmarks.md,
//! "The allocator's fast path").
//!
//! ```no_run
//! #[global_allocator]
//! static ALLOCATOR: intercept_alloc::MiMalloc = intercept_alloc::MiMalloc;
//! ```

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// Applies the process-wide settings of a process that runs intercept and nothing else
/// (the binary's `main`, the wheel's `intercept` command), before its work starts:
///
/// - transparent huge pages off. With them, memory that grows (traces kept in memory) is
///   faulted in 2 MiB at a time, each fault zeroing 2 MiB in the middle of a call:
///   recording into in-memory traces ran at p99 5.6 ms instead of 0.9 ms, with a quarter
///   more CPU per call (docs/benchmarks.md). mimalloc is built not to ask for them
///   (`no_thp`); this also covers hosts whose kernel gives them unasked (`enabled =
///   always`), and the other allocators of the process (the Python interpreter's). A
///   host that refuses the request keeps its default. Linux only.
/// - objects over 4 MiB mapped for themselves and unmapped when freed, instead of living
///   in mimalloc's arenas (its default is 2 GiB). Only a runaway answer (a body read up
///   to `max_response_bytes`, 256 MiB) makes such objects; unmapped at once, its memory
///   returns to the system as the call is released, and the allocator keeps its default
///   purge delay (1,000 ms) for everything else. A purge delay of 1 ms returned the
///   runaway's memory too, but purged and faulted the pages of ordinary calls again and
///   again: 1.26 page faults per recorded call and ~3 µs of CPU, against 0.25
///   (docs/sidecar.md, "Memory of a runaway answer"). `MIMALLOC_ARENA_MAX_OBJECT_SIZE` in
///   the environment still wins.
///
/// Both are settings of the whole process: a library loaded into someone else's program
/// does not call this.
pub fn configure_process() {
    no_transparent_huge_pages();
    huge_objects_from_the_os();
}

fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
}

/// `mi_option_arena_max_object_size` in mimalloc's `mi_option_e` (its header numbers the
/// options; a test checks that this one reads mimalloc's default, 2 GiB in KiB).
const MI_OPTION_ARENA_MAX_OBJECT_SIZE: mi::mi_option_t = 45;

/// Objects above this many KiB come straight from the OS and go back to it when freed.
const OS_OBJECTS_ABOVE_KIB: std::ffi::c_long = 4 * 1024;

fn huge_objects_from_the_os() {
    if std::env::var_os("MIMALLOC_ARENA_MAX_OBJECT_SIZE").is_some() {
        return;
    }
    // SAFETY: `mi_option_set` stores an integer in mimalloc's option table, which is
    // valid to do at any time from any thread; the option is a valid `mi_option_t`.
    #[allow(unsafe_code)]
    unsafe {
        mi::mi_option_set(MI_OPTION_ARENA_MAX_OBJECT_SIZE, OS_OBJECTS_ABOVE_KIB);
    }
}

/// The alignment of every block `mi_malloc` returns (a machine word).
const MI_MIN_ALIGN: usize = std::mem::size_of::<usize>();

/// mimalloc as the global allocator (see the [crate docs](crate)).
#[derive(Debug, Clone, Copy, Default)]
pub struct MiMalloc;

// SAFETY: mimalloc's functions are thread-safe and return null on failure. A block from
// `mi_malloc`, `mi_zalloc` or `mi_realloc` is aligned to `MI_MIN_ALIGN`, which satisfies
// every layout sent there; other layouts go to the aligned calls, which honour any
// power-of-two alignment. `mi_free` frees a block from either family.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for MiMalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if layout.align() <= MI_MIN_ALIGN {
                mi::mi_malloc(layout.size()).cast()
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if layout.align() <= MI_MIN_ALIGN {
                mi::mi_zalloc(layout.size()).cast()
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the trait's contract).
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout` (the trait's contract).
        unsafe {
            if layout.align() <= MI_MIN_ALIGN {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arena_object_size_option_is_the_one_named_and_configure_sets_it() {
        // SAFETY: reading an option of mimalloc's table.
        #[allow(unsafe_code)]
        let get = || unsafe { mi::mi_option_get(MI_OPTION_ARENA_MAX_OBJECT_SIZE) };
        let from_env = std::env::var_os("MIMALLOC_ARENA_MAX_OBJECT_SIZE").is_some();
        if !from_env {
            assert_eq!(
                get(),
                2 << 20,
                "mimalloc's default arena object limit is 2 GiB, in KiB"
            );
        }
        configure_process();
        if !from_env {
            assert_eq!(get(), OS_OBJECTS_ABOVE_KIB);
        }
        #[cfg(target_os = "linux")]
        assert_eq!(
            rustix::thread::transparent_huge_pages_are_disabled().ok(),
            Some(true),
            "this process asked for no transparent huge pages"
        );
    }

    /// Every size class of mimalloc's small and medium pages, every alignment up to a
    /// page: each block is aligned, writable over its whole size, keeps its bytes when
    /// grown or shrunk, and is zeroed when asked.
    #[test]
    #[allow(unsafe_code)]
    fn blocks_are_aligned_zeroed_and_keep_their_bytes_when_resized() {
        let a = MiMalloc;
        let sizes = (1..=600).chain((601..70_000).step_by(997)).chain([1 << 20]);
        for size in sizes {
            for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096] {
                let layout = Layout::from_size_align(size, align).expect("layout");
                // SAFETY: a non-zero size; every pointer is freed with its layout.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null(), "size {size} align {align}");
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    std::ptr::write_bytes(p, 0xA5, size);

                    let grown = a.realloc(p, layout, size * 2 + 24);
                    assert_eq!(
                        grown as usize % align,
                        0,
                        "grown: size {size} align {align}"
                    );
                    assert!(std::slice::from_raw_parts(grown, size)
                        .iter()
                        .all(|b| *b == 0xA5));
                    let grown_layout = Layout::from_size_align(size * 2 + 24, align).expect("l");
                    let shrunk = a.realloc(grown, grown_layout, size);
                    assert_eq!(
                        shrunk as usize % align,
                        0,
                        "shrunk: size {size} align {align}"
                    );
                    assert!(std::slice::from_raw_parts(shrunk, size)
                        .iter()
                        .all(|b| *b == 0xA5));
                    a.dealloc(shrunk, layout);

                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0, "zeroed: size {size} align {align}");
                    assert!(std::slice::from_raw_parts(z, size).iter().all(|b| *b == 0));
                    a.dealloc(z, layout);
                }
            }
        }
    }
}
