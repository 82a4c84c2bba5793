//! The dynamic loader's own allocations stay in glibc's heap.
//!
//! `ld.so` allocates with the program's `malloc`, `calloc` and `realloc`
//! (ours) once the program runs: the records of every library `dlopen`
//! loads (`struct link_map`), each thread's table of TLS blocks and the
//! blocks of dynamic TLS. The runtime's own threads read them: creating a
//! thread copies every module's TLS image by its record, and unwinding
//! walks the records. In a region, an evicted record would stop those
//! threads on a fault, and in a forked child the hook that starts the
//! child's handler thread faulted on one before any handler ran: the child
//! hung in `pthread_create` for ever. So an allocation whose caller is the
//! loader goes to glibc, as the runtime's own do (`free` and `realloc` tell
//! the heaps apart by address).
//!
//! The caller is the return address, which the entry points read before
//! anything else runs (`crate::malloc`); the loader is the object at
//! `AT_BASE`, the program interpreter. A program run without one
//! (static) never loads this library.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The loader's code: `[TEXT_LO, TEXT_HI)`, empty until [`find`].
static TEXT_LO: AtomicUsize = AtomicUsize::new(0);
static TEXT_HI: AtomicUsize = AtomicUsize::new(0);

/// Finds the loader's code. Call at start-up, before the program's
/// `malloc` is switched to the regions.
pub fn find() {
    if let Some((lo, hi)) = crate::sys::interpreter_text() {
        TEXT_LO.store(lo, Ordering::Relaxed);
        TEXT_HI.store(hi, Ordering::Release);
    }
}

/// Whether a call returning to `ret` was made by the loader.
#[inline]
pub fn called(ret: usize) -> bool {
    let hi = TEXT_HI.load(Ordering::Acquire);
    ret < hi && ret >= TEXT_LO.load(Ordering::Relaxed)
}
