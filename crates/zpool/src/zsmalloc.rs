//! The zsmalloc-class allocator.
//!
//! # Layout
//! Object sizes are rounded up to a multiple of 16 bytes; each rounded size
//! has a *class*. A class carves *zspages* of `pages_per_zspage` contiguous
//! pages (1..=`max_pages_per_zspage`, chosen per class to waste the least
//! tail space) into `objs_per_zspage` equal slots. Because a zspage is one
//! contiguous run of virtual memory, an object that straddles a page boundary
//! is still contiguous: every object can be read in place (zero-copy).
//! Classes whose geometry (pages per zspage, objects per zspage) equals that
//! of the next larger class are merged into it, as the kernel does. A class
//! with one object per one-page zspage is a *huge* class.
//!
//! # Handles
//! A handle encodes `tag:10 | class:8 | gen:18 | slot:28` (high to low). The
//! slot indexes the class's handle table, whose entry says where the object
//! lives now (zspage id, object index) and its size. Compaction moves objects
//! by rewriting handle-table entries, so handles held by callers never
//! change. The generation is bumped on free, so a freed handle is detected as
//! stale until the 18-bit generation wraps (262,144 reuses of the same slot);
//! the tag names the pool, so handles of other pools are refused.
//!
//! # Locks
//! Lock order, outer to inner:
//! 1. `Class::inner` (one `RwLock` per class; never two classes at once);
//! 2. `PageArena::inner` (taken only to get or give back page runs);
//! 3. `Compactor::state` (only to post a class for background compaction).
//!
//! Reads (`read`, `map_read`, `object_size`) take the class lock shared;
//! everything that changes the class, including writing object bytes, takes
//! it exclusive. So an object cannot move or vanish while it is read, and a
//! write never races a read. There is no pool-wide lock on the hot path: the
//! page counter is an atomic updated only when a zspage is made or freed.
//!
//! # Invariants (checked by [`Zpool::check_invariants`])
//! - per zspage: `inuse == |{obj: owner[obj] != FREE}|` and
//!   `inuse + |free| + (objs_per_zspage - fresh) == objs_per_zspage`;
//! - a zspage sits in exactly one fullness group, the one its `inuse` gives;
//!   a zspage with `inuse == 0` does not exist (it is freed at once);
//! - per class: `obj_used == Σ inuse == live handle slots`, `payload ==
//!   Σ size of live slots`, each live slot points at an object whose owner is
//!   that slot;
//! - per pool: `pages_held == Σ_class zspages × pages_per_zspage`.

use crate::stats::FULLNESS_BUCKETS;
use crate::sys::{PageArena, MAX_RUN_PAGES, PAGE_SIZE};
use crate::{check_size, ClassStats, CompactReport, Error, Handle, PoolStats, Zpool};
use parking_lot::{Condvar, Mutex, RwLock};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

/// Objects are rounded up to a multiple of this.
pub const CLASS_STEP: usize = 16;
/// Number of rounded sizes: 16, 32, …, 4096.
const NUM_SIZES: usize = PAGE_SIZE / CLASS_STEP;

const SLOT_BITS: u32 = 28;
const GEN_BITS: u32 = 18;
const CLASS_BITS: u32 = 8;
const TAG_BITS: u32 = 10;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const GEN_MASK: u32 = (1 << GEN_BITS) - 1;

/// Marks a free handle slot (`Slot::zspage`) or a free object (`owner`).
const FREE: u32 = u32::MAX;

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
    /// disables automatic compaction. Default 30 %, after seed 004.
    pub compact_watermark_percent: Option<u8>,
}

impl Default for ZsConfig {
    fn default() -> Self {
        ZsConfig {
            limit_bytes: None,
            max_pages_per_zspage: 8,
            compact_watermark_percent: Some(30),
        }
    }
}

/// An entry of a class's handle table.
#[derive(Clone, Copy)]
struct Slot {
    /// Generation of the handle that names this slot now (or next, if free).
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
    /// Objects freed since and not reused (a stack).
    free: Vec<u16>,
    /// Handle slot of each object, `FREE` when the object is not in use.
    owner: Vec<u32>,
    /// Fullness group and position in it (for O(1) removal).
    group: u8,
    group_pos: u32,
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
}

// SAFETY: the raw page pointers in a ClassInner are owned by the pool (taken
// from its arena and given back only by the pool), and every access to the
// memory behind them happens under the class lock that guards this struct.
unsafe impl Send for ClassInner {}
// SAFETY: shared references to ClassInner only read bookkeeping and object
// bytes; writes to object memory need `&mut ClassInner` (the write lock).
unsafe impl Sync for ClassInner {}

struct Class {
    /// Index in `Shared::classes`.
    index: u8,
    /// Slot size.
    size: usize,
    pages_per_zspage: usize,
    objs_per_zspage: usize,
    inner: RwLock<ClassInner>,
    /// Set while the class waits for the background compactor.
    compact_pending: AtomicBool,
}

/// Where an object lives, resolved from a handle under the class lock.
struct Located {
    slot: u32,
    zspage: u32,
    obj: u16,
    size: usize,
}

struct Shared {
    tag: u32,
    classes: Vec<Class>,
    /// Class index for each rounded size (index `(size - 1) / 16`).
    size_to_class: [u8; NUM_SIZES],
    arena: PageArena,
    pages_held: AtomicU64,
    /// Limit in pages; `u64::MAX` for none.
    limit_pages: AtomicU64,
    compactions: AtomicU64,
    objects_moved: AtomicU64,
    pages_compacted: AtomicU64,
    watermark_percent: Option<u8>,
    compactor: Compactor,
}

/// Background compaction: classes are posted here by `free` when their
/// freeable pages pass the watermark, and one thread compacts them.
struct Compactor {
    state: Mutex<CompactorState>,
    wake: Condvar,
}

struct CompactorState {
    pending: Vec<u8>,
    stop: bool,
}

/// The zsmalloc-class pool. See the module documentation.
pub struct ZsPool {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
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

fn group_of(inuse: usize, objs: usize) -> usize {
    if inuse >= objs {
        FULL_GROUP
    } else {
        // inuse >= 1 here: (0,10%] → 0, …, (90%,100%) → 9.
        ((inuse * 10).div_ceil(objs) - 1).min(9)
    }
}

fn encode(tag: u32, class: u8, gen: u32, slot: u32) -> Handle {
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
                _ => classes.push(Class {
                    index: 0,
                    size,
                    pages_per_zspage: pages,
                    objs_per_zspage: objs,
                    inner: RwLock::new(ClassInner {
                        zspages: Vec::new(),
                        free_zspage_ids: Vec::new(),
                        groups: Default::default(),
                        slots: Vec::new(),
                        free_slots: Vec::new(),
                        obj_used: 0,
                        payload: 0,
                        live_zspages: 0,
                    }),
                    compact_pending: AtomicBool::new(false),
                }),
            }
            raw_class[i] = classes.len() - 1;
        }
        // Number classes from the smallest size up, as the kernel's table.
        classes.reverse();
        let n = classes.len();
        assert!(n <= 1 << CLASS_BITS);
        for (i, c) in classes.iter_mut().enumerate() {
            c.index = i as u8;
        }
        for i in 0..NUM_SIZES {
            size_to_class[i] = (n - 1 - raw_class[i]) as u8;
        }
        let tag = NEXT_TAG.fetch_add(1, Ordering::Relaxed) % ((1 << TAG_BITS) - 1) + 1;
        let shared = Arc::new(Shared {
            tag,
            classes,
            size_to_class,
            arena: PageArena::new(),
            pages_held: AtomicU64::new(0),
            limit_pages: AtomicU64::new(limit_to_pages(config.limit_bytes)),
            compactions: AtomicU64::new(0),
            objects_moved: AtomicU64::new(0),
            pages_compacted: AtomicU64::new(0),
            watermark_percent: config.compact_watermark_percent,
            compactor: Compactor {
                state: Mutex::new(CompactorState {
                    pending: Vec::new(),
                    stop: false,
                }),
                wake: Condvar::new(),
            },
        });
        let thread = match config.compact_watermark_percent {
            None => None,
            Some(_) => {
                let weak = Arc::downgrade(&shared);
                Some(
                    std::thread::Builder::new()
                        .name("zs-compact".into())
                        .spawn(move || compactor_main(weak))
                        .map_err(|e| {
                            Error::Config(format!("cannot start the compaction thread: {e}"))
                        })?,
                )
            }
        };
        Ok(ZsPool { shared, thread })
    }

    /// The classes as (index, slot size, pages per zspage, objects per
    /// zspage), smallest first.
    pub fn class_geometry(&self) -> Vec<(usize, usize, usize, usize)> {
        self.shared
            .classes
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
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The arena unmaps its chunks when `shared` goes.
    }
}

fn compactor_main(weak: Weak<Shared>) {
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let class = {
            let mut st = shared.compactor.state.lock();
            loop {
                if st.stop {
                    return;
                }
                if let Some(c) = st.pending.pop() {
                    break c;
                }
                shared.compactor.wake.wait(&mut st);
            }
        };
        let c = &shared.classes[class as usize];
        c.compact_pending.store(false, Ordering::Relaxed);
        shared.compact_class(c);
        drop(shared);
    }
}

impl Shared {
    /// Resolves a handle to its class and, under the given lock, its slot.
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
        if s.zspage == FREE || s.gen != gen {
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
        // SAFETY: obj < objs_per_zspage, so the offset stays inside the run
        // of pages_per_zspage pages that `base` starts.
        unsafe { zp.base.as_ptr().add(obj as usize * class.size) }
    }

    fn malloc_locked(
        &self,
        class: &Class,
        inner: &mut ClassInner,
        size: usize,
    ) -> Result<(Handle, *mut u8), Error> {
        // The fullest partial zspage, so sparse ones drain and can be freed.
        let zid = match (0..FULL_GROUP).rev().find(|&g| !inner.groups[g].is_empty()) {
            Some(g) => *inner.groups[g].last().expect("group is non-empty"),
            None => self.new_zspage(class, inner)?,
        };
        let slot = match inner.free_slots.pop() {
            Some(s) => s,
            None => {
                let s = inner.slots.len();
                if s as u64 > SLOT_MASK {
                    return Err(Error::Config(format!(
                        "class {} holds 2^{SLOT_BITS} objects, the most a class can name",
                        class.size
                    )));
                }
                inner.slots.push(Slot {
                    gen: 0,
                    zspage: FREE,
                    obj: 0,
                    size: 0,
                });
                s as u32
            }
        };
        let objs = class.objs_per_zspage;
        let zp = inner.zspages[zid as usize]
            .as_mut()
            .expect("group lists only live zspages");
        let obj = match zp.free.pop() {
            Some(o) => o,
            None => {
                let o = zp.fresh;
                zp.fresh += 1;
                o as u16
            }
        };
        zp.owner[obj as usize] = slot;
        zp.inuse += 1;
        let inuse = zp.inuse as usize;
        // SAFETY: obj < objs_per_zspage (it came from `free` or `fresh`,
        // both below it), so the pointer is inside the zspage's run.
        let ptr = unsafe { zp.base.as_ptr().add(obj as usize * class.size) };
        Self::regroup(inner, zid, group_of(inuse, objs));
        let s = &mut inner.slots[slot as usize];
        s.zspage = zid;
        s.obj = obj;
        s.size = size as u16;
        let h = encode(self.tag, class.index, s.gen, slot);
        inner.obj_used += 1;
        inner.payload += size as u64;
        Ok((h, ptr))
    }

    fn new_zspage(&self, class: &Class, inner: &mut ClassInner) -> Result<u32, Error> {
        let pages = class.pages_per_zspage as u64;
        let limit = self.limit_pages.load(Ordering::Relaxed);
        // Reserve the pages first so concurrent classes cannot overshoot.
        let before = self.pages_held.fetch_add(pages, Ordering::Relaxed);
        if before + pages > limit {
            self.pages_held.fetch_sub(pages, Ordering::Relaxed);
            return Err(Error::LimitReached {
                limit_bytes: limit.saturating_mul(PAGE_SIZE as u64),
            });
        }
        let base = match self.arena.alloc_run(class.pages_per_zspage) {
            Ok(b) => b,
            Err(e) => {
                self.pages_held.fetch_sub(pages, Ordering::Relaxed);
                return Err(e);
            }
        };
        let zp = Zspage {
            base,
            inuse: 0,
            fresh: 0,
            free: Vec::new(),
            owner: vec![FREE; class.objs_per_zspage],
            group: 0,
            group_pos: 0,
        };
        let zid = match inner.free_zspage_ids.pop() {
            Some(id) => {
                inner.zspages[id as usize] = Some(zp);
                id
            }
            None => {
                inner.zspages.push(Some(zp));
                (inner.zspages.len() - 1) as u32
            }
        };
        let g = &mut inner.groups[0];
        g.push(zid);
        let pos = (g.len() - 1) as u32;
        let zp = inner.zspages[zid as usize].as_mut().expect("just inserted");
        zp.group = 0;
        zp.group_pos = pos;
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

    /// Frees the object at `loc`: wipes it, returns its slot to the table.
    /// Returns the zspage's run if the zspage became empty (the caller gives
    /// it back to the arena after dropping the class lock).
    fn free_locked(
        &self,
        class: &Class,
        inner: &mut ClassInner,
        loc: &Located,
    ) -> Option<NonNull<u8>> {
        let ptr = Self::obj_ptr(class, inner, loc.zspage, loc.obj);
        // SAFETY: ptr points at this object's slot of class.size bytes
        // inside a live zspage, and we hold the class lock exclusively, so
        // nobody else reads or writes it. Wiping keeps old contents from a
        // later owner.
        unsafe { std::ptr::write_bytes(ptr, 0, loc.size) };
        let s = &mut inner.slots[loc.slot as usize];
        s.zspage = FREE;
        s.gen = (s.gen + 1) & GEN_MASK;
        inner.free_slots.push(loc.slot);
        inner.obj_used -= 1;
        inner.payload -= loc.size as u64;
        self.release_obj(class, inner, loc.zspage, loc.obj)
    }

    /// Marks object `obj` of zspage `zid` free; frees the zspage if it
    /// became empty, returning its run.
    fn release_obj(
        &self,
        class: &Class,
        inner: &mut ClassInner,
        zid: u32,
        obj: u16,
    ) -> Option<NonNull<u8>> {
        let zp = inner.zspages[zid as usize].as_mut().expect("live zspage");
        zp.owner[obj as usize] = FREE;
        zp.free.push(obj);
        zp.inuse -= 1;
        let inuse = zp.inuse as usize;
        if inuse == 0 {
            let (g, pos, base) = (zp.group as usize, zp.group_pos as usize, zp.base);
            Self::unlink(inner, g, pos);
            inner.zspages[zid as usize] = None;
            inner.free_zspage_ids.push(zid);
            inner.live_zspages -= 1;
            self.pages_held
                .fetch_sub(class.pages_per_zspage as u64, Ordering::Relaxed);
            return Some(base);
        }
        Self::regroup(inner, zid, group_of(inuse, class.objs_per_zspage));
        None
    }

    fn give_back(&self, class: &Class, run: Option<NonNull<u8>>) {
        if let Some(base) = run {
            // SAFETY: the run came from this arena with this length, its
            // zspage was removed from the class under the class lock, and no
            // slot points into it any more.
            unsafe { self.arena.free_run(base, class.pages_per_zspage) };
        }
    }

    fn freeable(class: &Class, inner: &ClassInner) -> u64 {
        let allocated = inner.live_zspages * class.objs_per_zspage as u64;
        let wasted = allocated - inner.obj_used;
        wasted / class.objs_per_zspage as u64 * class.pages_per_zspage as u64
    }

    /// Posts the class to the background compactor if it passed the
    /// watermark. Called with the class lock held (shared or exclusive).
    fn maybe_post(&self, class: &Class, inner: &ClassInner) {
        let Some(pct) = self.watermark_percent else {
            return;
        };
        let freeable = Self::freeable(class, inner);
        let pages = inner.live_zspages * class.pages_per_zspage as u64;
        if freeable < 2 * class.pages_per_zspage as u64 || freeable * 100 < pages * u64::from(pct) {
            return;
        }
        if class.compact_pending.swap(true, Ordering::Relaxed) {
            return;
        }
        self.compactor.state.lock().pending.push(class.index);
        self.compactor.wake.notify_one();
    }

    /// Compacts one class: empties the sparsest zspages into the fullest
    /// partial ones. Takes the class lock once per source zspage, so readers
    /// wait at most one zspage's worth of moves.
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
            loop {
                let dst = (0..FULL_GROUP)
                    .rev()
                    .find_map(|g| inner.groups[g].iter().rev().find(|&&z| z != src).copied());
                let Some(dst) = dst else { break };
                let src_zp = inner.zspages[src as usize].as_ref().expect("live zspage");
                let Some(obj) = src_zp.owner.iter().position(|&o| o != FREE) else {
                    break;
                };
                let obj = obj as u16;
                let slot = src_zp.owner[obj as usize];
                let from = Self::obj_ptr(class, &inner, src, obj);
                // Take a free object in dst.
                let dzp = inner.zspages[dst as usize].as_mut().expect("live zspage");
                let dobj = match dzp.free.pop() {
                    Some(o) => o,
                    None => {
                        let o = dzp.fresh;
                        dzp.fresh += 1;
                        o as u16
                    }
                };
                dzp.owner[dobj as usize] = slot;
                dzp.inuse += 1;
                let dinuse = dzp.inuse as usize;
                let to = Self::obj_ptr(class, &inner, dst, dobj);
                let size = inner.slots[slot as usize].size as usize;
                // SAFETY: both pointers are object slots of class.size bytes
                // in live zspages of this class (distinct zspages, so they do
                // not overlap), and the class lock is held exclusively.
                unsafe {
                    std::ptr::copy_nonoverlapping(from, to, size);
                    std::ptr::write_bytes(from, 0, size);
                }
                Self::regroup(&mut inner, dst, group_of(dinuse, class.objs_per_zspage));
                let s = &mut inner.slots[slot as usize];
                s.zspage = dst;
                s.obj = dobj;
                report.objects_moved += 1;
                run = self.release_obj(class, &mut inner, src, obj);
                if run.is_some() {
                    break;
                }
            }
            drop(inner);
            match run {
                Some(_) => {
                    report.pages_freed += class.pages_per_zspage as u64;
                    self.give_back(class, run);
                }
                // No destination left for src: nothing more to gain.
                None => break,
            }
        }
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
        let class = &sh.classes[sh.size_to_class[(size - 1) / CLASS_STEP] as usize];
        let mut inner = class.inner.write();
        sh.malloc_locked(class, &mut inner, size).map(|(h, _)| h)
    }

    fn malloc_write(&self, data: &[u8]) -> Result<Handle, Error> {
        let size = data.len();
        check_size(size)?;
        let sh = &*self.shared;
        let class = &sh.classes[sh.size_to_class[(size - 1) / CLASS_STEP] as usize];
        let mut inner = class.inner.write();
        let (h, ptr) = sh.malloc_locked(class, &mut inner, size)?;
        // SAFETY: ptr is the new object's slot (class.size >= size bytes) in
        // a live zspage; we hold the class lock exclusively.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, size) };
        Ok(h)
    }

    fn free(&self, handle: Handle) -> Result<usize, Error> {
        let sh = &*self.shared;
        let (class, gen, slot) = sh.class_of(handle)?;
        let mut inner = class.inner.write();
        let loc = Shared::locate(&inner, handle, gen, slot)?;
        let run = sh.free_locked(class, &mut inner, &loc);
        sh.maybe_post(class, &inner);
        drop(inner);
        sh.give_back(class, run);
        Ok(loc.size)
    }

    fn object_size(&self, handle: Handle) -> Result<usize, Error> {
        let (class, gen, slot) = self.shared.class_of(handle)?;
        let inner = class.inner.read();
        Ok(Shared::locate(&inner, handle, gen, slot)?.size)
    }

    fn write(&self, handle: Handle, data: &[u8]) -> Result<(), Error> {
        let (class, gen, slot) = self.shared.class_of(handle)?;
        let inner = class.inner.write();
        let loc = Shared::locate(&inner, handle, gen, slot)?;
        if data.len() != loc.size {
            return Err(Error::BadBuffer {
                got: data.len(),
                object: loc.size,
                what: "write() takes exactly the object's size",
            });
        }
        let ptr = Shared::obj_ptr(class, &inner, loc.zspage, loc.obj);
        // SAFETY: ptr is this object's slot (>= loc.size bytes) in a live
        // zspage, and the exclusive class lock keeps readers out.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr, loc.size) };
        Ok(())
    }

    fn read(&self, handle: Handle, buf: &mut [u8]) -> Result<usize, Error> {
        let (class, gen, slot) = self.shared.class_of(handle)?;
        let inner = class.inner.read();
        let loc = Shared::locate(&inner, handle, gen, slot)?;
        if buf.len() < loc.size {
            return Err(Error::BadBuffer {
                got: buf.len(),
                object: loc.size,
                what: "read() needs a buffer at least the object's size",
            });
        }
        let ptr = Shared::obj_ptr(class, &inner, loc.zspage, loc.obj);
        // SAFETY: ptr is this object's slot in a live zspage; the shared
        // class lock excludes writers and compaction while we copy.
        unsafe { std::ptr::copy_nonoverlapping(ptr, buf.as_mut_ptr(), loc.size) };
        Ok(loc.size)
    }

    fn map_read(&self, handle: Handle, f: &mut dyn FnMut(&[u8])) -> Result<(), Error> {
        let (class, gen, slot) = self.shared.class_of(handle)?;
        let inner = class.inner.read();
        let loc = Shared::locate(&inner, handle, gen, slot)?;
        let ptr = Shared::obj_ptr(class, &inner, loc.zspage, loc.obj);
        // SAFETY: the object's loc.size bytes lie in a live zspage and stay
        // unchanged while the shared class lock is held (writers, free and
        // compaction take it exclusively), which lasts until `f` returns.
        let obj = unsafe { std::slice::from_raw_parts(ptr, loc.size) };
        f(obj);
        Ok(())
    }

    fn compact(&self) -> CompactReport {
        let mut total = CompactReport::default();
        for c in &self.shared.classes {
            let r = self.shared.compact_class(c);
            total.objects_moved += r.objects_moved;
            total.pages_freed += r.pages_freed;
        }
        total
    }

    fn stats(&self) -> PoolStats {
        let sh = &*self.shared;
        let mut st = PoolStats {
            allocator: "zsmalloc",
            ..PoolStats::default()
        };
        let mut meta = sh.arena.metadata_bytes() as u64
            + (sh.classes.capacity() * std::mem::size_of::<Class>()) as u64;
        for c in &sh.classes {
            let inner = c.inner.read();
            let objs = c.objs_per_zspage as u64;
            let mut row = ClassStats {
                class: u32::from(c.index),
                size: c.size as u32,
                pages_per_zspage: c.pages_per_zspage as u32,
                obj_allocated: inner.live_zspages * objs,
                obj_used: inner.obj_used,
                pages_used: inner.live_zspages * c.pages_per_zspage as u64,
                freeable: Shared::freeable(c, &inner),
                ..ClassStats::default()
            };
            let mut hist = [0u64; FULLNESS_BUCKETS];
            for (g, list) in inner.groups.iter().enumerate() {
                hist[(g + 1).min(FULLNESS_BUCKETS - 1)] += list.len() as u64;
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
            row.fullness = hist;
            st.objects += inner.obj_used;
            st.payload_bytes += inner.payload;
            meta += (inner.slots.capacity() * std::mem::size_of::<Slot>()
                + inner.free_slots.capacity() * 4
                + inner.free_zspage_ids.capacity() * 4
                + inner.zspages.capacity() * std::mem::size_of::<Option<Zspage>>()
                + inner.groups.iter().map(|g| g.capacity() * 4).sum::<usize>())
                as u64;
            for zp in inner.zspages.iter().flatten() {
                meta += (zp.owner.capacity() * 4 + zp.free.capacity() * 2) as u64;
            }
            drop(inner);
            if row.pages_used > 0 {
                st.classes.push(row);
            }
        }
        st.pages_held = sh.pages_held.load(Ordering::Relaxed);
        st.pool_bytes = st.pages_held * PAGE_SIZE as u64;
        st.metadata_bytes = meta;
        let lim = sh.limit_pages.load(Ordering::Relaxed);
        st.limit_bytes = (lim != u64::MAX).then(|| lim * PAGE_SIZE as u64);
        st.compactions = sh.compactions.load(Ordering::Relaxed);
        st.objects_moved = sh.objects_moved.load(Ordering::Relaxed);
        st.pages_compacted = sh.pages_compacted.load(Ordering::Relaxed);
        st
    }

    fn pool_bytes(&self) -> u64 {
        self.shared.pages_held.load(Ordering::Relaxed) * PAGE_SIZE as u64
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
            for (zid, zp) in inner.zspages.iter().enumerate() {
                let Some(zp) = zp else { continue };
                live += 1;
                let owned = zp.owner.iter().filter(|&&o| o != FREE).count();
                if owned != zp.inuse as usize || zp.inuse == 0 {
                    return Err(format!(
                        "{name}: zspage {zid} inuse {} but {owned} owned objects",
                        zp.inuse
                    ));
                }
                if zp.inuse as usize + zp.free.len() + (objs - zp.fresh as usize) != objs {
                    return Err(format!("{name}: zspage {zid} object counts do not add up"));
                }
                for &f in &zp.free {
                    if zp.owner[f as usize] != FREE || u32::from(f) >= zp.fresh {
                        return Err(format!("{name}: zspage {zid} free object {f} is in use"));
                    }
                }
                let g = group_of(zp.inuse as usize, objs);
                if zp.group as usize != g
                    || inner.groups[g].get(zp.group_pos as usize) != Some(&(zid as u32))
                {
                    return Err(format!("{name}: zspage {zid} is not in fullness group {g}"));
                }
                for (o, &slot) in zp.owner.iter().enumerate() {
                    if slot == FREE {
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
                if sh.size_to_class[(s.size as usize - 1) / CLASS_STEP] != c.index {
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
            pages += live * c.pages_per_zspage as u64;
        }
        let held = sh.pages_held.load(Ordering::Relaxed);
        if held != pages {
            return Err(format!(
                "pool holds {held} pages by its counter, {pages} by its classes"
            ));
        }
        Ok(())
    }
}
