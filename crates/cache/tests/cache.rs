//! The cache against a model, its errors and policies.

mod common;

use common::{page, MemBacking, KINDS};
use proptest::prelude::*;
use std::collections::HashMap;
use uzswap_cache::{
    Backing, Cache, CacheConfig, Compressor, DedupScope, Error, Incompressible, LoadError,
    LoadMode, Loaded, PoolLimit, Proactive, Reject, StoreError, Stored, PAGE_SIZE,
};

#[derive(Debug, Clone)]
enum Op {
    Store {
        area: u32,
        off: u64,
        kind: u8,
        seed: u64,
    },
    Load {
        area: u32,
        off: u64,
        keep: bool,
    },
    Invalidate {
        area: u32,
        off: u64,
    },
    InvalidateArea {
        area: u32,
    },
    Compressor(u8),
    Limit(u64),
    Writeback(usize),
    Dedup(bool),
    Check,
}

fn op() -> impl Strategy<Value = Op> {
    let area = 0u32..3;
    let off = 0u64..48;
    prop_oneof![
        10 => (area.clone(), off.clone(), 0..KINDS, any::<u64>())
            .prop_map(|(area, off, kind, seed)| Op::Store { area, off, kind, seed }),
        6 => (area.clone(), off.clone(), any::<bool>())
            .prop_map(|(area, off, keep)| Op::Load { area, off, keep }),
        2 => (area.clone(), off).prop_map(|(area, off)| Op::Invalidate { area, off }),
        1 => area.prop_map(|area| Op::InvalidateArea { area }),
        1 => (0u8..4).prop_map(Op::Compressor),
        1 => (4u64..40).prop_map(|pages| Op::Limit(pages * 4096)),
        1 => (1usize..40).prop_map(Op::Writeback),
        1 => any::<bool>().prop_map(Op::Dedup),
        1 => Just(Op::Check),
    ]
}

fn compressor(i: u8) -> Compressor {
    match i % 5 {
        0 => Compressor::Lz4,
        1 => Compressor::Zstd { level: -1 },
        2 => Compressor::Zstd { level: 3 },
        3 => Compressor::Lz4Hc { level: 2 },
        _ => Compressor::Deflate { level: 1 },
    }
}

fn run_model(ops: Vec<Op>, background: bool, global: bool, reject_poor: bool) {
    let cache = Cache::new(CacheConfig {
        pool_limit: PoolLimit::Bytes(16 * 4096),
        backing: Backing::Store(Box::new(MemBacking::default())),
        writeback_batch: 8,
        background_writer: background,
        dedup: true,
        dedup_scope: if global {
            DedupScope::Global
        } else {
            DedupScope::Area
        },
        incompressible: if reject_poor {
            Incompressible::Reject
        } else {
            Incompressible::StoreRaw
        },
        max_compressed_percent: if reject_poor { 60 } else { 100 },
        ..CacheConfig::default()
    })
    .unwrap();
    for a in 0..3 {
        cache.open_area(a).unwrap();
    }
    let mut model: HashMap<(u32, u64), Vec<u8>> = HashMap::new();
    let mut buf = vec![0u8; PAGE_SIZE];
    for op in ops {
        match op {
            Op::Store {
                area,
                off,
                kind,
                seed,
            } => {
                let p = page(kind, seed);
                match cache.store(area, off, &p) {
                    Ok(_) => {
                        model.insert((area, off), p);
                    }
                    Err(e) => panic!("store refused with a backing tier: {e}"),
                }
            }
            Op::Load { area, off, keep } => {
                let mode = if keep {
                    LoadMode::Keep
                } else {
                    LoadMode::Exclusive
                };
                match (
                    cache.load(area, off, &mut buf, mode),
                    model.get(&(area, off)),
                ) {
                    (Ok(_), Some(want)) => {
                        assert!(buf == *want, "wrong bytes for {area}/{off}");
                        if !keep {
                            model.remove(&(area, off));
                        }
                    }
                    (Err(LoadError::NotFound), None) => {}
                    (r, want) => panic!("load {area}/{off}: {r:?}, model has {}", want.is_some()),
                }
            }
            Op::Invalidate { area, off } => {
                let had = cache.invalidate(area, off).unwrap();
                assert_eq!(had, model.remove(&(area, off)).is_some());
            }
            Op::InvalidateArea { area } => {
                let n = cache.invalidate_area(area).unwrap();
                let before = model.len();
                model.retain(|k, _| k.0 != area);
                assert_eq!(n as usize, before - model.len());
                assert!(matches!(
                    cache.store(area, 0, &page(2, 1)),
                    Err(StoreError::Invalid(Error::UnknownArea { .. }))
                ));
                cache.open_area(area).unwrap();
            }
            Op::Compressor(i) => cache.set_compressor(compressor(i)).unwrap(),
            Op::Limit(b) => cache.set_pool_limit(PoolLimit::Bytes(b)).unwrap(),
            Op::Writeback(n) => {
                cache.writeback(n).unwrap();
            }
            Op::Dedup(on) => cache.set_dedup(on),
            Op::Check => cache.check_invariants().unwrap(),
        }
    }
    cache.check_invariants().unwrap();
    for ((area, off), want) in &model {
        cache.load(*area, *off, &mut buf, LoadMode::Keep).unwrap();
        assert!(buf == *want, "final check {area}/{off}");
    }
    let st = cache.stats();
    assert_eq!(
        (st.stored_pages + st.backing_pages) as usize,
        model.len(),
        "every stored page is in the pool or the backing tier"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn matches_model(ops in prop::collection::vec(op(), 1..400),
                     global in any::<bool>(), reject_poor in any::<bool>()) {
        run_model(ops, false, global, reject_poor);
    }

    #[test]
    fn matches_model_with_background_writer(ops in prop::collection::vec(op(), 1..300)) {
        run_model(ops, true, false, false);
    }
}

fn cache_with(limit: u64, backing: Option<MemBacking>) -> Cache {
    let c = Cache::new(CacheConfig {
        pool_limit: PoolLimit::Bytes(limit),
        backing: backing.map_or(Backing::None, |b| Backing::Store(Box::new(b))),
        background_writer: false,
        ..CacheConfig::default()
    })
    .unwrap();
    c.open_area(1).unwrap();
    c
}

#[test]
fn bad_arguments_are_typed_errors() {
    let c = cache_with(1 << 20, None);
    let p = page(2, 1);
    let mut buf = vec![0u8; PAGE_SIZE];
    assert!(matches!(
        c.store(1, 0, &p[..100]),
        Err(StoreError::Invalid(Error::BadPageSize { len: 100 }))
    ));
    assert!(matches!(
        c.store(7, 0, &p),
        Err(StoreError::Invalid(Error::UnknownArea { area: 7 }))
    ));
    assert!(matches!(
        c.open_area(u32::MAX),
        Err(Error::AreaOutOfRange { .. })
    ));
    assert!(matches!(
        c.load(1, 0, &mut buf[..10], LoadMode::Keep),
        Err(LoadError::Invalid(Error::BadPageSize { len: 10 }))
    ));
    assert!(matches!(
        c.load(1, 5, &mut buf, LoadMode::Keep),
        Err(LoadError::NotFound)
    ));
    assert!(matches!(c.writeback(1), Err(Error::NoBacking)));
    assert!(c.set_compressor(Compressor::Zstd { level: 99 }).is_err());
    assert!(c.set_pool_limit(PoolLimit::Percent(0)).is_err());
    for bad in [
        CacheConfig {
            accept_threshold_percent: 0,
            ..CacheConfig::default()
        },
        CacheConfig {
            writeback_batch: 0,
            ..CacheConfig::default()
        },
        CacheConfig {
            pool_limit: PoolLimit::Percent(101),
            ..CacheConfig::default()
        },
        CacheConfig {
            compressor: Compressor::Deflate { level: 40 },
            ..CacheConfig::default()
        },
        CacheConfig {
            cold_compressor: Some(Compressor::Zstd { level: 99 }),
            ..CacheConfig::default()
        },
        CacheConfig {
            pool_shards: Some(0),
            ..CacheConfig::default()
        },
        CacheConfig {
            pool_shards: Some(99),
            ..CacheConfig::default()
        },
    ] {
        let e = Cache::new(bad).unwrap_err();
        assert!(!e.to_string().is_empty());
    }
    let e = Cache::new(CacheConfig {
        backing: Backing::File("/nonexistent/dir/file".into()),
        ..CacheConfig::default()
    })
    .unwrap_err();
    assert!(matches!(e, Error::BackingCreate { .. }), "{e}");
}

/// A one-shard pool (as a pager's process uses) holds one partly filled
/// zspage per class, whichever CPU stored: pages of one size stored from
/// threads on every CPU share zspages, and read back.
#[test]
fn a_one_shard_pool_serves_stores_from_every_cpu() {
    let c = Cache::new(CacheConfig {
        pool_limit: PoolLimit::Unlimited,
        pool_shards: Some(1),
        ..CacheConfig::default()
    })
    .unwrap();
    c.open_area(1).unwrap();
    let c = std::sync::Arc::new(c);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                for i in 0..200 {
                    c.store(1, t * 1000 + i, &page(3, t * 1000 + i)).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut buf = vec![0u8; PAGE_SIZE];
    for t in 0..4u64 {
        for i in 0..200 {
            c.load(1, t * 1000 + i, &mut buf, LoadMode::Keep).unwrap();
            assert_eq!(buf, page(3, t * 1000 + i));
        }
    }
    // Nothing was freed: each class has at most one zspage not full (two
    // shards would keep one each).
    for row in c.pool_stats().classes {
        let partial = row.almost_full + row.almost_empty;
        assert!(
            partial <= 1,
            "class {}: {partial} partial zspages",
            row.class
        );
    }
    c.check_invariants().unwrap();
}

/// `store_cold` compresses with the cold compressor (a zstd frame, smaller
/// than lz4's block on text), `store` with the main one; both read back.
/// Without a cold compressor `store_cold` is `store`.
#[test]
fn cold_stores_use_the_cold_compressor() {
    let c = Cache::new(CacheConfig {
        cold_compressor: Some(Compressor::Zstd { level: 3 }),
        ..CacheConfig::default()
    })
    .unwrap();
    c.open_area(1).unwrap();
    let text = page(2, 7);
    let hot = match c.store(1, 0, &text).unwrap() {
        Stored::Compressed { bytes } => bytes,
        s => panic!("{s:?}"),
    };
    assert_eq!(c.stats().cold_stores, 0);
    let cold = match c.store_cold(1, 1, &text).unwrap() {
        Stored::Compressed { bytes } => bytes,
        s => panic!("{s:?}"),
    };
    assert_eq!(c.stats().cold_stores, 1);
    assert!(cold < hot, "zstd {cold} bytes, lz4 {hot}");
    // A same-filled page costs nothing either way.
    assert_eq!(c.store_cold(1, 2, &page(1, 3)).unwrap(), Stored::SameFilled);
    assert_eq!(c.stats().cold_stores, 1);
    let mut buf = vec![0u8; PAGE_SIZE];
    for off in [0, 1] {
        assert_eq!(
            c.load(1, off, &mut buf, LoadMode::Exclusive).unwrap(),
            Loaded::Pool
        );
        assert_eq!(buf, text, "offset {off}");
    }
    c.check_invariants().unwrap();

    let plain = cache_with(1 << 20, None);
    assert_eq!(
        plain.store_cold(1, 0, &text).unwrap(),
        Stored::Compressed { bytes: hot }
    );
    assert_eq!(plain.stats().cold_stores, 0);
}

#[test]
fn same_filled_pages_take_no_pool_memory() {
    let c = cache_with(1 << 20, None);
    for i in 0..100u64 {
        assert_eq!(
            c.store(1, i, &page(i as u8 % 2, i)).unwrap(),
            Stored::SameFilled
        );
    }
    let st = c.stats();
    assert_eq!((st.same_filled_pages, st.pool_total_size), (100, 0));
    let mut buf = vec![1u8; PAGE_SIZE];
    assert_eq!(
        c.load(1, 3, &mut buf, LoadMode::Exclusive).unwrap(),
        Loaded::SameFilled
    );
    assert_eq!(buf, page(1, 3));
    c.check_invariants().unwrap();
}

#[test]
fn exclusive_loads_free_and_keep_loads_do_not() {
    let c = cache_with(1 << 20, None);
    let p = page(2, 9);
    let mut buf = vec![0u8; PAGE_SIZE];
    c.store(1, 1, &p).unwrap();
    assert_eq!(
        c.load(1, 1, &mut buf, LoadMode::Keep).unwrap(),
        Loaded::Pool
    );
    assert_eq!(
        c.load(1, 1, &mut buf, LoadMode::Exclusive).unwrap(),
        Loaded::Pool
    );
    assert_eq!(buf, p);
    assert!(matches!(
        c.load(1, 1, &mut buf, LoadMode::Keep),
        Err(LoadError::NotFound)
    ));
    assert_eq!(c.stats().stored_pages, 0);
    c.check_invariants().unwrap();
}

#[test]
fn incompressible_pages_are_stored_raw_or_refused() {
    let c = cache_with(1 << 20, None);
    assert_eq!(c.store(1, 0, &page(4, 1)).unwrap(), Stored::Raw);
    assert_eq!(c.stats().stored_incompressible_pages, 1);
    let c = Cache::new(CacheConfig {
        incompressible: Incompressible::Reject,
        max_compressed_percent: 50,
        ..CacheConfig::default()
    })
    .unwrap();
    c.open_area(0).unwrap();
    assert!(matches!(
        c.store(0, 0, &page(3, 1)),
        Err(StoreError::Refused(Reject::CompressPoor { .. }))
    ));
    assert_eq!(c.stats().reject_compress_poor, 1);
    assert!(matches!(
        c.store(0, 1, &page(2, 1)).unwrap(),
        Stored::Compressed { .. }
    ));
}

#[test]
fn pool_limit_has_accept_threshold_hysteresis() {
    // Random pages are stored raw: one page of pool each, freed at once.
    let c = cache_with(20 * 4096, None);
    let mut n = 0;
    while c.store(1, n, &page(4, n)).is_ok() {
        n += 1;
    }
    assert_eq!(n, 20);
    assert_eq!(c.stats().pool_limit_hit, 1);
    // 19 of 20 pages: below the limit, above the 90 % threshold: refused.
    c.invalidate(1, 0).unwrap();
    assert!(matches!(
        c.store(1, 100, &page(4, 100)),
        Err(StoreError::Refused(Reject::PoolFull))
    ));
    // 17 of 20: below 90 %: accepted again.
    c.invalidate(1, 1).unwrap();
    c.invalidate(1, 2).unwrap();
    c.store(1, 100, &page(4, 100)).unwrap();
    assert!(c.stats().reject_reclaim_fail >= 2);
    // Raising the limit clears the full state.
    c.set_pool_limit(PoolLimit::Bytes(1 << 20)).unwrap();
    c.store(1, 101, &page(4, 101)).unwrap();
    c.check_invariants().unwrap();
}

#[test]
fn full_pool_writes_back_lru_and_goes_to_backing() {
    let b = MemBacking::default();
    let c = cache_with(16 * 4096, Some(b.clone()));
    let pages: Vec<Vec<u8>> = (0..200).map(|i| page(3, i)).collect();
    for (i, p) in pages.iter().enumerate() {
        c.store(1, i as u64, p).unwrap();
    }
    let st = c.stats();
    assert!(st.stores_to_backing > 0, "{st:?}");
    let wrote = c.writeback(50).unwrap();
    assert!(wrote > 0);
    let st = c.stats();
    assert!(st.written_back_pages as usize == wrote && st.writeback_batches > 0);
    assert!(
        st.backing_writes < st.written_back_pages + st.stores_to_backing,
        "batched writes"
    );
    let mut buf = vec![0u8; PAGE_SIZE];
    for (i, p) in pages.iter().enumerate() {
        c.load(1, i as u64, &mut buf, LoadMode::Keep).unwrap();
        assert!(buf == *p, "page {i}");
    }
    assert!(c.stats().loads_backing > 0);
    c.check_invariants().unwrap();
    // Written slots are encrypted: no plaintext run reaches the tier.
    assert!(!b.contains_bytes(&pages[0][PAGE_SIZE - 64..]));
    // Everything invalidated: every slot free again.
    assert_eq!(c.invalidate_area(1).unwrap(), 200);
    assert_eq!(c.stats().backing_slots_used, 0);
    c.check_invariants().unwrap();
}

#[test]
fn writeback_prefers_pages_not_used_recently() {
    let c = cache_with(1 << 20, Some(MemBacking::default()));
    for i in 0..64u64 {
        c.store(1, i, &page(2, i)).unwrap();
    }
    let mut buf = vec![0u8; PAGE_SIZE];
    // The oldest 32 are used again: they get a second chance.
    for i in 0..32u64 {
        c.load(1, i, &mut buf, LoadMode::Keep).unwrap();
    }
    assert_eq!(c.writeback(32).unwrap(), 32);
    for i in 0..32u64 {
        assert_eq!(
            c.load(1, i, &mut buf, LoadMode::Keep).unwrap(),
            Loaded::Pool,
            "hot {i}"
        );
    }
    let cold_in_backing = (32..64u64)
        .filter(|&i| c.load(1, i, &mut buf, LoadMode::Keep).unwrap() == Loaded::Backing)
        .count();
    assert_eq!(cold_in_backing, 32);
}

#[test]
fn corrupt_or_replayed_slots_are_errors_never_data() {
    let b = MemBacking::default();
    let c = cache_with(1 << 20, Some(b.clone()));
    for i in 0..4u64 {
        c.store(1, i, &page(2, i)).unwrap();
    }
    assert_eq!(c.writeback(4).unwrap(), 4);
    let slots = b.written();
    assert_eq!(slots.len(), 4);
    let mut buf = vec![0u8; PAGE_SIZE];
    // Which key sits in which slot is the cache's business: corrupt one slot
    // and replay another over a third; exactly those two fail.
    b.corrupt(slots[0]);
    b.copy(slots[1], slots[2]);
    let mut failed = 0;
    for i in 0..4u64 {
        match c.load(1, i, &mut buf, LoadMode::Keep) {
            Ok(_) => assert_eq!(buf, page(2, i)),
            Err(LoadError::Corrupt { .. }) => {
                failed += 1;
                assert!(buf.iter().all(|&x| x == 0), "a failed load leaves zeros");
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(failed, 2);
    assert_eq!(c.stats().backing_corrupt, 2);
}

#[test]
fn dedup_shares_equal_pages_and_never_colliding_ones() {
    for forced in [false, true] {
        let c = Cache::new(CacheConfig {
            dedup: true,
            dedup_hasher: forced.then_some((|_: &[u8]| 42u64) as fn(&[u8]) -> u64),
            ..CacheConfig::default()
        })
        .unwrap();
        c.open_area(0).unwrap();
        // 4 distinct pages, each stored 10 times; under forced collisions
        // every page hashes alike and only the byte compare tells them apart.
        for i in 0..40u64 {
            c.store(0, i, &page(2, i % 4 + 7)).unwrap();
        }
        let st = c.stats();
        assert_eq!(st.duplicate_pages, 36, "forced={forced}");
        let ps = c.pool_stats();
        assert_eq!(ps.objects, 4);
        // Nine more references on each of four objects: nine times their
        // sizes saved.
        assert_eq!(st.dedup_saved_bytes, 9 * ps.payload_bytes);
        let mut buf = vec![0u8; PAGE_SIZE];
        for i in 0..40u64 {
            c.load(0, i, &mut buf, LoadMode::Keep).unwrap();
            assert_eq!(buf, page(2, i % 4 + 7));
        }
        c.check_invariants().unwrap();
        for i in 0..40u64 {
            c.invalidate(0, i).unwrap();
        }
        assert_eq!(c.stats().dedup_saved_bytes, 0);
        assert_eq!(c.pool_stats().objects, 0);
        c.check_invariants().unwrap();
    }
}

#[test]
fn dedup_is_scoped_to_the_area_by_default() {
    for (scope, objects) in [(DedupScope::Area, 2), (DedupScope::Global, 1)] {
        let c = Cache::new(CacheConfig {
            dedup: true,
            dedup_scope: scope,
            ..CacheConfig::default()
        })
        .unwrap();
        c.open_area(0).unwrap();
        c.open_area(1).unwrap();
        c.store(0, 0, &page(2, 5)).unwrap();
        c.store(1, 0, &page(2, 5)).unwrap();
        assert_eq!(c.pool_stats().objects, objects, "{scope:?}");
        c.check_invariants().unwrap();
    }
}

#[test]
fn backing_file_is_unlinked_and_round_trips() {
    let dir = std::env::temp_dir().join(format!("uzswap-cache-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let c = Cache::new(CacheConfig {
        pool_limit: PoolLimit::Bytes(8 * 4096),
        backing: Backing::File(dir.clone()),
        background_writer: false,
        ..CacheConfig::default()
    })
    .unwrap();
    c.open_area(0).unwrap();
    for i in 0..100u64 {
        c.store(0, i, &page(3, i)).unwrap();
    }
    c.writeback(100).unwrap();
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing named on disk"
    );
    let mut buf = vec![0u8; PAGE_SIZE];
    for i in 0..100u64 {
        c.load(0, i, &mut buf, LoadMode::Exclusive).unwrap();
        assert_eq!(buf, page(3, i));
    }
    c.check_invariants().unwrap();
    std::fs::remove_dir(&dir).unwrap();
}

/// Waits up to 10 s for `cond`.
fn within_10s(mut cond: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    cond()
}

/// Proactive writeback by age: with no pressure at all, pages older than
/// `max_age` move to the tier in the background, and load back intact.
#[test]
fn proactive_writeback_moves_old_pages_to_the_tier() {
    let c = Cache::new(CacheConfig {
        backing: Backing::Store(Box::new(MemBacking::default())),
        proactive: Some(Proactive {
            max_age: Some(std::time::Duration::from_secs(1)),
            max_pool_percent_of_limit: None,
        }),
        ..CacheConfig::default()
    })
    .unwrap();
    c.open_area(0).unwrap();
    for i in 0..200u64 {
        c.store(0, i, &page(2, i)).unwrap();
    }
    assert!(
        within_10s(|| c.stats().backing_pages == 200),
        "{:?}",
        c.stats()
    );
    let st = c.stats();
    assert_eq!(st.proactive_written_back_pages, 200);
    assert_eq!(st.pool_limit_hit, 0, "no pressure was needed");
    let mut buf = vec![0u8; PAGE_SIZE];
    for i in 0..200u64 {
        assert_eq!(
            c.load(0, i, &mut buf, LoadMode::Keep).unwrap(),
            Loaded::Backing
        );
        assert_eq!(buf, page(2, i));
    }
    c.check_invariants().unwrap();
}

/// Proactive writeback by share: the pool is kept under the given share of
/// its limit before it is ever full, coldest pages first.
#[test]
fn proactive_writeback_keeps_the_pool_under_its_share() {
    const LIMIT: u64 = 256 * 4096;
    let c = Cache::new(CacheConfig {
        pool_limit: PoolLimit::Bytes(LIMIT),
        backing: Backing::Store(Box::new(MemBacking::default())),
        proactive: Some(Proactive {
            max_age: None,
            max_pool_percent_of_limit: Some(40),
        }),
        ..CacheConfig::default()
    })
    .unwrap();
    c.open_area(0).unwrap();
    // About 70 % of the limit in compressed pages: under the limit, over
    // the share.
    let mut n = 0u64;
    while c.stats().pool_total_size < LIMIT * 7 / 10 {
        c.store(0, n, &page(2, n)).unwrap();
        n += 1;
    }
    assert!(
        within_10s(|| c.stats().pool_total_size <= LIMIT * 4 / 10),
        "{:?}",
        c.stats()
    );
    let st = c.stats();
    assert!(st.proactive_written_back_pages > 0);
    assert_eq!(st.pool_limit_hit, 0, "the pool never reached its limit");
    // The oldest pages went first.
    let mut buf = vec![0u8; PAGE_SIZE];
    assert_eq!(
        c.load(0, 0, &mut buf, LoadMode::Keep).unwrap(),
        Loaded::Backing
    );
    for i in 0..n {
        c.load(0, i, &mut buf, LoadMode::Keep).unwrap();
        assert_eq!(buf, page(2, i), "page {i}");
    }
    c.check_invariants().unwrap();
}
