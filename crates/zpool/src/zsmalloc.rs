//! The zsmalloc-class allocator.
//!
//! # Layout
//! Object sizes are rounded up to a multiple of 16 bytes; each rounded size
//! has a *class*. A class carves *zspages* of `pages_per_zspage` contiguous
//! pages (1..=`max_pages_per_zspage`, chosen per class to waste the least
//! tail space) into `objs_per_zspage` equal slots. Because a zspage is one
//! contiguous run of virtual memory, an object that straddles a page boundary
//! is still contiguous: every object can be read in place (zero-copy).
//! A zspage commits memory lazily: objects are handed out from its start
//! (freed slots first, then fresh ones), and only the pages that the objects
//! handed out so far reach are counted and touched. A half-filled 8-page
//! zspage costs 4 pages, so the last zspage of each class, the main waste of
//! a zsmalloc pool of modest size, costs only what it holds. Compaction
//! packs what stays partial into its lowest slots and gives back the pages
//! past them.
//!
//! Classes whose geometry (pages per zspage, objects per zspage) equals that
//! of the next larger class are merged into it, as the kernel does. A class
//! with one object per one-page zspage is a *huge* class.
//!
//! # Handles
//! A handle encodes `tag:8 | class:10 | gen:18 | slot:28` (high to low;
//! `TAG_BITS`, `CLASS_BITS`, `GEN_BITS`, `SLOT_BITS`). The class field
//! indexes the pool's table of the classes of all shards (shard k's classes
//! follow shard k-1's): at most 256 classes (one per rounded size) times
//! `MAX_SHARDS` (4) fit its 10 bits. The tag is never 0, so neither is a
//! handle. The slot indexes the class's handle table, whose entry says
//! where the object lives now (zspage id, object index) and its size.
//! Compaction moves objects by rewriting handle-table entries, so handles
//! held by callers never change. The generation is bumped on free, so a
//! freed handle is detected as stale until the 18-bit generation wraps
//! (262,144 reuses of the same slot); the tag names the pool, so handles of
//! other pools are refused.
//!
//! # Locks
//! Lock order, outer to inner:
//! 1. `Class::inner` (one `RwLock` per class; never two classes at once,
//!    except in `check_invariants` and `fork_prepare`, which take all of
//!    them in index order);
//! 2. `PageArena::inner` (taken only to get or give back page runs);
//! 3. `Compactor::state` (only to post a class for background compaction
//!    or a batch of pages to release; never held with the arena lock,
//!    except by `fork_prepare`).
//!
//! Fork ([`Zpool::fork_prepare`]) takes every one of them in this order
//! (each class exclusive, in index order; each shard's arena, in shard
//! order; the compactor state) and keeps them until `fork_parent` or
//! `fork_child` releases them, so the child copies a pool no thread was
//! changing. Before it keeps the arenas and the compactor state it waits
//! until no thread holds a batch of freed pages outside them (one being
//! released): in the child every batch is then released or queued, and the
//! child's new compactor thread releases the queued ones. In the child a
//! lock is reset rather than unlocked: the waiters its word counts were
//! the parent's threads, which are not there to be woken
//! (`uzswap_os::fork`).
//!
//! Reads (`read`, `map_read`, `object_size`) take the class lock shared;
//! everything that changes the class, including writing object bytes, takes
//! it exclusive. So an object cannot move or vanish while it is read, and a
//! write never races a read. There is no pool-wide lock on the hot path: the
//! page counter is an atomic updated only when a zspage is made or freed.
//!
//! # Invariants (checked by [`Zpool::check_invariants`])
//! - per zspage: `inuse == |{obj: owner[obj] has no FREE_BIT}|`,
//!   `inuse + |freed stack| + (objs_per_zspage - fresh) == objs_per_zspage`
//!   (the stack links freed objects below `fresh` through `owner`; objects
//!   from `fresh` on are `FREE`), and `committed == ceil(fresh × size /
//!   4096)`;
//! - free object memory reads as zeros (freed objects are wiped, pages past
//!   `committed` are untouched or were given back), and so does all of a
//!   zspage not `touched`;
//! - a zspage sits in exactly one fullness group, the one its `inuse` gives;
//!   a zspage with `inuse == 0` does not exist (it is freed at once);
//! - per class: `obj_used == Σ inuse == live handle slots`, `payload ==
//!   Σ size of live slots`, each live slot points at an object whose owner is
//!   that slot;
//! - per pool: `pages_held == Σ_zspage committed`.

use crate::stats::FULLNESS_BUCKETS;
use crate::sys::{ArenaForkGuard, PageArena, ReleaseBatch, MAX_RUN_PAGES};
use crate::{check_size, ClassStats, CompactReport, Error, Handle, PoolStats, Zpool};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use uzswap_os::fork::{self, AfterFork, Side};
use uzswap_os::sync::{self, AtomicBool, AtomicU64, Condvar, Mutex, RwLock};
use uzswap_os::PAGE_SIZE;

/// Objects are rounded up to a multiple of this.
pub const CLASS_STEP: usize = 16;
/// Number of rounded sizes: 16, 32, …, 4096.
const NUM_SIZES: usize = PAGE_SIZE / CLASS_STEP;

const SLOT_BITS: u32 = 28;
const GEN_BITS: u32 = 18;
const CLASS_BITS: u32 = 10;
const TAG_BITS: u32 = 8;
/// Most shards a pool may have (the class field names shard × class).
pub const MAX_SHARDS: usize = 4;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;

/// Set in `Slot::gen` once the object's bytes have been written (so free
/// knows whether there is anything to wipe). Outside GEN_MASK.
const WRITTEN: u32 = 1 << 31;

/// Marks a free handle slot (`Slot::zspage`), and an object never handed
/// out (`Zspage::owner`).
const FREE: u32 = u32::MAX;

/// In `Zspage::owner`, set on every object not in use (handle slots stay
/// below it); the other bits of a freed object link the zspage's stack of
/// freed objects, ended by `NO_OBJ`. So `FREE == FREE_BIT | NO_OBJ`, and the
/// free stack costs no memory of its own (nor a cache miss of its own on
/// every malloc and free).
const FREE_BIT: u32 = 1 << 31;
const NO_OBJ: u32 = FREE & !FREE_BIT;

/// Partial zspages sit in groups 0..=9 by use ((0,10%], …, (90%,100%));
/// full ones in group 10.
const FULL_GROUP: usize = 10;
const NUM_GROUPS: usize = 11;

/// Configuration of a [`ZsPool`].
#[derive(Clone, Debug)]
pub struct ZsConfig {
    /// Hard limit on pool bytes (pages held × 4096); `None`: no limit.
    pub limit_bytes: Option<u64>,
    /// Largest zspage, in pages: 1..=16, default 8.
    pub max_pages_per_zspage: usize,
    /// Start background compaction of a class when its freeable pages reach
    /// this share of its pages (and at least two zspages' worth); `None`
    /// disables automatic compaction. Default 10 %: at 30 % (the figure
    /// the zsmalloc discussion gives as an example), under random exclusive
    /// loads classes sit just below it and the pool holds 15–20 % more than
    /// its payload; at 10 % a skewed run peaks 4-5 % lower at the same
    /// throughput (see `uzswap-bench usemem` in docs/BENCHMARKS.md).
    pub compact_watermark_percent: Option<u8>,
    /// Independent copies of the class table, 1..=4; a thread allocates in
    /// the shard of the CPU it runs on, so threads on different CPUs touch
    /// different class metadata (shared metadata is what stops an allocator
    /// from scaling: cache lines bounce between cores). Each shard keeps its
    /// own last partial page per class, so more shards cost a little memory.
    /// `None`: one per CPU, at most 4.
    pub shards: Option<usize>,
    /// Run first on the compaction thread (see [`uzswap_os::spawn_helper`]).
    pub thread_start: Option<fn()>,
}

impl Default for ZsConfig {
    fn default() -> Self {
        ZsConfig {
            limit_bytes: None,
            max_pages_per_zspage: 8,
            compact_watermark_percent: Some(10),
            shards: None,
            thread_start: None,
        }
    }
}

/// An entry of a class's handle table.
#[derive(Clone, Copy)]
struct Slot {
    /// Generation of the handle that names this slot now (or next, if
    /// free) in the low GEN_BITS; the WRITTEN flag above them.
    gen: u32,
    /// Id of the zspage holding the object; `FREE` if the slot is free
    /// (then `obj` and `size` are invalid).
    zspage: u32,
    /// Object index inside the zspage.
    obj: u16,
    /// Size the caller asked for (1..=4096).
    size: u16,
}

/// A run of pages carved into equal slots.
struct Zspage {
    /// First byte of the run; `pages_per_zspage` pages long.
    base: NonNull<u8>,
    /// Objects in use.
    inuse: u32,
    /// Objects never handed out are `fresh..objs_per_zspage`.
    fresh: u32,
    /// Pages of the run that are committed (may have been touched):
    /// `committed == pages_for(fresh)`. Pages past it were never written
    /// since the run was taken (or were given back by densify), so they cost
    /// no memory: a zspage's memory grows with its objects.
    committed: u32,
    /// Some byte of the run was written since it was taken from the arena.
    touched: bool,
    /// Top of the stack of objects freed and not reused (linked through
    /// `owner`), or `NO_OBJ`.
    free_head: u32,
    /// Handle slot of each object in use; `FREE_BIT` plus the next freed
    /// object for a freed one; `FREE` for one never handed out.
    owner: Vec<u32>,
    /// Fullness group and position in it (for O(1) removal).
    group: u8,
    group_pos: u32,
}

impl Zspage {
    fn pop_free(&mut self) -> Option<u16> {
        if self.free_head == NO_OBJ {
            return None;
        }
        let obj = self.free_head;
        self.free_head = self.owner[obj as usize] & !FREE_BIT;
        Some(obj as u16)
    }

    fn push_free(&mut self, obj: u16) {
        self.owner[obj as usize] = FREE_BIT | self.free_head;
        self.free_head = u32::from(obj);
    }

    /// The freed objects, top of the stack first (at most
    /// `owner.len()`, even if the links were damaged).
    fn freed(&self) -> impl Iterator<Item = u32> + '_ {
        let first = (self.free_head != NO_OBJ).then_some(self.free_head);
        std::iter::successors(first, |&o| {
            let next = self.owner.get(o as usize)? & !FREE_BIT;
            (next != NO_OBJ).then_some(next)
        })
        .take(self.owner.len())
    }
}

fn is_free(owner: u32) -> bool {
    owner & FREE_BIT != 0
}

struct ClassInner {
    /// Zspages by id; `None` for ids free for reuse.
    zspages: Vec<Option<Zspage>>,
    free_zspage_ids: Vec<u32>,
    /// Zspage ids by fullness group.
    groups: [Vec<u32>; NUM_GROUPS],
    /// The handle table.
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    obj_used: u64,
    payload: u64,
    /// Zspages in existence (`zspages` minus the `None`s).
    live_zspages: u64,
    /// Σ committed over the class's zspages.
    pages_committed: u64,
    /// The `owner` vectors of zspages that emptied (all `FREE` again),
    /// kept (up to `SPARE_VECS`) for the next zspage: emptying a pool in
    /// order would otherwise allocate and free one per zspage.
    spare: Vec<Vec<u32>>,
}

/// Zspage vectors a class keeps for reuse.
const SPARE_VECS: usize = 4;

// SAFETY: the raw page pointers in a ClassInner are owned by the pool (taken
// from its arena and given back only by the pool), and every access to the
// memory behind them happens under the class lock that guards this struct.
unsafe impl Send for ClassInner {}
// SAFETY: shared references to ClassInner only read bookkeeping and object
// bytes; writes to object memory need `&mut ClassInner` (the write lock).
unsafe impl Sync for ClassInner {}

struct Class {
    /// Index in `PoolState::classes` (shard × classes per shard + class).
    index: u16,
    /// Slot size.
    size: usize,
    pages_per_zspage: usize,
    objs_per_zspage: usize,
    inner: RwLock<ClassInner>,
    /// Set while the class waits for the background compactor.
    compact_pending: AtomicBool,
}

impl Class {
    /// Pages that the first `n` objects of a zspage reach.
    fn pages_for(&self, n: usize) -> usize {
        (n * self.size).div_ceil(PAGE_SIZE)
    }
}

/// A zspage that became empty: its run, to give back once the class lock
/// is dropped, and the pages it had committed.
struct EmptyRun {
    base: NonNull<u8>,
    committed: u64,
    /// Whether any byte of the run was ever written (else nothing is
    /// resident and there is nothing to give back).
    touched: bool,
}

/// Where an object lives, resolved from a handle under the class lock.
struct Located {
    slot: u32,
    zspage: u32,
    obj: u16,
    size: usize,
}

/// The pool's state, shared by its handles and its compaction thread: the
/// classes, the shards' page sources, the limit and the counters.
struct PoolState {
    tag: u32,
    classes: Vec<Class>,
    /// Class index (within a shard) for each rounded size (index
    /// `(size - 1) / 16`).
    size_to_class: [u8; NUM_SIZES],
    /// Classes per shard.
    per_shard: usize,
    shards: usize,
    /// Per-shard page source and page count.
    shard_state: Vec<ShardState>,
    /// Limit in pages; `u64::MAX` for none.
    limit_pages: AtomicU64,
    compactions: AtomicU64,
    objects_moved: AtomicU64,
    pages_compacted: AtomicU64,
    watermark_percent: Option<u8>,
    compactor: Compactor,
}

/// What each shard owns apart from its classes; aligned so that two
/// shards' counters never share a cache line.
#[repr(align(128))]
struct ShardState {
    arena: PageArena,
    /// Pages committed by this shard's zspages.
    pages: AtomicU64,
}

/// Background compaction: classes are posted here by `free` when their
/// freeable pages pass the watermark, and one thread compacts them.
struct Compactor {
    state: Mutex<CompactorState>,
    wake: Condvar,
}

struct CompactorState {
    pending: Vec<u16>,
    /// Batches of freed pages to give back to the kernel, by shard.
    releases: Vec<(usize, ReleaseBatch)>,
    /// The thread sleeps until notified (it notices posts by itself while it
    /// lingers: see `LINGER`).
    idle: bool,
    stop: bool,
}

/// After a release, the background thread keeps looking for more every
/// `LINGER_TICK` for `LINGER`, so that a thread emptying the pool posts its
/// batches without waking it each time (a wake-up costs the poster about
/// 20 µs here, as much as releasing the batch itself); it is woken when
/// batches pile up. No lingering under the model checker, whose schedules
/// must not depend on time.
const LINGER: std::time::Duration =
    std::time::Duration::from_millis(if cfg!(feature = "shuttle") { 0 } else { 10 });
const LINGER_TICK: std::time::Duration = std::time::Duration::from_micros(250);

/// Batches the compactor may have waiting before freeing threads release
/// their own batches (so a busy compactor delays at most this many).
const MAX_QUEUED_RELEASES: usize = 4;

/// The zsmalloc-class pool. See the module documentation.
pub struct ZsPool {
    shared: Arc<PoolState>,
    /// The compactor thread, if the pool has one. Behind a lock because a
    /// forked child replaces it (`fork_child`, through `&self`); nothing
    /// else takes that lock but `Drop`.
    thread: uzswap_os::lock::Mutex<Option<CompactorThread>>,
    /// Run first on the compactor thread, also on the one a forked child
    /// starts.
    thread_start: Option<fn()>,
}

static NEXT_TAG: AtomicU32 = AtomicU32::new(0);

/// Best zspage geometry for a slot size: (pages, objects). Usage is
/// compared in 1/10000ths; ties go to the smaller zspage.
fn geometry(size: usize, max_pages: usize) -> (usize, usize) {
    let usage = |pages: usize| (pages * PAGE_SIZE / size) * size * 10_000 / (pages * PAGE_SIZE);
    let pages = (1..=max_pages)
        .rev()
        .max_by_key(|&p| usage(p))
        .expect("max_pages >= 1");
    (pages, pages * PAGE_SIZE / size)
}

/// A hint to bring the cache line of `p` in; `p` need not be valid (a
/// prefetch never faults).
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `prefetch` needs SSE, part of every x86-64 CPU; it reads
    // nothing architecturally and cannot fault, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

fn group_of(inuse: usize, objs: usize) -> usize {
    if inuse >= objs {
        FULL_GROUP
    } else {
        // inuse >= 1 here: (0,10%] → 0, …, (90%,100%) → 9.
        ((inuse * 10).div_ceil(objs) - 1).min(9)
    }
}

fn encode(tag: u32, class: u16, gen: u32, slot: u32) -> Handle {
    let raw = (u64::from(tag) << (SLOT_BITS + GEN_BITS + CLASS_BITS))
        | (u64::from(class) << (SLOT_BITS + GEN_BITS))
        | (u64::from(gen & GEN_MASK) << SLOT_BITS)
        | u64::from(slot);
    Handle::from_raw(raw).expect("tag is never zero")
}

/// Splits a handle into (tag, class, gen, slot).
fn decode(h: Handle) -> (u32, usize, u32, u32) {
    let raw = h.to_raw();
    let tag = (raw >> (SLOT_BITS + GEN_BITS + CLASS_BITS)) as u32;
    let class = ((raw >> (SLOT_BITS + GEN_BITS)) & ((1 << CLASS_BITS) - 1)) as usize;
    let gen = ((raw >> SLOT_BITS) as u32) & GEN_MASK;
    let slot = (raw & SLOT_MASK) as u32;
    (tag, class, gen, slot)
}

impl ZsPool {
    /// Creates a pool; starts the background compactor if the configuration
    /// asks for one.
    pub fn new(config: ZsConfig) -> Result<ZsPool, Error> {
        if !(1..=MAX_RUN_PAGES).contains(&config.max_pages_per_zspage) {
            return Err(Error::Config(format!(
                "max_pages_per_zspage {} is out of range: use 1..={MAX_RUN_PAGES}",
                config.max_pages_per_zspage
            )));
        }
        if let Some(p) = config.compact_watermark_percent {
            if p == 0 || p > 100 {
                return Err(Error::Config(format!(
                    "compact_watermark_percent {p} is out of range: use 1..=100, or None to disable"
                )));
            }
        }
        let mut classes: Vec<Class> = Vec::new();
        let mut size_to_class = [0u8; NUM_SIZES];
        // From the largest size down, merging a size into the class above it
        // when both would have the same geometry.
        let mut raw_class = [0usize; NUM_SIZES];
        for i in (0..NUM_SIZES).rev() {
            let size = (i + 1) * CLASS_STEP;
            let (pages, objs) = geometry(size, config.max_pages_per_zspage);
            match classes.last() {
                Some(c) if c.pages_per_zspage == pages && c.objs_per_zspage == objs => {}
                _ => classes.push(Class::new(size, pages, objs)),
            }
            raw_class[i] = classes.len() - 1;
        }
        // Number classes from the smallest size up, as the kernel's table.
        classes.reverse();
        let n = classes.len();
        for i in 0..NUM_SIZES {
            size_to_class[i] = (n - 1 - raw_class[i]) as u8;
        }
        let shards = config.shards.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, |p| p.get().min(MAX_SHARDS))
        });
        if !(1..=MAX_SHARDS).contains(&shards) {
            return Err(Error::Config(format!(
                "shards {shards} is out of range: use 1..={MAX_SHARDS}"
            )));
        }
        // Shard k's classes are classes[k*n .. (k+1)*n].
        let mut all = Vec::with_capacity(n * shards);
        for _ in 0..shards {
            for c in &classes {
                all.push(Class::new(c.size, c.pages_per_zspage, c.objs_per_zspage));
            }
        }
        let mut classes = all;
        assert!(classes.len() <= 1 << CLASS_BITS);
        for (i, c) in classes.iter_mut().enumerate() {
            c.index = i as u16;
        }
        let tag = NEXT_TAG.fetch_add(1, Ordering::Relaxed) % ((1 << TAG_BITS) - 1) + 1;
        let shared = Arc::new(PoolState {
            tag,
            classes,
            per_shard: n,
            shards,
            size_to_class,
            shard_state: (0..shards)
                .map(|_| ShardState {
                    arena: PageArena::new(),
                    pages: AtomicU64::new(0),
                })
                .collect(),
            limit_pages: AtomicU64::new(limit_to_pages(config.limit_bytes)),
            compactions: AtomicU64::new(0),
            objects_moved: AtomicU64::new(0),
            pages_compacted: AtomicU64::new(0),
            watermark_percent: config.compact_watermark_percent,
            compactor: Compactor {
                state: Mutex::new(CompactorState {
                    pending: Vec::new(),
                    releases: Vec::new(),
                    idle: false,
                    stop: false,
                }),
                wake: Condvar::new(),
            },
        });
        let thread = match config.compact_watermark_percent {
            None => None,
            Some(_) => Some(start_compactor(&shared, config.thread_start)?),
        };
        Ok(ZsPool {
            shared,
            thread: uzswap_os::lock::Mutex::new(thread),
            thread_start: config.thread_start,
        })
    }

    /// Releases every lock `fork_prepare` took, innermost first.
    ///
    /// # Safety
    /// As [`AfterFork::after_fork`]: this thread took them all in
    /// `fork_prepare` and kept them; with `Side::Child`, it is the only
    /// thread of the process.
    unsafe fn release_after_fork(&self, side: Side) {
        let sh = &*self.shared;
        // SAFETY: forwarded from this function's contract (for the condvar,
        // that this thread is alone in the child); `fork_prepare` kept every
        // lock released here, and nothing here uses what they guard.
        unsafe {
            sh.compactor.wake.after_fork(side);
            sh.compactor.state.after_fork(side);
            for s in sh.shard_state.iter().rev() {
                s.arena.unlock_after_fork(side);
            }
            for c in sh.classes.iter().rev() {
                c.inner.after_fork(side);
            }
        }
    }

    /// The classes as (index, slot size, pages per zspage, objects per
    /// zspage), smallest first.
    pub fn class_geometry(&self) -> Vec<(usize, usize, usize, usize)> {
        self.shared.classes[..self.shared.per_shard]
            .iter()
            .map(|c| {
                (
                    c.index as usize,
                    c.size,
                    c.pages_per_zspage,
                    c.objs_per_zspage,
                )
            })
            .collect()
    }
}

impl Class {
    fn new(size: usize, pages_per_zspage: usize, objs_per_zspage: usize) -> Class {
        Class {
            index: 0,
            size,
            pages_per_zspage,
            objs_per_zspage,
            inner: RwLock::new(ClassInner {
                zspages: Vec::new(),
                free_zspage_ids: Vec::new(),
                groups: Default::default(),
                slots: Vec::new(),
                free_slots: Vec::new(),
                obj_used: 0,
                payload: 0,
                live_zspages: 0,
                pages_committed: 0,
                spare: Vec::new(),
            }),
            compact_pending: AtomicBool::new(false),
        }
    }
}

impl PoolState {
    /// The class for a new object of `size` bytes, in the shard of the CPU
    /// this thread runs on.
    fn class_for(&self, size: usize) -> &Class {
        let shard = if self.shards == 1 {
            0
        } else if cfg!(feature = "shuttle") {
            // Under the model checker every thread runs on one CPU: spread
            // threads over shards by id so cross-shard paths are explored.
            let id = format!("{:?}", sync::thread::current().id());
            id.bytes().map(usize::from).sum::<usize>() % self.shards
        } else {
            // SAFETY: sched_getcpu has no preconditions; it reads the CPU
            // number (through rseq or the vDSO, no system call). A stale
            // answer only costs locality, never correctness.
            let cpu = unsafe { libc::sched_getcpu() };
            cpu.max(0) as usize % self.shards
        };
        &self.classes[shard * self.per_shard + self.size_to_class[(size - 1) / CLASS_STEP] as usize]
    }
}

fn limit_to_pages(limit_bytes: Option<u64>) -> u64 {
    limit_bytes.map_or(u64::MAX, |b| b / PAGE_SIZE as u64)
}

impl Drop for ZsPool {
    fn drop(&mut self) {
        {
            let mut st = self.shared.compactor.state.lock();
            st.stop = true;
        }
        self.shared.compactor.wake.notify_all();
        if let Some(t) = self.thread.get_mut().take() {
            let _ = t.join();
        }
        // The arena unmaps its chunks when `shared` goes.
    }
}

/// The compactor thread's handle: a helper thread, except in a
/// model-checked build, which starts its threads in the model.
#[cfg(not(feature = "shuttle"))]
type CompactorThread = uzswap_os::Helper;
#[cfg(feature = "shuttle")]
type CompactorThread = sync::thread::JoinHandle<()>;

/// Starts the background compactor of `shared` (named "zs-compact").
fn start_compactor(
    shared: &Arc<PoolState>,
    thread_start: Option<fn()>,
) -> Result<CompactorThread, Error> {
    let weak = Arc::downgrade(shared);
    // A helper thread (listed for the CPU accounting), except
    // in a model-checked build, which starts its threads in the model.
    #[cfg(not(feature = "shuttle"))]
    let started = uzswap_os::spawn_helper("zs-compact", thread_start, move || compactor_main(weak));
    #[cfg(feature = "shuttle")]
    let started = {
        let _ = thread_start;
        sync::thread::Builder::new()
            .name("zs-compact".into())
            .spawn(move || compactor_main(weak))
    };
    started.map_err(|e| Error::Config(format!("cannot start the compaction thread: {e}")))
}

fn compactor_main(weak: Weak<PoolState>) {
    enum Job {
        Release(usize, ReleaseBatch),
        Compact(u16),
    }
    let mut last_release: Option<std::time::Instant> = None;
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let job = {
            let mut st = shared.compactor.state.lock();
            loop {
                if st.stop {
                    return;
                }
                if let Some((shard, b)) = st.releases.pop() {
                    break Job::Release(shard, b);
                }
                if let Some(c) = st.pending.pop() {
                    break Job::Compact(c);
                }
                if last_release.is_some_and(|t| t.elapsed() < LINGER) {
                    st = sync::wait_for(&shared.compactor.wake, st, LINGER_TICK);
                } else {
                    st.idle = true;
                    st = sync::wait(&shared.compactor.wake, st);
                    st.idle = false;
                }
            }
        };
        match job {
            Job::Release(shard, b) => {
                shared.shard_state[shard].arena.release(b);
                last_release = Some(std::time::Instant::now());
            }
            Job::Compact(class) => {
                let c = &shared.classes[class as usize];
                c.compact_pending.store(false, Ordering::Relaxed);
                shared.compact_class(c);
            }
        }
        drop(shared);
    }
}

impl PoolState {
    /// Resolves a handle to its class, generation and slot index.
    fn class_of(&self, h: Handle) -> Result<(&Class, u32, u32), Error> {
        let (tag, class, gen, slot) = decode(h);
        if tag != self.tag || class >= self.classes.len() {
            return Err(Error::ForeignHandle(h.to_raw()));
        }
        Ok((&self.classes[class], gen, slot))
    }

    fn locate(inner: &ClassInner, h: Handle, gen: u32, slot: u32) -> Result<Located, Error> {
        let s = inner
            .slots
            .get(slot as usize)
            .ok_or(Error::StaleHandle(h.to_raw()))?;
        if s.zspage == FREE || s.gen & GEN_MASK != gen {
            return Err(Error::StaleHandle(h.to_raw()));
        }
        Ok(Located {
            slot,
            zspage: s.zspage,
            obj: s.obj,
            size: s.size as usize,
        })
    }

    fn obj_ptr(class: &Class, inner: &ClassInner, zspage: u32, obj: u16) -> *mut u8 {
        let zp = inner.zspages[zspage as usize]
            .as_ref()
            .expect("slot points at a live zspage");
        // SAFETY: obj < fresh <= objs_per_zspage, so the offset stays inside
        // the committed part of the run that `base` starts.
        unsafe { zp.base.as_ptr().add(obj as usize * class.size) }
    }

    /// The located object's bytes, borrowed from the class state: the
    /// class lock (shared or exclusive) that gave `inner` stays held while
    /// the slice lives, and everything that changes object bytes (write,
    /// free, compaction) needs `&mut ClassInner`.
    fn obj_bytes<'a>(class: &Class, inner: &'a ClassInner, loc: &Located) -> &'a [u8] {
        let ptr = Self::obj_ptr(class, inner, loc.zspage, loc.obj);
        // SAFETY: the object's loc.size bytes lie in committed memory of a
        // live zspage, and the borrow of `inner` keeps them unchanged (see
        // above) for the slice's lifetime.
        unsafe { std::slice::from_raw_parts(ptr, loc.size) }
    }

    fn shard(&self, class: &Class) -> &ShardState {
        &self.shard_state[self.shard_index(class)]
    }

    fn shard_index(&self, class: &Class) -> usize {
        class.index as usize / self.per_shard
    }

    /// Pages held by the whole pool.
    fn pages_held(&self) -> u64 {
        self.shard_state
            .iter()
            .map(|s| s.pages.load(Ordering::Relaxed))
            .sum()
    }

    /// Takes `pages` more pages for `class` against the limit (unless
    /// `force`).
    fn reserve(&self, class: &Class, pages: u64, force: bool) -> Result<(), Error> {
        if pages == 0 {
            return Ok(());
        }
        let limit = self.limit_pages.load(Ordering::Relaxed);
        let own = &self.shard(class).pages;
        // Add first, then check the total, so that concurrent shards can
        // make each other fail but never both pass the limit.
        own.fetch_add(pages, Ordering::Relaxed);
        if !force && self.pages_held() > limit {
            own.fetch_sub(pages, Ordering::Relaxed);
            return Err(Error::LimitReached {
                limit_bytes: limit.saturating_mul(PAGE_SIZE as u64),
            });
        }
        Ok(())
    }

    /// Takes an object slot in zspage `zid` for handle slot `slot`: a freed
    /// object if there is one, else the next fresh one, committing the pages
    /// it reaches (the caller reserved them). Returns the object index.
    fn take_obj(class: &Class, inner: &mut ClassInner, zid: u32, slot: u32) -> u16 {
        let objs = class.objs_per_zspage;
        let zp = inner.zspages[zid as usize]
            .as_mut()
            .expect("caller picked a live zspage");
        let obj = match zp.pop_free() {
            Some(o) => o,
            None => {
                let o = zp.fresh;
                zp.fresh += 1;
                let now = class.pages_for(zp.fresh as usize) as u32;
                inner.pages_committed += u64::from(now - zp.committed);
                zp.committed = now;
                o as u16
            }
        };
        zp.owner[obj as usize] = slot;
        zp.inuse += 1;
        let inuse = zp.inuse as usize;
        Self::regroup(inner, zid, group_of(inuse, objs));
        obj
    }

    /// Pages that taking one more object in `zid` would commit.
    fn growth(class: &Class, zp: &Zspage) -> u64 {
        if zp.free_head == NO_OBJ {
            (class.pages_for(zp.fresh as usize + 1) - zp.committed as usize) as u64
        } else {
            0
        }
    }

    fn malloc_locked(
        &self,
        class: &Class,
        inner: &mut ClassInner,
        size: usize,
    ) -> Result<(Handle, *mut u8), Error> {
        // The fullest partial zspage, so sparse ones drain and can be freed.
        let partial = (0..FULL_GROUP)
            .rev()
            .find_map(|g| inner.groups[g].last().copied());
        let grow = match partial {
            Some(z) => Self::growth(class, inner.zspages[z as usize].as_ref().expect("live")),
            None => class.pages_for(1) as u64,
        };
        self.reserve(class, grow, false)?;
        let zid = match partial {
            Some(z) => z,
            None => match self.new_zspage(class, inner) {
                Ok(z) => z,
                Err(e) => {
                    self.shard(class).pages.fetch_sub(grow, Ordering::Relaxed);
                    return Err(e);
                }
            },
        };
        let slot = match inner.free_slots.pop() {
            Some(s) => s,
            None => {
                let s = inner.slots.len() as u64;
                assert!(s <= SLOT_MASK, "class handle table is full");
                inner.slots.push(Slot {
                    gen: 0,
                    zspage: FREE,
                    obj: 0,
                    size: 0,
                });
                // Room for every slot on the free list, taken now (doubling)
                // rather than by growing it on the free path.
                let n = inner.slots.len();
                inner.free_slots.reserve(n);
                s as u32
            }
        };
        let obj = Self::take_obj(class, inner, zid, slot);
        let ptr = Self::obj_ptr(class, inner, zid, obj);
        let s = &mut inner.slots[slot as usize];
        s.zspage = zid;
        s.obj = obj;
        s.size = size as u16;
        let h = encode(self.tag, class.index, s.gen, slot);
        inner.obj_used += 1;
        inner.payload += size as u64;
        Ok((h, ptr))
    }

    /// Makes an empty zspage (no page committed yet) in group 0.
    fn new_zspage(&self, class: &Class, inner: &mut ClassInner) -> Result<u32, Error> {
        let base = self.shard(class).arena.alloc_run(class.pages_per_zspage)?;
        let owner = inner
            .spare
            .pop()
            .unwrap_or_else(|| vec![FREE; class.objs_per_zspage]);
        debug_assert!(owner.iter().all(|&o| o == FREE));
        let zp = Zspage {
            base,
            inuse: 0,
            fresh: 0,
            committed: 0,
            touched: false,
            free_head: NO_OBJ,
            owner,
            group: 0,
            group_pos: inner.groups[0].len() as u32,
        };
        let zid = match inner.free_zspage_ids.pop() {
            Some(id) => {
                inner.zspages[id as usize] = Some(zp);
                id
            }
            None => {
                inner.zspages.push(Some(zp));
                let n = inner.zspages.len();
                inner.free_zspage_ids.reserve(n);
                (inner.zspages.len() - 1) as u32
            }
        };
        inner.groups[0].push(zid);
        inner.live_zspages += 1;
        Ok(zid)
    }

    /// Moves zspage `zid` to group `g` (no-op if already there).
    fn regroup(inner: &mut ClassInner, zid: u32, g: usize) {
        let zp = inner.zspages[zid as usize].as_ref().expect("live zspage");
        let (old, pos) = (zp.group as usize, zp.group_pos as usize);
        if old == g {
            return;
        }
        Self::unlink(inner, old, pos);
        let list = &mut inner.groups[g];
        list.push(zid);
        let pos = (list.len() - 1) as u32;
        let zp = inner.zspages[zid as usize].as_mut().expect("live zspage");
        zp.group = g as u8;
        zp.group_pos = pos;
    }

    /// Removes the entry at `pos` of group `g`, fixing the moved entry.
    fn unlink(inner: &mut ClassInner, g: usize, pos: usize) {
        let list = &mut inner.groups[g];
        list.swap_remove(pos);
        if let Some(&moved) = list.get(pos) {
            inner.zspages[moved as usize]
                .as_mut()
                .expect("group lists only live zspages")
                .group_pos = pos as u32;
        }
    }

    /// Frees the object at `loc`: wipes it if it was ever written, returns
    /// its slot to the table. Returns the zspage's run if the zspage became
    /// empty (the caller gives it back after dropping the class lock).
    fn free_locked(
        &self,
        class: &Class,
        inner: &mut ClassInner,
        loc: &Located,
    ) -> Option<EmptyRun> {
        let s = &mut inner.slots[loc.slot as usize];
        let written = s.gen & WRITTEN != 0;
        s.zspage = FREE;
        s.gen = (s.gen + 1) & GEN_MASK;
        inner.free_slots.push(loc.slot);
        inner.obj_used -= 1;
        inner.payload -= loc.size as u64;
        if written {
            let ptr = Self::obj_ptr(class, inner, loc.zspage, loc.obj);
            // SAFETY: ptr points at this object's slot (>= loc.size bytes)
            // in a live zspage, and we hold the class lock exclusively.
            // Wiping keeps old contents from a later owner and keeps the
            // invariant that free object memory reads as zeros.
            unsafe { std::ptr::write_bytes(ptr, 0, loc.size) };
        }
        self.release_obj(class, inner, loc.zspage, loc.obj)
    }

    /// Asks the CPU for the lines that freeing the located object writes and
    /// that reading it does not touch (its `owner` entry, its place in its
    /// fullness list and that list's end, the end of the list it moves to,
    /// the end of the free slot list), so they arrive while the caller's
    /// reader (a decompressor) runs instead of one after another in the
    /// free. Only addresses are formed; nothing is read through them.
    fn prefetch_free(class: &Class, inner: &ClassInner, loc: &Located) {
        let zp = inner.zspages[loc.zspage as usize]
            .as_ref()
            .expect("slot points at a live zspage");
        prefetch(zp.owner.as_ptr().wrapping_add(loc.obj as usize));
        let list = &inner.groups[zp.group as usize];
        prefetch(list.as_ptr().wrapping_add(zp.group_pos as usize));
        prefetch(list.as_ptr().wrapping_add(list.len().saturating_sub(1)));
        if zp.inuse > 1 {
            let to = &inner.groups[group_of(zp.inuse as usize - 1, class.objs_per_zspage)];
            prefetch(to.as_ptr().wrapping_add(to.len()));
        }
        prefetch(
            inner
                .free_slots
                .as_ptr()
                .wrapping_add(inner.free_slots.len()),
        );
    }

    /// Frees the located object, posts the class to the compactor if it
    /// crossed the watermark, drops the class lock and gives back the
    /// zspage if it emptied.
    fn free_and_unlock(
        &self,
        class: &Class,
        mut inner: impl std::ops::DerefMut<Target = ClassInner>,
        loc: &Located,
    ) {
        let run = self.free_locked(class, &mut inner, loc);
        self.maybe_post(class, &inner);
        drop(inner);
        self.give_back(class, run);
    }

    /// Marks object `obj` of zspage `zid` free; frees the zspage if it
    /// became empty, returning its run.
    fn release_obj(
        &self,
        class: &Class,
        inner: &mut ClassInner,
        zid: u32,
        obj: u16,
    ) -> Option<EmptyRun> {
        let zp = inner.zspages[zid as usize].as_mut().expect("live zspage");
        zp.push_free(obj);
        zp.inuse -= 1;
        let inuse = zp.inuse as usize;
        if inuse == 0 {
            let (g, pos, base, touched) = (
                zp.group as usize,
                zp.group_pos as usize,
                zp.base,
                zp.touched,
            );
            let committed = u64::from(zp.committed);
            Self::unlink(inner, g, pos);
            let zp = inner.zspages[zid as usize].take().expect("live zspage");
            if inner.spare.len() < SPARE_VECS {
                // Empty: unlink the free stack (objects past `fresh` are
                // FREE already).
                let mut owner = zp.owner;
                owner[..zp.fresh as usize].fill(FREE);
                inner.spare.push(owner);
            }
            inner.free_zspage_ids.push(zid);
            inner.live_zspages -= 1;
            inner.pages_committed -= committed;
            self.shard(class)
                .pages
                .fetch_sub(committed, Ordering::Relaxed);
            return Some(EmptyRun {
                base,
                committed,
                touched,
            });
        }
        Self::regroup(inner, zid, group_of(inuse, class.objs_per_zspage));
        None
    }

    /// Returns an emptied zspage's run to its arena. When that completes a
    /// batch of pages to release, the compactor thread releases it, off the
    /// freeing thread's path; without that thread (or with it behind), the
    /// freeing thread does.
    fn give_back(&self, class: &Class, run: Option<EmptyRun>) {
        let Some(r) = run else { return };
        let shard = self.shard_index(class);
        let arena = &self.shard_state[shard].arena;
        // SAFETY: the run came from this arena with this length, its zspage
        // was removed from the class under the class lock, and no slot points
        // into it any more.
        let Some(b) = (unsafe { arena.free_run(r.base, class.pages_per_zspage, r.touched) }) else {
            return;
        };
        // The background thread runs exactly when a watermark is set.
        if self.watermark_percent.is_some() {
            let mut st = self.compactor.state.lock();
            if !st.stop && st.releases.len() < MAX_QUEUED_RELEASES {
                st.releases.push((shard, b));
                // Asleep, or batches coming faster than it looks (one slot
                // left before freeing threads release their own): wake it.
                // A lingering thread finds the others within a tick, and a
                // wake-up costs the freeing thread more than a batch's worth
                // of loads (futex, and an IPI to the other CPU).
                let wake = st.idle || st.releases.len() >= MAX_QUEUED_RELEASES - 1;
                drop(st);
                if wake {
                    self.compactor.wake.notify_one();
                }
                return;
            }
        }
        arena.release(b);
    }

    /// Pages compaction could give back: pages committed minus the pages
    /// the class's objects need when packed (full zspages plus one dense
    /// partial one).
    fn freeable(class: &Class, inner: &ClassInner) -> u64 {
        let committed = inner.pages_committed;
        let objs = class.objs_per_zspage as u64;
        let needed = inner.obj_used / objs * class.pages_per_zspage as u64
            + class.pages_for((inner.obj_used % objs) as usize) as u64;
        committed.saturating_sub(needed)
    }

    /// Posts the class to the background compactor if it passed the
    /// watermark. Called with the class lock held.
    fn maybe_post(&self, class: &Class, inner: &ClassInner) {
        let Some(pct) = self.watermark_percent else {
            return;
        };
        let freeable = Self::freeable(class, inner);
        if freeable < 2 * class.pages_per_zspage as u64
            || freeable * 100 < inner.pages_committed * u64::from(pct)
        {
            return;
        }
        if class.compact_pending.swap(true, Ordering::Relaxed) {
            return;
        }
        self.compactor.state.lock().pending.push(class.index);
        self.compactor.wake.notify_one();
    }

    /// Moves object `obj` of zspage `src` into a free object of `dst`,
    /// updating its handle slot. Returns `src`'s run if it became empty.
    fn move_obj(
        &self,
        class: &Class,
        inner: &mut ClassInner,
        src: u32,
        obj: u16,
        dst: u32,
    ) -> Option<EmptyRun> {
        let slot = inner.zspages[src as usize].as_ref().expect("live").owner[obj as usize];
        let from = Self::obj_ptr(class, inner, src, obj);
        let grow = Self::growth(class, inner.zspages[dst as usize].as_ref().expect("live"));
        // Compaction gives back more than it takes: never refused.
        let _ = self.reserve(class, grow, true);
        let dobj = Self::take_obj(class, inner, dst, slot);
        let to = Self::obj_ptr(class, inner, dst, dobj);
        let s = &mut inner.slots[slot as usize];
        let size = s.size as usize;
        s.zspage = dst;
        s.obj = dobj;
        for z in [src, dst] {
            inner.zspages[z as usize].as_mut().expect("live").touched = true;
        }
        if from != to {
            // SAFETY: both pointers are distinct object slots of class.size
            // bytes in committed memory of live zspages of this class, so
            // they do not overlap; the class lock is held exclusively.
            unsafe {
                std::ptr::copy_nonoverlapping(from, to, size);
                std::ptr::write_bytes(from, 0, size);
            }
        }
        self.release_obj(class, inner, src, obj)
    }

    /// Packs the objects of a partial zspage into its lowest slots and gives
    /// back the committed pages past them. Returns pages given back.
    fn densify(&self, class: &Class, inner: &mut ClassInner, zid: u32) -> u64 {
        let zp = inner.zspages[zid as usize].as_mut().expect("live zspage");
        let inuse = zp.inuse as usize;
        let keep = class.pages_for(inuse);
        if keep >= zp.committed as usize {
            return 0;
        }
        let mut holes: Vec<u16> = zp
            .freed()
            .filter(|&o| (o as usize) < inuse)
            .map(|o| o as u16)
            .collect();
        let movers: Vec<u16> = (inuse..zp.fresh as usize)
            .filter(|&o| !is_free(zp.owner[o]))
            .map(|o| o as u16)
            .collect();
        debug_assert_eq!(holes.len(), movers.len());
        for obj in movers {
            let hole = holes
                .pop()
                .expect("as many holes below inuse as objects above");
            let zp = inner.zspages[zid as usize].as_mut().expect("live zspage");
            let slot = zp.owner[obj as usize];
            zp.owner[hole as usize] = slot;
            zp.owner[obj as usize] = FREE;
            let from = Self::obj_ptr(class, inner, zid, obj);
            let to = Self::obj_ptr(class, inner, zid, hole);
            let s = &mut inner.slots[slot as usize];
            s.obj = hole;
            let size = s.size as usize;
            // SAFETY: distinct object slots of the same zspage (hole <
            // inuse <= obj), class.size bytes each, no overlap; exclusive
            // class lock held.
            unsafe {
                std::ptr::copy_nonoverlapping(from, to, size);
                std::ptr::write_bytes(from, 0, size);
            }
        }
        let zp = inner.zspages[zid as usize].as_mut().expect("live zspage");
        // Objects below `inuse` are all in use now; the rest become fresh.
        zp.owner[inuse..zp.fresh as usize].fill(FREE);
        zp.free_head = NO_OBJ;
        zp.fresh = inuse as u32;
        let released = zp.committed as usize - keep;
        // SAFETY: pages keep..committed of the run hold no object any more
        // (every object now lies below `fresh`), and the exclusive class lock
        // keeps everyone else out.
        unsafe {
            self.shard(class).arena.decommit(
                NonNull::new(zp.base.as_ptr().add(keep * PAGE_SIZE)).expect("non-null"),
                released,
            )
        };
        zp.committed = keep as u32;
        inner.pages_committed -= released as u64;
        self.shard(class)
            .pages
            .fetch_sub(released as u64, Ordering::Relaxed);
        released as u64
    }

    /// Compacts one class: empties the sparsest zspages into the fullest
    /// partial ones, then packs what stays partial. Takes the class lock once
    /// per source zspage, so readers wait at most one zspage's worth of moves.
    fn compact_class(&self, class: &Class) -> CompactReport {
        let mut report = CompactReport::default();
        loop {
            let mut inner = class.inner.write();
            if Self::freeable(class, &inner) == 0 {
                break;
            }
            let Some(src) = (0..FULL_GROUP).find_map(|g| inner.groups[g].first().copied()) else {
                break;
            };
            let mut run = None;
            // Move every object of `src` into the fullest other partial zspage.
            while run.is_none() {
                let dst = (0..FULL_GROUP)
                    .rev()
                    .find_map(|g| inner.groups[g].iter().rev().find(|&&z| z != src).copied());
                let Some(dst) = dst else { break };
                let src_zp = inner.zspages[src as usize].as_ref().expect("live zspage");
                let obj = src_zp
                    .owner
                    .iter()
                    .rposition(|&o| !is_free(o))
                    .expect("a live zspage holds an object") as u16;
                run = self.move_obj(class, &mut inner, src, obj, dst);
                report.objects_moved += 1;
            }
            drop(inner);
            match run {
                Some(r) => {
                    report.pages_freed += r.committed;
                    self.give_back(class, Some(r));
                }
                // No destination left for src: nothing more to move.
                None => break,
            }
        }
        let mut inner = class.inner.write();
        let partial: Vec<u32> = (0..FULL_GROUP)
            .flat_map(|g| inner.groups[g].clone())
            .collect();
        for z in partial {
            report.pages_freed += self.densify(class, &mut inner, z);
        }
        drop(inner);
        self.compactions.fetch_add(1, Ordering::Relaxed);
        self.objects_moved
            .fetch_add(report.objects_moved, Ordering::Relaxed);
        self.pages_compacted
            .fetch_add(report.pages_freed, Ordering::Relaxed);
        report
    }
}

impl Zpool for ZsPool {
    fn name(&self) -> &'static str {
        "zsmalloc"
    }

    fn malloc(&self, size: usize) -> Result<Handle, Error> {
        check_size(size)?;
        let sh = &*self.shared;
        let class = sh.class_for(size);
        let mut inner = class.inner.write();
        sh.malloc_locked(class, &mut inner, size).map(|(h, _)| h)
    }

    fn malloc_write(&self, data: &[u8]) -> Result<Handle, Error> {
        let size = data.len();
        check_size(size)?;
        let sh = &*self.shared;
        let class = sh.class_for(size);
        let mut inner = class.inner.write();
        let (h, ptr) = sh.malloc_locked(class, &mut inner, size)?;
        // SAFETY: ptr is the new object's slot (class.size >= size bytes) in
        // committed memory of a live zspage; we hold the class lock
        // exclusively.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, size) };
        let (_, _, _, slot) = decode(h);
        let s = &mut inner.slots[slot as usize];
        s.gen |= WRITTEN;
        let zid = s.zspage;
        inner.zspages[zid as usize].as_mut().expect("live").touched = true;
        Ok(h)
    }

    fn free(&self, handle: Handle) -> Result<usize, Error> {
        let sh = &*self.shared;
        let (class, gen, slot) = sh.class_of(handle)?;
        let inner = class.inner.write();
        let loc = PoolState::locate(&inner, handle, gen, slot)?;
        sh.free_and_unlock(class, inner, &loc);
        Ok(loc.size)
    }

    /// One exclusive lock round for the read and the free: `f` runs under
    /// the class lock held exclusively (so other objects of the class in
    /// this shard wait for it, as they would for a free), and the metadata
    /// it found stays in the CPU's cache for the free.
    fn map_read_free(
        &self,
        handle: Handle,
        f: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<bool, Error> {
        let sh = &*self.shared;
        let (class, gen, slot) = sh.class_of(handle)?;
        let inner = class.inner.write();
        let loc = PoolState::locate(&inner, handle, gen, slot)?;
        PoolState::prefetch_free(class, &inner, &loc);
        if !f(PoolState::obj_bytes(class, &inner, &loc)) {
            return Ok(false);
        }
        sh.free_and_unlock(class, inner, &loc);
        Ok(true)
    }

    fn object_size(&self, handle: Handle) -> Result<usize, Error> {
        let (class, gen, slot) = self.shared.class_of(handle)?;
        let inner = class.inner.read();
        Ok(PoolState::locate(&inner, handle, gen, slot)?.size)
    }

    fn write(&self, handle: Handle, data: &[u8]) -> Result<(), Error> {
        let (class, gen, slot) = self.shared.class_of(handle)?;
        let mut inner = class.inner.write();
        let loc = PoolState::locate(&inner, handle, gen, slot)?;
        if data.len() != loc.size {
            return Err(Error::BadBuffer {
                got: data.len(),
                object: loc.size,
                what: "write() takes exactly the object's size",
            });
        }
        let ptr = PoolState::obj_ptr(class, &inner, loc.zspage, loc.obj);
        // SAFETY: ptr is this object's slot (>= loc.size bytes) in a live
        // zspage, and the exclusive class lock keeps readers out.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, loc.size) };
        inner.slots[slot as usize].gen |= WRITTEN;
        inner.zspages[loc.zspage as usize]
            .as_mut()
            .expect("live")
            .touched = true;
        Ok(())
    }

    fn read(&self, handle: Handle, buf: &mut [u8]) -> Result<usize, Error> {
        let (class, gen, slot) = self.shared.class_of(handle)?;
        let inner = class.inner.read();
        let loc = PoolState::locate(&inner, handle, gen, slot)?;
        if buf.len() < loc.size {
            return Err(Error::BadBuffer {
                got: buf.len(),
                object: loc.size,
                what: "read() needs a buffer at least the object's size",
            });
        }
        buf[..loc.size].copy_from_slice(PoolState::obj_bytes(class, &inner, &loc));
        Ok(loc.size)
    }

    fn map_read(&self, handle: Handle, f: &mut dyn FnMut(&[u8])) -> Result<(), Error> {
        let (class, gen, slot) = self.shared.class_of(handle)?;
        let inner = class.inner.read();
        let loc = PoolState::locate(&inner, handle, gen, slot)?;
        f(PoolState::obj_bytes(class, &inner, &loc));
        Ok(())
    }

    fn compact(&self) -> CompactReport {
        let mut total = CompactReport::default();
        for c in &self.shared.classes {
            let r = self.shared.compact_class(c);
            total.objects_moved += r.objects_moved;
            total.pages_freed += r.pages_freed;
        }
        // Give back what emptied zspages still hold resident: the batches
        // queued for the background thread (released here, so the wait
        // below is for at most the one it is releasing), then the pending.
        let queued = std::mem::take(&mut self.shared.compactor.state.lock().releases);
        for (shard, b) in queued {
            self.shared.shard_state[shard].arena.release(b);
        }
        for s in self.shared.shard_state.iter() {
            s.arena.flush();
        }
        total
    }

    fn stats(&self) -> PoolStats {
        let sh = &*self.shared;
        let mut st = PoolStats {
            allocator: "zsmalloc",
            ..PoolStats::default()
        };
        let mut meta = sh
            .shard_state
            .iter()
            .map(|s| s.arena.metadata_bytes() as u64)
            .sum::<u64>()
            + (sh.classes.capacity() * std::mem::size_of::<Class>()) as u64;
        // One row per class size, summed over the shards.
        let mut rows: Vec<ClassStats> = sh.classes[..sh.per_shard]
            .iter()
            .map(|c| ClassStats {
                class: u32::from(c.index),
                size: c.size as u32,
                pages_per_zspage: c.pages_per_zspage as u32,
                ..ClassStats::default()
            })
            .collect();
        for c in &sh.classes {
            let inner = c.inner.read();
            let objs = c.objs_per_zspage as u64;
            let row = &mut rows[c.index as usize % sh.per_shard];
            row.obj_allocated += inner.live_zspages * objs;
            row.obj_used += inner.obj_used;
            row.pages_used += inner.pages_committed;
            row.freeable += PoolState::freeable(c, &inner);
            for (g, list) in inner.groups.iter().enumerate() {
                row.fullness[(g + 1).min(FULLNESS_BUCKETS - 1)] += list.len() as u64;
                if g != FULL_GROUP {
                    for &z in list {
                        let zp = inner.zspages[z as usize].as_ref().expect("live zspage");
                        if u64::from(zp.inuse) * 4 >= objs * 3 {
                            row.almost_full += 1;
                        } else {
                            row.almost_empty += 1;
                        }
                    }
                }
            }
            st.objects += inner.obj_used;
            st.payload_bytes += inner.payload;
            meta += (inner.slots.capacity() * std::mem::size_of::<Slot>()
                + inner.free_slots.capacity() * 4
                + inner.free_zspage_ids.capacity() * 4
                + inner.zspages.capacity() * std::mem::size_of::<Option<Zspage>>()
                + inner.groups.iter().map(|g| g.capacity() * 4).sum::<usize>()
                + inner.spare.iter().map(|o| o.capacity() * 4).sum::<usize>())
                as u64;
            for zp in inner.zspages.iter().flatten() {
                meta += (zp.owner.capacity() * 4) as u64;
            }
        }
        st.classes = rows.into_iter().filter(|r| r.pages_used > 0).collect();
        st.pages_held = sh.pages_held();
        st.pool_bytes = st.pages_held * PAGE_SIZE as u64;
        st.metadata_bytes = meta;
        let lim = sh.limit_pages.load(Ordering::Relaxed);
        st.limit_bytes = (lim != u64::MAX).then(|| lim * PAGE_SIZE as u64);
        st.compactions = sh.compactions.load(Ordering::Relaxed);
        st.objects_moved = sh.objects_moved.load(Ordering::Relaxed);
        st.pages_compacted = sh.pages_compacted.load(Ordering::Relaxed);
        let (releasing, batches) = sh.shard_state.iter().fold((0, 0), |(p, b), s| {
            let (sp, sb) = s.arena.releasing_pages();
            (p + sp, b + sb)
        });
        st.extra = vec![
            ("releasing_pages".into(), releasing),
            ("release_batches".into(), batches),
        ];
        st
    }

    fn pool_bytes(&self) -> u64 {
        self.shared.pages_held() * PAGE_SIZE as u64
    }

    fn set_limit(&self, limit_bytes: Option<u64>) {
        self.shared
            .limit_pages
            .store(limit_to_pages(limit_bytes), Ordering::Relaxed);
    }

    fn check_invariants(&self) -> Result<(), String> {
        let sh = &*self.shared;
        // Hold every class lock at once so the page total is consistent
        // (taking them in index order; nothing else takes two).
        let guards: Vec<_> = sh.classes.iter().map(|c| c.inner.write()).collect();
        let mut pages = 0u64;
        for (c, inner) in sh.classes.iter().zip(&guards) {
            let name = format!("class {} (size {})", c.index, c.size);
            let objs = c.objs_per_zspage;
            let mut live = 0u64;
            let mut inuse_sum = 0u64;
            let mut committed = 0u64;
            for (zid, zp) in inner.zspages.iter().enumerate() {
                let Some(zp) = zp else { continue };
                live += 1;
                let owned = zp.owner.iter().filter(|&&o| !is_free(o)).count();
                if owned != zp.inuse as usize || zp.inuse == 0 {
                    return Err(format!(
                        "{name}: zspage {zid} inuse {} but {owned} owned objects",
                        zp.inuse
                    ));
                }
                if zp.committed as usize != c.pages_for(zp.fresh as usize) {
                    return Err(format!(
                        "{name}: zspage {zid} commits {} pages for {} fresh objects",
                        zp.committed, zp.fresh
                    ));
                }
                committed += u64::from(zp.committed);
                if !zp.touched {
                    // SAFETY: the committed pages of a live zspage's run;
                    // every class lock is held, so nobody writes them.
                    let bytes = unsafe {
                        std::slice::from_raw_parts(
                            zp.base.as_ptr(),
                            zp.committed as usize * PAGE_SIZE,
                        )
                    };
                    if bytes.iter().any(|&b| b != 0) {
                        return Err(format!("{name}: zspage {zid} was written but not marked"));
                    }
                }
                let freed = zp.freed().count();
                if zp.inuse as usize + freed + (objs - zp.fresh as usize) != objs {
                    return Err(format!("{name}: zspage {zid} object counts do not add up"));
                }
                if zp.owner[zp.fresh as usize..].iter().any(|&o| o != FREE) {
                    return Err(format!(
                        "{name}: zspage {zid} has an object past fresh that is not FREE"
                    ));
                }
                for f in zp.freed() {
                    if f >= zp.fresh || !is_free(zp.owner[f as usize]) {
                        return Err(format!("{name}: zspage {zid} free object {f} is in use"));
                    }
                    // SAFETY: f < fresh, so the slot lies in committed memory
                    // of a live zspage; every class lock is held.
                    let bytes = unsafe {
                        std::slice::from_raw_parts(
                            zp.base.as_ptr().add(f as usize * c.size),
                            c.size,
                        )
                    };
                    if bytes.iter().any(|&b| b != 0) {
                        return Err(format!(
                            "{name}: zspage {zid} free object {f} was not wiped"
                        ));
                    }
                }
                let g = group_of(zp.inuse as usize, objs);
                if zp.group as usize != g
                    || inner.groups[g].get(zp.group_pos as usize) != Some(&(zid as u32))
                {
                    return Err(format!("{name}: zspage {zid} is not in fullness group {g}"));
                }
                for (o, &slot) in zp.owner.iter().enumerate() {
                    if is_free(slot) {
                        continue;
                    }
                    let s = inner
                        .slots
                        .get(slot as usize)
                        .ok_or_else(|| format!("{name}: owner slot {slot} out of range"))?;
                    if s.zspage != zid as u32 || s.obj as usize != o {
                        return Err(format!(
                            "{name}: zspage {zid} object {o} owned by slot {slot} that points elsewhere"
                        ));
                    }
                }
                inuse_sum += u64::from(zp.inuse);
            }
            let listed: usize = inner.groups.iter().map(Vec::len).sum();
            if live != inner.live_zspages || listed as u64 != live {
                return Err(format!(
                    "{name}: {live} zspages, counter {}, {listed} in groups",
                    inner.live_zspages
                ));
            }
            let mut used = 0u64;
            let mut payload = 0u64;
            for s in inner.slots.iter().filter(|s| s.zspage != FREE) {
                used += 1;
                payload += u64::from(s.size);
                if sh.size_to_class[(s.size as usize - 1) / CLASS_STEP] as usize
                    != c.index as usize % sh.per_shard
                {
                    return Err(format!("{name}: object of size {} in wrong class", s.size));
                }
            }
            let free_slots = inner.slots.len() as u64 - used;
            if used != inuse_sum || used != inner.obj_used || payload != inner.payload {
                return Err(format!(
                    "{name}: slots in use {used}, objects in zspages {inuse_sum}, counter {}; payload {payload} vs {}",
                    inner.obj_used, inner.payload
                ));
            }
            if inner.free_slots.len() as u64 != free_slots {
                return Err(format!("{name}: free slot list does not match the table"));
            }
            if committed != inner.pages_committed {
                return Err(format!(
                    "{name}: zspages commit {committed} pages, counter says {}",
                    inner.pages_committed
                ));
            }
            pages += committed;
        }
        let held = sh.pages_held();
        if held != pages {
            return Err(format!(
                "pool holds {held} pages by its counter, {pages} by its classes"
            ));
        }
        Ok(())
    }

    /// Takes the locks in the order of the module documentation. A thread
    /// holding a batch of freed pages outside every lock (releasing it)
    /// needs no class lock to finish, so the classes are kept while the
    /// arenas and the compactor state are taken and let go until every
    /// batch an arena counts as in flight is queued in the compactor state.
    fn fork_prepare(&self) {
        fork::check_supported();
        let sh = &*self.shared;
        for c in &sh.classes {
            std::mem::forget(c.inner.write());
        }
        loop {
            let arenas: Vec<ArenaForkGuard<'_>> = sh
                .shard_state
                .iter()
                .map(|s| s.arena.lock_for_fork())
                .collect();
            let st = sh.compactor.state.lock();
            let mut queued = vec![0; sh.shards];
            for (shard, b) in &st.releases {
                queued[*shard] += b.pages();
            }
            if arenas
                .iter()
                .zip(&queued)
                .all(|(a, &q)| a.in_flight_pages() == q)
            {
                arenas.into_iter().for_each(ArenaForkGuard::keep);
                std::mem::forget(st);
                return;
            }
            drop(st);
            drop(arenas);
            sync::thread::yield_now();
        }
    }

    unsafe fn fork_parent(&self) {
        // SAFETY: the caller ran fork_prepare on this thread, in the parent.
        unsafe { self.release_after_fork(Side::Parent) };
    }

    /// The parent's compactor thread is gone; a new one takes over what was
    /// queued for it (batches to release, classes to compact). If it cannot
    /// be started, the pool goes on without background compaction: the
    /// queued batches are released here, and freeing threads release their
    /// own from then on.
    unsafe fn fork_child(&self) {
        // SAFETY: the caller ran fork_prepare on this thread, and this is
        // the child, where the thread is alone.
        unsafe { self.release_after_fork(Side::Child) };
    }

    fn fork_child_start(&self) {
        let sh = &*self.shared;
        if sh.watermark_percent.is_none() {
            return; // no compactor
        }
        {
            let mut st = sh.compactor.state.lock();
            // A post wakes the new thread whether it sleeps yet or not.
            st.idle = true;
            // The dead thread may have taken a class off `pending` and not
            // yet cleared its flag, which would keep the class from being
            // posted again.
            for c in &sh.classes {
                c.compact_pending
                    .store(st.pending.contains(&c.index), Ordering::Relaxed);
            }
        }
        match start_compactor(&self.shared, self.thread_start) {
            // The parent's handle names a thread of the parent: never joined
            // here.
            Ok(t) => std::mem::forget(self.thread.lock().replace(t)),
            Err(_) => {
                let queued = {
                    let mut st = sh.compactor.state.lock();
                    st.stop = true;
                    std::mem::take(&mut st.releases)
                };
                for (shard, b) in queued {
                    sh.shard_state[shard].arena.release(b);
                }
                std::mem::forget(self.thread.lock().take());
            }
        }
    }
}
