//! The pager: one userfaultfd, one handler thread, one evictor thread, one
//! [`PageStore`] and one resident budget shared by all its regions.
//!
//! See the crate documentation for the protocol; this file implements it.
//!
//! # Lock order
//! 1. `Shared::gate` (raw mutex: one eviction batch or one fork at a time)
//! 2. `Shared::dispatch` (the handlers, while they read and handle a batch;
//!    the evictor takes it, holding nothing else but the gate, after each
//!    discard: a barrier behind which every event of that call was
//!    handled). Handlers never take the gate.
//! 3. `Shared::state`
//! 4. the store's internal locks (taken inside `PageStore` calls)
//!
//! No thread holds `state` across a call that may need the handler to make
//! progress: `madvise` on a registered range (it waits until the handler has
//! read the remove event) or a read of region memory (it may fault). The
//! handler itself never waits for the evictor: a fault that must wait is
//! *parked* (a flag on the page) and woken by whoever settles the page.

use crate::stats::{Histogram, PagerStats};
use crate::store::{LoadError, LoadMode, Loaded, PageStore};
use crate::sys::{self, feature, Msg, OpenError, RawMsg, Uffd, PAGE_SIZE};
use parking_lot::lock_api::RawMutex as _;
use parking_lot::{Condvar, Mutex, RawMutex};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use uzswap_cache::spawn_helper;

/// Tries of a load that must succeed before the access gets SIGBUS (pauses
/// of 1 and 4 ms between them).
const LOAD_ATTEMPTS: usize = 3;

/// How victims are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum VictimPolicy {
    /// Two lists with second chance and refault-distance activation (see
    /// the crate documentation). The default.
    Workingset,
    /// Plain first-in first-out, for comparison.
    Fifo,
}

/// Settings of a [`Pager`].
#[derive(Clone, Debug)]
pub struct PagerConfig {
    /// Most pages of all regions resident at once. At least 16.
    pub budget_pages: usize,
    /// Most stored neighbours brought back with a faulting page.
    pub readahead_max: usize,
    /// Victim choice.
    pub policy: VictimPolicy,
    /// How long the handler spins on the descriptor after its last message
    /// before blocking in poll (a wake-up from poll costs several µs).
    pub spin: Duration,
    /// Pages evicted per batch.
    pub evict_batch: usize,
    /// Run a fault handler on each CPU the process may use (at most
    /// [`MAX_CPU_HANDLERS`]), so that a fault is resolved on the faulting
    /// thread's own CPU (see the crate documentation, "CPU handlers").
    pub cpu_handlers: bool,
    /// How long the CPU handlers keep spinning after the last fault before
    /// they block (they spin only on CPUs with nothing else to run).
    pub cpu_spin: Duration,
    /// Keep the store's copy of a page brought back, and map it
    /// write-protected (`Clean`): evicting it again unwritten then needs no
    /// compression, at the cost of pool memory for resident pages. `false`
    /// frees the copy as soon as the page is mapped (writable, `Dirty`), as
    /// the kernel's zswap frees an entry on load: less memory, more
    /// compression.
    pub keep_clean: bool,
    /// Bring every evicted page back before `fork()` (see `crate` docs).
    pub fork_prefault: bool,
    /// Drop victims of short spans by moving them into a staging area
    /// (`UFFDIO_MOVE`, where the kernel has it), which raises no remove
    /// event, instead of `MADV_DONTNEED` on the region (see `crate` docs,
    /// "Eviction").
    pub evict_by_move: bool,
    /// Called first on each helper thread the pager starts (the handler
    /// and the evictor), e.g. to mark them as the runtime's own threads.
    pub thread_start: Option<fn()>,
    /// Memory outside the regions that the budget pays for, in bytes (the
    /// store's index, the host's own heap, ...), read by the evictor about
    /// every [`CHARGE_PERIOD`]: the pages resident in regions are then kept
    /// within `budget_pages` minus that, as a memory cgroup charges the
    /// kernel's own allocations for a task to its limit. The regions keep
    /// at least a quarter of the budget whatever the charge. `None`: the
    /// budget is for region pages alone.
    pub charge: Option<Charge>,
    /// Test hook: pretend userfaultfd(2) failed with this errno and
    /// /dev/userfaultfd with EACCES.
    #[doc(hidden)]
    pub inject_open_errno: Option<i32>,
}

impl PagerConfig {
    /// Defaults for a budget of `budget_pages`.
    pub fn new(budget_pages: usize) -> PagerConfig {
        PagerConfig {
            budget_pages,
            readahead_max: 8,
            policy: VictimPolicy::Workingset,
            spin: Duration::from_micros(50),
            evict_batch: 64,
            cpu_handlers: false,
            cpu_spin: Duration::from_millis(2),
            fork_prefault: true,
            evict_by_move: true,
            keep_clean: true,
            thread_start: None,
            charge: None,
            inject_open_errno: None,
        }
    }
}

/// Spans of at most this many victims leave by moves (one `UFFDIO_MOVE`
/// and one TLB flush per page) rather than one `MADV_DONTNEED` (one remove
/// event through a handler and one TLB flush per span).
const MOVE_MAX_SPAN: usize = 4;

/// How often the evictor reads [`PagerConfig::charge`].
pub const CHARGE_PERIOD: Duration = Duration::from_millis(10);

/// Most CPU handlers one pager starts.
pub const MAX_CPU_HANDLERS: usize = 16;

/// A CPU handler that did not run for this long was preempted: a thread of
/// its CPU ran meanwhile, and may just have faulted.
const CPU_GAP: Duration = Duration::from_micros(3);

/// How long after such a gap a CPU handler takes faults as its own CPU's.
const CPU_FRESH: Duration = Duration::from_micros(10);

/// How long faults wait for the handler of the faulting thread's CPU
/// before any handler takes them (that CPU may be busy with other work).
const HANDOFF_WAIT: Duration = Duration::from_micros(20);

/// How often the main handler looks at the descriptor while the CPU
/// handlers spin (a backstop for when none of them gets a CPU).
const MAIN_BACKSTOP_MS: i32 = 1;

/// How far from a victim the evictor looks for more inactive pages to take
/// with it (pages, either side).
const CLUSTER_SCAN: usize = 256;

/// The most pages between two victims that one discard may span.
const MAX_GAP: u64 = 512;

/// A reading of memory the budget pays for (see [`PagerConfig::charge`]).
/// It runs on the evictor thread with no pager lock held, and must not
/// touch region memory.
#[derive(Clone)]
pub struct Charge(pub Arc<dyn Fn() -> u64 + Send + Sync>);

impl std::fmt::Debug for Charge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Charge(..)")
    }
}

/// Why a pager could not be made. Nothing is left set up.
#[derive(Debug, thiserror::Error)]
pub enum PagerError {
    /// userfaultfd could not be opened or negotiated.
    #[error(transparent)]
    Open(#[from] OpenError),
    /// The configuration is unusable.
    #[error("invalid pager configuration: {0}")]
    Config(&'static str),
    /// A helper thread or descriptor could not be created.
    #[error("could not start the pager: {0}")]
    Start(io::Error),
}

/// Why a region could not be made. Nothing is left set up.
#[derive(Debug, thiserror::Error)]
pub enum RegionError {
    /// Zero-sized region.
    #[error("a region needs at least one page")]
    Empty,
    /// `region_at` was given an address or length that is not page aligned.
    #[error("region_at({addr:#x}, {len}): address and length must be multiples of the page size")]
    Unaligned { addr: usize, len: usize },
    /// mmap failed.
    #[error("could not map the region: {0}")]
    Map(io::Error),
    /// UFFDIO_REGISTER failed.
    #[error("could not register the region with userfaultfd: {0}")]
    Register(io::Error),
}

/// The state of one page of a region.
///
/// "mapped" means a page may be present at the page's address; the store
/// "holds" it when an entry equal to the page's contents exists.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[repr(u8)]
pub enum PageState {
    /// Not mapped, not held: a fault maps zeros. Zero, so that a zeroed
    /// [`PageMeta`] is a default one (see [`zeroed_meta`]).
    #[default]
    Absent = 0,
    /// Not mapped, held: a fault loads it.
    Stored,
    /// Mapped and writable; the store holds nothing for it.
    Dirty,
    /// Mapped write-protected; the store holds an identical copy (loaded
    /// with `LoadMode::Keep`), so eviction only drops it.
    Clean,
    /// Mapped write-protected while the evictor copies and stores it.
    Evicting,
    /// Like `Evicting`, but a write is waiting: the evictor will drop what
    /// it stored, unprotect the page and make it `Dirty`.
    EvictAborted,
    /// Held; the evictor is discarding the mapping (`MADV_DONTNEED`).
    Discarding,
}

impl PageState {
    fn resident(self) -> bool {
        !matches!(self, PageState::Absent | PageState::Stored)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct PageMeta {
    st: PageState,
    /// A fault on this page waits for the evictor to settle it; whoever
    /// settles the page (evictor commit/settle, or a remove event) clears
    /// the flag and wakes the range. Set in `Evicting`, `EvictAborted` and
    /// `Discarding`, on a `zapping` page, and on a page between victims of
    /// a discard in flight (`OwnSpan`, which lists it for the wake-up).
    parked: bool,
    /// A write was seen since the page was queued (second chance).
    referenced: bool,
    /// The page is a victim of the eviction batch in flight (from claim to
    /// settle). The evictor reads such a page; if the program discarded it
    /// meanwhile that read faults, and the handler must serve it even with
    /// the budget full (the evictor is the one that would make room).
    claimed: bool,
    /// The page is on the active list (only meaningful while resident).
    active: bool,
    /// The evictor will drop (`MADV_DONTNEED`) the page's mapping and has
    /// not yet done so. A missing fault on such a page waits for the drop
    /// (`parked`) whatever the state: if the program discarded the page
    /// meanwhile (remove event: `Absent`) and a fault mapped a new page,
    /// the evictor's drop would take that page and what was written to it.
    /// Set when a victim is committed to discarding, cleared (waking the
    /// parked) when the drop returned.
    zapping: bool,
    /// A missing fault found the page `Dirty`/`Clean` and was only woken
    /// (the usual case: a readahead mapped it meanwhile). A second such
    /// fault before the page is queued again means nothing is mapped.
    woken: bool,
    /// Spared once this residency for its active neighbours (`select`).
    spared: bool,
    /// On the active list at some point this residency (activated at its
    /// refault, seen written, or spared): part of the working set, so its
    /// eviction uses the store's fast codec (`PageStore::store_cold`
    /// serves the others).
    warm: bool,
    /// Generation of the page's queue entry; older entries are stale.
    qgen: u32,
    /// Eviction clock when the page was last evicted (valid if `Stored`).
    evicted_at: u32,
}

/// `n` default page records from zeroed memory: the allocator maps zero
/// pages, which the kernel backs only once written, so a region's records
/// cost resident memory where its pages are used, not where they are only
/// mapped (a program's reservations, a space's chunk not yet reached).
fn zeroed_meta(n: usize) -> Vec<PageMeta> {
    if n == 0 {
        return Vec::new();
    }
    let layout =
        std::alloc::Layout::array::<PageMeta>(n).expect("a region's records fit in memory");
    // SAFETY: the layout's size is not zero. All-zero bits are a valid
    // `PageMeta::default()`: `PageState::Absent` is 0 (`repr(u8)`), the
    // flags false, the counters 0; so the allocation holds `n` initialised
    // records, and the Vec frees it with the layout it was made with.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout).cast::<PageMeta>();
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Vec::from_raw_parts(p, n, n)
    }
}

struct Area {
    meta: Vec<PageMeta>,
    /// The region is being dropped: no new victims from it.
    dying: bool,
    /// Victims of this area inside an eviction batch.
    inflight: usize,
    /// Readahead: page index of the last missing fault, and the window.
    ra_next: u64,
    ra_window: usize,
}

/// A registered address range: `len` bytes starting at the key, holding
/// pages `first..` of `area`. Split and moved by remap events.
#[derive(Clone, Copy, Debug)]
struct Seg {
    len: usize,
    area: u32,
    first: u64,
}

/// One `MADV_DONTNEED` of the evictor: victims and the pages between them,
/// none of which was resident when it was chosen (so the call drops only
/// victims, and one remove event and one TLB flush serve them all).
/// Lives from the commit that chose it until the call returned:
/// - a remove event for a page whose `unseen` bit is set is ours (the bit
///   is cleared); any other is the program's. If the program discards the
///   same page at the same moment, both events count, whichever is read
///   first, and the page ends `Absent` either way;
/// - a missing fault on any of its pages waits (`parked`, woken when the
///   call returned): mapped now, the page would be dropped by the call with
///   whatever the program wrote to it. Victims park through
///   `PageMeta::zapping`, the pages between them here.
struct OwnSpan {
    lo: usize,
    hi: usize,
    /// A bit per page: its remove event has not been read yet.
    unseen: Vec<u64>,
    /// Pages between victims whose faults wait for the call to return.
    parked: Vec<usize>,
}

impl OwnSpan {
    fn new(lo: usize, hi: usize) -> Self {
        let n = (hi - lo) / PAGE_SIZE;
        let mut unseen = vec![u64::MAX; n.div_ceil(64)];
        if !n.is_multiple_of(64) {
            *unseen.last_mut().expect("a span holds a page") = (1u64 << (n % 64)) - 1;
        }
        OwnSpan {
            lo,
            hi,
            unseen,
            parked: Vec::new(),
        }
    }

    /// Clears the bit of the page at `addr` (inside the span); whether it
    /// was set.
    fn take(&mut self, addr: usize) -> bool {
        let i = (addr - self.lo) / PAGE_SIZE;
        let (w, b) = (i / 64, 1u64 << (i % 64));
        let set = self.unseen[w] & b != 0;
        self.unseen[w] &= !b;
        set
    }
}

#[derive(Clone, Copy)]
struct QEntry {
    area: u32,
    page: u32,
    qgen: u32,
}

struct State {
    areas: HashMap<u32, Area>,
    segs: BTreeMap<usize, Seg>,
    inactive: VecDeque<QEntry>,
    active: VecDeque<QEntry>,
    /// Resident pages on the active list.
    n_active: usize,
    /// Pages in a resident state, over all areas.
    resident: usize,
    /// Evictions so far (wrapping), for refault distances.
    evict_clock: u32,
    /// The ranges the evictor is discarding (one `MADV_DONTNEED` each),
    /// by address, from the commit that chose them until the call returned
    /// (see [`OwnSpan`]).
    own: Vec<OwnSpan>,
    next_area: u32,
    stats: PagerStats,
    lat_store: Histogram,
    lat_zero: Histogram,
    /// Time inside the UFFDIO_COPY of store faults (includes waking the
    /// faulting thread).
    lat_copy: Histogram,
    /// The store refused the last whole batch: faults are not held back by
    /// the budget until a store succeeds (holding them would wait forever).
    store_full: bool,
    /// Pages resident in regions may reach this: the budget less what
    /// `PagerConfig::charge` reported (never below a quarter of it).
    limit: usize,
}

pub(crate) struct Shared {
    uffd: Uffd,
    store: Arc<dyn PageStore>,
    cfg: PagerConfig,
    state: Mutex<State>,
    /// The evictor waits here for work.
    work_cv: Condvar,
    /// Region drops wait here for in-flight evictions of their area.
    done_cv: Condvar,
    /// Serialises eviction batches with each other and with fork.
    gate: RawMutex,
    shutdown: AtomicBool,
    /// The handler holds faults back (budget full): wake it after a batch.
    throttled: AtomicBool,
    wake: sys::EventFd,
    pid: i32,
    /// Eviction starts at `limit - margin` and stops at `limit - 2·margin`.
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
    /// `evict`); only where it may go back (`sys::may_leave_idle`).
    idle_discards: bool,
    /// Where victims of short spans are moved to leave without a remove
    /// event (see `evict`); None without `UFFDIO_MOVE` or with
    /// `evict_by_move` off. Used by the evictor under `gate`.
    staging: Option<sys::Staging>,
    /// Faults a CPU handler resolved on the CPU they came from (as far as
    /// it can tell), and faults it took over from another CPU.
    faults_local: AtomicU64,
    faults_remote: AtomicU64,
    /// Faults deferred by EAGAIN (`PagerStats::faults_again`).
    faults_again: AtomicU64,
    /// A fault waits for an event's thread to go on: whoever raised the
    /// event and knows it returned (the evictor) signals `wake`.
    again_waiting: AtomicBool,
}

/// Messages between reading and handling, shared by the handlers.
///
/// Ordering rule: the descriptor is read only with this lock held and
/// `handoff` empty, and what was read is handled (or put in `handoff`)
/// before the lock is released; a batch in `handoff` is handled with the
/// lock held too. So messages are handled in the order they were read, one
/// batch at a time, as by a single thread: a fault read after a remove
/// event is never handled before it.
#[derive(Default)]
struct Dispatch {
    /// Faults read by a CPU handler that had been spinning on an idle CPU,
    /// so they came from another CPU: left for the handler of that CPU,
    /// which runs as soon as the faulting thread sleeps; after
    /// [`HANDOFF_WAIT`] any handler takes them.
    handoff: Vec<RawMsg>,
    handoff_at: Option<Instant>,
    /// Faults a CPU handler could not resolve yet (EAGAIN, budget full),
    /// for the main handler's retries.
    deferred: Vec<Fault>,
}

/// Owns the helper threads; the last `Pager` or `Region` handle stops them.
pub(crate) struct Owner {
    pub(crate) sh: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        if self.sh.pid != sys::getpid() {
            // A forked child: the threads do not exist here.
            return;
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
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

/// A set of regions sharing a handler, a store and a budget.
pub struct Pager {
    owner: Arc<Owner>,
}

/// One page buffer aligned to a page (UFFDIO_COPY wants an aligned source).
struct PageBuf {
    ptr: *mut u8,
    pages: usize,
}

impl PageBuf {
    fn new(pages: usize) -> PageBuf {
        let layout = std::alloc::Layout::from_size_align(pages * PAGE_SIZE, PAGE_SIZE)
            .expect("page buffer layout");
        // SAFETY: the layout has a non-zero size (pages >= 1).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory for a page buffer");
        PageBuf { ptr, pages }
    }

    fn page(&mut self, i: usize) -> &mut [u8] {
        assert!(i < self.pages);
        // SAFETY: page i lies inside the allocation, and `&mut self` makes
        // the returned slice the only reference to it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * PAGE_SIZE), PAGE_SIZE) }
    }

    fn addr(&self, i: usize) -> *const u8 {
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

// ---- fork -----------------------------------------------------------------

static REGISTRY: Mutex<Vec<Weak<Shared>>> = parking_lot::const_mutex(Vec::new());
static FORK_HELD: Mutex<Vec<Arc<Shared>>> = parking_lot::const_mutex(Vec::new());
static ATFORK: std::sync::Once = std::sync::Once::new();

unsafe extern "C" fn fork_prepare() {
    let list: Vec<Arc<Shared>> = REGISTRY
        .lock()
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|s| s.cfg.fork_prefault && s.pid == sys::getpid())
        .collect();
    for s in &list {
        s.gate.lock();
        s.prefault_all_locked();
    }
    *FORK_HELD.lock() = list;
}

unsafe extern "C" fn fork_parent() {
    for s in std::mem::take(&mut *FORK_HELD.lock()) {
        // SAFETY: fork_prepare locked the gate of every pager in FORK_HELD
        // on this thread and nothing unlocked it since.
        unsafe { s.gate.unlock() };
        let _g = s.state.lock();
        s.work_cv.notify_one();
    }
}

unsafe extern "C" fn fork_child() {
    let held = std::mem::take(&mut *FORK_HELD.lock());
    for s in &held {
        // SAFETY: as in fork_parent; the child's copy of the lock is held by
        // the (only) thread that runs this hook.
        unsafe { s.gate.unlock() };
    }
    // The child never uses the pager: keep the references from running
    // any destructor there.
    std::mem::forget(held);
}

// ---- pager ----------------------------------------------------------------

impl Pager {
    /// Opens userfaultfd and starts the handler and evictor threads.
    pub fn new(store: Arc<dyn PageStore>, cfg: PagerConfig) -> Result<Pager, PagerError> {
        if cfg.budget_pages < 16 {
            return Err(PagerError::Config("budget_pages must be at least 16"));
        }
        if cfg.evict_batch == 0 {
            return Err(PagerError::Config("evict_batch must be at least 1"));
        }
        let uffd = Uffd::open(feature::POISON, cfg.inject_open_errno)?;
        let wake = sys::EventFd::new().map_err(PagerError::Start)?;
        let stop = sys::EventFd::new().map_err(PagerError::Start)?;
        let idle_discards = cfg.cpu_handlers && sys::may_leave_idle();
        let staging = if cfg.evict_by_move {
            sys::Staging::new(cfg.evict_batch)
        } else {
            None
        };
        let sh = Arc::new(Shared {
            uffd,
            staging,
            store,
            margin: (cfg.budget_pages / 32).clamp(2, 256),
            state: Mutex::new(State {
                areas: HashMap::new(),
                segs: BTreeMap::new(),
                inactive: VecDeque::new(),
                active: VecDeque::new(),
                n_active: 0,
                resident: 0,
                evict_clock: 0,
                own: Vec::new(),
                next_area: 1,
                stats: PagerStats {
                    budget_pages: cfg.budget_pages as u64,
                    limit_pages: cfg.budget_pages as u64,
                    ..PagerStats::default()
                },
                lat_store: Histogram::default(),
                lat_zero: Histogram::default(),
                lat_copy: Histogram::default(),
                store_full: false,
                limit: cfg.budget_pages,
            }),
            cfg,
            work_cv: Condvar::new(),
            done_cv: Condvar::new(),
            gate: RawMutex::INIT,
            shutdown: AtomicBool::new(false),
            throttled: AtomicBool::new(false),
            wake,
            pid: sys::getpid(),
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
        });
        // The first reading before any region exists, so that no fault is
        // served against the whole budget.
        sh.recharge();
        let owner = Arc::new(Owner {
            sh: sh.clone(),
            threads: Mutex::new(Vec::new()),
        });
        let h = sh.clone();
        let t1 = spawn_helper("uzswap-uffd", sh.cfg.thread_start, move || h.handler_loop())
            .map_err(PagerError::Start)?;
        owner.threads.lock().push(t1);
        let e = sh.clone();
        let t2 = spawn_helper("uzswap-evict", sh.cfg.thread_start, move || {
            e.evictor_loop()
        })
        .map_err(PagerError::Start)?;
        owner.threads.lock().push(t2);
        if sh.cfg.cpu_handlers {
            // Without an affinity mask there are no CPU handlers: the main
            // handler serves every fault, as it does anyway as a backstop.
            let cpus = sys::allowed_cpus().unwrap_or_default();
            for cpu in cpus.into_iter().take(MAX_CPU_HANDLERS) {
                let c = sh.clone();
                let t = spawn_helper("uzswap-uffd-cpu", sh.cfg.thread_start, move || {
                    c.cpu_handler_loop(cpu)
                })
                .map_err(PagerError::Start)?;
                owner.threads.lock().push(t);
            }
        }
        REGISTRY.lock().push(Arc::downgrade(&sh));
        ATFORK.call_once(|| {
            sys::atfork(fork_prepare, fork_parent, fork_child).expect("pthread_atfork");
        });
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
                    ra_next: u64::MAX,
                    ra_window: 0,
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

    /// A snapshot of the counters.
    pub fn stats(&self) -> PagerStats {
        self.owner.sh.stats()
    }

    /// Brings every evicted page of every region back (what the fork hook
    /// does). Returns the pages brought back.
    pub fn prefault_all(&self) -> usize {
        let sh = &self.owner.sh;
        sh.gate.lock();
        let n = sh.prefault_all_locked();
        // SAFETY: locked just above on this thread.
        unsafe { sh.gate.unlock() };
        n
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

    /// Checks the pager's invariants (see `Shared::check_invariants`).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.owner.sh.check_invariants()
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
struct Wakes {
    defer: bool,
    ranges: Vec<(usize, usize)>,
    kick: bool,
}

impl Wakes {
    fn now() -> Wakes {
        Wakes {
            defer: false,
            ranges: Vec::new(),
            kick: false,
        }
    }

    fn deferred() -> Wakes {
        Wakes {
            defer: true,
            ..Wakes::now()
        }
    }

    /// After a resolving ioctl on `[addr, addr + len)`: with deferred
    /// wakes, the part it mapped is to be woken.
    fn resolved(&mut self, addr: usize, r: &Result<(), sys::UffdError>, len: usize) {
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

    /// Wakes the threads waiting on `[addr, addr + len)`, now or in
    /// `finish`.
    fn wake(&mut self, sh: &Shared, addr: usize, len: usize) {
        if self.defer {
            self.ranges.push((addr, len));
        } else {
            let _ = sh.uffd.wake(addr, len);
        }
    }

    /// Does the deferred wake-ups. Call with no pager lock held.
    fn finish(&mut self, sh: &Shared) {
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

/// What a CPU handler's step came to.
enum Step {
    /// Nothing it could do.
    Idle,
    /// It handled messages; `woke_at`: just before it woke the faulting
    /// threads (which preempt it).
    Worked { woke_at: Instant },
}

/// What handling a fault came to.
enum Outcome {
    Done,
    /// Retry later: the budget is full.
    Defer,
    /// Retry later: EAGAIN, an event is being delivered (it must be read,
    /// and the thread that raised it must go on, before any resolving
    /// ioctl succeeds).
    Again,
}

#[derive(Clone, Copy)]
struct Fault {
    addr: usize,
    write: bool,
    wp: bool,
    t0: Instant,
    /// Deferred before (counters count a fault once).
    retried: bool,
}

/// Victims of a batch (indexes, by address) that one call serves, and the
/// range it covers: from the first victim to the end of the last.
struct Span {
    victims: Vec<usize>,
    lo: usize,
    hi: usize,
}

/// A victim inside an eviction batch.
struct Victim {
    area: u32,
    page: u32,
    addr: usize,
    /// The page was `Clean`: nothing to store.
    clean: bool,
    /// Stored successfully (dirty victims).
    stored: bool,
    /// `MADV_DONTNEED` is to be (or was) issued.
    discard: bool,
    unprotect: bool,
    /// Never on the active list this residency: stored with
    /// `PageStore::store_cold`.
    cold: bool,
}

fn lookup(segs: &BTreeMap<usize, Seg>, addr: usize) -> Option<(u32, u64)> {
    let (start, seg) = segs.range(..=addr).next_back()?;
    if addr >= start + seg.len {
        return None;
    }
    Some((seg.area, seg.first + ((addr - start) / PAGE_SIZE) as u64))
}

impl State {
    fn meta(&mut self, area: u32, page: u64) -> &mut PageMeta {
        &mut self.areas.get_mut(&area).expect("area of a segment").meta[page as usize]
    }

    /// Puts a page that just became resident on a list: a new residency,
    /// not yet warm.
    fn enqueue_new(&mut self, area: u32, page: u64, active: bool) {
        self.meta(area, page).warm = false;
        self.enqueue(area, page, active);
    }

    /// Puts a resident page on a list.
    fn enqueue(&mut self, area: u32, page: u64, active: bool) {
        let m = self.meta(area, page);
        m.warm |= active;
        m.qgen = m.qgen.wrapping_add(1);
        m.referenced = false;
        m.woken = false;
        let was_active = m.active;
        m.active = active;
        let e = QEntry {
            area,
            page: page as u32,
            qgen: m.qgen,
        };
        if active {
            self.active.push_back(e);
        } else {
            self.inactive.push_back(e);
        }
        match (was_active, active) {
            (false, true) => self.n_active += 1,
            (true, false) => self.n_active -= 1,
            _ => {}
        }
    }

    /// Accounting for a page that stops being resident.
    fn leave(&mut self, area: u32, page: u64) {
        let m = self.meta(area, page);
        m.qgen = m.qgen.wrapping_add(1);
        m.spared = false;
        let was_active = std::mem::replace(&mut m.active, false);
        if was_active {
            self.n_active -= 1;
        }
        self.resident -= 1;
    }

    fn entry_valid(&self, e: QEntry) -> Option<PageMeta> {
        let a = self.areas.get(&e.area)?;
        if a.dying {
            return None;
        }
        let m = a.meta[e.page as usize];
        (m.qgen == e.qgen && m.st.resident()).then_some(m)
    }

    /// Picks up to `want` victims among `Dirty`/`Clean` pages.
    fn select(&mut self, want: usize, policy: VictimPolicy) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        let mut taken = HashSet::new();
        let mut budget = 4 * (self.inactive.len() + self.active.len()) + 16;
        while out.len() < want && budget > 0 {
            budget -= 1;
            // Keep the active list at most 7/8 of what is resident.
            let demote = policy == VictimPolicy::Workingset
                && (self.n_active * 8 > self.resident * 7 || self.inactive.is_empty());
            if demote {
                if let Some(e) = self.active.pop_front() {
                    if let Some(m) = self.entry_valid(e) {
                        if m.active {
                            self.enqueue(e.area, e.page as u64, false);
                        }
                    }
                    continue;
                }
            }
            let Some(e) = self.inactive.pop_front() else {
                break;
            };
            let Some(m) = self.entry_valid(e) else {
                continue;
            };
            if !matches!(m.st, PageState::Dirty | PageState::Clean) {
                continue;
            }
            if policy == VictimPolicy::Workingset && m.referenced {
                self.enqueue(e.area, e.page as u64, true);
                continue;
            }
            // An inactive page between two active ones is likely in use as
            // they are (memory is used in neighbourhoods; the kernel's
            // multi-gen LRU looks around a young page for the same reason),
            // and alone it would also cost a discard call of its own: it
            // gets one turn on the active list per residency.
            if policy == VictimPolicy::Workingset
                && !m.spared
                && self.between_active(e.area, e.page as u64)
            {
                self.meta(e.area, e.page as u64).spared = true;
                self.enqueue(e.area, e.page as u64, true);
                continue;
            }
            if !taken.insert((e.area, e.page)) {
                continue;
            }
            out.push((e.area, e.page as u64));
            if policy == VictimPolicy::Workingset {
                self.take_neighbours(e.area, e.page as u64, want, &mut out, &mut taken);
            }
        }
        out
    }

    /// Adds to `out` the inactive pages near `page`, up to [`CLUSTER_SCAN`]
    /// pages either side and no further than a resident page that is not
    /// one (active, or in flight). Pages not resident in between cost
    /// nothing: the victims and the gaps between them leave in one call
    /// (see [`OwnSpan`]), where scattered victims would cost a remove
    /// event and a TLB flush each. Which inactive pages go first matters
    /// little: none of them has been seen in use since it came in.
    fn take_neighbours(
        &mut self,
        area: u32,
        page: u64,
        want: usize,
        out: &mut Vec<(u32, u64)>,
        taken: &mut HashSet<(u32, u32)>,
    ) {
        let a = &self.areas[&area];
        let n = a.meta.len() as u64;
        for dir in [1i64, -1] {
            let mut p = page;
            for _ in 0..CLUSTER_SCAN {
                if out.len() >= want {
                    return;
                }
                let next = p as i64 + dir;
                if next < 0 || next as u64 >= n {
                    break;
                }
                p = next as u64;
                let m = a.meta[p as usize];
                if !m.st.resident() {
                    continue;
                }
                let candidate = matches!(m.st, PageState::Dirty | PageState::Clean)
                    && !m.active
                    && !m.referenced
                    && !m.claimed;
                if !candidate {
                    break;
                }
                if taken.insert((area, p as u32)) {
                    out.push((area, p));
                }
            }
        }
    }

    /// The victims (sorted by address) that pass `keep`, in spans:
    /// neighbours share one when no page between them is resident
    /// (`gap_is_empty`), so that one call serves the span.
    fn spans(&self, victims: &[Victim], keep: impl Fn(&Victim) -> bool) -> Vec<Span> {
        let mut out: Vec<Span> = Vec::new();
        let mut prev: Option<&Victim> = None;
        for (i, v) in victims.iter().enumerate() {
            if !keep(v) {
                continue;
            }
            let join = prev.is_some_and(|u| {
                u.area == v.area
                    && self.gap_is_empty(v.area, (u.addr, u.page as u64), (v.addr, v.page as u64))
            });
            match out.last_mut() {
                Some(span) if join => {
                    span.victims.push(i);
                    span.hi = v.addr + PAGE_SIZE;
                }
                _ => out.push(Span {
                    victims: vec![i],
                    lo: v.addr,
                    hi: v.addr + PAGE_SIZE,
                }),
            }
            prev = Some(v);
        }
        out
    }

    /// Both neighbours of `page` are resident and on the active list.
    fn between_active(&self, area: u32, page: u64) -> bool {
        let meta = &self.areas[&area].meta;
        let active = |p: Option<u64>| {
            p.and_then(|p| meta.get(p as usize))
                .is_some_and(|m| m.st.resident() && m.active)
        };
        active(page.checked_sub(1)) && active(Some(page + 1))
    }

    /// The span of `own` holding `addr`.
    fn own_at(&self, addr: usize) -> Option<usize> {
        let i = self.own.partition_point(|o| o.hi <= addr);
        (i < self.own.len() && self.own[i].lo <= addr).then_some(i)
    }

    /// Whether every page strictly between the victims at `a` and `b`
    /// (`a < b`, page indexes of `area`) is not resident and neither is
    /// being dropped: one call may then act on `[a, b]`. Both must lie in
    /// the same segment, at most [`MAX_GAP`] pages apart.
    fn gap_is_empty(&self, area: u32, a: (usize, u64), b: (usize, u64)) -> bool {
        if b.1 <= a.1 || b.1 - a.1 > MAX_GAP || b.0 - a.0 != (b.1 - a.1) as usize * PAGE_SIZE {
            return false;
        }
        let (Some((sa, _)), Some((sb, _))) = (
            self.segs.range(..=a.0).next_back(),
            self.segs.range(..=b.0).next_back(),
        ) else {
            return false;
        };
        if sa != sb {
            return false;
        }
        self.areas[&area].meta[a.1 as usize + 1..b.1 as usize]
            .iter()
            .all(|m| !m.st.resident() && !m.zapping)
    }
}

impl Shared {
    fn stats(&self) -> PagerStats {
        let mut st = {
            let s = self.state.lock();
            let mut st = s.stats.clone();
            st.resident_pages = s.resident as u64;
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

    // ---- handler ----------------------------------------------------------

    fn handler_loop(self: Arc<Self>) {
        let mut msgs = vec![RawMsg::default(); 64];
        let mut batch: Vec<RawMsg> = Vec::with_capacity(64);
        let mut buf = PageBuf::new(self.cfg.readahead_max + 1);
        let mut deferred: Vec<Fault> = Vec::new();
        let mut w = Wakes::now();
        let mut last = Instant::now();
        let mut spins = 0u32;
        while !self.shutdown.load(Ordering::Relaxed) {
            let n = {
                let mut d = self.dispatch.lock();
                deferred.append(&mut d.deferred);
                batch.clear();
                if !d.handoff.is_empty() {
                    // Nobody else took them: the faulting CPUs are busy.
                    if d.handoff_at.is_none_or(|t| t.elapsed() >= HANDOFF_WAIT) {
                        batch.append(&mut d.handoff);
                    }
                } else {
                    let n = match self.uffd.read_msgs(&mut msgs) {
                        Ok(n) => n,
                        Err(e) => panic!("reading userfaultfd failed: {e}"),
                    };
                    if n > 0 {
                        self.note_read();
                    }
                    batch.extend_from_slice(&msgs[..n]);
                }
                let t0 = Instant::now();
                for m in &batch {
                    self.handle_msg(m, t0, &mut buf, &mut w, &mut deferred);
                }
                batch.len()
            };
            if n == 0 {
                if !deferred.is_empty() {
                    self.retry(&mut deferred, &mut buf, &mut w);
                    if !deferred.is_empty() {
                        // What a deferred fault waits for (the evictor to
                        // free room, or a thread in madvise to finish after
                        // its remove event was read) needs a CPU: on a
                        // small machine spinning here would take it.
                        std::thread::yield_now();
                    }
                }
                if self.cpu_handlers_spinning() {
                    // They read the descriptor and send what they cannot
                    // resolve here through `wake`. Polling the
                    // descriptor too would have every fault wake this
                    // thread, on another CPU; the timeout covers the case
                    // where no CPU handler gets a CPU, and paces the
                    // retries of deferred faults.
                    sys::poll2(-1, self.wake.raw_fd(), MAIN_BACKSTOP_MS);
                    self.wake.drain();
                    last = Instant::now();
                    continue;
                }
                spins += 1;
                // Check the clock only every 64 spins.
                if spins & 63 != 0 || last.elapsed() < self.cfg.spin {
                    std::hint::spin_loop();
                    continue;
                }
                let timeout = if deferred.is_empty() { -1 } else { 1 };
                sys::poll2(self.uffd.raw_fd(), self.wake.raw_fd(), timeout);
                self.wake.drain();
                last = Instant::now();
                continue;
            }
            if !deferred.is_empty() {
                self.retry(&mut deferred, &mut buf, &mut w);
            }
            last = Instant::now();
            spins = 0;
        }
    }

    /// Handles one message on the main handler (events) or any handler
    /// (faults); a fault that must wait goes to `deferred`.
    fn handle_msg(
        &self,
        m: &RawMsg,
        t0: Instant,
        buf: &mut PageBuf,
        w: &mut Wakes,
        deferred: &mut Vec<Fault>,
    ) {
        match m.decode() {
            Msg::Fault { addr, write, wp } => {
                let f = Fault {
                    addr,
                    write,
                    wp,
                    t0,
                    retried: false,
                };
                if self.deferred(self.fault(f, buf, w), &f) {
                    deferred.push(f);
                }
            }
            Msg::Remove { start, end } => {
                self.discard_range(start, end, true, w);
                self.let_raiser_run(w);
            }
            Msg::Unmap { start, end } => {
                self.discard_range(start, end, false, w);
                self.forget_range(start, end);
                self.let_raiser_run(w);
            }
            Msg::Remap { from, to, len } => {
                self.remap(from, to, len);
                self.let_raiser_run(w);
            }
            Msg::Fork { fd } => {
                // Not negotiated; close it should it ever come.
                // SAFETY: the kernel gave us this descriptor.
                drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
            }
            Msg::Unknown(_) => {}
        }
    }

    /// After an event: until the thread that raised it runs again, every
    /// resolving ioctl fails with EAGAIN (the kernel counts the event as
    /// pending until then). On a CPU handler (the only one whose wakes are
    /// deferred) that thread usually slept on this CPU: its CPU went idle,
    /// so the handler ran. Yielding lets it run now rather than when the
    /// handler next finds nothing to do, so the faults after the event in
    /// this batch resolve at once instead of going to the main handler's
    /// retries. A discarding evictor resumes, drops its pages and waits for
    /// the dispatch lock held here (see `evict`). The main handler runs at
    /// the normal policy and does not yield: an idle-policy thread would
    /// not get its CPU anyway.
    fn let_raiser_run(&self, w: &Wakes) {
        if w.defer {
            std::thread::yield_now();
        }
    }

    /// Records that messages were just read (the CPU handlers spin on).
    fn note_read(&self) {
        let ns = self.epoch.elapsed().as_nanos() as u64;
        // Relaxed: a hint for when to spin, ordered with nothing else.
        self.last_read_ns.store(ns, Ordering::Relaxed);
    }

    /// Time since messages were last read.
    fn since_read(&self) -> Duration {
        let ns = self.epoch.elapsed().as_nanos() as u64;
        Duration::from_nanos(ns.saturating_sub(self.last_read_ns.load(Ordering::Relaxed)))
    }

    /// The CPU handlers are spinning on the descriptor.
    fn cpu_handlers_spinning(&self) -> bool {
        self.cpu_handlers.load(Ordering::Relaxed) > 0 && self.since_read() < self.cfg.cpu_spin
    }

    /// A CPU handler: bound to `cpu` at idle priority, so it runs exactly
    /// when nothing else can run there, as when a thread of that CPU has
    /// just blocked on a fault. Resolving the fault there wakes the thread
    /// on its own CPU: no cross-CPU wake-up, which costs more than the
    /// rest of a fault on a virtual machine. See the crate documentation.
    fn cpu_handler_loop(self: Arc<Self>, cpu: usize) {
        if sys::pin_idle(cpu).is_err() {
            // Not bound, it would be no better than the main handler.
            return;
        }
        self.cpu_handlers.fetch_add(1, Ordering::Relaxed);
        let mut msgs = vec![RawMsg::default(); 16];
        let mut buf = PageBuf::new(self.cfg.readahead_max + 1);
        let mut w = Wakes::deferred();
        let mut last = Instant::now();
        let mut fresh_until = last + CPU_FRESH;
        while !self.shutdown.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now.duration_since(last) > CPU_GAP {
                fresh_until = now + CPU_FRESH;
            }
            last = now;
            if self.since_read() >= self.cfg.cpu_spin {
                // Nothing for a while: block until a message comes. The
                // wake-up is cross-CPU for all but one handler; whoever
                // runs first takes the message.
                sys::poll2(self.uffd.raw_fd(), self.stop.raw_fd(), -1);
                // Spin again from now (the message is not read yet).
                self.note_read();
                last = Instant::now();
                fresh_until = last + CPU_FRESH;
                continue;
            }
            match self.cpu_step(now < fresh_until, &mut msgs, &mut buf, &mut w) {
                // Yield: an evictor discarding at the idle policy (see
                // `evict`) may be waiting for this CPU.
                Step::Idle => std::thread::yield_now(),
                Step::Worked { woke_at } => {
                    // Its own work is no gap, but the thread it woke
                    // preempts it at once: time after the wake-up is.
                    last = woke_at;
                }
            }
        }
    }

    /// One step of a CPU handler; `fresh`: it was just preempted, so the
    /// faults pending are likely its own CPU's.
    fn cpu_step(&self, fresh: bool, msgs: &mut [RawMsg], buf: &mut PageBuf, w: &mut Wakes) -> Step {
        let Some(mut d) = self.dispatch.try_lock() else {
            return Step::Idle;
        };
        let (n, t0) = if !d.handoff.is_empty() {
            let waited = d.handoff_at.is_none_or(|t| t.elapsed() >= HANDOFF_WAIT);
            if !fresh && !waited {
                return Step::Idle;
            }
            let n = d.handoff.len();
            msgs[..n].copy_from_slice(&d.handoff);
            d.handoff.clear();
            (n, d.handoff_at.unwrap_or_else(Instant::now))
        } else {
            let n = self.uffd.read_msgs(msgs).unwrap_or(0);
            if n == 0 {
                return Step::Idle;
            }
            self.note_read();
            let t0 = Instant::now();
            // A batch with an event is handled at once by whoever read it:
            // the thread that caused the event is not waiting for it (it
            // went on once the event was read), but every later message is.
            let events = msgs[..n]
                .iter()
                .any(|m| !matches!(m.decode(), Msg::Fault { .. }));
            if !fresh && !events {
                d.handoff.extend_from_slice(&msgs[..n]);
                d.handoff_at = Some(t0);
                return Step::Idle;
            }
            (n, t0)
        };
        let counter = if fresh {
            &self.faults_local
        } else {
            &self.faults_remote
        };
        counter.fetch_add(n as u64, Ordering::Relaxed);
        let before = d.deferred.len();
        for m in &msgs[..n] {
            self.handle_msg(m, t0, buf, w, &mut d.deferred);
        }
        let deferred = d.deferred.len() > before;
        drop(d);
        if deferred {
            self.wake.signal();
        }
        let woke_at = Instant::now();
        w.finish(self);
        Step::Worked { woke_at }
    }

    /// Whether a fault must be retried; counts and flags what it waits for.
    fn deferred(&self, o: Outcome, f: &Fault) -> bool {
        match o {
            Outcome::Done => false,
            Outcome::Defer => true,
            Outcome::Again => {
                if !f.retried {
                    self.faults_again.fetch_add(1, Ordering::Relaxed);
                }
                // The evictor signals `wake` when its discard returns.
                self.again_waiting.store(true, Ordering::Relaxed);
                true
            }
        }
    }

    fn retry(&self, deferred: &mut Vec<Fault>, buf: &mut PageBuf, w: &mut Wakes) {
        let old = std::mem::take(deferred);
        for mut f in old {
            f.retried = true;
            if self.deferred(self.fault(f, buf, w), &f) {
                deferred.push(f);
            }
        }
        if !deferred.is_empty() {
            self.throttled.store(true, Ordering::Relaxed);
            let _g = self.state.lock();
            self.work_cv.notify_one();
        }
    }

    /// Resolves one fault. Never blocks on the evictor. Wakes the faulting
    /// thread as `w` says.
    fn fault(&self, f: Fault, buf: &mut PageBuf, w: &mut Wakes) -> Outcome {
        let mut g = self.state.lock();
        let s = &mut *g;
        let Some((area, page)) = lookup(&s.segs, f.addr) else {
            // Not ours (grown by mremap, or a region being dropped): serve
            // it as plain memory.
            s.stats.faults_foreign += 1;
            drop(g);
            let r = if f.wp {
                self.unprotect(w, f.addr)
            } else {
                self.zeropage(w, f.addr)
            };
            return match r {
                Err(e) if e.errno == libc::EAGAIN => Outcome::Again,
                _ => Outcome::Done,
            };
        };
        let m = *s.meta(area, page);
        if f.wp {
            match m.st {
                PageState::Clean => {
                    // The store's copy goes stale with this write.
                    self.store.invalidate(area, page);
                    let mm = s.meta(area, page);
                    mm.st = PageState::Dirty;
                    mm.referenced = true;
                    s.stats.faults_wp += 1;
                    drop(g);
                    return self.unprotect_once(w, f.addr);
                }
                PageState::Evicting => {
                    let mm = s.meta(area, page);
                    mm.st = PageState::EvictAborted;
                    mm.parked = true;
                    s.stats.faults_parked += 1;
                }
                PageState::EvictAborted | PageState::Discarding => {
                    s.meta(area, page).parked = true;
                    s.stats.faults_parked += 1;
                }
                PageState::Dirty => {
                    drop(g);
                    return self.unprotect_once(w, f.addr);
                }
                PageState::Absent | PageState::Stored => {
                    // A write-protect marker left on a page that is not
                    // present (it was discarded or evicted while protected):
                    // waking alone would fault again forever. Clearing the
                    // marker turns the retry into a missing-page fault,
                    // served from the store (or as zeros).
                    drop(g);
                    return self.unprotect_once(w, f.addr);
                }
            }
            return Outcome::Done;
        }
        if m.zapping {
            s.meta(area, page).parked = true;
            s.stats.faults_parked += 1;
            return Outcome::Done;
        }
        if let Some(k) = s.own_at(f.addr) {
            // Between victims of a discard in flight: wait for it. (Listed
            // once per fault: waking twice is harmless, never waking not.)
            s.meta(area, page).parked = true;
            s.own[k].parked.push(f.addr & !(PAGE_SIZE - 1));
            s.stats.faults_parked += 1;
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
                match self.zeropage(w, f.addr) {
                    Ok(()) => {
                        // Mapped again as zeros: no copy may stand for it.
                        s.stats.faults_rezeroed += 1;
                        if m.st == PageState::Clean {
                            self.store.invalidate(area, page);
                            s.meta(area, page).st = PageState::Dirty;
                        }
                    }
                    Err(e) if e.errno == libc::EAGAIN => return Outcome::Again,
                    Err(_) => w.wake(self, f.addr, PAGE_SIZE),
                }
                Outcome::Done
            }
            PageState::Evicting | PageState::EvictAborted | PageState::Discarding => {
                s.meta(area, page).parked = true;
                s.stats.faults_parked += 1;
                Outcome::Done
            }
            PageState::Absent => {
                if s.resident >= s.limit && !m.claimed && !s.store_full {
                    if !f.retried {
                        s.stats.faults_throttled += 1;
                    }
                    return Outcome::Defer;
                }
                let r = if f.write {
                    // A write would copy the zero page at once: give a page.
                    buf.page(0).fill(0);
                    // SAFETY: buf page 0 is readable memory we own.
                    unsafe { self.copy(w, f.addr, buf.addr(0), PAGE_SIZE, false) }
                } else {
                    self.zeropage(w, f.addr)
                };
                match r {
                    Ok(()) => {}
                    Err(e) if e.errno == libc::EAGAIN => return Outcome::Again,
                    Err(e) if e.errno == libc::EEXIST => {}
                    Err(_) => return Outcome::Done, // ENOENT: range gone
                }
                s.meta(area, page).st = PageState::Dirty;
                s.resident += 1;
                s.enqueue_new(area, page, false);
                s.stats.faults_zero += 1;
                s.stats.peak_resident_pages = s.stats.peak_resident_pages.max(s.resident as u64);
                s.lat_zero.record(f.t0.elapsed().as_nanos() as u64);
                self.kick(s, w);
                Outcome::Done
            }
            PageState::Stored => self.fault_stored(s, f, area, page, buf, w),
        }
    }

    /// Loads a stored page that must come back (the faulting page, a page
    /// the fork hook brings back). A failed read or check is tried again a
    /// few times with a short pause: the device may have failed once, or a
    /// read may have been torn; the alternative is SIGBUS for the program.
    /// A page that keeps failing is reported as failed, never made up.
    /// Readahead followers do not come here: they just stay stored. The
    /// caller holds the state lock (as for every load on the fault path),
    /// so a retry stalls the pager for at most 5 ms, on failed reads only.
    fn load_stored(
        &self,
        stats: &mut PagerStats,
        area: u32,
        page: u64,
        buf: &mut [u8],
    ) -> Result<Loaded, LoadError> {
        let mut pause = Duration::from_millis(1);
        for _ in 1..LOAD_ATTEMPTS {
            match self.store.load(area, page, buf, LoadMode::Keep) {
                Err(LoadError::Io(_) | LoadError::Corrupt) => {
                    stats.load_retries += 1;
                    std::thread::sleep(pause);
                    pause *= 4;
                }
                r => return r,
            }
        }
        self.store.load(area, page, buf, LoadMode::Keep)
    }

    /// A missing fault on a stored page: load it and its stored followers.
    fn fault_stored(
        &self,
        s: &mut State,
        f: Fault,
        area: u32,
        page: u64,
        buf: &mut PageBuf,
        w: &mut Wakes,
    ) -> Outcome {
        let mut free = s.limit.saturating_sub(s.resident);
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
        let (npages, window) = {
            let a = s.areas.get_mut(&area).expect("area");
            if page == a.ra_next {
                a.ra_window = (a.ra_window * 2).max(2).min(self.cfg.readahead_max);
            } else {
                a.ra_window /= 2;
            }
            (a.meta.len() as u64, a.ra_window)
        };
        let seg_end = {
            let (_, seg) = s.segs.range(..=f.addr).next_back().expect("segment");
            seg.first + (seg.len / PAGE_SIZE) as u64
        };
        let limit = (page + 1 + window.min(free - 1) as u64)
            .min(npages)
            .min(seg_end);
        let mut n = 1usize;
        // Not into a discard in flight: it would drop what is mapped there.
        while page + (n as u64) < limit
            && s.meta(area, page + n as u64).st == PageState::Stored
            && s.own_at(f.addr + n * PAGE_SIZE).is_none()
        {
            n += 1;
        }
        // The faulting page first, alone: its COPY wakes the thread, which
        // then runs while the followers are loaded and mapped. A write
        // fault gets its page writable (the store's copy is dropped below);
        // with `keep_clean` everything else is mapped write-protected and
        // clean, so evicting it again needs no store; without it, every
        // page comes back writable and its copy is dropped below.
        let src = match self.load_stored(&mut s.stats, area, page, buf.page(0)) {
            Ok(l) => l,
            Err(_) => {
                s.stats.load_errors += 1;
                fail_access(self, w, f.addr);
                return Outcome::Done;
            }
        };
        let tc = Instant::now();
        let keep = self.cfg.keep_clean;
        // SAFETY: buf page 0 holds the loaded bytes.
        match unsafe { self.copy(w, f.addr, buf.addr(0), PAGE_SIZE, keep && !f.write) } {
            Ok(()) => {}
            Err(e) if e.errno == libc::EAGAIN => return Outcome::Again,
            Err(e) if e.errno == libc::EEXIST => {
                // Mapped already: nothing was copied, so nobody was woken.
                w.wake(self, f.addr, PAGE_SIZE);
            }
            Err(_) => return Outcome::Done,
        }
        s.lat_copy.record(tc.elapsed().as_nanos() as u64);
        s.lat_store.record(f.t0.elapsed().as_nanos() as u64);
        let mut got = 1;
        while got < n {
            if self
                .store
                .load(area, page + got as u64, buf.page(got), LoadMode::Keep)
                .is_err()
            {
                break;
            }
            got += 1;
        }
        let mut mapped = 1;
        if got > 1 {
            // SAFETY: buf pages 1..got hold loaded bytes.
            match unsafe {
                self.copy(
                    w,
                    f.addr + PAGE_SIZE,
                    buf.addr(1),
                    (got - 1) * PAGE_SIZE,
                    keep,
                )
            } {
                Ok(()) => mapped = got,
                // Partly done (EAGAIN, EEXIST): the rest stay `Stored`,
                // and the store still holds them (loaded with Keep).
                Err(e) => mapped = 1 + e.done / PAGE_SIZE,
            }
        }
        // Account for what was mapped.
        let distance = s.evict_clock.wrapping_sub(s.meta(area, page).evicted_at) as usize;
        let activate = self.cfg.policy == VictimPolicy::Workingset && distance <= s.limit;
        s.stats.refaults += 1;
        if activate {
            s.stats.refaults_activated += 1;
        }
        for i in 0..mapped {
            let p = page + i as u64;
            // Loaded with `Keep` either way, so that a page whose copy
            // failed stays in the store; dropped here once it is mapped.
            let dirty = !keep || (i == 0 && f.write);
            s.meta(area, p).st = if dirty {
                PageState::Dirty
            } else {
                PageState::Clean
            };
            if dirty {
                self.store.invalidate(area, p);
            }
            s.resident += 1;
            s.enqueue_new(area, p, i == 0 && activate);
        }
        s.stats.readahead_pages += mapped.saturating_sub(1) as u64;
        s.areas.get_mut(&area).expect("area").ra_next = page + mapped as u64;
        match src {
            Loaded::Pool => s.stats.faults_pool += 1,
            Loaded::Backing => s.stats.faults_backing += 1,
            Loaded::SameFilled => s.stats.faults_same_filled += 1,
        }
        s.stats.peak_resident_pages = s.stats.peak_resident_pages.max(s.resident as u64);
        self.kick(s, w);
        Outcome::Done
    }

    /// Wakes the evictor when the resident set nears the budget (after the
    /// faulting thread, with deferred wakes).
    fn kick(&self, s: &State, w: &mut Wakes) {
        if s.resident > self.start_threshold(s) {
            if w.defer {
                w.kick = true;
            } else {
                self.work_cv.notify_one();
            }
        }
    }

    /// `UFFDIO_COPY` on the fault path, waking as `w` says.
    ///
    /// # Safety
    /// As [`Uffd::copy`].
    unsafe fn copy(
        &self,
        w: &mut Wakes,
        dst: usize,
        src: *const u8,
        len: usize,
        wp: bool,
    ) -> Result<(), sys::UffdError> {
        // SAFETY: the caller's promise, passed on.
        let r = unsafe { self.uffd.copy(dst, src, len, wp, w.defer) };
        w.resolved(dst, &r, len);
        r
    }

    /// `UFFDIO_ZEROPAGE` of one page on the fault path, waking as `w` says.
    fn zeropage(&self, w: &mut Wakes, addr: usize) -> Result<(), sys::UffdError> {
        let r = self.uffd.zeropage(addr, PAGE_SIZE, w.defer);
        w.resolved(addr, &r, PAGE_SIZE);
        r
    }

    /// Clears write protection of one page on the fault path, waking as `w`
    /// says.
    fn unprotect(&self, w: &mut Wakes, addr: usize) -> Result<(), sys::UffdError> {
        let r = self.uffd.writeprotect(addr, PAGE_SIZE, false, w.defer);
        w.resolved(addr, &r, PAGE_SIZE);
        r
    }

    /// Resident pages at which eviction starts.
    fn start_threshold(&self, s: &State) -> usize {
        s.limit.saturating_sub(self.margin)
    }

    /// Resident pages at which eviction stops.
    fn stop_threshold(&self, s: &State) -> usize {
        s.limit.saturating_sub(2 * self.margin)
    }

    /// Reads the charge (if any) and moves the limit. Called by the
    /// evictor without the state lock.
    fn recharge(&self) {
        let Some(Charge(f)) = &self.cfg.charge else {
            return;
        };
        let bytes = f();
        let budget = self.cfg.budget_pages;
        let charged = (bytes.div_ceil(PAGE_SIZE as u64) as usize).min(budget - budget / 4);
        let mut s = self.state.lock();
        s.limit = budget - charged;
        s.stats.charged_bytes = bytes;
        s.stats.limit_pages = s.limit as u64;
    }

    /// Clears write protection from a handler. EAGAIN (an event is
    /// pending, and only a handler can read it) defers the fault: the page
    /// is `Dirty` by then, so the retry unprotects again.
    fn unprotect_once(&self, w: &mut Wakes, addr: usize) -> Outcome {
        match self.unprotect(w, addr) {
            Err(e) if e.errno == libc::EAGAIN => Outcome::Again,
            _ => Outcome::Done,
        }
    }

    /// Clears write protection from a thread other than the handler,
    /// retrying while an event is being delivered.
    fn unprotect_retry(&self, addr: usize) {
        loop {
            match self.uffd.writeprotect(addr, PAGE_SIZE, false, false) {
                Err(e) if e.errno == libc::EAGAIN => std::thread::yield_now(),
                _ => return,
            }
        }
    }

    /// The program discarded `[start, end)` (remove or unmap event): what
    /// the store held for it goes, the pages read as zeros afterwards.
    /// With `own_check`, a remove we caused ourselves is recognised and
    /// skipped.
    fn discard_range(&self, start: usize, end: usize, own_check: bool, w: &mut Wakes) {
        let mut wake = Vec::new();
        {
            let mut g = self.state.lock();
            let s = &mut *g;
            let mut addr = start & !(PAGE_SIZE - 1);
            while addr < end {
                let this = addr;
                addr += PAGE_SIZE;
                let own = s.own_at(this);
                if own_check && own.is_some_and(|k| s.own[k].take(this)) {
                    continue;
                }
                let Some((area, page)) = lookup(&s.segs, this) else {
                    continue;
                };
                let m = *s.meta(area, page);
                match m.st {
                    PageState::Absent => continue,
                    PageState::Stored | PageState::Clean | PageState::Discarding => {
                        self.store.invalidate(area, page)
                    }
                    // The evictor sees the state change and drops what it
                    // stored itself.
                    PageState::Dirty | PageState::Evicting | PageState::EvictAborted => {}
                }
                if m.st.resident() {
                    s.leave(area, page);
                }
                let mm = s.meta(area, page);
                mm.st = PageState::Absent;
                // A page the evictor is about to drop stays parked until the
                // drop returned (the evictor wakes it; see `zapping` and
                // `OwnSpan`).
                if !mm.zapping && own.is_none() && std::mem::replace(&mut mm.parked, false) {
                    wake.push(this);
                }
                s.stats.discarded_pages += 1;
            }
        }
        for a in wake {
            w.wake(self, a, PAGE_SIZE);
        }
    }

    /// Drops the segments of an unmapped range.
    fn forget_range(&self, start: usize, end: usize) {
        let mut s = self.state.lock();
        let moved = split_out(&mut s.segs, start, end);
        drop(moved);
    }

    /// `[from, from+len)` now lives at `to`: move the segments. Pages keep
    /// their `(area, page)` keys, so the store's entries move with them.
    fn remap(&self, from: usize, to: usize, len: usize) {
        let mut s = self.state.lock();
        let moved = split_out(&mut s.segs, from, from + len);
        for (start, seg) in moved {
            s.segs.insert(to + (start - from), seg);
        }
        s.stats.remaps += 1;
    }

    // ---- evictor ----------------------------------------------------------

    fn evictor_loop(self: Arc<Self>) {
        let charging = self.cfg.charge.is_some();
        let mut charged_at = Instant::now();
        loop {
            loop {
                {
                    let mut s = self.state.lock();
                    if self.shutdown.load(Ordering::Relaxed) {
                        return;
                    }
                    if s.resident > self.start_threshold(&s) {
                        break;
                    }
                    if !charging {
                        self.work_cv.wait(&mut s);
                        continue;
                    }
                    // A charge can grow while nothing faults: look again
                    // at the next reading.
                    self.work_cv.wait_until(&mut s, charged_at + CHARGE_PERIOD);
                }
                if charged_at.elapsed() >= CHARGE_PERIOD {
                    self.recharge();
                    charged_at = Instant::now();
                }
            }
            {
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
            loop {
                if charging && charged_at.elapsed() >= CHARGE_PERIOD {
                    self.recharge();
                    charged_at = Instant::now();
                }
                self.gate.lock();
                let n = {
                    let s = self.state.lock();
                    s.resident
                        .saturating_sub(self.stop_threshold(&s))
                        .min(self.cfg.evict_batch)
                };
                let gone = if n > 0 {
                    let victims = {
                        let mut s = self.state.lock();
                        let v = s.select(n, self.cfg.policy);
                        self.claim(&mut s, v)
                    };
                    let (gone, refused) = self.evict(victims);
                    self.note_progress(refused, gone);
                    gone
                } else {
                    0
                };
                // SAFETY: locked at the top of this iteration on this thread.
                unsafe { self.gate.unlock() };
                if self.throttled.swap(false, Ordering::Relaxed) {
                    self.wake.signal();
                }
                if gone == 0 || self.shutdown.load(Ordering::Relaxed) {
                    break;
                }
            }
        }
    }

    /// Marks chosen pages as in eviction (under the state lock).
    fn claim(&self, s: &mut State, v: Vec<(u32, u64)>) -> Vec<Victim> {
        let mut out = Vec::with_capacity(v.len());
        for (area, page) in v {
            let Some(addr) = Shared::page_addr(s, area, page) else {
                continue;
            };
            let m = s.meta(area, page);
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
    fn note_progress(&self, refused: usize, gone: usize) {
        let mut s = self.state.lock();
        if gone > 0 && refused == 0 {
            s.store_full = false;
        } else if gone == 0 && refused > 0 && !s.store_full {
            s.store_full = true;
            s.stats.store_full_episodes += 1;
            drop(s);
            self.throttled.store(false, Ordering::Relaxed);
            self.wake.signal();
        }
    }

    /// Evicts claimed victims: write-protect, copy out, store, commit,
    /// discard, settle. Runs without the state lock except to commit.
    /// Returns how many left memory, and how many the store refused.
    fn evict(&self, mut victims: Vec<Victim>) -> (usize, usize) {
        let mut refused = 0;
        // By address: victims with no resident page between them are
        // protected and discarded with one call per span (see `OwnSpan`).
        // Each `MADV_DONTNEED` is a round trip through the handler (a
        // remove event; while it is pending the handler's copies fail with
        // EAGAIN), and each call flushes the TLB of every CPU the program
        // runs on.
        victims.sort_unstable_by_key(|v| v.addr);
        let wp_spans = self.state.lock().spans(&victims, |v| !v.clean);
        let mut buf = Vec::new();
        let mut addrs = Vec::new();
        // 1. Write-protect dirty victims. After this no CPU can write them:
        //    a write faults (WP) and the handler parks or aborts. The pages
        //    between them were not resident: protecting nothing there (one
        //    a fault mapped since is protected too, and its first write
        //    only faults and is unprotected, as any `Dirty` page's).
        // 2. Copy each out and store it.
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
            // One read for the span; page by page if part of it is gone.
            let whole = sys::read_own_pages(&addrs, &mut buf).is_ok();
            for (k, &i) in span.victims.iter().enumerate() {
                let v = &mut victims[i];
                let page = &mut buf[k * PAGE_SIZE..(k + 1) * PAGE_SIZE];
                if !whole && sys::read_own_pages(&[v.addr], page).is_err() {
                    continue;
                }
                let stored = if v.cold {
                    self.store.store_cold(v.area, v.page as u64, page)
                } else {
                    self.store.store(v.area, v.page as u64, page)
                };
                match stored {
                    Ok(_) => v.stored = true,
                    Err(_) => refused += 1,
                }
            }
        }
        let mut discards;
        let mut moves = Vec::new();
        // 3. Commit: a victim still `Evicting` becomes `Discarding`; one a
        //    write reached goes back to `Dirty`; one the program discarded
        //    meanwhile loses what we stored.
        {
            let mut g = self.state.lock();
            let s = &mut *g;
            s.stats.store_rejected += refused as u64;
            for v in victims.iter_mut().filter(|v| !v.clean) {
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
            let mut spans = s.spans(&victims, |v| v.discard);
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
            discards = spans;
        }
        for v in victims.iter().filter(|v| v.unprotect) {
            self.unprotect_retry(v.addr);
        }
        // 4a. Move victims of short spans into the staging area, one page
        //     at a time: no remove event, so no handler round trip and no
        //     EAGAIN for the faults meanwhile (see `sys::Staging`). A missing
        //     fault on a moved page parks (`zapping`) until step 5, as after
        //     a discard; the program's own discard of one is its event, as
        //     the page is in no span of ours. A page the kernel will not
        //     move (shared with a forked child, a mapping with other flags)
        //     is discarded below in a span of its own.
        let mut moved = 0u64;
        if let Some(st) = &self.staging {
            let mut refused = Vec::new();
            let mut slot = 0;
            let mut gone = false;
            for &i in &moves {
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
            moved = slot as u64;
            if gone {
                // The program discarded the page: the kernel zaps only after
                // a handler read the remove event, and whoever reads a batch
                // with an event handles it under the dispatch lock. Once we
                // had that lock the page is `Absent`, and step 5 leaves it so.
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
        // 4. Discard, one call per span. The remove event each raises is
        //    recognised by the handler through `State::own`.
        //
        // With CPU handlers, discard at the idle policy: the handler that
        // reads our remove event wakes us, and woken at the normal policy
        // we would preempt it (on its CPU, where we slept) while it holds
        // the dispatch lock, holding up every fault until we sleep again.
        // At the idle policy we wait until it yields. (Where the process
        // may not leave the idle policy again, the discards stay normal.)
        let calls = discards.len() as u64;
        for &Span { lo, hi, .. } in &discards {
            let idle = self.idle_discards
                && self.cpu_handlers.load(Ordering::Relaxed) > 0
                && sys::set_idle(true).is_ok();
            // SAFETY: every victim of the span is held by the store and
            // `Discarding` (or clean), and no page between them is
            // resident: faults there wait until the call returned. The
            // addresses were taken from the segment map under the lock
            // (see the crate docs on remaps).
            let _ = unsafe { sys::dontneed(lo, hi - lo) };
            if idle {
                let _ = sys::set_idle(false);
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
            for a in parked {
                let _ = self.uffd.wake(a, PAGE_SIZE);
            }
            // Faults that met our remove event (EAGAIN) can go now.
            if self.again_waiting.swap(false, Ordering::Relaxed) {
                self.wake.signal();
            }
        }
        // 5. Settle: `Discarding` → `Stored`, wake parked faults.
        let mut wake = Vec::new();
        let mut gone = 0;
        {
            let mut g = self.state.lock();
            let s = &mut *g;
            s.stats.discard_calls += calls;
            s.stats.evict_moved_pages += moved;
            for v in &victims {
                let (area, page) = (v.area, v.page as u64);
                if v.discard {
                    s.meta(area, page).zapping = false;
                    if s.meta(area, page).st == PageState::Discarding {
                        s.leave(area, page);
                        let clock = s.evict_clock;
                        s.evict_clock = clock.wrapping_add(1);
                        let m = s.meta(area, page);
                        m.st = PageState::Stored;
                        m.evicted_at = clock;
                        gone += 1;
                        if v.clean {
                            s.stats.clean_drops += 1;
                        } else {
                            s.stats.evictions += 1;
                        }
                    }
                    // The drop returned: parked faults may go, whatever the
                    // page became meanwhile (`discard_range` leaves faults
                    // on a `zapping` page parked for us to wake).
                    if std::mem::replace(&mut s.meta(area, page).parked, false) {
                        wake.push(v.addr);
                    }
                }
                s.meta(area, page).claimed = false;
                let a = s.areas.get_mut(&area).expect("area");
                a.inflight -= 1;
                if a.dying && a.inflight == 0 {
                    self.done_cv.notify_all();
                }
            }
        }
        for a in wake {
            let _ = self.uffd.wake(a, PAGE_SIZE);
        }
        (gone, refused)
    }

    /// Evicts the given pages of `area` now, on the calling thread.
    pub(crate) fn evict_pages(&self, area: u32, pages: std::ops::Range<u64>) -> usize {
        self.gate.lock();
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
        // SAFETY: locked at the top of this function on this thread.
        unsafe { self.gate.unlock() };
        gone
    }

    /// Brings every stored page back, write-protected and clean. The gate
    /// must be held (no eviction in flight).
    fn prefault_all_locked(&self) -> usize {
        let mut buf = PageBuf::new(1);
        let mut n = 0;
        let todo: Vec<(usize, u32, u64)> = {
            let s = self.state.lock();
            let mut v = Vec::new();
            for (start, seg) in &s.segs {
                let a = &s.areas[&seg.area];
                for i in 0..seg.len / PAGE_SIZE {
                    let p = seg.first + i as u64;
                    if a.meta[p as usize].st == PageState::Stored {
                        v.push((start + i * PAGE_SIZE, seg.area, p));
                    }
                }
            }
            v
        };
        for (addr, area, page) in todo {
            loop {
                let mut g = self.state.lock();
                let s = &mut *g;
                if lookup(&s.segs, addr) != Some((area, page))
                    || s.meta(area, page).st != PageState::Stored
                {
                    break;
                }
                if self
                    .load_stored(&mut s.stats, area, page, buf.page(0))
                    .is_err()
                {
                    s.stats.load_errors += 1;
                    break;
                }
                // SAFETY: buf page 0 holds the loaded bytes.
                match unsafe { self.uffd.copy(addr, buf.addr(0), PAGE_SIZE, true, false) } {
                    Err(e) if e.errno == libc::EAGAIN => {
                        // An event is pending: let the handler read it
                        // (it may need the state lock to get there).
                        drop(g);
                        std::thread::sleep(Duration::from_micros(50));
                        continue;
                    }
                    Err(e) if e.errno != libc::EEXIST => break,
                    _ => {}
                }
                s.meta(area, page).st = PageState::Clean;
                s.resident += 1;
                s.enqueue_new(area, page, false);
                n += 1;
                break;
            }
        }
        let mut s = self.state.lock();
        s.stats.fork_prefaults += 1;
        s.stats.fork_prefault_pages += n as u64;
        s.stats.peak_resident_pages = s.stats.peak_resident_pages.max(s.resident as u64);
        n
    }

    /// Drops a region: waits for evictions in flight, unregisters, unmaps,
    /// and drops the store's entries.
    pub(crate) fn drop_area(&self, area: u32) {
        if self.pid != sys::getpid() {
            return; // a forked child: the pager is not ours to touch
        }
        let segs = {
            let mut s = self.state.lock();
            if let Some(a) = s.areas.get_mut(&area) {
                a.dying = true;
            }
            while s.areas.get(&area).is_some_and(|a| a.inflight > 0) {
                self.done_cv.wait(&mut s);
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
            segs
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

    pub(crate) fn area_resident(&self, area: u32) -> usize {
        let s = self.state.lock();
        s.areas
            .get(&area)
            .map_or(0, |a| a.meta.iter().filter(|m| m.st.resident()).count())
    }

    /// Re-derives the counters from the page states.
    fn check_invariants(&self) -> Result<(), String> {
        let s = self.state.lock();
        let mut resident = 0;
        let mut active = 0;
        for a in s.areas.values() {
            for m in &a.meta {
                if m.st.resident() {
                    resident += 1;
                    if m.active {
                        active += 1;
                    }
                }
            }
        }
        if resident != s.resident {
            return Err(format!("resident {} != counted {}", s.resident, resident));
        }
        if active != s.n_active {
            return Err(format!("n_active {} != counted {}", s.n_active, active));
        }
        Ok(())
    }
}

/// A load failed: the access must not see made-up data. Map a poison
/// marker (the access gets SIGBUS, as on a swap read error) if the kernel
/// has it, else zeros.
fn fail_access(sh: &Shared, w: &mut Wakes, addr: usize) {
    if sh.uffd.features() & feature::POISON != 0 {
        let r = sh.uffd.poison(addr, PAGE_SIZE, w.defer);
        w.resolved(addr, &r, PAGE_SIZE);
        if r.is_ok() {
            return;
        }
    }
    let _ = sh.zeropage(w, addr);
}

/// Removes the parts of segments inside `[start, end)` and returns them
/// (keyed by their start address); parts outside stay.
fn split_out(segs: &mut BTreeMap<usize, Seg>, start: usize, end: usize) -> Vec<(usize, Seg)> {
    let hits: Vec<(usize, Seg)> = segs
        .range(..end)
        .filter(|(s, seg)| **s + seg.len > start)
        .map(|(s, seg)| (*s, *seg))
        .collect();
    let mut out = Vec::new();
    for (s, seg) in hits {
        segs.remove(&s);
        let e = s + seg.len;
        let pages = |a: usize| ((a - s) / PAGE_SIZE) as u64;
        if s < start {
            segs.insert(
                s,
                Seg {
                    len: start - s,
                    ..seg
                },
            );
        }
        if e > end {
            segs.insert(
                end,
                Seg {
                    len: e - end,
                    area: seg.area,
                    first: seg.first + pages(end),
                },
            );
        }
        let ms = s.max(start);
        let me = e.min(end);
        out.push((
            ms,
            Seg {
                len: me - ms,
                area: seg.area,
                first: seg.first + pages(ms),
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_records_are_default_ones() {
        assert!(zeroed_meta(0).is_empty());
        let v = zeroed_meta(3000);
        assert_eq!(v.len(), 3000);
        assert!(v.iter().all(|m| *m == PageMeta::default()));
        assert_eq!(PageState::Absent as u8, 0);
    }

    fn seg(len_pages: usize, first: u64) -> Seg {
        Seg {
            len: len_pages * PAGE_SIZE,
            area: 1,
            first,
        }
    }

    #[test]
    fn split_out_middle_and_edges() {
        let mut segs = BTreeMap::new();
        let b = 0x10_0000;
        segs.insert(b, seg(10, 0));
        let out = split_out(&mut segs, b + 2 * PAGE_SIZE, b + 5 * PAGE_SIZE);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, b + 2 * PAGE_SIZE);
        assert_eq!((out[0].1.len, out[0].1.first), (3 * PAGE_SIZE, 2));
        assert_eq!(segs.len(), 2);
        assert_eq!(segs[&b].len, 2 * PAGE_SIZE);
        let tail = segs[&(b + 5 * PAGE_SIZE)];
        assert_eq!((tail.len, tail.first), (5 * PAGE_SIZE, 5));
        assert_eq!(lookup(&segs, b + 6 * PAGE_SIZE), Some((1, 6)));
        assert_eq!(lookup(&segs, b + 3 * PAGE_SIZE), None);
        // A range over both remaining parts and beyond.
        let out = split_out(&mut segs, b, b + 20 * PAGE_SIZE);
        assert_eq!(out.len(), 2);
        assert!(segs.is_empty());
    }
}
