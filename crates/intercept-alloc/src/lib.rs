//! The global allocator of intercept's processes: [`MiMalloc`], mimalloc called the way
//! its own `malloc` is fastest, for the `intercept` binary, the Python module and the
//! bench's proxy. Process-wide choices beyond the allocator (mimalloc's options,
//! transparent huge pages) stay with the binary that owns the process.
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

/// The alignment of every block `mi_malloc` returns (a machine word).
const MI_MIN_ALIGN: usize = std::mem::size_of::<usize>();

/// mimalloc as the global allocator (see the [crate](crate)).
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
