//! The pager's shared vocabulary: the values that pass between the
//! handler, a fault, a load and an eviction, and the buffers they fill.
//! Nothing here takes a pager lock.
//!
//! The fault path reads in one direction: a handler (`handler.rs`, or the
//! SIGBUS handler in `inthread.rs`) reads a [`Fault`] and calls
//! `fault.rs`, which resolves it or starts a [`Load`] and says so in an
//! [`Outcome`]; the handler finishes the load in `load.rs` once the
//! dispatch lock is released. Each step resolves through [`Wakes`], which
//! the handler that owns it wakes with at the end.

use super::PagerCore;
use crate::sys::{self, Uffd, PAGE_SIZE};
use std::time::Instant;

/// What handling a fault came to. (A `Load` is large, its tickets a fixed
/// array; boxing it would allocate in the SIGBUS handler of in-thread
/// faults.)
#[allow(clippy::large_enum_variant)]
pub(super) enum Outcome {
    Done,
    /// A load was started: finish it (`PagerCore::finish_load`) once the
    /// dispatch lock is released.
    Load(Load),
    /// Retry later: the budget is full.
    Defer,
    /// Retry later: EAGAIN, an event is being delivered (it must be read,
    /// and the thread that raised it must go on, before any resolving
    /// ioctl succeeds).
    Again,
    /// With in-thread faults: the address is in no region (the SIGBUS is
    /// not ours).
    Foreign,
}

#[derive(Clone, Copy)]
pub(super) struct Fault {
    pub(super) addr: usize,
    pub(super) write: bool,
    pub(super) wp: bool,
    pub(super) t0: Instant,
    /// Deferred before (counters count a fault once).
    pub(super) retried: bool,
}

/// A load between its start and its map step: pages `page..page + n` of
/// `area`, the first the faulting one.
pub(super) struct Load {
    pub(super) f: Fault,
    pub(super) area: u32,
    pub(super) page: u64,
    /// Pages in the load (at most [`MAX_LOAD`]).
    pub(super) n: usize,
    /// The ticket of each page (its `qgen` when it became `Loading`): a
    /// fixed array, so that starting a load allocates nothing (in-thread
    /// faults start loads in a signal handler).
    pub(super) tickets: [u32; MAX_LOAD],
}

/// The most pages one load brings back: the faulting page and at most 63
/// followers (`PagerConfig::readahead_max` is taken no larger).
pub(super) const MAX_LOAD: usize = 64;

/// One page buffer aligned to a page (UFFDIO_COPY wants an aligned source).
pub(super) struct PageBuf {
    pub(super) ptr: *mut u8,
    pub(super) pages: usize,
}

impl PageBuf {
    pub(super) fn new(pages: usize) -> PageBuf {
        let layout = std::alloc::Layout::from_size_align(pages * PAGE_SIZE, PAGE_SIZE)
            .expect("page buffer layout");
        // SAFETY: the layout has a non-zero size (pages >= 1).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory for a page buffer");
        PageBuf { ptr, pages }
    }

    pub(super) fn page(&mut self, i: usize) -> &mut [u8] {
        assert!(i < self.pages);
        // SAFETY: page i lies inside the allocation, and `&mut self` makes
        // the returned slice the only reference to it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * PAGE_SIZE), PAGE_SIZE) }
    }

    pub(super) fn addr(&self, i: usize) -> *const u8 {
        // SAFETY: in bounds of the allocation (i <= pages).
        unsafe { self.ptr.add(i * PAGE_SIZE) }
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.pages * PAGE_SIZE, PAGE_SIZE)
            .expect("page buffer layout");
        // SAFETY: allocated in `new` with this very layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

/// How the ioctls that resolve a fault wake the faulting thread.
///
/// The main handler lets each ioctl wake at once (`now`). A CPU handler
/// runs under `SCHED_IDLE` on the faulting thread's CPU, so the thread it
/// wakes preempts it at once: it resolves with `DONTWAKE`, records the
/// ranges here, releases every lock and only then wakes them (`finish`),
/// or it would be preempted holding the pager's locks. The evictor's
/// wake-up (`kick`) is deferred the same way, to after the faulting
/// thread's: woken first on that CPU it would run before the thread.
pub(super) struct Wakes {
    pub(super) defer: bool,
    pub(super) ranges: Vec<(usize, usize)>,
    pub(super) kick: bool,
    /// The fault was parked: with in-thread faults its thread waits on
    /// the settle sequence from `seen` (see `inthread.rs`).
    pub(super) wait: bool,
    /// The settle sequence when the fault took the state lock.
    pub(super) seen: u32,
}

impl Wakes {
    pub(super) fn now() -> Wakes {
        Wakes {
            defer: false,
            ranges: Vec::new(),
            kick: false,
            wait: false,
            seen: 0,
        }
    }

    pub(super) fn deferred() -> Wakes {
        Wakes {
            defer: true,
            ..Wakes::now()
        }
    }

    /// After a resolving ioctl on `[addr, addr + len)`: with deferred
    /// wakes, the part it mapped is to be woken.
    pub(super) fn resolved(&mut self, addr: usize, r: &Result<(), sys::UffdError>, len: usize) {
        if !self.defer {
            return;
        }
        let done = match r {
            Ok(()) => len,
            Err(e) => e.done,
        };
        if done > 0 {
            self.ranges.push((addr, done));
        }
    }

    /// `UFFDIO_COPY` on the fault path, waking as these wakes say.
    ///
    /// # Safety
    /// As [`Uffd::copy`].
    pub(super) unsafe fn copy(
        &mut self,
        uffd: &Uffd,
        dst: usize,
        src: *const u8,
        len: usize,
        wp: bool,
    ) -> Result<(), sys::UffdError> {
        // SAFETY: the caller's promise, passed on.
        let r = unsafe { uffd.copy(dst, src, len, wp, self.defer) };
        self.resolved(dst, &r, len);
        r
    }

    /// `UFFDIO_ZEROPAGE` of one page on the fault path, waking as these wakes say.
    pub(super) fn zeropage(&mut self, uffd: &Uffd, addr: usize) -> Result<(), sys::UffdError> {
        let r = uffd.zeropage(addr, PAGE_SIZE, self.defer);
        self.resolved(addr, &r, PAGE_SIZE);
        r
    }

    /// Clears write protection of one page on the fault path, waking as these
    /// wakes say.
    pub(super) fn unprotect(&mut self, uffd: &Uffd, addr: usize) -> Result<(), sys::UffdError> {
        let r = uffd.writeprotect(addr, PAGE_SIZE, false, self.defer);
        self.resolved(addr, &r, PAGE_SIZE);
        r
    }

    /// Wakes the threads waiting on `[addr, addr + len)`, now or in
    /// `finish`.
    pub(super) fn wake(&mut self, sh: &PagerCore, addr: usize, len: usize) {
        // Faults parked in the SIGBUS handler or by a pin wait on the settle
        // sequence; with in-thread faults nobody waits in the kernel.
        sh.notify_settled();
        if sh.cfg.in_thread_faults {
            return;
        }
        if self.defer {
            self.ranges.push((addr, len));
        } else {
            let _ = sh.uffd.wake(addr, len);
        }
    }

    /// Does the deferred wake-ups. Call with no pager lock held.
    pub(super) fn finish(&mut self, sh: &PagerCore) {
        for (addr, len) in self.ranges.drain(..) {
            let _ = sh.uffd.wake(addr, len);
        }
        if std::mem::take(&mut self.kick) {
            // No lock needed: an evictor that saw the old resident count
            // held the state lock from that check until it slept, so it
            // sleeps already and this reaches it.
            sh.work_cv.notify_one();
        }
    }
}

/// A victim inside an eviction batch.
pub(super) struct Victim {
    pub(super) area: u32,
    pub(super) page: u32,
    pub(super) addr: usize,
    /// The page was `Clean`: nothing to store.
    pub(super) clean: bool,
    /// Stored successfully (dirty victims).
    pub(super) stored: bool,
    /// `MADV_DONTNEED` is to be (or was) issued.
    pub(super) discard: bool,
    pub(super) unprotect: bool,
    /// Never on the active list this residency: stored with
    /// `PageStore::store_cold`.
    pub(super) cold: bool,
    /// A dirty victim that left by a move before it was stored
    /// ([`PagerCore::move_out`]): steps 2 to 5 are done for it.
    pub(super) moved: bool,
}

/// Victims of a batch (indexes, by address) that one call serves, and the
/// range it covers: from the first victim to the end of the last.
pub(super) struct Span {
    pub(super) victims: Vec<usize>,
    pub(super) lo: usize,
    pub(super) hi: usize,
}
