//! What a [`Pager`](super::Pager) is made with: its settings
//! ([`PagerConfig`], [`VictimPolicy`], [`Charge`]) and the errors of making
//! a pager or a region.

use super::state::MAX_IN_THREAD_WINDOW;
use crate::sys::{OpenError, PAGE_SIZE};
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// What a child forked without exec gets of a pager (see `crate` docs,
/// "Fork").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ForkChild {
    /// The child takes over its copy of the pager: its regions are
    /// registered again with a userfaultfd of its own before `fork()`
    /// returns, evicted pages stay in its copy of the store (a backing file
    /// is copied for it), and it runs its own handler and evictor under the
    /// same budget. Nothing is brought back for the fork.
    #[default]
    Managed,
    /// Every evicted page is brought back before `fork()`; the child's
    /// regions are plain memory and it has no pager.
    Prefault,
    /// Nothing: in the child, pages that were evicted read as zeros. Only
    /// for programs that fork just to exec.
    Unmanaged,
}

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
    /// Most stored neighbours brought back with a faulting page (taken no
    /// larger than 63).
    pub readahead_max: usize,
    /// Most untouched neighbours mapped as zeros with a first-touch fault
    /// (zero readahead): the window doubles up to this while first touches
    /// land right after the previous window (a heap growing, a buffer being
    /// filled) and halves otherwise. The neighbours get the shared zero
    /// page (`UFFDIO_ZEROPAGE`): a later write copies it in the kernel with
    /// no round trip through a handler, and a page never written costs no
    /// memory. 0: one page per fault (and no wide window either).
    pub zero_readahead_max: usize,
    /// While more than a quarter of the limit is free, a first-touch fault
    /// maps up to this many untouched pages after it, whatever the window
    /// (taken no larger than 63 with `in_thread_faults`). Allocators do
    /// not touch new memory page after page: they write a block's header,
    /// skip its body, come back; the window above then rarely grows. A
    /// parallel build with room to spare took 105 k first-touch faults
    /// with the window alone and 40 k with runs of 256 always; with this
    /// rule it took 0.90 of the wall time and 0.86 of the CPU
    /// (docs/BENCHMARKS.md). Near the limit only the window
    /// counts: pages mapped as zeros are charged as resident, and there
    /// they would push out pages in use.
    pub zero_readahead_wide: usize,
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
    /// What a child forked without exec gets (see `crate` docs, "Fork").
    pub fork: ForkChild,
    /// With `ForkChild::Managed`, a fork whose pager holds fewer pages
    /// (resident and stored) is handled as `Prefault` (default
    /// `MANAGE_MIN_PAGES`).
    pub fork_manage_min_pages: u64,
    /// Drop victims of short spans by moving them into a staging area
    /// (`UFFDIO_MOVE`, where the kernel has it), which raises no remove
    /// event, instead of `MADV_DONTNEED` on the region (see `crate` docs,
    /// "Eviction").
    pub evict_by_move: bool,
    /// Leave resident pages that map the shared zero page out of the
    /// budget (see `pager/zeros.rs`): the budget then bounds the pages that
    /// hold memory, and a region may have more pages mapped than the budget
    /// (`Region::mincore_resident` counts zero-mapped pages). Off by
    /// default: every mapped page counts. `uzswap run` turns it on, as its
    /// budget is the program's memory. Without `PAGEMAP_SCAN` (before Linux
    /// 6.7) or with `in_thread_faults` it does nothing.
    pub uncharged_zero_pages: bool,
    /// Called first on each helper thread the pager starts (the handler
    /// and the evictor), e.g. to mark them as the runtime's own threads.
    pub thread_start: Option<fn()>,
    /// Memory outside the regions that the budget pays for, in bytes (the
    /// store's index, the host's own heap, ...), read by the evictor about
    /// every [`CHARGE_PERIOD`]: the pages resident in regions are then kept
    /// within `budget_pages` minus that, as a memory cgroup charges the
    /// kernel's own allocations for a task to its limit. The regions keep
    /// at least [`PagerConfig::floor_pages`] whatever the charge. `None`:
    /// the budget is for region pages alone.
    pub charge: Option<Charge>,
    /// Memory a forked child is expected to make its own at once, in bytes
    /// (with `charge` only): the runtime's heap and the program's memory
    /// outside the regions, which the child's writes copy without a fault
    /// of ours. Before each fork that the child takes over, the parent
    /// evicts that much below its limit, waiting at most
    /// [`FORK_ROOM_WAIT`], and keeps its limit that much lower for
    /// [`FORK_ROOM_HOLD`] (until the tree's arbiter has seen the child).
    /// `None`: no room is made.
    pub fork_room: Option<Charge>,
    /// Hold the process's CPU latency request (`uzswap_os::latency`) from
    /// the first message of a burst until the handler has read none for
    /// `uzswap_os::latency::RELEASE_AFTER`: idle CPUs poll meanwhile, so
    /// the hand-off to the handler and the wake of the faulting thread
    /// reach no halted CPU. Needs root; without it nothing is held.
    pub latency_hold: bool,
    /// Bytes of the chunks a region is cut into for the access signal
    /// (`pager/access.rs`): the kernel keeps each as a mapping of its own,
    /// and the evictor reads which of them the program touched (reads
    /// included). A multiple of the page size; 0 (the default): no signal,
    /// victims by the lists alone. [`ACCESS_CHUNK`] is what `uzswap run`
    /// uses. With chunks, the kernel refuses an `mremap` of region memory
    /// that spans a chunk edge (`EFAULT`; the pages stay where they were):
    /// a program that moves its regions with `mremap` keeps this 0
    /// (`uzswap run` serves a program's `mremap` itself, by copying).
    pub access_chunk: usize,
    /// The least the charge may lower the limit to, in pages (at least 16,
    /// at most the budget). `None`: a quarter of the budget. A host that
    /// shares one budget among processes (`uzswap run`'s ledger) charges
    /// each process everything but its allotment and sets a small floor.
    pub floor_pages: Option<usize>,
    /// Resolve faults on the faulting thread itself, in a SIGBUS handler
    /// (`UFFD_FEATURE_SIGBUS`), with no hand-off to a handler thread (see
    /// the crate documentation, "In-thread faults"). For programs that use
    /// regions through the library and know which memory they hand to
    /// system calls: a system call that reads or writes region memory that
    /// is not resident fails with `EFAULT` in this mode, so such memory is
    /// made resident first with [`crate::Region::pin`]. One pager per
    /// process may have it; x86-64 only; not with `cpu_handlers`; both
    /// readahead windows at most 63. Off by default.
    ///
    /// Hidden from the documentation (experimental). A write fault's
    /// unprotect races an eviction in both modes (see
    /// `PagerCore::unprotect_once`; the tests `unprotect_against_eviction_*`
    /// make that interleaving), and `mincore` counts while pages move
    /// unless it walks under the state lock (see
    /// [`crate::Region::mincore_resident`]).
    #[doc(hidden)]
    pub in_thread_faults: bool,
    /// Test hook (feature `testing`): pretend userfaultfd(2) failed with
    /// this errno and /dev/userfaultfd with EACCES.
    #[cfg(feature = "testing")]
    pub inject_open_errno: Option<i32>,
    /// Test hook (feature `testing`): called by a write fault on a
    /// write-protected page just before it clears the protection (on the
    /// thread that resolves the fault: in a signal handler with in-thread
    /// faults).
    #[cfg(feature = "testing")]
    pub test_before_unprotect: Option<fn()>,
}

impl PagerConfig {
    /// The least the limit may fall to (see [`PagerConfig::floor_pages`]).
    pub fn floor(&self) -> usize {
        self.floor_pages.unwrap_or(self.budget_pages / 4)
    }

    /// Refuses settings a pager cannot run with (each error says which).
    pub(super) fn check(&self) -> Result<(), PagerError> {
        if self.budget_pages < 16 {
            return Err(PagerError::Config("budget_pages must be at least 16"));
        }
        if self
            .floor_pages
            .is_some_and(|f| f < 16 || f > self.budget_pages)
        {
            return Err(PagerError::Config(
                "floor_pages must be at least 16 and at most budget_pages",
            ));
        }
        if self.evict_batch == 0 {
            return Err(PagerError::Config("evict_batch must be at least 1"));
        }
        if !self.access_chunk.is_multiple_of(PAGE_SIZE) {
            return Err(PagerError::Config(
                "access_chunk must be a multiple of the page size (or 0: no access signal)",
            ));
        }
        if self.in_thread_faults {
            if self.cpu_handlers {
                return Err(PagerError::Config(
                    "in_thread_faults and cpu_handlers exclude each other (no fault reaches a handler thread in that mode)",
                ));
            }
            if self.readahead_max > MAX_IN_THREAD_WINDOW
                || self.zero_readahead_max > MAX_IN_THREAD_WINDOW
            {
                return Err(PagerError::Config(
                    "with in_thread_faults, readahead_max and zero_readahead_max must be at most 63",
                ));
            }
        }
        Ok(())
    }

    /// Defaults for a budget of `budget_pages`.
    pub fn new(budget_pages: usize) -> PagerConfig {
        PagerConfig {
            budget_pages,
            readahead_max: 8,
            zero_readahead_max: 32,
            zero_readahead_wide: 256,
            policy: VictimPolicy::Workingset,
            spin: Duration::from_micros(50),
            evict_batch: 64,
            cpu_handlers: false,
            cpu_spin: Duration::from_millis(2),
            fork: ForkChild::Managed,
            fork_manage_min_pages: MANAGE_MIN_PAGES,
            evict_by_move: true,
            uncharged_zero_pages: false,
            keep_clean: true,
            thread_start: None,
            charge: None,
            fork_room: None,
            latency_hold: true,
            access_chunk: 0,
            floor_pages: None,
            in_thread_faults: false,
            #[cfg(feature = "testing")]
            inject_open_errno: None,
            #[cfg(feature = "testing")]
            test_before_unprotect: None,
        }
    }
}

/// The default of `PagerConfig::access_chunk`: 512 KiB, 128 pages. Finer
/// chunks tell pages apart better and cost more mappings (the map-count
/// limit is 65,530 here, shared with the program) and more time to read.
pub const ACCESS_CHUNK: usize = 512 << 10;

/// The longest a fork waits for its parent to make room for the child
/// (`PagerConfig::fork_room`).
pub const FORK_ROOM_WAIT: Duration = Duration::from_millis(50);

/// How long the parent's limit stays lowered by the room made for a
/// child: long enough for the arbiter to see the child (it decides every
/// 100 ms) and share the budget anew.
pub const FORK_ROOM_HOLD: Duration = Duration::from_millis(300);

/// The default of `PagerConfig::fork_manage_min_pages`: below this many
/// pages held (resident and stored), a `Managed` pager brings its stored
/// pages back for the fork instead (`Prefault`): cheaper than the child's
/// take-over (its threads, its copy of the backing file), and the child of
/// a shell or a launcher, which execs at once, then carries no runtime. A
/// parent with more (a Python program forking its workers) has children
/// that grow from its size, and they are managed: counted by stored pages
/// alone, a parent with its data resident would have unmanaged workers,
/// 4.3 x a 64 MiB budget together (the fork test program,
/// `crates/cli/tests/programs/workers.py fork`, under `uzswap run`; its
/// figures are in docs/BENCHMARKS.md).
pub const MANAGE_MIN_PAGES: u64 = 2048;

/// How often the evictor reads [`PagerConfig::charge`] while the resident
/// set or the limit moves.
pub const CHARGE_PERIOD: Duration = Duration::from_millis(10);

/// The longest the evictor waits between two readings of the charge: the
/// period doubles up to this while the resident set does not move and the
/// limit does not come down. An idle process of a tree (a `gcc` driver
/// waiting for its `cc1`) woke 100 times a second for nothing: about
/// 0.5 % of a CPU each on the VM of docs/BENCHMARKS.md. Such a process
/// answers a smaller allotment this much later at worst; the arbiter grows
/// the others only into what is free, so the tree stays in its budget
/// meanwhile.
pub const IDLE_CHARGE_PERIOD: Duration = Duration::from_millis(80);

/// Most CPU handlers one pager starts.
pub const MAX_CPU_HANDLERS: usize = 16;

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
    /// `in_thread_faults` was asked for, but the kernel's userfaultfd has
    /// no SIGBUS mode.
    #[error(
        "in-thread faults need UFFD_FEATURE_SIGBUS (Linux 4.14+), which this \
         kernel's userfaultfd does not offer: turn PagerConfig::in_thread_faults \
         off (faults are then served by the handler thread)"
    )]
    NoSigbus,
    /// `in_thread_faults` was asked for on a machine where the handler
    /// cannot tell a write-protect fault from a missing page.
    #[error(
        "in-thread faults are supported on x86-64 only (the SIGBUS handler \
         reads the page fault's error code): turn PagerConfig::in_thread_faults off"
    )]
    InThreadUnsupported,
    /// Another pager of this process resolves its faults in-thread: the
    /// SIGBUS handler serves one pager.
    #[error(
        "another pager in this process already has in-thread faults (the \
         SIGBUS handler serves one pager): make this pager's regions with that \
         pager, drop it first, or turn in_thread_faults off for this one"
    )]
    InThreadTaken,
    /// The SIGBUS handler could not be installed.
    #[error("could not install the SIGBUS handler for in-thread faults: {0}")]
    Sigaction(io::Error),
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
