//! Resident pages that map the shared zero page, and what the budget
//! counts of them.
//!
//! A first touch maps the faulting page and its zero run as the kernel's
//! zero page (`fault.rs`), and so does a read of an untouched page. Such a
//! page is resident to the pager (it needs no fault) but holds no memory
//! until the program writes it, and then the kernel copies it without a
//! fault of ours. A zero run maps far ahead: in a `cc1` of the `tree`
//! build, half of the pages its zero runs map are never written, and its
//! resident count would be twice the memory it holds. So the budget counts
//! `State::resident` less the pages that map the zero page
//! (`State::charged`); the evictor finds them with `PAGEMAP_SCAN`:
//! - every fault that maps zeros notes its run (`State::note_zeros`, into
//!   capacity reserved beforehand);
//! - before each batch, the evictor looks at the runs noted since its last
//!   look that it does not track yet, and adds the zero-mapped pages it
//!   finds (an *incremental* look: cheap, the runs are new);
//! - once a [`CHARGE_PERIOD`], and at every reading of the charge, it looks
//!   at every tracked run again (a *full* look): pages written since hold
//!   memory and are counted again, pages evicted or discarded are gone;
//! - a victim in a run found mapping the zero page leaves the count when
//!   its eviction starts (`count_zero_mapped`).
//!
//! The count errs in both directions only between two full looks: a page
//! written since the last one still counts as zero-mapped (the program
//! holds that much more than the budget says, for at most a period), and
//! runs beyond the reserved capacity are not looked at (their pages stay
//! charged, as before any look).

use super::config::CHARGE_PERIOD;
use super::state::Seg;
use super::types::Victim;
use super::PagerCore;
use crate::sys::{self, PAGE_SIZE};
use std::collections::BTreeMap;
use std::time::Instant;

/// The evictor's view of the resident pages that map the zero page.
pub(super) struct ZeroLook {
    scan: sys::ZeroScan,
    /// `(start, end)` of the runs that mapped the zero page, sorted and
    /// disjoint: found at the last full look and by incremental ones since.
    runs: Vec<(usize, usize)>,
    /// The state's noted runs, taken at a look (swapped with
    /// `State::zero_runs`, so that neither allocates).
    taken: Vec<(usize, usize)>,
    /// When the last full look was.
    full_at: Option<Instant>,
}

impl ZeroLook {
    /// None where the kernel has no `PAGEMAP_SCAN` (it came in Linux 6.7).
    pub(super) fn new(capacity: usize) -> Option<ZeroLook> {
        Some(ZeroLook {
            scan: sys::ZeroScan::new()?,
            runs: Vec::new(),
            taken: Vec::with_capacity(capacity),
            full_at: None,
        })
    }

    /// In a forked child (its only thread, the fork hook): the look scans
    /// the child's own page tables from now on, and its next look is a full
    /// one. The runs it tracks stay right until then: the child's pages
    /// map the zero page where the parent's did at the fork.
    pub(super) fn renew(&mut self) -> std::io::Result<()> {
        self.scan.renew()?;
        self.full_at = None;
        Ok(())
    }
}

/// Sorts `runs` and joins those that overlap or touch.
fn coalesce(runs: &mut Vec<(usize, usize)>) {
    runs.sort_unstable();
    runs.dedup_by(|next, prev| {
        if next.0 <= prev.1 {
            prev.1 = prev.1.max(next.1);
            true
        } else {
            false
        }
    });
}

/// The parts of `new` (coalesced) that no run of `have` (sorted, disjoint)
/// covers.
fn uncovered(new: &[(usize, usize)], have: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for &(mut a, b) in new {
        let mut i = have.partition_point(|&(_, end)| end <= a);
        while a < b {
            match have.get(i) {
                Some(&(lo, hi)) if lo < b => {
                    if a < lo {
                        out.push((a, lo));
                    }
                    a = a.max(hi);
                    i += 1;
                }
                _ => {
                    out.push((a, b));
                    break;
                }
            }
        }
    }
    out
}

/// The parts of `runs` (sorted) that lie in the pager's segments.
fn clip(segs: &BTreeMap<usize, Seg>, runs: &[(usize, usize)]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for &(a, b) in runs {
        let from = segs.range(..=a).next_back().map_or(a, |(&k, _)| k);
        for (&start, seg) in segs.range(from..b) {
            let (lo, hi) = (a.max(start), b.min(start + seg.len));
            if lo < hi {
                out.push((lo, hi));
            }
        }
    }
    out
}

impl PagerCore {
    /// Looks at which resident pages map the zero page (see the module
    /// docs): a full look if the last is a [`CHARGE_PERIOD`] old, else an
    /// incremental one if faults noted runs since. Under the state lock
    /// only to take the noted runs and the segments' bounds, and to set the
    /// count; the scans run without it (the look's own lock, never
    /// contended, is the evictor's).
    pub(super) fn refresh_zero_mapped(&self) {
        let Some(look) = &self.zero_scan else {
            return;
        };
        let mut look = look.lock();
        let full = look.full_at.is_none_or(|t| t.elapsed() >= CHARGE_PERIOD);
        let ZeroLook {
            scan,
            runs,
            taken,
            full_at,
        } = &mut *look;
        let todo = {
            let mut s = self.state.lock();
            std::mem::swap(&mut s.zero_runs, taken);
            let nothing_tracked = runs.is_empty() && s.zero_mapped == 0;
            if taken.is_empty() && (!full || nothing_tracked) {
                return;
            }
            let mut new: Vec<(usize, usize)> = taken
                .drain(..)
                .map(|(a, n)| (a, a + n * PAGE_SIZE))
                .collect();
            coalesce(&mut new);
            let todo = if full {
                new.append(runs);
                coalesce(&mut new);
                new
            } else {
                uncovered(&new, runs)
            };
            clip(&s.segs, &todo)
        };
        if full {
            *full_at = Some(Instant::now());
            runs.clear();
        }
        let mut found = Vec::new();
        let mut zero = 0;
        for &(lo, hi) in &todo {
            let r = scan.zero_runs(lo, hi, |a, b| {
                found.push((a, b));
                zero += (b - a) / PAGE_SIZE;
            });
            if r.is_err() {
                // Not looked at: everything charged, as before any look.
                runs.clear();
                self.state.lock().zero_mapped = 0;
                return;
            }
        }
        runs.append(&mut found);
        if !full {
            coalesce(runs);
        }
        let more = {
            let mut s = self.state.lock();
            // An incremental look adds to what the state holds now (a
            // victim may have left the count meanwhile).
            let now = if full { zero } else { s.zero_mapped + zero };
            let more = now > s.zero_mapped;
            s.zero_mapped = now;
            more
        };
        if more {
            // Faults held back for room may find it now.
            self.wake.signal();
        }
    }

    /// Counts the victims (sorted by address) that lie in runs found
    /// mapping the zero page (`PagerStats::evict_zero_mapped`), and takes
    /// them out of the zero-mapped count: they leave. From the tracked runs
    /// alone, no system call: a scan of the batch's range would walk the
    /// page tables between victims spread over the heap, 9 % of the wall
    /// time of a Python dict read at random. A victim written since the
    /// last look is taken out all the same, which leaves the count low
    /// (charged more) until the next full look.
    pub(super) fn count_zero_mapped(&self, victims: &[Victim]) {
        let Some(look) = &self.zero_scan else {
            return;
        };
        let n = {
            let look = look.lock();
            let runs = &look.runs;
            if runs.is_empty() {
                return;
            }
            victims
                .iter()
                .filter(|v| {
                    let i = runs.partition_point(|&(_, end)| end <= v.addr);
                    runs.get(i).is_some_and(|&(lo, _)| lo <= v.addr)
                })
                .count()
        };
        let mut s = self.state.lock();
        s.stats.evict_zero_mapped += n as u64;
        s.zero_mapped = s.zero_mapped.saturating_sub(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_coalesce_and_subtract() {
        let mut v = vec![(30, 40), (0, 10), (10, 20), (35, 50), (60, 70)];
        coalesce(&mut v);
        assert_eq!(v, vec![(0, 20), (30, 50), (60, 70)]);
        let have = vec![(5, 8), (30, 50)];
        assert_eq!(
            uncovered(&[(0, 20), (25, 55), (60, 70)], &have),
            vec![(0, 5), (8, 20), (25, 30), (50, 55), (60, 70)]
        );
        assert_eq!(uncovered(&[(31, 49)], &have), vec![]);
        assert_eq!(uncovered(&[(0, 4)], &[]), vec![(0, 4)]);
    }

    #[test]
    fn runs_are_clipped_to_segments() {
        let mut segs = BTreeMap::new();
        for (start, len) in [(100, 50), (200, 100)] {
            segs.insert(
                start,
                Seg {
                    len,
                    area: 0,
                    first: 0,
                },
            );
        }
        assert_eq!(
            clip(&segs, &[(0, 120), (140, 250), (290, 400)]),
            vec![(100, 120), (140, 150), (200, 250), (290, 300)]
        );
        assert_eq!(clip(&segs, &[(150, 200)]), vec![]);
    }
}
