//! In-thread faults (`PagerConfig::in_thread_faults`): the userfaultfd is
//! negotiated with `UFFD_FEATURE_SIGBUS`, so the kernel raises SIGBUS on
//! the faulting thread instead of queueing a message, and the SIGBUS
//! handler installed here resolves the fault right there (see the crate
//! documentation, "In-thread faults"). Also the pins ([`crate::Region::pin`])
//! that make memory resident for the system calls of that mode.
//!
//! # What runs in the signal handler, and why it is safe there
//! The SIGBUS a userfault raises is synchronous: the thread was at an
//! access of region memory in user mode. So it holds exactly the locks the
//! accessing code holds. No code of this crate or of the store accesses
//! region memory in user mode (the evictor reads it with
//! `process_vm_readv`, loads map it with `UFFDIO_COPY`, a moved page is
//! read in the staging area, which is another userfaultfd without SIGBUS
//! mode; pins touch their pages holding no lock): so the interrupted code
//! holds no pager or store lock, and the handler may take them. The one
//! way around this is the program's: its own signal handler, run on a
//! thread inside a pager call, that touches unpinned region memory (the
//! nested SIGBUS would wait for a lock its own thread holds). The crate
//! documentation forbids it in the contract. The handler:
//! - takes the pager's futex-word locks (`dispatch` while it maps a page,
//!   `state`) and the store's, never across a wait;
//! - allocates nothing on its own path: page buffers come from a pool made
//!   with the pager ([`BufPool`], a lock-free bitmap); a load's tickets are
//!   a fixed array; pages are queued into list capacity reserved beforehand
//!   (`State::queue_spare`; a fault that finds too little is deferred and
//!   the evictor reserves more); no discard span's list of parked faults
//!   grows (waiting is by the settle sequence below);
//! - makes system calls that are async-signal-safe (ioctl, futex,
//!   sched_yield, clock_gettime);
//! - saves and restores `errno`.
//!
//! What the store does inside `PageStore::load` is the store's: the cache
//! takes its shard and pool locks (never held by code touching region
//! memory), decompresses into the caller's buffer (lz4 allocates nothing;
//! a thread's first zstd or deflate load makes its decompressor) and may
//! `pread` its backing file.
//!
//! # Waiting
//! A fault on a page the evictor or a load is working on, or one deferred
//! (budget full, a fork preparing, list capacity low), waits on the
//! pager's *settle sequence* (`PagerCore::settle_seq`), a futex word: the
//! fault reads it under the state lock before it looks at the page, and
//! every way a parked fault is woken (and the end of each eviction batch,
//! of a fork, a change of the store's fullness) bumps it and wakes the
//! sleepers. A bump after that read makes the wait return at once, so no
//! wake-up is lost; the wait is also bounded (`WAIT`). Then the handler
//! returns and the access runs again: it faults again if the page is still
//! not there, and everything is looked at anew (the segment, the page's
//! state, the budget). EAGAIN (an event is being delivered) only yields
//! and retries: the handler thread reads the event, and the thread that
//! raised it must run.

use super::state::{lookup, PageState};
use super::types::{Fault, Outcome, PageBuf, Wakes};
use super::{PagerCore, PagerError};
use crate::sys::{self, PAGE_SIZE};
use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use std::time::Instant;
use uzswap_os::lock::{futex_wait, futex_wake, Mutex};

/// The longest a fault waits on the settle sequence before it looks again
/// (a backstop: every settle bumps the sequence).
const WAIT: Duration = Duration::from_millis(2);

/// Page buffers in a pager's pool: faults resolved at once in signal
/// handlers; a fault that finds none free yields and runs again.
const BUF_SLOTS: usize = 64;

/// The pager whose faults the SIGBUS handler resolves (null: none).
static PAGER: AtomicPtr<PagerCore> = AtomicPtr::new(std::ptr::null_mut());
/// Handlers between reading `PAGER` and done with it: a pager waits for
/// none before it goes away.
static USERS: AtomicUsize = AtomicUsize::new(0);
/// SIGBUS's disposition before ours (set once; our handler stays
/// installed for the life of the process and chains to it).
static OLD: OnceLock<sys::OldAction> = OnceLock::new();
/// Serialises installing and taking the handler.
static INSTALL: Mutex<()> = Mutex::new(());

thread_local! {
    /// The thread is in our SIGBUS handler (`State::enqueue` never grows
    /// a list then). Const-initialised and without a destructor: reading
    /// it allocates nothing.
    static IN_HANDLER: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is in the SIGBUS handler.
pub(super) fn in_handler() -> bool {
    IN_HANDLER.with(|c| c.get())
}

/// Page buffers for faults resolved in signal handlers, made with the
/// pager: slot `i` is `pages` pages at `buf.ptr + i * pages * PAGE_SIZE`,
/// free while bit `i` of `free` is set.
pub(super) struct BufPool {
    buf: PageBuf,
    pages: usize,
    free: AtomicU64,
}

// SAFETY: the pool's memory is handed to one thread at a time (a slot is
// taken by clearing its bit with a compare-and-swap and given back by
// setting it), and PageBuf's pointer is only an address.
unsafe impl Send for BufPool {}
// SAFETY: as above.
unsafe impl Sync for BufPool {}

impl BufPool {
    pub(super) fn new(pages: usize) -> BufPool {
        BufPool {
            buf: PageBuf::new(pages * BUF_SLOTS),
            pages,
            free: AtomicU64::new(u64::MAX),
        }
    }

    /// A free slot as a page buffer (not to be dropped: give it back with
    /// [`BufPool::put`]), or None if all are taken.
    fn take(&self) -> Option<(usize, ManuallyDrop<PageBuf>)> {
        // Acquire: the slot's last user gave it back with Release.
        let mut f = self.free.load(Ordering::Acquire);
        loop {
            if f == 0 {
                return None;
            }
            let i = f.trailing_zeros() as usize;
            match self.free.compare_exchange_weak(
                f,
                f & !(1 << i),
                Ordering::Acquire,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    let ptr = self.buf.addr(i * self.pages).cast_mut();
                    let pages = self.pages;
                    return Some((i, ManuallyDrop::new(PageBuf { ptr, pages })));
                }
                Err(now) => f = now,
            }
        }
    }

    fn put(&self, i: usize) {
        // Release: what this thread wrote to the slot happens before the
        // next taker's use.
        self.free.fetch_or(1 << i, Ordering::Release);
    }
}

/// Makes `sh` the pager the SIGBUS handler serves, installing the handler
/// the first time.
pub(super) fn claim_handler(sh: &Arc<PagerCore>) -> Result<(), PagerError> {
    if !cfg!(target_arch = "x86_64") {
        return Err(PagerError::InThreadUnsupported);
    }
    let _g = INSTALL.lock();
    if OLD.get().is_none() {
        let old = sys::install_sigbus(on_sigbus).map_err(PagerError::Sigaction)?;
        let _ = OLD.set(old);
    }
    let me = Arc::as_ptr(sh).cast_mut();
    PAGER
        .compare_exchange(std::ptr::null_mut(), me, Ordering::SeqCst, Ordering::SeqCst)
        .map(|_| ())
        .map_err(|_| PagerError::InThreadTaken)
}

/// The pager `sh` goes away: the handler serves it no more, and no handler
/// still uses it when this returns.
pub(super) fn release_handler(sh: &PagerCore) {
    let me = (sh as *const PagerCore).cast_mut();
    if PAGER
        .compare_exchange(me, std::ptr::null_mut(), Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
    {
        // A handler that read the pointer before the swap counted itself
        // first (SeqCst on both sides).
        while USERS.load(Ordering::SeqCst) > 0 {
            std::thread::yield_now();
        }
    }
}

/// In a forked child: only the forking thread lives on, and it is in no
/// handler; what the parent's other threads counted or held is void.
pub(super) fn forget_parent_handlers(sh: &PagerCore) {
    USERS.store(0, Ordering::SeqCst);
    sh.sleepers.store(0, Ordering::SeqCst);
    if let Some(pool) = &sh.bufs {
        // Slots the parent's other threads held are nobody's here.
        pool.free.store(u64::MAX, Ordering::SeqCst);
    }
}

/// In a forked child (its hook, one thread): a pager the child did not
/// take over is served no more (its regions are plain memory here, and
/// its locks may be held by the parent's threads that are gone).
pub(super) fn forget_foreign_pager() {
    let p = PAGER.load(Ordering::SeqCst);
    // SAFETY: PAGER points at a live pager (a child's copy of the
    // parent's, which lives on in it: the hooks keep their references).
    if !p.is_null() && !unsafe { &*p }.ours() {
        PAGER.store(std::ptr::null_mut(), Ordering::SeqCst);
    }
}

/// The SIGBUS handler.
extern "C" fn on_sigbus(sig: i32, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let saved = sys::errno_value();
    // SAFETY: the kernel's arguments to this SA_SIGINFO handler.
    let bf = unsafe { sys::bus_fault(info, ctx) };
    if bf.adrerr {
        USERS.fetch_add(1, Ordering::SeqCst);
        let p = PAGER.load(Ordering::SeqCst);
        // SAFETY: a pager clears PAGER and then waits for USERS to drain
        // before it goes away, and this handler counted itself in USERS
        // before it read the pointer: the core lives until we are done.
        let handled = !p.is_null() && unsafe { &*p }.fault_in_thread(bf);
        USERS.fetch_sub(1, Ordering::SeqCst);
        if handled {
            sys::set_errno(saved);
            return;
        }
    }
    if let Some(old) = OLD.get() {
        // SAFETY: the arguments of this handler, passed on.
        unsafe { sys::chain_signal(old, sig, info, ctx) };
    }
    sys::set_errno(saved);
}

impl PagerCore {
    /// Resolves (or waits for) the fault behind a SIGBUS, on the faulting
    /// thread. False: not ours (not in a region of this pager, or in a
    /// forked child that did not take the pager over); the signal is
    /// chained.
    fn fault_in_thread(&self, bf: sys::BusFault) -> bool {
        // (A forked child that did not take the pager over cleared PAGER:
        // see `forget_foreign_pager`; no getpid here.)
        let addr = bf.addr & !(PAGE_SIZE - 1);
        let Some(pool) = &self.bufs else {
            return false;
        };
        let Some((slot, mut buf)) = pool.take() else {
            // Every buffer is in use: run the access again, unless the
            // address is in no region.
            let ours = lookup(&self.state.lock().segs, addr).is_some();
            sys::yield_cpu();
            return ours;
        };
        IN_HANDLER.with(|c| c.set(true));
        let ours = self.resolve_here(addr, bf.write, bf.present, &mut buf);
        IN_HANDLER.with(|c| c.set(false));
        pool.put(slot);
        ours
    }

    /// One attempt at the fault at `addr` on this thread (a present page:
    /// a write-protect fault), with `buf` for its pages: resolved, or
    /// waited for (the caller then runs the access again, which faults
    /// again if it must). False: the address is in no region.
    pub(super) fn resolve_here(
        &self,
        addr: usize,
        write: bool,
        present: bool,
        buf: &mut PageBuf,
    ) -> bool {
        let mut w = Wakes::now();
        let f = Fault {
            addr,
            write,
            wp: present,
            t0: Instant::now(),
            retried: false,
        };
        // Under the dispatch lock, as a handler's faults: an event a
        // handler has read is applied before this maps a page (see
        // `handle_batch`). Released before the load, which takes it again.
        let o = {
            let _d = self.dispatch.lock();
            self.fault(f, buf, &mut w)
        };
        let o = match o {
            Outcome::Load(l) => self.finish_load(l, buf, &mut w),
            o => o,
        };
        match o {
            Outcome::Done if w.wait => self.wait_settled(w.seen),
            Outcome::Done => {}
            Outcome::Defer => {
                // The evictor makes room, reserves list capacity, or the
                // fork ends; each bumps the sequence.
                {
                    let _g = self.state.lock();
                    self.throttled.store(true, Ordering::Relaxed);
                    self.work_cv.notify_one();
                }
                self.wait_settled(w.seen);
            }
            Outcome::Again => {
                self.faults_again.fetch_add(1, Ordering::Relaxed);
                sys::yield_cpu();
            }
            Outcome::Load(_) => unreachable!("a load is finished above"),
            Outcome::Foreign => return false,
        }
        true
    }

    /// The settle sequence now (read it under the state lock before
    /// looking at a page one may wait for).
    pub(super) fn settle_now(&self) -> u32 {
        // SeqCst: ordered with the sleepers count (see `notify_settled`).
        self.settle_seq.load(Ordering::SeqCst)
    }

    /// Waits until the settle sequence moves from `seen` (at most
    /// `WAIT`).
    pub(super) fn wait_settled(&self, seen: u32) {
        // SeqCst on both counters: a settler that bumps the sequence after
        // our read of it either sees us counted and wakes us, or bumped
        // before our futex call, which then does not sleep.
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let t = Instant::now();
        futex_wait(&self.settle_seq, seen, Some(WAIT));
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        // Relaxed: counters, ordered with nothing.
        self.faults_waited.fetch_add(1, Ordering::Relaxed);
        if t.elapsed() >= WAIT {
            self.waits_timed_out.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Something a fault may wait for happened (a page settled, a load
    /// ended, room was made): bumps the settle sequence and wakes the
    /// faults waiting on it. Call after the change (under the state lock
    /// or after releasing it).
    pub(super) fn notify_settled(&self) {
        self.settle_seq.fetch_add(1, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            futex_wake(&self.settle_seq, i32::MAX);
        }
    }

    /// Wakes the faults parked on the page at `addr`: in the kernel
    /// (`UFFDIO_WAKE`), or with in-thread faults on the settle sequence.
    pub(super) fn wake_parked(&self, addr: usize) {
        self.notify_settled();
        if !self.cfg.in_thread_faults {
            let _ = self.uffd.wake(addr, PAGE_SIZE);
        }
    }

    /// Makes pages `pages` of `area` resident and writable and pins them
    /// (the evictor leaves them until [`PagerCore::unpin`]), on this thread.
    pub(crate) fn pin(&self, area: u32, pages: std::ops::Range<u64>) {
        let mut buf = PageBuf::new(self.cfg.readahead_max.min(63) + 1);
        let mut done = pages.start;
        for page in pages.clone() {
            loop {
                let mut g = self.state.lock();
                let s = &mut *g;
                let Some(addr) = PagerCore::page_addr(s, area, page) else {
                    break; // unmapped by the program: nothing to keep
                };
                let m = s.meta(area, page);
                let present = match m.st {
                    PageState::Dirty if !m.claimed && !m.zapping => {
                        m.pins += 1;
                        break;
                    }
                    PageState::Clean | PageState::Evicting | PageState::EvictAborted => !m.zapping,
                    PageState::Discarding => true,
                    _ => false,
                };
                drop(g);
                // As a write fault on the page would be, here: loaded or
                // unprotected (`Dirty`), or waited for.
                self.resolve_here(addr, true, present, &mut buf);
            }
            done = page + 1;
        }
        debug_assert_eq!(done, pages.end);
        if self.cfg.in_thread_faults {
            // A `Dirty` page may still be write-protected (mapped between
            // victims of a protect span, or its unprotect not yet done), or
            // gone if the program discarded it: a write from user mode
            // faults here and is resolved, where one from a system call
            // would fail with EFAULT.
            let addrs: Vec<usize> = {
                let s = self.state.lock();
                pages
                    .filter_map(|p| PagerCore::page_addr(&s, area, p))
                    .collect()
            };
            for a in addrs {
                sys::touch_for_write(a);
            }
        }
    }

    /// The most pages one pin may hold: half the budget (pinned pages are
    /// resident and cannot make room for faults).
    pub(crate) fn pin_limit(&self) -> usize {
        self.cfg.budget_pages / 2
    }

    /// Drops a pin of each page of `pages`; the last one queues a resident
    /// page again (the evictor dropped its list entry while pinned).
    pub(crate) fn unpin(&self, area: u32, pages: std::ops::Range<u64>) {
        let mut s = self.state.lock();
        for page in pages {
            let Some(m) = s
                .areas
                .get_mut(&area)
                .and_then(|a| a.meta.get_mut(page as usize))
            else {
                continue;
            };
            m.pins = m.pins.saturating_sub(1);
            if m.pins == 0 && matches!(m.st, PageState::Dirty | PageState::Clean) && !m.claimed {
                let active = m.active;
                s.enqueue(area, page, active);
            }
        }
    }
}
