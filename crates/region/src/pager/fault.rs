//! Resolving one fault: zeros for a page never stored, the start of a load
//! (finished in `load.rs`, with no lock held) for a stored one,
//! unprotection for a write to a clean page, parking for a page the
//! evictor or a load is working on.

use super::state::{lookup, PageState, State, IN_THREAD_SPARE, MAX_IN_THREAD_WINDOW};
use super::types::{Fault, Outcome, PageBuf, Wakes, MAX_LOAD};
use super::PagerCore;
use crate::sys::{self, PAGE_SIZE};

impl PagerCore {
    /// Resolves one fault. Never blocks on the evictor. Wakes the faulting
    /// thread as `w` says.
    pub(super) fn fault(&self, f: Fault, buf: &mut PageBuf, w: &mut Wakes) -> Outcome {
        let mut g = self.state.lock();
        let s = &mut *g;
        w.seen = self.settle_now();
        let Some((area, page)) = lookup(&s.segs, f.addr) else {
            if self.cfg.in_thread_faults {
                // A SIGBUS at an address of no region: not ours, it goes to
                // the previous handler.
                return Outcome::Foreign;
            }
            // Not ours (grown by mremap, or a region being dropped): serve
            // it as plain memory.
            s.stats.faults_foreign += 1;
            drop(g);
            let r = if f.wp {
                w.unprotect(&self.uffd, f.addr)
            } else {
                w.zeropage(&self.uffd, f.addr)
            };
            return match r {
                Ok(()) => Outcome::Done,
                Err(e) => self.failed_map(&e, w, f.addr),
            };
        };
        let m = *s.meta(area, page);
        if self.cfg.in_thread_faults && s.queue_spare() < s.loading + IN_THREAD_SPARE {
            // In a signal handler, a page is queued only into capacity
            // reserved beforehand: wait for the evictor to reserve more.
            return Outcome::Defer;
        }
        if f.wp {
            return self.fault_wp(s, f.addr, area, page, m.st, w);
        }
        if m.zapping {
            park(s, area, page, w);
            return Outcome::Done;
        }
        if let Some(k) = s.own_at(f.addr) {
            // Between victims of a discard in flight: wait for it. (Listed
            // once per fault: waking twice is harmless, never waking not.)
            // In-thread, the span's end bumps the settle sequence: nothing
            // is listed (a signal handler must not grow the list).
            if self.cfg.in_thread_faults {
                w.wait = true;
                s.stats.faults_parked += 1;
            } else {
                park(s, area, page, w);
                s.own[k].parked.push(f.addr & !(PAGE_SIZE - 1));
            }
            return Outcome::Done;
        }
        match m.st {
            PageState::Dirty | PageState::Clean => {
                // Usually resolved already (by a readahead or an earlier
                // message): waking is enough. But if the program's own
                // MADV_DONTNEED took the page after its remove event was
                // handled and a fault had mapped it again, nothing is
                // mapped and waking alone would fault again forever; the
                // contents were discarded by the program, so zeros are
                // right. The second fault in a row tells (`woken`).
                if !std::mem::replace(&mut s.meta(area, page).woken, true) {
                    drop(g);
                    w.wake(self, f.addr, PAGE_SIZE);
                    return Outcome::Done;
                }
                match w.zeropage(&self.uffd, f.addr) {
                    Ok(()) => {
                        // Mapped again as zeros: no copy may stand for it.
                        s.stats.faults_rezeroed += 1;
                        if m.st == PageState::Clean {
                            self.store.invalidate(area, page);
                            s.meta(area, page).st = PageState::Dirty;
                        }
                    }
                    Err(e) => return self.failed_map(&e, w, f.addr),
                }
                Outcome::Done
            }
            PageState::Evicting | PageState::EvictAborted => {
                self.rezero_under_eviction(s, f, buf, w)
            }
            PageState::Discarding => {
                park(s, area, page, w);
                Outcome::Done
            }
            PageState::Loading => {
                // Another handler loads it: it wakes this fault when done.
                s.meta(area, page).parked = true;
                w.wait = true;
                Outcome::Done
            }
            PageState::Absent => self.fault_absent(s, f, (area, page), m.claimed, buf, w),
            PageState::Stored => self.fault_stored(s, f, area, page),
        }
    }

    /// A write-protect fault at `addr`, on page `page` of `area` in state
    /// `st` (state lock held).
    fn fault_wp(
        &self,
        s: &mut State,
        addr: usize,
        area: u32,
        page: u64,
        st: PageState,
        w: &mut Wakes,
    ) -> Outcome {
        match st {
            PageState::Clean => {
                // The store's copy goes stale with this write.
                self.store.invalidate(area, page);
                let mm = s.meta(area, page);
                mm.st = PageState::Dirty;
                mm.referenced = true;
                s.stats.faults_wp += 1;
                // Under the state lock (as every unprotect of a fault):
                // see `unprotect_once`.
                return self.unprotect_once(w, addr);
            }
            PageState::Evicting => {
                s.meta(area, page).st = PageState::EvictAborted;
                park(s, area, page, w);
            }
            // Loading: not mapped yet, or the write would not fault;
            // it goes once the load mapped the page (or gave it up).
            PageState::EvictAborted | PageState::Discarding | PageState::Loading => {
                park(s, area, page, w);
            }
            PageState::Dirty => {
                return self.unprotect_once(w, addr);
            }
            PageState::Absent | PageState::Stored => {
                // A write-protect marker left on a page that is not
                // present (it was discarded or evicted while protected):
                // waking alone would fault again forever. Clearing the
                // marker turns the retry into a missing-page fault,
                // served from the store (or as zeros). Under the lock
                // too: a load that maps the page meanwhile maps it
                // protected and `Clean`, and must stay so.
                return self.unprotect_once(w, addr);
            }
        }
        Outcome::Done
    }

    /// A missing fault on a page never stored (`Absent`; `claimed`: an
    /// eviction chose it), state lock held: held back while the budget is
    /// full, else mapped as zeros with its zero run.
    fn fault_absent(
        &self,
        s: &mut State,
        f: Fault,
        (area, page): (u32, u64),
        claimed: bool,
        buf: &mut PageBuf,
        w: &mut Wakes,
    ) -> Outcome {
        if s.charged() >= s.limit && !claimed && !s.store_full {
            if !f.retried {
                s.stats.faults_throttled += 1;
            }
            return Outcome::Defer;
        }
        let n = self.zero_run(s, f.addr, area, page);
        let mapped = match self.map_zeros(w, f, n, buf) {
            Ok(mapped) => mapped,
            // ENOENT: the range is gone (an unmap event of the same
            // batch was applied first).
            Err(e) => return self.failed_map(&e, w, f.addr),
        };
        s.areas.get_mut(&area).expect("area").zr.next = page + mapped as u64;
        s.note_zeros(f.addr, mapped);
        for i in 0..mapped as u64 {
            s.meta(area, page + i).st = PageState::Dirty;
            s.enqueue_new(area, page + i, false);
        }
        s.resident += mapped;
        s.stats.faults_zero += 1;
        s.stats.zero_readahead_pages += mapped as u64 - 1;
        s.stats.peak_resident_pages = s.stats.peak_resident_pages.max(s.charged() as u64);
        s.lat_zero.record(f.t0.elapsed().as_nanos() as u64);
        self.kick(s, w);
        Outcome::Done
    }

    /// A missing fault on a dirty victim the evictor has not dropped (not
    /// `zapping`, in no span of its own): the kernel dropped the page
    /// behind the pager's back, which the program's discard does when its
    /// zap comes after a fault mapped the page again (see
    /// `PagerCore::handle_batch`). The fault may be the evictor's own read of
    /// the page, which would wait for ever parked. Zeros are what a
    /// discarded page reads: mapped write-protected, so that a write still
    /// meets the eviction (and aborts it) and the evictor stores zeros. A
    /// stale message of a page mapped since meets EEXIST and is woken.
    fn rezero_under_eviction(
        &self,
        s: &mut State,
        f: Fault,
        buf: &mut PageBuf,
        w: &mut Wakes,
    ) -> Outcome {
        buf.page(0).fill(0);
        // SAFETY: buf page 0 is readable memory we own.
        match unsafe { w.copy(&self.uffd, f.addr, buf.addr(0), PAGE_SIZE, true) } {
            Ok(()) => {
                s.stats.faults_rezeroed += 1;
                Outcome::Done
            }
            Err(e) => self.failed_map(&e, w, f.addr),
        }
    }

    /// A fault whose mapping ioctl at `addr` failed with `e`: EAGAIN (an
    /// event is being delivered, to be read first) retries it; anything
    /// else (EEXIST: mapped meanwhile; ENOENT: unmapped) wakes its thread,
    /// which meets what is there now.
    fn failed_map(&self, e: &sys::UffdError, w: &mut Wakes, addr: usize) -> Outcome {
        if e.errno == libc::EAGAIN {
            return Outcome::Again;
        }
        w.wake(self, addr, PAGE_SIZE);
        Outcome::Done
    }

    /// How many pages a first-touch fault at `page` maps as zeros: itself
    /// and the run of `Absent` pages after it, up to the zero readahead
    /// window (which doubles while first touches land right after the last
    /// run and halves otherwise), the free budget and the segment's end.
    /// Not into a discard in flight or a page the evictor will drop.
    ///
    /// While more than a quarter of the limit is free the window is
    /// `zero_readahead_wide`, and the run ends where eviction starts, not
    /// at the limit: so little is resident then that the run's own pages
    /// would be the oldest on the list, and the evictor it woke would take
    /// them before the program reached them (seen: the first 256 pages of
    /// a sequential fill in 256, each evicted a few pages ahead of the
    /// writing thread and faulted back).
    fn zero_run(&self, s: &mut State, addr: usize, area: u32, page: u64) -> usize {
        let max = self.cfg.zero_readahead_max;
        if max == 0 {
            return 1;
        }
        let mut window = s.areas.get_mut(&area).expect("area").zr.window(page, max);
        let free = if s.store_full {
            window
        } else {
            let free = s.limit.saturating_sub(s.charged() + 1);
            if free > s.limit / 4 {
                window = window.max(self.wide_zero_window());
                self.start_threshold(s).saturating_sub(s.charged() + 1)
            } else {
                free
            }
        };
        if window == 0 {
            return 1;
        }
        let limit = page + 1 + window.min(free) as u64;
        s.run_after(addr, area, page, limit, |m| {
            m.st == PageState::Absent && !m.claimed
        })
    }

    /// `zero_readahead_wide`, as this pager may use it.
    fn wide_zero_window(&self) -> usize {
        if self.cfg.in_thread_faults {
            self.cfg.zero_readahead_wide.min(MAX_IN_THREAD_WINDOW)
        } else {
            self.cfg.zero_readahead_wide
        }
    }

    /// Maps the faulting page of `f` and the `n - 1` untouched pages after
    /// it as zeros; returns how many pages from the faulting one on are
    /// mapped (at least 1 on success). A write fault gets a page of zeros
    /// of its own (it would copy the zero page at once), the neighbours
    /// the zero page. EEXIST for the faulting page counts as mapped.
    fn map_zeros(
        &self,
        w: &mut Wakes,
        f: Fault,
        n: usize,
        buf: &mut PageBuf,
    ) -> Result<usize, sys::UffdError> {
        let (first, rest_at, rest) = if f.write {
            buf.page(0).fill(0);
            // SAFETY: buf page 0 is readable memory we own.
            match unsafe { w.copy(&self.uffd, f.addr, buf.addr(0), PAGE_SIZE, false) } {
                Ok(()) => {}
                Err(e) if e.errno == libc::EEXIST => return Ok(1),
                Err(e) => return Err(e),
            }
            (1, f.addr + PAGE_SIZE, n - 1)
        } else {
            (0, f.addr, n)
        };
        if rest == 0 {
            return Ok(first);
        }
        // One call maps within one mapping: a run that crosses into
        // another (the program's `mprotect` splits a region, and the JVM
        // and Go keep the uncommitted rest of a heap `PROT_NONE`) fails
        // whole with ENOENT. Halved until it fits, so that a wide run still
        // maps what lies before the boundary.
        let mut rest = rest;
        let r = loop {
            let r = self.uffd.zeropage(rest_at, rest * PAGE_SIZE, w.defer);
            w.resolved(rest_at, &r, rest * PAGE_SIZE);
            match &r {
                Err(e) if e.done == 0 && e.errno == libc::ENOENT && rest > 1 => rest /= 2,
                _ => break r,
            }
        };
        match r {
            Ok(()) => Ok(first + rest),
            Err(e) if e.done > 0 => Ok(first + e.done / PAGE_SIZE),
            // Only neighbours failed: the faulting page is mapped.
            Err(_) if first == 1 => Ok(1),
            // The run met a page mapped already (EEXIST): the faulting
            // page alone, or its thread would wait for ever.
            Err(e) if rest > 1 && e.errno != libc::EAGAIN => match w.zeropage(&self.uffd, f.addr) {
                Ok(()) => Ok(1),
                Err(e) if e.errno == libc::EEXIST => Ok(1),
                Err(e) => Err(e),
            },
            Err(e) if e.errno == libc::EEXIST => Ok(1),
            Err(e) => Err(e),
        }
    }

    /// A missing fault on a stored page: step 1 of a load (see `load.rs`).
    /// The faulting page and its run of stored followers (readahead)
    /// become `Loading`, counted resident so that the budget is reserved;
    /// the caller finishes the load with [`PagerCore::finish_load`] once it
    /// released the dispatch lock.
    pub(super) fn fault_stored(&self, s: &mut State, f: Fault, area: u32, page: u64) -> Outcome {
        if s.forking {
            // The fork waits for the loads in flight to end and must not
            // see new ones: retried once it is done.
            return Outcome::Defer;
        }
        let mut free = s.limit.saturating_sub(s.charged());
        if s.store_full {
            free = free.max(1); // the budget is soft (see `store_full`)
        }
        if free == 0 {
            if !f.retried {
                s.stats.faults_throttled += 1;
            }
            return Outcome::Defer;
        }
        // Readahead window: grows while faults follow the previous window,
        // halves otherwise.
        let max = self.cfg.readahead_max;
        let window = s.areas.get_mut(&area).expect("area").ra.window(page, max);
        let limit = page + 1 + window.min(free - 1).min(MAX_LOAD - 1) as u64;
        let n = s.run_after(f.addr, area, page, limit, |m| m.st == PageState::Stored);
        Outcome::Load(s.start_load(f, area, page, n))
    }

    /// Clears write protection from a handler. EAGAIN (an event is
    /// pending, and only a handler can read it) defers the fault: the page
    /// is `Dirty` by then, so the retry unprotects again.
    ///
    /// Call with the state lock held, from the look at the page's state to
    /// the end of the ioctl. Released in between, the evictor could claim
    /// the page (`Dirty` → `Evicting`), protect it, read it and store it,
    /// and then this unprotect would undo its protection: the write goes
    /// in unseen (no fault to abort the eviction), and the page is dropped
    /// with the copy from before it, the write lost. Holding the lock, the
    /// claim comes before the look (the fault sees `Evicting` and parks)
    /// or after the unprotect (the evictor's protection then stands, and
    /// a write faults and aborts it). The lock is held across the ioctl
    /// alone, as for the `UFFDIO_COPY` of a first-touch fault; it returns
    /// EAGAIN rather than wait for an event to be read.
    pub(super) fn unprotect_once(&self, w: &mut Wakes, addr: usize) -> Outcome {
        #[cfg(feature = "testing")]
        if let Some(hook) = self.cfg.test_before_unprotect {
            hook();
        }
        match w.unprotect(&self.uffd, addr) {
            Err(e) if e.errno == libc::EAGAIN => Outcome::Again,
            _ => Outcome::Done,
        }
    }
}

/// Parks the fault on page `page` of `area`: whoever settles the page wakes
/// it (in the kernel, or on the settle sequence for a fault resolved
/// in-thread, which `w.wait` tells its caller to wait on).
fn park(s: &mut State, area: u32, page: u64, w: &mut Wakes) {
    s.meta(area, page).parked = true;
    s.stats.faults_parked += 1;
    w.wait = true;
}

#[cfg(test)]
mod tests {
    use super::super::state::PageState;
    use crate::{MemStore, Pager, PagerConfig, PAGE_SIZE};
    use std::sync::Arc;
    use std::time::Duration;

    /// A page the pager holds `Dirty` that the kernel dropped (the
    /// program's discard zapped it after a fault mapped it again; made here
    /// by hand) is evicted as zeros: the evictor's own read of it faults,
    /// and that fault must not wait for the eviction. Its neighbours keep
    /// their contents.
    #[test]
    fn a_dirty_page_the_kernel_dropped_is_evicted_as_zeros() {
        let pager = Pager::new(Arc::new(MemStore::new()), PagerConfig::new(64)).unwrap();
        let r = pager.region(16 * PAGE_SIZE).unwrap();
        let base = r.as_ptr();
        for p in 0..16 {
            // SAFETY: inside the live region, used by this thread alone.
            unsafe { *base.add(p * PAGE_SIZE) = 7 };
        }
        // The program's discard of page 3, applied (`Absent`) ...
        // SAFETY: one page of the live region; its contents may go.
        unsafe { crate::sys::dontneed(base as usize + 3 * PAGE_SIZE, PAGE_SIZE) }.unwrap();
        let end = std::time::Instant::now() + Duration::from_secs(5);
        while r.page_state(3) != Some(PageState::Absent) {
            assert!(
                std::time::Instant::now() < end,
                "the remove event was never applied"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // ... then the page made `Dirty` as a fault mapping it before the
        // zap would have.
        {
            let mut s = pager.owner.sh.state.lock();
            let m = s.meta(r.area(), 3);
            m.st = PageState::Dirty;
            s.resident += 1;
            s.enqueue_new(r.area(), 3, false);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|sc| {
            sc.spawn(|| tx.send(r.evict(0..16)).unwrap());
            // A parked read of the evictor's would never return: abort
            // rather than hang the test run.
            let Ok(gone) = rx.recv_timeout(Duration::from_secs(10)) else {
                eprintln!("the evictor waits for its own read of a dropped page");
                std::process::abort();
            };
            assert_eq!(gone, 16);
        });
        assert_eq!(pager.stats().faults_rezeroed, 1);
        for p in 0..16 {
            // SAFETY: inside the live region.
            let b = unsafe { *base.add(p * PAGE_SIZE) };
            assert_eq!(b, if p == 3 { 0 } else { 7 }, "page {p}");
        }
        pager.check_invariants().unwrap();
    }
}
