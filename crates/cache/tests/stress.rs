//! Many threads storing, loading, invalidating and writing back at once,
//! with the pool and the backing tier near their limits; every load is
//! checked against what the thread stored.

mod common;

use common::{page, KINDS};
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use uzswap_cache::{
    Backing, Cache, CacheConfig, Compressor, DedupScope, LoadError, LoadMode, PoolLimit, PAGE_SIZE,
};

const THREADS: u32 = 8;

/// Each thread owns its keys (area = thread % 3, offsets thread-strided),
/// so it knows what every load must return; areas are shared, and with a
/// global dedup scope and few distinct pages, objects are shared across
/// threads all the time.
fn run(ops: u64, backing: bool, allocator: uzswap_cache::AllocatorKind) {
    let dir = std::env::temp_dir();
    let cache = Arc::new(
        Cache::new(CacheConfig {
            pool_limit: PoolLimit::Bytes(96 * 4096),
            backing: if backing {
                Backing::File(dir)
            } else {
                Backing::None
            },
            writeback_batch: 16,
            dedup: true,
            dedup_scope: DedupScope::Global,
            cold_compressor: Some(uzswap_cache::Compressor::Zstd { level: -1 }),
            allocator,
            ..CacheConfig::default()
        })
        .unwrap(),
    );
    for a in 0..3 {
        cache.open_area(a).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let barrier = Arc::new(Barrier::new(THREADS as usize + 2));
    let refused = Arc::new(AtomicU64::new(0));
    let side = {
        let (cache, stop, barrier) = (cache.clone(), stop.clone(), barrier.clone());
        std::thread::spawn(move || {
            barrier.wait();
            stir(&cache, &stop);
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (cache, barrier, refused) = (cache.clone(), barrier.clone(), refused.clone());
            std::thread::spawn(move || work(t, ops, backing, &cache, &barrier, &refused))
        })
        .collect();
    barrier.wait();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    side.join().unwrap();
    cache.check_invariants().unwrap();
    let st = cache.stats();
    assert!(st.cold_stores > 0, "{st:?}");
    if backing {
        assert!(st.written_back_pages + st.stores_to_backing > 0, "{st:?}");
        assert!(st.loads_backing > 0, "{st:?}");
    }
    assert!(st.duplicate_pages > 0, "{st:?}");
}

/// The side thread: until `stop`, writes back, compacts, switches the
/// compressor and turns dedup on and off, one after another.
fn stir(cache: &Cache, stop: &AtomicBool) {
    let mut i = 0u8;
    while !stop.load(Ordering::Relaxed) {
        i = i.wrapping_add(1);
        match i % 4 {
            0 => {
                let _ = cache.writeback(32);
            }
            1 => {
                cache.compact();
            }
            2 => cache
                .set_compressor(match i % 16 {
                    2 => Compressor::Zstd { level: -1 },
                    10 => Compressor::Lz4Hc { level: 2 },
                    _ => Compressor::Lz4,
                })
                .unwrap(),
            _ => cache.set_dedup(i % 16 != 3),
        }
        std::thread::yield_now();
    }
}

/// Thread `t`'s `ops` random stores, loads and invalidations of its own
/// keys (after `barrier`), each load checked against what it stored; then
/// every key it still holds is read back. `backing`: the cache has a tier
/// (a refused store is an error then).
fn work(t: u32, ops: u64, backing: bool, cache: &Cache, barrier: &Barrier, refused: &AtomicU64) {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(u64::from(t));
    let area = t % 3;
    let mut mine: HashMap<u64, (u8, u64)> = HashMap::new();
    let mut buf = vec![0u8; PAGE_SIZE];
    barrier.wait();
    for _ in 0..ops {
        let off = u64::from(t) + u64::from(THREADS) * rng.gen_range(0..64u64);
        match rng.gen_range(0..10) {
            0..=4 => {
                let (kind, seed) = (rng.gen_range(0..KINDS), rng.gen_range(0..6u64));
                // Half the stores cold (another codec, shared
                // objects keyed by codec).
                let p = page(kind, seed);
                let r = if rng.gen_bool(0.5) {
                    cache.store_cold(area, off, &p)
                } else {
                    cache.store(area, off, &p)
                };
                match r {
                    Ok(_) => {
                        mine.insert(off, (kind, seed));
                    }
                    Err(e) => {
                        // Without a tier a full pool refuses; the
                        // old entry is gone (replaced) either way.
                        assert!(!backing, "{e}");
                        refused.fetch_add(1, Ordering::Relaxed);
                        cache.invalidate(area, off).unwrap();
                        mine.remove(&off);
                    }
                }
            }
            5..=7 => {
                let keep = rng.gen_bool(0.5);
                let mode = if keep {
                    LoadMode::Keep
                } else {
                    LoadMode::Exclusive
                };
                match (cache.load(area, off, &mut buf, mode), mine.get(&off)) {
                    (Ok(_), Some(&(k, s))) => {
                        assert!(buf == page(k, s), "thread {t} key {off}: wrong bytes");
                        if !keep {
                            mine.remove(&off);
                        }
                    }
                    (Err(LoadError::NotFound), None) => {}
                    (r, m) => panic!("thread {t} key {off}: {r:?} vs {m:?}"),
                }
            }
            _ => {
                let had = cache.invalidate(area, off).unwrap();
                assert_eq!(had, mine.remove(&off).is_some());
            }
        }
    }
    for (off, (k, s)) in mine {
        cache.load(area, off, &mut buf, LoadMode::Keep).unwrap();
        assert!(buf == page(k, s), "thread {t} key {off}: final check");
    }
}

#[test]
fn threads_with_backing_file() {
    run(6_000, true, uzswap_cache::AllocatorKind::Zsmalloc);
}

#[test]
fn threads_with_backing_file_on_xcf() {
    run(3_000, true, uzswap_cache::AllocatorKind::Xcf);
}

#[test]
fn threads_without_backing() {
    run(4_000, false, uzswap_cache::AllocatorKind::Zsmalloc);
}
