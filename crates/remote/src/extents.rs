//! The store's map of slots to extents (the crate's docs, "Extents"):
//! bookkeeping only, no I/O. [`Extents`] lives under the store's `index`
//! lock; every method is a few steps over vectors and a hash map.

use std::collections::HashMap;

/// Pages per extent at most: a write of more adjacent slots goes out as
/// several extents. 16 pages (64 KiB values): on loopback a server
/// stores about 4× more 4 KiB pages per second this way than one key per
/// page, while a page freed early keeps at most 15 others' worth of
/// server memory held.
pub const EXTENT_PAGES: usize = 16;

/// Where a slot's page is on the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// The extent (its key's last part).
    pub extent: u64,
    /// The page's index in the extent's value.
    pub index: u32,
    /// The extent's pages.
    pub pages: u32,
}

/// One extent a write sends: `pages` pages for slots `first..`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NewExtent {
    pub id: u64,
    pub first: u64,
    pub pages: u32,
}

/// Which extent each slot's page is in, and which extents the server holds.
#[derive(Debug)]
pub struct Extents {
    /// Per slot: `extent << 8 | index`, or 0 for none (ids start at 1).
    slots: Vec<u64>,
    /// Per extent held: (slots that refer to it, its pages, when its
    /// time-to-live was last set, in the caller's seconds).
    refs: HashMap<u64, (u32, u32, u32)>,
    /// Extents no slot refers to any more, not yet unlinked.
    dead: Vec<u64>,
    /// The next extent id.
    next: u64,
    /// Slots that refer to an extent.
    live_pages: u64,
    /// Pages of the extents held (referred to, or dead and not unlinked).
    held_pages: u64,
}

impl Default for Extents {
    fn default() -> Self {
        Extents {
            slots: Vec::new(),
            refs: HashMap::new(),
            dead: Vec::new(),
            next: 1,
            live_pages: 0,
            held_pages: 0,
        }
    }
}

const INDEX_BITS: u32 = 8;
const _: () = assert!(EXTENT_PAGES <= 1 << INDEX_BITS);

impl Extents {
    /// Records a write of `n` pages to slots `first..first + n`: each slot
    /// leaves the extent it was in (a slot written again), and the pages
    /// go out as new extents of up to [`EXTENT_PAGES`], returned in order.
    pub fn write(&mut self, first: u64, n: u64, now: u32) -> Vec<NewExtent> {
        self.forget(first, n);
        let end = (first + n) as usize;
        if self.slots.len() < end {
            self.slots.resize(end, 0);
        }
        let mut out = Vec::with_capacity((n as usize).div_ceil(EXTENT_PAGES));
        let mut slot = first;
        while slot < first + n {
            let pages = (first + n - slot).min(EXTENT_PAGES as u64) as u32;
            let id = self.next;
            self.next += 1;
            for i in 0..pages {
                self.slots[(slot + u64::from(i)) as usize] = id << INDEX_BITS | u64::from(i);
            }
            self.refs.insert(id, (pages, pages, now));
            self.live_pages += u64::from(pages);
            self.held_pages += u64::from(pages);
            out.push(NewExtent {
                id,
                first: slot,
                pages,
            });
            slot += u64::from(pages);
        }
        out
    }

    /// Where slot `slot`'s page is, if it was written and not discarded.
    pub fn place(&self, slot: u64) -> Option<Place> {
        match self.slots.get(slot as usize) {
            Some(&v) if v != 0 => {
                let extent = v >> INDEX_BITS;
                Some(Place {
                    extent,
                    index: (v & ((1 << INDEX_BITS) - 1)) as u32,
                    pages: self.refs.get(&extent).expect("a slot's extent is held").1,
                })
            }
            _ => None,
        }
    }

    /// Slots `first..first + n` hold nothing from now on; an extent they
    /// leave empty is queued for unlinking.
    pub fn forget(&mut self, first: u64, n: u64) {
        let end = (first.saturating_add(n)).min(self.slots.len() as u64);
        for s in first..end {
            let Some(p) = self.place(s) else { continue };
            self.slots[s as usize] = 0;
            self.live_pages -= 1;
            let e = self
                .refs
                .get_mut(&p.extent)
                .expect("a slot's extent is held");
            e.0 -= 1;
            if e.0 == 0 {
                self.dead.push(p.extent);
            }
        }
    }

    /// The extents to unlink now (no slot refers to them): they count as
    /// gone from here on.
    pub fn take_dead(&mut self) -> Vec<u64> {
        for id in &self.dead {
            let (_, pages, _) = self.refs.remove(id).expect("a dead extent is held");
            self.held_pages -= u64::from(pages);
        }
        std::mem::take(&mut self.dead)
    }

    /// Every extent held, referred to or dead: the map is empty after.
    pub fn take_all(&mut self) -> Vec<u64> {
        let all = self.refs.keys().copied().collect();
        *self = Extents {
            next: self.next,
            ..Extents::default()
        };
        all
    }

    /// For a forked child: keeps only slots `0..end`, drops the dead
    /// extents (they are the parent's to unlink), and returns the extents
    /// still referred to, which the child copies into its own namespace.
    pub fn keep_below(&mut self, end: u64) -> Vec<u64> {
        let len = self.slots.len() as u64;
        if end < len {
            self.forget(end, len - end);
            self.slots.truncate(end as usize);
        }
        let _ = self.take_dead();
        let mut ids: Vec<u64> = self.refs.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// The extents some slot refers to whose time-to-live was set at
    /// `before` or earlier: the caller sets it again, so they count as set
    /// at `now`.
    pub fn refresh(&mut self, before: u32, now: u32) -> Vec<u64> {
        let mut out = Vec::new();
        for (&id, e) in self.refs.iter_mut() {
            if e.0 > 0 && e.2 <= before {
                e.2 = now;
                out.push(id);
            }
        }
        out
    }

    /// (Slots that refer to an extent, pages of the extents held.)
    pub fn pages(&self) -> (u64, u64) {
        (self.live_pages, self.held_pages)
    }

    /// Bytes of this map itself.
    pub fn heap_bytes(&self) -> u64 {
        (self.slots.capacity() * 8 + self.refs.capacity() * 28 + self.dead.capacity() * 8) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_write_is_cut_into_extents() {
        let mut x = Extents::default();
        let e = x.write(10, 40, 0);
        assert_eq!(
            e,
            [
                NewExtent {
                    id: 1,
                    first: 10,
                    pages: 16
                },
                NewExtent {
                    id: 2,
                    first: 26,
                    pages: 16
                },
                NewExtent {
                    id: 3,
                    first: 42,
                    pages: 8
                },
            ]
        );
        assert_eq!(
            x.place(10),
            Some(Place {
                extent: 1,
                index: 0,
                pages: 16
            })
        );
        assert_eq!(
            x.place(27),
            Some(Place {
                extent: 2,
                index: 1,
                pages: 16
            })
        );
        assert_eq!(
            x.place(49),
            Some(Place {
                extent: 3,
                index: 7,
                pages: 8
            })
        );
        assert_eq!(x.place(9), None);
        assert_eq!(x.place(50), None);
        assert_eq!(x.pages(), (40, 40));
    }

    #[test]
    fn an_extent_dies_when_its_last_slot_leaves() {
        let mut x = Extents::default();
        x.write(0, 4, 0);
        x.forget(0, 3);
        assert!(x.take_dead().is_empty(), "slot 3 still refers to it");
        assert_eq!(x.pages(), (1, 4));
        // Written again: the slot leaves extent 1 for extent 2.
        assert_eq!(x.write(3, 1, 0)[0].id, 2);
        assert_eq!(x.take_dead(), [1]);
        assert_eq!(x.pages(), (1, 1));
        assert_eq!(
            x.place(3),
            Some(Place {
                extent: 2,
                index: 0,
                pages: 1
            })
        );
        assert_eq!(x.take_dead(), Vec::<u64>::new());
        // Forgetting a slot twice, or one never written, changes nothing.
        x.forget(0, 100);
        x.forget(0, 100);
        assert_eq!(x.take_dead(), [2]);
        assert_eq!(x.pages(), (0, 0));
    }

    #[test]
    fn only_extents_in_use_and_stale_are_refreshed() {
        let mut x = Extents::default();
        x.write(0, 1, 10); // extent 1, set at 10
        x.write(1, 1, 20); // extent 2, set at 20
        x.write(2, 1, 5); // extent 3, set at 5, then unused
        x.forget(2, 1);
        let mut r = x.refresh(15, 30);
        r.sort_unstable();
        assert_eq!(r, [1]);
        assert_eq!(x.refresh(15, 30), Vec::<u64>::new(), "set again at 30");
        let mut r = x.refresh(31, 40);
        r.sort_unstable();
        assert_eq!(r, [1, 2]);
    }

    #[test]
    fn ids_are_never_reused() {
        let mut x = Extents::default();
        x.write(0, 1, 0);
        let all = x.take_all();
        assert_eq!(all, [1]);
        assert_eq!(x.pages(), (0, 0));
        assert_eq!(x.write(0, 1, 0)[0].id, 2);
    }

    #[test]
    fn a_forked_child_keeps_the_slots_below_its_end() {
        let mut x = Extents::default();
        x.write(0, 16, 0); // extent 1
        x.write(16, 16, 0); // extent 2
        x.write(32, 4, 0); // extent 3
        x.forget(0, 16); // extent 1 dead: the parent's to unlink
        assert_eq!(x.keep_below(20), [2]);
        assert_eq!(
            x.place(19),
            Some(Place {
                extent: 2,
                index: 3,
                pages: 16
            })
        );
        assert_eq!(x.place(20), None);
        assert_eq!(x.place(33), None);
        assert_eq!(x.pages(), (4, 16));
        assert!(x.take_dead().is_empty());
    }
}
