//! The process and its threads: CPUs and scheduling, the process id, fork
//! hooks, ending a forked child that cannot go on.

use std::io;

/// The CPUs this thread may run on (its affinity mask), in order.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    Ok(uzswap_os::sched::affinity(0)?.cpus())
}

/// Binds the calling thread to `cpu` and gives it the `SCHED_IDLE` policy:
/// it then runs only when its CPU has nothing else to run, and any other
/// thread woken there preempts it at once.
pub fn pin_idle(cpu: usize) -> io::Result<()> {
    uzswap_os::sched::set_affinity(0, &uzswap_os::sched::CpuSet::one(cpu))?;
    uzswap_os::sched::set_idle(0, true)
}

/// This process's id.
pub fn getpid() -> i32 {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// Ends the process with `status` as `exit(3)` does: the atexit handlers
/// run, as the C library runs them when the last thread of a process
/// exits.
pub fn exit_process(status: i32) -> ! {
    // SAFETY: ends the process.
    unsafe { libc::exit(status) }
}

/// Says `msg` on stderr and ends the process with status 125 (no
/// destructors, no atexit handlers: for a forked child that cannot go on).
pub fn die(msg: &str) -> ! {
    uzswap_os::say(msg);
    // SAFETY: ends the process.
    unsafe { libc::_exit(125) }
}

/// Registers fork hooks (see `crate::fork`).
pub fn atfork(
    prepare: unsafe extern "C" fn(),
    parent: unsafe extern "C" fn(),
    child: unsafe extern "C" fn(),
) -> io::Result<()> {
    // SAFETY: the three hooks are `extern "C"` functions with no arguments
    // that live for the whole program (they are statics of this crate).
    let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    if r != 0 {
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok(())
}
