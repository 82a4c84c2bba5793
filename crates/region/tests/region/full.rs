//! A store that refuses pages (a full pool with no backing file) must not
//! stop the program: the budget turns soft, every page keeps its data, and
//! the statistics say so.

use crate::common::*;
use rand::{RngCore, SeedableRng};
use std::sync::Arc;

#[test]
fn a_full_pool_without_backing_lets_the_program_go_over_budget() {
    const BUDGET: usize = 64;
    const PAGES: usize = 8 * BUDGET;
    // Room for about BUDGET compressed pages of random data, no backing.
    let cache = Arc::new(
        uzswap_cache::Cache::new(uzswap_cache::CacheConfig {
            pool_limit: uzswap_cache::PoolLimit::Bytes((BUDGET * PAGE) as u64),
            ..uzswap_cache::CacheConfig::default()
        })
        .unwrap(),
    );
    let pager =
        uzswap_region::Pager::new(cache.clone(), uzswap_region::PagerConfig::new(BUDGET)).unwrap();
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
