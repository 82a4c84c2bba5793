//! The managed address space: one `PROT_NONE` reservation from which every
//! anonymous private mapping of the program is served, in regions of the
//! pager made chunk by chunk as the program's mappings reach them.
//!
//! Invariants:
//! - every address handed out lies in an active chunk (a pager region), so
//!   its pages are under the budget and their faults reach the handler;
//! - `free` holds exactly the reusable ranges; a range is in at most one of
//!   `free`, handed out, or `retired`;
//! - a range freed by the program is `MADV_DONTNEED`ed before it is put
//!   back in `free`, so a later owner reads zeros (what mimalloc and
//!   `calloc` assume of fresh mappings);
//! - `retired` ranges were replaced by the program's own `MAP_FIXED`
//!   mappings; they are never handed out again.

use crate::ranges::Ranges;
use crate::sys;
use std::sync::{Mutex, MutexGuard, PoisonError};
use uzswap_contract::SpaceStats;
use uzswap_region::{Pager, Region, PAGE_SIZE};

/// Chunks are made into regions as the program reaches them: the pager
/// keeps 16 bytes per page of a region, in zeroed memory that is resident
/// only where pages were used, so a chunk's bookkeeping (up to 1 MiB)
/// grows with its use and costs nothing before.
pub const CHUNK: usize = 256 << 20;

thread_local! {
    /// The space's lock across a fork (`lock_for_fork`). A std mutex: a
    /// program thread that maps memory during the fork waits on the lock's
    /// own futex, never in a table that the child would inherit half
    /// updated.
    static FORK_GUARD: std::cell::RefCell<Option<MutexGuard<'static, Inner>>> =
        const { std::cell::RefCell::new(None) };
}

pub struct Space {
    start: usize,
    end: usize,
    pager: Pager,
    inner: Mutex<Inner>,
}

struct Inner {
    free: Ranges,
    retired: Ranges,
    active: Vec<bool>,
    /// Kept for the life of the process: a region's drop would unmap it.
    regions: Vec<Region>,
    mapped: usize,
    peak_mapped: usize,
    mmaps: u64,
    munmaps: u64,
    mremaps: u64,
    mremap_copies: u64,
    /// `MAP_FIXED` mappings served in place (`replace`).
    replaced: u64,
}

fn round_up(len: usize) -> Option<usize> {
    len.checked_add(PAGE_SIZE - 1).map(|l| l & !(PAGE_SIZE - 1))
}

impl Space {
    /// Reserves `reserve` bytes (rounded to chunks) of address space.
    pub fn new(pager: Pager, reserve: usize) -> std::io::Result<Space> {
        let len = reserve.div_ceil(CHUNK).max(1) * CHUNK;
        // One spare chunk so the start can be chunk aligned.
        let raw = sys::reserve(len + CHUNK)?;
        let start = (raw + CHUNK - 1) & !(CHUNK - 1);
        let mut free = Ranges::new();
        free.insert(start, start + len);
        Ok(Space {
            start,
            end: start + len,
            pager,
            inner: Mutex::new(Inner {
                free,
                retired: Ranges::new(),
                active: vec![false; len / CHUNK],
                regions: Vec::new(),
                mapped: 0,
                peak_mapped: 0,
                mmaps: 0,
                munmaps: 0,
                mremaps: 0,
                mremap_copies: 0,
                replaced: 0,
            }),
        })
    }

    /// Whether `addr` lies in the reservation (the test `free` uses).
    #[inline]
    pub fn owns(&self, addr: usize) -> bool {
        addr >= self.start && addr < self.end
    }

    /// Whether `addr..addr + len` touches the reservation.
    pub fn overlaps(&self, addr: usize, len: usize) -> bool {
        addr < self.end && addr.saturating_add(len) > self.start
    }

    fn contains(&self, addr: usize, len: usize) -> bool {
        addr >= self.start && addr.checked_add(len).is_some_and(|e| e <= self.end)
    }

    pub fn pager(&self) -> &Pager {
        &self.pager
    }

    /// Makes sure every chunk under `start..end` is a region. Called with
    /// the lock held; the caller is marked internal (region creation maps
    /// memory and must not come back here).
    fn activate(&self, inner: &mut Inner, start: usize, end: usize) -> Result<(), i32> {
        // Region creation maps memory and allocates: straight to the
        // kernel and glibc, not back into this space (whose lock we hold).
        let _internal = crate::InternalGuard::enter();
        let first = (start - self.start) / CHUNK;
        let last = (end - 1 - self.start) / CHUNK;
        for c in first..=last {
            if inner.active[c] {
                continue;
            }
            let addr = self.start + c * CHUNK;
            // SAFETY: the chunk is part of our reservation and has never
            // been handed out (inactive), so nothing uses its addresses.
            match unsafe { self.pager.region_at(addr, CHUNK) } {
                Ok(r) => {
                    inner.regions.push(r);
                    inner.active[c] = true;
                }
                Err(e) => {
                    sys::warn(&format!(
                        "cannot make a managed region ({e}); the allocation fails with ENOMEM"
                    ));
                    return Err(libc::ENOMEM);
                }
            }
        }
        Ok(())
    }

    /// `mmap` of an anonymous private mapping: `len` bytes with protection
    /// `prot`, from the reservation.
    pub fn map(&self, len: usize, prot: i32) -> Result<usize, i32> {
        let len = round_up(len).filter(|&l| l > 0).ok_or(libc::EINVAL)?;
        let at = {
            let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(at) = inner.free.take_first_fit(len, PAGE_SIZE) else {
                drop(inner);
                sys::warn(&format!(
                    "the managed address space ({} GiB) is exhausted; raise it with --reserve",
                    (self.end - self.start) >> 30
                ));
                return Err(libc::ENOMEM);
            };
            if let Err(e) = self.activate(&mut inner, at, at + len) {
                inner.free.insert(at, at + len);
                return Err(e);
            }
            inner.mapped += len;
            inner.peak_mapped = inner.peak_mapped.max(inner.mapped);
            inner.mmaps += 1;
            at
        };
        if prot != libc::PROT_READ | libc::PROT_WRITE {
            if let Err(e) = sys::protect(at, len, prot) {
                self.unmap(at, len).ok();
                return Err(e);
            }
        }
        Ok(at)
    }

    /// `munmap` of a range inside the reservation.
    pub fn unmap(&self, addr: usize, len: usize) -> Result<(), i32> {
        if !addr.is_multiple_of(PAGE_SIZE) {
            return Err(libc::EINVAL);
        }
        let len = round_up(len).filter(|&l| l > 0).ok_or(libc::EINVAL)?;
        if !self.contains(addr, len) {
            return Err(libc::EINVAL);
        }
        let end = addr + len;
        let retired = self
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retired
            .overlap(addr, end);
        // Put the reservation back under the program's own mappings; those
        // addresses stay retired.
        for &(s, e) in &retired {
            sys::reserve_at(s, e - s)?;
        }
        let mut live = Ranges::new();
        live.insert(addr, end);
        for &(s, e) in &retired {
            live.remove(s, e);
        }
        for (s, e) in live.overlap(addr, end) {
            // Discard first (the pager drops what it stored for these
            // pages), then make the range ordinary memory again, and only
            // then let anyone else have it.
            sys::discard(s, e - s)?;
            sys::protect(s, e - s, libc::PROT_READ | libc::PROT_WRITE)?;
        }
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        for (s, e) in live.overlap(addr, end) {
            let already: usize = inner.free.overlap(s, e).iter().map(|(a, b)| b - a).sum();
            inner.mapped -= (e - s - already).min(inner.mapped);
            inner.free.insert(s, e);
        }
        inner.munmaps += 1;
        Ok(())
    }

    /// `mmap(MAP_FIXED)` of an anonymous private mapping (`prot` within
    /// read and write) over a range the program holds of this space, as the
    /// JVM and Go commit and uncommit their heaps inside a reservation:
    /// served in place, the range staying a region. What the program asks
    /// for is a new zero-filled mapping with `prot`: the range is discarded
    /// (the pager drops what it stored for it) and given that protection.
    /// `Ok(false)`: not wholly held by the program (part of it free or
    /// retired), so the caller maps it for real and retires it.
    ///
    /// The space's lock is dropped before the discard (which waits for the
    /// handler to read its remove event); a `munmap` of the same range by
    /// another thread meanwhile is the program's own race, as it is with the
    /// kernel's `mmap`.
    pub fn replace(&self, addr: usize, len: usize, prot: i32) -> Result<bool, i32> {
        if !addr.is_multiple_of(PAGE_SIZE) {
            return Err(libc::EINVAL);
        }
        let len = round_up(len).filter(|&l| l > 0).ok_or(libc::EINVAL)?;
        if !self.contains(addr, len) {
            return Ok(false);
        }
        let end = addr + len;
        {
            let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            let first = (addr - self.start) / CHUNK;
            let last = (end - 1 - self.start) / CHUNK;
            let held = (first..=last).all(|c| inner.active[c])
                && inner.free.overlap(addr, end).is_empty()
                && inner.retired.overlap(addr, end).is_empty();
            if !held {
                return Ok(false);
            }
        }
        sys::discard(addr, len)?;
        sys::protect(addr, len, prot)?;
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replaced += 1;
        Ok(true)
    }

    /// `mmap(MAP_FIXED)` by the program over part of the reservation has
    /// replaced that part: never hand it out again.
    pub fn retire(&self, addr: usize, len: usize) {
        let end = addr.saturating_add(len).min(self.end);
        let addr = addr.max(self.start);
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let was_free: usize = inner
            .free
            .overlap(addr, end)
            .iter()
            .map(|(a, b)| b - a)
            .sum();
        inner.mapped -= (end - addr - was_free).min(inner.mapped);
        inner.free.remove(addr, end);
        inner.retired.insert(addr, end);
    }

    /// `mremap` of a range inside the reservation. Shrinks in place, grows
    /// in place when the pages after it are free, else (with `may_move`)
    /// copies into a new range.
    pub fn remap(
        &self,
        old: usize,
        old_len: usize,
        new_len: usize,
        may_move: bool,
    ) -> Result<usize, i32> {
        if !old.is_multiple_of(PAGE_SIZE) {
            return Err(libc::EINVAL);
        }
        let old_len = round_up(old_len).ok_or(libc::EINVAL)?;
        let new_len = round_up(new_len).filter(|&l| l > 0).ok_or(libc::EINVAL)?;
        if old_len == 0 || !self.contains(old, old_len) {
            return Err(libc::EINVAL);
        }
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .mremaps += 1;
        if new_len <= old_len {
            if new_len < old_len {
                self.unmap(old + new_len, old_len - new_len)?;
            }
            return Ok(old);
        }
        let (tail, tail_end) = (old + old_len, old + new_len);
        {
            let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
            if tail_end <= self.end && inner.free.contains(tail, tail_end) {
                inner.free.remove(tail, tail_end);
                if let Err(e) = self.activate(&mut inner, tail, tail_end) {
                    inner.free.insert(tail, tail_end);
                    return Err(e);
                }
                inner.mapped += tail_end - tail;
                inner.peak_mapped = inner.peak_mapped.max(inner.mapped);
                return Ok(old);
            }
        }
        if !may_move {
            return Err(libc::ENOMEM);
        }
        let new = self.map(new_len, libc::PROT_READ | libc::PROT_WRITE)?;
        // SAFETY: both ranges are mapped read-write for us (the old one by
        // the program's own mapping, which it hands over by calling
        // mremap), and they do not overlap (the new one was free).
        unsafe { std::ptr::copy_nonoverlapping(old as *const u8, new as *mut u8, old_len) };
        self.unmap(old, old_len)?;
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .mremap_copies += 1;
        Ok(new)
    }

    pub fn stats(&self) -> SpaceStats {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        SpaceStats {
            reserved_bytes: (self.end - self.start) as u64,
            mapped_bytes: inner.mapped as u64,
            peak_mapped_bytes: inner.peak_mapped as u64,
            active_chunks: inner.active.iter().filter(|&&a| a).count() as u64,
            mmaps: inner.mmaps,
            munmaps: inner.munmaps,
            mremaps: inner.mremaps,
            mremap_copies: inner.mremap_copies,
            fixed_in_place: inner.replaced,
            retired_bytes: inner.retired.total() as u64,
        }
    }

    /// Taken across `fork()` so the child never inherits it locked. The
    /// guard waits in a thread-local of the forking thread, which runs the
    /// parent or child hook too.
    pub fn lock_for_fork(&'static self) {
        let g = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        FORK_GUARD.with(|f| *f.borrow_mut() = Some(g));
    }

    /// Releases what `lock_for_fork` took (in the parent, or in the child
    /// of the fork that followed it).
    pub fn unlock_after_fork(&self) {
        FORK_GUARD.with(|f| f.borrow_mut().take());
    }
}
