//! In-thread faults: installing the SIGBUS handler, decoding what the
//! kernel tells it, chaining to the previous disposition, and the
//! async-signal-safe calls the handler makes.

use std::io;

/// What a SIGBUS handler receives: `(signal, siginfo, ucontext)`.
pub type SigHandler = extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void);

/// The disposition of SIGBUS before [`install_sigbus`], to chain to.
pub struct OldAction(libc::sigaction);

/// Installs `handler` for SIGBUS (`SA_SIGINFO`, not `SA_ONSTACK`: it runs
/// on the faulting thread's own stack, which a region fault leaves intact,
/// and not on the small alternate stack Rust's runtime sets up for stack
/// overflows, which a load from the store could overflow). Returns the
/// previous disposition.
pub fn install_sigbus(handler: SigHandler) -> io::Result<OldAction> {
    // SAFETY: an all-zero sigaction is valid (empty mask, no flags).
    let mut new: libc::sigaction = unsafe { std::mem::zeroed() };
    new.sa_sigaction = handler as usize;
    new.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
    // SAFETY: `new.sa_mask` is a valid sigset to initialise.
    unsafe { libc::sigemptyset(&mut new.sa_mask) };
    // SAFETY: as above.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid sigaction structs for the call.
    if unsafe { libc::sigaction(libc::SIGBUS, &new, &mut old) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(OldAction(old))
}

/// What a SIGBUS says about the fault behind it: its address, whether it
/// is the kind a userfaultfd in SIGBUS mode raises (`BUS_ADRERR`; a poison
/// marker raises `BUS_MCEERR_AR`, which must kill), and on x86-64 the page
/// fault's error code (present page: a write-protect fault; write access).
#[derive(Clone, Copy, Debug)]
pub struct BusFault {
    /// The faulting address.
    pub addr: usize,
    /// `si_code == BUS_ADRERR`.
    pub adrerr: bool,
    /// The page was present (a protection fault, not a missing page).
    pub present: bool,
    /// The access was a write.
    pub write: bool,
}

/// Decodes a SIGBUS's `siginfo` and `ucontext`.
///
/// # Safety
/// `info` and `ctx` must be the pointers the kernel passed to a
/// `SA_SIGINFO` handler.
pub unsafe fn bus_fault(info: *const libc::siginfo_t, ctx: *const libc::c_void) -> BusFault {
    /// `BUS_ADRERR` (asm-generic/siginfo.h).
    const BUS_ADRERR: i32 = 2;
    // SAFETY: the kernel's siginfo, valid for the handler's duration; for
    // SIGBUS `si_addr` is the member of the union that is set.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the kernel's ucontext for this signal (x86-64 layout).
    let err =
        unsafe { (*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs[libc::REG_ERR as usize] };
    // Elsewhere the error code is not at hand: the pager refuses the mode
    // there (`PagerError::InThreadUnsupported`).
    #[cfg(not(target_arch = "x86_64"))]
    let err = {
        let _ = ctx;
        0
    };
    BusFault {
        addr,
        adrerr: code == BUS_ADRERR,
        present: err & 1 != 0,
        write: err & 2 != 0,
    }
}

/// Hands a signal that is not ours to the disposition `old`: its handler,
/// or for the default action, the default disposition restored and the
/// signal raised again (delivered when our handler returns: the process
/// dies as it would have without us). Async-signal-safe.
///
/// # Safety
/// The arguments must be those of the running `SA_SIGINFO` handler.
pub unsafe fn chain_signal(
    old: &OldAction,
    sig: i32,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    let a = &old.0;
    match a.sa_sigaction {
        libc::SIG_IGN => {}
        libc::SIG_DFL => {
            // SAFETY: signal(2) and raise(3) are async-signal-safe; the
            // signal is blocked until this handler returns.
            unsafe {
                libc::signal(sig, libc::SIG_DFL);
                libc::raise(sig);
            }
        }
        f if a.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: an SA_SIGINFO handler installed by someone else,
            // called as the kernel would have.
            let f: SigHandler = unsafe { std::mem::transmute::<usize, SigHandler>(f) };
            f(sig, info, ctx);
        }
        f => {
            // SAFETY: a plain handler installed by someone else.
            let f: extern "C" fn(i32) =
                unsafe { std::mem::transmute::<usize, extern "C" fn(i32)>(f) };
            f(sig);
        }
    }
}

/// The calling thread's `errno` (a signal handler saves and restores it).
pub fn errno_value() -> i32 {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's `errno`.
pub fn set_errno(v: i32) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = v };
}

/// `sched_yield(2)`, async-signal-safe (`std::thread::yield_now` is the
/// same call, but its safety in a handler is not documented).
pub fn yield_cpu() {
    // SAFETY: no arguments, no memory.
    unsafe { libc::sched_yield() };
}

/// A write access to the byte at `addr` from user mode that changes
/// nothing (`lock or byte [addr], 0`): it faults as a write would (a
/// missing page, write protection) and leaves the byte as it is even if
/// another thread writes it at the same moment.
pub fn touch_for_write(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: callers pass an address inside a live region mapping; the
    // locked read-modify-write of 0 leaves the byte's value unchanged
    // whatever other threads do.
    unsafe {
        std::arch::asm!("lock or byte ptr [{0}], 0", in(reg) addr, options(nostack));
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}
