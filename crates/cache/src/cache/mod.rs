//! The cache itself: an index from `(area, offset)` to where a page lives
//! (a same-filled word, a pool object, or a backing slot), and the paths
//! that change it. This file holds the data layout (the types [`Entry`],
//! [`Place`], [`Obj`], [`Seals`], [`LruItem`], [`Shard`] with their
//! methods), the lock order, the public [`Cache`] handle (all its methods
//! but the fork hooks), the state [`Inner`], and the few methods of `Inner`
//! that every path uses (`shard`, `check`, `area_slot`, `now`, `scope`,
//! `limit_share`, `index_bytes`). The rest of `Inner`'s methods live with
//! their job, one file each:
//!
//! - `store.rs`: the store path (same-filled pages, IO admission,
//!   compression, duplicate sharing, the pool, direct writes to the backing
//!   tier): `store`, `store_to_backing`, `pool_full`, `inflight`,
//!   `object_is`;
//! - `load.rs`: the load path in both modes, and reading a place: `load`,
//!   `load_exclusive`, `read_place`, `read_backing`, `take_pool`,
//!   `count_load`, `miss`;
//! - `entry.rs`: putting entries into the index and taking them out, the
//!   gauges they move, and freeing what a removed entry held: `insert`,
//!   `remove`, `remove_area`, `detach`, `free_obj`, `free_slot`,
//!   `account`;
//! - `writeback.rs`: one writeback batch (victims from the LRU queues,
//!   sealing, vectored writes, commit): `writeback_batch`, `pick_victims`;
//! - `writer.rs`: the writer thread (wake-up, reclaim, proactive
//!   writeback): `writer_loop`, `wake_writer`, `reclaim`, `stop_writer`;
//! - `fork.rs`: the fork hooks, methods of [`Cache`] (`fork_prepare`,
//!   `fork_parent`, `fork_child`, `fork_child_start`) and what they share
//!   or copy of the backing tier;
//! - `check.rs`: the invariant check, `check_invariants`.
//!
//! # Layout
//! The index is split into [`SHARDS`] shards, each a mutex over a dense
//! index (`index.rs`: leaves of 16 neighbouring offsets, one shard per
//! leaf) and that shard's LRU queue of pool entries. An [`Entry`] names
//! its page's [`Place`]: a same-filled word, a pool object ([`Obj`]), or a
//! sealed backing slot. Queue items ([`LruItem`]) are not removed when
//! their entry changes: an item whose `gen` no longer matches its entry's
//! is skipped, and `Shard::trim_lru` drops such items when they pile up.
//!
//! # Locks
//! Lock order, outer to inner (a path takes a lock only while it holds
//! none below it in this list):
//! 1. `Inner::wb_gate` (`RwLock<()>`, guards no data): held shared by each
//!    writeback batch from start to end, taken exclusively only by
//!    `check_invariants`, so that the check never sees an entry half
//!    written back. The one cache lock held across decompression and I/O:
//!    batches share it, and only the check waits for it.
//! 2. `Inner::slots` (the backing slot map): taken under no lock but
//!    `wb_gate` to allocate slots and to free one, and held across the
//!    hole punch (`BackingStore::discard`) that a free may do: once the
//!    lock is released the extent may be handed out and written, and a
//!    late punch would erase the new data. `check_invariants` holds it
//!    while it walks the shards, the dedup index and the pool.
//! 3. `Inner::shards[i]` (an index shard: its entries and LRU queue): never
//!    two at once (a path takes its key's shard; a walk of all shards takes
//!    them one after another), and never across compression,
//!    decompression or I/O. Only `check_invariants` calls the pool under
//!    it (object sizes).
//! 4. The dedup index's shard locks (`dedup.rs`): one at a time, never with
//!    an index shard held. A lookup compares a candidate's bytes under it
//!    (`object_is`), which reads the pool object.
//! 5. The pool's locks (`uzswap_zpool`, in the allocator's own order, e.g.
//!    zsmalloc.rs's class, arena, compactor). A `map_read` callback runs
//!    under the object's class lock, which keeps the object in place for a
//!    zero-copy read: loads and writeback decompress there, and the dedup
//!    lookup compares there. Such a callback never calls into the cache.
//! 6. `Inner::wake.0` (the writer's wake-up flag, with `wake.1`, its
//!    condvar): a leaf, taken with no other cache lock held.
//! 7. `Inner::seals` (each backing slot's seal): a leaf, taken with no
//!    other cache lock held but `wb_gate` (a batch records its seals before
//!    it commits) and, in `fork_prepare`, after all the others. A load
//!    reads a slot's seal after it dropped the shard lock: the slot may
//!    have been freed and written again meanwhile, so what it read counts
//!    only if the entry's `gen` is unchanged afterwards (below).
//!
//! A backing store's own locks (`FaultInjector`'s switch, the file's list
//! of files shared since a fork) are leaves, reached under `slots` through
//! `discard` and under none otherwise; `fork_prepare` takes the list last
//! of all (`BackingStore::fork_lock`). The
//! per-thread buffers `OUT` and `SCRATCH` (store.rs) are not locks: each
//! thread compresses into its own. Counters, the limit, the full flag and
//! the areas' open flags are atomics, read and written without a lock.
//!
//! # Versions
//! Every change of an entry's place gives it a new `gen`. A reader copies
//! `(gen, place)` under the lock, reads the object or slot without it, then
//! checks under the lock that `gen` is unchanged: if it is, the object (or
//! slot) was not freed while it was read, because resources are released
//! only after the change that detaches them. If it changed, the read is
//! retried. So no load ever returns bytes of a freed and reused object.

mod check;
mod entry;
// Fork releases locks it took on another call (`force_unlock`, a reset in
// the child): uzswap_os::lock's locks have it, the model checker's do not, and the model never forks.
#[cfg(not(feature = "shuttle"))]
mod fork;
mod load;
mod store;
mod writeback;
mod writer;

#[cfg(not(feature = "shuttle"))]
pub use fork::ForkError;
pub use store::same_filled_word;
pub(crate) use store::warm_thread as warm_store_buffers;

use crate::admission::{IoAdmission, IoLimits};
use crate::backing::{BackingStore, FileBacking, SlotMap};
use crate::codec::{Codec, Compressor};
use crate::config::{
    validate, Backing, CacheConfig, DedupScope, Error, Incompressible, LoadError, PoolLimit,
    Proactive, StoreError, MAX_AREAS,
};
use crate::dedup::DedupIndex;
use crate::index::{leaf_of, DenseIndex, Key};
use crate::seal::Sealer;
use crate::stats::{CacheStats, Counters};
use crate::PAGE_SIZE;
use crossbeam_utils::CachePadded;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;
// The locks and atomics of the protocol (not the statistics counters) come
// from the sync shim, so that the `shuttle` feature model-checks them
// (tests/shuttle.rs).
use uzswap_os::sync::{
    AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Condvar, Mutex, RwLock,
};
use uzswap_zpool::{Handle, PoolStats, Zpool};

/// Index shards (a power of two).
pub const SHARDS: usize = 256;

const RELAXED: Ordering = Ordering::Relaxed;

/// What a successful store kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Stored {
    /// Compressed into the pool, `bytes` long.
    Compressed {
        /// Compressed size.
        bytes: usize,
    },
    /// Kept uncompressed in the pool: it did not compress enough.
    Raw,
    /// One repeated word: no pool memory.
    SameFilled,
    /// Identical to a stored page: shares its object.
    Duplicate {
        /// The shared object's size.
        bytes: usize,
    },
    /// Written to the backing tier (pool full or refused, or IO admission).
    Backing,
}

/// Where a load found the page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Loaded {
    /// Decompressed from the pool.
    Pool,
    /// Read from the backing tier.
    Backing,
    /// Rebuilt from its word.
    SameFilled,
}

/// Whether a load keeps the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadMode {
    /// The entry is freed (the kernel's exclusive load).
    Exclusive,
    /// The entry stays, marked recently used.
    Keep,
}

// A leaf slot costs what an entry does (32 bytes); a queue item is 16.
const _: () = assert!(std::mem::size_of::<LruItem>() == 16);
const _: () = assert!(std::mem::size_of::<Option<Entry>>() == std::mem::size_of::<Entry>());
const _: () = assert!(std::mem::size_of::<Entry>() == 32);

/// A page's pool object, laid out by hand in 24 bytes (with the flags of
/// its entry that only a pool entry has), so that an [`Entry`] takes 32.
#[derive(Clone, Copy, Debug)]
struct Obj {
    /// The object; live while an entry (or, shared, several) names it.
    handle: Handle,
    /// The dedup hash the object is registered under, if `deduped`.
    dedup_hash: u64,
    /// Its size in bytes (the encoded page, at most a page).
    size: u16,
    /// How the page is encoded in it (`Codec::Raw`: not compressed).
    codec: Codec,
    /// The object is registered in the dedup index under `dedup_hash`.
    deduped: bool,
    /// Loaded (Keep) since it entered the LRU or was last passed over.
    referenced: bool,
    /// A writeback batch holds it: it is being sealed and written; loads
    /// still read the pool object.
    writeback: bool,
}

impl Obj {
    fn new(handle: Handle, size: usize, codec: Codec, dedup: Option<u64>) -> Obj {
        Obj {
            handle,
            dedup_hash: dedup.unwrap_or(0),
            size: u16::try_from(size).expect("an encoded page is at most a page"),
            codec,
            deduped: dedup.is_some(),
            referenced: false,
            writeback: false,
        }
    }

    /// The dedup hash the object is registered under, if it is.
    fn dedup(&self) -> Option<u64> {
        self.deduped.then_some(self.dedup_hash)
    }
}

/// Where a page lives.
#[derive(Clone, Copy, Debug)]
enum Place {
    /// A same-filled page: the word it repeats; no memory.
    Same(u64),
    /// In the pool, and in its shard's LRU queue.
    Pool(Obj),
    /// In backing slot `slot`; its seal (sequence number and tag) is the
    /// slot's in `Inner::seals`.
    Backing { slot: u64 },
}

/// An index entry: one stored page.
#[derive(Debug)]
struct Entry {
    /// Bumped (from the shard's counter) by every change of `place`: a
    /// reader that dropped the shard lock compares it to know whether what
    /// it read is still the entry's.
    gen: u32,
    /// When stored: for a pool or same-filled entry seconds since the cache
    /// was made (the age writeback policy), for a backing entry the
    /// backing clock when it got there (`Inner::backing_clock`: a load's
    /// distance).
    born: u32,
    /// Where the page is.
    place: Place,
}

impl Entry {
    /// A writeback batch holds the entry (only a pool entry can be held).
    fn writeback(&self) -> bool {
        matches!(self.place, Place::Pool(o) if o.writeback)
    }

    fn set_writeback(&mut self, on: bool) {
        if let Place::Pool(o) = &mut self.place {
            o.writeback = on;
        }
    }

    /// Marks a pool entry loaded since it was queued (the LRU's second
    /// chance); other entries are on no queue.
    fn mark_referenced(&mut self) {
        if let Place::Pool(o) = &mut self.place {
            o.referenced = true;
        }
    }
}

/// The seal of a written backing slot: the sequence number it was sealed
/// with (unique per write) and the authentication tag. Kept by slot rather
/// than in the entry, so that the many entries in the pool do not carry
/// the room of the few that are written back.
#[derive(Clone, Copy, Debug, Default)]
struct SlotSeal {
    seq: u64,
    tag: [u8; 16],
}

/// Seals by slot (`Inner::seals`), a table for each backing file this
/// process has written (its slots numbered from the table's first: a fork
/// moves both processes to new files, `fork.rs`), each grown to its file's
/// high mark; a freed slot keeps its stale seal until it is written again.
#[derive(Debug)]
struct Seals(Vec<(u64, Vec<SlotSeal>)>);

impl Default for Seals {
    /// One table, for the first file (its slots from 0).
    fn default() -> Seals {
        Seals(vec![(0, Vec::new())])
    }
}

impl Seals {
    /// Which table holds `slot` (the newest file that starts at or below
    /// it; the first starts at 0), and the slot's index in it.
    fn place(&self, slot: u64) -> (usize, usize) {
        let t = self
            .0
            .iter()
            .rposition(|&(first, _)| first <= slot)
            .expect("the first table starts at slot 0");
        (t, (slot - self.0[t].0) as usize)
    }

    fn set(&mut self, slot: u64, seq: u64, tag: [u8; 16]) {
        let (t, i) = self.place(slot);
        let table = &mut self.0[t].1;
        if i >= table.len() {
            table.resize(i + 1, SlotSeal::default());
        }
        table[i] = SlotSeal { seq, tag };
    }

    /// The seal last set for `slot` (all zeros, which opens nothing, if
    /// none was).
    fn get(&self, slot: u64) -> SlotSeal {
        let (t, i) = self.place(slot);
        self.0[t].1.get(i).copied().unwrap_or_default()
    }

    /// A new file's slots start at `first` (see `SlotMap::rebase`).
    #[cfg_attr(feature = "shuttle", allow(dead_code))]
    fn rebase(&mut self, first: u64) {
        self.0.push((first, Vec::new()));
    }

    /// Bytes of the tables.
    fn bytes(&self) -> usize {
        self.0
            .iter()
            .map(|(_, t)| t.capacity() * std::mem::size_of::<SlotSeal>())
            .sum()
    }
}

/// A queued entry: its key and the `gen` it had when queued. Fields laid
/// out by hand in 16 bytes (a `(Key, u32)` takes 24).
#[derive(Clone, Copy, Debug)]
struct LruItem {
    offset: u64,
    area: u32,
    gen: u32,
}

impl LruItem {
    fn new(key: Key, gen: u32) -> LruItem {
        LruItem {
            offset: key.1,
            area: key.0,
            gen,
        }
    }

    fn key(&self) -> Key {
        (self.area, self.offset)
    }
}

#[derive(Default)]
struct Shard {
    map: DenseIndex<Entry>,
    lru: VecDeque<LruItem>,
    next_gen: u32,
}

impl Shard {
    fn bump(&mut self) -> u32 {
        self.next_gen = self.next_gen.wrapping_add(1);
        self.next_gen
    }

    /// Drops queue items of entries that left the pool, when they pile up
    /// (more than twice the shard's entries, plus [`LRU_SLACK`]), and
    /// gives back the room they took.
    ///
    /// Amortised: after a trim the queue holds at most the shard's
    /// entries, so the next one comes at least `entries + LRU_SLACK`
    /// inserts later and costs at most two lookups per insert.
    fn trim_lru(&mut self) {
        if self.lru.len() > 2 * self.map.len() + LRU_SLACK {
            let map = &self.map;
            self.lru.retain(|it| {
                map.get(&it.key())
                    .is_some_and(|e| e.gen == it.gen && matches!(e.place, Place::Pool(_)))
            });
            // A queue keeps the room of its largest length for good:
            // sized for the items just dropped, it would hold them on.
            if self.lru.capacity() > 2 * self.lru.len() + LRU_SLACK {
                self.lru.shrink_to(self.lru.len() + LRU_SLACK);
            }
        }
    }
}

/// Stale queue items a shard holds beyond twice its entries before
/// [`Shard::trim_lru`] drops them. Small because there are [`SHARDS`]
/// queues: with 64, each queue of a cache of 12 000 pages faulted back and
/// stored again grows to 256 items, 1 MiB in all, mostly dead (a Python
/// worker's index at its peak is 1.6 MiB with 64, 1.1 with 8: see "runtime
/// memory" in docs/BENCHMARKS.md).
const LRU_SLACK: usize = 8;

/// The shard of a key: all keys of one index leaf (neighbouring offsets)
/// share it.
fn shard_of(key: Key) -> usize {
    let key = leaf_of(key);
    let h = (u64::from(key.0).wrapping_mul(0xff51_afd7_ed55_8ccd))
        ^ key.1.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 56) as usize % SHARDS
}

/// The cache's state, shared by the handle and the writer thread. Locks
/// (see the order above): `wb_gate` (1), `slots` (2), `shards` (3), the
/// dedup index's (4), the pool's (5), `wake.0` (6), `seals` (7); the rest is immutable
/// after creation or atomic.
struct Inner {
    /// The allocator of the pool objects.
    pool: Arc<dyn Zpool>,
    /// The index, [`SHARDS`] mutexes: lock 3.
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    /// 1 per open area.
    areas: Box<[AtomicU8]>,
    /// The compressor of new stores, packed (`Compressor::pack`).
    compressor: AtomicU64,
    /// `CacheConfig::cold_compressor`.
    cold_compressor: Option<Compressor>,
    /// The pool limit in bytes (`u64::MAX`: none).
    limit: AtomicU64,
    /// The pool reached its limit and has not yet fallen below the accept
    /// threshold (`pool_full`'s hysteresis).
    full: AtomicBool,
    accept_percent: u64,
    /// Largest compressed size kept as compressed, in bytes.
    max_compressed: usize,
    incompressible: Incompressible,
    same_filled: bool,
    dedup_on: AtomicBool,
    dedup_scope: DedupScope,
    /// Shares identical objects; its shard locks are lock 4.
    dedup: DedupIndex,
    /// The backing tier, if any.
    backing: Option<Box<dyn BackingStore>>,
    /// Which backing slots are used: lock 2.
    slots: Mutex<SlotMap>,
    /// Seals what goes to the backing tier; written only by `fork_child`
    /// (a fresh key), read by every seal and open: a leaf lock.
    sealer: RwLock<Sealer>,
    /// The seal of each written backing slot: lock 7, a leaf.
    seals: Mutex<Seals>,
    /// The next seal sequence number (unique per sealed write).
    seq: AtomicU64,
    /// Pages per writeback batch.
    batch: usize,
    io_limits: IoLimits,
    admission: IoAdmission,
    /// Reads and writes of the backing tier under way (IO admission).
    inflight_reads: AtomicU32,
    inflight_writes: AtomicU32,
    proactive: Option<Proactive>,
    counters: Counters,
    /// Loads from the backing tier by how many pages entered it since the
    /// page did ([`Inner::backing_clock`]).
    backing_distances: uzswap_os::distance::AtomicDistances,
    /// A wake-up of the writer is on its way (writer.rs).
    wake_pending: AtomicBool,
    /// The writer's wake-up flag (lock 6) and its condvar.
    wake: (Mutex<bool>, Condvar),
    /// Tells the writer thread to end.
    stop: AtomicBool,
    /// The shard where the next victim pick starts.
    cursor: AtomicUsize,
    /// Time 0 of the entries' `born`.
    epoch: Instant,
    /// Held (shared) by every writeback batch; taken exclusively by the
    /// invariant check so that no entry is half written back: lock 1.
    wb_gate: RwLock<()>,
}

/// What [`Cache::usage`] reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheUsage {
    /// Bytes the pool holds (`CacheStats::pool_total_size`).
    pub pool_bytes: u64,
    /// Pages stored, pool and backing tier (`CacheStats::stored_pages`).
    pub stored_pages: u64,
    /// Pages in the backing tier (`CacheStats::backing_pages`).
    pub backing_pages: u64,
    /// Writeback batches that failed (`CacheStats::writeback_fail`).
    pub writeback_fail: u64,
    /// Stores refused with the pool full and nowhere to write back
    /// (`CacheStats::reject_reclaim_fail`).
    pub reject_reclaim_fail: u64,
    /// Loads from the pool and from the backing tier, and the time they
    /// took in all (`CacheStats::loads_pool`, `load_pool_ns`, ...).
    pub loads_pool: u64,
    pub load_pool_ns: u64,
    pub loads_backing: u64,
    pub load_backing_ns: u64,
    /// Loads from the backing tier by how many pages entered it after the
    /// page did: what a pool that many objects larger would have served.
    pub backing_distances: uzswap_os::distance::Distances,
}

/// The compressed page cache. Cheap to share: wrap it in an `Arc`.
pub struct Cache {
    inner: Arc<Inner>,
    /// The writer thread (a forked child starts its own: `fork.rs`).
    writer: uzswap_os::lock::Mutex<Option<uzswap_os::Helper>>,
    /// `CacheConfig::thread_start`, for threads started after a fork.
    #[cfg_attr(feature = "shuttle", allow(dead_code))]
    thread_start: Option<fn()>,
    /// The pipe a forked child says "copied" through (`fork.rs`): set by
    /// `fork_prepare`, taken by the hook after the fork; a leaf lock,
    /// never held across the fork.
    #[cfg_attr(feature = "shuttle", allow(dead_code))]
    fork_pipe: uzswap_os::lock::Mutex<Option<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)>>,
    /// When the backing store's slots are shared with a forked child, not
    /// copied (`fork.rs`): the first slot after the fork and how many are
    /// in use. Set by `fork_prepare`, taken by the hook after the fork.
    #[cfg_attr(feature = "shuttle", allow(dead_code))]
    fork_share: uzswap_os::lock::Mutex<Option<(u64, u64)>>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("compressor", &self.compressor())
            .field("cold_compressor", &self.inner.cold_compressor)
            .field("pool_bytes", &self.inner.pool.pool_bytes())
            .finish_non_exhaustive()
    }
}

impl Cache {
    /// Builds a cache; starts its writer thread when it has a backing tier.
    pub fn new(cfg: CacheConfig) -> Result<Cache, Error> {
        validate(&cfg)?;
        let backing: Option<Box<dyn BackingStore>> = match cfg.backing {
            Backing::None => None,
            Backing::File(path) => Some(Box::new(
                FileBacking::create(&path)
                    .map_err(|source| Error::BackingCreate { path, source })?,
            )),
            Backing::Store(s) => Some(s),
        };
        let has_backing = backing.is_some();
        let inner = Arc::new(Inner {
            pool: uzswap_zpool::new_pool(cfg.allocator, None, cfg.pool_shards, cfg.thread_start)?,
            shards: (0..SHARDS)
                .map(|_| CachePadded::new(Mutex::default()))
                .collect(),
            areas: (0..MAX_AREAS).map(|_| AtomicU8::new(0)).collect(),
            compressor: AtomicU64::new(cfg.compressor.pack()),
            cold_compressor: cfg.cold_compressor,
            limit: AtomicU64::new(cfg.pool_limit.bytes()),
            full: AtomicBool::new(false),
            accept_percent: u64::from(cfg.accept_threshold_percent),
            max_compressed: PAGE_SIZE * usize::from(cfg.max_compressed_percent) / 100,
            incompressible: cfg.incompressible,
            same_filled: cfg.same_filled,
            dedup_on: AtomicBool::new(cfg.dedup),
            dedup_scope: cfg.dedup_scope,
            #[cfg(feature = "testing")]
            dedup: cfg
                .dedup_hasher
                .map_or_else(DedupIndex::default, DedupIndex::with_hasher),
            #[cfg(not(feature = "testing"))]
            dedup: DedupIndex::default(),
            backing,
            slots: Mutex::new(SlotMap::new(
                cfg.backing_max_bytes.map(|b| b / PAGE_SIZE as u64),
            )),
            sealer: RwLock::new(Sealer::new(cfg.encrypt).map_err(Error::Random)?),
            seals: Mutex::default(),
            seq: AtomicU64::new(1),
            batch: cfg.writeback_batch,
            io_limits: cfg.io_limits,
            admission: IoAdmission::default(),
            inflight_reads: AtomicU32::new(0),
            inflight_writes: AtomicU32::new(0),
            proactive: cfg.proactive,
            counters: Counters::default(),
            backing_distances: Default::default(),
            wake_pending: AtomicBool::new(false),
            wake: (Mutex::new(false), Condvar::new()),
            stop: AtomicBool::new(false),
            cursor: AtomicUsize::new(0),
            epoch: Instant::now(),
            wb_gate: RwLock::new(()),
        });
        let writer = (has_backing && cfg.background_writer)
            .then(|| {
                let inner = inner.clone();
                uzswap_os::spawn_helper_warmed(
                    "uzswap-writer",
                    cfg.thread_start,
                    crate::warm_thread,
                    move || inner.writer_loop(),
                )
            })
            .transpose()
            .map_err(|e| Error::Config(format!("cannot start the writer thread: {e}")))?;
        Ok(Cache {
            inner,
            writer: uzswap_os::lock::Mutex::new(writer),
            thread_start: cfg.thread_start,
            fork_pipe: uzswap_os::lock::Mutex::new(None),
            fork_share: uzswap_os::lock::Mutex::new(None),
        })
    }

    /// Opens an area (idempotent). Keys of an area are valid until
    /// [`Cache::invalidate_area`].
    pub fn open_area(&self, area: u32) -> Result<(), Error> {
        self.inner.area_slot(area)?.store(1, RELAXED);
        Ok(())
    }

    /// Stores a copy of `page` under `(area, offset)`, replacing any entry.
    /// A refused store drops the old entry too (it is older than the page
    /// the caller still holds), as the kernel's zswap does.
    pub fn store(&self, area: u32, offset: u64, page: &[u8]) -> Result<Stored, StoreError> {
        self.store_with(area, offset, page, false)
    }

    /// As [`Cache::store`], for a page the caller does not expect back soon:
    /// compressed with `CacheConfig::cold_compressor` if one is set.
    pub fn store_cold(&self, area: u32, offset: u64, page: &[u8]) -> Result<Stored, StoreError> {
        self.store_with(area, offset, page, true)
    }

    fn store_with(
        &self,
        area: u32,
        offset: u64,
        page: &[u8],
        cold: bool,
    ) -> Result<Stored, StoreError> {
        self.inner.check(area, page.len())?;
        self.inner.store(area, offset, page, cold).map_err(|e| {
            self.inner.remove(area, offset);
            e.into()
        })
    }

    /// Fills `page` with the bytes stored under `(area, offset)`.
    pub fn load(
        &self,
        area: u32,
        offset: u64,
        page: &mut [u8],
        mode: LoadMode,
    ) -> Result<Loaded, LoadError> {
        self.inner.check(area, page.len())?;
        self.inner.load(area, offset, page, mode)
    }

    /// Drops the entry for `(area, offset)`; `true` if there was one.
    pub fn invalidate(&self, area: u32, offset: u64) -> Result<bool, Error> {
        self.inner.check(area, PAGE_SIZE)?;
        let had = self.inner.remove(area, offset);
        if had {
            self.inner.counters.invalidated_pages.fetch_add(1, RELAXED);
        }
        Ok(had)
    }

    /// Drops every entry of `area` and closes it. No store to the area may
    /// run concurrently (as with swapoff).
    pub fn invalidate_area(&self, area: u32) -> Result<u64, Error> {
        let inner = &*self.inner;
        inner.check(area, PAGE_SIZE)?;
        inner.area_slot(area)?.store(0, RELAXED);
        let n = inner.remove_area(area);
        inner.counters.invalidated_pages.fetch_add(n, RELAXED);
        Ok(n)
    }

    /// The compressor new stores use.
    pub fn compressor(&self) -> Compressor {
        Compressor::unpack(self.inner.compressor.load(RELAXED))
    }

    /// Switches the compressor; stored pages stay readable.
    pub fn set_compressor(&self, c: Compressor) -> Result<(), Error> {
        self.inner.compressor.store(c.validate()?.pack(), RELAXED);
        Ok(())
    }

    /// Changes the pool limit. Lowering it below the pool's size makes the
    /// writer write back (with a backing tier) and stores refuse meanwhile.
    pub fn set_pool_limit(&self, limit: PoolLimit) -> Result<(), Error> {
        match limit {
            PoolLimit::Percent(p) if !(1..=100).contains(&p) => {
                return Err(Error::Config(format!(
                    "pool limit percent must be 1..=100, got {p}"
                )))
            }
            PoolLimit::Bytes(0) => {
                return Err(Error::Config("pool limit of 0 bytes".into()));
            }
            _ => {}
        }
        self.inner.limit.store(limit.bytes(), RELAXED);
        self.inner.full.store(false, RELAXED);
        self.inner.wake_writer();
        Ok(())
    }

    /// Turns duplicate sharing on or off. Stored pages are unaffected.
    pub fn set_dedup(&self, on: bool) {
        self.inner.dedup_on.store(on, RELAXED);
    }

    /// Writes back up to `max_pages` of the least recently used pool
    /// entries now; returns how many went.
    pub fn writeback(&self, max_pages: usize) -> Result<usize, Error> {
        if self.inner.backing.is_none() {
            return Err(Error::NoBacking);
        }
        let mut done = 0;
        while done < max_pages {
            let n = self
                .inner
                .writeback_batch(self.inner.batch.min(max_pages - done), None);
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }

    /// Compacts the pool now.
    pub fn compact(&self) -> uzswap_zpool::CompactReport {
        self.inner.pool.compact()
    }

    /// Counters, with the kernel's names where the kernel has them.
    pub fn stats(&self) -> CacheStats {
        let inner = &*self.inner;
        let mut s = inner.counters.snapshot();
        s.pool_total_size = inner.pool.pool_bytes();
        s.index_bytes = inner.index_bytes();
        s.backing_slots_used = inner.slots.lock().used();
        s.pool_limit_bytes = inner.limit.load(RELAXED);
        s.pool_full = u64::from(inner.full.load(RELAXED));
        if let Some(b) = &inner.backing {
            let t = b.tier_stats();
            s.tier_round_trips = t.round_trips;
            s.tier_bytes_sent = t.bytes_sent;
            s.tier_bytes_received = t.bytes_received;
            s.tier_errors = t.errors;
            s.tier_missing = t.missing;
            s.tier_connects = t.connects;
            s.tier_read_ahead_hits = t.read_ahead_hits;
            s.tier_held_bytes = t.held_bytes;
            s.backing_shared_files = t.shared_files;
            s.backing_shared_slots = t.shared_slots;
        }
        s
    }

    /// The backing slot that holds `(area, offset)`'s page, if it was
    /// written back: for tests and tools that look at a tier directly.
    pub fn backing_slot(&self, area: u32, offset: u64) -> Option<u64> {
        match self
            .inner
            .shard((area, offset))
            .lock()
            .map
            .get(&(area, offset))?
            .place
        {
            Place::Backing { slot } => Some(slot),
            _ => None,
        }
    }

    /// The few figures a host reads often (every few milliseconds): no
    /// lock is taken, unlike [`Cache::stats`], which walks the index.
    pub fn usage(&self) -> CacheUsage {
        let c = &self.inner.counters;
        CacheUsage {
            pool_bytes: self.inner.pool.pool_bytes(),
            stored_pages: c.stored_pages.load(RELAXED),
            backing_pages: c.backing_pages.load(RELAXED),
            writeback_fail: c.writeback_fail.load(RELAXED),
            reject_reclaim_fail: c.reject_reclaim_fail.load(RELAXED),
            loads_pool: c.loads_pool.load(RELAXED),
            load_pool_ns: c.load_pool_ns.load(RELAXED),
            loads_backing: c.loads_backing.load(RELAXED),
            load_backing_ns: c.load_backing_ns.load(RELAXED),
            backing_distances: self.inner.backing_distances.load(),
        }
    }

    /// The allocator's per-class table and totals.
    pub fn pool_stats(&self) -> PoolStats {
        self.inner.pool.stats()
    }

    /// Whether written-back pages are encrypted.
    pub fn encrypts(&self) -> bool {
        self.inner.sealer.read().encrypts()
    }

    /// Re-derives every gauge from the index and checks it against the
    /// counters, the allocator, the dedup index and the slot map. Call when
    /// no other thread uses the cache (the writer may run: it is paused).
    pub fn check_invariants(&self) -> Result<(), String> {
        self.inner.check_invariants()
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.inner.stop_writer();
        if let Some(t) = self.writer.get_mut().take() {
            let _ = t.join();
        }
        // The pool's memory goes with Inner; the backing file, unlinked,
        // vanishes with its descriptor.
    }
}

impl Inner {
    fn shard(&self, key: Key) -> &Mutex<Shard> {
        &self.shards[shard_of(key)]
    }

    fn area_slot(&self, area: u32) -> Result<&AtomicU8, Error> {
        self.areas
            .get(area as usize)
            .ok_or(Error::AreaOutOfRange { area })
    }

    fn check(&self, area: u32, len: usize) -> Result<(), Error> {
        if len != PAGE_SIZE {
            return Err(Error::BadPageSize { len });
        }
        if self.area_slot(area)?.load(RELAXED) == 0 {
            return Err(Error::UnknownArea { area });
        }
        Ok(())
    }

    fn now(&self) -> u32 {
        self.epoch.elapsed().as_secs() as u32
    }

    /// Pages that entered the backing tier so far (written back, or stored
    /// there directly), wrapping: a backing entry's `born`.
    fn backing_clock(&self) -> u32 {
        let c = &self.counters;
        (c.written_back_pages.load(RELAXED) + c.stores_to_backing.load(RELAXED)) as u32
    }

    /// A load from the backing tier of an entry born at `born`.
    fn note_backing_load(&self, born: u32) {
        let d = self.backing_clock().wrapping_sub(born);
        self.backing_distances.record(u64::from(d));
    }

    fn scope(&self, area: u32) -> u32 {
        match self.dedup_scope {
            DedupScope::Area => area,
            DedupScope::Global => u32::MAX,
        }
    }

    fn limit_share(&self, percent: u64) -> u64 {
        let limit = self.limit.load(RELAXED);
        if limit == u64::MAX {
            u64::MAX
        } else {
            limit / 100 * percent
        }
    }

    fn index_bytes(&self) -> u64 {
        let item = std::mem::size_of::<LruItem>();
        let index: usize = self
            .shards
            .iter()
            .map(|s| {
                let s = s.lock();
                s.map.heap_bytes() + s.lru.capacity() * item
            })
            .sum();
        let seals = self.seals.lock().bytes();
        (index + seals) as u64 + self.dedup.metadata_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool_entry(gen: u32) -> Entry {
        Entry {
            gen,
            born: 0,
            place: Place::Pool(Obj::new(
                Handle::from_raw(1).expect("a non-zero handle"),
                100,
                Codec::Lz4,
                None,
            )),
        }
    }

    /// Stores one page of `key` into the shard as `Inner::insert` does.
    fn store(s: &mut Shard, key: Key) {
        let gen = s.bump();
        s.lru.push_back(LruItem::new(key, gen));
        s.map.insert(key, pool_entry(gen));
        s.trim_lru();
    }

    #[test]
    fn a_shard_queue_gives_back_the_room_of_dropped_items() {
        let mut s = Shard::default();
        // 1000 pages stored, then each faulted back (removed) and stored
        // again 20 times: every round leaves 1000 dead items behind.
        for _ in 0..20 {
            for off in 0..1000 {
                s.map.remove(&(0, off));
                store(&mut s, (0, off));
            }
        }
        // Then all but 10 leave for good, and a few stores trigger a trim.
        for off in 10..1000 {
            s.map.remove(&(0, off));
        }
        for off in 2000..2000 + LRU_SLACK as u64 + 1 {
            store(&mut s, (0, off));
        }
        let live = s.map.len();
        assert!(
            s.lru.len() <= 2 * live + LRU_SLACK,
            "{} queue items for {live} entries",
            s.lru.len()
        );
        assert!(
            s.lru.capacity() <= 2 * s.lru.len() + LRU_SLACK,
            "room for {} items kept for {} items",
            s.lru.capacity(),
            s.lru.len()
        );
        // Every live pool entry is still queued, once, with its gen.
        for (off, e) in (0..10)
            .chain(2000..2000 + LRU_SLACK as u64 + 1)
            .map(|o| (o, s.map.get(&(0, o)).unwrap()))
        {
            let n = s
                .lru
                .iter()
                .filter(|it| it.key() == (0, off) && it.gen == e.gen)
                .count();
            assert_eq!(n, 1, "page {off} queued {n} times");
        }
    }
}
