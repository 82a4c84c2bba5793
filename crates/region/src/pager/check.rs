//! `check_invariants`: re-derives from the page records what the pager's
//! counters, lists, flags and spans claim, for tests. It holds the state
//! lock, so it sees the pager between two steps of any protocol; checks
//! that hold only while nothing is in flight say so. Pages the kernel has
//! mapped are compared with their records too, and a mismatch that a
//! discard under way could explain is looked at again after it.

use super::state::{lookup, PageState, QEntry, State};
use super::PagerCore;
use std::collections::{HashMap, HashSet};

impl PagerCore {
    /// Checks the pager's invariants; the first broken one is the error.
    pub(super) fn check_invariants(&self) -> Result<(), String> {
        let suspects = {
            let s = self.state.lock();
            check_pages(&s)?;
            check_lists(&s)?;
            check_spans(&s)?;
            check_segments(&s)?;
            let budget = self.cfg.budget_pages;
            let floor = self.cfg.floor();
            if s.limit > budget || s.limit < floor {
                return Err(format!("limit {} outside [{floor}, {budget}]", s.limit));
            }
            mapped_not_resident(&s)?
        };
        confirm_unmapped(self, suspects)
    }
}

/// Per page, and the counters over pages:
/// - `resident` = pages in a resident state (`Loading` included);
/// - `n_active` = resident pages flagged active; a page not resident is
///   not active;
/// - each area's `inflight` = its `claimed` pages; a claimed page is never
///   `Stored` or `Loading`; an `Evicting`, `EvictAborted` or `Discarding`
///   page is claimed; `zapping` only on a claimed page;
/// - `Loading` pages ≤ `loading`, never claimed, zapping or active;
/// - a parked page waits for something: an eviction step (`Evicting`,
///   `EvictAborted`, `Discarding`, `zapping`), a load (`Loading`), or the
///   discard of a span it lies in (listed in that span's `parked`);
/// - with no eviction in flight (nothing claimed) no page is zapping and no
///   span is left; with no load either, no page is parked.
fn check_pages(s: &State) -> Result<(), String> {
    let span_parked: HashSet<(u32, u64)> = s
        .own
        .iter()
        .flat_map(|o| o.parked.iter())
        .filter_map(|&a| lookup(&s.segs, a))
        .collect();
    let (mut resident, mut active, mut loading, mut claimed, mut parked) = (0, 0, 0, 0, 0);
    for (&id, a) in &s.areas {
        let mut area_claimed = 0;
        for (p, m) in a.meta.iter().enumerate() {
            let at = || format!("area {id} page {p} ({m:?})");
            if m.st.resident() {
                resident += 1;
                active += usize::from(m.active);
            } else if m.active {
                return Err(format!("{}: active but not resident", at()));
            }
            let in_eviction = matches!(
                m.st,
                PageState::Evicting | PageState::EvictAborted | PageState::Discarding
            );
            if m.claimed {
                area_claimed += 1;
                if matches!(m.st, PageState::Stored | PageState::Loading) {
                    return Err(format!("{}: claimed", at()));
                }
            } else if in_eviction || m.zapping {
                return Err(format!("{}: in eviction but not claimed", at()));
            }
            if m.st == PageState::Loading {
                loading += 1;
                if m.zapping || m.active {
                    return Err(format!("{}: loading and zapping or active", at()));
                }
            }
            parked += usize::from(m.parked);
            if m.parked
                && !in_eviction
                && !m.zapping
                && m.st != PageState::Loading
                && !span_parked.contains(&(id, p as u64))
            {
                return Err(format!("{}: parked with nothing to wake it", at()));
            }
        }
        if area_claimed != a.inflight {
            return Err(format!(
                "area {id}: inflight {} != {area_claimed} claimed pages",
                a.inflight
            ));
        }
        claimed += area_claimed;
    }
    if resident != s.resident {
        return Err(format!("resident {} != counted {resident}", s.resident));
    }
    if active != s.n_active {
        return Err(format!("n_active {} != counted {active}", s.n_active));
    }
    if loading > s.loading {
        return Err(format!("{loading} pages Loading, {} in loads", s.loading));
    }
    if claimed == 0 && !s.own.is_empty() {
        return Err(format!(
            "{} discard spans with no eviction in flight",
            s.own.len()
        ));
    }
    if claimed == 0 && s.loading == 0 && parked > 0 {
        return Err(format!("{parked} faults parked with nothing in flight"));
    }
    Ok(())
}

/// The lists: an entry is current when its `qgen` is the page's and the
/// page is resident. A current entry is on the list its page's `active`
/// flag names, at most one per page, and every resident page in neither
/// eviction nor load (`Dirty` or `Clean`, unclaimed) has one. Dying areas
/// are skipped (their pages are on their way out).
fn check_lists(s: &State) -> Result<(), String> {
    let mut current: HashMap<(u32, u32), bool> = HashMap::new();
    for (list, on_active) in [(&s.inactive, false), (&s.active, true)] {
        for &QEntry { area, page, qgen } in list {
            let Some(a) = s.areas.get(&area).filter(|a| !a.dying) else {
                continue;
            };
            let m = a.meta[page as usize];
            if m.qgen != qgen || !m.st.resident() {
                continue;
            }
            if m.active != on_active {
                return Err(format!(
                    "area {area} page {page}: on the {} list, active {}",
                    if on_active { "active" } else { "inactive" },
                    m.active
                ));
            }
            if current.insert((area, page), on_active).is_some() {
                return Err(format!("area {area} page {page}: two current entries"));
            }
        }
    }
    for (&id, a) in s.areas.iter().filter(|(_, a)| !a.dying) {
        for (p, m) in a.meta.iter().enumerate() {
            let queued = matches!(m.st, PageState::Dirty | PageState::Clean) && !m.claimed;
            if queued && !current.contains_key(&(id, p as u32)) {
                return Err(format!("area {id} page {p} ({:?}): on no list", m.st));
            }
        }
    }
    Ok(())
}

/// The evictor's discard spans: sorted, disjoint, page aligned, their
/// `unseen` bits inside the span.
fn check_spans(s: &State) -> Result<(), String> {
    for w in s.own.windows(2) {
        if w[0].hi > w[1].lo {
            return Err(format!(
                "spans {:#x}.. and {:#x}.. overlap or are out of order",
                w[0].lo, w[1].lo
            ));
        }
    }
    for o in &s.own {
        if o.lo >= o.hi || o.lo % crate::sys::PAGE_SIZE != 0 || o.hi % crate::sys::PAGE_SIZE != 0 {
            return Err(format!("span {:#x}..{:#x} is not a page range", o.lo, o.hi));
        }
        let n = (o.hi - o.lo) / crate::sys::PAGE_SIZE;
        if o.unseen.len() != n.div_ceil(64) {
            return Err(format!(
                "span {:#x}: {} bit words for {n} pages",
                o.lo,
                o.unseen.len()
            ));
        }
        if let Some(&last) = o.unseen.last() {
            if !n.is_multiple_of(64) && last >> (n % 64) != 0 {
                return Err(format!("span {:#x}: bits past its end", o.lo));
            }
        }
    }
    Ok(())
}

/// With no eviction and no load in flight, every page the kernel has
/// mapped in a segment is in a resident state. A mapped page the pager
/// holds `Absent` or `Stored` takes the program's writes without a fault,
/// and the next discard span with it in a gap drops them (a fault's page
/// mapped after the zap of a remove event that was then applied over it
/// did so; see `handle_batch`). The converse may hold for a moment: a page
/// the program's own discard zapped after its event was applied is
/// `Dirty` and missing until its next fault maps it as zeros.
///
/// Returns the addresses of pages mapped but not resident: one the
/// program is discarding may still be mapped after its event was applied
/// (the zap is under way), so [`confirm_unmapped`] looks at them again.
fn mapped_not_resident(s: &State) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    let quiet = s.loading == 0 && s.areas.values().all(|a| a.inflight == 0);
    if !quiet {
        return Ok(out);
    }
    for (&start, seg) in &s.segs {
        let mapped = crate::sys::mincore(start, seg.len)
            .map_err(|e| format!("segment {start:#x}: mincore failed: {e}"))?;
        let meta = &s.areas[&seg.area].meta;
        for (i, &present) in mapped.iter().enumerate() {
            if present && !meta[seg.first as usize + i].st.resident() {
                out.push(start + i * crate::sys::PAGE_SIZE);
            }
        }
    }
    Ok(out)
}

/// The pages of [`mapped_not_resident`], looked at again with the state
/// lock released in between (no sleep under it) for up to 200 ms: a
/// discard's zap ends, and a page a fault maps meanwhile is resident. One
/// still mapped and not resident at the end is an error.
fn confirm_unmapped(sh: &PagerCore, mut pages: Vec<usize>) -> Result<(), String> {
    for _ in 0..100 {
        if pages.is_empty() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
        let s = sh.state.lock();
        pages.retain(|&a| {
            state_at(&s, a).is_some_and(|st| !st.resident())
                && crate::sys::mincore(a, crate::sys::PAGE_SIZE).is_ok_and(|v| v[0])
        });
    }
    match pages.first() {
        None => Ok(()),
        Some(&a) => {
            let st = state_at(&sh.state.lock(), a);
            Err(format!("page {a:#x}: mapped for 200 ms but {st:?}"))
        }
    }
}

/// The state of the page at `addr`, if it lies in a segment.
fn state_at(s: &State, addr: usize) -> Option<PageState> {
    lookup(&s.segs, addr).map(|(area, page)| s.areas[&area].meta[page as usize].st)
}

/// The segment map: disjoint, page aligned, each inside a live area's pages.
fn check_segments(s: &State) -> Result<(), String> {
    let mut end = 0;
    for (&start, seg) in &s.segs {
        if start < end {
            return Err(format!("segment {start:#x} overlaps the one before"));
        }
        end = start + seg.len;
        let Some(a) = s.areas.get(&seg.area) else {
            return Err(format!("segment {start:#x}: area {} is gone", seg.area));
        };
        let pages = (seg.len / crate::sys::PAGE_SIZE) as u64;
        if seg.len == 0 || seg.first + pages > a.meta.len() as u64 {
            return Err(format!(
                "segment {start:#x}: pages outside area {}",
                seg.area
            ));
        }
    }
    Ok(())
}
