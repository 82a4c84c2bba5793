//! Behaviour of every pool through the shared `Zpool` interface: a model-based
//! property test, error paths, limits, and a many-thread stress test with
//! content verification while compaction runs. Not a benchmark.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use uzswap_zpool::{new_pool, AllocatorKind, Error, Handle, Zpool, ZsConfig, ZsPool};

/// Every allocator the shared tests run against.
fn kinds() -> Vec<AllocatorKind> {
    vec![AllocatorKind::Zsmalloc, AllocatorKind::Xcf]
}

fn pool(kind: AllocatorKind) -> Arc<dyn Zpool> {
    new_pool(kind, None, None, None).expect("pool")
}

/// A pool that compacts only when asked: zsmalloc's background compactor
/// (started by the frees once a class passes its watermark) would race a
/// test's own `compact()` and leave it nothing to move.
fn pool_compacted_on_demand(kind: AllocatorKind) -> Arc<dyn Zpool> {
    match kind {
        AllocatorKind::Zsmalloc => Arc::new(
            ZsPool::new(ZsConfig {
                compact_watermark_percent: None,
                ..ZsConfig::default()
            })
            .expect("pool"),
        ),
        AllocatorKind::Xcf => pool(kind),
    }
}

/// Deterministic contents for (seed, len): mixes runs and noise so that a
/// misplaced byte anywhere shows.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..len)
        .map(|i| {
            if i % 7 == 0 {
                r.gen()
            } else {
                (seed as u8) ^ (i as u8)
            }
        })
        .collect()
}

fn check_object(p: &dyn Zpool, h: Handle, want: &[u8]) {
    assert_eq!(p.object_size(h).unwrap(), want.len());
    let mut buf = vec![0u8; 4096];
    let n = p.read(h, &mut buf).unwrap();
    assert_eq!(&buf[..n], want, "read() returned other bytes");
    let mut seen = Vec::new();
    p.map_read(h, &mut |b| seen.extend_from_slice(b)).unwrap();
    assert_eq!(seen, want, "map_read() returned other bytes");
}

#[derive(Debug, Clone)]
enum Op {
    Malloc(usize, u64),
    Free(usize),
    Write(usize, u64),
    Read(usize),
    /// `map_read_free`, its reader saying to free the object or not.
    ReadFree(usize, bool),
    UseStale,
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        // Sizes weighted like compressed pages, with the edges.
        // A few fixed sizes crowd a few classes, so compaction has work.
        4 => (prop_oneof![
                1usize..=64,
                64usize..=4096,
                Just(4096usize),
                Just(1usize),
                prop::sample::select(vec![200usize, 1000, 3000]),
                prop::sample::select(vec![200usize, 1000, 3000]),
            ], any::<u64>())
            .prop_map(|(s, seed)| Op::Malloc(s, seed)),
        3 => any::<usize>().prop_map(Op::Free),
        1 => (any::<usize>(), any::<u64>()).prop_map(|(i, s)| Op::Write(i, s)),
        1 => any::<usize>().prop_map(Op::Read),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(i, free)| Op::ReadFree(i, free)),
        1 => Just(Op::UseStale),
        1 => Just(Op::Compact),
    ]
}

fn run_model(kind: AllocatorKind, ops: &[Op]) {
    let p = pool(kind);
    let mut live: Vec<(Handle, Vec<u8>)> = Vec::new();
    let mut stale: Vec<Handle> = Vec::new();
    for op in ops {
        match *op {
            Op::Malloc(size, seed) => {
                let data = pattern(seed, size);
                let h = p.malloc_write(&data).unwrap();
                live.push((h, data));
            }
            Op::Free(i) if !live.is_empty() => {
                let (h, data) = live.swap_remove(i % live.len());
                assert_eq!(p.free(h).unwrap(), data.len());
                stale.push(h);
            }
            Op::Write(i, seed) if !live.is_empty() => {
                let i = i % live.len();
                let data = pattern(seed, live[i].1.len());
                p.write(live[i].0, &data).unwrap();
                live[i].1 = data;
            }
            Op::Read(i) if !live.is_empty() => {
                let (h, data) = &live[i % live.len()];
                check_object(&*p, *h, data);
            }
            Op::ReadFree(i, free) if !live.is_empty() => {
                let i = i % live.len();
                let mut seen = Vec::new();
                let freed = p
                    .map_read_free(live[i].0, &mut |b| {
                        seen.extend_from_slice(b);
                        free
                    })
                    .unwrap();
                assert_eq!(seen, live[i].1, "map_read_free() showed other bytes");
                assert_eq!(freed, free, "freed exactly when the reader said so");
                if free {
                    stale.push(live.swap_remove(i).0);
                } else {
                    check_object(&*p, live[i].0, &live[i].1);
                }
            }
            Op::UseStale => {
                // A freed handle is refused, unless its slot was reused by a
                // live object with the same bits (impossible: gen bumps).
                for h in &stale {
                    if !live.iter().any(|(l, _)| l == h) {
                        assert!(matches!(p.object_size(*h), Err(Error::StaleHandle(_))));
                        assert!(matches!(p.free(*h), Err(Error::StaleHandle(_))));
                        let mut called = false;
                        assert!(matches!(
                            p.map_read_free(*h, &mut |_| {
                                called = true;
                                true
                            }),
                            Err(Error::StaleHandle(_))
                        ));
                        assert!(!called, "a stale handle's reader never runs");
                    }
                }
            }
            Op::Compact => {
                p.compact();
            }
            _ => {}
        }
        p.check_invariants().unwrap();
        let st = p.stats();
        assert_eq!(st.objects, live.len() as u64);
        assert_eq!(
            st.payload_bytes,
            live.iter().map(|(_, d)| d.len() as u64).sum::<u64>()
        );
    }
    for (h, data) in &live {
        check_object(&*p, *h, data);
    }
    for (h, _) in live {
        p.free(h).unwrap();
    }
    p.check_invariants().unwrap();
    assert_eq!(p.pool_bytes(), 0, "an empty pool holds no pages");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn model_random_ops(ops in proptest::collection::vec(op(), 1..400)) {
        for kind in kinds() {
            run_model(kind, &ops);
        }
    }
}

/// Many objects of one class freed in a checkerboard, then compacted: pages
/// come back and every survivor keeps its bytes.
#[test]
fn compaction_keeps_contents_and_frees_pages() {
    for kind in kinds() {
        let p = pool_compacted_on_demand(kind);
        let mut hs: Vec<(Handle, Vec<u8>)> = (0..4000)
            .map(|i| {
                let d = pattern(i, 700 + (i as usize % 40));
                (p.malloc_write(&d).unwrap(), d)
            })
            .collect();
        let full = p.pool_bytes();
        let mut keep = Vec::new();
        for (i, (h, d)) in hs.drain(..).enumerate() {
            if i % 4 == 0 {
                keep.push((h, d));
            } else {
                p.free(h).unwrap();
            }
        }
        let before = p.pool_bytes();
        let r = p.compact();
        p.check_invariants().unwrap();
        let after = p.pool_bytes();
        assert!(r.objects_moved > 0, "{kind:?}: nothing moved");
        assert!(
            after < before && after <= full / 3,
            "{kind:?}: pool {full} -> {before} -> {after} bytes"
        );
        for (h, d) in &keep {
            check_object(&*p, *h, d);
        }
    }
}

#[test]
fn bad_sizes_are_refused() {
    for kind in kinds() {
        let p = pool(kind);
        assert!(matches!(
            p.malloc(0),
            Err(Error::InvalidSize { size: 0, .. })
        ));
        assert!(matches!(
            p.malloc(4097),
            Err(Error::InvalidSize { size: 4097, .. })
        ));
        assert!(p.malloc(4096).is_ok() && p.malloc(1).is_ok());
        let h = p.malloc(100).unwrap();
        assert!(matches!(p.write(h, &[0; 99]), Err(Error::BadBuffer { .. })));
        assert!(matches!(
            p.read(h, &mut [0; 99]),
            Err(Error::BadBuffer { .. })
        ));
        let msg = p.malloc(0).unwrap_err().to_string();
        assert!(msg.contains("1..=4096"), "message says the range: {msg}");
    }
}

#[test]
fn foreign_and_stale_handles_are_detected() {
    for kind in kinds() {
        let a = pool(kind);
        let b = pool(kind);
        let h = a.malloc_write(b"hello").unwrap();
        assert!(matches!(b.free(h), Err(Error::ForeignHandle(_))));
        assert!(matches!(
            b.read(h, &mut [0; 8]),
            Err(Error::ForeignHandle(_))
        ));
        a.free(h).unwrap();
        assert!(matches!(a.free(h), Err(Error::StaleHandle(_))));
        // The slot is reused by a new object: the old handle is still stale
        // and cannot reach the new object's bytes.
        let h2 = a.malloc_write(b"secret").unwrap();
        assert_ne!(h, h2);
        assert!(matches!(a.read(h, &mut [0; 8]), Err(Error::StaleHandle(_))));
        assert!(matches!(
            a.map_read(h, &mut |_| panic!("stale map")),
            Err(Error::StaleHandle(_))
        ));
        for raw in [1u64, u64::MAX, 0x1234_5678_9abc_def0] {
            let junk = Handle::from_raw(raw).unwrap();
            assert!(a.free(junk).is_err());
        }
    }
}

#[test]
fn freed_memory_is_wiped() {
    for kind in kinds() {
        let p = pool(kind);
        // A neighbour keeps the page in use, so the freed bytes stay mapped.
        let h = p.malloc_write(&[0xAB; 3000]).unwrap();
        let _neighbour = p.malloc_write(&[0xCD; 3000]).unwrap();
        p.free(h).unwrap();
        let h = p.malloc(3000).unwrap();
        let mut buf = vec![0xFF; 3000];
        p.read(h, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0), "a new object shows old bytes");
    }
}

#[test]
fn hard_limit_is_enforced_and_adjustable() {
    for kind in kinds() {
        let p = new_pool(kind, Some(64 * 4096), None, None).unwrap();
        let mut n = 0;
        let err = loop {
            match p.malloc_write(&[7; 4096]) {
                Ok(_) => n += 1,
                Err(e) => break e,
            }
        };
        assert!(matches!(err, Error::LimitReached { limit_bytes } if limit_bytes == 64 * 4096));
        assert!(
            (56..=64).contains(&n),
            "{n} pages fit under a 64-page limit"
        );
        assert!(p.pool_bytes() <= 64 * 4096);
        p.set_limit(None);
        p.malloc_write(&[7; 4096]).unwrap();
        p.check_invariants().unwrap();
    }
}

#[test]
fn zsmalloc_class_geometry_follows_the_rules() {
    let p = ZsPool::new(ZsConfig::default()).unwrap();
    let g = p.class_geometry();
    assert_eq!(g.last().unwrap().1, 4096);
    let mut prev = 0;
    for &(_, size, pages, objs) in &g {
        assert_eq!(size % 16, 0);
        assert!(size > prev);
        prev = size;
        assert!((1..=8).contains(&pages));
        assert_eq!(objs, pages * 4096 / size);
    }
    // Merging happened: fewer classes than 256 sizes, and no two
    // neighbours share a geometry.
    assert!(g.len() < 256);
    for w in g.windows(2) {
        assert!((w[0].2, w[0].3) != (w[1].2, w[1].3));
    }
    // A 3000-byte object packs with little waste thanks to multi-page zspages.
    let (_, size, pages, objs) = *g.iter().find(|c| c.1 >= 3000).unwrap();
    let waste = pages * 4096 - objs * size;
    assert!(
        waste * 100 < pages * 4096 * 3,
        "class {size}: {waste} wasted"
    );
    assert!(ZsPool::new(ZsConfig {
        max_pages_per_zspage: 0,
        ..ZsConfig::default()
    })
    .is_err());
}

#[test]
fn automatic_compaction_runs_in_the_background() {
    let p = ZsPool::new(ZsConfig {
        compact_watermark_percent: Some(25),
        ..ZsConfig::default()
    })
    .unwrap();
    let hs: Vec<Handle> = (0..20_000)
        .map(|i| p.malloc_write(&pattern(i, 1000)).unwrap())
        .collect();
    for (i, h) in hs.iter().enumerate() {
        if i % 2 == 1 {
            p.free(*h).unwrap();
        }
    }
    // The compactor is woken by free(); give it time, without a fixed sleep.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while p.stats().compactions == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let st = p.stats();
    assert!(st.compactions > 0 && st.objects_moved > 0, "{}", st.table());
    p.check_invariants().unwrap();
    for (i, h) in hs.iter().enumerate() {
        if i % 2 == 0 {
            check_object(&p, *h, &pattern(i as u64, 1000));
        }
    }
}

/// Eight threads malloc, write, verify and free their own objects while a
/// ninth compacts without pause; every byte is checked.
#[test]
fn stress_many_threads_with_compaction() {
    for kind in kinds() {
        let p = pool(kind);
        let stop = Arc::new(AtomicBool::new(false));
        let compactor = {
            let (p, stop) = (p.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut runs = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    p.compact();
                    runs += 1;
                }
                runs
            })
        };
        let workers: Vec<_> = (0..8u64)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    let mut r = rand::rngs::SmallRng::seed_from_u64(t);
                    let mut mine: HashMap<u64, (Handle, Vec<u8>)> = HashMap::new();
                    for step in 0..30_000u64 {
                        let key = r.gen_range(0..600u64);
                        match mine.remove(&key) {
                            Some((h, d)) => {
                                check_object(&*p, h, &d);
                                if r.gen_bool(0.5) {
                                    p.free(h).unwrap();
                                } else {
                                    let d2 = pattern(t << 32 | step, d.len());
                                    p.write(h, &d2).unwrap();
                                    mine.insert(key, (h, d2));
                                }
                            }
                            None => {
                                let size = r.gen_range(1..=4096);
                                let d = pattern(t << 32 | step, size);
                                mine.insert(key, (p.malloc_write(&d).unwrap(), d));
                            }
                        }
                    }
                    for (h, d) in mine.values() {
                        check_object(&*p, *h, d);
                    }
                    mine.len()
                })
            })
            .collect();
        let live: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
        stop.store(true, Ordering::Relaxed);
        assert!(compactor.join().unwrap() > 0);
        p.check_invariants().unwrap();
        assert_eq!(p.stats().objects, live as u64);
    }
}

/// Freed pages leave the pool's hands without a `compact()`: batches go to
/// the background thread (zsmalloc) or are released by the freeing thread
/// (xcf), and at most one batch per arena waits.
#[test]
fn freed_pages_are_released_without_compaction() {
    const BATCH: u64 = uzswap_zpool::RELEASE_BATCH_PAGES as u64;
    for kind in kinds() {
        let p = pool(kind);
        let obj = pattern(5, 3000);
        let handles: Vec<_> = (0..20_000).map(|_| p.malloc_write(&obj).unwrap()).collect();
        for h in handles {
            p.free(h).unwrap();
        }
        let releasing = |p: &dyn Zpool| {
            let st = p.stats();
            (
                st.extra("releasing_pages").unwrap(),
                st.extra("release_batches").unwrap(),
            )
        };
        let t = std::time::Instant::now();
        // The shard count bounds the pending lists (one arena per shard).
        let arenas = match kind {
            AllocatorKind::Zsmalloc => 4,
            AllocatorKind::Xcf => 1,
        };
        loop {
            let (pending, batches) = releasing(&*p);
            if pending < arenas * BATCH {
                assert!(batches > 0, "{kind:?}: no batch released");
                break;
            }
            assert!(
                t.elapsed() < std::time::Duration::from_secs(10),
                "{kind:?}: {pending} pages still waiting for release"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(p.pool_bytes(), 0);
        p.check_invariants().unwrap();
    }
}
