//! `sched_getaffinity`: a pinned thread is told its affinity from before
//! co-scheduling pinned it.

use libc::{c_int, size_t};

use crate::{cosched, sys};

/// # Safety
/// The C `sched_getaffinity` contract. While co-scheduling pins the main
/// thread, it answers that thread's affinity from before the pin
/// (cosched.rs); otherwise the kernel's, as libc's does.
#[no_mangle]
pub unsafe extern "C" fn sched_getaffinity(
    pid: libc::pid_t,
    size: size_t,
    mask: *mut libc::cpu_set_t,
) -> c_int {
    if mask.is_null() {
        sys::set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller gave `size` writable bytes at `mask`.
    let buf = unsafe { std::slice::from_raw_parts_mut(mask.cast::<u8>(), size) };
    let copied = match cosched::answer_for(pid) {
        Some(set) => {
            let bytes = set.as_bytes();
            let n = size.min(bytes.len());
            if bytes[n..].iter().any(|&b| b != 0) {
                // The kernel's answer to a mask too small for its CPUs.
                sys::set_errno(libc::EINVAL);
                return -1;
            }
            buf[..n].copy_from_slice(&bytes[..n]);
            n
        }
        None => match uzswap_os::sched::affinity_into(pid, buf) {
            Ok(n) => n,
            Err(e) => {
                sys::set_errno(e.raw_os_error().unwrap_or(libc::EINVAL));
                return -1;
            }
        },
    };
    // As libc's: the bytes past what was written are cleared.
    buf[copied..].fill(0);
    0
}
