//! The evictor thread: when to evict, which pages (`claim`), and the steps
//! of an eviction batch (`evict`), as the crate documentation numbers them.

use super::config::{Charge, VictimPolicy, CHARGE_PERIOD, IDLE_CHARGE_PERIOD};
use super::state::{lookup, OwnSpan, PageState, State, QUEUE_RESERVE};
use super::types::{Span, Victim, Wakes};
use super::PagerCore;
use crate::sys::{self, PAGE_SIZE};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often an idle evictor looks whether the program's threads have all
/// ended ([`PagerCore::end_if_program_ended`]): a read of the leader's
/// `/proc` state, and of every thread's only once the leader has exited.
const PROGRAM_LOOK_PERIOD: Duration = Duration::from_millis(200);

/// Spans of at most this many victims leave by moves (one `UFFDIO_MOVE`
/// and one TLB flush per page) rather than one `MADV_DONTNEED` (one remove
/// event through a handler and one TLB flush per span).
pub(super) const MOVE_MAX_SPAN: usize = 4;

/// The largest eviction margin, pages: eviction starts a margin below the
/// limit and stops two below it, so a process runs on average one and a
/// half margins under what it is allotted. That slack is what absorbs a
/// process's writes to pages mapped as zeros (no fault; counted only at
/// the evictor's next look) while the arbiter moves its share to another:
/// at 64 `make -j8` takes 0.94-0.96 x the time, but a `make -j2` tree
/// peaks at up to 1.07 x its budget (0.97-1.03 x at 256, 1.02 x at 128,
/// which is no faster; see `uzswap-bench tree` in docs/BENCHMARKS.md).
pub(super) const MARGIN_MAX: usize = 256;

impl PagerCore {
    /// Wakes the evictor when the resident set nears the budget (after the
    /// faulting thread, with deferred wakes).
    pub(super) fn kick(&self, s: &State, w: &mut Wakes) {
        if s.charged() > self.start_threshold(s) {
            if w.defer {
                w.kick = true;
            } else {
                self.work_cv.notify_one();
            }
        }
    }

    /// The margin at the limit now: the configured one (a 32nd of the
    /// budget) scaled down with a limit that a charge has brought far below
    /// the budget. A margin of the budget's size under a limit at the floor
    /// would stop eviction at no resident page at all, and every access of
    /// the program would fault (seen: a Python parent sharing 32 MiB with
    /// three forked workers kept 1 resident page and made 118 faults/s).
    fn margin_at(&self, limit: usize) -> usize {
        self.margin.min(limit / 16).max(1)
    }

    /// Resident pages at which eviction starts.
    pub(super) fn start_threshold(&self, s: &State) -> usize {
        s.limit.saturating_sub(self.margin_at(s.limit))
    }

    /// Resident pages at which eviction stops: never below seven eighths of
    /// the limit.
    pub(super) fn stop_threshold(&self, s: &State) -> usize {
        s.limit.saturating_sub(2 * self.margin_at(s.limit))
    }

    /// Reads the charge (if any) and moves the limit; returns the resident
    /// pages and the limit then. Called by the evictor without the state
    /// lock.
    pub(super) fn recharge(&self) -> (usize, usize) {
        self.refresh_zero_mapped();
        let Some(Charge(f)) = &self.cfg.charge else {
            let s = self.state.lock();
            return (s.charged(), s.limit);
        };
        let bytes = f();
        let budget = self.cfg.budget_pages;
        let charged = (bytes.div_ceil(PAGE_SIZE as u64) as usize).min(budget - self.cfg.floor());
        let mut s = self.state.lock();
        s.limit = budget - charged;
        match s.fork_room {
            Some((room, until)) if Instant::now() < until => {
                s.limit = s.limit.saturating_sub(room).max(self.cfg.floor());
            }
            Some(_) => s.fork_room = None,
            None => {}
        }
        // Read every period, busy or idle: where the lists' memory is
        // looked after too.
        s.trim_lists();
        s.stats.charged_bytes = bytes;
        s.stats.limit_pages = s.limit as u64;
        (s.charged(), s.limit)
    }

    /// [`PagerCore::recharge`], and the time until the next reading:
    /// [`CHARGE_PERIOD`] while the resident set moves or the limit comes
    /// down, twice the last period (up to [`IDLE_CHARGE_PERIOD`])
    /// otherwise. A limit that comes down means the arbiter of a tree is
    /// moving memory to another process, which waits until this one gives
    /// it up: the next readings must come soon. `seen` holds the last
    /// reading's resident pages and limit.
    fn recharge_paced(&self, period: Duration, seen: &mut (usize, usize)) -> Duration {
        let now = self.recharge();
        let (resident, limit) = std::mem::replace(seen, now);
        if now.0 == resident && now.1 >= limit {
            (period * 2).min(IDLE_CHARGE_PERIOD)
        } else {
            CHARGE_PERIOD
        }
    }

    /// Clears write protection from a thread other than the handler,
    /// retrying while an event is being delivered.
    pub(super) fn unprotect_retry(&self, addr: usize) {
        loop {
            match self.uffd.writeprotect(addr, PAGE_SIZE, false, false) {
                Err(e) if e.errno == libc::EAGAIN => std::thread::yield_now(),
                _ => return,
            }
        }
    }

    pub(super) fn evictor_loop(self: Arc<Self>) {
        let charging = self.cfg.charge.is_some();
        let mut charged_at = Instant::now();
        // The charge is read every `period`: CHARGE_PERIOD, longer while
        // an idle process's reading does not change (`recharge_paced`).
        let mut period = CHARGE_PERIOD;
        let mut seen = (usize::MAX, 0);
        loop {
            if !self.wait_for_work(charging, &mut charged_at, &mut period, &mut seen) {
                return;
            }
            // Evicting: the process is not idle.
            period = CHARGE_PERIOD;
            self.pause_while_store_full();
            loop {
                if charging && charged_at.elapsed() >= CHARGE_PERIOD {
                    self.recharge();
                    charged_at = Instant::now();
                }
                let gone = self.one_batch();
                if gone == 0 || self.shutdown.load(Ordering::Relaxed) {
                    break;
                }
            }
        }
    }

    /// The evictor between rounds: sleeps until the charged count passes
    /// the start threshold (true) or the pager shuts down (false), reading
    /// the charge every `period` (paced by `recharge_paced` from `seen`)
    /// and looking at zero-mapped runs while idle.
    fn wait_for_work(
        &self,
        charging: bool,
        charged_at: &mut Instant,
        period: &mut Duration,
        seen: &mut (usize, usize),
    ) -> bool {
        let mut looked = Instant::now();
        loop {
            if looked.elapsed() >= PROGRAM_LOOK_PERIOD {
                looked = Instant::now();
                self.end_if_program_ended();
            }
            {
                let mut s = self.state.lock();
                if self.shutdown.load(Ordering::Relaxed) {
                    return false;
                }
                if self.cfg.in_thread_faults && s.queue_spare() < QUEUE_RESERVE / 2 {
                    // In-thread faults queue pages into reserved
                    // capacity only; one deferred for it waits.
                    s.reserve_queues();
                    self.notify_settled();
                }
                if s.charged() > self.start_threshold(&s) {
                    return true;
                }
                if !charging {
                    if s.zero_mapped == 0 {
                        self.work_cv
                            .wait_until(&mut s, Instant::now() + PROGRAM_LOOK_PERIOD);
                        continue;
                    }
                    // Pages mapped as zeros may be written, and take
                    // memory, without a fault: look again soon.
                    self.work_cv
                        .wait_until(&mut s, Instant::now() + IDLE_CHARGE_PERIOD);
                    // The look takes the state lock itself; the loop
                    // takes it again and re-checks shutdown and the
                    // threshold.
                    drop(s);
                    self.refresh_zero_mapped();
                    continue;
                }
                // A charge can grow while nothing faults: look again
                // at the next reading. (A fault that nears the limit
                // wakes the evictor whatever the period.)
                self.work_cv.wait_until(&mut s, *charged_at + *period);
            }
            if charged_at.elapsed() >= *period {
                *period = self.recharge_paced(*period, seen);
                *charged_at = Instant::now();
            }
        }
    }

    /// Helper threads never keep a process alive: once every thread of the
    /// program has ended (`uzswap_os::threads::program_ended`), the process
    /// ends as the C library ends it when its last thread exits, with
    /// status 0 and its atexit handlers run. Called with no lock held.
    fn end_if_program_ended(&self) {
        if self.ours() && uzswap_os::threads::program_ended() {
            sys::exit_process(0);
        }
    }

    /// Before a round: if the store refused the last batch, a pause.
    fn pause_while_store_full(&self) {
        let mut s = self.state.lock();
        if s.store_full {
            // The store refused the last batch: try again after a
            // pause (the program may free memory, the pool shrink).
            // Every fault notifies the condition variable; only the
            // deadline (or shutdown) ends the pause, or the evictor
            // would offer batches to a full store at fault rate.
            let until = Instant::now() + Duration::from_millis(20);
            loop {
                if self.shutdown.load(Ordering::Relaxed)
                    || self.work_cv.wait_until(&mut s, until).timed_out()
                {
                    break;
                }
            }
        }
    }

    /// One batch of a round: looks at zero-mapped runs, samples the access
    /// signal when a sample is due, then under the gate
    /// chooses, claims and evicts up to `evict_batch` pages over the stop
    /// threshold. Returns how many left memory.
    fn one_batch(&self) -> usize {
        // Runs mapped as zeros since the last look hold no memory:
        // looked at first, and again if faults noted more before
        // the count (two looks at most a batch).
        self.refresh_zero_mapped();
        // Outside the gate: a sample reads /proc for milliseconds, and a
        // fork must not wait behind it.
        self.sample_access();
        let gate = self.gate.lock();
        let over = || {
            let s = self.state.lock();
            let n = s
                .charged()
                .saturating_sub(self.stop_threshold(&s))
                .min(self.cfg.evict_batch);
            (n, !s.zero_runs.is_empty())
        };
        let n = match over() {
            (n, true) if n > 0 => {
                self.refresh_zero_mapped();
                over().0
            }
            (n, _) => n,
        };
        let gone = if n > 0 {
            let victims = {
                let mut s = self.state.lock();
                let v = s.select(n, self.cfg.policy);
                if self.cfg.in_thread_faults && s.queue_spare() < QUEUE_RESERVE / 2 {
                    // As in `wait_for_work`: faults deferred for list
                    // capacity must not wait for the whole round.
                    s.reserve_queues();
                    self.notify_settled();
                }
                self.claim(&mut s, v)
            };
            let (gone, refused) = self.evict(victims);
            self.note_progress(refused, gone);
            gone
        } else {
            0
        };
        drop(gate);
        if self.throttled.swap(false, Ordering::Relaxed) {
            self.wake.signal();
        }
        // In-thread faults deferred for room wait on the sequence.
        self.notify_settled();
        gone
    }

    /// Step 1, *claim*: marks chosen pages as in eviction (under the state
    /// lock): `Dirty` → `Evicting`, `Clean` → `Discarding`.
    pub(super) fn claim(&self, s: &mut State, v: Vec<(u32, u64)>) -> Vec<Victim> {
        let mut out = Vec::with_capacity(v.len());
        for (area, page) in v {
            let Some(addr) = PagerCore::page_addr(s, area, page) else {
                continue;
            };
            let m = s.meta(area, page);
            if m.pins > 0 {
                // Pinned (`Region::pin`): not a victim until unpinned, which
                // queues it again.
                continue;
            }
            let clean = match m.st {
                PageState::Dirty => {
                    m.st = PageState::Evicting;
                    false
                }
                PageState::Clean => {
                    m.st = PageState::Discarding;
                    m.zapping = true;
                    true
                }
                _ => continue,
            };
            let m = s.meta(area, page);
            m.claimed = true;
            let cold = !m.warm;
            s.areas.get_mut(&area).expect("area").inflight += 1;
            out.push(Victim {
                area,
                page: page as u32,
                addr,
                clean,
                stored: false,
                discard: clean,
                unprotect: false,
                cold,
                moved: false,
            });
        }
        out
    }

    /// Records what a batch did: `refused` victims the store would not
    /// take, `gone` that left memory. A batch that freed nothing because
    /// the store refused makes the budget soft until one is taken whole,
    /// and lets held-back faults through (a batch whose victims were all
    /// written meanwhile says nothing about the store; one taken in part
    /// leaves the state as it was).
    pub(super) fn note_progress(&self, refused: usize, gone: usize) {
        let mut s = self.state.lock();
        if gone > 0 && refused == 0 {
            s.store_full = false;
        } else if gone == 0 && refused > 0 && !s.store_full {
            s.store_full = true;
            s.stats.store_full_episodes += 1;
            drop(s);
            self.throttled.store(false, Ordering::Relaxed);
            self.wake.signal();
            self.notify_settled();
        }
    }

    /// Steps 2 to 6 for claimed victims: write-protect, copy out and store,
    /// commit, drop (move or discard), settle. Runs without the state lock
    /// except to commit and settle.
    /// Returns how many left memory, and how many the store refused.
    pub(super) fn evict(&self, mut victims: Vec<Victim>) -> (usize, usize) {
        // By address: victims with no resident page between them are
        // protected and discarded with one call per span (see `OwnSpan`).
        // Each `MADV_DONTNEED` is a round trip through the handler (a
        // remove event; while it is pending the handler's copies fail with
        // EAGAIN), and each call flushes the TLB of every CPU the program
        // runs on.
        victims.sort_unstable_by_key(|v| v.addr);
        self.count_zero_mapped(&victims);
        let (gone_first, refused_first) = self.move_out(&mut victims);
        let refused = refused_first + self.protect_and_store(&mut victims);
        let (mut discards, moves) = self.commit_batch(&mut victims, refused);
        self.unprotect_aborted(&victims);
        let moved = self.drop_by_move(&victims, &moves, &mut discards);
        self.drop_by_discard(&discards);
        let gone = gone_first + self.settle_batch(&victims, discards.len() as u64, moved);
        (gone, refused)
    }

    /// Steps 2 and 3 of [`PagerCore::evict`] for the dirty victims not moved
    /// out: write-protect them a span at a time, copy each out and store
    /// it. Returns how many the store refused.
    fn protect_and_store(&self, victims: &mut [Victim]) -> usize {
        let mut refused = 0;
        let wp_spans = self.state.lock().spans(victims, |v| !v.clean && !v.moved);
        let mut buf = Vec::new();
        let mut addrs = Vec::new();
        let mut forced = sys::ForcedRead::default();
        // 2. Write-protect dirty victims. After this no CPU can write them:
        //    a write faults (WP) and the handler parks or aborts. The pages
        //    between them were not resident: protecting nothing there (one
        //    a fault mapped since is protected too, and its first write
        //    only faults and is unprotected, as any `Dirty` page's).
        // 3. Copy each out and store it.
        for span in wp_spans {
            let wp = loop {
                match self
                    .uffd
                    .writeprotect(span.lo, span.hi - span.lo, true, false)
                {
                    Err(e) if e.errno == libc::EAGAIN => std::thread::yield_now(),
                    r => break r,
                }
            };
            if wp.is_err() {
                continue;
            }
            addrs.clear();
            addrs.extend(span.victims.iter().map(|&i| victims[i].addr));
            buf.resize(addrs.len() * PAGE_SIZE, 0);
            // One read for the span; page by page if part of it is gone or
            // the program made it inaccessible (`sys::ForcedRead`: unread,
            // such a page went back to the lists and came round again and
            // again, the evictor spinning while the faults waited for room).
            let whole = sys::read_own_pages(&addrs, &mut buf).is_ok();
            for (k, &i) in span.victims.iter().enumerate() {
                let v = &mut victims[i];
                let page = &mut buf[k * PAGE_SIZE..(k + 1) * PAGE_SIZE];
                if !whole
                    && sys::read_own_pages(&[v.addr], page).is_err()
                    && forced.read_page(v.addr, page).is_err()
                {
                    continue;
                }
                if self.store_victim(v, page) {
                    v.stored = true;
                } else {
                    refused += 1;
                }
            }
        }
        refused
    }

    /// Step 4 of [`PagerCore::evict`] (state lock): `refused` is the batch's
    /// count of refused stores. Returns the spans to discard (listed in
    /// `State::own`) and the victims (indexes) to move to the staging area.
    fn commit_batch(&self, victims: &mut [Victim], refused: usize) -> (Vec<Span>, Vec<usize>) {
        let mut moves = Vec::new();
        // 4. Commit: a victim still `Evicting` becomes `Discarding`; one a
        //    write reached goes back to `Dirty`; one the program discarded
        //    meanwhile loses what we stored.
        let discards = {
            let mut g = self.state.lock();
            let s = &mut *g;
            s.stats.store_rejected += refused as u64;
            for v in victims.iter_mut().filter(|v| !v.clean && !v.moved) {
                let (area, page) = (v.area, v.page as u64);
                let st = s.meta(area, page).st;
                match st {
                    PageState::Evicting if v.stored => {
                        let m = s.meta(area, page);
                        m.st = PageState::Discarding;
                        m.zapping = true;
                        v.discard = true;
                    }
                    PageState::Evicting | PageState::EvictAborted => {
                        if v.stored {
                            self.store.invalidate(area, page);
                        }
                        if st == PageState::EvictAborted {
                            s.stats.evictions_aborted += 1;
                        }
                        let m = s.meta(area, page);
                        m.st = PageState::Dirty;
                        m.parked = false; // the unprotect below wakes them
                        v.unprotect = true;
                        // A written page is hot; a refused one goes round again.
                        let hot = st == PageState::EvictAborted;
                        s.enqueue(
                            area,
                            page,
                            hot && self.cfg.policy == VictimPolicy::Workingset,
                        );
                    }
                    _ => {
                        if v.stored {
                            self.store.invalidate(area, page);
                        }
                    }
                }
            }
            debug_assert!(s.own.is_empty(), "one eviction batch at a time");
            let mut spans = s.spans(victims, |v| v.discard && !v.moved);
            // Short spans leave by moves while the staging area has room.
            if let Some(st) = &self.staging {
                let mut room = st.pages();
                spans.retain(|span| {
                    let n = span.victims.len();
                    let move_it = n <= MOVE_MAX_SPAN && n <= room;
                    if move_it {
                        room -= n;
                        moves.extend_from_slice(&span.victims);
                    }
                    !move_it
                });
            }
            s.own
                .extend(spans.iter().map(|span| OwnSpan::new(span.lo, span.hi)));
            spans
        };
        (discards, moves)
    }

    /// After step 4: clears the protection of the victims a write reached or
    /// the store refused (they are `Dirty` again).
    fn unprotect_aborted(&self, victims: &[Victim]) {
        for v in victims.iter().filter(|v| v.unprotect) {
            self.unprotect_retry(v.addr);
        }
        if victims.iter().any(|v| v.unprotect) {
            // Faults waiting in-thread on the aborted pages go (those in
            // the kernel were woken by the unprotect).
            self.notify_settled();
        }
    }

    /// Step 5a of [`PagerCore::evict`]: the victims `moves` (indexes) leave by
    /// moves; one the kernel will not move joins `discards`, listed in
    /// `State::own`. Returns how many pages moved.
    fn drop_by_move(&self, victims: &[Victim], moves: &[usize], discards: &mut Vec<Span>) -> u64 {
        // 5a. Drop by moving victims of short spans into the staging area,
        //     one page at a time: no remove event, so no handler round trip
        //     and no EAGAIN for the faults meanwhile (see `sys::Staging`). A
        //     missing fault on a moved page parks (`zapping`) until step 6,
        //     as after a discard; the program's own discard of one is its
        //     event, as the page is in no span of ours. A page the kernel
        //     will not move (shared with a forked child, a mapping with
        //     other flags) is discarded below in a span of its own.
        let mut moved = 0;
        if let Some(st) = &self.staging {
            let mut refused = Vec::new();
            let mut slot = 0;
            let mut gone = false;
            for &i in moves {
                match st.take(slot, victims[i].addr) {
                    sys::Taken::Moved => slot += 1,
                    sys::Taken::Gone => gone = true,
                    sys::Taken::Refused(_) => refused.push(Span {
                        victims: vec![i],
                        lo: victims[i].addr,
                        hi: victims[i].addr + PAGE_SIZE,
                    }),
                }
            }
            st.clear(slot);
            moved += slot as u64;
            if gone {
                // The program discarded the page: the kernel zaps only after
                // a handler read the remove event, and whoever reads a batch
                // with an event handles it under the dispatch lock. Once we
                // had that lock the page is `Absent`, and step 6 leaves it so.
                drop(self.dispatch.lock());
            }
            if !refused.is_empty() {
                // Nothing to re-check: the pages stay `zapping` (ours) until
                // settle; their spans only have to exist before the call.
                let mut s = self.state.lock();
                s.own
                    .extend(refused.iter().map(|span| OwnSpan::new(span.lo, span.hi)));
                s.own.sort_unstable_by_key(|o| o.lo);
                discards.extend(refused);
            }
        }
        moved
    }

    /// Step 5b of [`PagerCore::evict`]: one discard call per span of
    /// `discards`, each span's parked faults woken after its call.
    fn drop_by_discard(&self, discards: &[Span]) {
        // 5b. Drop by discarding, one call per span. The remove event each
        //     raises is recognised by the handler through `State::own`.
        //
        // With CPU handlers, discard at the idle policy: the handler that
        // reads our remove event wakes us, and woken at the normal policy
        // we would preempt it (on its CPU, where we slept) while it holds
        // the dispatch lock, holding up every fault until we sleep again.
        // At the idle policy we wait until it yields. (Where the process
        // may not leave the idle policy again, the discards stay normal.)
        for &Span { lo, hi, .. } in discards {
            let idle = self.idle_discards
                && self.cpu_handlers.load(Ordering::Relaxed) > 0
                && uzswap_os::sched::set_idle(0, true).is_ok();
            // SAFETY: every victim of the span is held by the store and
            // `Discarding` (or clean), and no page between them is
            // resident: faults there wait until the call returned. The
            // addresses were taken from the segment map under the lock
            // (see the crate docs on remaps).
            let _ = unsafe { sys::dontneed(lo, hi - lo) };
            if idle {
                let _ = uzswap_os::sched::set_idle(0, false);
            }
            // The call returned, so every event it raised was read, and a
            // batch with an event is handled by whoever read it before the
            // dispatch lock is released: once we had that lock, a later
            // event is the program's. Faults parked between victims may go.
            drop(self.dispatch.lock());
            let parked = {
                let mut g = self.state.lock();
                let s = &mut *g;
                let k = s.own_at(lo).expect("a span lives until its call returned");
                let o = s.own.remove(k);
                for &a in &o.parked {
                    if let Some((area, page)) = lookup(&s.segs, a) {
                        s.meta(area, page).parked = false;
                    }
                }
                o.parked
            };
            // In-thread faults between victims are listed nowhere: they
            // wait on the settle sequence.
            self.notify_settled();
            for a in parked {
                self.wake_parked(a);
            }
            // Faults that met our remove event (EAGAIN) can go now.
            if self.again_waiting.swap(false, Ordering::Relaxed) {
                self.wake.signal();
            }
        }
    }

    /// Step 6 of [`PagerCore::evict`] (state lock): settles the discarded
    /// victims and releases every victim not moved out first; `calls` and
    /// `moved` go to the statistics. Returns how many of them left memory.
    fn settle_batch(&self, victims: &[Victim], calls: u64, moved: u64) -> usize {
        // 6. Settle: `Discarding` → `Stored`, wake parked faults (those
        //    moved out first were settled then).
        let mut wake = Vec::new();
        let mut gone = 0;
        {
            let mut g = self.state.lock();
            let s = &mut *g;
            s.stats.discard_calls += calls;
            s.stats.evict_moved_pages += moved;
            for v in victims {
                if v.discard && !v.moved {
                    let mut w = None;
                    if settle(s, v, &mut w) {
                        gone += 1;
                    }
                    wake.extend(w);
                }
                if !v.moved {
                    self.release(s, v);
                }
            }
        }
        for a in wake {
            self.wake_parked(a);
        }
        self.notify_settled();
        gone
    }

    /// Steps 2 to 6 for the dirty victims of short spans, while the
    /// staging area has room, one page at a time: each is *moved* out
    /// first (`UFFDIO_MOVE`, which unmaps it from the program atomically,
    /// with one TLB flush), stored from its staging slot and settled at
    /// once. No write protection is needed (nor its TLB flushes): after
    /// the move no CPU can write the page, and a fault on it parks
    /// (`zapping`) only until that page is settled, not the whole batch.
    /// Returns how many left so (moved, stored, settled) and how many the
    /// store refused.
    ///
    /// A victim the kernel will not move (shared with a forked child) goes
    /// on through the protected path. A refused one is copied back under
    /// the dispatch lock, as a load maps a page (see `pager/load.rs`):
    /// only if it is still `Evicting` at the address its key has now, so
    /// that no copy lands after a discard or a remap it did not see.
    pub(super) fn move_out(&self, victims: &mut [Victim]) -> (usize, usize) {
        let Some(st) = &self.staging else {
            return (0, 0);
        };
        let chosen = self.choose_moves(st, victims);
        let (mut slots, mut left, mut refused) = (0, 0, 0);
        for i in chosen {
            let v = &mut victims[i];
            match st.take(slots, v.addr) {
                sys::Taken::Moved => {
                    v.moved = true;
                    let slot = slots;
                    slots += 1;
                    // SAFETY: the slot holds the page just moved into it,
                    // and only this thread uses the staging area until
                    // `clear`.
                    if !self.store_victim(v, unsafe { st.slot(slot) }) {
                        refused += 1;
                        self.move_back(v, st, slot);
                        continue;
                    }
                    v.stored = true;
                }
                sys::Taken::Gone => {
                    // The program discarded it: as in step 5a, once we had
                    // the dispatch lock its remove event was handled
                    // (`Absent`).
                    v.moved = true;
                    drop(self.dispatch.lock());
                }
                sys::Taken::Refused(_) => {}
            }
            // Settle it now (a refused move: clear `zapping`, and it goes on
            // through write protection as if never chosen).
            if self.settle_moved(v) {
                left += 1;
            }
        }
        st.clear(slots);
        let mut s = self.state.lock();
        s.stats.evict_moved_first += left as u64;
        s.stats.evict_moved_pages += left as u64;
        (left, refused)
    }

    /// The dirty victims (indexes) of spans short enough to leave by moves
    /// while the staging area `st` has room, each marked `zapping` (state
    /// lock): from here a missing fault on one of them parks until it is
    /// settled.
    fn choose_moves(&self, st: &sys::Staging, victims: &[Victim]) -> Vec<usize> {
        let mut g = self.state.lock();
        let s = &mut *g;
        let mut room = st.pages();
        let mut chosen = Vec::new();
        // The spans step 5 would drop: a long one leaves in one
        // discard, cheaper than a move per page.
        for span in s.spans(victims, |_| true) {
            let n = span.victims.len();
            if n > MOVE_MAX_SPAN || n > room {
                continue;
            }
            room -= n;
            for i in span.victims {
                let v = &victims[i];
                if v.clean {
                    continue; // moved in step 5a, nothing to store
                }
                let m = s.meta(v.area, v.page as u64);
                if m.st == PageState::Evicting {
                    m.zapping = true;
                    chosen.push(i);
                }
            }
        }
        chosen
    }

    /// Settles victim `v` of [`PagerCore::move_out`] once its move was tried:
    /// a moved one leaves (whether it counts as gone is returned), one the
    /// kernel would not move is left to the protected path.
    fn settle_moved(&self, v: &Victim) -> bool {
        let mut left = false;
        let mut wake = None;
        {
            let mut g = self.state.lock();
            let s = &mut *g;
            let (area, page) = (v.area, v.page as u64);
            if v.moved {
                // `EvictAborted`: a write met the page's write-protect
                // marker (left from an earlier span) before the move
                // took it. The write has not happened (its thread waits,
                // parked), so the moved bytes are the page's: it leaves
                // as stored, and the write faults it back. Left
                // `EvictAborted` it would have no owner, and every later
                // fault on it would park for ever.
                let st = s.meta(area, page).st;
                if v.stored && matches!(st, PageState::Evicting | PageState::EvictAborted) {
                    s.meta(area, page).st = PageState::Discarding;
                } else if v.stored {
                    // Discarded by the program meanwhile (`Absent`): its
                    // copy must not stand for it.
                    self.store.invalidate(area, page);
                }
                left = settle(s, v, &mut wake);
                self.release(s, v);
            } else {
                let m = s.meta(area, page);
                m.zapping = false;
                if std::mem::replace(&mut m.parked, false) {
                    wake = Some(v.addr);
                }
            }
        }
        if let Some(a) = wake {
            self.wake_parked(a);
        }
        left
    }

    /// Stores a victim's bytes (cold ones with `PageStore::store_cold`);
    /// whether the store took them.
    fn store_victim(&self, v: &Victim, page: &[u8]) -> bool {
        let (area, offset) = (v.area, v.page as u64);
        let stored = if v.cold {
            self.store.store_cold(area, offset, page)
        } else {
            self.store.store(area, offset, page)
        };
        stored.is_ok()
    }

    /// The end of a victim's batch (state lock held): no longer claimed, no
    /// longer in flight for its area (whose drop may be waiting for that).
    fn release(&self, s: &mut State, v: &Victim) {
        s.meta(v.area, v.page as u64).claimed = false;
        let a = s.areas.get_mut(&v.area).expect("area");
        a.inflight -= 1;
        if a.dying && a.inflight == 0 {
            self.done_cv.notify_all();
        }
    }

    /// Maps a moved victim the store refused back where its key lives now,
    /// `Dirty` again, if it is still `Evicting` or `EvictAborted` (else the
    /// program discarded or unmapped it meanwhile and its bytes are
    /// dropped), and ends its
    /// batch (`release`): steps 4 to 6 have nothing to do for it. Under the
    /// dispatch lock, then the state lock: no event is read between the
    /// re-check and the copy; a copy that meets a pending event (EAGAIN)
    /// lets go of both and looks again once a handler has read it.
    fn move_back(&self, v: &Victim, st: &sys::Staging, slot: usize) {
        let (area, page) = (v.area, v.page as u64);
        loop {
            let d = self.dispatch.lock();
            let mut g = self.state.lock();
            let s = &mut *g;
            let at = PagerCore::page_addr(s, area, page);
            // `EvictAborted` too: a write that met a write-protect marker
            // before the move waits for the page (see `move_out`).
            let still = matches!(
                s.meta(area, page).st,
                PageState::Evicting | PageState::EvictAborted
            );
            let copied = match (still, at) {
                // SAFETY: the slot holds the page until `clear` (the
                // caller's), readable memory of this process.
                (true, Some(addr)) => unsafe {
                    self.uffd
                        .copy(addr, st.slot(slot).as_ptr(), PAGE_SIZE, false, true)
                },
                _ => Err(sys::UffdError {
                    errno: libc::ENOENT,
                    done: 0,
                }),
            };
            match copied {
                Err(e) if e.errno == libc::EAGAIN => {
                    drop(g);
                    drop(d);
                    std::thread::yield_now();
                    continue;
                }
                Ok(()) => {
                    let m = s.meta(area, page);
                    m.st = PageState::Dirty;
                    s.enqueue(area, page, false);
                    s.stats.evict_moved_back += 1;
                }
                Err(_) => {}
            }
            let m = s.meta(area, page);
            m.zapping = false;
            let woken = std::mem::replace(&mut m.parked, false);
            self.release(s, v);
            drop(g);
            drop(d);
            if let (true, Some(addr)) = (woken, at) {
                self.wake_parked(addr);
            }
            return;
        }
    }

    /// Evicts the given pages of `area` now, on the calling thread.
    pub(crate) fn evict_pages(&self, area: u32, pages: std::ops::Range<u64>) -> usize {
        let _gate = self.gate.lock();
        let victims = {
            let mut s = self.state.lock();
            let v: Vec<(u32, u64)> = pages
                .filter(|p| {
                    s.areas
                        .get(&area)
                        .and_then(|a| a.meta.get(*p as usize))
                        .is_some_and(|m| matches!(m.st, PageState::Dirty | PageState::Clean))
                })
                .map(|p| (area, p))
                .collect();
            self.claim(&mut s, v)
        };
        let (gone, _) = self.evict(victims);
        gone
    }
}

/// Step 6 for one victim whose drop returned (state lock held): a page
/// still `Discarding` becomes `Stored` (it left memory: true); parked
/// faults may go whatever the page became meanwhile (`discard_range`
/// leaves faults on a `zapping` page parked for us), so `wake` gets its
/// address if any parked.
fn settle(s: &mut State, v: &Victim, wake: &mut Option<usize>) -> bool {
    let (area, page) = (v.area, v.page as u64);
    s.meta(area, page).zapping = false;
    let mut left = false;
    if s.meta(area, page).st == PageState::Discarding {
        s.leave(area, page);
        let clock = s.evict_clock;
        s.evict_clock = clock.wrapping_add(1);
        let m = s.meta(area, page);
        m.st = PageState::Stored;
        m.evicted_at = clock;
        left = true;
        if v.clean {
            s.stats.clean_drops += 1;
        } else {
            s.stats.evictions += 1;
        }
    }
    if std::mem::replace(&mut s.meta(area, page).parked, false) {
        *wake = Some(v.addr);
    }
    left
}
