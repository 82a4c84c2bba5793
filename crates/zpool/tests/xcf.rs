//! Tests of the scatter-gather allocator (`xcf`) through the `Zpool` trait.
//!
//! The stress test checks correctness under concurrency; it is not a
//! benchmark.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::Arc;
use uzswap_zpool::xcf::{XcfConfig, XcfPool};
use uzswap_zpool::{Error, Handle, Zpool};

fn pool() -> XcfPool {
    XcfPool::new(XcfConfig::default()).unwrap()
}

fn extra(p: &XcfPool, k: &str) -> u64 {
    p.stats().extra(k).unwrap()
}

fn fill_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| r.gen()).collect()
}

#[derive(Debug, Clone)]
enum Op {
    Malloc(usize),
    Free(usize),
    Write(usize, u64),
    Read(usize),
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..=4096).prop_map(Op::Malloc),
        2 => any::<usize>().prop_map(Op::Free),
        2 => (any::<usize>(), any::<u64>()).prop_map(|(i, s)| Op::Write(i, s)),
        2 => any::<usize>().prop_map(Op::Read),
        1 => Just(Op::Compact),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn model_matches(ops in proptest::collection::vec(op(), 1..120), shards in 1usize..=3) {
        let p = XcfPool::new(XcfConfig { limit_bytes: None, shards }).unwrap();
        let mut model: HashMap<Handle, Vec<u8>> = HashMap::new();
        let mut order: Vec<Handle> = Vec::new();
        for op in ops {
            match op {
                Op::Malloc(n) => {
                    let h = p.malloc(n).unwrap();
                    prop_assert_eq!(p.object_size(h).unwrap(), n);
                    // Freed memory is wiped: a new object reads as zeros.
                    let mut b = vec![1u8; n];
                    p.read(h, &mut b).unwrap();
                    prop_assert!(b.iter().all(|&x| x == 0));
                    model.insert(h, b);
                    order.push(h);
                }
                Op::Free(i) if !order.is_empty() => {
                    let h = order.swap_remove(i % order.len());
                    let n = model.remove(&h).unwrap().len();
                    prop_assert_eq!(p.free(h).unwrap(), n);
                    prop_assert_eq!(p.free(h), Err(Error::StaleHandle(h.to_raw())));
                }
                Op::Write(i, s) if !order.is_empty() => {
                    let h = order[i % order.len()];
                    let d = fill_bytes(s, model[&h].len());
                    p.write(h, &d).unwrap();
                    model.insert(h, d);
                }
                Op::Read(i) if !order.is_empty() => {
                    let h = order[i % order.len()];
                    let mut b = vec![0u8; 4096];
                    let n = p.read(h, &mut b).unwrap();
                    prop_assert_eq!(&b[..n], &model[&h][..]);
                    let mut seen = Vec::new();
                    p.map_read(h, &mut |s| seen.extend_from_slice(s)).unwrap();
                    prop_assert_eq!(&seen, &model[&h]);
                }
                Op::Compact => { p.compact(); }
                _ => {}
            }
            if let Err(e) = p.check_invariants() { prop_assert!(false, "{}", e); }
            let st = p.stats();
            prop_assert_eq!(st.objects, model.len() as u64);
            prop_assert_eq!(st.payload_bytes, model.values().map(|v| v.len() as u64).sum::<u64>());
        }
        for (h, v) in &model {
            let mut b = vec![0u8; v.len()];
            p.read(*h, &mut b).unwrap();
            prop_assert_eq!(&b, v);
            p.free(*h).unwrap();
        }
        p.check_invariants().unwrap();
        prop_assert_eq!(p.pool_bytes(), 0);
    }
}

#[test]
fn errors() {
    let p = pool();
    let q = pool();
    assert!(matches!(
        p.malloc(0),
        Err(Error::InvalidSize { size: 0, .. })
    ));
    assert!(matches!(
        p.malloc(4097),
        Err(Error::InvalidSize { size: 4097, .. })
    ));
    assert_eq!(extra(&p, "refused_size"), 2);
    let h = p.malloc(100).unwrap();
    assert_eq!(q.free(h), Err(Error::ForeignHandle(h.to_raw())));
    assert_eq!(q.object_size(h), Err(Error::ForeignHandle(h.to_raw())));
    assert!(matches!(
        p.write(h, &[0; 99]),
        Err(Error::BadBuffer {
            got: 99,
            object: 100,
            ..
        })
    ));
    assert!(matches!(
        p.read(h, &mut [0; 10]),
        Err(Error::BadBuffer { got: 10, .. })
    ));
    assert_eq!(p.free(h).unwrap(), 100);
    assert_eq!(p.free(h), Err(Error::StaleHandle(h.to_raw())));
    assert_eq!(
        p.read(h, &mut [0; 100]),
        Err(Error::StaleHandle(h.to_raw()))
    );
    assert!(p.map_read(h, &mut |_| ()).is_err());
    // The slot is reused with a new generation: the old handle stays stale.
    let h2 = p.malloc(100).unwrap();
    assert_ne!(h, h2);
    assert_eq!(p.object_size(h), Err(Error::StaleHandle(h.to_raw())));
    let bogus = Handle::from_raw(1).unwrap();
    assert_eq!(p.free(bogus), Err(Error::ForeignHandle(1)));
    assert!(XcfPool::new(XcfConfig {
        limit_bytes: None,
        shards: 0
    })
    .is_err());
    p.check_invariants().unwrap();
}

#[test]
fn limit() {
    let p = XcfPool::new(XcfConfig {
        limit_bytes: Some(8 * 4096),
        shards: 1,
    })
    .unwrap();
    let mut hs = Vec::new();
    let err = loop {
        match p.malloc(3000) {
            Ok(h) => hs.push(h),
            Err(e) => break e,
        }
    };
    assert_eq!(
        err,
        Error::LimitReached {
            limit_bytes: 8 * 4096
        }
    );
    assert_eq!(p.pool_bytes(), 8 * 4096);
    assert_eq!(extra(&p, "refused_limit"), 1);
    assert_eq!(hs.len(), 8 * 4096 / 3000);
    p.set_limit(None);
    hs.push(p.malloc(3000).unwrap());
    assert_eq!(p.stats().limit_bytes, None);
    p.check_invariants().unwrap();
}

#[test]
fn compaction_keeps_contents_and_frees_pages() {
    let p = XcfPool::new(XcfConfig {
        limit_bytes: None,
        shards: 2,
    })
    .unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(7);
    let mut live = Vec::new();
    for i in 0..4000u64 {
        let n = r.gen_range(2000..4000);
        let d = fill_bytes(i, n);
        live.push((p.malloc_write(&d).unwrap(), d));
    }
    // Free every other object: pages are left half full.
    let mut kept = Vec::new();
    for (i, x) in live.into_iter().enumerate() {
        if i % 2 == 0 {
            p.free(x.0).unwrap();
        } else {
            kept.push(x);
        }
    }
    let before = p.pool_bytes();
    let rep = p.compact();
    p.check_invariants().unwrap();
    assert!(rep.pages_freed > 0 && rep.objects_moved > 0, "{rep:?}");
    assert_eq!(p.pool_bytes(), before - rep.pages_freed * 4096);
    let st = p.stats();
    assert!(
        st.overhead() <= 0.02,
        "overhead after compaction {}",
        st.overhead()
    );
    for (h, d) in &kept {
        let mut b = vec![0; d.len()];
        p.read(*h, &mut b).unwrap();
        assert_eq!(&b, d);
    }
    assert_eq!(st.pages_compacted, rep.pages_freed);
    assert!(extra(&p, "descriptors") >= extra(&p, "blocks"));
}

/// Fill with objects of ~3000 bytes (text compressed to ~75 %): the pool
/// wastes only the rounding to 8 bytes (≤ 7 B per object, 0.25 %) and the
/// free tail of each shard's last page, so 1 % is a safe bound.
#[test]
fn fill_overhead() {
    let p = pool();
    let mut r = rand::rngs::StdRng::seed_from_u64(3);
    for _ in 0..20_000 {
        let n = r.gen_range(2700..3300);
        p.malloc(n).unwrap();
    }
    let st = p.stats();
    p.check_invariants().unwrap();
    assert!(st.overhead() <= 0.01, "fill overhead {}", st.overhead());
    eprintln!(
        "fill overhead {:.3} %  metadata {} B",
        st.overhead() * 100.0,
        st.metadata_bytes
    );
}

#[test]
fn stress_threads_with_compaction() {
    let p = Arc::new(pool());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let compactor = {
        let (p, stop) = (p.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                p.compact();
                p.check_invariants().unwrap();
                std::thread::yield_now();
            }
        })
    };
    let workers: Vec<_> = (0..8u64)
        .map(|t| {
            let p = p.clone();
            std::thread::spawn(move || {
                let mut r = rand::rngs::StdRng::seed_from_u64(t);
                let mut live: Vec<(Handle, u8, usize)> = Vec::new();
                let mut buf = vec![0u8; 4096];
                for i in 0..20_000u32 {
                    if live.len() < 300 && r.gen_bool(0.6) || live.is_empty() {
                        let n = r.gen_range(1..=4096);
                        let v = (i % 251) as u8;
                        live.push((p.malloc_write(&vec![v; n]).unwrap(), v, n));
                    } else {
                        let (h, v, n) = live.swap_remove(r.gen_range(0..live.len()));
                        assert_eq!(p.read(h, &mut buf).unwrap(), n);
                        assert!(buf[..n].iter().all(|&x| x == v));
                        p.map_read(h, &mut |s| assert!(s.iter().all(|&x| x == v)))
                            .unwrap();
                        assert_eq!(p.free(h).unwrap(), n);
                    }
                }
                live
            })
        })
        .collect();
    let lives: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    compactor.join().unwrap();
    p.check_invariants().unwrap();
    let mut buf = vec![0u8; 4096];
    for (h, v, n) in lives.into_iter().flatten() {
        assert_eq!(p.read(h, &mut buf).unwrap(), n);
        assert!(buf[..n].iter().all(|&x| x == v));
        p.free(h).unwrap();
    }
    p.compact();
    p.check_invariants().unwrap();
    assert_eq!(p.pool_bytes(), 0);
}

/// Objects never written are freed without a wipe (their blocks still read
/// as zeros); written ones are wiped. Either way a later owner of the same
/// bytes reads zeros, and free blocks pass the checker's zero test.
#[test]
fn wipe_only_what_was_written() {
    let p = XcfPool::new(XcfConfig {
        limit_bytes: None,
        shards: 1,
    })
    .unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(11);
    for round in 0..50u64 {
        let hs: Vec<(Handle, usize)> = (0..40)
            .map(|i| {
                let n = r.gen_range(1..=4096);
                let h = if (round + i).is_multiple_of(3) {
                    p.malloc(n).unwrap()
                } else {
                    p.malloc_write(&fill_bytes(round * 100 + i, n)).unwrap()
                };
                (h, n)
            })
            .collect();
        for (i, &(h, n)) in hs.iter().enumerate() {
            if (round as usize + i).is_multiple_of(2) {
                assert_eq!(p.free(h).unwrap(), n);
            }
        }
        p.check_invariants().unwrap();
        let fresh = p.malloc(4096).unwrap();
        let mut b = vec![1u8; 4096];
        p.read(fresh, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0), "a new object shows old bytes");
        p.free(fresh).unwrap();
        for (i, &(h, _)) in hs.iter().enumerate() {
            if (round as usize + i) % 2 == 1 {
                p.free(h).unwrap();
            }
        }
        p.check_invariants().unwrap();
    }
    assert_eq!(p.pool_bytes(), 0);
}

/// Below the limit a new object takes at most two blocks (a fresh page is
/// added rather than a longer chain made of scattered free space); at the
/// limit the scattered space is used, however many blocks that takes.
#[test]
fn chains_of_two_unless_at_limit() {
    let p = XcfPool::new(XcfConfig {
        limit_bytes: None,
        shards: 1,
    })
    .unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(5);
    let mut live: Vec<Handle> = (0..400)
        .map(|_| p.malloc(r.gen_range(200..1200)).unwrap())
        .collect();
    // Free every other object: the free space is scattered in small holes.
    for h in live.iter().skip(1).step_by(2) {
        p.free(*h).unwrap();
    }
    live = live.into_iter().step_by(2).collect();
    p.check_invariants().unwrap();
    assert!(extra(&p, "largest_free_block") < 2000);
    for _ in 0..50 {
        let before = extra(&p, "blocks");
        live.push(p.malloc(r.gen_range(2000..4000)).unwrap());
        assert!(extra(&p, "blocks") - before <= 2);
    }
    p.check_invariants().unwrap();
    // At the limit: one more page is refused, yet free space in many holes
    // still takes an object bigger than any hole.
    p.set_limit(Some(p.pool_bytes()));
    let free = extra(&p, "free_bytes");
    let largest = extra(&p, "largest_free_block");
    assert!(
        free > largest + 8,
        "free {free} B, largest hole {largest} B"
    );
    let before = extra(&p, "blocks");
    live.push(p.malloc(largest as usize + 8).unwrap());
    assert!(extra(&p, "blocks") - before >= 2);
    assert_eq!(extra(&p, "refused_limit"), 0);
    p.check_invariants().unwrap();
}
