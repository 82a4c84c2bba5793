//! The cache itself: an index from `(area, offset)` to where a page lives
//! (a same-filled word, a pool object, or a backing slot), the store, load
//! and invalidate paths, and writeback.
//!
//! # Locking
//! The index is split into [`SHARDS`] shards, each a mutex over a dense
//! index (`index.rs`: leaves of 16 neighbouring offsets, one shard per
//! leaf) and that shard's LRU queue. A shard lock is held only to look up,
//! insert or change an entry: never across compression, decompression or
//! I/O.
//!
//! # Versions
//! Every change of an entry's place gives it a new `gen`. A reader copies
//! `(gen, place)` under the lock, reads the object or slot without it, then
//! checks under the lock that `gen` is unchanged: if it is, the object (or
//! slot) was not freed while it was read, because resources are released
//! only after the change that detaches them. If it changed, the read is
//! retried. So no load ever returns bytes of a freed and reused object.
//!
//! # Writeback
//! A batch marks its victims `writeback` (loads keep reading them from the
//! pool meanwhile), decompresses and seals them into adjacent slots, writes
//! each run of adjacent slots with one vectored write, then commits each
//! victim whose entry still has the same `gen`: the entry moves to its slot
//! and the pool object is freed. A victim invalidated or replaced meanwhile
//! has its slot freed instead. A failed write leaves the victims in the
//! pool, back in the LRU queue.

use crate::admission::{Admit, IoAdmission, IoLimits};
use crate::backing::{BackingStore, FileBacking, SlotMap};
use crate::codec::{Codec, Compressor, COMPRESS_BOUND};
use crate::config::{
    validate, Backing, CacheConfig, DedupScope, Error, Incompressible, LoadError, PoolLimit,
    Proactive, Reject, StoreError, MAX_AREAS,
};
use crate::dedup::DedupIndex;
use crate::index::{leaf_of, DenseIndex, Key};
use crate::seal::{SealId, Sealer};
use crate::stats::{CacheStats, Counters};
use crate::PAGE_SIZE;
use crossbeam_utils::CachePadded;
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::hash::Hasher;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
// The locks and atomics of the protocol (not the statistics counters) come
// from the sync shim, so that the `shuttle` feature model-checks them
// (tests/shuttle.rs).
use uzswap_os::sync::{
    thread_local, AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Condvar, Mutex, RwLock,
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

// A leaf slot costs what an entry does; a queue item is 16 bytes.
const _: () = assert!(std::mem::size_of::<LruItem>() == 16);
const _: () = assert!(std::mem::size_of::<Option<Entry>>() == std::mem::size_of::<Entry>());

#[derive(Clone, Copy, Debug)]
struct Obj {
    handle: Handle,
    size: u32,
    codec: Codec,
    /// The dedup hash the object is registered under, if it is.
    dedup: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
enum Place {
    Same(u64),
    Pool(Obj),
    Backing { slot: u64, seq: u64, tag: [u8; 16] },
}

#[derive(Debug)]
struct Entry {
    gen: u32,
    /// Seconds since the cache was made, when stored.
    born: u32,
    /// Loaded (Keep) since it entered the LRU or was last passed over.
    referenced: bool,
    /// A writeback batch holds it.
    writeback: bool,
    place: Place,
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

/// A hasher for `(u32, u64)` keys: multiply and fold. Keys are page
/// numbers or content hashes, not attacker-chosen strings; the shard
/// already spread them. (The dedup index uses it too: SipHash cost a few
/// percent of the store path there.)
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    fn write_u64(&mut self, v: u64) {
        let x = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 29);
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

    /// Drops queue items of entries that left the pool, when they pile up.
    fn trim_lru(&mut self) {
        if self.lru.len() > 2 * self.map.len() + 64 {
            let map = &self.map;
            self.lru.retain(|it| {
                map.get(&it.key())
                    .is_some_and(|e| e.gen == it.gen && matches!(e.place, Place::Pool(_)))
            });
        }
    }
}

/// The shard of a key: all keys of one index leaf (neighbouring offsets)
/// share it.
fn shard_of(key: Key) -> usize {
    let key = leaf_of(key);
    let h = (u64::from(key.0).wrapping_mul(0xff51_afd7_ed55_8ccd))
        ^ key.1.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 56) as usize % SHARDS
}

/// The word a page repeats, if it is one 8-byte word over and over.
pub fn same_filled_word(page: &[u8]) -> Option<u64> {
    let (head, words, tail) = {
        // SAFETY: u64 has no invalid bit patterns; align_to splits safely.
        unsafe { page.align_to::<u64>() }
    };
    if head.is_empty() && tail.is_empty() && !words.is_empty() {
        let w = words[0];
        return words.iter().all(|&x| x == w).then_some(w);
    }
    let first = u64::from_ne_bytes(page.get(..8)?.try_into().ok()?);
    page.chunks_exact(8)
        .all(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")) == first)
        .then_some(first)
}

/// The outcome of reading a pool object: it was there and decompressed.
fn pool_read(ok: bool) -> Result<Loaded, LoadError> {
    if ok {
        Ok(Loaded::Pool)
    } else {
        Err(LoadError::Corrupt { where_: "pool" })
    }
}

fn fill_word(page: &mut [u8], w: u64) {
    for c in page.chunks_exact_mut(8) {
        c.copy_from_slice(&w.to_ne_bytes());
    }
}

thread_local! {
    /// Compression output of this thread's store.
    static OUT: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; COMPRESS_BOUND].into_boxed_slice());
    /// A page of scratch (dedup comparison, sealing a direct write).
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; PAGE_SIZE].into_boxed_slice());
}

struct Inner {
    pool: Arc<dyn Zpool>,
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    /// 1 per open area.
    areas: Box<[AtomicU8]>,
    compressor: AtomicU64,
    /// `CacheConfig::cold_compressor`.
    cold_compressor: Option<Compressor>,
    limit: AtomicU64,
    full: AtomicBool,
    accept_percent: u64,
    max_compressed: usize,
    incompressible: Incompressible,
    same_filled: bool,
    dedup_on: AtomicBool,
    dedup_scope: DedupScope,
    dedup: DedupIndex,
    backing: Option<Box<dyn BackingStore>>,
    slots: Mutex<SlotMap>,
    sealer: Sealer,
    seq: AtomicU64,
    batch: usize,
    io_limits: IoLimits,
    admission: IoAdmission,
    inflight_reads: AtomicU32,
    inflight_writes: AtomicU32,
    proactive: Option<Proactive>,
    counters: Counters,
    wake_pending: AtomicBool,
    wake: (Mutex<bool>, Condvar),
    stop: AtomicBool,
    cursor: AtomicUsize,
    epoch: Instant,
    /// Held (shared) by every writeback batch; taken exclusively by the
    /// invariant check so that no entry is half written back.
    wb_gate: RwLock<()>,
}

/// The compressed page cache. Cheap to share: wrap it in an `Arc`.
pub struct Cache {
    inner: Arc<Inner>,
    writer: Option<std::thread::JoinHandle<()>>,
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
            pool: uzswap_zpool::new_pool(cfg.allocator, None, cfg.thread_start)?,
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
            dedup: cfg
                .dedup_hasher
                .map_or_else(DedupIndex::default, DedupIndex::with_hasher),
            backing,
            slots: Mutex::new(SlotMap::new(
                cfg.backing_max_bytes.map(|b| b / PAGE_SIZE as u64),
            )),
            sealer: Sealer::new(cfg.encrypt).map_err(Error::Random)?,
            seq: AtomicU64::new(1),
            batch: cfg.writeback_batch,
            io_limits: cfg.io_limits,
            admission: IoAdmission::default(),
            inflight_reads: AtomicU32::new(0),
            inflight_writes: AtomicU32::new(0),
            proactive: cfg.proactive,
            counters: Counters::default(),
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
                uzswap_os::spawn_helper("uzswap-writer", cfg.thread_start, move || {
                    inner.writer_loop()
                })
            })
            .transpose()
            .map_err(|e| Error::Config(format!("cannot start the writer thread: {e}")))?;
        Ok(Cache { inner, writer })
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
        let mut n = 0;
        for shard in inner.shards.iter() {
            let mut dropped = Vec::new();
            shard.lock().map.retain(|k, e| {
                if k.0 == area {
                    dropped.push(e.place);
                    false
                } else {
                    true
                }
            });
            n += dropped.len() as u64;
            for p in dropped {
                inner.detach(area, p);
            }
        }
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
        s
    }

    /// The allocator's per-class table and totals.
    pub fn pool_stats(&self) -> PoolStats {
        self.inner.pool.stats()
    }

    /// Whether written-back pages are encrypted.
    pub fn encrypts(&self) -> bool {
        self.inner.sealer.encrypts()
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
        self.inner.stop.store(true, Ordering::SeqCst);
        {
            let mut w = self.inner.wake.0.lock();
            *w = true;
            self.inner.wake.1.notify_all();
        }
        if let Some(t) = self.writer.take() {
            let _ = t.join();
        }
        // The pool's memory goes with Inner; the backing file, unlinked,
        // vanishes with its descriptor.
    }
}

/// A victim of a writeback batch.
struct Victim {
    key: Key,
    gen: u32,
    obj: Obj,
    /// Slot, sequence number and tag once sealed.
    sealed: Option<(u64, u64, [u8; 16])>,
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

    /// The pool-full state with the accept-threshold hysteresis.
    fn pool_full(&self) -> bool {
        let limit = self.limit.load(RELAXED);
        if limit == u64::MAX {
            return false;
        }
        let size = self.pool.pool_bytes();
        if self.full.load(RELAXED) {
            if size < self.limit_share(self.accept_percent) {
                self.full.store(false, RELAXED);
                return false;
            }
            true
        } else if size >= limit {
            self.full.store(true, RELAXED);
            true
        } else {
            false
        }
    }

    fn wake_writer(&self) {
        if self.backing.is_some() && !self.wake_pending.swap(true, RELAXED) {
            let mut w = self.wake.0.lock();
            *w = true;
            self.wake.1.notify_one();
        }
    }

    fn inflight(&self) -> (u32, u32) {
        let own = (
            self.inflight_reads.load(RELAXED),
            self.inflight_writes.load(RELAXED),
        );
        match self.backing.as_ref().and_then(|b| b.device_inflight()) {
            Some((r, w)) => (own.0.max(r), own.1.max(w)),
            None => own,
        }
    }

    fn store(&self, area: u32, offset: u64, page: &[u8], cold: bool) -> Result<Stored, Reject> {
        if self.same_filled {
            if let Some(w) = same_filled_word(page) {
                self.insert(area, offset, Place::Same(w));
                return Ok(Stored::SameFilled);
            }
        }
        if self.backing.is_some()
            && self.io_limits.enabled()
            && self.admission.decide(self.io_limits, self.inflight()) == Admit::Backing
        {
            self.counters.reject_io.fetch_add(1, RELAXED);
            return self.store_to_backing(area, offset, page);
        }
        if self.pool_full() {
            self.counters.pool_limit_hit.fetch_add(1, RELAXED);
            self.wake_writer();
            if self.backing.is_none() {
                self.counters.reject_reclaim_fail.fetch_add(1, RELAXED);
                return Err(Reject::PoolFull);
            }
            return self.store_to_backing(area, offset, page);
        }
        let cold_codec = if cold { self.cold_compressor } else { None };
        let compressor =
            cold_codec.unwrap_or_else(|| Compressor::unpack(self.compressor.load(RELAXED)));
        OUT.with(|out| {
            let mut out = out.borrow_mut();
            let (data, codec): (&[u8], Codec) = match compressor.compress(page, &mut out) {
                Some(n) if n < PAGE_SIZE && n <= self.max_compressed => {
                    (&out[..n], compressor.codec())
                }
                r => {
                    let size = r.unwrap_or(PAGE_SIZE);
                    if self.incompressible == Incompressible::StoreRaw {
                        (page, Codec::Raw)
                    } else {
                        self.counters.reject_compress_poor.fetch_add(1, RELAXED);
                        if self.backing.is_some() {
                            return self.store_to_backing(area, offset, page);
                        }
                        return Err(Reject::CompressPoor { size });
                    }
                }
            };
            let scope = self.scope(area);
            let size = data.len();
            let mut dhash = None;
            let mut shared = None;
            if self.dedup_on.load(RELAXED) {
                // Pages are matched in encoded form: equal encoded bytes
                // under one codec decode to equal pages, so a candidate is
                // confirmed by comparing bytes, without decoding it, and the
                // hash reads the (shorter) encoded object. The codec is part
                // of the key. A page encoded differently (another level)
                // merely misses a saving.
                let h = self.dedup.hash(data) ^ (codec as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                shared = self
                    .dedup
                    .find_and_ref(scope, h, |cand| self.object_is(cand, data));
                dhash = Some(h);
            }
            let handle = match shared {
                Some(h) => {
                    self.counters.duplicate_pages.fetch_add(1, RELAXED);
                    self.counters
                        .dedup_saved_bytes
                        .fetch_add(size as u64, RELAXED);
                    h
                }
                None => match self.pool.malloc_write(data) {
                    Ok(h) => {
                        if let Some(d) = dhash {
                            self.dedup.insert(scope, d, h);
                        }
                        h
                    }
                    Err(e) => {
                        self.counters.reject_alloc_fail.fetch_add(1, RELAXED);
                        if self.backing.is_some() {
                            return self.store_to_backing(area, offset, page);
                        }
                        return Err(Reject::Alloc(e.to_string()));
                    }
                },
            };
            let obj = Obj {
                handle,
                size: size as u32,
                codec,
                dedup: dhash,
            };
            self.insert(area, offset, Place::Pool(obj));
            if cold_codec.is_some() && codec != Codec::Raw {
                self.counters.cold_stores.fetch_add(1, RELAXED);
            }
            if self.pool.pool_bytes() >= self.limit_share((100 + self.accept_percent) / 2) {
                self.wake_writer();
            }
            Ok(match (shared, codec) {
                (Some(_), _) => Stored::Duplicate { bytes: size },
                (None, Codec::Raw) => Stored::Raw,
                (None, _) => Stored::Compressed { bytes: data.len() },
            })
        })
    }

    /// Whether the pool object `cand` holds exactly the bytes `data`.
    fn object_is(&self, cand: Handle, data: &[u8]) -> bool {
        let mut same = false;
        let _ = self.pool.map_read(cand, &mut |src| same = src == data);
        same
    }

    /// Seals and writes one page straight to the backing tier.
    fn store_to_backing(&self, area: u32, offset: u64, page: &[u8]) -> Result<Stored, Reject> {
        let backing = self.backing.as_ref().ok_or(Reject::PoolFull)?;
        let slot = {
            let mut slots = self.slots.lock();
            match slots.alloc(1).first() {
                Some(&(slot, _)) => slot,
                None => return Err(Reject::BackingFull { slots: slots.end() }),
            }
        };
        let seq = self.seq.fetch_add(1, RELAXED);
        let res = SCRATCH.with(|s| {
            let mut buf = s.borrow_mut();
            buf.copy_from_slice(page);
            let tag = self.sealer.seal(
                SealId {
                    area,
                    offset,
                    slot,
                    seq,
                },
                &mut buf,
            );
            self.inflight_writes.fetch_add(1, RELAXED);
            let r = backing.write_slots(slot, &[&buf[..]]);
            self.inflight_writes.fetch_sub(1, RELAXED);
            r.map(|()| tag)
        });
        self.counters.backing_writes.fetch_add(1, RELAXED);
        match res {
            Ok(tag) => {
                self.insert(area, offset, Place::Backing { slot, seq, tag });
                self.counters.stores_to_backing.fetch_add(1, RELAXED);
                Ok(Stored::Backing)
            }
            Err(e) => {
                self.free_slot(slot);
                Err(Reject::BackingIo(e.to_string()))
            }
        }
    }

    /// Counts a place into (`add`) or out of the gauges.
    fn account(&self, place: &Place, add: bool) {
        let c = &self.counters;
        let bump = |a: &std::sync::atomic::AtomicU64, v: u64| {
            if add {
                a.fetch_add(v, RELAXED);
            } else {
                a.fetch_sub(v, RELAXED);
            }
        };
        match place {
            Place::Same(_) => {
                bump(&c.stored_pages, 1);
                bump(&c.same_filled_pages, 1);
            }
            Place::Pool(o) => {
                bump(&c.stored_pages, 1);
                bump(&c.stored_payload_bytes, u64::from(o.size));
                if o.codec == Codec::Raw {
                    bump(&c.stored_incompressible_pages, 1);
                }
            }
            Place::Backing { .. } => bump(&c.backing_pages, 1),
        }
    }

    /// Inserts an entry (replacing and releasing any old one).
    fn insert(&self, area: u32, offset: u64, place: Place) {
        let key = (area, offset);
        let born = self.now();
        self.account(&place, true);
        let old = {
            let mut s = self.shard(key).lock();
            let gen = s.bump();
            if matches!(place, Place::Pool(_)) {
                s.lru.push_back(LruItem::new(key, gen));
            }
            let old = s.map.insert(
                key,
                Entry {
                    gen,
                    born,
                    referenced: false,
                    writeback: false,
                    place,
                },
            );
            s.trim_lru();
            old
        };
        if let Some(old) = old {
            self.detach(area, old.place);
        }
    }

    /// Removes the entry of a key, if any, and frees what it held.
    fn remove(&self, area: u32, offset: u64) -> bool {
        let key = (area, offset);
        let old = self.shard(key).lock().map.remove(&key);
        old.map(|e| self.detach(area, e.place)).is_some()
    }

    /// Uncounts a removed entry's place and frees what it held.
    fn detach(&self, area: u32, place: Place) {
        self.account(&place, false);
        match place {
            Place::Same(_) => {}
            Place::Pool(obj) => self.free_obj(area, obj),
            Place::Backing { slot, .. } => self.free_slot(slot),
        }
    }

    fn free_obj(&self, area: u32, obj: Obj) {
        let last = match obj.dedup {
            Some(h) => self.dedup.unref(self.scope(area), h, obj.handle),
            None => true,
        };
        if !last {
            self.counters
                .dedup_saved_bytes
                .fetch_sub(u64::from(obj.size), RELAXED);
        }
        if last {
            self.pool
                .free(obj.handle)
                .expect("an entry's object is live until its entry lets go");
        }
    }

    fn free_slot(&self, slot: u64) {
        let mut slots = self.slots.lock();
        let (start, len) = slots.free(slot);
        // Give the file's blocks back in batches, not one page at a time.
        // Under the lock: once it is released the extent may be handed out
        // and written, and a late hole punch would erase the new data.
        if len % 16 == 0 {
            if let Some(b) = &self.backing {
                b.discard(start, len);
            }
        }
    }

    fn load(
        &self,
        area: u32,
        offset: u64,
        page: &mut [u8],
        mode: LoadMode,
    ) -> Result<Loaded, LoadError> {
        if mode == LoadMode::Exclusive {
            return self.load_exclusive(area, offset, page);
        }
        let key = (area, offset);
        loop {
            let (gen, place) = {
                let mut s = self.shard(key).lock();
                let Some(e) = s.map.get_mut(&key) else {
                    drop(s);
                    return Err(self.miss(page));
                };
                e.referenced = true;
                (e.gen, e.place)
            };
            let res = self.read_place(area, offset, place, page);
            // Valid only if the entry did not change while it was read.
            if self
                .shard(key)
                .lock()
                .map
                .get(&key)
                .is_none_or(|e| e.gen != gen)
            {
                continue;
            }
            return self.count_load(res, page);
        }
    }

    /// An exclusive load takes the entry out first: from then on nothing
    /// else can free what it refers to, so one lock round suffices. If the
    /// read fails, the entry goes back (unless the key was stored anew
    /// meanwhile: the newer page wins).
    fn load_exclusive(&self, area: u32, offset: u64, page: &mut [u8]) -> Result<Loaded, LoadError> {
        let key = (area, offset);
        let Some(e) = self.shard(key).lock().map.remove(&key) else {
            return Err(self.miss(page));
        };
        let res = match e.place {
            // Not shared through dedup: read and free in one pool call.
            Place::Pool(obj) if obj.dedup.is_none() => {
                let res = self.take_pool(obj, page);
                if res.is_ok() {
                    self.account(&e.place, false);
                }
                res
            }
            place => {
                let res = self.read_place(area, offset, place, page);
                if res.is_ok() {
                    self.detach(area, place);
                }
                res
            }
        };
        if res.is_err() {
            let mut s = self.shard(key).lock();
            if !s.map.contains_key(&key) {
                s.map.insert(
                    key,
                    Entry {
                        writeback: false,
                        ..e
                    },
                );
            } else {
                drop(s);
                self.detach(area, e.place);
            }
        }
        self.count_load(res, page)
    }

    fn miss(&self, page: &mut [u8]) -> LoadError {
        self.counters.load_misses.fetch_add(1, RELAXED);
        page.fill(0);
        LoadError::NotFound
    }

    fn read_place(
        &self,
        area: u32,
        offset: u64,
        place: Place,
        page: &mut [u8],
    ) -> Result<Loaded, LoadError> {
        match place {
            Place::Same(w) => {
                fill_word(page, w);
                Ok(Loaded::SameFilled)
            }
            Place::Pool(obj) => {
                let mut ok = false;
                let r = self.pool.map_read(obj.handle, &mut |src| {
                    ok = obj.codec.decompress(src, page).is_ok();
                });
                pool_read(r.is_ok() && ok)
            }
            Place::Backing { slot, seq, tag } => self.read_backing(
                SealId {
                    area,
                    offset,
                    slot,
                    seq,
                },
                &tag,
                page,
            ),
        }
    }

    /// Decompresses a pool object into `page` and frees it, or leaves it
    /// (and says so) if it does not decompress.
    fn take_pool(&self, obj: Obj, page: &mut [u8]) -> Result<Loaded, LoadError> {
        let r = self.pool.map_read_free(obj.handle, &mut |src| {
            obj.codec.decompress(src, page).is_ok()
        });
        pool_read(r == Ok(true))
    }

    fn count_load(
        &self,
        res: Result<Loaded, LoadError>,
        page: &mut [u8],
    ) -> Result<Loaded, LoadError> {
        let c = &self.counters;
        match &res {
            Ok(Loaded::Pool) => &c.loads_pool,
            Ok(Loaded::Backing) => &c.loads_backing,
            Ok(Loaded::SameFilled) => &c.loads_same_filled,
            Err(e) => {
                page.fill(0);
                match e {
                    LoadError::Corrupt { where_: "pool" } => &c.decompress_fail,
                    LoadError::Corrupt { .. } => &c.backing_corrupt,
                    _ => &c.backing_read_fail,
                }
            }
        }
        .fetch_add(1, RELAXED);
        res
    }

    fn read_backing(
        &self,
        id: SealId,
        tag: &[u8; 16],
        page: &mut [u8],
    ) -> Result<Loaded, LoadError> {
        let backing = self
            .backing
            .as_ref()
            .expect("a backing entry implies a tier");
        self.inflight_reads.fetch_add(1, RELAXED);
        let r = backing.read_slot(id.slot, page);
        self.inflight_reads.fetch_sub(1, RELAXED);
        r.map_err(LoadError::Io)?;
        self.sealer
            .open(id, page, tag)
            .map_err(|_| LoadError::Corrupt { where_: "backing" })?;
        Ok(Loaded::Backing)
    }

    /// Picks up to `max` victims from the LRU queues (second chance), or
    /// only entries older than `min_age` seconds.
    ///
    /// As with one global list: first every entry not used since it was
    /// queued, from the front of each shard's queue (`per_shard` at a time,
    /// so a batch spreads over shards), while used ones lose their mark and
    /// go to the back; only when no shard has such an entry left, the ones
    /// passed over. (Neighbouring offsets share a shard, so taking a shard's
    /// quota of passed-over entries before other shards ran out of unused
    /// ones would write back the hot half of a working set.)
    fn pick_victims(&self, max: usize, min_age: Option<u32>) -> Vec<Victim> {
        let mut victims = Vec::with_capacity(max);
        let per_shard = max.div_ceil(8).max(1);
        let start = self.cursor.fetch_add(1, RELAXED);
        let now = self.now();
        // Per shard, entries sent to the back of its queue by this pick.
        let mut passed = vec![0usize; SHARDS];
        for second_round in [false, true] {
            loop {
                let before = victims.len();
                for i in 0..SHARDS {
                    if victims.len() >= max {
                        break;
                    }
                    let idx = (start + i) % SHARDS;
                    let mut s = self.shards[idx].lock();
                    // The first round looks only at what it has not passed
                    // over (the front of the queue).
                    let mut budget = if second_round {
                        s.lru.len()
                    } else {
                        s.lru.len().saturating_sub(passed[idx])
                    };
                    let mut taken = 0;
                    while taken < per_shard && victims.len() < max && budget > 0 {
                        budget -= 1;
                        let Some(it) = s.lru.pop_front() else { break };
                        let Some(e) = s.map.get_mut(&it.key()) else {
                            continue;
                        };
                        let Place::Pool(obj) = e.place else { continue };
                        if e.gen != it.gen || e.writeback {
                            continue;
                        }
                        if let Some(age) = min_age {
                            if now.saturating_sub(e.born) < age {
                                s.lru.push_front(it);
                                break;
                            }
                        }
                        if e.referenced {
                            e.referenced = false;
                            s.lru.push_back(it);
                            passed[idx] += 1;
                            self.counters.writeback_second_chance.fetch_add(1, RELAXED);
                            continue;
                        }
                        e.writeback = true;
                        taken += 1;
                        victims.push(Victim {
                            key: it.key(),
                            gen: it.gen,
                            obj,
                            sealed: None,
                        });
                    }
                }
                if victims.len() == before || victims.len() >= max {
                    break;
                }
            }
        }
        victims
    }

    /// One writeback batch; returns the pages written back.
    fn writeback_batch(&self, max: usize, min_age: Option<u32>) -> usize {
        let Some(backing) = self.backing.as_ref() else {
            return 0;
        };
        let _gate = self.wb_gate.read();
        let mut victims = self.pick_victims(max, min_age);
        if victims.is_empty() {
            return 0;
        }
        // Decompress each victim into its page of the batch buffer.
        let mut buf = vec![0u8; victims.len() * PAGE_SIZE];
        let mut readable = vec![false; victims.len()];
        for (i, v) in victims.iter().enumerate() {
            let page = &mut buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
            let mut ok = false;
            // A stale handle means the entry was dropped meanwhile; the
            // commit below sees that and skips it.
            let _ = self.pool.map_read(v.obj.handle, &mut |src| {
                ok = v.obj.codec.decompress(src, page).is_ok();
            });
            readable[i] = ok;
        }
        let wanted = readable.iter().filter(|&&r| r).count() as u64;
        let runs = self.slots.lock().alloc(wanted);
        // Assign slots in order and seal.
        let mut slot_iter = runs.iter().flat_map(|&(s, n)| s..s + n);
        for (i, v) in victims.iter_mut().enumerate() {
            if !readable[i] {
                continue;
            }
            let Some(slot) = slot_iter.next() else { break };
            let seq = self.seq.fetch_add(1, RELAXED);
            let id = SealId {
                area: v.key.0,
                offset: v.key.1,
                slot,
                seq,
            };
            let tag = self
                .sealer
                .seal(id, &mut buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]);
            v.sealed = Some((slot, seq, tag));
        }
        // Write each run of adjacent slots with one vectored write.
        let mut written = vec![false; victims.len()];
        let mut i = 0;
        while i < victims.len() {
            let Some((first, _, _)) = victims[i].sealed else {
                i += 1;
                continue;
            };
            let mut j = i + 1;
            while j < victims.len()
                && victims[j]
                    .sealed
                    .is_some_and(|(s, _, _)| s == first + (j - i) as u64)
            {
                j += 1;
            }
            let pages: Vec<&[u8]> = (i..j)
                .map(|k| &buf[k * PAGE_SIZE..(k + 1) * PAGE_SIZE])
                .collect();
            self.inflight_writes.fetch_add((j - i) as u32, RELAXED);
            let ok = backing.write_slots(first, &pages).is_ok();
            self.inflight_writes.fetch_sub((j - i) as u32, RELAXED);
            self.counters.backing_writes.fetch_add(1, RELAXED);
            written[i..j].iter_mut().for_each(|w| *w = ok);
            i = j;
        }
        // Commit.
        let mut done = 0;
        let mut failed = false;
        for (v, ok) in victims.iter().zip(&written) {
            let mut s = self.shard(v.key).lock();
            let ours = s
                .map
                .get(&v.key)
                .is_some_and(|e| e.gen == v.gen && e.writeback);
            match (ours, *ok, v.sealed) {
                (true, true, Some((slot, seq, tag))) => {
                    let gen = s.bump();
                    let e = s.map.get_mut(&v.key).expect("checked above");
                    e.gen = gen;
                    e.writeback = false;
                    e.place = Place::Backing { slot, seq, tag };
                    drop(s);
                    self.account(&Place::Pool(v.obj), false);
                    self.account(&Place::Backing { slot, seq, tag }, true);
                    self.free_obj(v.key.0, v.obj);
                    done += 1;
                }
                (true, _, sealed) => {
                    // Not written: back to the pool's LRU, to try later.
                    failed |= sealed.is_some();
                    let e = s.map.get_mut(&v.key).expect("checked above");
                    e.writeback = false;
                    s.lru.push_back(LruItem::new(v.key, v.gen));
                    drop(s);
                    if let Some((slot, _, _)) = sealed {
                        self.free_slot(slot);
                    }
                }
                (false, _, sealed) => {
                    drop(s);
                    if let Some((slot, _, _)) = sealed {
                        self.free_slot(slot);
                    }
                }
            }
        }
        let c = &self.counters;
        c.writeback_batches.fetch_add(1, RELAXED);
        c.written_back_pages.fetch_add(done as u64, RELAXED);
        if failed {
            c.writeback_fail.fetch_add(1, RELAXED);
        }
        done
    }

    fn writer_loop(&self) {
        let tick = if self.proactive.is_some() {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(1)
        };
        while !self.stop.load(Ordering::SeqCst) {
            {
                let mut w = self.wake.0.lock();
                if !*w {
                    w = uzswap_os::sync::wait_for(&self.wake.1, w, tick);
                }
                *w = false;
            }
            self.wake_pending.store(false, RELAXED);
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            self.reclaim();
        }
    }

    /// Writes back until the pool is below its target; then the proactive
    /// policies.
    fn reclaim(&self) {
        let mut target = self.limit_share(self.accept_percent);
        let mut min_age = None;
        if let Some(p) = self.proactive {
            if let Some(share) = p.max_pool_percent_of_limit {
                target = target.min(self.limit_share(u64::from(share)));
            }
            min_age = p.max_age.map(|a| a.as_secs().max(1) as u32);
        }
        let high = if self.proactive.is_some() {
            target
        } else {
            self.limit_share((100 + self.accept_percent) / 2)
        };
        if self.pool.pool_bytes() >= high {
            let mut since_compact = 0;
            while self.pool.pool_bytes() > target && !self.stop.load(RELAXED) {
                let n = self.writeback_batch(self.batch, None);
                if self.proactive.is_some() {
                    self.counters
                        .proactive_written_back_pages
                        .fetch_add(n as u64, RELAXED);
                }
                since_compact += n;
                let payload = self.counters.stored_payload_bytes.load(RELAXED);
                // Freed objects become free pages only once their zspages
                // empty: compact when the pool holds much more than its data.
                if since_compact >= 256 && payload < self.pool.pool_bytes() / 10 * 9 {
                    self.pool.compact();
                    self.counters.writer_compactions.fetch_add(1, RELAXED);
                    since_compact = 0;
                }
                if n == 0 {
                    break;
                }
            }
        }
        if let Some(age) = min_age {
            loop {
                let n = self.writeback_batch(self.batch, Some(age));
                self.counters
                    .proactive_written_back_pages
                    .fetch_add(n as u64, RELAXED);
                if n == 0 || self.stop.load(RELAXED) {
                    break;
                }
            }
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
        index as u64 + self.dedup.metadata_bytes()
    }

    fn check_invariants(&self) -> Result<(), String> {
        let _gate = self.wb_gate.write();
        let c = self.counters.snapshot();
        let (mut same, mut pooled, mut raw, mut payload, mut backed) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut handles: HashMap<u64, (u32, Obj, u32)> = HashMap::new();
        let mut slots_seen = std::collections::HashSet::new();
        let slots = self.slots.lock();
        for (i, shard) in self.shards.iter().enumerate() {
            let s = shard.lock();
            s.map.check().map_err(|e| format!("shard {i}: {e}"))?;
            for (key, e) in s.map.iter() {
                if shard_of(key) != i {
                    return Err(format!("{key:?} in shard {i}"));
                }
                if e.writeback {
                    return Err(format!("{key:?} still marked for writeback"));
                }
                match e.place {
                    Place::Same(_) => same += 1,
                    Place::Pool(o) => {
                        pooled += 1;
                        payload += u64::from(o.size);
                        raw += u64::from(o.codec == Codec::Raw);
                        let size = self
                            .pool
                            .object_size(o.handle)
                            .map_err(|err| format!("{key:?}: {err}"))?;
                        if size != o.size as usize {
                            return Err(format!("{key:?}: object {size} B, entry says {}", o.size));
                        }
                        let r =
                            handles
                                .entry(o.handle.to_raw())
                                .or_insert((self.scope(key.0), o, 0));
                        r.2 += 1;
                        if r.2 > 1 && (o.dedup.is_none() || r.0 != self.scope(key.0)) {
                            return Err(format!("{key:?} shares an object outside dedup"));
                        }
                    }
                    Place::Backing { slot, .. } => {
                        backed += 1;
                        if !slots.is_used(slot) || !slots_seen.insert(slot) {
                            return Err(format!("{key:?}: slot {slot} free or shared"));
                        }
                    }
                }
            }
        }
        let want = [
            ("stored_pages", c.stored_pages, same + pooled),
            ("same_filled_pages", c.same_filled_pages, same),
            (
                "stored_incompressible_pages",
                c.stored_incompressible_pages,
                raw,
            ),
            ("stored_payload_bytes", c.stored_payload_bytes, payload),
            ("backing_pages", c.backing_pages, backed),
            ("backing slots used", slots.used(), backed),
        ];
        for (name, have, counted) in want {
            if have != counted {
                return Err(format!("{name}: counter {have}, index holds {counted}"));
            }
        }
        let saved: u64 = handles
            .values()
            .map(|(_, o, refs)| u64::from(o.size) * u64::from(refs - 1))
            .sum();
        if c.dedup_saved_bytes != saved {
            return Err(format!(
                "dedup_saved_bytes: counter {}, shared objects save {saved}",
                c.dedup_saved_bytes
            ));
        }
        let objects = self.pool.stats().objects;
        if objects != handles.len() as u64 {
            return Err(format!(
                "pool holds {objects} objects, entries refer to {}",
                handles.len()
            ));
        }
        for (scope, o, refs) in handles.values() {
            if let Some(h) = o.dedup {
                let have = self.dedup.refs(*scope, h, o.handle);
                if have != *refs {
                    return Err(format!(
                        "dedup refs {have} for an object {refs} entries use"
                    ));
                }
            }
        }
        let (dedup_objects, _) = self.dedup.totals();
        let registered = handles
            .values()
            .filter(|(_, o, _)| o.dedup.is_some())
            .count();
        if dedup_objects != registered as u64 {
            return Err(format!(
                "dedup index holds {dedup_objects} objects, entries register {registered}"
            ));
        }
        drop(slots);
        self.pool.check_invariants()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CacheConfig, PoolLimit};

    /// Overwrites the pool object behind `(area, offset)` with bytes no
    /// codec accepts.
    fn damage(cache: &Cache, area: u32, offset: u64) {
        let key = (area, offset);
        let place = cache.inner.shard(key).lock().map.get(&key).map(|e| e.place);
        let Some(Place::Pool(obj)) = place else {
            panic!("({area}, {offset}) is not in the pool: {place:?}");
        };
        let junk = vec![0xff; obj.size as usize];
        cache.inner.pool.write(obj.handle, &junk).unwrap();
    }

    /// A pool object that no longer decompresses is an error on every load,
    /// exclusive ones included, and the entry survives it: it is neither
    /// freed (the allocator's invariants hold, the page still counts) nor
    /// dropped from the index, until invalidated or stored anew. With dedup
    /// on, the exclusive load takes another path (the object may be shared).
    #[test]
    fn a_damaged_pool_object_fails_loads_and_keeps_its_entry() {
        for dedup in [false, true] {
            let cache = Cache::new(CacheConfig {
                pool_limit: PoolLimit::Unlimited,
                dedup,
                ..CacheConfig::default()
            })
            .unwrap();
            cache.open_area(0).unwrap();
            let page: Vec<u8> = (0..PAGE_SIZE).map(|i| (i / 7 % 251) as u8).collect();
            cache.store(0, 1, &page).unwrap();
            cache.store(0, 2, &page).unwrap();
            damage(&cache, 0, 1);
            let mut buf = vec![1u8; PAGE_SIZE];
            for mode in [LoadMode::Exclusive, LoadMode::Keep, LoadMode::Exclusive] {
                let r = cache.load(0, 1, &mut buf, mode);
                assert!(
                    matches!(r, Err(LoadError::Corrupt { where_: "pool" })),
                    "dedup {dedup}, {mode:?}: {r:?}"
                );
                assert!(
                    buf.iter().all(|&b| b == 0),
                    "a failed load zeroes the buffer"
                );
                cache.check_invariants().unwrap();
            }
            let st = cache.stats();
            assert_eq!(st.decompress_fail, 3);
            assert_eq!(
                st.stored_pages, 2,
                "dedup {dedup}: the damaged entry still counts"
            );
            // With dedup the two offsets share the damaged object.
            if !dedup {
                cache.load(0, 2, &mut buf, LoadMode::Exclusive).unwrap();
                assert_eq!(buf, page);
            }
            cache.store(0, 1, &page).unwrap();
            cache.load(0, 1, &mut buf, LoadMode::Exclusive).unwrap();
            assert_eq!(
                buf, page,
                "a page stored anew over a damaged one reads back"
            );
            cache.check_invariants().unwrap();
        }
    }
}
