//! A bounded soak: threads store, load, invalidate and write back with the
//! pool and the backing tier both near their limits, while a chaos thread
//! injects write failures, full-disk errors, short writes, read errors and
//! flipped bits. Every load is checked; a load that fails must fail only
//! because of an injected fault, and the page must come back on retry.
//! At the end, with faults off, every page still stored must read back
//! exactly: pages lost must be 0.
//!
//! 5 s by default (CI); longer with `UZSWAP_SOAK_SECONDS=600 cargo test
//! --release -p uzswap-cache --test soak -- --nocapture`.

mod common;

use common::{page, KINDS};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uzswap_cache::{
    Backing, Cache, CacheConfig, FaultInjector, FileBacking, LoadError, LoadMode, PoolLimit,
    StoreError, PAGE_SIZE,
};

const THREADS: u64 = 6;
const KEYS: u64 = 2048; // per thread

/// What the workers count, for the report.
#[derive(Default)]
struct Counts {
    ops: AtomicU64,
    /// Stores refused.
    refused: AtomicU64,
    /// Loads that failed (an injected fault) and succeeded on retry.
    survived: AtomicU64,
}

#[test]
fn soak() {
    let secs: u64 = std::env::var("UZSWAP_SOAK_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let inj = Arc::new(FaultInjector::new(
        FileBacking::create(&std::env::temp_dir()).unwrap(),
    ));
    let cache = Arc::new(
        Cache::new(CacheConfig {
            // Pool for ~1/8 of the pages, tier for ~3/4: both near full.
            pool_limit: PoolLimit::Bytes(THREADS * KEYS / 8 * 4096 / 2),
            backing: Backing::Store(Box::new(inj.clone())),
            backing_max_bytes: Some(THREADS * KEYS * 3 / 4 * 4096),
            writeback_batch: 32,
            dedup: true,
            ..CacheConfig::default()
        })
        .unwrap(),
    );
    for a in 0..THREADS as u32 {
        cache.open_area(a).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let chaos = {
        let (inj, stop) = (inj.clone(), stop.clone());
        std::thread::spawn(move || inj.chaos(&stop, 99))
    };
    let deadline = Instant::now() + Duration::from_secs(secs);
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (cache, counts) = (cache.clone(), counts.clone());
            std::thread::spawn(move || work(t, &cache, &counts, deadline))
        })
        .collect();
    let models: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, Ordering::Relaxed);
    chaos.join().unwrap();
    inj.disarm();
    let mut lost = 0u64;
    let mut checked = 0u64;
    let mut buf = vec![0u8; PAGE_SIZE];
    for (t, model) in models.iter().enumerate() {
        for (&off, &(k, s)) in model {
            checked += 1;
            match cache.load(t as u32, off, &mut buf, LoadMode::Keep) {
                Ok(_) if buf == page(k, s) => {}
                _ => lost += 1,
            }
        }
    }
    let st = cache.stats();
    let report = format!(
        "soak {secs}s: {} ops, {} faults injected, {} failed loads survived, {} stores refused, {} pages checked, {} lost; written back {}, loads from tier {}, writeback failures {}",
        counts.ops.load(Ordering::Relaxed),
        inj.injected(),
        counts.survived.load(Ordering::Relaxed),
        counts.refused.load(Ordering::Relaxed),
        checked,
        lost,
        st.written_back_pages,
        st.loads_backing,
        st.writeback_fail
    );
    eprintln!("{report}");
    assert_eq!(lost, 0, "{report}");
    assert!(inj.injected() > 0 && st.written_back_pages > 0, "{report}");
    cache.check_invariants().unwrap();
}

/// Thread `t`'s random stores, loads and invalidations of the keys of its
/// own area until `deadline`, each load checked against its model of what
/// is stored (a failed load retried until it succeeds); returns the model.
fn work(t: u64, cache: &Cache, counts: &Counts, deadline: Instant) -> HashMap<u64, (u8, u64)> {
    let area = t as u32;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(t);
    let mut model: HashMap<u64, (u8, u64)> = HashMap::new();
    let mut buf = vec![0u8; PAGE_SIZE];
    while Instant::now() < deadline {
        for _ in 0..256 {
            let off = rng.gen_range(0..KEYS);
            match rng.gen_range(0..10) {
                0..=4 => {
                    let (k, s) = (rng.gen_range(0..KINDS), rng.gen_range(0..1_000u64));
                    match cache.store(area, off, &page(k, s)) {
                        Ok(_) => {
                            model.insert(off, (k, s));
                        }
                        Err(StoreError::Refused(_)) => {
                            counts.refused.fetch_add(1, Ordering::Relaxed);
                            model.remove(&off);
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                5..=8 => {
                    let want = model.get(&off).copied();
                    let mode = if rng.gen_bool(0.5) {
                        LoadMode::Keep
                    } else {
                        LoadMode::Exclusive
                    };
                    let mut r = cache.load(area, off, &mut buf, mode);
                    let mut tries = 0;
                    while matches!(r, Err(LoadError::Io(_) | LoadError::Corrupt { .. })) {
                        // Only an injected read fault may cause
                        // this, and the entry must survive it.
                        tries += 1;
                        assert!(tries < 1000, "key {off}: {r:?} persists");
                        counts.survived.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_millis(1));
                        r = cache.load(area, off, &mut buf, mode);
                    }
                    match (r, want) {
                        (Ok(_), Some((k, s))) => {
                            assert!(buf == page(k, s), "thread {t} key {off}: wrong bytes");
                            if mode == LoadMode::Exclusive {
                                model.remove(&off);
                            }
                        }
                        (Err(LoadError::NotFound), None) => {}
                        (r, w) => panic!("thread {t} key {off}: {r:?} vs {w:?}"),
                    }
                }
                _ => {
                    assert_eq!(
                        cache.invalidate(area, off).unwrap(),
                        model.remove(&off).is_some()
                    );
                }
            }
            counts.ops.fetch_add(1, Ordering::Relaxed);
        }
    }
    model
}
