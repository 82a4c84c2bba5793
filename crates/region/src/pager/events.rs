//! The program's own changes to region memory, as userfaultfd reports them:
//! remove (`MADV_DONTNEED`), unmap and remap events.

use super::state::{lookup, split_out, PageState};
use super::types::Wakes;
use super::PagerCore;
use crate::sys::PAGE_SIZE;

impl PagerCore {
    /// The program discarded `[start, end)` (remove or unmap event): what
    /// the store held for it goes, the pages read as zeros afterwards.
    /// With `own_check`, a remove we caused ourselves is recognised and
    /// skipped.
    pub(super) fn discard_range(&self, start: usize, end: usize, own_check: bool, w: &mut Wakes) {
        let mut wake = Vec::new();
        {
            let mut g = self.state.lock();
            let s = &mut *g;
            let mut addr = start & !(PAGE_SIZE - 1);
            while addr < end {
                let this = addr;
                addr += PAGE_SIZE;
                let own = s.own_at(this);
                if own_check && own.is_some_and(|k| s.own[k].take(this)) {
                    continue;
                }
                let Some((area, page)) = lookup(&s.segs, this) else {
                    continue;
                };
                let m = *s.meta(area, page);
                match m.st {
                    PageState::Absent => continue,
                    // A load in flight sees the page gone and throws its
                    // bytes away.
                    PageState::Stored
                    | PageState::Loading
                    | PageState::Clean
                    | PageState::Discarding => self.store.invalidate(area, page),
                    // The evictor sees the state change and drops what it
                    // stored itself.
                    PageState::Dirty | PageState::Evicting | PageState::EvictAborted => {}
                }
                if m.st.resident() {
                    s.leave(area, page);
                }
                let mm = s.meta(area, page);
                mm.st = PageState::Absent;
                // A page the evictor is about to drop stays parked until the
                // drop returned (the evictor wakes it; see `zapping` and
                // `OwnSpan`).
                if !mm.zapping && own.is_none() && std::mem::replace(&mut mm.parked, false) {
                    wake.push(this);
                }
                s.stats.discarded_pages += 1;
            }
        }
        for a in wake {
            w.wake(self, a, PAGE_SIZE);
        }
    }

    /// Drops the segments of an unmapped range.
    pub(super) fn forget_range(&self, start: usize, end: usize) {
        let mut s = self.state.lock();
        let moved = split_out(&mut s.segs, start, end);
        drop(moved);
    }

    /// `[from, from+len)` now lives at `to`: move the segments. Pages keep
    /// their `(area, page)` keys, so the store's entries move with them.
    pub(super) fn remap(&self, from: usize, to: usize, len: usize) {
        let mut s = self.state.lock();
        let moved = split_out(&mut s.segs, from, from + len);
        for (start, seg) in moved {
            s.segs.insert(to + (start - from), seg);
        }
        s.stats.remaps += 1;
    }
}
