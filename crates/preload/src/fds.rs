//! `close`, `close_range` and `closefrom`: the runtime's guarded
//! descriptors (its userfaultfds and eventfds, `uzswap_os::fdguard`) stay
//! open whatever the program closes. A managed child between `fork()` and
//! `exec()` that closes every descriptor but its own (Python's
//! `subprocess` with `preexec_fn`) would lose its pager's descriptors: its
//! handler thread would die on EBADF and the child with it (and, were a
//! fault to come first, an evicted page would read as zeros). Each call
//! succeeds as if the guarded descriptors had been closed too; they are
//! close-on-exec, so an `exec` still ends them.

use libc::{c_int, c_uint};
use uzswap_os::fdguard;

use crate::sys;

/// `close_range(2)`'s flag that marks close-on-exec instead of closing.
const CLOSE_RANGE_CLOEXEC: c_uint = 1 << 2;

/// # Safety
/// The C `close` contract.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if fdguard::is_guarded(fd) {
        return 0;
    }
    // SAFETY: forwarded to the kernel.
    unsafe { sys::close(fd) }
}

/// Closes `first..=last` but the guarded descriptors, in the pieces
/// between them.
///
/// # Safety
/// As `close_range`: nothing may use the descriptors closed.
unsafe fn close_range_unguarded(first: c_uint, last: c_uint, flags: c_uint) -> c_int {
    let raw = |lo: c_uint, hi: c_uint| {
        // SAFETY: forwarded to the kernel.
        unsafe { sys::close_range(lo, hi, flags) }
    };
    if flags & CLOSE_RANGE_CLOEXEC != 0 || first > last {
        return raw(first, last);
    }
    let mut lo = first;
    for fd in fdguard::guarded_in(first, last) {
        if fd > lo {
            let r = raw(lo, fd - 1);
            if r != 0 {
                return r;
            }
        }
        // Guarded descriptors are below `GUARDED_MAX`: no overflow.
        lo = fd + 1;
    }
    if lo > last {
        return 0;
    }
    raw(lo, last)
}

/// # Safety
/// The C `close_range` contract.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    // SAFETY: forwarded.
    unsafe { close_range_unguarded(first, last, flags as c_uint) }
}

/// # Safety
/// The C `closefrom` contract.
#[no_mangle]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    let Ok(first) = c_uint::try_from(lowfd) else {
        return;
    };
    // SAFETY: forwarded.
    if unsafe { close_range_unguarded(first, c_uint::MAX, 0) } != 0 {
        // A kernel without close_range: one at a time, as glibc falls
        // back to, up to the descriptor limit.
        let max = sys::descriptor_table_size();
        for fd in lowfd..max {
            // SAFETY: the interposed close above.
            unsafe { close(fd) };
        }
    }
}
