//! Fork: the `pthread_atfork` hooks (see the crate docs, "Fork").
//!
//! What a child gets is [`ForkChild`]'s choice, by default `Managed`: the
//! child takes over its copy of the pager. Its regions lost their
//! userfaultfd registration at the fork (no `UFFD_FEATURE_EVENT_FORK`, which
//! needs CAP_SYS_PTRACE), so an evicted page would read as zeros; the child
//! hook registers them again with a userfaultfd of its own before `fork()`
//! returns, and serves their faults from its copy of the store. Nothing is
//! brought back into memory for the fork.
//!
//! The steps:
//! 1. *prepare* (parent): the gate (no eviction batch in flight), then
//!    `forking` under the state lock: no new load starts (faults that would
//!    load are deferred) and the hook waits for the loads in flight to end,
//!    so that no page is half loaded at the fork. Then the dispatch, zero
//!    look, access look and state locks, held through the fork, and the store's locks
//!    (`PageStore::fork_prepare`).
//! 2. *child*: the store makes itself the child's (`PageStore::fork_child`:
//!    its own backing file, key and threads); the locks are released; the
//!    pager renews its descriptors (userfaultfd, eventfds, the staging
//!    area, the zero look's page map, the access look's files), forgets what the parent's threads
//!    were doing (messages read, parked and deferred faults: those threads
//!    are not in the child),
//!    registers every segment again, write-protects its `Clean` pages again
//!    (the fork cleared their markers); last, once every lock of every
//!    pager and store is released, the store's threads and its own start
//!    (a thread started earlier could block on a lock still held).
//! 3. *parent*: the store's locks (it waits for the child's copy of the
//!    backing file), then the pager's; `forking` ends and the deferred
//!    faults are retried.
//!
//! Invariants relied on: with the gate held no page is `Evicting`,
//! `EvictAborted` or `Discarding`, none is claimed or zapping, and the
//! evictor owns no span; with `loading == 0` none is `Loading`. So in the
//! child every page is `Absent` or `Stored` (not mapped), or `Dirty` or
//! `Clean` (mapped, a copy-on-write copy of the parent's).

use super::config::{Charge, ForkChild, FORK_ROOM_HOLD, FORK_ROOM_WAIT};
use super::state::PageState;
use super::types::PageBuf;
use super::PagerCore;
use crate::sys::{self, PAGE_SIZE};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use uzswap_os::fork::{AfterFork, Side};
use uzswap_os::lock::Mutex;

/// Every pager of the process (the hooks skip the dropped ones).
static REGISTRY: Mutex<Vec<Weak<PagerCore>>> = Mutex::new(Vec::new());
/// The pagers whose locks `fork_prepare` holds, with what this fork does
/// for each, for the parent and child hooks to release.
static FORK_HELD: Mutex<Vec<(Arc<PagerCore>, ForkChild)>> = Mutex::new(Vec::new());
/// Whether the child of the last fork took over a pager (see
/// [`fork_child_managed`]).
static LAST_MANAGED: AtomicBool = AtomicBool::new(false);

/// In a forked child (from its `pthread_atfork` child hook on): whether it
/// took over a pager. If not, its regions are plain memory, and the host
/// must not create new ones (their descriptor is the parent's).
pub fn fork_child_managed() -> bool {
    LAST_MANAGED.load(Ordering::Acquire)
}
/// A segment the child registers again: (address, area, first page,
/// length in bytes).
type ChildSeg = (usize, u32, u64, usize);

static ATFORK: std::sync::Once = std::sync::Once::new();
/// A fork is between its prepare and its parent or child hook.
static FORKING: AtomicBool = AtomicBool::new(false);

/// Lists a new pager for the fork hooks (installed with the first pager),
/// and forgets the dropped ones.
pub(super) fn register(sh: &Arc<PagerCore>) {
    let mut reg = REGISTRY.lock();
    reg.retain(|w| w.strong_count() > 0);
    reg.push(Arc::downgrade(sh));
    ATFORK.call_once(|| {
        sys::atfork(fork_prepare, fork_parent, fork_child).expect("pthread_atfork");
    });
}

/// The gate, and with `Managed` the dispatch and state locks, are taken
/// without a guard here and released in `fork_parent` or `fork_child`,
/// other calls of the same thread: the guards are forgotten and the locks
/// released by hand there.
unsafe extern "C" fn fork_prepare() {
    // One fork at a time: a second forking thread waits here.
    while FORKING
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
    // Held across the fork, as every lock of the pagers: a thread making
    // a pager at the fork would leave it taken in the child, whose next
    // fork or pager would wait for it for ever.
    let reg = REGISTRY.lock();
    let list: Vec<Arc<PagerCore>> = reg
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|s| s.cfg.fork != ForkChild::Unmanaged && s.ours())
        .collect();
    let mut held = Vec::with_capacity(list.len());
    for s in list {
        let mode = match s.cfg.fork {
            ForkChild::Managed if s.held_pages() < s.cfg.fork_manage_min_pages => {
                ForkChild::Prefault
            }
            m => m,
        };
        std::mem::forget(s.gate.lock());
        match mode {
            ForkChild::Prefault => {
                s.prefault_all_locked();
            }
            ForkChild::Managed => s.quiesce_for_fork(),
            ForkChild::Unmanaged => unreachable!("filtered out above"),
        }
        held.push((s, mode));
    }
    let managed = held.iter().any(|(_, m)| *m == ForkChild::Managed);
    LAST_MANAGED.store(managed, Ordering::Release);
    *FORK_HELD.lock() = held;
    std::mem::forget(reg);
}

unsafe extern "C" fn fork_parent() {
    // SAFETY: fork_prepare took it on this thread and forgot the guard.
    unsafe { REGISTRY.after_fork(Side::Parent) };
    for (s, mode) in std::mem::take(&mut *FORK_HELD.lock()) {
        if mode == ForkChild::Managed {
            // SAFETY: fork_prepare took the store's locks, and the dispatch,
            // zero look and state locks, on this thread and forgot the
            // guards.
            unsafe {
                s.store.fork_parent();
                s.state.after_fork(Side::Parent);
                if let Some(z) = &s.zero_scan {
                    z.after_fork(Side::Parent);
                }
                if let Some(a) = &s.access {
                    a.after_fork(Side::Parent);
                }
                s.dispatch.after_fork(Side::Parent);
            }
            s.state.lock().forking = false;
            // In-thread faults deferred by the fork wait on the sequence.
            s.notify_settled();
        }
        // SAFETY: fork_prepare locked the gate of every pager in FORK_HELD
        // on this thread, forgot the guard, and nothing unlocked it since.
        unsafe { s.gate.after_fork(Side::Parent) };
        let _g = s.state.lock();
        s.work_cv.notify_one();
    }
    FORKING.store(false, Ordering::Release);
}

unsafe extern "C" fn fork_child() {
    // The parent's helper threads are not here (new ones list themselves).
    uzswap_os::fork::forget_helpers();
    // The inherited descriptor of the CPU latency request is the parent's.
    uzswap_os::latency::forget_after_fork();
    // SAFETY: fork_prepare took it on this thread and forgot the guard;
    // this is the child's only thread.
    unsafe { REGISTRY.after_fork(Side::Child) };
    let held = std::mem::take(&mut *FORK_HELD.lock());
    // Every lock first, then the threads: a new thread must not park on a
    // lock whose parent waiters are still listed.
    for (s, mode) in &held {
        if *mode == ForkChild::Managed {
            // SAFETY: fork_prepare took the store's locks and the dispatch,
            // zero look and state locks on this thread and forgot the
            // guards; in the child, whose only thread runs this hook.
            let r = unsafe { s.store.fork_child() };
            if let Err(e) = r {
                take_over_failed(&e);
            }
            // SAFETY: as above.
            unsafe {
                s.state.after_fork(Side::Child);
                if let Some(z) = &s.zero_scan {
                    z.after_fork(Side::Child);
                }
                if let Some(a) = &s.access {
                    a.after_fork(Side::Child);
                }
                s.dispatch.after_fork(Side::Child);
                s.work_cv.after_fork(Side::Child);
                s.done_cv.after_fork(Side::Child);
            }
        }
        // SAFETY: as in fork_parent; the child's copy of the lock is held by
        // the (only) thread that runs this hook.
        unsafe { s.gate.after_fork(Side::Child) };
    }
    for (s, mode) in &held {
        if *mode == ForkChild::Managed {
            if let Err(e) = s.take_over() {
                take_over_failed(&e.to_string());
            }
        }
    }
    // Only now may threads start, every lock being released (a thread
    // started earlier could block on one still held).
    // The handlers first (this thread serves faults while each starts),
    // then every other thread, whose start-up may fault too.
    for (s, mode) in &held {
        if *mode == ForkChild::Managed {
            if let Err(e) = s.start_handler(true) {
                take_over_failed(&e.to_string());
            }
        }
    }
    for (s, mode) in &held {
        if *mode == ForkChild::Managed {
            let r = s
                .store
                .fork_child_start()
                .and_then(|()| s.start_others().map_err(|e| e.to_string()));
            if let Err(e) = r {
                take_over_failed(&e);
            }
        }
    }
    super::inthread::forget_foreign_pager();
    // The references stay (the child's pagers live on in it or, with
    // `Prefault`, are never used): no destructor runs here.
    std::mem::forget(held);
    FORKING.store(false, Ordering::Release);
}

/// The child's copy of the pages cannot be served: it must not run on,
/// reading zeros where pages were evicted.
fn take_over_failed(e: &str) -> ! {
    sys::die(&format!(
        "uzswap: a forked child cannot take over its memory: {e}"
    ))
}

impl PagerCore {
    /// Before a fork whose child takes over (`PagerConfig::fork_room`;
    /// [`crate::Pager::make_room_for_fork`], which says when to call it):
    /// lowers the limit by the memory the child is expected to make its
    /// own at once, for [`FORK_ROOM_HOLD`] (rooms of forks in a row add
    /// up), and waits at most [`FORK_ROOM_WAIT`] for the evictor to bring
    /// the resident pages under it. The kernel charges a child's copies as
    /// it makes them and reclaims at once; here they are made by writes
    /// no fault of ours sees, so the room is made beforehand. Called with
    /// no lock held; the state lock is taken for each look.
    pub(super) fn make_room_for_fork(&self) {
        let Some(Charge(f)) = &self.cfg.fork_room else {
            return;
        };
        if self.cfg.fork != ForkChild::Managed
            || !self.ours()
            || self.held_pages() < self.cfg.fork_manage_min_pages
        {
            return;
        }
        let pages = (f() as usize).div_ceil(PAGE_SIZE);
        if pages == 0 {
            return;
        }
        let now = Instant::now();
        {
            let mut s = self.state.lock();
            let before = s.fork_room.filter(|&(_, t)| now < t).map_or(0, |(r, _)| r);
            let limit = s.limit.saturating_sub(pages).max(self.cfg.floor());
            let made = s.limit.saturating_sub(limit);
            s.fork_room = Some((before + made, now + FORK_ROOM_HOLD));
            s.limit = limit;
            s.stats.limit_pages = limit as u64;
            self.work_cv.notify_one();
        }
        let deadline = now + FORK_ROOM_WAIT;
        loop {
            {
                let s = self.state.lock();
                if s.store_full || s.charged() <= self.start_threshold(&s) {
                    return;
                }
            }
            if Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Pages the pager holds: resident and stored.
    fn held_pages(&self) -> u64 {
        let resident = self.state.lock().resident as u64;
        resident + self.store.stats().pages
    }

    /// Step 1 with `Managed` (gate held): no load starts, those in flight
    /// end, then the dispatch, state and store locks are taken and kept.
    fn quiesce_for_fork(&self) {
        {
            let mut s = self.state.lock();
            s.forking = true;
            while s.loading > 0 {
                self.done_cv.wait(&mut s);
            }
        }
        // Taken in the lock order (the pager module's documentation): the
        // gate is held already. No load can start in between: `forking`
        // defers them.
        // The zero look is the evictor's, which takes it outside the gate
        // (before each batch and while idle): held across the fork so that
        // the child never finds it taken by a thread it does not have (its
        // evictor would wait on it for ever, and the child's first fault,
        // held back for room, with it).
        std::mem::forget(self.dispatch.lock());
        if let Some(z) = &self.zero_scan {
            std::mem::forget(z.lock());
        }
        // The access look likewise (a sample holds it outside the gate).
        if let Some(a) = &self.access {
            std::mem::forget(a.lock());
        }
        std::mem::forget(self.state.lock());
        self.store.fork_prepare();
    }

    /// Step 2 in the child (only this thread runs; no pager lock is held),
    /// but for the threads, which the hook starts last.
    fn take_over(self: &Arc<Self>) -> std::io::Result<()> {
        self.pid.store(sys::getpid(), Ordering::Relaxed);
        // The parent's threads are not here: their handles must never be
        // joined from this process. The list is not one of the locks the
        // prepare hook takes (a pager being dropped holds it while it joins
        // its threads, which may wait for the gate the hook holds), so a
        // thread of the parent may have held it at the fork: a pager
        // starting, or being dropped. Then the list is left unread (its
        // handles leak, as forgotten ones do). Waiting for it instead would
        // hang the child for ever when another thread of the parent was
        // dropping its pager (`fork_during_heavy_eviction_loses_nothing`
        // forks while other tests of its binary drop theirs).
        // SAFETY: this is the child of a fork, run by its only thread (the
        // fork hook).
        let parents = unsafe { uzswap_os::fork::take_in_child(&self.threads) }.unwrap_or_default();
        for t in parents {
            std::mem::forget(t);
        }
        let step = |what: &'static str| {
            move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{what}: {e}"))
        };
        self.uffd
            .renew()
            .map_err(step("a userfaultfd of its own"))?;
        self.wake.renew().map_err(step("an eventfd"))?;
        self.stop.renew().map_err(step("an eventfd"))?;
        if let Some(st) = &self.staging {
            st.renew().map_err(step("the staging area"))?;
        }
        if let Some(z) = &self.zero_scan {
            z.lock()
                .renew()
                .map_err(step("its own page map (/proc/self/pagemap)"))?;
        }
        if let Some(a) = &self.access {
            a.lock()
                .renew()
                .map_err(step("its own smaps and clear_refs (/proc/self)"))?;
        }
        {
            let mut d = self.dispatch.lock();
            d.handoff.clear();
            d.handoff_at = None;
            d.deferred.clear();
        }
        let (segs, clean) = self.child_records();
        for (addr, _, _, len) in segs {
            self.uffd
                .register(addr, len)
                .map_err(step("registering the regions"))?;
        }
        for addr in clean {
            self.uffd
                .writeprotect(addr, PAGE_SIZE, true, false)
                .map_err(|e| std::io::Error::from_raw_os_error(e.errno))
                .map_err(step("write-protecting clean pages"))?;
        }
        self.cpu_handlers.store(0, Ordering::Relaxed);
        super::inthread::forget_parent_handlers(self);
        self.throttled.store(false, Ordering::Relaxed);
        self.again_waiting.store(false, Ordering::Relaxed);
        for c in [
            &self.faults_local,
            &self.faults_remote,
            &self.faults_again,
            &self.faults_waited,
            &self.waits_timed_out,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        Ok(())
    }

    /// In the child's take-over (state lock): the pager's state becomes the
    /// child's (no fork in progress, no parked or woken records, counters
    /// from zero). Returns the segments `(address, area, first page,
    /// length)` to register again and the addresses of the `Clean` pages
    /// to write-protect again.
    fn child_records(&self) -> (Vec<ChildSeg>, Vec<usize>) {
        let mut s = self.state.lock();
        s.forking = false;
        s.fork_room = None;
        debug_assert!(s.own.is_empty() && s.loading == 0);
        let mut clean = Vec::new();
        let segs: Vec<ChildSeg> = s
            .segs
            .iter()
            .map(|(&a, seg)| (a, seg.area, seg.first, seg.len))
            .collect();
        // Only records with something to clear are written: the
        // records are the parent's copy-on-write pages (and, where no
        // page was ever used, the zero page), so a write to each would
        // give this child a private copy of the whole table, a record
        // for every page of every reservation (6.3 MiB in each forked
        // Python worker of the fork test program), where the parent
        // holds only the records of pages it used.
        for &(addr, area, first, len) in &segs {
            let a = s.areas.get_mut(&area).expect("a segment's area");
            for i in 0..len / PAGE_SIZE {
                let m = &mut a.meta[first as usize + i];
                if m.parked || m.woken {
                    m.parked = false;
                    m.woken = false;
                }
                if m.st == PageState::Clean {
                    clean.push(addr + i * PAGE_SIZE);
                }
            }
        }
        // The counters start again: they are the child's.
        let (budget, limit) = (s.stats.budget_pages, s.stats.limit_pages);
        s.stats = crate::stats::PagerStats {
            budget_pages: budget,
            limit_pages: limit,
            ..Default::default()
        };
        s.stats.peak_resident_pages = s.charged() as u64;
        (segs, clean)
    }

    /// Brings every stored page back, write-protected and clean. The gate
    /// must be held (no eviction in flight).
    pub(super) fn prefault_all_locked(&self) -> usize {
        let mut buf = PageBuf::new(1);
        let mut n = 0;
        let todo: Vec<(usize, u32, u64)> = {
            let s = self.state.lock();
            let mut v = Vec::new();
            for (start, seg) in &s.segs {
                let a = &s.areas[&seg.area];
                for i in 0..seg.len / PAGE_SIZE {
                    let p = seg.first + i as u64;
                    if matches!(
                        a.meta[p as usize].st,
                        PageState::Stored | PageState::Loading
                    ) {
                        v.push((start + i * PAGE_SIZE, seg.area, p));
                    }
                }
            }
            v
        };
        for (addr, area, page) in todo {
            if self.prefault_page(addr, area, page, &mut buf) {
                n += 1;
            }
        }
        let mut s = self.state.lock();
        s.stats.fork_prefaults += 1;
        s.stats.fork_prefault_pages += n as u64;
        s.stats.peak_resident_pages = s.stats.peak_resident_pages.max(s.charged() as u64);
        n
    }
}
