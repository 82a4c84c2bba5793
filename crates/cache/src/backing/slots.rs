//! Free-slot bookkeeping of the backing tier: which slots are used, and
//! runs of adjacent free ones for writeback batches.

use std::collections::BTreeMap;

/// Free-slot bookkeeping: free extents (start → length) below `end`, the
/// first never-used slot. Allocation prefers one extent that holds the whole
/// run, then the end of the file, then pieces.
///
/// Slots are numbered from `base`, the current file's first slot (see
/// [`FileBacking`](super::FileBacking), "A fork shares the file"):
/// [`SlotMap::rebase`] starts a new file's numbering.
#[derive(Debug, Default)]
pub struct SlotMap {
    free: BTreeMap<u64, u64>,
    base: u64,
    end: u64,
    capacity: Option<u64>,
    used: u64,
}

impl SlotMap {
    pub fn new(capacity: Option<u64>) -> SlotMap {
        SlotMap {
            capacity,
            ..SlotMap::default()
        }
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    /// Slots past the last used one are never read: the current file's
    /// high mark, in slots from its first.
    pub fn end(&self) -> u64 {
        self.end - self.base
    }

    /// The current file's first slot: slots below it are in files shared
    /// since a fork, which this map does not hand out.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Starts over for a new file whose first slot is `base` (at a fork,
    /// after the slots so far became shared): every slot below is
    /// forgotten.
    pub fn rebase(&mut self, base: u64) {
        debug_assert!(base >= self.end, "slot {base} is below the high mark");
        *self = SlotMap {
            base,
            end: base,
            capacity: self.capacity,
            ..SlotMap::default()
        };
    }

    /// Allocates up to `n` slots as runs `(first, len)`; fewer (possibly
    /// none) when the capacity is reached.
    pub fn alloc(&mut self, n: u64) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        let mut want = n;
        if let Some((&start, &len)) = self.free.iter().find(|(_, &len)| len >= want) {
            self.take_extent(start, len, want, &mut runs);
            want = 0;
        }
        if want > 0 {
            let room = self
                .capacity
                .map_or(u64::MAX, |c| c.saturating_sub(self.end - self.base));
            let tail = want.min(room);
            if tail > 0 {
                runs.push((self.end, tail));
                self.end += tail;
                self.used += tail;
                want -= tail;
            }
        }
        while want > 0 {
            let Some((&start, &len)) = self.free.iter().next() else {
                break;
            };
            let take = want.min(len);
            self.take_extent(start, len, take, &mut runs);
            want -= take;
        }
        runs
    }

    fn take_extent(&mut self, start: u64, len: u64, take: u64, runs: &mut Vec<(u64, u64)>) {
        self.free.remove(&start);
        if len > take {
            self.free.insert(start + take, len - take);
        }
        runs.push((start, take));
        self.used += take;
    }

    /// Returns a slot; merges it with free neighbours. Returns the merged
    /// extent so the caller may discard it.
    pub fn free(&mut self, slot: u64) -> (u64, u64) {
        debug_assert!(slot < self.end);
        self.used -= 1;
        let mut start = slot;
        let mut len = 1;
        if let Some((&s, &l)) = self.free.range(..slot).next_back() {
            debug_assert!(s + l <= slot, "slot {slot} freed twice");
            if s + l == slot {
                self.free.remove(&s);
                start = s;
                len += l;
            }
        }
        if let Some(l) = self.free.remove(&(slot + 1)) {
            len += l;
        }
        if start + len == self.end {
            // The tail shrinks back: the file's high mark falls.
            self.end = start;
        } else {
            self.free.insert(start, len);
        }
        (start, len)
    }

    /// Whether `slot` is allocated (for invariant checks).
    pub fn is_used(&self, slot: u64) -> bool {
        slot >= self.base
            && slot < self.end
            && self
                .free
                .range(..=slot)
                .next_back()
                .is_none_or(|(&s, &l)| slot >= s + l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_runs_are_adjacent_and_reused() {
        let mut m = SlotMap::new(None);
        assert_eq!(m.alloc(8), vec![(0, 8)]);
        for s in [2, 3, 4, 6] {
            m.free(s);
        }
        assert_eq!(m.used(), 4);
        // A run of 3 fits in the extent 2..5.
        assert_eq!(m.alloc(3), vec![(2, 3)]);
        // A run of 4 does not fit in 6..7: taken from the end.
        assert_eq!(m.alloc(4), vec![(8, 4)]);
        assert!(m.is_used(5) && !m.is_used(6) && m.is_used(11));
        for s in 0..12 {
            if s != 6 {
                m.free(s);
            }
        }
        assert_eq!((m.used(), m.end()), (0, 0), "everything merged back");
    }

    #[test]
    fn capacity_limits_and_pieces() {
        let mut m = SlotMap::new(Some(6));
        assert_eq!(m.alloc(4), vec![(0, 4)]);
        m.free(1);
        assert_eq!(m.alloc(4), vec![(4, 2), (1, 1)]);
        assert!(m.alloc(1).is_empty());
    }
}
