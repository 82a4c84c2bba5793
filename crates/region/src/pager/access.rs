//! The access signal: which resident pages were used lately, reads
//! included, so that victims are chosen by use and not by arrival alone.
//!
//! The pager's lists see a page when it comes in (a fault) and when a
//! write hits a write-protected page; a page that the program only reads,
//! or writes while it is writable, looks unused to them however hot it is.
//! The kernel's reclaim reads the accessed bits of the page tables for
//! that. From user space the same bits are seen per mapping:
//! `clear_refs` clears them and `smaps` says how much of each mapping was
//! touched since (`sys::AccessScan`). To give that a useful resolution
//! the pager cuts its regions into chunks the kernel keeps as separate
//! mappings (`PagerConfig::access_chunk`, `sys::split_chunks`): before
//! each sample, what the program reached since the last one
//! (`PagerCore::split_reached`), as far as the map-count limit leaves
//! room (a quarter of it at most, with the program's own mappings).
//!
//! While a process evicts, the evictor samples (`PagerCore::sample_access`,
//! no pager lock held across the reading): it reads the report, clears the
//! bits, and then under the state lock (`State::apply_access`) weighs each
//! chunk. A page that came in during the window (a load maps it young, a
//! first touch is a use) says nothing of reuse (`PageMeta::came_in`), nor
//! does the first write to a page mapped as zeros (its chunk's `Rss:`
//! grows); what a chunk's `Referenced` count holds beyond those is *reuse*
//! of the pages that were resident before the window:
//! - reuse of at least a quarter of them: the chunk is in use, and its
//!   resident pages get a second chance (`PageMeta::referenced`, as a write
//!   gives): an inactive one goes to the active list instead of leaving, an
//!   active one round the active list once more instead of down;
//! - no reuse at all: the pages resident before the window, oldest chunks
//!   first, become the *cold queue*, which the victim choice takes from
//!   before the lists (`State::select`): a page on the active list that is
//!   no longer used leaves before an inactive one that is;
//! - anything between: the lists decide.
//!
//! A mapping larger than `MAX_CHUNKS` chunks (the program's own advice
//! merged chunks, or splitting was refused) says too little about each
//! page and is left to the lists. A sample costs a few milliseconds for
//! hundreds of mappings; the next comes no sooner than `COST_FACTOR`
//! times that cost later (at most 2 % of a CPU) and `MIN_PERIOD`. A window
//! older than `STALE` (eviction paused) would show every chunk touched: it
//! is cleared and read one period later. Where `/proc` cannot be read, or a
//! read fails, the lists alone choose, and `PagerStats::access_signal` says
//! which is in force.

use super::state::{lookup, PageMeta, PageState, QEntry, State};
use super::PagerCore;
use crate::sys::{self, Used, PAGE_SIZE};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A chunk whose pages from before the window were reused at least this
/// share (1 / `IN_USE`) is in use.
pub(super) const IN_USE: usize = 4;

/// A chunk whose pages were not reused in this many samples in a row is
/// cold: one window without reuse may be shorter than the program's reuse
/// distance.
pub(super) const COLD_AFTER: u8 = 2;

/// The shortest time between two samples.
pub(super) const MIN_PERIOD: Duration = Duration::from_millis(50);

/// The time between two samples is at least this many times the last
/// sample's cost: the sampler takes at most 1/50 of a CPU.
pub(super) const COST_FACTOR: u32 = 50;

/// A window older than this is cleared, not read (see the module doc).
pub(super) const STALE: Duration = Duration::from_secs(1);

/// Mappings larger than this many chunks are left to the lists.
pub(super) const MAX_CHUNKS: usize = 2;

/// What the samples found of a mapping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Seen {
    /// Samples in a row that found no reuse in it.
    pub(super) idle: u8,
    /// Its resident pages at the last sample (`Rss:`, which leaves out
    /// pages that map the zero page).
    pub(super) rss_pages: usize,
}

/// The evictor's view of what the program used (behind
/// `PagerCore::access`).
pub(super) struct AccessLook {
    scan: sys::AccessScan,
    /// What the last sample found of each mapping, by its start (with its
    /// end: a mapping whose bounds changed starts afresh).
    ages: BTreeMap<usize, (usize, Seen)>,
    /// When the bits were last cleared.
    cleared_at: Option<Instant>,
    /// No sample before this.
    next_at: Instant,
    /// The last report's mappings, with their ages (reused).
    used: Vec<(Used, Seen)>,
    /// A read or a clear failed: the lists alone choose from now on.
    failed: bool,
}

impl AccessLook {
    /// Opens the process's files; the error says why the signal is not
    /// in force.
    pub(super) fn new() -> std::io::Result<AccessLook> {
        Ok(AccessLook {
            scan: sys::AccessScan::new()?,
            ages: BTreeMap::new(),
            cleared_at: None,
            next_at: Instant::now(),
            used: Vec::new(),
            failed: false,
        })
    }

    /// In a forked child (its only thread, the fork hook): the files are
    /// the parent's; the child reads its own from now on, starting afresh.
    pub(super) fn renew(&mut self) -> std::io::Result<()> {
        self.scan.renew()?;
        self.ages.clear();
        self.cleared_at = None;
        Ok(())
    }
}

impl PagerCore {
    /// Cuts into chunks what the program has reached of each region since
    /// the last sample, and one chunk beyond (a region is one mapping until
    /// then: a mapping costs the report about 4 µs whether it holds pages or
    /// not, and a program reaches a fraction of the 256 MiB regions of
    /// `uzswap run`), as far as the map-count limit leaves room. Called by
    /// the sampler with no lock held; the state lock is taken to find the
    /// ranges, and the `madvise` calls are made after it is dropped: a range
    /// the program replaced meanwhile (`MAP_FIXED` over it) gets the advice
    /// too, which only tells the kernel's readahead that it has no locality.
    pub(super) fn split_reached(&self) {
        let chunk = self.cfg.access_chunk;
        let chunk_pages = (chunk / PAGE_SIZE) as u64;
        let mut ranges = Vec::new();
        {
            let mut s = self.state.lock();
            let mut todo = Vec::new();
            for (&id, ar) in s.areas.iter_mut() {
                let want = (ar.reached + chunk_pages)
                    .next_multiple_of(chunk_pages)
                    .min(ar.meta.len() as u64);
                if !ar.dying && want > ar.split {
                    todo.push((id, ar.split, want));
                    ar.split = want;
                }
            }
            for (id, from, to) in todo {
                for (&start, g) in s.segs.iter().filter(|(_, g)| g.area == id) {
                    let end = g.first + (g.len / PAGE_SIZE) as u64;
                    let (a, b) = (from.max(g.first), to.min(end));
                    if a < b {
                        let at = start + (a - g.first) as usize * PAGE_SIZE;
                        ranges.push((at, (b - a) as usize * PAGE_SIZE));
                    }
                }
            }
        }
        if ranges.is_empty() {
            return;
        }
        let chunks: usize = ranges.iter().map(|&(_, len)| len.div_ceil(chunk)).sum();
        let room = match sys::map_count() {
            Ok((have, max)) => have + chunks <= max / 4,
            Err(_) => false,
        };
        let mut made = 0;
        for &(at, len) in ranges.iter().filter(|_| room) {
            if sys::split_chunks(at, len, chunk).is_ok() {
                made += len.div_ceil(chunk);
            }
        }
        let mut s = self.state.lock();
        s.stats.access_chunks += made as u64;
        if !room {
            s.stats.access_unsplit_regions += ranges.len() as u64;
        }
    }

    /// A sample now, due or not (the test hook `Pager::sample_access_now`).
    #[cfg(feature = "testing")]
    pub(super) fn sample_access_now(&self) {
        if let Some(a) = &self.access {
            a.lock().next_at = Instant::now();
        }
        self.sample_access();
    }

    /// One sample of the access signal if one is due (see the module doc).
    /// Called by the evictor with no lock held; takes the access look,
    /// and the state lock inside it three times, briefly: for the bounds,
    /// for what to cut (`split_reached`), and to apply the reading. Between
    /// them the program runs on: what the reading finds is weighed against
    /// the records as they are when it is applied, and a cold entry is
    /// checked again when it is taken (`pop_cold`).
    pub(super) fn sample_access(&self) {
        let Some(look) = &self.access else {
            return;
        };
        let mut a = look.lock();
        let start = Instant::now();
        if a.failed || start < a.next_at {
            return;
        }
        let bounds = {
            let s = self.state.lock();
            let lo = s.segs.keys().next().copied();
            let hi = s.segs.iter().next_back().map(|(&k, g)| k + g.len);
            lo.zip(hi)
        };
        let Some((lo, hi)) = bounds else {
            return;
        };
        self.split_reached();
        let fresh = a.cleared_at.is_some_and(|t| t.elapsed() <= STALE);
        let mut used = std::mem::take(&mut a.used);
        used.clear();
        let read = if fresh {
            let a = &mut *a;
            let ages = &a.ages;
            a.scan
                .read(lo, hi, |u| {
                    let seen = match ages.get(&u.lo) {
                        Some(&(end, seen)) if end == u.hi => seen,
                        _ => Seen::default(),
                    };
                    used.push((u, seen));
                })
                .map(|_| ())
        } else {
            Ok(())
        };
        let r = read.and_then(|()| a.scan.clear());
        let cost = start.elapsed();
        let now = Instant::now();
        a.cleared_at = Some(now);
        a.next_at = now + (cost * COST_FACTOR).max(MIN_PERIOD);
        let mut s = self.state.lock();
        s.stats.access_samples += 1;
        s.stats.access_sample_s += cost.as_secs_f64();
        if let Err(e) = r {
            a.failed = true;
            s.cold.clear();
            s.stats.access_signal = format!("failed ({e}): victims by the lists alone");
            return;
        }
        if fresh {
            s.apply_access(&mut used, self.cfg.access_chunk);
            a.ages = used.iter().map(|(u, age)| (u.lo, (u.hi, *age))).collect();
        }
        // Pages loaded from here on are of the next window.
        s.access_window = s.access_window.wrapping_add(1);
        a.used = used;
    }
}

impl State {
    /// Applies a sample (see the module doc): second chances in the chunks
    /// in use, the cold queue from those whose pages nobody reused. `used`
    /// holds each mapping with what the last sample found of it, brought
    /// up to date here.
    pub(super) fn apply_access(&mut self, used: &mut [(Used, Seen)], chunk: usize) {
        self.cold.clear();
        let window = self.access_window;
        // What each mapping held: pages resident before the window (that
        // could be victims), and how many of them were touched. Taken off
        // the touched: pages that came in since, and pages that began to
        // hold memory since (a first write to a page mapped as zeros, seen
        // as growth of `Rss:`), whichever is more.
        let mut held = Vec::with_capacity(used.len());
        for (u, seen) in used.iter_mut() {
            let (mut old, mut new) = (0usize, 0usize);
            if u.rss > 0 && u.hi - u.lo <= MAX_CHUNKS * chunk {
                self.each_candidate(u.lo, u.hi, |m, _, _| {
                    if m.came_in == window {
                        new += 1;
                    } else {
                        old += 1;
                    }
                });
            }
            let rss = u.rss / PAGE_SIZE;
            let fresh = new.max(rss.saturating_sub(seen.rss_pages));
            let reused = (u.referenced / PAGE_SIZE).saturating_sub(fresh);
            *seen = Seen {
                idle: if old > 0 && reused == 0 {
                    seen.idle.saturating_add(1)
                } else {
                    0
                },
                rss_pages: rss,
            };
            held.push((old, reused));
        }
        // Those longest without reuse first.
        let mut order: Vec<usize> = (0..used.len()).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse(used[i].1.idle), used[i].0.lo));
        let mut marked = 0u64;
        let mut cold = std::mem::take(&mut self.cold);
        for i in order {
            let (u, _) = used[i];
            let (old, reused) = held[i];
            let (in_use, cold_too) = (reused * IN_USE >= old, used[i].1.idle >= COLD_AFTER);
            if old == 0 || !(in_use || cold_too) {
                continue;
            }
            self.each_candidate(u.lo, u.hi, |m, area, page| {
                if in_use {
                    if !m.referenced {
                        m.referenced = true;
                        marked += 1;
                    }
                } else if m.came_in != window {
                    // No reuse for a while outweighs an older second
                    // chance (a write since would have shown as reuse).
                    m.referenced = false;
                    cold.push_back(QEntry {
                        area,
                        page: page as u32,
                        qgen: m.qgen,
                    });
                }
            });
        }
        self.cold = cold;
        self.stats.access_second_chances += marked;
        self.stats.access_cold_pages = self.cold.len() as u64;
    }

    /// Calls `f(record, area, page)` for every page of `[lo, hi)` that could
    /// be a victim (`Dirty` or `Clean`, unclaimed, unpinned, of a live
    /// region), in address order.
    fn each_candidate(&mut self, lo: usize, hi: usize, mut f: impl FnMut(&mut PageMeta, u32, u64)) {
        self.each_page(lo, hi, |s, area, page| {
            let Some(ar) = s.areas.get_mut(&area).filter(|ar| !ar.dying) else {
                return;
            };
            let m = &mut ar.meta[page as usize];
            if matches!(m.st, PageState::Dirty | PageState::Clean) && !m.claimed && m.pins == 0 {
                f(m, area, page);
            }
        });
    }

    /// Calls `f(self, area, page)` for every page of a segment in
    /// `[lo, hi)`, in address order.
    fn each_page(&mut self, lo: usize, hi: usize, mut f: impl FnMut(&mut State, u32, u64)) {
        let mut at = lo;
        while at < hi {
            let Some((area, page)) = lookup(&self.segs, at) else {
                // Not ours: on to the next segment, if one starts before hi.
                match self.segs.range(at..hi).next() {
                    Some((&start, _)) => {
                        at = start;
                        continue;
                    }
                    None => return,
                }
            };
            f(self, area, page);
            at += PAGE_SIZE;
        }
    }

    /// The next victim of the cold queue, if it is still one: resident
    /// since the sample that queued it, unpinned, unclaimed, and not seen
    /// written since.
    pub(super) fn pop_cold(&mut self) -> Option<(u32, u64)> {
        while let Some(e) = self.cold.pop_front() {
            let Some(m) = self.entry_valid(e) else {
                continue;
            };
            if matches!(m.st, PageState::Dirty | PageState::Clean)
                && !m.claimed
                && m.pins == 0
                && !m.referenced
            {
                return Some((e.area, e.page as u64));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pager::config::PagerConfig;
    use crate::pager::state::{zeroed_meta, Area, Readahead, Seg};

    const BASE: usize = 0x7f00_0000_0000;
    const CHUNK_PAGES: usize = 8;
    const CHUNK: usize = CHUNK_PAGES * PAGE_SIZE;

    /// A state of one area of `chunks` chunks at `BASE`, every page
    /// resident and `Dirty`, queued inactive, before the first window.
    fn state(chunks: usize) -> State {
        let pages = chunks * CHUNK_PAGES;
        let mut s = State::new(&PagerConfig::new(1024), false, "chunks".into());
        s.areas.insert(
            1,
            Area {
                meta: zeroed_meta(pages),
                dying: false,
                inflight: 0,
                reached: 0,
                split: 0,
                ra: Readahead::new(),
                zr: Readahead::new(),
            },
        );
        s.segs.insert(
            BASE,
            Seg {
                len: pages * PAGE_SIZE,
                area: 1,
                first: 0,
            },
        );
        for p in 0..pages as u64 {
            s.meta(1, p).st = PageState::Dirty;
            s.enqueue_new(1, p, false);
            s.resident += 1;
        }
        s.access_window = 1;
        s
    }

    fn chunk(i: usize, rss: usize, referenced: usize) -> Used {
        Used {
            lo: BASE + i * CHUNK,
            hi: BASE + (i + 1) * CHUNK,
            rss: rss * PAGE_SIZE,
            referenced: referenced * PAGE_SIZE,
        }
    }

    fn seen(rss_pages: usize, idle: u8) -> Seen {
        Seen { idle, rss_pages }
    }

    #[test]
    fn reuse_gives_second_chances_and_no_reuse_makes_pages_cold() {
        let mut s = state(3);
        let n = CHUNK_PAGES;
        let mut used = vec![
            (chunk(0, n, n / 2), seen(n, 0)), // half reused: in use
            (chunk(1, n, 0), seen(n, 1)),     // a second window without reuse
            (chunk(2, n, 0), seen(n, 0)),     // a first one: not yet cold
        ];
        s.apply_access(&mut used, CHUNK);
        for p in 0..n as u64 {
            assert!(s.meta(1, p).referenced, "page {p} of the chunk in use");
            assert!(!s.meta(1, p + n as u64).referenced);
        }
        let cold: Vec<u64> = std::iter::from_fn(|| s.pop_cold().map(|(_, p)| p)).collect();
        assert_eq!(cold, (n as u64..2 * n as u64).collect::<Vec<_>>());
        assert_eq!(used[1].1.idle, 2);
        assert_eq!(used[2].1.idle, 1);
        assert_eq!(used[0].1.idle, 0);
        assert_eq!(s.stats.access_second_chances, n as u64);
    }

    #[test]
    fn pages_that_came_in_or_began_to_hold_memory_are_no_reuse() {
        let mut s = state(2);
        let n = CHUNK_PAGES;
        // Chunk 0: half its pages were brought back in this window (mapped
        // young), and exactly those are referenced.
        for p in 0..(n / 2) as u64 {
            s.leave(1, p);
            s.enqueue_new(1, p, false);
            s.resident += 1;
        }
        // Chunk 1: its Rss grew by the pages referenced (first writes to
        // pages that mapped the zero page).
        let mut used = vec![
            (chunk(0, n, n / 2), seen(n, 1)),
            (chunk(1, n, n / 2), seen(n / 2, 1)),
        ];
        s.apply_access(&mut used, CHUNK);
        assert_eq!(used[0].1.idle, 2, "loads are no reuse");
        assert_eq!(used[1].1.idle, 2, "first writes are no reuse");
        assert_eq!(s.stats.access_second_chances, 0);
        // Cold: the pages of chunk 0 from before the window, and chunk 1.
        let cold: Vec<u64> = std::iter::from_fn(|| s.pop_cold().map(|(_, p)| p)).collect();
        let mut want: Vec<u64> = (n as u64 / 2..2 * n as u64).collect();
        want.sort_unstable();
        let mut got = cold.clone();
        got.sort_unstable();
        assert_eq!(got, want);
    }

    #[test]
    fn a_cold_entry_is_dropped_once_the_page_changed() {
        let mut s = state(1);
        let n = CHUNK_PAGES;
        let mut used = vec![(chunk(0, n, 0), seen(n, 1))];
        s.apply_access(&mut used, CHUNK);
        // Page 0 left and came back, page 1 is pinned, page 2 was claimed,
        // page 3 was seen written since.
        s.leave(1, 0);
        s.enqueue_new(1, 0, false);
        s.meta(1, 1).pins = 1;
        s.meta(1, 2).claimed = true;
        s.meta(1, 3).referenced = true;
        let cold: Vec<u64> = std::iter::from_fn(|| s.pop_cold().map(|(_, p)| p)).collect();
        assert_eq!(cold, (4..n as u64).collect::<Vec<_>>());
    }

    #[test]
    fn mappings_larger_than_two_chunks_are_left_to_the_lists() {
        let mut s = state(3);
        let n = CHUNK_PAGES;
        let whole = Used {
            lo: BASE,
            hi: BASE + 3 * CHUNK,
            rss: 3 * n * PAGE_SIZE,
            referenced: 0,
        };
        let mut used = vec![(whole, seen(3 * n, 5))];
        s.apply_access(&mut used, CHUNK);
        assert!(s.pop_cold().is_none());
        assert_eq!(s.stats.access_second_chances, 0);
    }
}
