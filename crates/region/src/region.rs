//! [`Region`]: an anonymous mapping served by a [`crate::Pager`].

use crate::pager::{Owner, PageState};
use crate::sys::{self, PAGE_SIZE};
use std::sync::Arc;

/// An anonymous read-write mapping whose pages the pager keeps under its
/// budget. It behaves as ordinary memory for every thread, for system
/// calls too. Dropping it unmaps it and drops everything the store held for
/// it.
///
/// The memory is shared by raw pointer ([`Region::as_ptr`]); concurrent
/// access through it follows the usual rules for shared memory.
pub struct Region {
    owner: Arc<Owner>,
    area: u32,
    addr: usize,
    len: usize,
}

impl Region {
    pub(crate) fn new(owner: Arc<Owner>, area: u32, addr: usize, len: usize) -> Region {
        Region {
            owner,
            area,
            addr,
            len,
        }
    }

    /// Start of the mapping (page aligned). Valid until the region is
    /// dropped (or the program moves it with mremap).
    pub fn as_ptr(&self) -> *mut u8 {
        self.addr as *mut u8
    }

    /// The memory as a slice.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` readable and writable bytes for the
        // region's lifetime, and `&mut self` rules out other slices.
        unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), self.len) }
    }

    /// Length in bytes (a multiple of the page size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never: regions have at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pages in the region.
    pub fn pages(&self) -> usize {
        self.len / PAGE_SIZE
    }

    /// The area id: the first half of the region's keys in the store.
    pub fn area(&self) -> u32 {
        self.area
    }

    /// The pager's view of page `page`.
    pub fn page_state(&self, page: usize) -> Option<PageState> {
        self.owner.sh.page_state(self.area, page as u64)
    }

    /// Pages of this region the pager counts as resident.
    pub fn resident_pages(&self) -> usize {
        self.owner.sh.area_resident(self.area)
    }

    /// Pages of this region the kernel reports resident (`mincore`), the
    /// check of the budget against the real resident set: at most what the
    /// pager counts resident at the call.
    ///
    /// The kernel walks the range one page table at a time, taking each
    /// table's lock in turn: unsynchronised, a page that left behind the
    /// walk and another that came in ahead of it would both be counted (up
    /// to 135 for a budget of 128 with faults and evictions going on). So the
    /// walk runs under the pager's state lock, under which every page is
    /// mapped into a region: meanwhile pages only leave, and the count is
    /// at most what was resident when the call began.
    pub fn mincore_resident(&self) -> std::io::Result<usize> {
        self.owner
            .sh
            .while_nothing_maps(|| sys::mincore_count(self.addr, self.len))
    }

    /// Evicts the resident pages among `pages` now, on this thread.
    /// Returns the pages evicted (stored or dropped clean).
    pub fn evict(&self, pages: std::ops::Range<usize>) -> usize {
        self.owner
            .sh
            .evict_pages(self.area, pages.start as u64..pages.end as u64)
    }
}

impl Region {
    /// Makes the pages of the byte range `range` resident and writable,
    /// and keeps them so (the evictor leaves them) until the returned guard
    /// is dropped. With `PagerConfig::in_thread_faults`, a system call that
    /// reads or writes region memory fails with `EFAULT` unless the memory
    /// is pinned (the kernel cannot raise SIGBUS for its own access): pin
    /// what you hand to `read(2)`, `write(2)`, `recv(2)`... for the call.
    /// Pinned pages count against the budget and are brought back as a
    /// write would (their stored copies are dropped). Pinning a page the
    /// program then discards (`MADV_DONTNEED`) keeps nothing: the discard
    /// wins.
    pub fn pin(&self, range: std::ops::Range<usize>) -> Result<Pinned<'_>, PinError> {
        if range.start > range.end || range.end > self.len {
            return Err(PinError::OutOfRange {
                start: range.start,
                end: range.end,
                len: self.len,
            });
        }
        let pages = (range.start / PAGE_SIZE) as u64..range.end.div_ceil(PAGE_SIZE) as u64;
        let most = self.owner.sh.pin_limit();
        let n = (pages.end - pages.start) as usize;
        if n > most {
            return Err(PinError::TooLarge { pages: n, most });
        }
        self.owner.sh.pin(self.area, pages.clone());
        Ok(Pinned {
            region: self,
            pages,
        })
    }
}

/// Why [`Region::pin`] refused.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// The range is not inside the region.
    #[error("pin {start}..{end}: outside the region of {len} bytes")]
    OutOfRange {
        /// Start of the range asked for.
        start: usize,
        /// End of the range asked for.
        end: usize,
        /// The region's length.
        len: usize,
    },
    /// The range has more pages than one pin may hold (half the budget):
    /// pin a smaller part at a time.
    #[error("pin of {pages} pages: at most {most} (half the budget) at once; pin a smaller part at a time")]
    TooLarge {
        /// Pages asked for.
        pages: usize,
        /// The most one pin may hold.
        most: usize,
    },
}

/// Pages of a region kept resident (see [`Region::pin`]); dropping it lets
/// the evictor have them again.
pub struct Pinned<'a> {
    region: &'a Region,
    pages: std::ops::Range<u64>,
}

impl Pinned<'_> {
    /// The pinned pages (indexes in the region).
    pub fn pages(&self) -> std::ops::Range<usize> {
        self.pages.start as usize..self.pages.end as usize
    }
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        self.region
            .owner
            .sh
            .unpin(self.region.area, self.pages.clone());
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.owner.sh.drop_area(self.area);
    }
}

#[cfg(test)]
mod tests {
    /// A region moves between threads and is shared by reference without an
    /// `unsafe impl`: its fields (the owner handle, plain integers for the
    /// address) are `Send + Sync` themselves.
    #[test]
    fn region_is_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<super::Region>();
        send_sync::<crate::Pager>();
    }
}
