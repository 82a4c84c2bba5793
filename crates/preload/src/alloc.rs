//! The runtime's own heap: glibc's. Rust allocations of this library (the
//! cache, the pager, the pool's bookkeeping) go through the global
//! allocator here to glibc's malloc, whose memory is never managed.

use libc::{c_void, size_t};
use std::alloc::{GlobalAlloc, Layout};

use crate::sys;

extern "C" {
    pub(crate) fn __libc_malloc(size: size_t) -> *mut c_void;
    pub(crate) fn __libc_calloc(n: size_t, size: size_t) -> *mut c_void;
    pub(crate) fn __libc_realloc(p: *mut c_void, size: size_t) -> *mut c_void;
    pub(crate) fn __libc_free(p: *mut c_void);
    pub(crate) fn __libc_memalign(align: size_t, size: size_t) -> *mut c_void;
}

/// glibc's malloc guarantees this alignment.
const LIBC_ALIGN: usize = 16;

/// Rust allocations of this library (cache, pager, pool bookkeeping) go to
/// glibc's heap, which is never managed.
struct LibcHeap;

// SAFETY: glibc's allocator returns blocks of at least the requested size
// and alignment (memalign for alignments above 16), or null.
unsafe impl GlobalAlloc for LibcHeap {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: plain calls into glibc's allocator.
        unsafe {
            if l.align() <= LIBC_ALIGN {
                __libc_malloc(l.size()).cast()
            } else {
                __libc_memalign(l.align(), l.size()).cast()
            }
        }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.align() <= LIBC_ALIGN {
            // SAFETY: plain call into glibc's allocator.
            return unsafe { __libc_calloc(1, l.size()).cast() };
        }
        // SAFETY: alloc returns `size` writable bytes or null.
        unsafe {
            let p = self.alloc(l);
            if !p.is_null() {
                std::ptr::write_bytes(p, 0, l.size());
            }
            p
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, _l: Layout) {
        // SAFETY: p came from glibc's allocator (alloc above).
        unsafe { __libc_free(p.cast()) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        if l.align() <= LIBC_ALIGN {
            // SAFETY: p came from glibc's allocator.
            return unsafe { __libc_realloc(p.cast(), new_size).cast() };
        }
        // SAFETY: a new block of the same alignment, the old contents
        // copied, the old block freed; `new_size` is non-zero by contract.
        unsafe {
            let n = self.alloc(Layout::from_size_align_unchecked(new_size, l.align()));
            if !n.is_null() {
                std::ptr::copy_nonoverlapping(p, n, l.size().min(new_size));
                self.dealloc(p, l);
            }
            n
        }
    }
}

#[global_allocator]
static GLOBAL: LibcHeap = LibcHeap;

/// Sets glibc's heap up for the runtime, before any runtime thread runs.
///
/// Once the runtime is started glibc's heap serves the runtime alone (the
/// program's `malloc` is mimalloc's; glibc keeps only what was allocated
/// before, freed there, and the calls of a fork's window). By default
/// glibc gives each new thread that allocates an arena of its own, up to
/// eight per CPU, and every arena keeps its own free space and its own
/// partly used top: with five runtime threads (handler, evictor, writer,
/// compactor, statistics) each process held several arenas whose free
/// space no other thread could reuse (3.3 MiB of a tree of five Python
/// processes, 0.7-0.9 MiB in each: "runtime memory" in
/// docs/BENCHMARKS.md). One arena pools that space.
/// Its lock is taken only inside glibc's malloc and free, never across
/// anything of ours; the runtime's threads allocate
/// little on their hot paths (buffers are per thread and reused), and
/// glibc's per-thread cache serves most small blocks without the lock.
///
/// glibc fixes its arena limit when it makes its first arena past the
/// main one, so the setting cannot be taken back: a forked child that runs
/// unmanaged (`FORKED`, whose `malloc` is glibc's again) keeps one arena
/// for its own threads too.
pub(crate) fn setup_runtime_heap() {
    if !sys::one_malloc_arena() {
        // Not fatal: the runtime works with glibc's arenas, only larger.
        sys::warn("glibc refused M_ARENA_MAX: the runtime's heap keeps an arena per thread");
    }
}
