//! A store that refuses pages (a full pool with no backing file) must not
//! stop the program: the budget turns soft, every page keeps its data, and
//! the statistics say so.

use crate::common::*;
use rand::{RngCore, SeedableRng};
use std::sync::Arc;

/// A pager with a budget of `budget` pages over a cache with room for
/// about `budget` compressed pages of random data and no backing file.
fn full_pool_pager(budget: usize) -> (Arc<uzswap_cache::Cache>, uzswap_region::Pager) {
    let cache = Arc::new(
        uzswap_cache::Cache::new(uzswap_cache::CacheConfig {
            pool_limit: uzswap_cache::PoolLimit::Bytes((budget * PAGE) as u64),
            ..uzswap_cache::CacheConfig::default()
        })
        .unwrap(),
    );
    let pager =
        uzswap_region::Pager::new(cache.clone(), uzswap_region::PagerConfig::new(budget)).unwrap();
    (cache, pager)
}

#[test]
fn a_full_pool_without_backing_lets_the_program_go_over_budget() {
    const BUDGET: usize = 64;
    const PAGES: usize = 8 * BUDGET;
    let (cache, pager) = full_pool_pager(BUDGET);
    let mut r = pager.region(PAGES * PAGE).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut want = vec![0u8; PAGES * PAGE];
    rng.fill_bytes(&mut want);
    // Writing every page must finish (it would hang if faults waited for
    // room the store can never make).
    r.as_mut_slice().copy_from_slice(&want);
    assert!(r.as_mut_slice() == &want[..], "a page came back wrong");
    let st = pager.stats();
    assert!(st.store_full_episodes > 0, "{st:?}");
    assert!(st.store_rejected > 0, "{st:?}");
    assert!(st.peak_resident_pages > BUDGET as u64, "{st:?}");
    assert!(cache.stats().reject_reclaim_fail > 0);
    pager.check_invariants().unwrap();
}

/// The same, writing the even pages first and then the odd ones: victims
/// are then isolated pages, which the pager moves out of the region before
/// storing them. Those the store refuses must come back with their bytes.
#[test]
fn refused_pages_that_were_moved_out_come_back() {
    let _watchdog = watchdog("refused_pages_that_were_moved_out_come_back", 60);
    const BUDGET: usize = 64;
    const PAGES: usize = 8 * BUDGET;
    let (_cache, pager) = full_pool_pager(BUDGET);
    let mut r = pager.region(PAGES * PAGE).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let mut want = vec![0u8; PAGES * PAGE];
    rng.fill_bytes(&mut want);
    let mem = r.as_mut_slice();
    for first in [0, 1] {
        for p in (first..PAGES).step_by(2) {
            mem[p * PAGE..(p + 1) * PAGE].copy_from_slice(&want[p * PAGE..(p + 1) * PAGE]);
        }
    }
    for p in 0..PAGES {
        assert!(
            mem[p * PAGE..(p + 1) * PAGE] == want[p * PAGE..(p + 1) * PAGE],
            "page {p} came back wrong"
        );
    }
    let st = pager.stats();
    assert!(st.evict_given_back > 0, "{st:?}");
    assert!(st.store_rejected > 0, "{st:?}");
    pager.check_invariants().unwrap();
}
