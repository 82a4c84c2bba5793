//! This process's share of the tree's budget (`uzswap run`'s ledger).
//!
//! With a ledger, `--memory-max` is the budget of every process of the
//! program together. Each process keeps its own pager and pool and reports
//! what it holds in its slot of the ledger; the arbiter (`uzswap run`)
//! writes back what it may hold, its *allotment*. The pager's evictor calls
//! [`Share::charge`] every `CHARGE_PERIOD` (10 ms; up to 80 ms while the
//! process is idle, `IDLE_CHARGE_PERIOD`) with no pager lock held:
//! it publishes the report, sizes the pool within the allotment and
//! returns, as the pager's charge, everything of the budget that is not
//! this process's to fill with resident pages:
//!
//! ```text
//! unmanaged      = resident anonymous memory − managed pages − pool
//!                  (the runtime's heap, and what the program holds that
//!                  uzswap does not manage)
//! resident limit = allotment − unmanaged − pool
//! charge         = budget − resident limit
//! ```
//!
//! What the allotment leaves beside the unmanaged memory is split between
//! resident pages and the pool (`--pool-max` caps the pool further) by
//! what faults from each cost ([`next_split`]): the pool's share grows
//! while loads from the backing file cost more than the faults a larger
//! resident set would have saved, and shrinks while the pool is full and
//! those faults cost more. Held at half, a pool wrote 477 k pages of
//! `usemem` back at 631 MiB, where the whole of it fits compressed, and
//! its pass ran at a third of the speed; given all of it, a JVM whose
//! heap compresses poorly kept 7 MiB resident of 80 and took 2.4 × the
//! time (`uzswap-bench run`, docs/BENCHMARKS.md).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use uzswap_cache::{Cache, PoolLimit};
use uzswap_ledger::{Ledger, Member, Usage};
use uzswap_os::distance::BUCKETS;
use uzswap_os::lock::{Mutex, MutexGuard};
use uzswap_region::{Pager, PAGE_SIZE};

/// What the process holds besides its managed pages and its pool (see
/// [`Share::charge`]): all of its resident anonymous memory less those
/// two, as the kernel counts it.
pub(crate) fn unmanaged(p: &uzswap_region::PagerUsage, c: &uzswap_cache::CacheUsage) -> u64 {
    let anon = uzswap_os::rss_anon_bytes().unwrap_or(0);
    anon.saturating_sub(p.resident_pages * PAGE_SIZE as u64 + c.pool_bytes)
}

/// Pages a process always keeps resident, whatever its allotment.
pub(crate) const FLOOR_PAGES: usize = 256;
/// The least pool limit ever set.
const MIN_POOL: u64 = 1 << 20;
/// The longest a process waits at its start for the tree to give memory
/// back (`Member::wait_for_room`): past it, it runs and the arbiter's
/// figures say the tree is over its budget.
const START_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// A process's slot and what it last did with it.
pub(crate) struct Share {
    /// This process's slot (a forked child claims its own: `rejoin`). The
    /// evictor reports through it outside every pager lock (`charge`), so
    /// the fork hooks hold it across a fork ([`Share::hold_for_fork`]): a
    /// child that inherited it taken would wait for ever in `rejoin`. A
    /// leaf: nothing is taken while it is held.
    member: Mutex<Member>,
    /// The tree's budget (the pager's budget).
    budget: u64,
    /// `--pool-max`, if given.
    pool_max: Option<u64>,
    /// The pool limit last set (0: none yet).
    pool_limit: AtomicU64,
    /// How what the allotment leaves is split between resident pages and
    /// the pool. Only the evictor (`charge`) moves it: atomics, no lock
    /// that a fork could copy taken.
    split: Split,
    /// `writeback_fail` and `reject_reclaim_fail` at the last report.
    last_fail: AtomicU64,
    last_refused: AtomicU64,
    /// CPU time of the process and of its uzswap threads at the last
    /// measure (ms), and when that was (ms since `born`).
    cpu_ms: AtomicU64,
    runtime_cpu_ms: AtomicU64,
    /// uzswap's own heap at that measure (glibc's, bytes in use: see
    /// `crate::stats::runtime_heap`), as often: `mallinfo2` walks every
    /// arena. Its large blocks count whole, touched or not.
    own: AtomicU64,
    cpu_at_ms: AtomicU64,
    born: std::time::Instant,
}

/// How often the CPU times are measured (a read of /proc per thread).
const CPU_PERIOD_MS: u64 = 500;

impl Share {
    /// Joins the ledger at `path` (a slot for this process). `Ok(None)`:
    /// the `uzswap run` that holds the ledger has ended (see
    /// [`run_ended`]), and the process is to run unmanaged.
    pub(crate) fn join(
        path: &std::path::Path,
        budget: u64,
        pool_max: Option<u64>,
    ) -> Result<Option<Share>, String> {
        let ledger = match Ledger::open(path) {
            Ok(l) => std::sync::Arc::new(l),
            Err(e) if run_ended(path, &e) => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let member = claim(&ledger)?;
        // Before the program runs: the room it takes comes from the others,
        // who give it up as fast as their evictors run (a fork, below in
        // `rejoin`, already holds its memory and does not wait).
        member.wait_for_room(START_WAIT_MAX);
        Ok(Some(Share {
            member: Mutex::new(member),
            budget,
            pool_max,
            pool_limit: AtomicU64::new(0),
            split: Split::default(),
            last_fail: AtomicU64::new(0),
            last_refused: AtomicU64::new(0),
            cpu_ms: AtomicU64::new(0),
            runtime_cpu_ms: AtomicU64::new(0),
            own: AtomicU64::new(0),
            cpu_at_ms: AtomicU64::new(0),
            born: std::time::Instant::now(),
        }))
    }

    fn member(&self) -> MutexGuard<'_, Member> {
        self.member.lock()
    }

    /// The fork's prepare hook: takes the slot's lock and keeps it (the
    /// guard is forgotten) until [`Share::release_after_fork`].
    pub(crate) fn hold_for_fork(&self) {
        std::mem::forget(self.member.lock());
    }

    /// The fork's parent or child hook: releases what
    /// [`Share::hold_for_fork`] took. In the child too by an unlock that
    /// wakes a waiter, not by resetting the lock's word: the pager's child
    /// hook, which runs first, has started the child's evictor, which may
    /// already wait for the slot (`charge`).
    ///
    /// # Safety
    /// This thread called `hold_for_fork` (in the child: its parent's
    /// thread did, and this is its copy) and nothing released it since.
    pub(crate) unsafe fn release_after_fork(&self) {
        // SAFETY: as the caller promised: the lock is held through a
        // forgotten guard of this thread.
        unsafe { self.member.force_unlock() }
    }

    /// In a forked child: claims a slot of its own. The slot it inherited
    /// is the parent's and stays the parent's (never left from here).
    pub(crate) fn rejoin(&self) -> Result<(), String> {
        let mut m = self.member();
        let fresh = claim(m.ledger())?;
        std::mem::forget(std::mem::replace(&mut *m, fresh));
        self.pool_limit.store(0, Ordering::Relaxed);
        // The child's own times start at 0 (the kernel's count does).
        self.cpu_at_ms.store(0, Ordering::Relaxed);
        Ok(())
    }

    /// Measures the process's CPU time, its uzswap threads' and uzswap's
    /// own heap now (at exit too, so that the last report holds the whole
    /// of it).
    pub(crate) fn measure(&self) {
        self.own
            .store(crate::stats::runtime_heap().in_use_bytes, Ordering::Relaxed);
        let ms = |secs: f64| (secs * 1000.0) as u64;
        self.runtime_cpu_ms
            .store(ms(uzswap_os::cpu::helpers_cpu_seconds()), Ordering::Relaxed);
        self.cpu_ms
            .store(ms(uzswap_os::cpu::process_cpu_seconds()), Ordering::Relaxed);
        let now = self.born.elapsed().as_millis() as u64;
        self.cpu_at_ms.store(now.max(1), Ordering::Relaxed);
    }

    /// The pool limit to start with, before any allotment: what the
    /// arbiter has left unallotted, split as [`Share::charge`] splits.
    pub(crate) fn initial_pool_limit(&self) -> u64 {
        self.pool_share(self.member().limit())
    }

    fn pool_share(&self, avail: u64) -> u64 {
        let floor = (FLOOR_PAGES * PAGE_SIZE) as u64;
        let parts = u64::from(self.split.parts.load(Ordering::Relaxed));
        (avail / SPLIT_PARTS * parts)
            .min(avail.saturating_sub(floor))
            .max(MIN_POOL)
            .min(self.pool_max.unwrap_or(u64::MAX))
    }

    /// Moves the split (`next_split`) once a window of [`SPLIT_PERIOD_MS`]
    /// has passed since the last move, from the counters now.
    fn steer_split(
        &self,
        p: &uzswap_region::PagerUsage,
        c: &uzswap_cache::CacheUsage,
        allot_avail: u64,
        now: u64,
    ) {
        let sp = &self.split;
        let at = sp.at_ms.load(Ordering::Relaxed);
        if now.saturating_sub(at) < SPLIT_PERIOD_MS {
            return;
        }
        let counts = [
            p.store_faults,
            p.store_fault_ns,
            c.loads_pool,
            c.load_pool_ns,
            c.loads_backing,
            c.load_backing_ns,
            p.evictions + p.faults,
            self.runtime_cpu_ms.load(Ordering::Relaxed) * 1_000_000,
        ];
        let mut d = [0u64; 8];
        for ((d, n), start) in d.iter_mut().zip(counts).zip(&sp.start) {
            *d = n.saturating_sub(start.swap(n, Ordering::Relaxed));
        }
        sp.at_ms.store(now, Ordering::Relaxed);
        let refaults = p.refault_distances.since(&sp.refaults);
        let backing = c.backing_distances.since(&sp.backing);
        if at == 0 {
            return; // the first window starts here
        }
        let mean = |ns: u64, n: u64| if n == 0 { 0.0 } else { ns as f64 / n as f64 };
        let limit = self.pool_limit.load(Ordering::Relaxed);
        // What one part of the split holds: as resident pages, and as
        // pool objects of the mean size now (the clock of a backing load's
        // distance is pages written back).
        let part = allot_avail / SPLIT_PARTS;
        let objects = c.stored_pages.saturating_sub(c.backing_pages).max(1);
        let object = (c.pool_bytes / objects).max(1);
        let w = Window {
            near_refaults: refaults.within(part / PAGE_SIZE as u64) as u64,
            // A page that came back cost its fault and its eviction: the
            // handler's time, and uzswap's CPU per page moved.
            fault_ns: mean(d[1], d[0]) + mean(d[7], d[6]),
            backing_loads: backing.within(part / object) as u64,
            backing_extra_ns: (mean(d[5], d[4]) - mean(d[3], d[2])).max(0.0),
            // The writer keeps a full pool between 90 and 95 % of its limit.
            pool_full: limit > 0 && c.pool_bytes >= limit / 8 * 7,
        };
        let cur = sp.parts.load(Ordering::Relaxed);
        sp.parts.store(next_split(cur, &w), Ordering::Relaxed);
    }

    /// Reports, sizes the pool and returns the pager's charge (see the
    /// module docs). `pager` and `cache` are `None` while the runtime is
    /// starting.
    ///
    /// What the process holds besides its managed pages and its pool (the
    /// runtime's heap, but also the program's memory uzswap does not
    /// manage: `brk`, thread stacks, what it had before the runtime
    /// started) is all of its resident anonymous memory less those two,
    /// as the kernel counts it. The allocator's own count would include
    /// tables it reserved and never touched (a region's page table is
    /// zeroed memory, resident only where used).
    pub(crate) fn charge(&self, pager: Option<&Pager>, cache: Option<&Cache>) -> u64 {
        let p = pager.map(Pager::usage).unwrap_or_default();
        let c = cache.map(Cache::usage).unwrap_or_default();
        let heap = unmanaged(&p, &c);
        let mut flags = 0;
        if p.store_full || c.reject_reclaim_fail > self.last_refused.load(Ordering::Relaxed) {
            flags |= Usage::STORE_REFUSING;
        }
        if c.writeback_fail > self.last_fail.load(Ordering::Relaxed) {
            flags |= Usage::BACKING_FAILING;
        }
        self.last_refused
            .store(c.reject_reclaim_fail, Ordering::Relaxed);
        self.last_fail.store(c.writeback_fail, Ordering::Relaxed);
        let now = self.born.elapsed().as_millis() as u64;
        let at = self.cpu_at_ms.load(Ordering::Relaxed);
        // At the first report too: its heap is in it from the start.
        if at == 0 || now.saturating_sub(at) >= CPU_PERIOD_MS {
            self.measure();
        }
        let member = self.member();
        if member.pid() != std::process::id() {
            // A forked child between its pager's hook and `rejoin`: the
            // slot is still the parent's; report nothing into it.
            return self.budget.saturating_sub(member.limit());
        }
        member.publish(&Usage {
            resident: p.resident_pages * PAGE_SIZE as u64,
            pool: c.pool_bytes,
            runtime: heap,
            // Of what it holds beside managed pages and pool: never more
            // than all of it (the heap's pages the kernel has not made
            // resident are held but not counted there).
            own: self.own.load(Ordering::Relaxed).min(heap),
            backing: c.backing_pages * PAGE_SIZE as u64,
            faults: p.faults,
            first_touches: p.first_touches,
            evictions: p.evictions,
            stored: c.stored_pages,
            flags,
            cpu_ms: self.cpu_ms.load(Ordering::Relaxed),
            runtime_cpu_ms: self.runtime_cpu_ms.load(Ordering::Relaxed),
        });
        let allot = member.limit();
        drop(member);
        if let Some(cache) = cache {
            let avail = allot.saturating_sub(heap);
            self.steer_split(&p, &c, avail, now);
            let want = self.pool_share(avail);
            let had = self.pool_limit.load(Ordering::Relaxed);
            // Only a change of more than 1/16: setting the limit restarts
            // the pool's full/accept hysteresis.
            if (had == 0 || want.abs_diff(had) > had / 16)
                && cache.set_pool_limit(PoolLimit::Bytes(want)).is_ok()
            {
                self.pool_limit.store(want, Ordering::Relaxed);
            }
        }
        let resident_limit = allot.saturating_sub(heap + c.pool_bytes);
        self.budget.saturating_sub(resident_limit)
    }

    /// Whether this process is the program `uzswap run` started (its parent
    /// is the arbiter), not one of its descendants.
    pub(crate) fn is_root(&self) -> bool {
        let parent = crate::sys::getppid() as u32;
        parent == self.member().ledger().arbiter_pid()
    }

    /// Gives the slot back (at exit: a static is never dropped).
    pub(crate) fn leave(&self) {
        self.member().leave();
    }
}

/// The pool's share is counted in this many parts of what the allotment
/// leaves beside the unmanaged memory; all of them leave the floor.
const SPLIT_PARTS: u64 = 16;
/// The least and first share: a quarter, and half.
const SPLIT_MIN: u32 = 4;
const SPLIT_START: u32 = 8;
/// A window of faults the split is judged on, at least (ms): the CPU
/// times are measured as often (`CPU_PERIOD_MS`).
const SPLIT_PERIOD_MS: u64 = CPU_PERIOD_MS;
/// The least evidence a move needs: faults of either kind in the window.
const SPLIT_EVIDENCE: u64 = 16;

/// See [`Share::split`].
struct Split {
    /// The pool's share, in [`SPLIT_PARTS`].
    parts: AtomicU32,
    /// The counters at the window's start (as `steer_split` lists them),
    /// and when it started (ms since `born`; 0: not yet).
    start: [AtomicU64; 8],
    /// The distances of refaults and of loads from the backing file then
    /// (`uzswap_os::distance`).
    refaults: [AtomicU64; BUCKETS],
    backing: [AtomicU64; BUCKETS],
    at_ms: AtomicU64,
}

impl Default for Split {
    fn default() -> Split {
        Split {
            parts: AtomicU32::new(SPLIT_START),
            start: Default::default(),
            refaults: std::array::from_fn(|_| AtomicU64::new(0)),
            backing: std::array::from_fn(|_| AtomicU64::new(0)),
            at_ms: AtomicU64::new(0),
        }
    }
}

/// What a window of faults says of the split.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Window {
    /// Faults of pages evicted at most one part of the split ago (in
    /// pages): what a resident set a part larger would have saved, each a
    /// whole fault.
    pub near_refaults: u64,
    /// What a page that came back from the store cost, ns: the handler's
    /// time for its fault and uzswap's CPU per page moved.
    pub fault_ns: f64,
    /// Loads from the backing file of pages written back at most a part
    /// of the split ago (in pool objects): what a pool a part larger
    /// would have served instead.
    pub backing_loads: u64,
    /// What such a load costs beyond one from the pool, ns.
    pub backing_extra_ns: f64,
    /// The pool is at its limit (pages are written back, so the split
    /// binds).
    pub pool_full: bool,
}

/// The next split, in parts: a part more for the pool while its misses
/// (loads from the backing file) cost more than the resident set's (near
/// refaults), a part less while the pool is full and the resident set's
/// cost more; between a quarter and all. The kernel has no such rule: its
/// reclaim takes the coldest anonymous pages into zswap whatever zswap
/// holds, and a v2 cgroup charges the pool inside the limit.
pub(crate) fn next_split(cur: u32, w: &Window) -> u32 {
    if w.near_refaults + w.backing_loads < SPLIT_EVIDENCE {
        return cur;
    }
    let resident = w.near_refaults as f64 * w.fault_ns;
    let pool = w.backing_loads as f64 * w.backing_extra_ns;
    if pool > resident {
        (cur + 1).min(SPLIT_PARTS as u32)
    } else if w.pool_full && resident > pool {
        cur.saturating_sub(1).max(SPLIT_MIN)
    } else {
        cur
    }
}

/// Whether opening the ledger failed because the `uzswap run` that holds
/// it has ended: the ledger is named by that process's descriptor
/// (`/proc/RUN/fd/N`), which is gone with it. A process the program left
/// behind can exec after that with the library still loaded: a
/// `--preload-lib` file outlives the run, and the carried copy can be
/// opened by the loader just before the run ends and the ledger just
/// after. It runs unmanaged then, as it would where the loader could not
/// open the library; any other failure stops it (the configuration is
/// wrong, and running unmanaged would hide that).
pub(crate) fn run_ended(path: &std::path::Path, e: &uzswap_ledger::Error) -> bool {
    let uzswap_ledger::Error::Io { source, .. } = e else {
        return false;
    };
    run_pid(path).is_some() && source.kind() == std::io::ErrorKind::NotFound
}

/// The pid of the `uzswap run` whose ledger is `path`, when the path names
/// the descriptor it holds: `/proc/PID/fd/N`.
pub(crate) fn run_pid(path: &std::path::Path) -> Option<u32> {
    let mut parts = path.components().map(|c| c.as_os_str());
    if parts.next() != Some("/".as_ref()) || parts.next() != Some("proc".as_ref()) {
        return None;
    }
    let pid = parts.next()?.to_str()?.parse::<u32>().ok()?;
    (parts.next() == Some("fd".as_ref())).then_some(pid)
}

/// A slot for this process in `ledger`.
fn claim(ledger: &std::sync::Arc<Ledger>) -> Result<Member, String> {
    let comm = std::fs::read_to_string("/proc/self/comm").unwrap_or_default();
    ledger
        .claim(
            std::process::id(),
            uzswap_ledger::self_start_time(),
            comm.trim_end(),
        )
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::run_ended;
    use std::path::Path;

    fn io(kind: std::io::ErrorKind) -> uzswap_ledger::Error {
        uzswap_ledger::Error::Io {
            path: "x".into(),
            source: kind.into(),
        }
    }

    #[test]
    fn the_split_follows_what_faults_cost() {
        use super::{next_split, Window, SPLIT_MIN, SPLIT_START};
        let w = |near, backing, full| Window {
            near_refaults: near,
            fault_ns: 8000.0,
            backing_loads: backing,
            backing_extra_ns: 4000.0,
            pool_full: full,
        };
        // Loads from the file cost more: the pool grows, up to all.
        assert_eq!(next_split(SPLIT_START, &w(10, 100, true)), SPLIT_START + 1);
        assert_eq!(next_split(16, &w(0, 100, true)), 16);
        // The resident set's misses cost more and the pool is full: it
        // shrinks, down to a quarter.
        assert_eq!(next_split(SPLIT_START, &w(100, 10, true)), SPLIT_START - 1);
        assert_eq!(next_split(SPLIT_MIN, &w(100, 0, true)), SPLIT_MIN);
        // A pool that is not full does not bind: nothing to give back.
        assert_eq!(next_split(SPLIT_START, &w(100, 0, false)), SPLIT_START);
        // Too few faults to judge by.
        assert_eq!(next_split(SPLIT_START, &w(3, 5, true)), SPLIT_START);
    }

    #[test]
    fn only_a_missing_descriptor_of_a_run_means_the_run_ended() {
        let gone = io(std::io::ErrorKind::NotFound);
        assert!(run_ended(Path::new("/proc/4242/fd/4"), &gone));
        // A file named otherwise is a configuration to fix, not a run that
        // ended.
        assert!(!run_ended(Path::new("/tmp/ledger"), &gone));
        assert!(!run_ended(Path::new("/proc/self/fd/4"), &gone));
        assert!(!run_ended(Path::new("proc/4242/fd/4"), &gone));
        assert!(!run_ended(
            Path::new("/proc/4242/fd/4"),
            &io(std::io::ErrorKind::PermissionDenied)
        ));
        let other = uzswap_ledger::Error::NotALedger {
            path: "/proc/4242/fd/4".into(),
        };
        assert!(!run_ended(Path::new("/proc/4242/fd/4"), &other));
    }

    /// The slot's lock is held across a fork: a child never inherits it
    /// taken by the thread that reports (the evictor, in a program), and
    /// claims its own slot at once. Released in the child by an unlock, a
    /// thread of the child already waiting for it gets it.
    #[test]
    fn a_fork_while_another_thread_reports_does_not_hang_the_child() {
        const FORKS: usize = 300;
        // A slot for each child (no arbiter here gives a left slot back).
        let ledger = uzswap_ledger::Ledger::create(FORKS + 1, 1 << 30).unwrap();
        let sh = super::Share::join(ledger.path(), 1 << 30, None)
            .unwrap()
            .expect("the ledger is open");
        let stop = std::sync::atomic::AtomicBool::new(false);
        /// Stops the reporter however the loop ends (a failed check
        /// panics, and the scope then waits for it).
        struct StopOnDrop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        std::thread::scope(|sc| {
            let _stop = StopOnDrop(&stop);
            sc.spawn(|| {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    sh.charge(None, None);
                }
            });
            for fork in 0..FORKS {
                sh.hold_for_fork();
                // SAFETY: the child claims a slot, gives it back and
                // leaves at once, without the harness.
                let pid = unsafe { crate::sys::fork() };
                // SAFETY: held just above, by this thread (or, in the
                // child, its copy).
                unsafe { sh.release_after_fork() };
                if pid == 0 {
                    let ok = sh.rejoin().is_ok();
                    sh.leave();
                    // Leaving the child at once.
                    crate::sys::exit_now(if ok { 0 } else { 1 });
                }
                assert!(pid > 0, "fork failed");
                let t0 = std::time::Instant::now();
                let status = loop {
                    if let Some(status) = crate::sys::try_wait(pid) {
                        break status;
                    }
                    if t0.elapsed() > std::time::Duration::from_secs(10) {
                        crate::sys::kill_and_reap(pid);
                        panic!("fork {fork}: the child hung claiming its slot");
                    }
                    std::thread::sleep(std::time::Duration::from_micros(200));
                };
                assert_eq!(status, 0, "fork {fork}: the child could not claim a slot");
            }
        });
    }

    #[test]
    fn joining_the_ledger_of_an_ended_run_is_none() {
        // A pid that has just ended and has no descriptors left.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        let path = format!("/proc/{pid}/fd/4");
        assert!(super::Share::join(Path::new(&path), 1 << 24, None)
            .unwrap()
            .is_none());
        // A missing file elsewhere is an error, with the path in it.
        let e = super::Share::join(Path::new("/nonexistent/ledger"), 1 << 24, None)
            .err()
            .unwrap();
        assert!(e.contains("/nonexistent/ledger"), "{e}");
    }
}
