//! Reading ahead, for the file ([`super::FileBacking`]).
//!
//! A read of a slot outside the window read ahead asks the kernel to read
//! the [`FILE_READ_AROUND`] − 1 slots after it into the page cache
//! (`POSIX_FADV_WILLNEED`, which starts the reads and returns), then reads
//! its own slot; [`FILE_READ_AHEAD`] slots when it follows the slot read
//! last. A window that served no read halves the next one read around a
//! slot, down to the slot alone, and one that did doubles it back, as the
//! kernel sizes its swap readahead by its hits: a program that reads its
//! pages back at random asks the disk for no page it will not use. A read
//! that follows inside the window and finds half of it or less ahead asks
//! for the next window at once, so that reads in order find their slots
//! read before they ask, as the kernel's swap readahead starts a cluster's
//! reads and waits only for the page it needs. Pages written back together
//! lie in adjacent slots, and a program that reads its data again in order
//! faults them back one after another.
//!
//! What is read ahead is the file's own page cache, which writes, hole
//! punches and reads keep coherent: a page read from it is the slot's last
//! write, whatever the window's state, which is only a hint (threads that
//! race on it cost a read, never a wrong page). When the window moves, the
//! pages it leaves behind are dropped (`POSIX_FADV_DONTNEED`), so about
//! two windows of pages (a few dozen) are in the page cache for a file,
//! outside the budget; a page still being read when its window is dropped
//! stays until the kernel reclaims it.

/// Most slots one read of the file asks for when reads follow each other
/// (its own and those after it; see the module doc).
pub const FILE_READ_AHEAD: usize = 16;
/// Slots one read of the file asks for otherwise (the kernel's default
/// swap cluster, `vm.page-cluster` 3), at most.
pub const FILE_READ_AROUND: usize = 8;
/// Halvings of [`FILE_READ_AROUND`] that leave the slot alone.
const AROUND_SHORTEST: u32 = FILE_READ_AROUND.trailing_zeros();

/// The window read ahead: slots `lo..hi` were asked of the kernel; `next`
/// is one past the slot read last; `hit` is set once a read is served from
/// the window; `short` is how many times the window read around a slot has
/// been halved (see the module doc).
#[derive(Default, Debug, PartialEq)]
pub(super) struct Ahead {
    lo: u64,
    hi: u64,
    next: u64,
    hit: bool,
    short: u32,
}

/// What a read does besides reading its slot, decided under the lock and
/// done after it ([`Ahead::plan`]).
#[derive(Debug, PartialEq)]
pub(super) struct Plan {
    /// The slot is in the window read ahead.
    pub(super) ahead: bool,
    /// Slots to ask the kernel to read now.
    pub(super) fetch: std::ops::Range<u64>,
    /// Slots the window left behind, to drop from the page cache.
    pub(super) drop: [std::ops::Range<u64>; 2],
}

impl Ahead {
    /// Moves the window for a read of `slot` (see the module doc).
    pub(super) fn plan(&mut self, slot: u64) -> Plan {
        const AHEAD: u64 = FILE_READ_AHEAD as u64;
        let follows = self.next == slot && slot != 0;
        self.next = slot + 1;
        if (self.lo..self.hi).contains(&slot) {
            self.hit = true;
            if follows && self.hi - slot <= AHEAD / 2 {
                // Running out while following: the next window now, and
                // the slots read before this one leave.
                let fetch = self.hi..self.hi + AHEAD;
                let drop = if self.lo < slot { self.lo..slot } else { 0..0 };
                self.lo = slot;
                self.hi = fetch.end;
                return Plan {
                    ahead: true,
                    fetch,
                    drop: [drop, 0..0],
                };
            }
            return Plan {
                ahead: true,
                fetch: 0..0,
                drop: [0..0, 0..0],
            };
        }
        let n = if follows {
            AHEAD
        } else {
            // A window that served no read halves the next one read
            // around a slot, down to the slot alone; one that did doubles
            // it back.
            if self.lo < self.hi {
                self.short = if self.hit {
                    self.short.saturating_sub(1)
                } else {
                    (self.short + 1).min(AROUND_SHORTEST)
                };
            }
            FILE_READ_AROUND as u64 >> self.short
        };
        self.hit = false;
        let fetch = slot + 1..slot + n;
        // The old window less the new one: up to two pieces.
        let (lo, hi) = (self.lo, self.hi);
        let piece = |a: u64, b: u64| if a < b { a..b } else { 0..0 };
        let drop = [piece(lo, hi.min(fetch.start)), piece(lo.max(fetch.end), hi)];
        self.lo = fetch.start;
        self.hi = fetch.end;
        Plan {
            ahead: false,
            fetch,
            drop,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The window: a read outside it asks for the slots after it (more
    /// when it follows the last), a read in order that runs low asks for
    /// the next window, and what a window leaves behind is dropped.
    #[test]
    fn the_window_moves_ahead_of_reads_in_order_and_drops_what_it_leaves() {
        let mut a = Ahead::default();
        let p = a.plan(100);
        assert_eq!((p.ahead, p.fetch), (false, 101..108));
        assert_eq!(p.drop, [0..0, 0..0]);
        // In the window, following, half a window or less ahead: the
        // next window at once.
        let p = a.plan(101);
        assert_eq!((p.ahead, p.fetch), (true, 108..124));
        assert_eq!(p.drop, [0..0, 0..0]);
        // More than half a window ahead: nothing to do.
        for s in 102..116 {
            assert_eq!(
                a.plan(s),
                Plan {
                    ahead: true,
                    fetch: 0..0,
                    drop: [0..0, 0..0]
                }
            );
        }
        // Half or less again: the next window, and the slots read leave.
        let p = a.plan(116);
        assert_eq!((p.ahead, p.fetch), (true, 124..140));
        assert_eq!(p.drop, [101..116, 0..0]);
        assert_eq!((a.lo, a.hi), (116, 140));
        // A jump: a window around the new slot; the old one is dropped,
        // less what the new one holds again.
        let p = a.plan(210);
        assert_eq!((p.ahead, p.fetch), (false, 211..218));
        assert_eq!(p.drop, [116..140, 0..0]);
        // Overlapping windows (the old one served a read): only what the
        // new one does not hold leaves.
        assert!(a.plan(213).ahead);
        let p = a.plan(205);
        assert_eq!(p.fetch, 206..213);
        assert_eq!(p.drop, [0..0, 213..218]);
        // Outside the window, not following: a short one; following the
        // slot read last: a long one.
        let mut b = Ahead::default();
        assert_eq!(b.plan(130).fetch, 131..138);
        let p = b.plan(131);
        assert_eq!((p.ahead, p.fetch), (true, 138..154));
        assert_eq!((b.lo, b.hi), (131, 154));
        let mut c = Ahead {
            next: 40,
            ..Ahead::default()
        };
        assert_eq!(c.plan(40).fetch, 41..56);
    }

    /// Reads at random make the window read around a slot shorter, down
    /// to none; a window that serves a read makes it longer again.
    #[test]
    fn windows_that_serve_no_read_shrink_and_served_ones_grow() {
        let mut a = Ahead::default();
        let mut sizes = Vec::new();
        for s in [1000u64, 5000, 9000, 13000, 17000] {
            let p = a.plan(s);
            assert!(!p.ahead);
            sizes.push(p.fetch.end - p.fetch.start);
        }
        assert_eq!(sizes, vec![7, 3, 1, 0, 0]);
        // Reads in order still read ahead: a long window, which serves.
        assert_eq!(a.plan(17001).fetch, 17002..17017);
        assert!(a.plan(17002).ahead);
        // The next jump finds the window served: twice as long as before.
        assert_eq!(a.plan(30000).fetch, 30001..30002);
        assert!(a.plan(30001).ahead);
        let p = a.plan(40000);
        assert_eq!(p.fetch, 40001..40004);
        assert_eq!(p.drop, [30001..30018, 0..0]);
    }
}
