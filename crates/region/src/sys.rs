//! The OS boundary of the region crate: the only module that touches
//! userfaultfd, and the home of every other `libc` call of the crate.
//!
//! The ioctl numbers, structs and flag bits below are written down from the
//! kernel's UAPI header `linux/userfaultfd.h` (stable ABI). We do not use the
//! `userfaultfd` crate: it runs bindgen (needs libclang on the build machine)
//! and lacks `UFFD_FEATURE_WP_ASYNC`, `UFFDIO_MOVE` and `UFFDIO_POISON`.
//!
//! # Contract
//! - Addresses and lengths given to [`Uffd`] methods are page aligned and
//!   lie in ranges registered with that descriptor; the kernel checks this
//!   and answers `EINVAL`/`ENOENT` otherwise, so a wrong address is an error,
//!   never memory corruption.
//! - Every resolving ioctl wakes the threads blocked on the range unless a
//!   `DONTWAKE` flag is given (we never give it).
//! - `EAGAIN` from a resolving ioctl means a non-cooperative event (remove,
//!   unmap, remap, fork) is being delivered: nothing was done past
//!   [`UffdError::done`] bytes, and the call must be retried after the
//!   handler has *read* the pending event (reading completes the event).
//! - `EEXIST` from `UFFDIO_COPY`/`UFFDIO_ZEROPAGE` means a page is already
//!   mapped at the destination (another resolution won the race): the fault
//!   is resolved, but the caller's bytes were not installed there.
//! - `ENOENT` means the range is no longer registered (unmapped or
//!   unregistered meanwhile): the fault, if any, is gone with the mapping.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use uzswap_os::fdguard::GuardedFd;

pub use uzswap_os::{rss_bytes, PAGE_SIZE};

// ---- UAPI: linux/userfaultfd.h ------------------------------------------

const UFFD_API: u64 = 0xAA;
const UFFDIO: u64 = 0xAA;
const IOC_WRITE: u64 = 1;
const IOC_READ: u64 = 2;

/// `_IOC(dir, 0xAA, nr, size)` as encoded on x86, arm64 and riscv.
const fn ioc(dir: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}

const UFFDIO_REGISTER: u64 = ioc(IOC_READ | IOC_WRITE, 0x00, 32);
const UFFDIO_UNREGISTER: u64 = ioc(IOC_READ, 0x01, 16);
const UFFDIO_WAKE: u64 = ioc(IOC_READ, 0x02, 16);
const UFFDIO_COPY: u64 = ioc(IOC_READ | IOC_WRITE, 0x03, 40);
const UFFDIO_ZEROPAGE: u64 = ioc(IOC_READ | IOC_WRITE, 0x04, 32);
const UFFDIO_MOVE: u64 = ioc(IOC_READ | IOC_WRITE, 0x05, 40);
const UFFDIO_WRITEPROTECT: u64 = ioc(IOC_READ | IOC_WRITE, 0x06, 24);
const UFFDIO_POISON: u64 = ioc(IOC_READ | IOC_WRITE, 0x08, 32);
const UFFDIO_API: u64 = ioc(IOC_READ | IOC_WRITE, 0x3F, 24);
/// `USERFAULTFD_IOC_NEW`: `_IO(0xAA, 0x00)` on `/dev/userfaultfd`.
const USERFAULTFD_IOC_NEW: u64 = 0xAA << 8;

/// Feature bits of `uffdio_api.features`.
pub mod feature {
    /// Write-protect faults are reported (with `UFFD_PAGEFAULT_FLAG_WP`).
    pub const PAGEFAULT_FLAG_WP: u64 = 1 << 0;
    /// fork(2) hands the child's descriptor to the handler (CAP_SYS_PTRACE).
    pub const EVENT_FORK: u64 = 1 << 1;
    /// mremap(2) is reported as a remap event.
    pub const EVENT_REMAP: u64 = 1 << 2;
    /// madvise(MADV_DONTNEED/MADV_REMOVE) is reported as a remove event.
    pub const EVENT_REMOVE: u64 = 1 << 3;
    /// munmap(2) is reported as an unmap event.
    pub const EVENT_UNMAP: u64 = 1 << 6;
    /// Faults raise SIGBUS instead of reaching the handler.
    pub const SIGBUS: u64 = 1 << 7;
    /// Write protection resolved by the kernel itself (tracking only).
    pub const WP_ASYNC: u64 = 1 << 15;
    /// `UFFDIO_POISON` is available.
    pub const POISON: u64 = 1 << 14;
    /// `UFFDIO_MOVE` is available.
    pub const MOVE: u64 = 1 << 16;
}

/// Register modes.
const REGISTER_MODE_MISSING: u64 = 1 << 0;
const REGISTER_MODE_WP: u64 = 1 << 1;
/// `UFFDIO_COPY_MODE_WP`: map the copied pages write-protected.
const COPY_MODE_WP: u64 = 1 << 1;
/// `UFFDIO_WRITEPROTECT_MODE_WP`: set (1) or clear (0) protection.
const WRITEPROTECT_MODE_WP: u64 = 1 << 0;
/// `UFFDIO_COPY_MODE_DONTWAKE`, `UFFDIO_ZEROPAGE_MODE_DONTWAKE` and
/// `UFFDIO_POISON_MODE_DONTWAKE`: resolve without waking the waiters (the
/// caller wakes them later with `UFFDIO_WAKE`).
const MODE_DONTWAKE: u64 = 1 << 0;
/// `UFFDIO_WRITEPROTECT_MODE_DONTWAKE`.
const WRITEPROTECT_MODE_DONTWAKE: u64 = 1 << 1;

const EVENT_PAGEFAULT: u8 = 0x12;
const EVENT_FORK: u8 = 0x13;
const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;
const PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
const PAGEFAULT_FLAG_WP: u64 = 1 << 1;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    /// Out: bytes copied, or a negated errno.
    copy: i64,
}

#[repr(C)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

#[repr(C)]
struct UffdioMove {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}

#[repr(C)]
struct UffdioPoison {
    range: UffdioRange,
    mode: u64,
    updated: i64,
}

/// `struct uffd_msg`: 8 header bytes then a 24-byte union. The C struct is
/// `__packed`, but its fields are naturally aligned, so `repr(C)` matches.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct RawMsg {
    event: u8,
    _reserved1: u8,
    _reserved2: u16,
    _reserved3: u32,
    arg: [u64; 3],
}

const _: () = assert!(std::mem::size_of::<RawMsg>() == 32);
const _: () = assert!(std::mem::size_of::<UffdioCopy>() == 40);
const _: () = assert!(std::mem::size_of::<UffdioRegister>() == 32);

/// A decoded userfaultfd message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Msg {
    /// A thread faulted at `addr` (page aligned by us).
    Fault {
        /// Page-aligned faulting address.
        addr: usize,
        /// The access was a write.
        write: bool,
        /// A write hit a write-protected page (else: the page was missing).
        wp: bool,
    },
    /// A child was forked; `fd` is its descriptor (only with EVENT_FORK).
    Fork {
        /// The child's userfaultfd, now owned by the reader.
        fd: RawFd,
    },
    /// `[from, from+len)` moved to `[to, to+len)`.
    Remap {
        /// Old start.
        from: usize,
        /// New start.
        to: usize,
        /// Length in bytes.
        len: usize,
    },
    /// Pages of `[start, end)` are about to be discarded by madvise.
    Remove {
        /// Start address.
        start: usize,
        /// End address (exclusive).
        end: usize,
    },
    /// `[start, end)` is about to be unmapped.
    Unmap {
        /// Start address.
        start: usize,
        /// End address (exclusive).
        end: usize,
    },
    /// An event this crate does not know.
    Unknown(u8),
}

impl RawMsg {
    /// Decodes the message.
    pub fn decode(&self) -> Msg {
        let a = self.arg;
        match self.event {
            EVENT_PAGEFAULT => Msg::Fault {
                addr: (a[1] as usize) & !(PAGE_SIZE - 1),
                write: a[0] & PAGEFAULT_FLAG_WRITE != 0,
                wp: a[0] & PAGEFAULT_FLAG_WP != 0,
            },
            EVENT_FORK => Msg::Fork {
                fd: (a[0] & 0xffff_ffff) as u32 as RawFd,
            },
            EVENT_REMAP => Msg::Remap {
                from: a[0] as usize,
                to: a[1] as usize,
                len: a[2] as usize,
            },
            EVENT_REMOVE => Msg::Remove {
                start: a[0] as usize,
                end: a[1] as usize,
            },
            EVENT_UNMAP => Msg::Unmap {
                start: a[0] as usize,
                end: a[1] as usize,
            },
            e => Msg::Unknown(e),
        }
    }
}

// ---- errors ---------------------------------------------------------------

/// Why userfaultfd could not be set up. Each variant's text says what to
/// change.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Both ways to get a descriptor were refused.
    #[error(
        "userfaultfd is not permitted for this process: userfaultfd(2) failed \
         with {syscall} (with vm.unprivileged_userfaultfd=0 only processes with \
         CAP_SYS_PTRACE may handle kernel-mode faults) and /dev/userfaultfd \
         could not be opened ({dev}). Fix one of: `sysctl -w \
         vm.unprivileged_userfaultfd=1`; give this user read and write access to \
         /dev/userfaultfd (e.g. a udev rule or `setfacl -m u:$USER:rw \
         /dev/userfaultfd`); or run with CAP_SYS_PTRACE"
    )]
    NotPermitted {
        /// Error of the userfaultfd(2) syscall.
        syscall: io::Error,
        /// Error of opening or using /dev/userfaultfd.
        dev: io::Error,
    },
    /// The kernel has no userfaultfd.
    #[error(
        "userfaultfd is not supported by this kernel (ENOSYS); it needs a \
         kernel built with CONFIG_USERFAULTFD=y (Linux 5.7+ for write protection)"
    )]
    NotSupported,
    /// The API handshake failed or lacks features we need.
    #[error(
        "userfaultfd lacks features this crate needs (missing feature bits \
         {missing:#x}: write-protect faults and remove/unmap/remap events, \
         Linux 5.7+ on anonymous memory)"
    )]
    MissingFeatures {
        /// Feature bits requested but not offered.
        missing: u64,
    },
    /// Any other failure while opening or negotiating.
    #[error("userfaultfd setup failed: {0}")]
    Other(io::Error),
}

/// A failed resolving ioctl: the errno and the bytes done before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UffdError {
    /// `errno` of the failure (EEXIST, EAGAIN, ENOENT, ...).
    pub errno: i32,
    /// Bytes handled before the failure (multi-page operations).
    pub done: usize,
}

impl std::fmt::Display for UffdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} after {} bytes",
            io::Error::from_raw_os_error(self.errno),
            self.done
        )
    }
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

// ---- the descriptor -------------------------------------------------------

/// An open, negotiated userfaultfd.
#[derive(Debug)]
pub struct Uffd {
    /// Guarded: a program that closes descriptors it did not open (a
    /// child before `exec`, a daemon) must not close this one, or every
    /// evicted page would read as zeros (`uzswap_os::fdguard`).
    fd: GuardedFd,
    features: u64,
}

/// Features we cannot work without.
pub const REQUIRED_FEATURES: u64 = feature::PAGEFAULT_FLAG_WP
    | feature::EVENT_REMAP
    | feature::EVENT_REMOVE
    | feature::EVENT_UNMAP;

/// Opens a raw, not yet negotiated userfaultfd: the syscall first, then
/// `/dev/userfaultfd`. `inject` makes the syscall fail with that errno and
/// the device open fail with EACCES (a test hook: tests run as root).
fn open_raw(inject: Option<i32>) -> Result<OwnedFd, OpenError> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
    let sys_err = match inject {
        Some(e) => io::Error::from_raw_os_error(e),
        None => {
            // SAFETY: userfaultfd(2) takes one int of flags and returns a new
            // descriptor or -1; no memory is passed. We do not pass
            // UFFD_USER_MODE_ONLY: kernel-mode faults (read(2) into region
            // memory) must reach the handler too.
            let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
            if fd >= 0 {
                // SAFETY: the kernel just returned this descriptor to us and
                // nothing else owns it.
                return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
            }
            io::Error::last_os_error()
        }
    };
    if sys_err.raw_os_error() == Some(libc::ENOSYS) {
        return Err(OpenError::NotSupported);
    }
    let dev_err = match inject {
        Some(_) => io::Error::from_raw_os_error(libc::EACCES),
        None => match open_dev(flags) {
            Ok(fd) => return Ok(fd),
            Err(e) => e,
        },
    };
    match sys_err.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) => Err(OpenError::NotPermitted {
            syscall: sys_err,
            dev: dev_err,
        }),
        _ => Err(OpenError::Other(sys_err)),
    }
}

fn open_dev(flags: i32) -> io::Result<OwnedFd> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")?;
    // SAFETY: USERFAULTFD_IOC_NEW takes the new descriptor's flags as its
    // integer argument and returns a new descriptor or -1.
    let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor returned by the kernel, owned by no one else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Uffd {
    /// Opens a userfaultfd and negotiates `REQUIRED_FEATURES | optional`
    /// (optional bits are taken only where the kernel offers them).
    pub fn open(optional: u64, inject: Option<i32>) -> Result<Uffd, OpenError> {
        // The API handshake may run once per descriptor, so probe what the
        // kernel offers on a throwaway descriptor first.
        let probe = open_raw(inject)?;
        let offered = api(&probe, 0).map_err(OpenError::Other)?;
        drop(probe);
        if offered & REQUIRED_FEATURES != REQUIRED_FEATURES {
            return Err(OpenError::MissingFeatures {
                missing: REQUIRED_FEATURES & !offered,
            });
        }
        let want = REQUIRED_FEATURES | (optional & offered);
        let fd = open_raw(inject)?;
        let got = api(&fd, want).map_err(OpenError::Other)?;
        if got & want != want {
            return Err(OpenError::MissingFeatures {
                missing: want & !got,
            });
        }
        Ok(Uffd {
            fd: GuardedFd::new(fd),
            features: want,
        })
    }

    /// Features negotiated.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// In a forked child: the inherited descriptor is the parent's (its
    /// context is the parent's memory, and the child's mappings lost their
    /// registration). Opens a new userfaultfd with the same features and
    /// puts it in place of this one's descriptor number (`dup3`), so every
    /// holder of `self` now works on the child's memory. Ranges must be
    /// registered again.
    pub fn renew(&self) -> io::Result<()> {
        let fd = open_raw(None).map_err(|e| io::Error::other(e.to_string()))?;
        let got = api(&fd, self.features)?;
        if got & self.features != self.features {
            return Err(io::Error::other(
                "the kernel took back userfaultfd features",
            ));
        }
        replace_fd(&fd, &self.fd)
    }

    /// The descriptor, for poll.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn ioctl<T>(&self, req: u64, arg: &mut T) -> Result<(), i32> {
        // SAFETY: every request number used with this helper is paired with
        // the struct of exactly the size encoded in it (see the constants),
        // and `arg` is a valid, exclusive pointer to such a struct for the
        // duration of the call.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), req as _, arg as *mut T) };
        if r < 0 {
            Err(errno())
        } else {
            Ok(())
        }
    }

    /// Registers `[addr, addr+len)` for missing and write-protect faults.
    pub fn register(&self, addr: usize, len: usize) -> io::Result<()> {
        self.register_mode(addr, len, REGISTER_MODE_MISSING | REGISTER_MODE_WP)
    }

    fn register_mode(&self, addr: usize, len: usize, mode: u64) -> io::Result<()> {
        let mut r = UffdioRegister {
            range: UffdioRange {
                start: addr as u64,
                len: len as u64,
            },
            mode,
            ioctls: 0,
        };
        self.ioctl(UFFDIO_REGISTER, &mut r)
            .map_err(io::Error::from_raw_os_error)
    }

    /// Unregisters a range; blocked faulting threads are woken and retry
    /// as on ordinary memory.
    pub fn unregister(&self, addr: usize, len: usize) -> io::Result<()> {
        let mut r = UffdioRange {
            start: addr as u64,
            len: len as u64,
        };
        self.ioctl(UFFDIO_UNREGISTER, &mut r)
            .map_err(io::Error::from_raw_os_error)
    }

    /// `UFFDIO_COPY`: atomically maps copies of `len` bytes at `src` at
    /// `dst` (both page aligned), write-protected if `wp`, and wakes the
    /// threads waiting there unless `dontwake`. EEXIST: a page is already mapped at `dst +
    /// done` (resolved by someone else). EAGAIN: read pending events first,
    /// then retry from `done`. ENOENT: the range went away.
    ///
    /// # Safety
    /// `[src, src+len)` must be readable memory of this process.
    pub unsafe fn copy(
        &self,
        dst: usize,
        src: *const u8,
        len: usize,
        wp: bool,
        dontwake: bool,
    ) -> Result<(), UffdError> {
        let mut c = UffdioCopy {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: if wp { COPY_MODE_WP } else { 0 } | if dontwake { MODE_DONTWAKE } else { 0 },
            copy: 0,
        };
        match self.ioctl(UFFDIO_COPY, &mut c) {
            Ok(()) => Ok(()),
            Err(e) => Err(UffdError {
                errno: e,
                done: c.copy.max(0) as usize,
            }),
        }
    }

    /// `UFFDIO_ZEROPAGE`: maps the shared zero page (a later write
    /// copies it on write in the kernel, without a fault to us). Same
    /// EEXIST/EAGAIN/ENOENT and `dontwake` handling as [`Uffd::copy`].
    pub fn zeropage(&self, addr: usize, len: usize, dontwake: bool) -> Result<(), UffdError> {
        let mut z = UffdioZeropage {
            range: UffdioRange {
                start: addr as u64,
                len: len as u64,
            },
            mode: if dontwake { MODE_DONTWAKE } else { 0 },
            zeropage: 0,
        };
        match self.ioctl(UFFDIO_ZEROPAGE, &mut z) {
            Ok(()) => Ok(()),
            Err(e) => Err(UffdError {
                errno: e,
                done: z.zeropage.max(0) as usize,
            }),
        }
    }

    /// `UFFDIO_WRITEPROTECT`: sets (`wp`) or clears write protection on
    /// mapped pages of the range (unmapped pages are skipped). On return
    /// with `wp`, no CPU can write the pages any more (the TLB is flushed).
    /// Clearing wakes the writers blocked on the range, unless `dontwake`.
    /// EAGAIN: an event is being delivered, retry after the handler reads
    /// it.
    pub fn writeprotect(
        &self,
        addr: usize,
        len: usize,
        wp: bool,
        dontwake: bool,
    ) -> Result<(), UffdError> {
        let mut w = UffdioWriteprotect {
            range: UffdioRange {
                start: addr as u64,
                len: len as u64,
            },
            mode: if wp { WRITEPROTECT_MODE_WP } else { 0 }
                | if dontwake {
                    WRITEPROTECT_MODE_DONTWAKE
                } else {
                    0
                },
        };
        self.ioctl(UFFDIO_WRITEPROTECT, &mut w)
            .map_err(|e| UffdError { errno: e, done: 0 })
    }

    /// `UFFDIO_WAKE`: wakes threads blocked on faults in the range, which
    /// retry their access (and fault again if it is still unresolved).
    pub fn wake(&self, addr: usize, len: usize) -> Result<(), UffdError> {
        let mut r = UffdioRange {
            start: addr as u64,
            len: len as u64,
        };
        self.ioctl(UFFDIO_WAKE, &mut r)
            .map_err(|e| UffdError { errno: e, done: 0 })
    }

    /// `UFFDIO_POISON`: maps a poison marker, so the access raises SIGBUS
    /// (as a swap read error does). Needs `feature::POISON`. `dontwake` as
    /// for [`Uffd::copy`].
    pub fn poison(&self, addr: usize, len: usize, dontwake: bool) -> Result<(), UffdError> {
        let mut p = UffdioPoison {
            range: UffdioRange {
                start: addr as u64,
                len: len as u64,
            },
            mode: if dontwake { MODE_DONTWAKE } else { 0 },
            updated: 0,
        };
        self.ioctl(UFFDIO_POISON, &mut p).map_err(|e| UffdError {
            errno: e,
            done: p.updated.max(0) as usize,
        })
    }

    /// `UFFDIO_MOVE`: moves mapped pages from `src` to `dst` (a registered,
    /// unmapped destination), without `ALLOW_SRC_HOLES` (see [`Staging`]
    /// on why never with it). EBUSY on pages shared with a forked child;
    /// EEXIST if the destination is mapped; ENOENT at an unmapped source
    /// page.
    pub fn move_pages(&self, dst: usize, src: usize, len: usize) -> Result<(), UffdError> {
        let mut m = UffdioMove {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            mode: 0,
            moved: 0,
        };
        self.ioctl(UFFDIO_MOVE, &mut m).map_err(|e| UffdError {
            errno: e,
            done: m.moved.max(0) as usize,
        })
    }

    /// Reads as many pending messages as fit, without blocking. Returns 0
    /// when none is pending.
    pub fn read_msgs(&self, buf: &mut [RawMsg]) -> io::Result<usize> {
        let bytes = std::mem::size_of_val(buf);
        // SAFETY: `buf` is valid writable memory of `bytes` bytes; the kernel
        // writes whole `uffd_msg`s (32 bytes each) into it.
        let r = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), bytes) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EAGAIN) {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(r as usize / std::mem::size_of::<RawMsg>())
    }
}

/// The UFFDIO_API handshake; returns the features the kernel reports.
fn api(fd: &OwnedFd, features: u64) -> io::Result<u64> {
    let mut a = UffdioApi {
        api: UFFD_API,
        features,
        ioctls: 0,
    };
    // SAFETY: UFFDIO_API takes a `struct uffdio_api` (24 bytes), which `a` is.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut a as *mut UffdioApi) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(a.features)
}

// ---- other system calls ---------------------------------------------------

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

/// Makes descriptor number `old` name what `new` names (`dup3`, atomic);
/// `new` keeps its own number and closes it when dropped.
fn replace_fd(new: &impl AsRawFd, old: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: both descriptors are open and ours; dup3 closes what `old`
    // named and makes its number a copy of `new`.
    if unsafe { libc::dup3(new.as_raw_fd(), old.as_raw_fd(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What became of a page [`Staging::take`] tried to move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// It is in the slot; the region has no page there any more.
    Moved,
    /// The region had no page there (the program discarded it).
    Gone,
    /// The kernel refused (this errno): the page is where it was. EBUSY
    /// for a page shared with a forked child, EINVAL for a mapping whose
    /// protection or flags differ from the staging area's.
    Refused(i32),
}

/// Where the evictor drops pages without a remove event: `pages` pages of
/// anonymous memory registered with a userfaultfd of its own that has
/// `UFFDIO_MOVE` and no events. A page moved here from a region leaves it
/// with no `MADV_DONTNEED` on the region, so the region's descriptor
/// reports nothing (each remove event is a round trip through a handler,
/// and until the thread that raised it runs again every resolving ioctl
/// fails with EAGAIN); the staging pages are then dropped together, which
/// reports nothing either (this descriptor has no events).
///
/// One page per ioctl, never with `ALLOW_SRC_HOLES`: on Linux 6.18 the
/// move loop keeps its error across retries, so a move that met a
/// transient EAGAIN (the page table changed under it) and then found a
/// hole at the source "moves the hole" forever, spinning in the kernel
/// (seen here: a test hung with the evictor at 100 % system time in
/// `move_pages`). Without holes, the same sequence ends: a page that did
/// move after the EAGAIN is reported as EEXIST at its (formerly empty)
/// destination, which [`Staging::take`] checks with `mincore`.
#[derive(Debug)]
pub struct Staging {
    uffd: Uffd,
    base: usize,
    pages: usize,
}

impl Staging {
    /// None if the kernel lacks `UFFDIO_MOVE` or the area cannot be set up
    /// (the evictor then drops pages with `MADV_DONTNEED` only).
    pub fn new(pages: usize) -> Option<Staging> {
        let fd = open_raw(None).ok()?;
        let got = api(&fd, feature::MOVE).ok()?;
        if got & feature::MOVE == 0 {
            return None;
        }
        let uffd = Uffd {
            fd: GuardedFd::new(fd),
            features: feature::MOVE,
        };
        let len = pages * PAGE_SIZE;
        let base = map_anon(len).ok()?;
        let _ = no_huge_pages(base, len);
        // A forked child gets no copy: the area is the evictor's alone.
        // SAFETY: our own fresh mapping; MADV_DONTFORK changes no contents.
        let dontfork = unsafe { madvise(base, len, libc::MADV_DONTFORK) };
        if dontfork.is_err()
            || uffd
                .register_mode(base, len, REGISTER_MODE_MISSING)
                .is_err()
        {
            // SAFETY: our own fresh mapping, never handed out.
            unsafe { unmap(base, len) };
            return None;
        }
        Some(Staging { uffd, base, pages })
    }

    /// Pages the area holds.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// In a forked child: the area was not copied (`MADV_DONTFORK`) and its
    /// descriptor is the parent's. Maps the area again at the same address,
    /// registered with a new descriptor of its own in place of the old one.
    pub fn renew(&self) -> io::Result<()> {
        let len = self.pages * PAGE_SIZE;
        // SAFETY: the range is the staging area's, which this child did not
        // inherit (MADV_DONTFORK): nothing of the child's lives there.
        unsafe { map_anon_at(self.base, len) }?;
        let _ = no_huge_pages(self.base, len);
        // SAFETY: our own fresh mapping; MADV_DONTFORK changes no contents.
        unsafe { madvise(self.base, len, libc::MADV_DONTFORK) }?;
        let fd = open_raw(None).map_err(|e| io::Error::other(e.to_string()))?;
        api(&fd, feature::MOVE)?;
        replace_fd(&fd, &self.uffd.fd)?;
        self.uffd
            .register_mode(self.base, len, REGISTER_MODE_MISSING)
    }

    /// Moves the page at `src` into the empty slot `slot`.
    pub fn take(&self, slot: usize, src: usize) -> Taken {
        assert!(slot < self.pages, "staging holds {} pages", self.pages);
        let dst = self.base + slot * PAGE_SIZE;
        match self.uffd.move_pages(dst, src, PAGE_SIZE) {
            Ok(()) => Taken::Moved,
            Err(e) if e.errno == libc::ENOENT => Taken::Gone,
            // The slot was empty, so only this move can have filled it
            // (see the type's docs); mincore tells.
            Err(e) if e.errno == libc::EEXIST => match mincore_count(dst, PAGE_SIZE) {
                Ok(1) => Taken::Moved,
                _ => Taken::Refused(e.errno),
            },
            Err(e) => Taken::Refused(e.errno),
        }
    }

    /// The page in slot `slot`.
    ///
    /// # Safety
    /// The slot must hold a page ([`Staging::take`] gave `Moved` and no
    /// [`Staging::clear`] since): an empty slot is a missing page of a
    /// descriptor nobody serves, and reading it would wait forever. The
    /// caller is the only user of the area meanwhile.
    pub unsafe fn slot(&self, slot: usize) -> &[u8] {
        assert!(slot < self.pages, "staging holds {} pages", self.pages);
        // SAFETY: per the contract, the slot is mapped, private to the
        // caller, and stays so while the borrow of `self` lives.
        unsafe {
            std::slice::from_raw_parts((self.base + slot * PAGE_SIZE) as *const u8, PAGE_SIZE)
        }
    }

    /// Drops the first `n` slots (no event: the area's descriptor has
    /// none); they are empty afterwards.
    pub fn clear(&self, n: usize) {
        if n > 0 {
            // SAFETY: staging memory is ours alone; its pages were stored
            // (or are clean copies of stored pages) before they moved.
            let _ = unsafe { dontneed(self.base, n * PAGE_SIZE) };
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // SAFETY: the area is ours and nothing refers to it any more.
        unsafe { unmap(self.base, self.pages * PAGE_SIZE) };
    }
}

// ---- in-thread faults: SIGBUS ---------------------------------------------

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

/// Maps `len` bytes of private anonymous read-write memory.
pub fn map_anon(len: usize) -> io::Result<usize> {
    // SAFETY: a new anonymous mapping at an address of the kernel's choice
    // aliases nothing; the result is checked for MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p as usize)
}

/// A fresh anonymous read-write mapping at exactly `addr` (`MAP_FIXED`).
///
/// # Safety
/// Whatever was mapped at `addr..addr + len` is replaced: the caller must
/// own that range and nothing may still use it.
pub unsafe fn map_anon_at(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: the caller owns the range (function contract).
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `madvise(MADV_NOHUGEPAGE)`: the pager works in 4 KiB pages; a huge
/// page (a THP fault or a khugepaged collapse) would be evicted and
/// tracked as 512 unrelated pages.
pub fn no_huge_pages(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: only changes the huge-page policy of our own mapping; no
    // contents are affected.
    unsafe { madvise(addr, len, libc::MADV_NOHUGEPAGE) }
}

/// `madvise(2)` with `advice` on `[addr, addr+len)`.
///
/// # Safety
/// As `advice` requires: one that drops pages needs a range whose contents
/// may be lost.
unsafe fn madvise(addr: usize, len: usize, advice: i32) -> io::Result<()> {
    // SAFETY: per the caller's contract; the kernel checks the range.
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Unmaps a range.
///
/// # Safety
/// Nothing may access `[addr, addr+len)` afterwards.
pub unsafe fn unmap(addr: usize, len: usize) {
    // SAFETY: per the caller's contract.
    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
}

/// `madvise(MADV_DONTNEED)`: drops the pages of the range (they read as
/// zeros, or fault to the handler, afterwards). On a registered range with
/// EVENT_REMOVE this blocks until the handler has read the remove event.
///
/// # Safety
/// The range must be private anonymous memory whose contents may be lost.
pub unsafe fn dontneed(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: per the caller's contract.
    unsafe { madvise(addr, len, libc::MADV_DONTNEED) }
}

/// Copies the pages at our own addresses `pages` into consecutive pages of
/// `dst` (`pages.len()` pages) with `process_vm_readv`, one system call per
/// 1024 pages: if a page was unmapped meanwhile this fails with EFAULT
/// instead of crashing, and missing pages fault to the handler like any
/// kernel access.
pub fn read_own_pages(pages: &[usize], dst: &mut [u8]) -> io::Result<()> {
    assert_eq!(
        dst.len(),
        pages.len() * PAGE_SIZE,
        "one page of dst per address"
    );
    for (addrs, out) in pages.chunks(1024).zip(dst.chunks_mut(1024 * PAGE_SIZE)) {
        let local = libc::iovec {
            iov_base: out.as_mut_ptr().cast(),
            iov_len: out.len(),
        };
        let remote: Vec<libc::iovec> = addrs
            .iter()
            .map(|&a| libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: PAGE_SIZE,
            })
            .collect();
        // SAFETY: `local` describes writable memory we own exclusively; the
        // kernel validates every remote range against our address space
        // and returns an error for unmapped parts.
        let r = unsafe {
            libc::process_vm_readv(
                libc::getpid(),
                &local,
                1,
                remote.as_ptr(),
                remote.len() as _,
                0,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        if r as usize != out.len() {
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
    }
    Ok(())
}

// ---- UAPI: linux/fs.h, PAGEMAP_SCAN (Linux 6.7) ------------------------

/// `struct pm_scan_arg`.
#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `struct page_region`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// `PAGE_IS_PFNZERO`: the page table maps the shared zero page.
const PAGE_IS_PFNZERO: u64 = 1 << 5;
/// `PAGEMAP_SCAN`: `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: u64 =
    (3 << 30) | ((std::mem::size_of::<PmScanArg>() as u64) << 16) | ((b'f' as u64) << 8) | 16;

/// Finds which of our own pages map the shared zero page (`PAGEMAP_SCAN`
/// on `/proc/self/pagemap`): pages a first touch or a read mapped as zeros
/// and nothing wrote since. Dropping one frees no memory.
pub struct ZeroScan {
    /// `pagemap`'s number, guarded (`uzswap_os::fdguard`; before it, so
    /// that it is unmarked first).
    mark: uzswap_os::fdguard::Mark,
    pagemap: std::fs::File,
    regions: Vec<PageRegion>,
}

impl ZeroScan {
    /// None where the kernel has no `PAGEMAP_SCAN` (it came in Linux 6.7) or
    /// `/proc` is not mounted.
    pub fn new() -> Option<ZeroScan> {
        let pagemap = std::fs::File::open("/proc/self/pagemap").ok()?;
        let mut z = ZeroScan {
            mark: uzswap_os::fdguard::Mark::new(&pagemap),
            pagemap,
            regions: vec![PageRegion::default(); 64],
        };
        let probe = map_anon(PAGE_SIZE).ok()?;
        let works = z.zero_runs(probe, probe + PAGE_SIZE, |_, _| {}).is_ok();
        // SAFETY: the page was mapped just above and is ours alone.
        unsafe { libc::munmap(probe as *mut libc::c_void, PAGE_SIZE) };
        works.then_some(z)
    }

    /// Opens the calling process's own `pagemap` in place of the one
    /// opened before a fork: that descriptor names the parent's memory
    /// whichever process uses it.
    pub fn renew(&mut self) -> io::Result<()> {
        let pagemap = std::fs::File::open("/proc/self/pagemap")?;
        // The old number's mark goes first, then its file.
        self.mark = uzswap_os::fdguard::Mark::new(&pagemap);
        self.pagemap = pagemap;
        Ok(())
    }

    /// Calls `each(lo, hi)` for every run of pages of `[lo, hi)` that map
    /// the zero page, in address order.
    pub fn zero_runs(
        &mut self,
        lo: usize,
        hi: usize,
        mut each: impl FnMut(usize, usize),
    ) -> io::Result<()> {
        let mut at = lo as u64;
        while at < hi as u64 {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                start: at,
                end: hi as u64,
                vec: self.regions.as_mut_ptr() as u64,
                vec_len: self.regions.len() as u64,
                category_mask: PAGE_IS_PFNZERO,
                return_mask: PAGE_IS_PFNZERO,
                ..PmScanArg::default()
            };
            // SAFETY: `arg` is a valid pm_scan_arg whose `vec` points at
            // `vec_len` writable page_region records we own; the kernel
            // only reads our page tables.
            let n = unsafe {
                libc::ioctl(
                    self.pagemap.as_raw_fd(),
                    PAGEMAP_SCAN as _,
                    &mut arg as *mut PmScanArg,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            for r in &self.regions[..n as usize] {
                each(r.start as usize, r.end as usize);
            }
            if arg.walk_end <= at {
                break;
            }
            at = arg.walk_end;
        }
        Ok(())
    }
}

/// Pages of `[addr, addr+len)` resident in memory, by `mincore(2)`.
pub fn mincore_count(addr: usize, len: usize) -> io::Result<usize> {
    Ok(mincore(addr, len)?.into_iter().filter(|&m| m).count())
}

/// Per page of `[addr, addr + len)`: whether the kernel has it mapped (a
/// page of zeros mapped by `UFFDIO_ZEROPAGE` counts; a write-protect or
/// poison marker does not).
pub fn mincore(addr: usize, len: usize) -> io::Result<Vec<bool>> {
    let n = len.div_ceil(PAGE_SIZE);
    let mut v = vec![0u8; n];
    // SAFETY: `v` has one byte per page of the range, as mincore requires;
    // the kernel checks the range itself.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, len, v.as_mut_ptr()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v.into_iter().map(|b| b & 1 != 0).collect())
}

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
