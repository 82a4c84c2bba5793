//! Pager statistics: counters users read, and a fault latency histogram.

use crate::store::StoreStats;
use serde::{Deserialize, Serialize};

/// Linear buckets of 100 ns up to 50 µs, then doubling buckets up to ~1.6 s.
const LINEAR_NS: u64 = 100;
const LINEAR_BUCKETS: usize = 500;
const LOG_BUCKETS: usize = 16;

/// A latency histogram in nanoseconds.
#[derive(Clone, Debug)]
pub struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    sum_ns: u64,
    max_ns: u64,
}

impl Default for Histogram {
    fn default() -> Histogram {
        Histogram {
            buckets: vec![0; LINEAR_BUCKETS + LOG_BUCKETS],
            count: 0,
            sum_ns: 0,
            max_ns: 0,
        }
    }
}

impl Histogram {
    /// Records one sample.
    pub fn record(&mut self, ns: u64) {
        let i = if ns < LINEAR_NS * LINEAR_BUCKETS as u64 {
            (ns / LINEAR_NS) as usize
        } else {
            let over = ns / (LINEAR_NS * LINEAR_BUCKETS as u64);
            let l = (64 - over.leading_zeros()) as usize; // 1.. for over >= 1
            LINEAR_BUCKETS + (l - 1).min(LOG_BUCKETS - 1)
        };
        self.buckets[i] += 1;
        self.count += 1;
        self.sum_ns += ns;
        self.max_ns = self.max_ns.max(ns);
    }

    /// Upper bound of bucket `i` in ns.
    fn upper(i: usize) -> u64 {
        if i < LINEAR_BUCKETS {
            (i as u64 + 1) * LINEAR_NS
        } else {
            LINEAR_NS * LINEAR_BUCKETS as u64 * (2u64 << (i - LINEAR_BUCKETS))
        }
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Their sum, ns.
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns
    }

    /// The `q` quantile (0..=1) in ns, as its bucket's upper bound.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let want = ((self.count as f64 * q).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b;
            if seen >= want {
                return Histogram::upper(i).min(self.max_ns.max(1));
            }
        }
        self.max_ns
    }

    /// Summary for reports.
    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            count: self.count,
            mean_us: if self.count == 0 {
                0.0
            } else {
                self.sum_ns as f64 / self.count as f64 / 1000.0
            },
            p50_us: self.quantile_ns(0.5) as f64 / 1000.0,
            p99_us: self.quantile_ns(0.99) as f64 / 1000.0,
            max_us: self.max_ns as f64 / 1000.0,
        }
    }
}

/// Quantiles of a latency histogram, in microseconds.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencySummary {
    /// Samples.
    pub count: u64,
    /// Mean.
    pub mean_us: f64,
    /// Median (upper bound of its 100 ns bucket).
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Largest sample.
    pub max_us: f64,
}

/// Counters of one pager (all its regions).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PagerStats {
    /// Missing faults resolved with zeros (never-touched or discarded page).
    pub faults_zero: u64,
    /// Missing faults resolved from the store's in-memory pool.
    pub faults_pool: u64,
    /// Missing faults resolved from the store's backing file.
    pub faults_backing: u64,
    /// Missing faults resolved from a same-filled entry.
    pub faults_same_filled: u64,
    /// Write-protect faults (a write to a clean or mid-eviction page).
    pub faults_wp: u64,
    /// Faults that had to wait for an eviction in flight on their page.
    pub faults_parked: u64,
    /// CPU handlers running (0: the main handler serves every fault).
    pub cpu_handlers: u64,
    /// Faults a CPU handler resolved on the CPU they came from (as far as
    /// it can tell: it had just been preempted by a thread of its CPU).
    pub faults_local: u64,
    /// Faults a CPU handler took over after they waited for their CPU's
    /// handler (that CPU was busy).
    pub faults_remote: u64,
    /// Faults held back because the resident budget was full.
    pub faults_throttled: u64,
    /// Faults deferred because an event was being delivered (the
    /// resolving ioctl failed with EAGAIN: someone, usually the evictor,
    /// was discarding pages of a region).
    pub faults_again: u64,
    /// In-thread faults (and pins) that waited on the settle sequence: the
    /// page was under eviction or being loaded, or the fault was held back
    /// (budget full, a fork, list capacity).
    pub faults_waited: u64,
    /// Of those, waits that ran to their bound (2 ms) with no settle
    /// meanwhile: the access then simply ran again.
    pub waits_timed_out: u64,
    /// The process's CPU latency request (`PagerConfig::latency_hold`):
    /// "held", "released", "unavailable" (the device needs root), "off",
    /// or "unused" (no message read yet).
    pub latency_hold: String,
    /// Bursts of messages the request was held for.
    pub latency_holds: u64,
    /// Time it was held, in all.
    pub latency_held_s: f64,
    /// Messages (faults and events) the handlers read while it was held.
    pub latency_read_held: u64,
    /// What chooses victims beside the lists: "chunks" (the access signal
    /// of `clear_refs` and `smaps`), "off", or why it is not in force
    /// ("unavailable (...)", "failed (...)").
    pub access_signal: String,
    /// Chunk mappings made for the access signal.
    pub access_chunks: u64,
    /// Regions left whole (the map-count limit left no room, or the
    /// split failed): the lists alone choose their victims.
    pub access_unsplit_regions: u64,
    /// Samples of the access signal taken, and their time in all.
    pub access_samples: u64,
    pub access_sample_s: f64,
    /// Resident pages given a second chance because their chunk was
    /// touched.
    pub access_second_chances: u64,
    /// Resident pages in untouched chunks at the last sample.
    pub access_cold_pages: u64,
    /// Victims taken from those before the lists.
    pub access_cold_victims: u64,
    /// Pages the pager believed mapped that a fault found unmapped (the
    /// program's MADV_DONTNEED racing with its own access): mapped again
    /// as zeros, as a discarded page reads.
    pub faults_rezeroed: u64,
    /// Faults on addresses no region owns (served with zeros).
    pub faults_foreign: u64,
    /// Pages brought back with a faulting neighbour (readahead).
    pub readahead_pages: u64,
    /// Untouched pages mapped as zeros with a faulting neighbour (zero
    /// readahead; see `PagerConfig::zero_readahead_max`).
    pub zero_readahead_pages: u64,
    /// Refaults: missing faults on pages that had been evicted.
    pub refaults: u64,
    /// Refaults whose refault distance was within the budget (the page is
    /// part of the working set and was activated).
    pub refaults_activated: u64,
    /// Refaults within an eighth of the limit (evictions since the page
    /// left): pages a list of that size, holding victims uncompressed
    /// until they are touched or pass its end, would have kept from the
    /// store (a measure for that design, which needs no accessed bits).
    pub refaults_near: u64,
    /// Pages evicted after being stored (dirty pages).
    pub evictions: u64,
    /// Clean pages dropped without storing (the store kept their copy).
    pub clean_drops: u64,
    /// Evictions abandoned because a write hit the page.
    pub evictions_aborted: u64,
    /// Entries on the victim lists (a gauge), stale ones included: a page
    /// queued again, or gone, leaves its old entry until the evictor
    /// reaches it.
    pub list_entries: u64,
    /// Heap bytes the victim lists hold (a gauge: their capacity).
    pub lists_bytes: u64,
    /// `MADV_DONTNEED` calls the evictor made, one per run of neighbouring
    /// victims; each is a remove event through the handler. Evictions plus
    /// clean drops, less moved pages, over this is the pages released per
    /// call.
    pub discard_calls: u64,
    /// Evicted or clean pages that left by a move into the staging area
    /// (`UFFDIO_MOVE`: no remove event) rather than `MADV_DONTNEED`.
    pub evict_moved_pages: u64,
    /// Of those, dirty pages moved out before they were stored (no write
    /// protection; see `PagerCore::move_out`).
    pub evict_moved_first: u64,
    /// Moved-out pages the store refused, copied back in place.
    pub evict_moved_back: u64,
    /// Of the resident pages, those that mapped the shared zero page at the
    /// evictor's last look (a gauge): they hold no memory, and the budget
    /// does not count them.
    pub zero_mapped_pages: u64,
    /// Victims that lay in runs the evictor found mapping the shared zero
    /// page (a first touch or a read mapped them as zeros, nothing wrote
    /// them since its look): evicting one frees no memory.
    pub evict_zero_mapped: u64,
    /// Evictions abandoned because the store refused the page.
    pub store_rejected: u64,
    /// Loads that failed (the access gets SIGBUS through a poison marker).
    pub load_errors: u64,
    /// Failed loads tried again (a transient read error or failed check).
    pub load_retries: u64,
    /// Pages discarded by the program (madvise/munmap) while held.
    pub discarded_pages: u64,
    /// Remap events handled.
    pub remaps: u64,
    /// Times the fork hook brought every evicted page back.
    pub fork_prefaults: u64,
    /// Pages brought back by the fork hook.
    pub fork_prefault_pages: u64,
    /// Resident pages now (mapped in some region).
    pub resident_pages: u64,
    /// Highest count of resident pages that hold memory seen (less those
    /// that mapped the zero page, with `PagerConfig::uncharged_zero_pages`).
    pub peak_resident_pages: u64,
    /// Times the store refused a whole eviction batch (its pool full and
    /// nowhere to write back): until a store succeeds again the budget is
    /// soft, faults are served past it rather than held forever.
    pub store_full_episodes: u64,
    /// Whether the budget is soft right now (see `store_full_episodes`).
    pub over_budget: bool,
    /// Pages held by the store for these regions now.
    pub stored_pages: u64,
    /// The budget in pages.
    pub budget_pages: u64,
    /// What `PagerConfig::charge` last reported (bytes the budget pays
    /// for outside the regions); 0 without a charge.
    pub charged_bytes: u64,
    /// Pages the regions may hold now: the budget less the charge (at
    /// least a quarter of the budget).
    pub limit_pages: u64,
    /// Handler service time of missing faults served from the store: from
    /// reading the message to the faulting page being mapped (its
    /// readahead followers are mapped after that). The faulting thread
    /// also pays the kernel's fault entry and its own wake-up.
    pub fault_latency: LatencySummary,
    /// Time inside `UFFDIO_COPY` for store faults (part of `fault_latency`;
    /// it includes the kernel waking the faulting thread).
    pub copy_latency: LatencySummary,
    /// Handler service time of zero-page faults.
    pub zero_fault_latency: LatencySummary,
    /// The store's own counters.
    pub store: StoreStats,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let mut h = Histogram::default();
        for i in 1..=100u64 {
            h.record(i * 400);
        }
        let p50 = h.quantile_ns(0.5);
        assert!((20_000..=20_100).contains(&p50), "{p50}");
        assert!(h.quantile_ns(0.99) >= 39_600);
        h.record(10_000_000_000);
        assert_eq!(h.summary().count, 101);
    }
}
