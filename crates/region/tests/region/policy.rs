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

/// Victims that never joined the working set are stored cold; pages
/// activated by a short refault distance are stored plain when evicted
/// again. Contents stay right throughout.
#[test]
fn victims_outside_the_working_set_are_stored_cold() {
    use std::sync::atomic::Ordering::Relaxed;
    const BUDGET: usize = 64;
    const PAGES: usize = 512;
    let mut cfg = PagerConfig::new(BUDGET);
    cfg.readahead_max = 0;
    let store = std::sync::Arc::new(TestStore::default());
    let pager = uzswap_region::Pager::new(store.clone(), cfg).expect("userfaultfd (root)");
    let r = pager.region(PAGES * PAGE).unwrap();
    let base = r.as_ptr();
    // A first pass: every page is new, none has refaulted.
    for p in 0..PAGES {
        fill(page_mut(base, p), p, 1);
    }
    assert!(eventually(|| store.cold.load(Relaxed) > 0));
    assert_eq!(
        store.plain.load(Relaxed),
        0,
        "pages seen once are stored cold"
    );
    // A working set a little larger than the budget, cycled: its pages
    // refault within the budget's distance, join the active list, and
    // are stored plain when they leave again.
    let set = BUDGET + BUDGET / 2;
    // Each page is checked and rewritten, so that it is stored again.
    let mut want = vec![0u8; PAGE];
    for round in 0..40u32 {
        for p in 0..set {
            fill(&mut want, p, round.max(1));
            assert_eq!(page_mut(base, p), &want[..], "page {p}, round {round}");
            fill(page_mut(base, p), p, round + 1);
        }
        pager.check_invariants().unwrap();
    }
    let (plain, cold) = (store.plain.load(Relaxed), store.cold.load(Relaxed));
    eprintln!("stores: {plain} plain, {cold} cold");
    assert!(plain > 0, "refaulting pages are stored plain ({cold} cold)");
}

/// The refault distance measured for a list of victims held uncompressed
/// (`refaults_near`: within an eighth of the limit): a loop just over the
/// budget refaults near, a stream far over it never does, and the counts
/// nest (near ⊆ activated ⊆ refaults). Contents stay right throughout.
#[test]
fn refaults_near_count_short_distances_only() {
    const BUDGET: usize = 256;
    let run = |pages: usize, passes: usize| {
        let mut cfg = PagerConfig::new(BUDGET);
        cfg.readahead_max = 0;
        let (pager, _store) = pager_with(cfg);
        let r = pager.region(pages * PAGE).unwrap();
        let base = r.as_ptr();
        for p in 0..pages {
            fill(page_mut(base, p), p, 1);
        }
        let mut want = vec![0u8; PAGE];
        for _ in 0..passes {
            for p in 0..pages {
                fill(&mut want, p, 1);
                assert!(page_mut(base, p) == &want[..], "page {p}");
            }
        }
        pager.stats()
    };
    // A loop of 264 pages in 256: each page is back after about as many
    // evictions as the loop overflows the resident pages by.
    let near = run(BUDGET + BUDGET / 32, 6);
    // A stream of 2048 pages: each is back after about 1800 evictions.
    let far = run(BUDGET * 8, 2);
    eprintln!(
        "loop: refaults {} activated {} near {}; stream: refaults {} activated {} near {}",
        near.refaults,
        near.refaults_activated,
        near.refaults_near,
        far.refaults,
        far.refaults_activated,
        far.refaults_near
    );
    for s in [&near, &far] {
        assert!(s.refaults_near <= s.refaults_activated);
        assert!(s.refaults_activated <= s.refaults);
    }
    assert!(near.refaults > 0 && far.refaults > 0);
    assert!(
        near.refaults_near * 2 > near.refaults,
        "a loop just over the budget refaults near: {near:?}"
    );
    // Near none. A zero run that crossed the eviction threshold lost its
    // own pages to the evictor just ahead of the writing thread, each
    // then faulted back near: up to 259 of 4096 (a budget's worth).
    assert!(
        far.refaults_near * 100 < far.refaults,
        "a stream 8 x the budget: {far:?}"
    );
}
