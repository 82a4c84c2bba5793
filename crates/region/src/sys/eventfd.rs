//! The eventfd that wakes a handler thread, and polling a handler's
//! descriptors.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use uzswap_os::fdguard::GuardedFd;

use super::replace_fd;

/// Waits until `fd` or `wake_fd` is readable, at most `timeout_ms`.
pub fn poll2(fd: RawFd, wake_fd: RawFd, timeout_ms: i32) {
    let mut fds = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: wake_fd,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // SAFETY: `fds` is a valid array of two pollfd for the call's duration.
    unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
}

/// Whether `fd` has something to read now (a poll that does not wait).
pub fn readable(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is a valid pollfd for the call's duration.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r > 0 && p.revents & libc::POLLIN != 0
}

/// An eventfd used to wake the handler thread for shutdown.
#[derive(Debug)]
pub struct EventFd(GuardedFd);

impl EventFd {
    /// Creates a non-blocking eventfd.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes an initial value and flags; returns a new fd.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor owned by no one else.
        Ok(EventFd(GuardedFd::new(unsafe { OwnedFd::from_raw_fd(fd) })))
    }

    /// Makes the eventfd readable.
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to an eventfd.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Resets the eventfd to not readable.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64; non-blocking, so an
        // unsignalled eventfd just returns EAGAIN.
        unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }

    /// The descriptor, for poll.
    pub fn raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// In a forked child: a fresh eventfd in place of the one shared with
    /// the parent (whose threads would otherwise take the child's signals).
    pub fn renew(&self) -> io::Result<()> {
        let fresh = EventFd::new()?;
        replace_fd(&fresh.0, &self.0)
    }
}
