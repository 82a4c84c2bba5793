//! A usemem-like workload (seeds 000 and 002): fill memory with pages, then
//! passes that read every page, check it, and rewrite a fifth of them.
//! The same code runs over plain anonymous memory (in a child under a
//! memory cgroup, for the kernel's numbers) and over uzswap memory.

use crate::corpus::{DataKind, Pages, PAGE};
use rand::{Rng, SeedableRng};
use std::time::Instant;

/// Which pages a pass touches.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Every page in order.
    Seq,
    /// A hot fifth of the pages 80 % of the time.
    Skewed,
}

/// The usemem workload's size, data and pattern, and the compressor: the
/// arguments `uzswap-bench usemem` and `uzswap-bench run` share.
#[derive(clap::Args, Clone, Debug)]
pub struct WorkloadArgs {
    /// MiB of memory the workload uses.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=16384))]
    mib: u64,
    /// Resident budget in MiB (for `uzswap-bench run` also the cgroup's
    /// limit).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=16384))]
    budget_mib: u64,
    #[arg(long, value_enum, default_value = "mixed")]
    pub data: DataKind,
    #[arg(long, value_enum, default_value = "seq")]
    pub pattern: Pattern,
    /// lz4, lz4hc[:LEVEL], zstd[:LEVEL], deflate[:LEVEL] (the kernel is
    /// asked for the same; it falls back to lzo if it lacks it).
    #[arg(long, default_value = "lz4")]
    pub compressor: String,
}

impl WorkloadArgs {
    /// MiB of memory the workload uses.
    pub fn mib(&self) -> usize {
        self.mib as usize
    }
    /// The resident budget in MiB.
    pub fn budget_mib(&self) -> usize {
        self.budget_mib as usize
    }
}

/// What a run measured.
#[derive(Debug, Default, Clone, serde::Serialize, serde::Deserialize)]
pub struct Report {
    pub fill_kbps: f64,
    pub pass_kbps: f64,
    pub corrupt_pages: u64,
    pub pages: u64,
    pub passes: u32,
    /// Page accesses in the passes that took longer than
    /// [`FAULT_THRESHOLD_NS`] as the workload saw them: page faults
    /// (reading a mapped page takes well under it).
    #[serde(default)]
    pub faults_seen: u64,
    /// Their latency at p50 and p99, in µs, timed around the first read of
    /// the page by the workload itself (the whole round trip: trap, the
    /// kernel or the handler thread, back to the program).
    #[serde(default)]
    pub fault_p50_us: f64,
    #[serde(default)]
    pub fault_p99_us: f64,
    /// Their mean, in µs: what the throughput pays (the median hides the
    /// tail).
    #[serde(default)]
    pub fault_mean_us: f64,
}

/// An access slower than this counts as a page fault.
pub const FAULT_THRESHOLD_NS: u32 = 1_000;

/// The first read of `page`, timed; nanoseconds.
fn timed_touch(page: &[u8]) -> u32 {
    use std::sync::atomic::{compiler_fence, Ordering::SeqCst};
    let t = Instant::now();
    compiler_fence(SeqCst);
    // SAFETY: the page is a live slice; a volatile read cannot be elided.
    let _ = unsafe { std::ptr::read_volatile(page.as_ptr()) };
    compiler_fence(SeqCst);
    t.elapsed().as_nanos().min(u32::MAX as u128) as u32
}

/// The `q` quantile of sorted nanoseconds, in µs.
fn quantile_us(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i] as f64 / 1e3
}

/// The workload's page contents: page `i` is corpus page `i % count`;
/// in each cycle through the corpus after the first its first 8 bytes are
/// XORed with the cycle number, unless it is one repeated word (zero and
/// same-filled pages stay so). A workload larger than the corpus so holds
/// no copies across cycles, while the corpus's own copies (the mixed data's
/// share of duplicates) stay copies within a cycle. `workloads/usemem.c`
/// follows the same rule.
struct Contents<'a> {
    pages: &'a Pages,
    /// Corpus pages that are one repeated word.
    same: Vec<bool>,
}

impl<'a> Contents<'a> {
    fn new(pages: &'a Pages) -> Contents<'a> {
        let same = (0..pages.count())
            .map(|c| uzswap_cache::same_filled_word(pages.page(c)).is_some())
            .collect();
        Contents { pages, same }
    }

    /// The page expected at index `i`: as filled, with its first 8 bytes
    /// replaced by `stamp` once rewritten (`stamp` 0: never rewritten).
    fn expected(&self, i: usize, stamp: u64, out: &mut [u8]) {
        let (cycle, c) = (i / self.pages.count(), i % self.pages.count());
        out.copy_from_slice(self.pages.page(c));
        let head = if stamp != 0 {
            stamp
        } else {
            let h = u64::from_ne_bytes(out[..8].try_into().expect("8 bytes"));
            if self.same[c] {
                h
            } else {
                h ^ cycle as u64
            }
        };
        out[..8].copy_from_slice(&head.to_ne_bytes());
    }
}

/// Runs the workload over `mem` (a whole number of pages).
pub fn run(mem: &mut [u8], pages: &Pages, pattern: Pattern, passes: u32) -> Report {
    let n = mem.len() / PAGE;
    let mut stamps = vec![0u64; n];
    let mut want = vec![0u8; PAGE];
    let contents = Contents::new(pages);
    let t = Instant::now();
    for i in 0..n {
        contents.expected(i, 0, &mut mem[i * PAGE..(i + 1) * PAGE]);
    }
    let fill_s = t.elapsed().as_secs_f64();
    let mut r = rand::rngs::SmallRng::seed_from_u64(1);
    let mut corrupt = 0u64;
    let hot = (n / 5).max(1);
    // Reserved before the timing starts, on both sides of a comparison
    // (4 bytes a sample: in the kernel's run it is charged to the cgroup).
    let mut slow: Vec<u32> = Vec::with_capacity(n * passes as usize);
    let t = Instant::now();
    let mut touched = 0u64;
    for pass in 0..passes {
        for k in 0..n {
            let i = match pattern {
                Pattern::Seq => k,
                Pattern::Skewed => {
                    if r.gen_bool(0.8) {
                        r.gen_range(0..hot)
                    } else {
                        r.gen_range(hot..n.max(hot + 1)).min(n - 1)
                    }
                }
            };
            let page = &mut mem[i * PAGE..(i + 1) * PAGE];
            let ns = timed_touch(page);
            if ns > FAULT_THRESHOLD_NS {
                slow.push(ns);
            }
            contents.expected(i, stamps[i], &mut want);
            if page != &want[..] {
                corrupt += 1;
            }
            if r.gen_range(0..5) == 0 {
                let stamp = (u64::from(pass) + 1) << 32 | k as u64 | 1 << 63;
                stamps[i] = stamp;
                page[..8].copy_from_slice(&stamp.to_ne_bytes());
            }
            touched += 1;
        }
    }
    let pass_s = t.elapsed().as_secs_f64();
    let kib = |pages: u64, s: f64| pages as f64 * 4.0 / s.max(1e-9);
    slow.sort_unstable();
    Report {
        fill_kbps: kib(n as u64, fill_s),
        pass_kbps: kib(touched, pass_s),
        corrupt_pages: corrupt,
        pages: n as u64,
        passes,
        faults_seen: slow.len() as u64,
        fault_p50_us: quantile_us(&slow, 0.5),
        fault_p99_us: quantile_us(&slow, 0.99),
        fault_mean_us: slow.iter().map(|&ns| u64::from(ns)).sum::<u64>() as f64
            / slow.len().max(1) as f64
            / 1e3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_of_sorted_nanoseconds() {
        assert_eq!(quantile_us(&[], 0.5), 0.0);
        let ns: Vec<u32> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(quantile_us(&ns, 0.5), 51.0);
        assert_eq!(quantile_us(&ns, 0.99), 99.0);
        assert_eq!(quantile_us(&ns[..1], 0.99), 1.0);
    }

    /// Cycles through the corpus are not copies of each other; the corpus's
    /// own copies stay copies within a cycle; one-word pages stay one word.
    #[test]
    fn contents_copy_within_a_cycle_but_not_across() {
        let text: Vec<u8> = (0..PAGE).map(|i| b"corpus text "[i % 12]).collect();
        let other: Vec<u8> = (0..PAGE).map(|i| (i * 7 % 251) as u8).collect();
        let mut bytes = vec![0u8; PAGE]; // a zero page
        bytes.extend_from_slice(&text);
        bytes.extend_from_slice(&text); // a copy
        bytes.extend_from_slice(&other);
        bytes.extend(std::iter::repeat_n(0xabu8, PAGE)); // same-filled
        let pages = Pages {
            bytes,
            source: "test".into(),
        };
        let c = Contents::new(&pages);
        let n = 3 * pages.count();
        let all: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                let mut p = vec![0u8; PAGE];
                c.expected(i, 0, &mut p);
                p
            })
            .collect();
        for (i, p) in all.iter().enumerate() {
            let k = i % pages.count();
            assert_eq!(
                &p[8..],
                &pages.page(k)[8..],
                "page {i}: only the head changes"
            );
            if k == 0 || k == 4 {
                assert_eq!(p, pages.page(k), "one-word page {i} stays so");
            } else {
                assert_eq!(i < pages.count(), p == pages.page(k), "page {i}");
            }
        }
        for cycle in 0..3 {
            let b = cycle * pages.count();
            assert_eq!(
                all[b + 1],
                all[b + 2],
                "the copy stays a copy in cycle {cycle}"
            );
            for later in cycle + 1..3 {
                let l = later * pages.count();
                assert_ne!(all[b + 1], all[l + 1], "cycles {cycle} and {later}");
                assert_ne!(all[b + 3], all[l + 3], "cycles {cycle} and {later}");
            }
        }
        let mut p = vec![0u8; PAGE];
        c.expected(7, 0xdead, &mut p);
        assert_eq!(
            &p[..8],
            &0xdeadu64.to_ne_bytes()[..],
            "a stamp replaces the head"
        );
    }
}
