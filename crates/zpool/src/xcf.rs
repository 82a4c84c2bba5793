//! A scatter-gather allocator after zcache's xcfmalloc ("xcf").
//!
//! # Data layout
//! - The pool is `shards` independent sub-pools ([`Shard`]), each behind its
//!   own lock. A thread allocates from "its" shard (a per-thread index given
//!   round robin); free/read/write go to the shard named in the handle.
//! - A shard holds pages, each one run of one page from the pool's
//!   [`PageArena`]. The bytes of a page are tiled, without gap or overlap, by
//!   **blocks**: runs of bytes inside one page, `GRAN`-aligned, a multiple of
//!   `GRAN` long. A block is either owned by one object or free.
//! - A block's **descriptor** (24 bytes: page, offset, length, owner, chain
//!   link or free-list position, previous and next block of its page) lives
//!   in the side table `Shard::descs`, never in the page. The blocks of a
//!   page form a doubly linked list in offset order starting at `Page::first`
//!   (the block at offset 0, the same descriptor for the page's life), so a
//!   freed block finds and merges its free neighbours in O(1).
//! - An **object** is a chain of blocks (`Obj::first`, then `Block::link`),
//!   possibly in different pages, whose lengths add up to the object size
//!   rounded up to `GRAN`. The object entry also caches the addresses of
//!   the chain's first two blocks (`Obj::head`, `Obj::tail`), so reading
//!   an object of one or two blocks follows no descriptor.
//! - Free blocks sit in exact-size free lists, one per multiple of `GRAN`
//!   (`free[len / GRAN]`), with a bitmap of non-empty lists. An allocation
//!   takes the best-fitting free block (smallest one that holds the object,
//!   split if longer); else the largest free block whole plus the best fit
//!   for the rest. If that is not possible either, it adds a fresh page and
//!   takes the largest free block plus the rest from the new page. So a
//!   chain has at most **two blocks** when made by malloc: a read follows
//!   few links, and a page's tail is still used. Only at the pool's limit
//!   does malloc chain as many scattered blocks as it takes; compaction
//!   does too (it fills holes). Leftovers that malloc skipped are what
//!   compaction packs away.
//! - A page whose blocks all become free is given back to the OS (in
//!   batches of 256 pages, one system call each: see `sys.rs`).
//!   Freed object bytes are zeroed if the object was ever written (an
//!   object never written still reads as zeros), so a later object never
//!   shows old data.
//! - A handle is `tag:16 | shard:4 | generation:16 | slot:28` (high to low
//!   bits). The tag is per pool (never 0, so a handle is never 0), the slot
//!   indexes the shard's object table, the generation is bumped on free.
//!
//! # Glossary
//! - **page**: a 4096-byte OS page (one arena run).
//! - **block**: a run of bytes inside one page; used or free.
//! - **descriptor**: the side-table entry describing one block.
//! - **chain**: the blocks of one object, in byte order of the object.
//! - **shard**: an independent sub-pool with its own lock and pages.
//!
//! # Lock order
//! 1. one shard lock (never two at once: stats and compact take them one
//!    after the other). Exceptions: `check_invariants` and `fork_prepare`
//!    hold all of them, taken in index order;
//! 2. the arena lock (inside `alloc_run`/`free_run`).
//!
//! Fork ([`Zpool::fork_prepare`]) takes every shard lock in index order,
//! then the arena lock once no thread is releasing a batch of freed pages
//! outside it (only `compact`'s flush does, with no shard lock held), and
//! keeps them all until `fork_parent` or `fork_child` releases them. The
//! pool has no helper thread to restart in the child. In the child the
//! locks are reset, as zsmalloc's are (its "# Locks").
//!
//! # Limits of the design
//! - A shard only allocates from its own pages: when the pool is at its
//!   limit, a malloc fails with `LimitReached` even if another shard has
//!   free space.
//! - Generations have 16 bits and tags 16 bits: a handle used after 65536
//!   reuses of its slot, or a handle of a pool created 65535 pools earlier,
//!   is not detected (it names a live object, never freed memory).
//! - Compaction (and malloc at the limit) may split a block over several
//!   free blocks, so those chains get longer; reads follow them at the cost
//!   of a few copies.
//! - Between compactions, holes malloc skipped (too small for a two-block
//!   chain) cost memory: the overhead after churn and before compaction is
//!   higher than with unlimited chains; after compaction it is the same.
//!
//! Pool-wide counters are atomics, read without locks.
//!
//! Compaction runs per shard under its lock, so a handle stays valid and
//! its bytes unchanged while blocks move: no reader can see a half-moved
//! object. `map_read` holds the shard lock while its closure runs.

use crate::sys::PageArena;
use crate::{check_size, CompactReport, Error, Handle, PoolStats, Zpool};
use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use uzswap_os::fork::{self, AfterFork, Side};
use uzswap_os::lock::Mutex;
use uzswap_os::PAGE_SIZE;

/// Allocation granularity: block offsets and lengths are multiples of it.
const GRAN: usize = 8;
/// Free lists: one per block length `k * GRAN`, `k` in `0..=PAGE_SIZE/GRAN`.
const NBUCKETS: usize = PAGE_SIZE / GRAN + 1;
/// Words of the non-empty free-list bitmap.
const NWORDS: usize = NBUCKETS.div_ceil(64);
/// "No block" in a chain link, and the owner of a free block.
const NIL: u32 = u32::MAX;
/// Most shards a pool may have (4 handle bits).
const MAX_SHARDS: usize = 16;
const SLOT_BITS: u32 = 28;
const GEN_BITS: u32 = 16;
const SHARD_BITS: u32 = 4;

/// Configuration of a [`XcfPool`].
#[derive(Clone, Debug)]
pub struct XcfConfig {
    /// Hard limit on pool bytes.
    pub limit_bytes: Option<u64>,
    /// Independent sub-pools, each with its own lock (1..=16).
    pub shards: usize,
}

impl Default for XcfConfig {
    fn default() -> Self {
        XcfConfig {
            limit_bytes: None,
            shards: 4,
        }
    }
}

/// Descriptor of one block (24 bytes).
///
/// Invariants (checked by `Shard::check`): following `pnext` from a page's
/// `first` visits its blocks in offset order, each starting where the one
/// before ends, the last ending at `PAGE_SIZE`; `pprev` is the reverse link;
/// two free blocks are never neighbours (they are merged).
#[derive(Clone, Copy, Debug)]
struct Block {
    /// Index in `Shard::pages`. Invalid when the descriptor is unused.
    page: u32,
    /// Byte offset in the page (multiple of GRAN).
    off: u16,
    /// Length in bytes (multiple of GRAN, 8..=4096).
    len: u16,
    /// Object slot owning the block, or NIL when free.
    owner: u32,
    /// Used block: next block of the owner's chain (NIL: last).
    /// Free block: its position in `free[len / GRAN]` while listed; invalid
    /// while compaction keeps it unlisted.
    link: u32,
    /// The block before this one in its page (NIL: the block at offset 0).
    pprev: u32,
    /// The block after this one in its page (NIL: the last block).
    pnext: u32,
}

/// One page of a shard.
#[derive(Clone, Copy, Debug, Default)]
struct Page {
    /// Address of the page; 0 when this table entry holds no page (then
    /// `used` and `first` are invalid).
    addr: usize,
    /// Bytes in used blocks. `used + free bytes of its blocks == PAGE_SIZE`.
    used: u32,
    /// The block at offset 0. It stays the same descriptor for the page's
    /// life: a split keeps the head, a merge keeps the lower block.
    first: u32,
}

/// One entry of the object table.
#[derive(Clone, Copy, Debug, Default)]
struct Obj {
    /// First block of the chain; invalid when `!live`.
    first: u32,
    /// Address and length of the first block's bytes, and of the second's
    /// if the chain has exactly two (else `tail_len` is 0): copies of what
    /// `Shard::ptr` gives, so a read of an object in one or two blocks (all
    /// of malloc's below the limit) touches neither descriptors nor the
    /// page table. Set by `Shard::cache_ends` after malloc and compaction,
    /// the only two that change a used chain.
    head: usize,
    tail: usize,
    head_len: u16,
    tail_len: u16,
    /// Size as requested; invalid when `!live`.
    size: u32,
    /// Generation, bumped on free; a handle carries the value at malloc.
    gen: u16,
    live: bool,
    /// Some byte of the object may be non-zero (it was written since
    /// malloc). A never-written object still reads as zeros, so free skips
    /// the wipe, as zsmalloc's does. Invalid when `!live`.
    written: bool,
}

/// An independent sub-pool. Every field is guarded by the shard's lock.
#[derive(Default)]
struct Shard {
    pages: Vec<Page>,
    /// Indexes of `pages` entries holding no page.
    free_page_ids: Vec<u32>,
    descs: Vec<Block>,
    /// Unused descriptor ids.
    free_descs: Vec<u32>,
    objs: Vec<Obj>,
    /// Unused object slots.
    free_slots: Vec<u32>,
    /// `free[k]`: ids of listed free blocks of length `k * GRAN`.
    free: Vec<Vec<u32>>,
    /// Bit k set iff `free[k]` is not empty.
    bits: [u64; NWORDS],
    /// Sum of the lengths of listed free blocks.
    free_bytes: usize,
    /// Live objects and their requested bytes.
    objects: u64,
    payload: u64,
    /// Blocks owned by objects.
    used_blocks: u64,
    /// Pages held by this shard.
    pages_held: u64,
}

/// A shard behind its lock, on cache lines of its own: two threads working
/// in two shards never write the same line.
#[repr(align(128))]
struct ShardLock(Mutex<Shard>);

impl std::ops::Deref for ShardLock {
    type Target = Mutex<Shard>;
    fn deref(&self) -> &Mutex<Shard> {
        &self.0
    }
}

/// Pool-wide counters shared by the shards.
struct PoolWide {
    arena: PageArena,
    pages_held: AtomicU64,
    /// Limit in bytes; u64::MAX means none.
    limit: AtomicU64,
}

impl PoolWide {
    fn take_page(&self) -> Result<NonNull<u8>, Error> {
        let limit = self.limit.load(Ordering::Relaxed);
        // Relaxed: the counter orders nothing else; two racing takers may
        // both see room for one page, and the add-then-check below refuses
        // the one that passes the limit.
        let held = self.pages_held.fetch_add(1, Ordering::Relaxed) + 1;
        if held.saturating_mul(PAGE_SIZE as u64) > limit {
            self.pages_held.fetch_sub(1, Ordering::Relaxed);
            return Err(Error::LimitReached { limit_bytes: limit });
        }
        match self.arena.alloc_run(1) {
            Ok(p) => Ok(p),
            Err(e) => {
                self.pages_held.fetch_sub(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// # Safety
    /// `addr` is a page from `take_page` that nothing refers to any more.
    unsafe fn give_page(&self, addr: usize) {
        let p = NonNull::new(addr as *mut u8).expect("page address is non-null");
        // SAFETY: per this function's contract.
        if let Some(b) = unsafe { self.arena.free_run(p, 1, true) } {
            self.arena.release(b);
        }
        self.pages_held.fetch_sub(1, Ordering::Relaxed);
    }
}

fn round_up(n: usize) -> usize {
    n.div_ceil(GRAN) * GRAN
}

impl Shard {
    fn new() -> Shard {
        Shard {
            free: (0..NBUCKETS).map(|_| Vec::new()).collect(),
            ..Shard::default()
        }
    }

    fn new_desc(&mut self, b: Block) -> u32 {
        if let Some(id) = self.free_descs.pop() {
            self.descs[id as usize] = b;
            id
        } else {
            self.descs.push(b);
            u32::try_from(self.descs.len() - 1).expect("descriptor table overflow")
        }
    }

    fn drop_desc(&mut self, id: u32) {
        self.descs[id as usize].owner = NIL;
        self.free_descs.push(id);
    }

    fn fl_insert(&mut self, b: u32) {
        let k = self.descs[b as usize].len as usize / GRAN;
        self.descs[b as usize].link =
            u32::try_from(self.free[k].len()).expect("free list overflow");
        self.free[k].push(b);
        self.bits[k / 64] |= 1 << (k % 64);
        self.free_bytes += k * GRAN;
    }

    fn fl_remove(&mut self, b: u32) {
        let d = self.descs[b as usize];
        let k = d.len as usize / GRAN;
        let pos = d.link as usize;
        let list = &mut self.free[k];
        debug_assert_eq!(list[pos], b);
        list.swap_remove(pos);
        if let Some(&moved) = list.get(pos) {
            self.descs[moved as usize].link = d.link;
        } else if list.is_empty() {
            self.bits[k / 64] &= !(1 << (k % 64));
        }
        self.free_bytes -= k * GRAN;
    }

    /// Smallest non-empty free list index `>= k`.
    fn find_at_least(&self, k: usize) -> Option<usize> {
        let mut w = k / 64;
        let mut mask = !0u64 << (k % 64);
        while w < NWORDS {
            let m = self.bits[w] & mask;
            if m != 0 {
                return Some(w * 64 + m.trailing_zeros() as usize);
            }
            w += 1;
            mask = !0;
        }
        None
    }

    /// Largest non-empty free list index.
    fn find_largest(&self) -> Option<usize> {
        (0..NWORDS)
            .rev()
            .find(|&w| self.bits[w] != 0)
            .map(|w| w * 64 + 63 - self.bits[w].leading_zeros() as usize)
    }

    /// Whether `len` bytes fit in at most two listed free blocks: one that
    /// holds them all, or the largest plus the best fit for the rest (what
    /// `take_blocks` then takes).
    fn fits_in_two(&self, len: usize) -> bool {
        let k = len / GRAN;
        if self.find_at_least(k).is_some() {
            return true;
        }
        let Some(big) = self.find_largest() else {
            return false;
        };
        match self.find_at_least(k - big) {
            Some(k2) if k2 < big => true,
            Some(_) => self.free[big].len() >= 2,
            None => false,
        }
    }

    fn add_page(&mut self, shared: &PoolWide) -> Result<(), Error> {
        let addr = shared.take_page()?.as_ptr() as usize;
        let pid = match self.free_page_ids.pop() {
            Some(p) => p,
            None => {
                self.pages.push(Page::default());
                u32::try_from(self.pages.len() - 1).expect("page table overflow")
            }
        };
        let b = self.new_desc(Block {
            page: pid,
            off: 0,
            len: PAGE_SIZE as u16,
            owner: NIL,
            link: NIL,
            pprev: NIL,
            pnext: NIL,
        });
        self.pages[pid as usize] = Page {
            addr,
            used: 0,
            first: b,
        };
        self.pages_held += 1;
        self.fl_insert(b);
        Ok(())
    }

    /// Takes `len` bytes (a multiple of GRAN, `<= free_bytes`) from the free
    /// lists for `owner`; returns the first and last block of the new chain.
    ///
    /// `lead` (a listed free block shorter than `len`, or NIL) is taken
    /// first. Then best fit: the smallest free block that holds the rest (an
    /// exact fit needs no split, the common case once the pool has churned);
    /// else the largest free block whole, and the rest again.
    fn take_blocks(&mut self, len: usize, owner: u32, lead: u32) -> (u32, u32) {
        debug_assert!(len <= self.free_bytes && len & (GRAN - 1) == 0);
        let (mut first, mut last) = (NIL, NIL);
        let mut rem = len;
        let mut lead = lead;
        while rem > 0 {
            let b = if lead != NIL {
                debug_assert!((self.descs[lead as usize].len as usize) < len);
                std::mem::replace(&mut lead, NIL)
            } else {
                let k = self
                    .find_at_least(rem / GRAN)
                    .or_else(|| self.find_largest())
                    .expect("free bytes cover the request");
                *self.free[k].last().expect("listed bucket is non-empty")
            };
            self.fl_remove(b);
            let d = self.descs[b as usize];
            let blen = d.len as usize;
            if blen > rem {
                // Split: b keeps the head, the tail becomes a new free block
                // linked in after b.
                let tail = self.new_desc(Block {
                    page: d.page,
                    off: d.off + rem as u16,
                    len: (blen - rem) as u16,
                    owner: NIL,
                    link: NIL,
                    pprev: b,
                    pnext: d.pnext,
                });
                if d.pnext != NIL {
                    self.descs[d.pnext as usize].pprev = tail;
                }
                let db = &mut self.descs[b as usize];
                db.pnext = tail;
                db.len = rem as u16;
                self.fl_insert(tail);
            }
            let take = blen.min(rem);
            let db = &mut self.descs[b as usize];
            db.owner = owner;
            db.link = NIL;
            self.pages[d.page as usize].used += take as u32;
            self.used_blocks += 1;
            if last == NIL {
                first = b;
            } else {
                self.descs[last as usize].link = b;
            }
            last = b;
            rem -= take;
        }
        (first, last)
    }

    fn ptr(&self, b: u32) -> (*mut u8, usize) {
        let d = self.descs[b as usize];
        (
            (self.pages[d.page as usize].addr + d.off as usize) as *mut u8,
            d.len as usize,
        )
    }

    /// Removes free block `gone` (the page neighbour after `keep`) from its
    /// page and gives its length to `keep`.
    fn absorb_next(&mut self, keep: u32, gone: u32) {
        let g = self.descs[gone as usize];
        if g.pnext != NIL {
            self.descs[g.pnext as usize].pprev = keep;
        }
        let k = &mut self.descs[keep as usize];
        k.pnext = g.pnext;
        k.len += g.len;
        self.drop_desc(gone);
    }

    /// Frees a used block: wipes it if its object was written, merges it
    /// with free neighbours, and gives its page back when the whole page is
    /// free.
    fn release_block(&mut self, shared: &PoolWide, b: u32, wipe: bool) {
        let (p, len) = self.ptr(b);
        if wipe {
            // SAFETY: the block lies inside a page this shard holds (blocks
            // tile their page) and we hold the shard lock, so nobody else
            // touches it.
            unsafe { std::ptr::write_bytes(p, 0, len) };
        }
        let d = self.descs[b as usize];
        let page = d.page as usize;
        self.pages[page].used -= len as u32;
        self.descs[b as usize].owner = NIL;
        self.used_blocks -= 1;
        let mut b = b;
        if d.pnext != NIL && self.descs[d.pnext as usize].owner == NIL {
            self.fl_remove(d.pnext);
            self.absorb_next(b, d.pnext);
        }
        if d.pprev != NIL && self.descs[d.pprev as usize].owner == NIL {
            self.fl_remove(d.pprev);
            self.absorb_next(d.pprev, b);
            b = d.pprev;
        }
        if self.descs[b as usize].len as usize == PAGE_SIZE {
            debug_assert_eq!(self.pages[page].first, b);
            self.drop_page(shared, page);
        } else {
            self.fl_insert(b);
        }
    }

    /// Gives a page back whose blocks are all free and unlisted.
    fn drop_page(&mut self, shared: &PoolWide, page: usize) {
        let mut b = self.pages[page].first;
        while b != NIL {
            let next = self.descs[b as usize].pnext;
            self.drop_desc(b);
            b = next;
        }
        let addr = std::mem::take(&mut self.pages[page]).addr;
        self.free_page_ids.push(page as u32);
        self.pages_held -= 1;
        // SAFETY: the page came from take_page; no block refers to it now
        // and we hold the shard lock, so nobody reads it.
        unsafe { shared.give_page(addr) };
    }

    fn malloc(&mut self, shared: &PoolWide, size: usize) -> Result<u32, Error> {
        let r = round_up(size);
        // The chain to start with: none, or the largest free block when a
        // fresh page must be added (it then holds the rest, so the chain has
        // two blocks and the old block, a page's tail when filling, is not
        // left behind).
        let mut lead = NIL;
        if !self.fits_in_two(r) {
            if let Some(k) = self.find_largest() {
                lead = *self.free[k].last().expect("listed bucket is non-empty");
            }
            // At the pool's limit the free space of the shard is used
            // however scattered it is.
            match self.add_page(shared) {
                Ok(()) => {}
                Err(Error::LimitReached { .. }) if self.free_bytes >= r => lead = NIL,
                Err(e) => return Err(e),
            }
        }
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                if self.objs.len() >= 1 << SLOT_BITS {
                    return Err(Error::OutOfMemory {
                        bytes: size,
                        errno: libc::ENOMEM,
                    });
                }
                self.objs.push(Obj::default());
                (self.objs.len() - 1) as u32
            }
        };
        let (first, _) = self.take_blocks(r, slot, lead);
        let o = &mut self.objs[slot as usize];
        o.first = first;
        o.size = size as u32;
        o.live = true;
        o.written = false;
        self.cache_ends(slot);
        self.objects += 1;
        self.payload += size as u64;
        Ok(slot)
    }

    fn free(&mut self, shared: &PoolWide, slot: u32) -> usize {
        let o = self.objs[slot as usize];
        let mut b = o.first;
        while b != NIL {
            let next = self.descs[b as usize].link;
            self.release_block(shared, b, o.written);
            b = next;
        }
        let e = &mut self.objs[slot as usize];
        e.live = false;
        e.gen = e.gen.wrapping_add(1) & ((1 << GEN_BITS) - 1) as u16;
        self.free_slots.push(slot);
        self.objects -= 1;
        self.payload -= o.size as u64;
        o.size as usize
    }

    /// Copies `data` (exactly the object's size) into the object and marks
    /// it written.
    fn write_locked(&mut self, slot: u32, data: &[u8]) {
        debug_assert_eq!(data.len(), self.objs[slot as usize].size as usize);
        self.objs[slot as usize].written = true;
        let mut off = 0;
        self.for_each_chunk(slot, |p, n| {
            // SAFETY: `p..p+n` is inside a block of this object in a page
            // the shard holds; the shard lock is held (we have `&mut self`);
            // `off + n <= size == data.len()`.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr().add(off), p, n) };
            off += n;
        });
    }

    /// The ends of `slot`'s chain as `Obj` caches them (see `Obj::head`).
    fn ends(&self, slot: u32) -> (usize, usize, u16, u16) {
        let o = &self.objs[slot as usize];
        let (head, head_len) = self.ptr(o.first);
        let second = self.descs[o.first as usize].link;
        let (tail, tail_len) = if second != NIL && self.descs[second as usize].link == NIL {
            self.ptr(second)
        } else {
            (std::ptr::null_mut(), 0)
        };
        (
            head as usize,
            tail as usize,
            head_len as u16,
            tail_len as u16,
        )
    }

    fn cache_ends(&mut self, slot: u32) {
        let (head, tail, head_len, tail_len) = self.ends(slot);
        let o = &mut self.objs[slot as usize];
        (o.head, o.tail, o.head_len, o.tail_len) = (head, tail, head_len, tail_len);
    }

    /// Calls `f(block bytes)` for each block of the object in order, with at
    /// most `size` bytes in total.
    fn for_each_chunk(&self, slot: u32, mut f: impl FnMut(*mut u8, usize)) {
        let o = self.objs[slot as usize];
        let (size, head_len) = (o.size as usize, o.head_len as usize);
        if head_len >= size {
            // One block holds it all: no descriptor to follow.
            f(o.head as *mut u8, size);
            return;
        }
        if o.tail_len != 0 {
            // Two blocks.
            f(o.head as *mut u8, head_len);
            f(o.tail as *mut u8, size - head_len);
            return;
        }
        let mut rem = o.size as usize;
        let mut b = o.first;
        while b != NIL && rem > 0 {
            let (p, len) = self.ptr(b);
            let n = len.min(rem);
            f(p, n);
            rem -= n;
            b = self.descs[b as usize].link;
        }
    }

    /// Moves every used block out of the sparsest pages whose data fits in
    /// the free space of the others; returns (objects moved, pages freed).
    fn compact(&mut self, shared: &PoolWide) -> (u64, u64) {
        let mut ids: Vec<usize> = (0..self.pages.len())
            .filter(|&p| self.pages[p].addr != 0 && (self.pages[p].used as usize) < PAGE_SIZE)
            .collect();
        ids.sort_by_key(|&p| self.pages[p].used);
        let mut outside = self.free_bytes;
        let mut src_used = 0usize;
        let mut src = Vec::new();
        for p in ids {
            let used = self.pages[p].used as usize;
            let free = PAGE_SIZE - used;
            if src_used + used + free > outside {
                break;
            }
            src_used += used;
            outside -= free;
            src.push(p);
        }
        if src.is_empty() {
            return (0, 0);
        }
        // Unlist the free blocks of the source pages so no block moves into
        // a page that is being emptied.
        for &p in &src {
            let mut b = self.pages[p].first;
            while b != NIL {
                if self.descs[b as usize].owner == NIL {
                    self.fl_remove(b);
                }
                b = self.descs[b as usize].pnext;
            }
        }
        let mut owners = Vec::new();
        for &p in &src {
            // Blocks move out of p one by one; the links of p's own blocks
            // are not touched meanwhile (take_blocks only takes listed
            // blocks, and p's are unlisted).
            let mut next_b = self.pages[p].first;
            while next_b != NIL {
                let b = next_b;
                let d = self.descs[b as usize];
                next_b = d.pnext;
                if d.owner == NIL {
                    continue;
                }
                let len = d.len as usize;
                let (first, last) = self.take_blocks(len, d.owner, NIL);
                let (from, _) = self.ptr(b);
                let mut off = 0;
                let mut nb = first;
                while nb != NIL {
                    let (to, n) = self.ptr(nb);
                    // SAFETY: source and destination are blocks of pages
                    // this shard holds, in different pages (sources are
                    // unlisted), so they do not overlap; `off + n <= len`
                    // since the new chain's lengths add up to `len`.
                    unsafe { std::ptr::copy_nonoverlapping(from.add(off), to, n) };
                    off += n;
                    nb = self.descs[nb as usize].link;
                }
                // Splice the new chain in place of b.
                self.descs[last as usize].link = d.link;
                let o = &mut self.objs[d.owner as usize];
                if o.first == b {
                    o.first = first;
                } else {
                    let mut q = o.first;
                    while self.descs[q as usize].link != b {
                        q = self.descs[q as usize].link;
                    }
                    self.descs[q as usize].link = first;
                }
                self.cache_ends(d.owner);
                self.descs[b as usize].owner = NIL;
                self.pages[p].used -= len as u32;
                self.used_blocks -= 1;
                owners.push(d.owner);
            }
            self.drop_page(shared, p);
        }
        owners.sort_unstable();
        owners.dedup();
        (owners.len() as u64, src.len() as u64)
    }

    fn largest_free(&self) -> usize {
        self.find_largest().map_or(0, |k| k * GRAN)
    }

    fn metadata_bytes(&self) -> usize {
        use std::mem::size_of;
        self.descs.capacity() * size_of::<Block>()
            + self.objs.capacity() * size_of::<Obj>()
            + self.pages.capacity() * size_of::<Page>()
            + self.free.iter().map(|l| l.capacity() * 4).sum::<usize>()
            + (self.free_descs.capacity()
                + self.free_slots.capacity()
                + self.free_page_ids.capacity())
                * 4
    }

    fn check(&self, s: usize) -> Result<(), String> {
        let mut seen = vec![false; self.descs.len()];
        let mut used_blocks = 0u64;
        let mut page_free_blocks = 0usize;
        let mut pages_held = 0u64;
        for (pi, p) in self.pages.iter().enumerate() {
            if p.addr == 0 {
                continue;
            }
            pages_held += 1;
            let mut off = 0usize;
            let mut used = 0usize;
            let mut prev_free = false;
            let (mut b, mut prev) = (p.first, NIL);
            while b != NIL {
                let d = self.descs[b as usize];
                if off >= PAGE_SIZE || std::mem::replace(&mut seen[b as usize], true) {
                    return Err(format!("shard {s} page {pi}: block list loops at {b}"));
                }
                if d.page as usize != pi || d.off as usize != off || d.pprev != prev {
                    return Err(format!(
                        "shard {s} page {pi}: block {b} at {}:{} (after {}) expected at {off} after {prev} (gap, overlap or bad link)",
                        d.page, d.off, d.pprev
                    ));
                }
                if d.len == 0 || d.len as usize & (GRAN - 1) != 0 {
                    return Err(format!("shard {s}: block {b} has length {}", d.len));
                }
                off += d.len as usize;
                if d.owner == NIL {
                    if prev_free {
                        return Err(format!(
                            "shard {s} page {pi}: adjacent free blocks not merged"
                        ));
                    }
                    prev_free = true;
                    page_free_blocks += 1;
                    let k = d.len as usize / GRAN;
                    if self.free[k].get(d.link as usize) != Some(&b) {
                        return Err(format!("shard {s}: free block {b} not in its free list"));
                    }
                    let (ptr, len) = self.ptr(b);
                    // SAFETY: the block lies in a page we hold (checked to
                    // tile it above); the caller holds the shard lock.
                    let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
                    if bytes.iter().any(|&x| x != 0) {
                        return Err(format!("shard {s}: free block {b} was not wiped"));
                    }
                } else {
                    prev_free = false;
                    used_blocks += 1;
                    used += d.len as usize;
                    let o = self.objs.get(d.owner as usize);
                    if !o.is_some_and(|o| o.live) {
                        return Err(format!(
                            "shard {s}: block {b} owned by dead slot {}",
                            d.owner
                        ));
                    }
                }
                prev = b;
                b = d.pnext;
            }
            if off != PAGE_SIZE {
                return Err(format!("shard {s} page {pi}: blocks cover {off} bytes"));
            }
            if used != p.used as usize {
                return Err(format!(
                    "shard {s} page {pi}: used {} but blocks hold {used}",
                    p.used
                ));
            }
            if used == 0 {
                return Err(format!("shard {s} page {pi}: empty page kept"));
            }
        }
        for &b in &self.free_descs {
            if std::mem::replace(&mut seen[b as usize], true) {
                return Err(format!("shard {s}: descriptor {b} both used and free"));
            }
        }
        if let Some(b) = seen.iter().position(|&x| !x) {
            return Err(format!("shard {s}: descriptor {b} leaked"));
        }
        let mut listed = 0usize;
        let mut free_bytes = 0usize;
        for (k, l) in self.free.iter().enumerate() {
            if (self.bits[k / 64] >> (k % 64)) & 1 != (!l.is_empty()) as u64 {
                return Err(format!("shard {s}: bitmap bit {k} wrong"));
            }
            for (i, &b) in l.iter().enumerate() {
                let d = self.descs[b as usize];
                if d.owner != NIL || d.len as usize != k * GRAN || d.link as usize != i {
                    return Err(format!("shard {s}: bad entry {b} in free list {k}"));
                }
                listed += 1;
                free_bytes += d.len as usize;
            }
        }
        if listed != page_free_blocks || free_bytes != self.free_bytes {
            return Err(format!(
                "shard {s}: free lists hold {listed} blocks/{free_bytes} B, pages {page_free_blocks}, counter {} B",
                self.free_bytes
            ));
        }
        let (mut objects, mut payload, mut chained) = (0u64, 0u64, 0u64);
        for (slot, o) in self.objs.iter().enumerate() {
            if !o.live {
                continue;
            }
            objects += 1;
            payload += o.size as u64;
            if (o.head, o.tail, o.head_len, o.tail_len) != self.ends(slot as u32) {
                return Err(format!("shard {s}: slot {slot} caches stale chain ends"));
            }
            let mut len = 0usize;
            let mut b = o.first;
            while b != NIL {
                let d = self.descs[b as usize];
                if d.owner as usize != slot {
                    return Err(format!(
                        "shard {s}: slot {slot} chain reaches block {b} of {}",
                        d.owner
                    ));
                }
                len += d.len as usize;
                chained += 1;
                if len > PAGE_SIZE {
                    return Err(format!("shard {s}: slot {slot} chain too long"));
                }
                if !o.written {
                    let (ptr, n) = self.ptr(b);
                    // SAFETY: the block is in a page this shard holds (the
                    // page walk above checked every listed block); the caller
                    // holds the shard lock.
                    let bytes = unsafe { std::slice::from_raw_parts(ptr, n) };
                    if bytes.iter().any(|&x| x != 0) {
                        return Err(format!(
                            "shard {s}: slot {slot} is marked unwritten but holds data"
                        ));
                    }
                }
                b = d.link;
            }
            if len != round_up(o.size as usize) {
                return Err(format!(
                    "shard {s}: slot {slot} of {} B has {len} B of blocks",
                    o.size
                ));
            }
        }
        if self.free_slots.len() + objects as usize != self.objs.len() {
            return Err(format!("shard {s}: object slots leaked"));
        }
        if chained != used_blocks || used_blocks != self.used_blocks {
            return Err(format!(
                "shard {s}: chains hold {chained} blocks, pages {used_blocks}, counter {}",
                self.used_blocks
            ));
        }
        if objects != self.objects || payload != self.payload || pages_held != self.pages_held {
            return Err(format!("shard {s}: counters objects/payload/pages drifted"));
        }
        Ok(())
    }
}

thread_local! {
    /// Bounce buffer of `map_read` for objects split over several blocks.
    static BOUNCE: RefCell<Box<[u8; PAGE_SIZE]>> = RefCell::new(Box::new([0; PAGE_SIZE]));
    /// This thread's preferred shard (taken round robin on first use).
    static SHARD_HINT: Cell<usize> = const { Cell::new(usize::MAX) };
}

static NEXT_TAG: AtomicU64 = AtomicU64::new(0);
static NEXT_HINT: AtomicUsize = AtomicUsize::new(0);

/// The scatter-gather pool; see the module documentation.
pub struct XcfPool {
    shards: Box<[ShardLock]>,
    shared: PoolWide,
    /// Per-pool handle tag (1..=65535).
    tag: u64,
    compactions: AtomicU64,
    objects_moved: AtomicU64,
    pages_compacted: AtomicU64,
    /// Mallocs refused because the size was outside 1..=4096.
    refused_size: AtomicU64,
    /// Mallocs refused because a new page would pass the limit.
    refused_limit: AtomicU64,
    /// Mallocs refused because the OS gave no page (or the slot table of a
    /// shard is full).
    refused_oom: AtomicU64,
}

impl XcfPool {
    /// Creates a pool.
    pub fn new(config: XcfConfig) -> Result<XcfPool, Error> {
        if !(1..=MAX_SHARDS).contains(&config.shards) {
            return Err(Error::Config(format!(
                "xcf shards must be 1..={MAX_SHARDS}, got {}",
                config.shards
            )));
        }
        Ok(XcfPool {
            shards: (0..config.shards)
                .map(|_| ShardLock(Mutex::new(Shard::new())))
                .collect(),
            shared: PoolWide {
                arena: PageArena::new(),
                pages_held: AtomicU64::new(0),
                limit: AtomicU64::new(config.limit_bytes.unwrap_or(u64::MAX)),
            },
            tag: NEXT_TAG.fetch_add(1, Ordering::Relaxed) % 0xffff + 1,
            compactions: AtomicU64::new(0),
            objects_moved: AtomicU64::new(0),
            pages_compacted: AtomicU64::new(0),
            refused_size: AtomicU64::new(0),
            refused_limit: AtomicU64::new(0),
            refused_oom: AtomicU64::new(0),
        })
    }

    fn encode(&self, shard: usize, gen: u16, slot: u32) -> Handle {
        let raw = (self.tag << (SLOT_BITS + GEN_BITS + SHARD_BITS))
            | ((shard as u64) << (SLOT_BITS + GEN_BITS))
            | ((gen as u64) << SLOT_BITS)
            | slot as u64;
        Handle::from_raw(raw).expect("tag is non-zero")
    }

    /// Locks the handle's shard and checks the handle; returns the guard
    /// and the slot.
    fn lookup(&self, h: Handle) -> Result<(uzswap_os::lock::MutexGuard<'_, Shard>, u32), Error> {
        let raw = h.to_raw();
        let tag = raw >> (SLOT_BITS + GEN_BITS + SHARD_BITS);
        let shard = ((raw >> (SLOT_BITS + GEN_BITS)) & ((1 << SHARD_BITS) - 1)) as usize;
        if tag != self.tag || shard >= self.shards.len() {
            return Err(Error::ForeignHandle(raw));
        }
        let gen = ((raw >> SLOT_BITS) & ((1 << GEN_BITS) - 1)) as u16;
        let slot = (raw & ((1 << SLOT_BITS) - 1)) as u32;
        let g = self.shards[shard].lock();
        match g.objs.get(slot as usize) {
            Some(o) if o.live && o.gen == gen => Ok((g, slot)),
            _ => Err(Error::StaleHandle(raw)),
        }
    }

    /// Allocates in this thread's home shard and returns the handle with
    /// the shard still locked, so the caller can fill the object first.
    fn malloc_locked(
        &self,
        size: usize,
    ) -> Result<(Handle, uzswap_os::lock::MutexGuard<'_, Shard>, u32), Error> {
        if let Err(e) = check_size(size) {
            self.refused_size.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        let s = self.home_shard();
        let mut g = self.shards[s].lock();
        let slot = g.malloc(&self.shared, size).inspect_err(|e| {
            let c = match e {
                Error::LimitReached { .. } => &self.refused_limit,
                _ => &self.refused_oom,
            };
            c.fetch_add(1, Ordering::Relaxed);
        })?;
        let gen = g.objs[slot as usize].gen;
        Ok((self.encode(s, gen, slot), g, slot))
    }

    /// Releases every lock `fork_prepare` took, innermost first.
    ///
    /// # Safety
    /// As [`AfterFork::after_fork`]: this thread took them all in
    /// `fork_prepare` and kept them; with `Side::Child`, it is the only
    /// thread of the process.
    unsafe fn release_after_fork(&self, side: Side) {
        // SAFETY: forwarded from this function's contract; nothing here uses
        // what the locks guard.
        unsafe {
            self.shared.arena.unlock_after_fork(side);
            for s in self.shards.iter().rev() {
                s.0.after_fork(side);
            }
        }
    }

    fn home_shard(&self) -> usize {
        SHARD_HINT.with(|c| {
            let mut v = c.get();
            if v == usize::MAX {
                v = NEXT_HINT.fetch_add(1, Ordering::Relaxed);
                c.set(v);
            }
            v % self.shards.len()
        })
    }
}

impl Zpool for XcfPool {
    fn name(&self) -> &'static str {
        "xcf"
    }

    fn malloc(&self, size: usize) -> Result<Handle, Error> {
        self.malloc_locked(size).map(|(h, _, _)| h)
    }

    /// One lock for both steps (a store's common path).
    fn malloc_write(&self, data: &[u8]) -> Result<Handle, Error> {
        let (h, mut g, slot) = self.malloc_locked(data.len())?;
        g.write_locked(slot, data);
        Ok(h)
    }

    fn free(&self, handle: Handle) -> Result<usize, Error> {
        let (mut g, slot) = self.lookup(handle)?;
        Ok(g.free(&self.shared, slot))
    }

    fn object_size(&self, handle: Handle) -> Result<usize, Error> {
        let (g, slot) = self.lookup(handle)?;
        Ok(g.objs[slot as usize].size as usize)
    }

    fn write(&self, handle: Handle, data: &[u8]) -> Result<(), Error> {
        let (mut g, slot) = self.lookup(handle)?;
        let size = g.objs[slot as usize].size as usize;
        if data.len() != size {
            return Err(Error::BadBuffer {
                got: data.len(),
                object: size,
                what: "write needs a buffer of exactly the object's size",
            });
        }
        g.write_locked(slot, data);
        Ok(())
    }

    fn read(&self, handle: Handle, buf: &mut [u8]) -> Result<usize, Error> {
        let (g, slot) = self.lookup(handle)?;
        let size = g.objs[slot as usize].size as usize;
        if buf.len() < size {
            return Err(Error::BadBuffer {
                got: buf.len(),
                object: size,
                what: "read needs a buffer at least the object's size",
            });
        }
        let mut off = 0;
        g.for_each_chunk(slot, |p, n| {
            // SAFETY: as in write; `buf` has room for `size >= off + n`.
            unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr().add(off), n) };
            off += n;
        });
        Ok(size)
    }

    fn map_read(&self, handle: Handle, f: &mut dyn FnMut(&[u8])) -> Result<(), Error> {
        let (g, slot) = self.lookup(handle)?;
        let o = g.objs[slot as usize];
        let size = o.size as usize;
        if o.head_len as usize >= size {
            let p = o.head as *const u8;
            // SAFETY: the single block holds the whole object inside a page
            // the shard holds; the lock (held until after `f`) keeps it from
            // moving or being freed, and nobody writes it meanwhile.
            let bytes = unsafe { std::slice::from_raw_parts(p, size) };
            f(bytes);
            return Ok(());
        }
        BOUNCE.with(|cell| {
            let mut buf = cell.borrow_mut();
            let mut off = 0;
            g.for_each_chunk(slot, |p, n| {
                // SAFETY: as in read; the bounce buffer holds PAGE_SIZE >= size.
                unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr().add(off), n) };
                off += n;
            });
            f(&buf[..size]);
        });
        Ok(())
    }

    fn compact(&self) -> CompactReport {
        let mut r = CompactReport::default();
        for s in self.shards.iter() {
            let (moved, freed) = s.lock().compact(&self.shared);
            r.objects_moved += moved;
            r.pages_freed += freed;
        }
        self.shared.arena.flush();
        self.compactions.fetch_add(1, Ordering::Relaxed);
        self.objects_moved
            .fetch_add(r.objects_moved, Ordering::Relaxed);
        self.pages_compacted
            .fetch_add(r.pages_freed, Ordering::Relaxed);
        r
    }

    fn stats(&self) -> PoolStats {
        let (mut objects, mut payload, mut meta, mut descs, mut blocks) = (0, 0, 0, 0, 0);
        let (mut free_bytes, mut free_blocks, mut largest, mut chained) = (0, 0, 0, 0);
        let (releasing, batches) = self.shared.arena.releasing_pages();
        for s in self.shards.iter() {
            let g = s.lock();
            objects += g.objects;
            payload += g.payload;
            meta += g.metadata_bytes() as u64;
            descs += (g.descs.len() - g.free_descs.len()) as u64;
            blocks += g.used_blocks;
            free_bytes += g.free_bytes as u64;
            free_blocks += g.free.iter().map(|l| l.len() as u64).sum::<u64>();
            largest = largest.max(g.largest_free() as u64);
            chained += g
                .objs
                .iter()
                .filter(|o| o.live && g.descs[o.first as usize].link != NIL)
                .count() as u64;
        }
        let pages = self.shared.pages_held.load(Ordering::Relaxed);
        let limit = self.shared.limit.load(Ordering::Relaxed);
        PoolStats {
            allocator: "xcf",
            classes: Vec::new(),
            pages_held: pages,
            pool_bytes: pages * PAGE_SIZE as u64,
            objects,
            payload_bytes: payload,
            metadata_bytes: meta + self.shared.arena.metadata_bytes() as u64,
            limit_bytes: (limit != u64::MAX).then_some(limit),
            compactions: self.compactions.load(Ordering::Relaxed),
            objects_moved: self.objects_moved.load(Ordering::Relaxed),
            pages_compacted: self.pages_compacted.load(Ordering::Relaxed),
            extra: vec![
                ("shards".into(), self.shards.len() as u64),
                ("releasing_pages".into(), releasing),
                ("release_batches".into(), batches),
                ("descriptors".into(), descs),
                ("blocks".into(), blocks),
                ("free_blocks".into(), free_blocks),
                ("free_bytes".into(), free_bytes),
                ("largest_free_block".into(), largest),
                ("chained_objects".into(), chained),
                (
                    "refused_size".into(),
                    self.refused_size.load(Ordering::Relaxed),
                ),
                (
                    "refused_limit".into(),
                    self.refused_limit.load(Ordering::Relaxed),
                ),
                (
                    "refused_oom".into(),
                    self.refused_oom.load(Ordering::Relaxed),
                ),
            ],
        }
    }

    fn pool_bytes(&self) -> u64 {
        self.shared.pages_held.load(Ordering::Relaxed) * PAGE_SIZE as u64
    }

    fn set_limit(&self, limit_bytes: Option<u64>) {
        self.shared
            .limit
            .store(limit_bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn check_invariants(&self) -> Result<(), String> {
        // All shard locks at once, in index order (the one exception to
        // "one shard lock at a time"; nothing else takes two, so this cannot
        // deadlock). Pages are taken and given back only under a shard lock,
        // so with every shard locked the pool counter is exact.
        let guards: Vec<_> = self.shards.iter().map(|s| s.lock()).collect();
        let mut pages = 0;
        for (i, g) in guards.iter().enumerate() {
            g.check(i)?;
            pages += g.pages_held;
        }
        let held = self.shared.pages_held.load(Ordering::Relaxed);
        if pages != held {
            return Err(format!(
                "shards hold {pages} pages, pool counter says {held}"
            ));
        }
        Ok(())
    }

    /// Every shard lock in index order, then the arena lock once no batch
    /// of freed pages is in flight (a thread releasing one holds no shard
    /// lock, so it finishes while the arena lock is let go and retaken).
    fn fork_prepare(&self) {
        fork::check_supported();
        for s in self.shards.iter() {
            std::mem::forget(s.lock());
        }
        loop {
            let a = self.shared.arena.lock_for_fork();
            if a.in_flight_pages() == 0 {
                a.keep();
                return;
            }
            drop(a);
            std::thread::yield_now();
        }
    }

    unsafe fn fork_parent(&self) {
        // SAFETY: the caller ran fork_prepare on this thread, in the parent.
        unsafe { self.release_after_fork(Side::Parent) };
    }

    /// No helper thread to restart: releasing the locks is all.
    unsafe fn fork_child(&self) {
        // SAFETY: the caller ran fork_prepare on this thread, and this is
        // the child, where the thread is alone.
        unsafe { self.release_after_fork(Side::Child) };
    }
}
