//! Page state and the victim lists: what the pager knows of every page
//! ([`PageState`], `PageMeta`), the segment map from addresses to pages,
//! the evictor's own discards in flight (`OwnSpan`), and the two lists
//! victims are chosen from (`State::select`). Everything here lives under
//! `PagerCore::state`; nothing here makes a system call.

use super::config::{PagerConfig, VictimPolicy};
use super::inthread::in_handler;
use super::types::{Fault, Load, Span, Victim, MAX_LOAD};
use crate::stats::{Histogram, PagerStats};
use crate::sys::PAGE_SIZE;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// How far from a victim the evictor looks for more inactive pages to take
/// with it (pages, either side).
pub(super) const CLUSTER_SCAN: usize = 256;

/// The most pages between two victims that one discard may span.
pub(super) const MAX_GAP: u64 = 512;

/// Spare list entries reserved for faults resolved in signal handlers
/// (see `State::queue_spare`).
pub(super) const QUEUE_RESERVE: usize = 8192;

/// Spare list entries [`State::trim_lists`] leaves (12 KiB a list).
pub(super) const LIST_SLACK: usize = 1024;

/// The spare entries a fault resolved in a signal handler needs beyond
/// one per page of the loads in flight: it queues at most
/// `1 + zero_readahead_max` pages at once (both windows are at most
/// `MAX_IN_THREAD_WINDOW` in that mode) and starts a load of at most
/// `1 + readahead_max`.
pub(super) const IN_THREAD_SPARE: usize = 2 * (MAX_IN_THREAD_WINDOW + 1);

/// The most `readahead_max` and `zero_readahead_max` may be with in-thread
/// faults (a load's tickets live in a fixed array, see `load.rs`).
pub(super) const MAX_IN_THREAD_WINDOW: usize = 63;

/// The state of one page of a region.
///
/// "mapped" means a page may be present at the page's address; the store
/// "holds" it when an entry equal to the page's contents exists.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[repr(u8)]
pub enum PageState {
    /// Not mapped, not held: a fault maps zeros. Zero, so that a zeroed
    /// [`PageMeta`] is a default one (see [`zeroed_meta`]).
    #[default]
    Absent = 0,
    /// Not mapped, held: a fault loads it.
    Stored,
    /// Mapped and writable; the store holds nothing for it.
    Dirty,
    /// Mapped write-protected; the store holds an identical copy (loaded
    /// with `LoadMode::Keep`), so eviction only drops it.
    Clean,
    /// Mapped write-protected while the evictor copies and stores it.
    Evicting,
    /// Like `Evicting`, but a write is waiting: the evictor will drop what
    /// it stored, unprotect the page and make it `Dirty`.
    EvictAborted,
    /// Held; the evictor is discarding the mapping (`MADV_DONTNEED`).
    Discarding,
    /// Held, not mapped yet: a handler (or the fork hook) is loading it
    /// with no lock held and will map it if it is still `Loading` with the
    /// same ticket afterwards (see `pager/load.rs`). Counted resident (the
    /// budget is reserved for it), on no list: never a victim. A fault on
    /// it is parked and woken when the load ends; a remove or unmap event
    /// takes it as it takes a `Stored` page (the load then throws its bytes
    /// away).
    Loading,
}

impl PageState {
    pub(super) fn resident(self) -> bool {
        !matches!(self, PageState::Absent | PageState::Stored)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct PageMeta {
    pub(super) st: PageState,
    /// A fault on this page waits for the evictor to settle it; whoever
    /// settles the page (evictor commit/settle, or a remove event) clears
    /// the flag and wakes the range. Set in `Evicting`, `EvictAborted` and
    /// `Discarding`, on a `zapping` page, and on a page between victims of
    /// a discard in flight (`OwnSpan`, which lists it for the wake-up),
    /// and in `Loading` (the load's end wakes it).
    pub(super) parked: bool,
    /// A use was seen since the page was queued (a write fault on a
    /// write-protected page, or its chunk in an access sample): a second
    /// chance, on either list.
    pub(super) referenced: bool,
    /// The page is a victim of the eviction batch in flight (from claim to
    /// settle). The evictor reads such a page; if the program discarded it
    /// meanwhile that read faults, and the handler must serve it even with
    /// the budget full (the evictor is the one that would make room).
    pub(super) claimed: bool,
    /// The page is on the active list (only meaningful while resident).
    pub(super) active: bool,
    /// The evictor will drop (`MADV_DONTNEED`) the page's mapping and has
    /// not yet done so. A missing fault on such a page waits for the drop
    /// (`parked`) whatever the state: if the program discarded the page
    /// meanwhile (remove event: `Absent`) and a fault mapped a new page,
    /// the evictor's drop would take that page and what was written to it.
    /// Set when a victim is committed to discarding, cleared (waking the
    /// parked) when the drop returned.
    pub(super) zapping: bool,
    /// A missing fault found the page `Dirty`/`Clean` and was only woken
    /// (the usual case: a readahead mapped it meanwhile). A second such
    /// fault before the page is queued again means nothing is mapped.
    pub(super) woken: bool,
    /// Spared once this residency for its active neighbours (`select`).
    pub(super) spared: bool,
    /// On the active list at some point this residency (activated at its
    /// refault, seen written, or spared): part of the working set, so its
    /// eviction uses the store's fast codec (`PageStore::store_cold`
    /// serves the others).
    pub(super) warm: bool,
    /// Generation of the page's queue entry; older entries are stale.
    /// It is also a load's ticket: bumped when the page becomes `Loading`
    /// and by every way out of a resident state (`State::leave`), so a
    /// load that finds it unchanged knows nobody took the page meanwhile.
    pub(super) qgen: u32,
    /// Eviction clock when the page was last evicted (valid if `Stored`).
    pub(super) evicted_at: u32,
    /// Pins held on the page (`Region::pin`): while non-zero the evictor
    /// never claims it. A pinned page may be on no list (the evictor drops
    /// its entry); the last unpin queues it again if it is resident.
    pub(super) pins: u16,
    /// The access sample window (`State::access_window`) in which this
    /// residency began. A page brought back is mapped young
    /// (`UFFDIO_COPY`), and a first touch is a use: either way a sample of
    /// that window counts the page touched, which says nothing of reuse
    /// (see `access.rs`).
    pub(super) came_in: u8,
}

/// `n` default page records from zeroed memory: the allocator maps zero
/// pages, which the kernel backs only once written, so a region's records
/// cost resident memory where its pages are used, not where they are only
/// mapped (a program's reservations, a space's chunk not yet reached).
pub(super) fn zeroed_meta(n: usize) -> Vec<PageMeta> {
    if n == 0 {
        return Vec::new();
    }
    let layout =
        std::alloc::Layout::array::<PageMeta>(n).expect("a region's records fit in memory");
    // SAFETY: the layout's size is not zero. All-zero bits are a valid
    // `PageMeta::default()`: `PageState::Absent` is 0 (`repr(u8)`), the
    // flags false, the counters 0; so the allocation holds `n` initialised
    // records, and the Vec frees it with the layout it was made with.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout).cast::<PageMeta>();
        if p.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Vec::from_raw_parts(p, n, n)
    }
}

pub(super) struct Area {
    pub(super) meta: Vec<PageMeta>,
    /// The region is being dropped: no new victims from it.
    pub(super) dying: bool,
    /// Victims of this area inside an eviction batch.
    pub(super) inflight: usize,
    /// One past the highest page that has been resident, and the pages
    /// (from page 0) cut into chunks for the access signal so far
    /// (`access.rs`, `PagerCore::split_reached`).
    pub(super) reached: u64,
    pub(super) split: u64,
    /// Readahead of stored pages (loads).
    pub(super) ra: Readahead,
    /// Zero readahead (first touches mapped as zeros).
    pub(super) zr: Readahead,
}

/// A readahead window: how many pages after a faulting one to bring with
/// it. It doubles (up to a most) while faults land on `next`, the page
/// right after the last run, and halves otherwise.
#[derive(Clone, Copy, Debug)]
pub(super) struct Readahead {
    /// The page after the last run.
    pub(super) next: u64,
    window: usize,
}

impl Readahead {
    pub(super) const fn new() -> Readahead {
        Readahead {
            next: u64::MAX,
            window: 0,
        }
    }

    /// The window for a fault at `page`, at most `max`.
    pub(super) fn window(&mut self, page: u64, max: usize) -> usize {
        if page == self.next {
            self.window = (self.window * 2).max(2).min(max);
        } else {
            self.window /= 2;
        }
        self.window
    }
}

/// A registered address range: `len` bytes starting at the key, holding
/// pages `first..` of `area`. Split and moved by remap events.
#[derive(Clone, Copy, Debug)]
pub(super) struct Seg {
    pub(super) len: usize,
    pub(super) area: u32,
    pub(super) first: u64,
}

/// One `MADV_DONTNEED` of the evictor: victims and the pages between them,
/// none of which was resident when it was chosen (so the call drops only
/// victims, and one remove event and one TLB flush serve them all).
/// Lives from the commit that chose it until the call returned:
/// - a remove event for a page whose `unseen` bit is set is ours (the bit
///   is cleared); any other is the program's. If the program discards the
///   same page at the same moment, both events count, whichever is read
///   first, and the page ends `Absent` either way;
/// - a missing fault on any of its pages waits (`parked`, woken when the
///   call returned): mapped now, the page would be dropped by the call with
///   whatever the program wrote to it. Victims park through
///   `PageMeta::zapping`, the pages between them here.
pub(super) struct OwnSpan {
    pub(super) lo: usize,
    pub(super) hi: usize,
    /// A bit per page: its remove event has not been read yet.
    pub(super) unseen: Vec<u64>,
    /// Pages between victims whose faults wait for the call to return.
    pub(super) parked: Vec<usize>,
}

impl OwnSpan {
    pub(super) fn new(lo: usize, hi: usize) -> Self {
        let n = (hi - lo) / PAGE_SIZE;
        let mut unseen = vec![u64::MAX; n.div_ceil(64)];
        if !n.is_multiple_of(64) {
            *unseen.last_mut().expect("a span holds a page") = (1u64 << (n % 64)) - 1;
        }
        OwnSpan {
            lo,
            hi,
            unseen,
            parked: Vec::new(),
        }
    }

    /// Clears the bit of the page at `addr` (inside the span); whether it
    /// was set.
    pub(super) fn take(&mut self, addr: usize) -> bool {
        let i = (addr - self.lo) / PAGE_SIZE;
        let (w, b) = (i / 64, 1u64 << (i % 64));
        let set = self.unseen[w] & b != 0;
        self.unseen[w] &= !b;
        set
    }
}

#[derive(Clone, Copy)]
pub(super) struct QEntry {
    pub(super) area: u32,
    pub(super) page: u32,
    pub(super) qgen: u32,
}

/// Runs mapped as zeros that the state keeps for the evictor between two
/// looks ([`State::zero_runs`]).
pub(super) const ZERO_RUNS_KEPT: usize = 1024;

pub(super) struct State {
    pub(super) areas: HashMap<u32, Area>,
    pub(super) segs: BTreeMap<usize, Seg>,
    pub(super) inactive: VecDeque<QEntry>,
    pub(super) active: VecDeque<QEntry>,
    /// The access sample window now (wrapping; see `PageMeta::came_in`).
    pub(super) access_window: u8,
    /// Resident pages of chunks the last access sample found untouched,
    /// oldest chunks first: victims before the lists' (see `access.rs`).
    pub(super) cold: VecDeque<QEntry>,
    /// Resident pages on the active list.
    pub(super) n_active: usize,
    /// Pages in a resident state, over all areas.
    pub(super) resident: usize,
    /// Of those, pages that mapped the shared zero page at the evictor's
    /// last look (`PagerCore::refresh_zero_mapped`): mapped as zeros by a
    /// first touch or its zero run and not written since, they hold no
    /// memory. The budget counts `resident` less these
    /// ([`State::charged`]).
    pub(super) zero_mapped: usize,
    /// Runs `(address, pages)` mapped as zeros since the evictor's last
    /// look, for it to look at. Never grown past its capacity (a fault in
    /// a signal handler may not allocate): runs beyond it are not looked
    /// at, and their pages stay charged.
    pub(super) zero_runs: Vec<(usize, usize)>,
    /// Pages of loads between their start and their end (`Loading`, or
    /// taken from a load by an event and not yet seen so by it).
    pub(super) loading: usize,
    /// Evictions so far (wrapping), for refault distances.
    pub(super) evict_clock: u32,
    /// Refaults of stored pages by their distance (evictions since the
    /// page left), in powers of two (`uzswap_os::distance`).
    pub(super) refault_distances: uzswap_os::distance::Distances,
    /// The ranges the evictor is discarding (one `MADV_DONTNEED` each),
    /// by address, from the commit that chose them until the call returned
    /// (see [`OwnSpan`]).
    pub(super) own: Vec<OwnSpan>,
    pub(super) next_area: u32,
    pub(super) stats: PagerStats,
    pub(super) lat_store: Histogram,
    pub(super) lat_zero: Histogram,
    /// Time inside the UFFDIO_COPY of store faults (includes waking the
    /// faulting thread).
    pub(super) lat_copy: Histogram,
    /// The store refused the last whole batch: faults are not held back by
    /// the budget until a store succeeds (holding them would wait forever).
    pub(super) store_full: bool,
    /// Pages resident in regions may reach this: the budget less what
    /// `PagerConfig::charge` reported (never below `PagerConfig::floor`).
    pub(super) limit: usize,
    /// A fork is being prepared (`fork.rs`): no load starts (a fault that
    /// would load is deferred), and the last load to end wakes `done_cv`.
    pub(super) forking: bool,
    /// Pages of room made for forked children (`PagerConfig::fork_room`):
    /// the limit is kept that much lower until the instant given.
    pub(super) fork_room: Option<(usize, std::time::Instant)>,
    /// Faults are resolved in signal handlers (`in_thread_faults`): the
    /// lists keep spare capacity (see [`State::queue_spare`]).
    pub(super) reserve_lists: bool,
}

pub(super) fn lookup(segs: &BTreeMap<usize, Seg>, addr: usize) -> Option<(u32, u64)> {
    let (start, seg) = segs.range(..=addr).next_back()?;
    if addr >= start + seg.len {
        return None;
    }
    Some((seg.area, seg.first + ((addr - start) / PAGE_SIZE) as u64))
}

impl State {
    /// The state of a new pager with settings `cfg`, nothing mapped yet;
    /// `zero_look`: it looks at zero runs (capacity reserved for them);
    /// `access_signal`: what chooses victims (`PagerStats::access_signal`).
    pub(super) fn new(cfg: &PagerConfig, zero_look: bool, access_signal: String) -> State {
        State {
            areas: HashMap::new(),
            segs: BTreeMap::new(),
            inactive: VecDeque::new(),
            active: VecDeque::new(),
            cold: VecDeque::new(),
            access_window: 0,
            n_active: 0,
            resident: 0,
            zero_mapped: 0,
            zero_runs: Vec::with_capacity(if zero_look { ZERO_RUNS_KEPT } else { 0 }),
            evict_clock: 0,
            own: Vec::new(),
            loading: 0,
            next_area: 1,
            stats: PagerStats {
                budget_pages: cfg.budget_pages as u64,
                limit_pages: cfg.budget_pages as u64,
                access_signal,
                ..PagerStats::default()
            },
            refault_distances: uzswap_os::distance::Distances::default(),
            lat_store: Histogram::default(),
            lat_zero: Histogram::default(),
            lat_copy: Histogram::default(),
            store_full: false,
            limit: cfg.budget_pages,
            forking: false,
            fork_room: None,
            reserve_lists: cfg.in_thread_faults,
        }
    }

    /// Resident pages that hold memory: the budget's count.
    pub(super) fn charged(&self) -> usize {
        self.resident.saturating_sub(self.zero_mapped)
    }

    /// Notes `pages` pages from `addr` as mapped to the zero page (some may
    /// not be: the evictor's look tells).
    pub(super) fn note_zeros(&mut self, addr: usize, pages: usize) {
        if pages > 0 && self.zero_runs.len() < self.zero_runs.capacity() {
            self.zero_runs.push((addr, pages));
        }
    }

    pub(super) fn meta(&mut self, area: u32, page: u64) -> &mut PageMeta {
        &mut self.areas.get_mut(&area).expect("area of a segment").meta[page as usize]
    }

    /// Puts a page that just became resident on a list: a new residency,
    /// not yet warm.
    pub(super) fn enqueue_new(&mut self, area: u32, page: u64, active: bool) {
        let w = self.access_window;
        let ar = self.areas.get_mut(&area).expect("area of a segment");
        ar.reached = ar.reached.max(page + 1);
        let m = &mut ar.meta[page as usize];
        m.warm = false;
        m.came_in = w;
        self.enqueue(area, page, active);
    }

    /// Puts a resident page on a list.
    pub(super) fn enqueue(&mut self, area: u32, page: u64, active: bool) {
        if self.reserve_lists && self.queue_spare() < QUEUE_RESERVE / 2 && !in_handler() {
            // With in-thread faults every thread that may allocate keeps
            // capacity in reserve for those in signal handlers.
            self.reserve_queues();
        }
        let m = self.meta(area, page);
        m.warm |= active;
        m.qgen = m.qgen.wrapping_add(1);
        m.referenced = false;
        m.woken = false;
        let was_active = m.active;
        m.active = active;
        let e = QEntry {
            area,
            page: page as u32,
            qgen: m.qgen,
        };
        self.list_mut(active).push_back(e);
        match (was_active, active) {
            (false, true) => self.n_active += 1,
            (true, false) => self.n_active -= 1,
            _ => {}
        }
    }

    /// Entries both lists can take without growing: the least of their
    /// spare capacities. With in-thread faults a fault (in a signal
    /// handler) must not allocate, so it queues pages only into capacity
    /// reserved beforehand by [`State::reserve_queues`].
    pub(super) fn queue_spare(&self) -> usize {
        let spare = |q: &VecDeque<QEntry>| q.capacity() - q.len();
        spare(&self.inactive).min(spare(&self.active))
    }

    /// Drops the stale entries of a list that holds more than twice as many
    /// entries as there are resident pages, and gives back capacity far
    /// beyond what a list holds (keeping [`LIST_SLACK`], or with in-thread
    /// faults [`QUEUE_RESERVE`], spare). A process whose resident set
    /// shrank would keep the lists it had at its largest (an idle Python
    /// parent of the `tree` benchmark's program: 768 KiB of lists for 273
    /// entries; the `list_entries` and `lists_bytes` statistics show them).
    /// Never in a signal handler (it may allocate).
    pub(super) fn trim_lists(&mut self) {
        if self.inactive.len() + self.active.len() > 2 * self.resident + LIST_SLACK {
            for active in [false, true] {
                // Taken out, so that the filter may read the records.
                let mut q = std::mem::take(self.list_mut(active));
                q.retain(|&e| self.entry_valid(e).is_some_and(|m| m.active == active));
                *self.list_mut(active) = q;
            }
        }
        let keep = if self.reserve_lists {
            QUEUE_RESERVE
        } else {
            LIST_SLACK
        };
        for q in [&mut self.inactive, &mut self.active] {
            if q.capacity() > 2 * (q.len() + keep) {
                q.shrink_to(q.len() + keep);
            }
        }
    }

    /// The active list, or the inactive one.
    fn list_mut(&mut self, active: bool) -> &mut VecDeque<QEntry> {
        if active {
            &mut self.active
        } else {
            &mut self.inactive
        }
    }

    /// Reserves [`QUEUE_RESERVE`] spare entries on both lists (never in a
    /// signal handler: it may allocate).
    pub(super) fn reserve_queues(&mut self) {
        self.inactive.reserve(QUEUE_RESERVE);
        self.active.reserve(QUEUE_RESERVE);
    }

    /// Accounting for a page that stops being resident.
    pub(super) fn leave(&mut self, area: u32, page: u64) {
        let m = self.meta(area, page);
        m.qgen = m.qgen.wrapping_add(1);
        m.spared = false;
        let was_active = std::mem::replace(&mut m.active, false);
        if was_active {
            self.n_active -= 1;
        }
        self.resident -= 1;
    }

    pub(super) fn entry_valid(&self, e: QEntry) -> Option<PageMeta> {
        let a = self.areas.get(&e.area)?;
        if a.dying {
            return None;
        }
        let m = a.meta[e.page as usize];
        (m.qgen == e.qgen && m.st.resident()).then_some(m)
    }

    /// Picks up to `want` victims among `Dirty`/`Clean` pages: from the
    /// cold queue of the access signal first (`access.rs`), then from the
    /// lists.
    pub(super) fn select(&mut self, want: usize, policy: VictimPolicy) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        let mut taken = HashSet::new();
        if policy == VictimPolicy::Workingset {
            while out.len() < want {
                let Some((area, page)) = self.pop_cold() else {
                    break;
                };
                if taken.insert((area, page as u32)) {
                    out.push((area, page));
                    self.stats.access_cold_victims += 1;
                }
            }
        }
        let mut budget = 4 * (self.inactive.len() + self.active.len()) + 16;
        while out.len() < want && budget > 0 {
            budget -= 1;
            // Keep the active list at most 7/8 of what is resident.
            let demote = policy == VictimPolicy::Workingset
                && (self.n_active * 8 > self.resident * 7 || self.inactive.is_empty());
            if demote {
                if let Some(e) = self.active.pop_front() {
                    if let Some(m) = self.entry_valid(e) {
                        // A page seen in use since it was queued goes round
                        // the active list once more (its flag cleared).
                        if m.active {
                            self.enqueue(e.area, e.page as u64, m.referenced);
                        }
                    }
                    continue;
                }
            }
            let Some(e) = self.inactive.pop_front() else {
                break;
            };
            let Some(m) = self.entry_valid(e) else {
                continue;
            };
            if !matches!(m.st, PageState::Dirty | PageState::Clean) {
                continue;
            }
            if policy == VictimPolicy::Workingset && m.referenced {
                self.enqueue(e.area, e.page as u64, true);
                continue;
            }
            // An inactive page between two active ones is likely in use as
            // they are (memory is used in neighbourhoods; the kernel's
            // multi-gen LRU looks around a young page for the same reason),
            // and alone it would also cost a discard call of its own: it
            // gets one turn on the active list per residency.
            if policy == VictimPolicy::Workingset
                && !m.spared
                && self.between_active(e.area, e.page as u64)
            {
                self.meta(e.area, e.page as u64).spared = true;
                self.enqueue(e.area, e.page as u64, true);
                continue;
            }
            if !taken.insert((e.area, e.page)) {
                continue;
            }
            out.push((e.area, e.page as u64));
            if policy == VictimPolicy::Workingset {
                self.take_neighbours(e.area, e.page as u64, want, &mut out, &mut taken);
            }
        }
        self.trim_lists();
        out
    }

    /// Adds to `out` the inactive pages near `page`, up to [`CLUSTER_SCAN`]
    /// pages either side and no further than a resident page that is not
    /// one (active, or in flight). Pages not resident in between cost
    /// nothing: the victims and the gaps between them leave in one call
    /// (see [`OwnSpan`]), where scattered victims would cost a remove
    /// event and a TLB flush each. Which inactive pages go first matters
    /// little: none of them has been seen in use since it came in.
    pub(super) fn take_neighbours(
        &mut self,
        area: u32,
        page: u64,
        want: usize,
        out: &mut Vec<(u32, u64)>,
        taken: &mut HashSet<(u32, u32)>,
    ) {
        let a = &self.areas[&area];
        let n = a.meta.len() as u64;
        for dir in [1i64, -1] {
            let mut p = page;
            for _ in 0..CLUSTER_SCAN {
                if out.len() >= want {
                    return;
                }
                let next = p as i64 + dir;
                if next < 0 || next as u64 >= n {
                    break;
                }
                p = next as u64;
                let m = a.meta[p as usize];
                if !m.st.resident() {
                    continue;
                }
                let candidate = matches!(m.st, PageState::Dirty | PageState::Clean)
                    && !m.active
                    && !m.referenced
                    && !m.claimed;
                if !candidate {
                    break;
                }
                if taken.insert((area, p as u32)) {
                    out.push((area, p));
                }
            }
        }
    }

    /// Both neighbours of `page` are resident and on the active list.
    pub(super) fn between_active(&self, area: u32, page: u64) -> bool {
        let meta = &self.areas[&area].meta;
        let active = |p: Option<u64>| {
            p.and_then(|p| meta.get(p as usize))
                .is_some_and(|m| m.st.resident() && m.active)
        };
        active(page.checked_sub(1)) && active(Some(page + 1))
    }

    /// The span of `own` holding `addr`.
    /// How many pages from `page` (at `addr`) on, at most up to page
    /// `limit` and the end of the segment, `keep` accepts: the faulting
    /// page and a readahead run after it. At least 1. The run stops before a
    /// page the evictor will drop (`zapping`) and a discard in flight (it
    /// would drop what is mapped there).
    pub(super) fn run_after(
        &self,
        addr: usize,
        area: u32,
        page: u64,
        limit: u64,
        keep: impl Fn(&PageMeta) -> bool,
    ) -> usize {
        let (_, seg) = self.segs.range(..=addr).next_back().expect("segment");
        let limit = limit.min(seg.first + (seg.len / PAGE_SIZE) as u64);
        let mut n = 1usize;
        while page + (n as u64) < limit
            && {
                let m = &self.areas[&area].meta[(page + n as u64) as usize];
                !m.zapping && keep(m)
            }
            && self.own_at(addr + n * PAGE_SIZE).is_none()
        {
            n += 1;
        }
        n
    }

    pub(super) fn own_at(&self, addr: usize) -> Option<usize> {
        let i = self.own.partition_point(|o| o.hi <= addr);
        (i < self.own.len() && self.own[i].lo <= addr).then_some(i)
    }

    /// Whether every page strictly between the victims at `a` and `b`
    /// (`a < b`, page indexes of `area`) is not resident and neither is
    /// being dropped: one call may then act on `[a, b]`. Both must lie in
    /// the same segment, at most [`MAX_GAP`] pages apart.
    pub(super) fn gap_is_empty(&self, area: u32, a: (usize, u64), b: (usize, u64)) -> bool {
        if b.1 <= a.1 || b.1 - a.1 > MAX_GAP || b.0 - a.0 != (b.1 - a.1) as usize * PAGE_SIZE {
            return false;
        }
        let (Some((sa, _)), Some((sb, _))) = (
            self.segs.range(..=a.0).next_back(),
            self.segs.range(..=b.0).next_back(),
        ) else {
            return false;
        };
        if sa != sb {
            return false;
        }
        self.areas[&area].meta[a.1 as usize + 1..b.1 as usize]
            .iter()
            .all(|m| !m.st.resident() && !m.zapping)
    }
}

impl State {
    /// Step 1: pages `page..page + n` of `area`, all `Stored`, become
    /// `Loading` for the fault `f`.
    pub(super) fn start_load(&mut self, f: Fault, area: u32, page: u64, n: usize) -> Load {
        assert!(n <= MAX_LOAD, "a load of {n} pages");
        let mut tickets = [0; MAX_LOAD];
        for i in 0..n as u64 {
            let m = self.meta(area, page + i);
            debug_assert_eq!(m.st, PageState::Stored);
            m.st = PageState::Loading;
            m.qgen = m.qgen.wrapping_add(1);
            tickets[i as usize] = m.qgen;
        }
        self.resident += n;
        self.loading += n;
        Load {
            f,
            area,
            page,
            n,
            tickets,
        }
    }

    /// Whether page `i` of load `l` is still the load's: `Loading` with its
    /// ticket (`at`: and still at the address `l` was made for).
    pub(super) fn load_owns(&self, l: &Load, i: usize, at: bool) -> bool {
        let p = l.page + i as u64;
        let mine = self
            .areas
            .get(&l.area)
            .and_then(|a| a.meta.get(p as usize))
            .is_some_and(|m| m.st == PageState::Loading && m.qgen == l.tickets[i]);
        mine && (!at || lookup(&self.segs, l.f.addr + i * PAGE_SIZE) == Some((l.area, p)))
    }
}

impl State {
    /// The victims (sorted by address) that pass `keep`, in spans:
    /// neighbours share one when no page between them is resident
    /// (`gap_is_empty`), so that one call serves the span.
    pub(super) fn spans(&self, victims: &[Victim], keep: impl Fn(&Victim) -> bool) -> Vec<Span> {
        let mut out: Vec<Span> = Vec::new();
        let mut prev: Option<&Victim> = None;
        for (i, v) in victims.iter().enumerate() {
            if !keep(v) {
                continue;
            }
            let join = prev.is_some_and(|u| {
                u.area == v.area
                    && self.gap_is_empty(v.area, (u.addr, u.page as u64), (v.addr, v.page as u64))
            });
            match out.last_mut() {
                Some(span) if join => {
                    span.victims.push(i);
                    span.hi = v.addr + PAGE_SIZE;
                }
                _ => out.push(Span {
                    victims: vec![i],
                    lo: v.addr,
                    hi: v.addr + PAGE_SIZE,
                }),
            }
            prev = Some(v);
        }
        out
    }
}

/// Removes the parts of segments inside `[start, end)` and returns them
/// (keyed by their start address); parts outside stay.
pub(super) fn split_out(
    segs: &mut BTreeMap<usize, Seg>,
    start: usize,
    end: usize,
) -> Vec<(usize, Seg)> {
    let hits: Vec<(usize, Seg)> = segs
        .range(..end)
        .filter(|(s, seg)| **s + seg.len > start)
        .map(|(s, seg)| (*s, *seg))
        .collect();
    let mut out = Vec::new();
    for (s, seg) in hits {
        segs.remove(&s);
        let e = s + seg.len;
        let pages = |a: usize| ((a - s) / PAGE_SIZE) as u64;
        if s < start {
            segs.insert(
                s,
                Seg {
                    len: start - s,
                    ..seg
                },
            );
        }
        if e > end {
            segs.insert(
                end,
                Seg {
                    len: e - end,
                    area: seg.area,
                    first: seg.first + pages(end),
                },
            );
        }
        let ms = s.max(start);
        let me = e.min(end);
        out.push((
            ms,
            Seg {
                len: me - ms,
                area: seg.area,
                first: seg.first + pages(ms),
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_records_are_default_ones() {
        assert!(zeroed_meta(0).is_empty());
        let v = zeroed_meta(3000);
        assert_eq!(v.len(), 3000);
        assert!(v.iter().all(|m| *m == PageMeta::default()));
        assert_eq!(PageState::Absent as u8, 0);
    }

    fn seg(len_pages: usize, first: u64) -> Seg {
        Seg {
            len: len_pages * PAGE_SIZE,
            area: 1,
            first,
        }
    }

    #[test]
    fn split_out_middle_and_edges() {
        let mut segs = BTreeMap::new();
        let b = 0x10_0000;
        segs.insert(b, seg(10, 0));
        let out = split_out(&mut segs, b + 2 * PAGE_SIZE, b + 5 * PAGE_SIZE);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, b + 2 * PAGE_SIZE);
        assert_eq!((out[0].1.len, out[0].1.first), (3 * PAGE_SIZE, 2));
        assert_eq!(segs.len(), 2);
        assert_eq!(segs[&b].len, 2 * PAGE_SIZE);
        let tail = segs[&(b + 5 * PAGE_SIZE)];
        assert_eq!((tail.len, tail.first), (5 * PAGE_SIZE, 5));
        assert_eq!(lookup(&segs, b + 6 * PAGE_SIZE), Some((1, 6)));
        assert_eq!(lookup(&segs, b + 3 * PAGE_SIZE), None);
        // A range over both remaining parts and beyond.
        let out = split_out(&mut segs, b, b + 20 * PAGE_SIZE);
        assert_eq!(out.len(), 2);
        assert!(segs.is_empty());
    }
}
