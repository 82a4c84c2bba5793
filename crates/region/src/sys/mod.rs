//! The OS boundary of the region crate: the only module that touches
//! userfaultfd, and the home of every other `libc` call of the crate. One
//! file a job:
//! - `uffd.rs`: the userfaultfd descriptor (UAPI, messages, the resolving
//!   ioctls, opening and negotiating it);
//! - `eventfd.rs`: the eventfd that wakes a handler, and polling;
//! - `staging.rs`: the area the evictor moves pages into (`UFFDIO_MOVE`);
//! - `sigbus.rs`: in-thread faults: the SIGBUS handler's installation,
//!   decoding and chaining, and the async-signal-safe calls it makes;
//! - `pagemap.rs`: `PAGEMAP_SCAN` on our own page map (zero-page runs);
//! - `smaps.rs`: the access signal (`clear_refs` and `smaps`) and the
//!   chunks that give it its resolution;
//! - `mem.rs`: mappings (`mmap`, `madvise`, `munmap`), `mincore`, reads of
//!   our own pages;
//! - `process.rs`: CPUs, the process id, fork hooks, ending a child.
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
use std::os::fd::AsRawFd;

pub use uzswap_os::{rss_bytes, PAGE_SIZE};

mod eventfd;
mod mem;
mod pagemap;
mod process;
mod sigbus;
mod smaps;
mod staging;
mod uffd;

pub use eventfd::{poll2, readable, EventFd};
pub use mem::{
    dontneed, map_anon, map_anon_at, mincore, mincore_count, no_huge_pages, read_own_pages, unmap,
    ForcedRead,
};
pub use pagemap::ZeroScan;
pub use process::{allowed_cpus, atfork, die, exit_process, getpid, pin_idle};
pub use sigbus::{
    bus_fault, chain_signal, errno_value, install_sigbus, set_errno, touch_for_write, yield_cpu,
    BusFault, OldAction, SigHandler,
};
pub use smaps::{map_count, split_chunks, AccessScan, Used};
pub use staging::{Staging, Taken};
pub use uffd::{feature, Msg, OpenError, RawMsg, Uffd, UffdError, REQUIRED_FEATURES};

/// Makes descriptor number `old` name what `new` names (`dup3`, atomic,
/// at a lifted number too: `uzswap_os::fdguard::replace`); `new` keeps its
/// own number and closes it when dropped.
fn replace_fd(new: &impl AsRawFd, old: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: both descriptors are open and ours; `old`'s owner names the
    // new file through its number from here on.
    unsafe { uzswap_os::fdguard::replace(new.as_raw_fd(), old.as_raw_fd()) }
}
