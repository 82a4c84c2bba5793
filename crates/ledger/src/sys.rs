//! The only module of this crate that calls `libc`: the shared mapping of
//! the ledger, and what `/proc` says of a process.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// A shared read-write mapping of a whole file descriptor.
pub(crate) struct Shared {
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
}

// SAFETY: the mapping is plain shared memory; all access to it goes
// through atomics (table.rs), so it may be used from any thread.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

impl Shared {
    /// Maps `len` bytes of `fd` shared and read-write.
    pub(crate) fn map(fd: &OwnedFd, len: usize) -> io::Result<Shared> {
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
        Ok(Shared { ptr: p.cast(), len })
    }
}

impl Drop for Shared {
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
    Ok((OwnedFd::from(f), len))
}

/// What `/proc/PID/stat` says of a process: whether it still runs (not a
/// zombie) and when it started (clock ticks since boot), which tells a
/// process from a later one that got the same pid.
pub fn proc_identity(pid: u32) -> Option<(bool, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: the
    // fields after it start after the last ')'.
    let rest = &s[s.rfind(')')? + 2..];
    let mut f = rest.split(' ');
    let state = f.next()?;
    // Field 22 (starttime) is the 20th after the state (field 3).
    let start = f.nth(18)?.parse().ok()?;
    Some((!matches!(state, "Z" | "X" | "x"), start))
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
