//! A bounded soak of the whole stack: threads read, check and rewrite the
//! pages of a region eight times its budget, so eviction, the compressed
//! pool, writeback and the backing file all work all the time, with the
//! pool and the backing file both near their limits, while a chaos thread
//! injects write failures, full-disk errors, short writes, read errors,
//! flipped bits and truncated reads into the backing file. A read fault is
//! survived by the pager's retry; a write fault keeps the page in the pool
//! or in memory (`FaultInjector::chaos` spaces read faults so that the
//! retry gets through). Every page is checked all along and at the end: pages
//! lost must be 0, and no access may get SIGBUS.
//!
//! 4 s by default (CI); longer with `UZSWAP_SOAK_SECONDS=300 cargo test
//! --release -p uzswap-region --test region soak -- --nocapture`.

use crate::common::*;
use crate::stress::{hammer_for, BUDGET};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use uzswap_cache::{Backing, Cache, CacheConfig, FaultInjector, FileBacking, PoolLimit};

#[test]
fn soak_region_over_a_failing_backing_file() {
    let secs: u64 = std::env::var("UZSWAP_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let evicted = 7 * BUDGET; // pages outside the budget
    let inj = Arc::new(FaultInjector::new(
        FileBacking::create(&std::env::temp_dir()).unwrap(),
    ));
    let cache = Arc::new(
        Cache::new(CacheConfig {
            // A pool for about a tenth of the evicted pages (they compress
            // to about a third), a file for about three quarters of them.
            pool_limit: PoolLimit::Bytes((evicted * PAGE / 30) as u64),
            backing: Backing::Store(Box::new(inj.clone())),
            backing_max_bytes: Some((evicted * 3 / 4 * PAGE) as u64),
            writeback_batch: 16,
            ..CacheConfig::default()
        })
        .unwrap(),
    );
    let mut cfg = uzswap_region::PagerConfig::new(BUDGET);
    cfg.keep_clean = false;
    let pager = uzswap_region::Pager::new(cache.clone(), cfg).unwrap();
    let stop = AtomicBool::new(false);
    let report = std::thread::scope(|sc| {
        sc.spawn(|| inj.chaos(&stop, 7));
        let r = hammer_for(
            &pager,
            Duration::from_secs(secs),
            false,
            crate::common::fill,
        );
        stop.store(true, Ordering::Relaxed);
        r
    });
    let ps = pager.stats();
    let cs = cache.stats();
    eprintln!(
        "soak {secs} s: {} operations, {} faults injected, {} loads retried, {} load errors, \
         {} stores refused, {} writeback failures, {} pages from the file, {} pages checked, \
         {} pages lost",
        report.operations,
        inj.injected(),
        ps.load_retries,
        ps.load_errors,
        ps.store_rejected,
        cs.writeback_fail,
        cs.loads_backing,
        report.pages_checked,
        report.pages_lost,
    );
    assert_eq!(report.pages_lost, 0);
    assert_eq!(ps.load_errors, 0, "an access got SIGBUS: {ps:?}");
    assert!(inj.injected() > 0, "no fault was injected");
    assert!(cs.loads_backing > 0 && cs.written_back_pages > 0, "{cs:?}");
    assert!(ps.evictions > 1000, "{ps:?}");
    drop(pager);
    let cs = cache.stats();
    assert_eq!(cs.stored_pages + cs.backing_pages, 0, "{cs:?}");
    cache.check_invariants().unwrap();
}
