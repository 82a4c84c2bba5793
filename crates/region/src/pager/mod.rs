//! The pager: one userfaultfd, one handler thread, one evictor thread, one
//! [`PageStore`] and one resident budget shared by all its regions.
//!
//! See the crate documentation for the protocol; this folder implements
//! it, one job a file:
//! - `mod.rs`: [`Pager`] and its public API, the state its threads share
//!   (`PagerCore`) and region lifecycle (made, dropped);
//! - `config.rs`: [`PagerConfig`], [`VictimPolicy`], [`Charge`], errors;
//! - `types.rs`: the vocabulary the other files share (a fault, its
//!   outcome, a load, page buffers, wakes, eviction victims);
//! - `state.rs`: [`PageState`], the page records, the segment map, the
//!   victim lists and victim choice, and every method of `State`;
//! - `handler.rs`: the handler threads, message dispatch and wake-ups;
//! - `fault.rs`: resolving one fault (what each page state calls for);
//! - `load.rs`: a stored page brought back with no lock held (load,
//!   re-check and map; its start is `State::start_load`), readahead;
//! - `events.rs`: remove, unmap and remap events;
//! - `evict.rs`: the evictor thread and an eviction batch's steps;
//! - `access.rs`: the access signal (which chunks the program used since
//!   the last sample) and the cold queue it gives the victim choice;
//! - `zeros.rs`: resident pages that map the zero page, which the budget
//!   does not count, found with `PAGEMAP_SCAN`;
//! - `fork.rs`: the fork hooks;
//! - `inthread.rs`: in-thread faults (the SIGBUS handler, its buffer pool,
//!   the settle sequence faults wait on) and pins;
//! - `check.rs`: `check_invariants`.
//!
//! # Lock order
//! 1. `PagerCore::gate` (one eviction batch or one fork at a time; a guard
//!    everywhere but in the fork hooks, which hold it from prepare to
//!    parent/child)
//! 2. `PagerCore::dispatch` (the handlers, while they read and handle a batch
//!    or retry deferred faults, and while they map a load: re-check and
//!    `UFFDIO_COPY`, see `load.rs`; an in-thread fault while it resolves;
//!    every page is mapped under it, see `handler.rs`, `handle_batch`;
//!    the evictor takes it, holding nothing else but the gate,
//!    after each discard: a barrier behind which every event of that call
//!    was handled). Handlers never take the gate, nor does the SIGBUS
//!    handler of in-thread faults (it takes `dispatch` to map a load,
//!    `state` and the store's locks, never across a wait).
//! 3. `PagerCore::zero_scan` (the evictor's, and the fork hooks', which hold
//!    it through a fork; it takes `state` inside it briefly, never the
//!    reverse), then `PagerCore::access` (the same, for the access signal;
//!    never held with `zero_scan` but by the fork hooks)
//! 4. `PagerCore::state`
//! 5. the store's internal locks (taken inside `PageStore` calls)
//!
//! No thread holds `state` across a call that may need the handler to make
//! progress: `madvise` on a registered range (it waits until the handler has
//! read the remove event) or a read of region memory (it may fault). No
//! code of the pager reads or writes region memory in user mode holding a
//! lock: with in-thread faults the SIGBUS handler, which takes `dispatch`
//! and `state`, would run on that very thread. No
//! thread holds any pager lock across a load from the store (its read,
//! decompression, decryption, retry pauses): see `load.rs`. The
//! handler itself never waits for the evictor: a fault that must wait is
//! *parked* (a flag on the page) and woken by whoever settles the page.

mod access;
mod check;
mod config;
mod events;
mod evict;
mod fault;
mod fork;
mod handler;
mod inthread;
mod load;
mod state;
mod types;
mod zeros;

pub use config::{
    Charge, ForkChild, PagerConfig, PagerError, RegionError, VictimPolicy, CHARGE_PERIOD,
    IDLE_CHARGE_PERIOD, MAX_CPU_HANDLERS,
};
pub use config::{ACCESS_CHUNK, MANAGE_MIN_PAGES};
pub use fork::fork_child_managed;
pub use state::PageState;

use crate::stats::PagerStats;
use crate::store::PageStore;
use crate::sys::{self, feature, Uffd, PAGE_SIZE};
use handler::Dispatch;
use state::{zeroed_meta, Area, Readahead, Seg, State};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use uzswap_os::lock::{Condvar, Mutex};
use uzswap_os::Helper;
use zeros::ZeroLook;

/// What the pager's threads share (handlers, evictor, SIGBUS handler, fork
/// hooks, and the program's own calls): the descriptor, the store, the
/// locks (taken in the order above) and the counters. Its methods are
/// grouped by job, one file of this folder a job (the list above).
pub(crate) struct PagerCore {
    uffd: Uffd,
    store: Arc<dyn PageStore>,
    cfg: PagerConfig,
    state: Mutex<State>,
    /// The evictor waits here for work.
    work_cv: Condvar,
    /// Region drops wait here for in-flight evictions of their area.
    done_cv: Condvar,
    /// Serialises eviction batches with each other and with fork.
    /// The one lock taken without a guard: the fork hooks hold it from
    /// `fork_prepare` to `fork_parent`/`fork_child` (see `fork.rs`).
    gate: Mutex<()>,
    shutdown: AtomicBool,
    /// The handler holds faults back (budget full): wake it after a batch.
    throttled: AtomicBool,
    wake: sys::EventFd,
    /// The process the helper threads run in (a forked child that did not
    /// take the pager over has none: see `fork.rs`).
    pid: AtomicI32,
    /// The helper threads (replaced, never joined, in a forked child).
    threads: Mutex<Vec<Helper>>,
    /// Eviction starts at `limit - margin` and stops at `limit - 2·margin`,
    /// the margin a 32nd of the budget, at most `evict::MARGIN_MAX`, and
    /// no larger than a sixteenth of the limit (see `PagerCore::margin_at`).
    margin: usize,
    /// Messages read and not yet handled (see [`Dispatch`]).
    dispatch: Mutex<Dispatch>,
    /// When a message was last read, in ns since `epoch`: the CPU handlers
    /// spin while it is recent.
    last_read_ns: AtomicU64,
    epoch: Instant,
    /// Wakes blocked CPU handlers at shutdown (never drained).
    stop: sys::EventFd,
    /// CPU handlers running.
    cpu_handlers: AtomicUsize,
    /// The evictor discards at the idle policy while CPU handlers run (see
    /// `evict`); only where it may go back (`uzswap_os::sched::may_leave_idle`).
    idle_discards: bool,
    /// Where victims of short spans are moved to leave without a remove
    /// event (see `evict`); None without `UFFDIO_MOVE` or with
    /// `evict_by_move` off. Used by the evictor under `gate`.
    staging: Option<sys::Staging>,
    /// Finds resident pages that map the zero page (`State::zero_mapped`)
    /// and counts victims among them (`PagerStats::evict_zero_mapped`);
    /// None without `PagerConfig::uncharged_zero_pages`, with in-thread
    /// faults, or without `PAGEMAP_SCAN`. Used by the evictor only (its
    /// lock is never contended; taken around a scan or a count; the state
    /// lock may be taken inside it, never it inside the state lock).
    zero_scan: Option<Mutex<ZeroLook>>,
    /// The access signal (`access.rs`); None with `access_chunk` 0 or where
    /// the process's `smaps` and `clear_refs` cannot be opened. The
    /// evictor's (a sample takes `state` inside it briefly).
    access: Option<Mutex<access::AccessLook>>,
    /// Faults a CPU handler resolved on the CPU they came from (as far as
    /// it can tell), and faults it took over from another CPU.
    faults_local: AtomicU64,
    faults_remote: AtomicU64,
    /// Faults deferred by EAGAIN (`PagerStats::faults_again`).
    faults_again: AtomicU64,
    /// A fault waits for an event's thread to go on: whoever raised the
    /// event and knows it returned (the evictor) signals `wake`.
    again_waiting: AtomicBool,
    /// The settle sequence, a futex word: bumped whenever something a
    /// fault resolved in-thread (or a pin) may wait for happens (see
    /// `inthread.rs`, "Waiting").
    settle_seq: AtomicU32,
    /// Threads waiting on `settle_seq`.
    sleepers: AtomicU32,
    /// `PagerStats::faults_waited` and `waits_timed_out`.
    faults_waited: AtomicU64,
    waits_timed_out: AtomicU64,
    /// Page buffers for faults resolved in signal handlers (with
    /// `in_thread_faults` only).
    bufs: Option<inthread::BufPool>,
}

/// Owns the helper threads; the last `Pager` or `Region` handle stops them.
pub(crate) struct Owner {
    pub(crate) sh: Arc<PagerCore>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        if !self.sh.ours() {
            // A forked child: the threads do not exist here.
            return;
        }
        if self.sh.cfg.in_thread_faults {
            inthread::release_handler(&self.sh);
        }
        // Relaxed is enough: the flag is re-read after every wake-up below,
        // and the condvar/eventfd provide the ordering.
        self.sh.shutdown.store(true, Ordering::Relaxed);
        self.sh.wake.signal();
        self.sh.stop.signal();
        {
            let _g = self.sh.state.lock();
            self.sh.work_cv.notify_all();
        }
        for t in self.sh.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

/// A set of regions sharing a handler, a store and a budget.
pub struct Pager {
    owner: Arc<Owner>,
}

/// What [`Pager::usage`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PagerUsage {
    /// Pages resident now (what the limit holds).
    pub resident_pages: u64,
    /// Missing faults resolved so far (zero, pool, backing, same-filled).
    pub faults: u64,
    /// Of those, faults resolved with zeros (`PagerStats::faults_zero`):
    /// a first touch of a page never stored, or of one the program
    /// discarded, which the kernel serves in its own fault path.
    pub first_touches: u64,
    /// Pages evicted so far.
    pub evictions: u64,
    /// The store is refusing pages (full, nothing to write back to): the
    /// regions may stay over their limit.
    pub store_full: bool,
    /// Faults of stored pages by how many evictions ago they left: what a
    /// resident set larger by so many pages would not have taken.
    pub refault_distances: uzswap_os::distance::Distances,
    /// Faults served from the store and the time the handler took for
    /// them in all, ns (the fault latency's count and sum).
    pub store_faults: u64,
    pub store_fault_ns: u64,
}

impl Pager {
    /// Opens userfaultfd and starts the handler and evictor threads.
    pub fn new(store: Arc<dyn PageStore>, cfg: PagerConfig) -> Result<Pager, PagerError> {
        if cfg.latency_hold {
            // Opened with the pager's other descriptors (see `open`).
            uzswap_os::latency::open();
        }
        cfg.check()?;
        let sigbus = if cfg.in_thread_faults {
            feature::SIGBUS
        } else {
            0
        };
        #[cfg(feature = "testing")]
        let inject = cfg.inject_open_errno;
        #[cfg(not(feature = "testing"))]
        let inject = None;
        let uffd = Uffd::open(feature::POISON | sigbus, inject)?;
        if uffd.features() & sigbus != sigbus {
            return Err(PagerError::NoSigbus);
        }
        let wake = sys::EventFd::new().map_err(PagerError::Start)?;
        let stop = sys::EventFd::new().map_err(PagerError::Start)?;
        let idle_discards = cfg.cpu_handlers && uzswap_os::sched::may_leave_idle();
        let staging = if cfg.evict_by_move {
            sys::Staging::new(cfg.evict_batch)
        } else {
            None
        };
        let (cfg_in_thread, cfg_ra) = (cfg.in_thread_faults, cfg.readahead_max);
        let (access, access_signal) = if cfg.access_chunk == 0 {
            (None, "off".to_string())
        } else {
            match access::AccessLook::new() {
                Ok(a) => (Some(Mutex::new(a)), "chunks".to_string()),
                Err(e) => (
                    None,
                    format!("unavailable ({e}): victims by the lists alone"),
                ),
            }
        };
        let mut uffd = uffd;
        if access.is_some() {
            uffd.set_edge(cfg.access_chunk);
        }
        // A pager whose faults run in signal handlers looks at no zero
        // runs: noting them could not allocate, and its zero pages stay
        // charged.
        let zero_look = cfg.uncharged_zero_pages && !cfg.in_thread_faults;
        let sh = Arc::new(PagerCore {
            uffd,
            staging,
            zero_scan: zero_look
                .then(|| ZeroLook::new(state::ZERO_RUNS_KEPT).map(Mutex::new))
                .flatten(),
            access,
            store,
            margin: (cfg.budget_pages / 32).clamp(2, evict::MARGIN_MAX),
            state: Mutex::new(State::new(&cfg, zero_look, access_signal)),
            cfg,
            work_cv: Condvar::new(),
            done_cv: Condvar::new(),
            gate: Mutex::new(()),
            shutdown: AtomicBool::new(false),
            throttled: AtomicBool::new(false),
            wake,
            pid: AtomicI32::new(sys::getpid()),
            threads: Mutex::new(Vec::new()),
            dispatch: Mutex::new(Dispatch::default()),
            last_read_ns: AtomicU64::new(0),
            epoch: Instant::now(),
            stop,
            cpu_handlers: AtomicUsize::new(0),
            idle_discards,
            faults_local: AtomicU64::new(0),
            faults_remote: AtomicU64::new(0),
            faults_again: AtomicU64::new(0),
            again_waiting: AtomicBool::new(false),
            settle_seq: AtomicU32::new(0),
            sleepers: AtomicU32::new(0),
            faults_waited: AtomicU64::new(0),
            waits_timed_out: AtomicU64::new(0),
            bufs: cfg_in_thread.then(|| inthread::BufPool::new(cfg_ra + 1)),
        });
        if sh.cfg.in_thread_faults {
            sh.state.lock().reserve_queues();
            inthread::claim_handler(&sh)?;
        }
        // The first reading before any region exists, so that no fault is
        // served against the whole budget.
        sh.recharge();
        let owner = Arc::new(Owner { sh: sh.clone() });
        sh.start_threads().map_err(PagerError::Start)?;
        fork::register(&sh);
        Ok(Pager { owner })
    }

    /// Maps a new region of `bytes` (rounded up to pages).
    pub fn region(&self, bytes: usize) -> Result<crate::Region, RegionError> {
        let len = bytes.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        if len == 0 {
            return Err(RegionError::Empty);
        }
        let addr = sys::map_anon(len).map_err(RegionError::Map)?;
        self.adopt(addr, len)
    }

    /// Maps a new region of `len` bytes at `addr`, replacing whatever the
    /// caller had mapped there (typically its own `PROT_NONE` reservation,
    /// so that all regions of a program lie in one address range).
    ///
    /// # Safety
    /// `addr..addr + len` must be page aligned and owned by the caller, with
    /// nothing in it still in use: its old contents are gone.
    pub unsafe fn region_at(&self, addr: usize, len: usize) -> Result<crate::Region, RegionError> {
        if len == 0 {
            return Err(RegionError::Empty);
        }
        if !addr.is_multiple_of(PAGE_SIZE) || !len.is_multiple_of(PAGE_SIZE) {
            return Err(RegionError::Unaligned { addr, len });
        }
        // SAFETY: the caller owns the range and gives up its contents.
        unsafe { sys::map_anon_at(addr, len) }.map_err(RegionError::Map)?;
        self.adopt(addr, len)
    }

    /// Registers the fresh anonymous mapping `addr..addr + len` and makes
    /// it a region; unmaps it if that fails.
    fn adopt(&self, addr: usize, len: usize) -> Result<crate::Region, RegionError> {
        let sh = &self.owner.sh;
        // Best effort: a kernel without THP refuses the advice, harmlessly.
        let _ = sys::no_huge_pages(addr, len);
        if let Err(e) = sh.uffd.register(addr, len) {
            // SAFETY: we just mapped it and nobody has seen the address.
            unsafe { sys::unmap(addr, len) };
            return Err(RegionError::Register(e));
        }
        let area = {
            let mut s = sh.state.lock();
            let area = s.next_area;
            s.next_area += 1;
            s.areas.insert(
                area,
                Area {
                    meta: zeroed_meta(len / PAGE_SIZE),
                    dying: false,
                    inflight: 0,
                    reached: 0,
                    split: 0,
                    ra: Readahead::new(),
                    zr: Readahead::new(),
                },
            );
            s.segs.insert(
                addr,
                Seg {
                    len,
                    area,
                    first: 0,
                },
            );
            area
        };
        sh.store.open_area(area);
        Ok(crate::Region::new(self.owner.clone(), area, addr, len))
    }

    /// Test hook (feature `testing`): takes a sample of the access signal
    /// now, as the evictor does while it evicts (`pager/access.rs`).
    #[cfg(feature = "testing")]
    pub fn sample_access_now(&self) {
        self.owner.sh.sample_access_now();
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PagerStats {
        self.owner.sh.stats()
    }

    /// Makes room for the child of a fork about to be made, as
    /// [`PagerConfig::fork_room`] says (nothing without it, or when the
    /// child will not take this pager over). The host calls it from its
    /// own `pthread_atfork` prepare hook before it takes any lock the
    /// evictor or its charge may take: it waits (at most
    /// `FORK_ROOM_WAIT`) for the evictor.
    pub fn make_room_for_fork(&self) {
        self.owner.sh.make_room_for_fork();
    }

    /// The few counters a host reads often (every few milliseconds), without
    /// the latency summaries [`Pager::stats`] computes.
    pub fn usage(&self) -> PagerUsage {
        let s = self.owner.sh.state.lock();
        let st = &s.stats;
        PagerUsage {
            resident_pages: s.charged() as u64,
            faults: st.faults_zero + st.faults_pool + st.faults_backing + st.faults_same_filled,
            first_touches: st.faults_zero,
            evictions: st.evictions,
            store_full: s.store_full,
            refault_distances: s.refault_distances,
            store_faults: s.lat_store.count(),
            store_fault_ns: s.lat_store.sum_ns(),
        }
    }

    /// Whether every page of `[addr, addr + len)` lies in a region of this
    /// pager and was never touched or was discarded since (`Absent`): such
    /// pages read as zeros, and only a fault maps them. A page that another
    /// thread touches meanwhile stops being so: the caller must own the
    /// range (a block it just allocated).
    pub fn untouched(&self, addr: usize, len: usize) -> bool {
        let s = self.owner.sh.state.lock();
        (addr..addr.saturating_add(len))
            .step_by(PAGE_SIZE)
            .all(|a| match state::lookup(&s.segs, a) {
                Some((area, page)) => s
                    .areas
                    .get(&area)
                    .and_then(|ar| ar.meta.get(page as usize))
                    .is_some_and(|m| m.st == state::PageState::Absent),
                None => false,
            })
    }

    /// How long a fault has waited unread: `Some` while the userfaultfd has
    /// a message to read, with the time since the handler last read one;
    /// `None` when nothing waits. A host that runs the handler at idle
    /// priority beside a busy thread (co-scheduling) reads it to see a
    /// fault of another thread waiting behind that one.
    pub fn fault_unread_for(&self) -> Option<std::time::Duration> {
        let sh = &self.owner.sh;
        crate::sys::readable(sh.uffd.raw_fd()).then(|| sh.since_read())
    }

    /// Brings every evicted page of every region back (what the fork hook
    /// does). Returns the pages brought back.
    pub fn prefault_all(&self) -> usize {
        let sh = &self.owner.sh;
        let _gate = sh.gate.lock();
        sh.prefault_all_locked()
    }

    /// Whether victims can leave by a move into the staging area
    /// (`PagerConfig::evict_by_move` on and the kernel has `UFFDIO_MOVE`).
    pub fn evicts_by_move(&self) -> bool {
        self.owner.sh.staging.is_some()
    }

    /// Negotiated userfaultfd feature bits (see `sys::feature`).
    pub fn features(&self) -> u64 {
        self.owner.sh.uffd.features()
    }

    /// Checks the pager's invariants (see `PagerCore::check_invariants`).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.owner.sh.check_invariants()
    }
}

impl PagerCore {
    /// Whether this process runs the pager's threads.
    fn ours(&self) -> bool {
        self.pid.load(Ordering::Relaxed) == sys::getpid()
    }

    /// Starts the handler, the evictor and the CPU handlers (at creation).
    fn start_threads(self: &Arc<Self>) -> std::io::Result<()> {
        self.start_handler(false)?;
        self.start_others()
    }

    /// Starts the main handler. With `serve_meanwhile` (a forked child,
    /// whose regions have no handler yet) the calling thread serves their
    /// faults until the new thread runs: the thread library's start-up
    /// reads memory of the program's (its locale data), which may be
    /// evicted. The budget is soft meanwhile (no evictor runs yet to make
    /// room for a deferred fault).
    pub(super) fn start_handler(self: &Arc<Self>, serve_meanwhile: bool) -> std::io::Result<()> {
        let h = self.clone();
        let w = self.clone();
        let warm = move || w.store.warm_thread();
        let body = move || h.handler_loop();
        let t = if serve_meanwhile {
            let soft = {
                let mut s = self.state.lock();
                std::mem::replace(&mut s.store_full, true)
            };
            let t = uzswap_os::spawn_helper_serving(
                "uzswap-uffd",
                self.cfg.thread_start,
                warm,
                body,
                |started| self.serve(Some(started)),
            );
            let mut s = self.state.lock();
            s.store_full = soft;
            t?
        } else {
            uzswap_os::spawn_helper_warmed("uzswap-uffd", self.cfg.thread_start, warm, body)?
        };
        self.threads.lock().push(t);
        Ok(())
    }

    /// Starts the evictor and the CPU handlers.
    pub(super) fn start_others(self: &Arc<Self>) -> std::io::Result<()> {
        let e = self.clone();
        let w = self.clone();
        let t = uzswap_os::spawn_helper_warmed(
            "uzswap-evict",
            self.cfg.thread_start,
            move || w.store.warm_thread(),
            move || e.evictor_loop(),
        )?;
        self.threads.lock().push(t);
        if self.cfg.cpu_handlers {
            // Without an affinity mask there are no CPU handlers: the main
            // handler serves every fault, as it does anyway as a backstop.
            let cpus = sys::allowed_cpus().unwrap_or_default();
            for cpu in cpus.into_iter().take(MAX_CPU_HANDLERS) {
                let c = self.clone();
                let w = self.clone();
                let t = uzswap_os::spawn_helper_warmed(
                    "uzswap-uffd-cpu",
                    self.cfg.thread_start,
                    move || w.store.warm_thread(),
                    move || c.cpu_handler_loop(cpu),
                )?;
                self.threads.lock().push(t);
            }
        }
        Ok(())
    }

    fn stats(&self) -> PagerStats {
        let mut st = {
            let s = self.state.lock();
            let mut st = s.stats.clone();
            st.resident_pages = s.resident as u64;
            st.zero_mapped_pages = s.zero_mapped as u64;
            st.list_entries = (s.inactive.len() + s.active.len()) as u64;
            st.lists_bytes = ((s.inactive.capacity() + s.active.capacity())
                * std::mem::size_of::<state::QEntry>()) as u64;
            st.over_budget = s.store_full;
            st.fault_latency = s.lat_store.summary();
            st.zero_fault_latency = s.lat_zero.summary();
            st.copy_latency = s.lat_copy.summary();
            st
        };
        st.cpu_handlers = self.cpu_handlers.load(Ordering::Relaxed) as u64;
        st.faults_local = self.faults_local.load(Ordering::Relaxed);
        st.faults_remote = self.faults_remote.load(Ordering::Relaxed);
        st.faults_again = self.faults_again.load(Ordering::Relaxed);
        st.faults_waited = self.faults_waited.load(Ordering::Relaxed);
        st.waits_timed_out = self.waits_timed_out.load(Ordering::Relaxed);
        let lat = uzswap_os::latency::stats();
        st.latency_hold = lat.state.to_string();
        st.latency_holds = lat.holds;
        st.latency_held_s = lat.held_ns as f64 / 1e9;
        st.latency_read_held = lat.read_held;
        st.store = self.store.stats();
        st.stored_pages = st.store.pages;
        st
    }

    fn page_addr(s: &State, area: u32, page: u64) -> Option<usize> {
        s.segs.iter().find_map(|(start, seg)| {
            (seg.area == area
                && page >= seg.first
                && page < seg.first + (seg.len / PAGE_SIZE) as u64)
                .then(|| start + (page - seg.first) as usize * PAGE_SIZE)
        })
    }

    /// Drops a region: waits for evictions in flight, unregisters, unmaps,
    /// and drops the store's entries.
    ///
    /// The segments are read under the dispatch lock, then the state lock:
    /// the program's `munmap` or `mremap` of part of the region returns
    /// once a handler has *read* its event, and a handler reads and handles
    /// events under the dispatch lock. Read under the state lock alone,
    /// the segments could still list a range the program unmapped (or
    /// moved) a moment ago, which the kernel may have handed to another
    /// mapping since: unmapping it would take that mapping away (seen: a
    /// test thread's region vanished, SIGSEGV, while another test dropped a
    /// region it had just unmapped part of).
    pub(crate) fn drop_area(&self, area: u32) {
        if !self.ours() {
            return; // a forked child: the pager is not ours to touch
        }
        let segs = loop {
            let d = self.dispatch.lock();
            let mut s = self.state.lock();
            if let Some(a) = s.areas.get_mut(&area) {
                a.dying = true;
            }
            if s.areas.get(&area).is_some_and(|a| a.inflight > 0) {
                // An eviction in flight may need the dispatch lock to
                // finish (a page moved back): wait without it, then take
                // both again and look again.
                drop(d);
                self.done_cv.wait(&mut s);
                continue;
            }
            let segs: Vec<(usize, Seg)> = s
                .segs
                .iter()
                .filter(|(_, seg)| seg.area == area)
                .map(|(a, seg)| (*a, *seg))
                .collect();
            for (a, _) in &segs {
                s.segs.remove(a);
            }
            if let Some(a) = s.areas.remove(&area) {
                let r = a.meta.iter().filter(|m| m.st.resident()).count();
                let act = a
                    .meta
                    .iter()
                    .filter(|m| m.st.resident() && m.active)
                    .count();
                s.resident -= r;
                s.n_active -= act;
            }
            break segs;
        };
        for (addr, seg) in segs {
            let _ = self.uffd.unregister(addr, seg.len);
            // SAFETY: the region is being dropped; its segments were ours
            // and are no longer known to the handler or the evictor.
            unsafe { sys::unmap(addr, seg.len) };
        }
        self.store.invalidate_area(area);
    }

    pub(crate) fn page_state(&self, area: u32, page: u64) -> Option<PageState> {
        let s = self.state.lock();
        s.areas.get(&area)?.meta.get(page as usize).map(|m| m.st)
    }

    /// Runs `f` with the state lock held: no fault, load or move back maps
    /// a page into a region meanwhile (each maps under that lock), while
    /// the evictor and the program may still take pages away. `f` must not
    /// touch region memory (with in-thread faults that would take this
    /// lock again).
    pub(crate) fn while_nothing_maps<T>(&self, f: impl FnOnce() -> T) -> T {
        let _s = self.state.lock();
        f()
    }

    pub(crate) fn area_resident(&self, area: u32) -> usize {
        let s = self.state.lock();
        s.areas
            .get(&area)
            .map_or(0, |a| a.meta.iter().filter(|m| m.st.resident()).count())
    }
}
