//! The userfaultfd descriptor: the UAPI of `linux/userfaultfd.h`, the
//! messages it reads, opening and negotiating it, and its ioctls (the
//! contract is in the module above).
//!
//! The ioctl numbers, structs and flag bits below are written down from the
//! kernel's UAPI header `linux/userfaultfd.h` (stable ABI). We do not use the
//! `userfaultfd` crate: it runs bindgen (needs libclang on the build machine)
//! and lacks `UFFD_FEATURE_WP_ASYNC`, `UFFDIO_MOVE` and `UFFDIO_POISON`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use uzswap_os::fdguard::GuardedFd;

use super::{replace_fd, PAGE_SIZE};

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
pub(super) const REGISTER_MODE_MISSING: u64 = 1 << 0;
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
    pub(super) fd: GuardedFd,
    pub(super) features: u64,
    /// Chunk edges (every `edge` bytes from address 0; 0: none) that the
    /// mapping ioctls never cross: the kernel resolves a `UFFDIO_COPY`,
    /// `ZEROPAGE`, `POISON` or `MOVE` inside one mapping only, and the
    /// pager keeps its chunks as separate mappings (`split_chunks`).
    /// Calls that span an edge are made one piece a chunk.
    pub(super) edge: usize,
}

/// Calls `f(offset, bytes)` for the pieces of `[at, at + len)` (and of
/// `[also, also + len)`, moved alike) that cross no multiple of `edge`,
/// in order, until one fails; the failure's `done` counts from `at`.
fn pieces(
    edge: usize,
    at: usize,
    also: usize,
    len: usize,
    mut f: impl FnMut(usize, usize) -> Result<(), UffdError>,
) -> Result<(), UffdError> {
    if edge == 0 {
        return f(0, len);
    }
    let mut off = 0;
    while off < len {
        let to_edge = |a: usize| edge - (a + off) % edge;
        let n = (len - off).min(to_edge(at)).min(to_edge(also));
        f(off, n).map_err(|e| UffdError {
            errno: e.errno,
            done: off + e.done,
        })?;
        off += n;
    }
    Ok(())
}

/// Features we cannot work without.
pub const REQUIRED_FEATURES: u64 = feature::PAGEFAULT_FLAG_WP
    | feature::EVENT_REMAP
    | feature::EVENT_REMOVE
    | feature::EVENT_UNMAP;

/// Opens a raw, not yet negotiated userfaultfd: the syscall first, then
/// `/dev/userfaultfd`. `inject` makes the syscall fail with that errno and
/// the device open fail with EACCES (a test hook: tests run as root).
pub(super) fn open_raw(inject: Option<i32>) -> Result<OwnedFd, OpenError> {
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
            edge: 0,
        })
    }

    /// Makes the mapping ioctls stop at every multiple of `edge` bytes
    /// (see the field); 0: anywhere.
    pub fn set_edge(&mut self, edge: usize) {
        self.edge = edge;
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

    pub(super) fn register_mode(&self, addr: usize, len: usize, mode: u64) -> io::Result<()> {
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
        pieces(self.edge, dst, dst, len, |off, n| {
            let mut c = UffdioCopy {
                dst: (dst + off) as u64,
                src: src as u64 + off as u64,
                len: n as u64,
                mode: if wp { COPY_MODE_WP } else { 0 } | if dontwake { MODE_DONTWAKE } else { 0 },
                copy: 0,
            };
            self.ioctl(UFFDIO_COPY, &mut c).map_err(|e| UffdError {
                errno: e,
                done: c.copy.max(0) as usize,
            })
        })
    }

    /// `UFFDIO_ZEROPAGE`: maps the shared zero page (a later write
    /// copies it on write in the kernel, without a fault to us). Same
    /// EEXIST/EAGAIN/ENOENT and `dontwake` handling as [`Uffd::copy`].
    pub fn zeropage(&self, addr: usize, len: usize, dontwake: bool) -> Result<(), UffdError> {
        pieces(self.edge, addr, addr, len, |off, n| {
            let mut z = UffdioZeropage {
                range: UffdioRange {
                    start: (addr + off) as u64,
                    len: n as u64,
                },
                mode: if dontwake { MODE_DONTWAKE } else { 0 },
                zeropage: 0,
            };
            self.ioctl(UFFDIO_ZEROPAGE, &mut z).map_err(|e| UffdError {
                errno: e,
                done: z.zeropage.max(0) as usize,
            })
        })
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
        pieces(self.edge, addr, addr, len, |off, n| {
            let mut p = UffdioPoison {
                range: UffdioRange {
                    start: (addr + off) as u64,
                    len: n as u64,
                },
                mode: if dontwake { MODE_DONTWAKE } else { 0 },
                updated: 0,
            };
            self.ioctl(UFFDIO_POISON, &mut p).map_err(|e| UffdError {
                errno: e,
                done: p.updated.max(0) as usize,
            })
        })
    }

    /// `UFFDIO_MOVE`: moves mapped pages from `src` to `dst` (a registered,
    /// unmapped destination), without `ALLOW_SRC_HOLES` (see [`Staging`]
    /// on why never with it). EBUSY on pages shared with a forked child;
    /// EEXIST if the destination is mapped; ENOENT at an unmapped source
    /// page.
    pub fn move_pages(&self, dst: usize, src: usize, len: usize) -> Result<(), UffdError> {
        pieces(self.edge, dst, src, len, |off, n| {
            let mut m = UffdioMove {
                dst: (dst + off) as u64,
                src: (src + off) as u64,
                len: n as u64,
                mode: 0,
                moved: 0,
            };
            self.ioctl(UFFDIO_MOVE, &mut m).map_err(|e| UffdError {
                errno: e,
                done: m.moved.max(0) as usize,
            })
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
pub(super) fn api(fd: &OwnedFd, features: u64) -> io::Result<u64> {
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
