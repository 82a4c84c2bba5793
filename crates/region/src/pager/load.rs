//! Loads: a stored page brought back with no lock held across the store's
//! read, its decompression or decryption, or the pauses between retries.
//!
//! The steps (as the crate documentation numbers them, "Loads"):
//! 1. *start* (state lock; `fault.rs` or the fork prefault): the page, and
//!    for a fault its run of stored followers, becomes `Loading`. It
//!    counts as resident, so the budget is reserved, and its `qgen` is
//!    bumped: that value is the load's *ticket*. A `Loading` page is on no
//!    list, so the evictor never picks it; it is resident, so no discard
//!    span covers it; a fault on it is parked.
//! 2. *load* (no lock): `PageStore::load` with `LoadMode::Keep`, retried
//!    after 1 and 4 ms if it fails. Meanwhile a remove or unmap event or
//!    the region's drop may take the page (it leaves `Loading`, and every
//!    way out bumps `qgen`: the ticket no longer matches), and a remap may
//!    move it (its address no longer maps to it). Two handlers may be in
//!    this step at once, and the evictor goes on.
//! 3. *map* (dispatch lock, then state lock): only a page still `Loading`
//!    with the load's ticket, still at the address it was loaded for, is
//!    mapped (`UFFDIO_COPY`) and committed (`Clean` or `Dirty`, on a
//!    list). The dispatch lock is what makes this safe: the program's
//!    `MADV_DONTNEED` zaps the page once a handler has *read* its remove
//!    event, and an event is read and handled under that lock; holding it
//!    from the re-check to the copy, no event is read in between, so no
//!    copy lands after a discard it did not see. A page that fails the
//!    re-check is the event's: the loaded bytes are thrown away, the
//!    pages still ours go back to `Stored` (the store kept them), parked
//!    faults are woken, and the faulting thread is woken to fault again
//!    against the page as it is now.

use super::config::VictimPolicy;
use super::handler::Dispatch;
use super::state::{lookup, PageState, State};
use super::types::{Fault, Load, Outcome, PageBuf, Wakes};
use super::PagerCore;
use crate::store::{LoadError, LoadMode, Loaded};
use crate::sys::{feature, PAGE_SIZE};
use std::time::{Duration, Instant};
use uzswap_os::lock::MutexGuard;

/// Tries of a load that must succeed before the access gets SIGBUS (pauses
/// of 1 and 4 ms between them).
const LOAD_ATTEMPTS: usize = 3;

impl PagerCore {
    /// Loads a stored page that must come back (the faulting page, a page
    /// the fork hook brings back), with no lock held. A failed read or
    /// check is tried again a few times with a short pause: the device may
    /// have failed once, or a read may have been torn; the alternative is
    /// SIGBUS for the program. A page that keeps failing is reported as
    /// failed, never made up. Readahead followers do not come here: they
    /// just stay stored. `retries` counts the pauses.
    fn load_stored(
        &self,
        area: u32,
        page: u64,
        buf: &mut [u8],
        retries: &mut u64,
    ) -> Result<Loaded, LoadError> {
        let mut pause = Duration::from_millis(1);
        for _ in 1..LOAD_ATTEMPTS {
            match self.store.load(area, page, buf, LoadMode::Keep) {
                Err(LoadError::Io(_) | LoadError::Corrupt) => {
                    *retries += 1;
                    std::thread::sleep(pause);
                    pause *= 4;
                }
                r => return r,
            }
        }
        self.store.load(area, page, buf, LoadMode::Keep)
    }

    /// Step 2 for the first page of `l` (no lock held: what may change
    /// meanwhile is in the module docs, and the caller re-checks it with
    /// `load_owns`), then the locks of step 3: dispatch first (lock order),
    /// so that no event is read until the copy is done, then state.
    fn load_then_lock(
        &self,
        l: &Load,
        buf: &mut PageBuf,
    ) -> (
        Result<Loaded, LoadError>,
        MutexGuard<'_, Dispatch>,
        MutexGuard<'_, State>,
    ) {
        let mut retries = 0;
        let r = self.load_stored(l.area, l.page, buf.page(0), &mut retries);
        let d = self.dispatch.lock();
        let mut s = self.state.lock();
        s.stats.load_retries += retries;
        (r, d, s)
    }

    /// Steps 2 and 3 of a fault's load: the faulting page is loaded and
    /// mapped alone, so that its thread is woken at once; then the
    /// followers are loaded and mapped with one `UFFDIO_COPY`. Call with no
    /// pager lock held. Returns `Again` when the copy met EAGAIN (the pages
    /// are `Stored` again and the fault is to be retried).
    pub(super) fn finish_load(&self, l: Load, buf: &mut PageBuf, w: &mut Wakes) -> Outcome {
        let (f, area, page) = (l.f, l.area, l.page);
        let n = l.n;
        let (r, d, mut g) = self.load_then_lock(&l, buf);
        let s = &mut *g;
        if !s.load_owns(&l, 0, true) {
            // An event or the region's drop took the page, or a remap moved
            // it: the bytes are stale. The thread faults again and meets
            // the page as it is now.
            self.unload(s, &l, 0..n, w);
            drop(g);
            drop(d);
            w.wake(self, f.addr, PAGE_SIZE);
            w.finish(self);
            return Outcome::Done;
        }
        let src = match r {
            Ok(src) => src,
            Err(_) => {
                s.stats.load_errors += 1;
                fail_access(self, w, f.addr);
                self.unload(s, &l, 0..n, w);
                drop(g);
                drop(d);
                w.finish(self);
                return Outcome::Done;
            }
        };
        // A write fault gets its page writable (the store's copy is dropped
        // at commit); with `keep_clean` everything else is mapped
        // write-protected and clean, so evicting it again needs no store;
        // without it, every page comes back writable and its copy dropped.
        let tc = Instant::now();
        let keep = self.cfg.keep_clean;
        // SAFETY: buf page 0 holds the loaded bytes.
        match unsafe { w.copy(&self.uffd, f.addr, buf.addr(0), PAGE_SIZE, keep && !f.write) } {
            Ok(()) => {}
            Err(e) if e.errno == libc::EEXIST => {
                // Mapped already: nothing was copied, so nobody was woken.
                w.wake(self, f.addr, PAGE_SIZE);
            }
            Err(e) => {
                // EAGAIN: an event is being delivered; retry the fault.
                // Anything else (ENOENT: the range is gone): done.
                self.unload(s, &l, 0..n, w);
                drop(g);
                drop(d);
                w.finish(self);
                return if e.errno == libc::EAGAIN {
                    Outcome::Again
                } else {
                    Outcome::Done
                };
            }
        }
        s.lat_copy.record(tc.elapsed().as_nanos() as u64);
        s.lat_store.record(f.t0.elapsed().as_nanos() as u64);
        let distance = s.evict_clock.wrapping_sub(s.meta(area, page).evicted_at) as usize;
        let activate = self.cfg.policy == VictimPolicy::Workingset && distance <= s.limit;
        s.stats.refaults += 1;
        if activate {
            s.stats.refaults_activated += 1;
        }
        if distance <= s.limit / 8 {
            s.stats.refaults_near += 1;
        }
        s.refault_distances.record(distance as u64);
        self.map_loaded(s, &l, 0, !keep || f.write, activate, w);
        match src {
            Loaded::Pool => s.stats.faults_pool += 1,
            Loaded::Backing => s.stats.faults_backing += 1,
            Loaded::SameFilled => s.stats.faults_same_filled += 1,
        }
        s.areas.get_mut(&area).expect("area").ra.next = page + 1;
        s.stats.peak_resident_pages = s.stats.peak_resident_pages.max(s.charged() as u64);
        self.kick(s, w);
        drop(g);
        drop(d);
        w.finish(self);
        if n > 1 {
            self.finish_readahead(&l, buf, w);
        }
        Outcome::Done
    }

    /// Steps 2 and 3 for the followers of a load whose faulting page is
    /// mapped. A follower that does not load, or is no longer the load's,
    /// ends the run mapped; the rest stay (or become again) `Stored`.
    fn finish_readahead(&self, l: &Load, buf: &mut PageBuf, w: &mut Wakes) {
        let n = l.n;
        // 2. Load, no lock held (as for the faulting page).
        let mut got = 1;
        while got < n
            && self
                .store
                .load(l.area, l.page + got as u64, buf.page(got), LoadMode::Keep)
                .is_ok()
        {
            got += 1;
        }
        // 3. Map what is still ours, under the same locks.
        let d = self.dispatch.lock();
        let mut g = self.state.lock();
        let s = &mut *g;
        let mut run = 1;
        while run < got && s.load_owns(l, run, true) {
            run += 1;
        }
        let keep = self.cfg.keep_clean;
        let mut mapped = 1;
        if run > 1 {
            // SAFETY: buf pages 1..run hold loaded bytes.
            match unsafe {
                w.copy(
                    &self.uffd,
                    l.f.addr + PAGE_SIZE,
                    buf.addr(1),
                    (run - 1) * PAGE_SIZE,
                    keep,
                )
            } {
                Ok(()) => mapped = run,
                // Partly done (EAGAIN, EEXIST): the rest go back to
                // `Stored`, and the store still holds them (Keep).
                Err(e) => mapped = 1 + e.done / PAGE_SIZE,
            }
        }
        for i in 1..mapped {
            self.map_loaded(s, l, i, !keep, false, w);
        }
        self.unload(s, l, mapped..n, w);
        s.stats.readahead_pages += (mapped - 1) as u64;
        s.areas.get_mut(&l.area).expect("area").ra.next = l.page + mapped as u64;
        s.stats.peak_resident_pages = s.stats.peak_resident_pages.max(s.charged() as u64);
        self.kick(s, w);
        drop(g);
        drop(d);
        w.finish(self);
    }

    /// Commits page `i` of load `l`, just mapped (`Dirty` when `dirty`,
    /// its store entry dropped; else `Clean`), and wakes faults parked on
    /// it while it loaded.
    fn map_loaded(
        &self,
        s: &mut State,
        l: &Load,
        i: usize,
        dirty: bool,
        active: bool,
        w: &mut Wakes,
    ) {
        let p = l.page + i as u64;
        self.load_ended(s);
        let m = s.meta(l.area, p);
        m.st = if dirty {
            PageState::Dirty
        } else {
            PageState::Clean
        };
        let parked = std::mem::take(&mut m.parked);
        if dirty {
            self.store.invalidate(l.area, p);
        }
        s.enqueue_new(l.area, p, active);
        if parked {
            w.wake(self, l.f.addr + i * PAGE_SIZE, PAGE_SIZE);
        }
    }

    /// One page of a load ended: the fork hook waits for the last.
    fn load_ended(&self, s: &mut State) {
        s.loading -= 1;
        if s.loading == 0 && s.forking {
            self.done_cv.notify_all();
        }
    }

    /// Ends load `l` for its pages `range`, unmapped. A page still the
    /// load's is `Stored` again (loads use `LoadMode::Keep`: the store kept
    /// its entry) and faults parked on it are woken; one taken meanwhile
    /// belongs to whoever took it (it was handled as for `Stored`).
    fn unload(&self, s: &mut State, l: &Load, range: std::ops::Range<usize>, w: &mut Wakes) {
        for i in range {
            self.load_ended(s);
            if !s.load_owns(l, i, false) {
                continue;
            }
            let p = l.page + i as u64;
            s.leave(l.area, p);
            let m = s.meta(l.area, p);
            m.st = PageState::Stored;
            if std::mem::take(&mut m.parked) {
                if let Some(addr) = PagerCore::page_addr(s, l.area, p) {
                    w.wake(self, addr, PAGE_SIZE);
                }
            }
        }
    }

    /// Brings page `page` of `area`, at `addr`, back for the fork hook:
    /// write-protected and `Clean`, through the same three steps; waits for
    /// a handler's load of it to end. Whether this call mapped it.
    pub(super) fn prefault_page(
        &self,
        addr: usize,
        area: u32,
        page: u64,
        buf: &mut PageBuf,
    ) -> bool {
        let mut w = Wakes::now();
        loop {
            let l = {
                let mut g = self.state.lock();
                let s = &mut *g;
                if lookup(&s.segs, addr) != Some((area, page)) {
                    return false;
                }
                match s.meta(area, page).st {
                    PageState::Stored => {}
                    PageState::Loading => {
                        // A handler's load: the child must see the page, so
                        // wait until that load mapped it (or gave it back,
                        // `Stored`: then it is ours to bring back).
                        drop(g);
                        std::thread::sleep(Duration::from_micros(50));
                        continue;
                    }
                    _ => return false,
                }
                let f = Fault {
                    addr,
                    write: false,
                    wp: false,
                    t0: Instant::now(),
                    retried: false,
                };
                s.start_load(f, area, page, 1)
            };
            let (r, d, mut g) = self.load_then_lock(&l, buf);
            let s = &mut *g;
            if !s.load_owns(&l, 0, true) {
                self.unload(s, &l, 0..1, &mut w);
                return false;
            }
            if r.is_err() {
                s.stats.load_errors += 1;
                self.unload(s, &l, 0..1, &mut w);
                return false;
            }
            // SAFETY: buf page 0 holds the loaded bytes.
            match unsafe { self.uffd.copy(addr, buf.addr(0), PAGE_SIZE, true, false) } {
                Err(e) if e.errno == libc::EAGAIN => {
                    // An event is pending: let a handler read it (it needs
                    // the dispatch lock to get there), then start again.
                    self.unload(s, &l, 0..1, &mut w);
                    drop(g);
                    drop(d);
                    std::thread::sleep(Duration::from_micros(50));
                    continue;
                }
                Err(e) if e.errno != libc::EEXIST => {
                    self.unload(s, &l, 0..1, &mut w);
                    return false;
                }
                _ => {}
            }
            self.map_loaded(s, &l, 0, false, false, &mut w);
            return true;
        }
    }
}

/// A load failed: the access must not see made-up data. Map a poison
/// marker (the access gets SIGBUS, as on a swap read error) if the kernel
/// has it, else zeros.
fn fail_access(sh: &PagerCore, w: &mut Wakes, addr: usize) {
    if sh.uffd.features() & feature::POISON != 0 {
        let r = sh.uffd.poison(addr, PAGE_SIZE, w.defer);
        w.resolved(addr, &r, PAGE_SIZE);
        if r.is_ok() {
            return;
        }
    }
    let _ = w.zeropage(&sh.uffd, addr);
}
