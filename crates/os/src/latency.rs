//! The CPU latency request (PM QoS) that a process's fault handlers hold
//! while faults arrive.
//!
//! A fault's round trip to a handler thread that sleeps wakes two CPUs: the
//! handler's, to serve it, and the faulting thread's, when it is served.
//! Where idle CPUs halt at once (a VM with `cpuidle_haltpoll.force=1
//! haltpoll.guest_halt_poll_ns=0`, as these machines boot), each wake is an
//! interrupt into a halted vCPU, 10-30 µs. A request of 0 µs on
//! `/dev/cpu_dma_latency` keeps every idle CPU in its polling state while it
//! is held: a wake is then a store the other CPU sees at once. It costs
//! the host CPU time on idle vCPUs, so it is held only while faults come:
//! from the first fault of a burst until the handlers have seen none for
//! [`RELEASE_AFTER`] (`uzswap-bench usemem` measures both sides).
//!
//! The kernel keeps the request while the file is open with it written, and
//! drops it when the file is closed: a process that dies, however, releases
//! it. The device is root's (mode 0600); where it cannot be opened nothing
//! is held and [`LatencyStats::state`] says so.
//!
//! One request per process, shared by every handler of every pager in it.
//! A forked child gets a request of its own ([`forget_after_fork`]): the
//! descriptor it inherits names its parent's request.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::time::Instant;

/// How long the handlers may see no fault before the request is released.
pub const RELEASE_AFTER: std::time::Duration = std::time::Duration::from_millis(5);

/// The request when nothing is held: the kernel's default, no constraint
/// (`PM_QOS_CPU_LATENCY_DEFAULT_VALUE`, 2000 s in µs).
const NO_CONSTRAINT: i32 = 2_000_000_000;

/// The descriptor: `NOT_OPENED` before the first hold, `UNAVAILABLE` if it
/// cannot be opened, `DISABLED` if switched off.
static FD: AtomicI32 = AtomicI32::new(NOT_OPENED);
const NOT_OPENED: i32 = -1;
const UNAVAILABLE: i32 = -2;
const DISABLED: i32 = -3;
/// Whether the request is held (0 µs written), as the last transition set
/// it; the file follows it (see [`apply`]).
static HELD: AtomicBool = AtomicBool::new(false);
/// When the current hold began, in ns since [`epoch`].
static SINCE_NS: AtomicU64 = AtomicU64::new(0);
static HELD_NS: AtomicU64 = AtomicU64::new(0);
static HOLDS: AtomicU64 = AtomicU64::new(0);
/// Messages (faults and events) read while the request was held.
static READ_HELD: AtomicU64 = AtomicU64::new(0);

/// What the request did in this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyStats {
    /// `"held"` or `"released"` when the device is open, `"unavailable"`
    /// where it cannot be opened (not root), `"off"` when switched off,
    /// `"unused"` before the first fault.
    pub state: &'static str,
    /// Bursts the request was held for.
    pub holds: u64,
    /// Time it was held, in all (the current hold included).
    pub held_ns: u64,
    /// Messages (faults and events) the handlers read while it was held.
    pub read_held: u64,
}

/// A handler read `n` messages: the request is held (see [`hold`]) and
/// they are counted as read under it.
pub fn read(n: usize) {
    hold();
    if HELD.load(Ordering::Relaxed) {
        READ_HELD.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Holds the request (opening the device at the first call). Cheap while
/// held: one atomic load.
pub fn hold() {
    if HELD.load(Ordering::Acquire) {
        return;
    }
    let fd = fd();
    if fd < 0 {
        return;
    }
    if HELD
        .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        SINCE_NS.store(now_ns(), Ordering::Relaxed);
        HOLDS.fetch_add(1, Ordering::Relaxed);
        apply(fd);
    }
}

/// Releases the request if it is held.
pub fn release() {
    let fd = FD.load(Ordering::Acquire);
    if fd < 0 {
        return;
    }
    if HELD
        .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        let since = SINCE_NS.load(Ordering::Relaxed);
        HELD_NS.fetch_add(now_ns().saturating_sub(since), Ordering::Relaxed);
        apply(fd);
    }
}

/// Never holds the request again in this process (and releases it).
pub fn disable() {
    release();
    let fd = FD.swap(DISABLED, Ordering::AcqRel);
    if fd >= 0 {
        crate::fdguard::unmark(fd);
        // SAFETY: our own descriptor, no longer published in FD.
        unsafe { libc::close(fd) };
    }
}

/// What the request did.
pub fn stats() -> LatencyStats {
    let fd = FD.load(Ordering::Acquire);
    let held = HELD.load(Ordering::Acquire);
    let mut held_ns = HELD_NS.load(Ordering::Relaxed);
    if held {
        held_ns += now_ns().saturating_sub(SINCE_NS.load(Ordering::Relaxed));
    }
    LatencyStats {
        state: match fd {
            NOT_OPENED => "unused",
            UNAVAILABLE => "unavailable",
            DISABLED => "off",
            _ if held => "held",
            _ => "released",
        },
        holds: HOLDS.load(Ordering::Relaxed),
        held_ns,
        read_held: READ_HELD.load(Ordering::Relaxed),
    }
}

/// Opens the device now (where it can be): call where the host makes its
/// other descriptors (at start-up, in a fork's child hook), so that the
/// descriptor's number is not taken later among the program's own.
pub fn open() {
    fd();
}

/// In a forked child (its only thread): the inherited descriptor names the
/// parent's request. The child's copy is closed (the parent's request
/// stays) and the child opens its own.
pub fn forget_after_fork() {
    let fd = FD.load(Ordering::Relaxed);
    HELD.store(false, Ordering::Relaxed);
    if fd >= 0 {
        crate::fdguard::unmark(fd);
        // SAFETY: the child's copy of our descriptor.
        unsafe { libc::close(fd) };
        FD.store(NOT_OPENED, Ordering::Relaxed);
        open();
    }
}

/// The device's descriptor, opened at the first call (negative if none).
fn fd() -> i32 {
    let fd = FD.load(Ordering::Acquire);
    if fd != NOT_OPENED {
        return fd;
    }
    // SAFETY: a NUL-terminated path; the descriptor is ours.
    let new = unsafe {
        libc::open(
            c"/dev/cpu_dma_latency".as_ptr(),
            libc::O_WRONLY | libc::O_CLOEXEC,
        )
    };
    let new = if new < 0 {
        UNAVAILABLE
    } else {
        crate::fdguard::lift_raw(new)
    };
    match FD.compare_exchange(NOT_OPENED, new, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            if new >= 0 {
                crate::fdguard::mark(new);
            }
            new
        }
        Err(other) => {
            // Another thread opened it first: ours goes.
            if new >= 0 {
                // SAFETY: our own descriptor, never published.
                unsafe { libc::close(new) };
            }
            other
        }
    }
}

/// Writes what [`HELD`] says to the device, until a write matches it: a
/// hold and a release that race may write in either order, and the last
/// to look writes again if it lost.
fn apply(fd: i32) {
    loop {
        let want = HELD.load(Ordering::Acquire);
        let v: i32 = if want { 0 } else { NO_CONSTRAINT };
        // SAFETY: four bytes of a local to our descriptor. A failed write
        // leaves the request as it was: only speed depends on it.
        unsafe { libc::write(fd, (&v as *const i32).cast(), 4) };
        if HELD.load(Ordering::Acquire) == want {
            return;
        }
    }
}

fn now_ns() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Usage counts of the CPU idle states with an exit latency above 0 µs
    /// (everything but polling), summed over the CPUs.
    fn deep_idle_entries() -> Option<u64> {
        let mut total = 0;
        let mut any = false;
        for cpu in std::fs::read_dir("/sys/devices/system/cpu").ok()?.flatten() {
            let Ok(states) = std::fs::read_dir(cpu.path().join("cpuidle")) else {
                continue;
            };
            for st in states.flatten() {
                let read = |f: &str| std::fs::read_to_string(st.path().join(f)).unwrap_or_default();
                if read("latency").trim().parse::<u64>().unwrap_or(0) > 0 {
                    total += read("usage").trim().parse::<u64>().unwrap_or(0);
                    any = true;
                }
            }
        }
        any.then_some(total)
    }

    /// While held no CPU enters an idle state deeper than polling; released
    /// (and the file closed at the end), the counts say it was held for
    /// one burst.
    #[test]
    fn while_held_no_cpu_halts() {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        hold();
        let st = stats();
        if !root {
            assert_eq!(st.state, "unavailable");
            return;
        }
        assert_eq!(st.state, "held");
        if let Some(before) = deep_idle_entries() {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let after = deep_idle_entries().unwrap();
            assert_eq!(after, before, "a CPU halted while the request was held");
        }
        hold(); // held already: no second burst
        release();
        let st = stats();
        assert_eq!(st.state, "released");
        assert_eq!(st.holds, 1);
        assert!(st.held_ns > 150_000_000, "{st:?}");
        disable();
        assert_eq!(stats().state, "off");
        hold();
        assert_eq!(stats().state, "off");
    }
}
