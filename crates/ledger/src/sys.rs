//! The only module of this crate that calls `libc`: the shared mapping of
//! the ledger, what `/proc` says of a process, pidfds that tell when one
//! ends, whether two processes share an address space, and the tests'
//! signals and clones.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// A shared read-write mapping of a whole file descriptor.
pub(crate) struct Mapping {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

// SAFETY: the mapping is plain shared memory; all access to it goes
// through atomics (table.rs), so it may be used from any thread.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared and read-write.
    pub(crate) fn map(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping chosen by the kernel; fd is open.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p.cast(), len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, not used after this.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A new anonymous memory file of `len` bytes. Close-on-exec: the
/// processes of the tree open it by its path `/proc/PID/fd/N` (which works
/// whatever descriptors a program between them closed), so no program
/// inherits a descriptor it did not ask for.
pub(crate) fn memfd(len: usize) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name and a valid flag.
    let fd = unsafe { libc::memfd_create(c"uzswap-ledger".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a descriptor we own from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fd is open; len fits in off_t (the table is small).
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Opens an existing ledger read-write (close-on-exec: a member's
/// children find the ledger by its path, not by this descriptor).
pub(crate) fn open(path: &Path) -> io::Result<(OwnedFd, usize)> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let len = f.metadata()?.len() as usize;
    // High in the table (`uzswap_os::fdguard::lift`): a member is a
    // program's process, whose own numbers it must not take.
    Ok((uzswap_os::fdguard::lift(OwnedFd::from(f)), len))
}

/// What `/proc/PID/stat` says of a process: whether it still runs (not a
/// zombie) and when it started (clock ticks since boot), which tells a
/// process from a later one that got the same pid.
pub fn proc_identity(pid: u32) -> Option<(bool, u64)> {
    proc_stat(pid).map(|s| (s.alive, s.start))
}

/// The fields of `/proc/PID/stat` this crate reads.
pub(crate) struct ProcStat {
    /// Not a zombie.
    pub alive: bool,
    /// Its parent's pid.
    pub parent: u32,
    /// When it started, clock ticks since boot.
    pub start: u64,
}

pub(crate) fn proc_stat(pid: u32) -> Option<ProcStat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: the
    // fields after it start after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let mut f = rest.split(' ');
    let state = f.next()?;
    let parent = f.next()?.parse().ok()?;
    // Field 22 (starttime) is the 18th after the parent (field 4).
    let start = f.nth(17)?.parse().ok()?;
    Some(ProcStat {
        alive: !matches!(state, "Z" | "X" | "x"),
        parent,
        start,
    })
}

/// A pidfd for process `pid` (None if it is gone, or none can be opened:
/// no descriptor left, or a kernel without pidfds).
pub fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new
    // descriptor (or -1); nothing of ours is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, 0 as libc::c_long) };
    // SAFETY: a descriptor just returned to us, owned by nobody else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Which of the processes behind `fds` have ended (exited, zombies
/// included): one `poll` for all of them, waiting for none. A pidfd polls
/// readable once its process has ended.
pub fn ended(fds: &[&OwnedFd]) -> Vec<bool> {
    let mut polled: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `polled` is a live array of `polled.len()` entries; timeout 0.
    let n = unsafe { libc::poll(polled.as_mut_ptr(), polled.len() as libc::nfds_t, 0) };
    if n < 0 {
        // Only EINTR or ENOMEM: nothing is known to have ended.
        return vec![false; fds.len()];
    }
    polled.iter().map(|p| p.revents != 0).collect()
}

/// The calling process's start time, as [`proc_identity`] gives it.
pub fn self_start_time() -> u64 {
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    proc_identity(pid).map_or(0, |(_, t)| t)
}

/// The calling process's pid.
pub fn getpid() -> u32 {
    // SAFETY: getpid cannot fail.
    unsafe { libc::getpid() as u32 }
}

/// Whether `a` and `b` share one address space (`kcmp(2)`, `KCMP_VM`); no
/// if the kernel cannot say (either is gone, or not ours to inspect).
pub fn same_address_space(a: u32, b: u32) -> bool {
    const KCMP_VM: libc::c_long = 1;
    // SAFETY: kcmp only compares kernel objects of the two processes; no
    // memory of ours is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            libc::c_long::from(a as i32),
            libc::c_long::from(b as i32),
            KCMP_VM,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    };
    r == 0
}

/// Sends `SIGKILL` to `pid`, a process of a test's own.
#[cfg(test)]
pub(crate) fn kill(pid: u32) {
    // SAFETY: kill only signals; the caller names a process it started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// Kills and reaps `pid`, a child of this process.
#[cfg(test)]
pub(crate) fn kill_and_reap(pid: u32) {
    kill(pid);
    // SAFETY: reaps a child of ours; no status is written.
    unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
}

/// Starts a child in this process's address space (`clone(CLONE_VM)`,
/// as a `vfork` child is until it execs) that only pauses, on `stack`,
/// until it is killed; returns its pid.
///
/// # Safety
/// `stack` outlives the child: the caller kills and reaps it
/// ([`kill_and_reap`]) before the stack goes.
#[cfg(test)]
pub(crate) unsafe fn clone_vm_pausing(stack: &mut [u8]) -> io::Result<u32> {
    extern "C" fn wait_forever(_: *mut libc::c_void) -> libc::c_int {
        loop {
            // SAFETY: pause takes nothing; the child only sleeps here
            // until it is killed.
            unsafe { libc::pause() };
        }
    }
    // SAFETY: the child runs `wait_forever` on `stack`, which outlives it
    // (the caller's duty), and touches nothing else.
    let child = unsafe {
        libc::clone(
            wait_forever,
            stack.as_mut_ptr().add(stack.len()).cast(),
            libc::CLONE_VM | libc::SIGCHLD,
            std::ptr::null_mut(),
        )
    };
    if child <= 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(child as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pidfd_polls_ended_once_its_process_exits_zombie_or_not() {
        let mut a = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep is on the machine");
        let mut b = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep is on the machine");
        let (fa, fb) = (pidfd_open(a.id()).unwrap(), pidfd_open(b.id()).unwrap());
        assert_eq!(ended(&[&fa, &fb]), [false, false]);
        // Killed and not yet waited for: a zombie has ended.
        // SAFETY: signals a child of this test.
        unsafe { libc::kill(b.id() as i32, libc::SIGKILL) };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while ended(&[&fa, &fb]) != [false, true] {
            assert!(std::time::Instant::now() < deadline, "never seen ended");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(proc_identity(b.id()).map(|(alive, _)| alive), Some(false));
        let _ = a.kill();
        let _ = a.wait();
        let _ = b.wait();
        assert_eq!(ended(&[&fa]), [true]);
        assert!(pidfd_open(u32::MAX >> 1).is_none());
    }
}
