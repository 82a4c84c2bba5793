//! The malloc family: the program's heap is mimalloc's once the runtime
//! runs, glibc's before, for the runtime's own threads and in a fork's
//! window. `free` tells the two apart by address.

use libc::{c_int, c_void, size_t};
use libmimalloc_sys as mi;
use std::sync::atomic::{AtomicUsize, Ordering};
use uzswap_region::{Pager, PAGE_SIZE};

use crate::alloc::{__libc_calloc, __libc_free, __libc_malloc, __libc_memalign, __libc_realloc};
use crate::state::{is_managed_ptr, managed};
use crate::sys;

/// Defines the C entry point `$name($($arg),*)` over `$body($($arg),*,
/// caller)`, where `caller` is the entry's return address (see
/// `crate::loader`). On x86-64 the entry is two instructions: the return
/// address at the top of the stack goes into the next argument register,
/// and a jump to the body, which returns to the entry's caller.
macro_rules! entry_with_caller {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $body:ident, $reg:literal) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[no_mangle]
        #[unsafe(naked)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            core::arch::naked_asm!(concat!("mov ", $reg, ", [rsp]"), "jmp {body}", body = sym $body)
        }
        $(#[$doc])*
        #[cfg(not(target_arch = "x86_64"))]
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
            // SAFETY: the caller has the duties of the C function.
            unsafe { $body($($arg),*, 0) }
        }
    };
}

/// Whether this call's block is the program's (mimalloc's): the runtime
/// runs and manages the calling thread, and the caller is not the loader.
fn for_program(caller: usize) -> bool {
    managed().is_some() && !crate::loader::called(caller)
}

entry_with_caller! {
    /// # Safety
    /// The C `malloc` contract.
    fn malloc(size: size_t) -> *mut c_void = malloc_from, "rsi"
}

/// `malloc` for a call that returns to `caller`.
unsafe extern "C" fn malloc_from(size: size_t, caller: usize) -> *mut c_void {
    // SAFETY: plain allocator calls.
    unsafe {
        if for_program(caller) {
            mi::mi_malloc(size)
        } else {
            __libc_malloc(size)
        }
    }
}

/// Blocks of `calloc` from this size on are zeroed by discarding their
/// whole pages (see [`calloc_from`]); smaller ones by `mi_calloc`.
const CALLOC_DISCARD_MIN: usize = 64 << 10;

entry_with_caller! {
    /// # Safety
    /// The C `calloc` contract (see `calloc_from`).
    fn calloc(n: size_t, size: size_t) -> *mut c_void = calloc_from, "rdx"
}

/// `calloc` for a call that returns to `caller`.
///
/// mimalloc writes zeros over a block whose memory it has used before,
/// and a program that uses only part of a large zeroed block (a hash
/// table, a bitmap) then holds every page of it. glibc gives such blocks
/// fresh mappings, whose untouched pages take no memory: `cc1` holds 27 MB
/// (a third) more under mimalloc's `calloc` on one unit of the build of
/// `uzswap-bench tree` (docs/BENCHMARKS.md). So
/// a large block's whole pages are discarded instead (`MADV_DONTNEED`: the
/// pager sees a remove event and maps zeros where the program touches
/// them), and only its partial first and last pages are written.
unsafe extern "C" fn calloc_from(n: size_t, size: size_t, caller: usize) -> *mut c_void {
    // SAFETY: plain allocator calls (both check n * size for overflow);
    // the block `mi_malloc` returned is ours to write and discard.
    unsafe {
        if !for_program(caller) {
            return __libc_calloc(n, size);
        }
        match n.checked_mul(size) {
            Some(len) if len >= CALLOC_DISCARD_MIN => {
                let p = mi::mi_malloc(len);
                if !p.is_null() {
                    zero_by_discard(p.cast(), len, managed().map(|rt| rt.space.pager()));
                }
                p
            }
            _ => mi::mi_calloc(n, size),
        }
    }
}

/// Zeros `len` bytes at `p`: the whole pages by discarding them, the rest
/// by writing (everything by writing if the discard fails). Whole pages
/// the pager holds as never touched (fresh memory) already read as zeros:
/// then nothing is discarded, which spares a remove event's round trip
/// through the pager's handler.
///
/// # Safety
/// `p..p + len` is a block of the managed heap that the caller owns.
unsafe fn zero_by_discard(p: *mut u8, len: usize, pager: Option<&Pager>) {
    let start = p as usize;
    let lo = start.next_multiple_of(PAGE_SIZE);
    let hi = (start + len) / PAGE_SIZE * PAGE_SIZE;
    let fresh = hi > lo && pager.is_some_and(|pg| pg.untouched(lo, hi - lo));
    // SAFETY: every range written lies in the caller's block.
    unsafe {
        if hi > lo && (fresh || sys::discard(lo, hi - lo).is_ok()) {
            std::ptr::write_bytes(p, 0, lo - start);
            std::ptr::write_bytes(hi as *mut u8, 0, start + len - hi);
        } else {
            std::ptr::write_bytes(p, 0, len);
        }
    }
}

/// # Safety
/// The C `free` contract.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    // SAFETY: a pointer inside the reservation can only be mimalloc's; any
    // other came from glibc (before start-up, or from a runtime thread).
    unsafe {
        if is_managed_ptr(p) {
            mi::mi_free(p)
        } else {
            __libc_free(p)
        }
    }
}

/// # Safety
/// The C `cfree` contract (an old alias of free).
#[no_mangle]
pub unsafe extern "C" fn cfree(p: *mut c_void) {
    // SAFETY: as free.
    unsafe { free(p) }
}

/// glibc's `malloc_usable_size` (found past this library).
fn libc_usable_size(p: *mut c_void) -> usize {
    type F = unsafe extern "C" fn(*mut c_void) -> size_t;
    /// The symbol's address; 0 before the first look, `usize::MAX` if
    /// there is none. An atomic, not a `OnceLock`: a fork while another
    /// thread ran the look would leave a once taken in the child, and the
    /// child's first `realloc` of a glibc block would wait on it for ever.
    /// Two threads may both look; they find the same address.
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let mut f = REAL.load(Ordering::Relaxed);
    if f == 0 {
        f = sys::next_symbol(c"malloc_usable_size").unwrap_or(usize::MAX);
        REAL.store(f, Ordering::Relaxed);
    }
    if f == usize::MAX {
        return 0;
    }
    // SAFETY: the symbol is glibc's malloc_usable_size, of this type.
    unsafe { std::mem::transmute::<usize, F>(f)(p) }
}

entry_with_caller! {
    /// # Safety
    /// The C `realloc` contract.
    fn realloc(p: *mut c_void, size: size_t) -> *mut c_void = realloc_from, "rdx"
}

/// `realloc` for a call that returns to `caller`.
unsafe extern "C" fn realloc_from(p: *mut c_void, size: size_t, caller: usize) -> *mut c_void {
    // SAFETY: the pointer's owner is told apart by address as in free; a
    // glibc block reallocated for the program moves into the managed heap
    // (copying the bytes glibc says it holds).
    unsafe {
        if p.is_null() {
            return malloc_from(size, caller);
        }
        if is_managed_ptr(p) {
            return mi::mi_realloc(p, size);
        }
        if !for_program(caller) {
            return __libc_realloc(p, size);
        }
        if size == 0 {
            __libc_free(p);
            return std::ptr::null_mut();
        }
        let n = mi::mi_malloc(size);
        if !n.is_null() {
            std::ptr::copy_nonoverlapping(
                p as *const u8,
                n as *mut u8,
                libc_usable_size(p).min(size),
            );
            __libc_free(p);
        }
        n
    }
}

/// # Safety
/// The C `reallocarray` contract.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: as realloc.
        Some(total) => unsafe { realloc(p, total) },
        None => {
            sys::set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// Aligned allocation for the managed or the glibc heap.
unsafe fn aligned(align: usize, size: usize) -> *mut c_void {
    // SAFETY: plain allocator calls; align is a power of two (checked by
    // the callers).
    unsafe {
        if managed().is_some() {
            mi::mi_malloc_aligned(size, align)
        } else {
            __libc_memalign(align, size)
        }
    }
}

/// # Safety
/// The C `posix_memalign` contract.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    align: size_t,
    size: size_t,
) -> c_int {
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<*mut c_void>()) {
        return libc::EINVAL;
    }
    // SAFETY: as aligned; `out` is the caller's result slot.
    unsafe {
        let p = aligned(align, size);
        if p.is_null() {
            return libc::ENOMEM;
        }
        *out = p;
    }
    0
}

/// # Safety
/// The C `aligned_alloc` contract.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        sys::set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: as aligned.
    unsafe { aligned(align, size) }
}

/// # Safety
/// The C `memalign` contract.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: as aligned_alloc.
    unsafe { aligned_alloc(align, size) }
}

/// # Safety
/// The C `valloc` contract.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    // SAFETY: as aligned.
    unsafe { aligned(PAGE_SIZE, size) }
}

/// # Safety
/// The C `pvalloc` contract.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    let Some(size) = size
        .checked_add(PAGE_SIZE - 1)
        .map(|s| s & !(PAGE_SIZE - 1))
    else {
        sys::set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    // SAFETY: as aligned.
    unsafe { aligned(PAGE_SIZE, size.max(PAGE_SIZE)) }
}

/// # Safety
/// The C `malloc_usable_size` contract.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> size_t {
    if p.is_null() {
        return 0;
    }
    if is_managed_ptr(p) {
        // SAFETY: a live mimalloc block.
        unsafe { mi::mi_usable_size(p) }
    } else {
        libc_usable_size(p)
    }
}
