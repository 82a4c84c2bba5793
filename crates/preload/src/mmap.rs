//! The mmap family: anonymous private mappings of the managed kind are
//! carved out of the reservation ([`crate::space::Space`]); every other
//! mapping goes to the kernel unchanged.

use libc::{c_int, c_void, size_t};

use crate::state::{managed, runtime};
use crate::sys;

/// Whether a mapping request is one the space serves.
fn is_managed_mapping(prot: c_int, flags: c_int) -> bool {
    let private_anon =
        flags & libc::MAP_TYPE == libc::MAP_PRIVATE && flags & libc::MAP_ANONYMOUS != 0;
    let unusual = libc::MAP_HUGETLB | libc::MAP_GROWSDOWN | libc::MAP_STACK | libc::MAP_32BIT;
    private_anon && flags & unusual == 0 && prot & !(libc::PROT_READ | libc::PROT_WRITE) == 0
}

/// # Safety
/// The C `mmap` contract.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    // SAFETY: forwarded to the kernel, or served from our reservation.
    unsafe {
        let Some(rt) = managed() else {
            return sys::mmap(addr, len, prot, flags, fd, off);
        };
        if flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0 {
            if !rt.space.overlaps(addr as usize, len) {
                return sys::mmap(addr, len, prot, flags, fd, off);
            }
            if flags & libc::MAP_FIXED == 0 {
                // NOREPLACE over our reservation: it is occupied.
                sys::set_errno(libc::EEXIST);
                return libc::MAP_FAILED;
            }
            if is_managed_mapping(prot, flags) {
                // A heap committed or uncommitted inside its own
                // reservation (the JVM, Go): kept managed.
                match rt.space.replace(addr as usize, len, prot) {
                    Ok(true) => return addr,
                    Ok(false) => {}
                    Err(e) => {
                        sys::set_errno(e);
                        return libc::MAP_FAILED;
                    }
                }
            }
            let p = sys::mmap(addr, len, prot, flags, fd, off);
            if p != libc::MAP_FAILED {
                rt.space.retire(addr as usize, len);
            }
            return p;
        }
        if !is_managed_mapping(prot, flags) {
            return sys::mmap(addr, len, prot, flags, fd, off);
        }
        match rt.space.map(len, prot) {
            Ok(p) => p as *mut c_void,
            Err(e) => {
                sys::set_errno(e);
                libc::MAP_FAILED
            }
        }
    }
}

/// # Safety
/// The C `mmap64` contract (the same call on 64-bit systems).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    // SAFETY: as mmap.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// # Safety
/// The C `munmap` contract.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    // SAFETY: forwarded to the kernel, or a range of our reservation.
    unsafe {
        let Some(rt) = runtime() else {
            return sys::munmap(addr, len);
        };
        if !rt.space.overlaps(addr as usize, len) {
            return sys::munmap(addr, len);
        }
        match rt.space.unmap(addr as usize, len) {
            Ok(()) => 0,
            Err(e) => {
                sys::set_errno(e);
                -1
            }
        }
    }
}

/// # Safety
/// The C `mremap` contract. C declares it variadic (the fifth argument is
/// read only with `MREMAP_FIXED`); on x86-64 and AArch64 Linux a variadic
/// caller passes it in the same register this definition reads.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // SAFETY: forwarded to the kernel, or a range of our reservation.
    unsafe {
        let Some(rt) = runtime() else {
            return sys::mremap(old, old_len, new_len, flags, new_addr);
        };
        let moves_to = flags & libc::MREMAP_FIXED != 0;
        let touches_new = moves_to && rt.space.overlaps(new_addr as usize, new_len);
        if !rt.space.overlaps(old as usize, old_len.max(1)) && !touches_new {
            return sys::mremap(old, old_len, new_len, flags, new_addr);
        }
        if moves_to || flags & libc::MREMAP_DONTUNMAP != 0 {
            // Not supported on managed memory: refuse rather than move
            // pages the pager tracks behind its back.
            sys::set_errno(libc::EINVAL);
            return libc::MAP_FAILED;
        }
        match rt.space.remap(
            old as usize,
            old_len,
            new_len,
            flags & libc::MREMAP_MAYMOVE != 0,
        ) {
            Ok(p) => p as *mut c_void,
            Err(e) => {
                sys::set_errno(e);
                libc::MAP_FAILED
            }
        }
    }
}

/// # Safety
/// The C `madvise` contract.
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    // MADV_FREE lets the kernel drop pages later, without an event the
    // pager could see; on managed memory it becomes MADV_DONTNEED, which
    // the program cannot tell apart (freed pages may read as zeros).
    let advice = match runtime() {
        Some(rt) if advice == libc::MADV_FREE && rt.space.overlaps(addr as usize, len) => {
            libc::MADV_DONTNEED
        }
        _ => advice,
    };
    // SAFETY: forwarded to the kernel.
    unsafe { sys::madvise(addr, len, advice) }
}
