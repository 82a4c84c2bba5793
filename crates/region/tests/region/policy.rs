//! Victim choice: on a skewed pattern (a hot fifth of the pages gets 80 %
//! of the accesses) the workingset policy must refault less than FIFO.

use crate::common::*;
use rand::{Rng, SeedableRng};
use uzswap_region::{PagerConfig, VictimPolicy};

fn refaults(policy: VictimPolicy) -> (u64, u64) {
    const BUDGET: usize = 256;
    const PAGES: usize = 1024;
    let mut cfg = PagerConfig::new(BUDGET);
    cfg.policy = policy;
    cfg.readahead_max = 0;
    let (pager, _store) = pager_with(cfg);
    let r = pager.region(PAGES * PAGE).unwrap();
    let base = r.as_ptr();
    for p in 0..PAGES {
        fill(page_mut(base, p), p, 1);
    }
    let hot = PAGES / 5;
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let access = |rng: &mut rand::rngs::StdRng| {
        let p = if rng.gen_bool(0.8) {
            rng.gen_range(0..hot)
        } else {
            rng.gen_range(hot..PAGES)
        };
        touch(base, p);
        if rng.gen_bool(0.2) {
            page_mut(base, p)[8] ^= 1;
        }
    };
    for _ in 0..20_000 {
        access(&mut rng);
    }
    let before = pager.stats();
    let n = 40_000;
    for _ in 0..n {
        access(&mut rng);
    }
    let after = pager.stats();
    let loads = |s: &uzswap_region::PagerStats| s.faults_pool + s.faults_same_filled;
    (loads(&after) - loads(&before), n)
}

#[test]
fn policy_beats_fifo_on_skewed_access() {
    let (fifo, n) = refaults(VictimPolicy::Fifo);
    let (ws, _) = refaults(VictimPolicy::Workingset);
    eprintln!(
        "skewed 80/20, 1024 pages, budget 256, {n} accesses: refaults fifo {fifo} ({:.1} %), workingset {ws} ({:.1} %)",
        100.0 * fifo as f64 / n as f64,
        100.0 * ws as f64 / n as f64
    );
    assert!(ws * 10 < fifo * 9, "workingset {ws} vs fifo {fifo}");
}
