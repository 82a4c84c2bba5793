//! Model checking of the cache's protocol with shuttle: every lock, atomic
//! and thread-local of the cache and its allocator is scheduled by shuttle,
//! which explores interleavings of small scenarios (three threads, a few
//! keys) where stores, loads in both modes, invalidations, writeback,
//! compaction and duplicate sharing race on the same entries. Every load is
//! checked against what may legally be there, and the cache re-derives all
//! its invariants at the end.
//! Run with `cargo test -p uzswap-cache --features shuttle --test shuttle`.
#![cfg(feature = "shuttle")]

mod common;

use common::{page, MemBacking};
use shuttle::sync::Arc;
use shuttle::thread;
use uzswap_cache::{
    Backing, Cache, CacheConfig, DedupScope, LoadError, LoadMode, PoolLimit, PAGE_SIZE,
};

fn cache(dedup: bool) -> Arc<Cache> {
    let c = Cache::new(CacheConfig {
        pool_limit: PoolLimit::Unlimited,
        backing: Backing::Store(Box::new(MemBacking::default())),
        // Writeback is driven by a model thread instead.
        background_writer: false,
        writeback_batch: 2,
        dedup,
        dedup_scope: DedupScope::Global,
        ..CacheConfig::default()
    })
    .unwrap();
    c.open_area(0).unwrap();
    c.open_area(1).unwrap();
    Arc::new(c)
}

/// Version `v` of the page under key `k`: text-like, half random or random
/// pages (kinds 2..=4), so pool objects of several classes and raw objects.
fn version(k: u64, v: u64) -> Vec<u8> {
    page(2 + (k + v) as u8 % 3, k * 100 + v)
}

/// `Some(v)` if `buf` is version `v` of key `k`, for `v` in `0..n`.
fn which(buf: &[u8], k: u64, n: u64) -> Option<u64> {
    (0..n).find(|&v| buf == version(k, v))
}

/// One owner rewrites keys 0 and 1 while a reader loads them (keep mode)
/// and a third thread writes back and compacts; another key is stored,
/// loaded exclusively and reloaded by the reader's thread.
fn store_load_writeback() {
    let c = cache(false);
    let owner = {
        let c = c.clone();
        thread::spawn(move || {
            let mut buf = vec![0u8; PAGE_SIZE];
            for v in 0..3 {
                for k in 0..2 {
                    c.store(0, k, &version(k, v)).unwrap();
                    c.load(0, k, &mut buf, LoadMode::Keep).unwrap();
                    assert_eq!(which(&buf, k, 3), Some(v), "owner reads its last store");
                }
            }
        })
    };
    let reader = {
        let c = c.clone();
        thread::spawn(move || {
            let mut buf = vec![0u8; PAGE_SIZE];
            for k in 0..2 {
                match c.load(0, k, &mut buf, LoadMode::Keep) {
                    Ok(_) => assert!(
                        which(&buf, k, 3).is_some(),
                        "a load returned bytes never stored"
                    ),
                    Err(LoadError::NotFound) => {}
                    Err(e) => panic!("load failed: {e}"),
                }
            }
            // A key of its own: exclusive load takes it out exactly once.
            c.store(0, 7, &version(7, 0)).unwrap();
            c.load(0, 7, &mut buf, LoadMode::Exclusive).unwrap();
            assert_eq!(buf, version(7, 0));
            assert!(matches!(
                c.load(0, 7, &mut buf, LoadMode::Exclusive),
                Err(LoadError::NotFound)
            ));
            c.store(0, 7, &version(7, 1)).unwrap();
        })
    };
    let writer = {
        let c = c.clone();
        thread::spawn(move || {
            for _ in 0..3 {
                c.writeback(2).unwrap();
            }
            c.compact();
        })
    };
    owner.join().unwrap();
    reader.join().unwrap();
    writer.join().unwrap();
    let mut buf = vec![0u8; PAGE_SIZE];
    for (k, last) in [(0, 2), (1, 2), (7, 1)] {
        c.load(0, k, &mut buf, LoadMode::Keep).unwrap();
        assert_eq!(which(&buf, k, 3), Some(last), "key {k} lost its last store");
    }
    c.check_invariants().unwrap();
    let s = c.stats();
    assert_eq!(s.stored_pages + s.backing_pages, 3, "{s:?}");
}

/// Two areas store the same page (shared through dedup, global scope),
/// load it exclusively and invalidate it while a third thread writes back:
/// the shared object is freed exactly once, after its last reference.
fn dedup_shared_object() {
    let c = cache(true);
    let shared = version(5, 0);
    let users: Vec<_> = (0..2u32)
        .map(|area| {
            let c = c.clone();
            let shared = shared.clone();
            thread::spawn(move || {
                let mut buf = vec![0u8; PAGE_SIZE];
                c.store(area, 0, &shared).unwrap();
                c.store(area, 1, &shared).unwrap();
                c.load(area, 0, &mut buf, LoadMode::Exclusive).unwrap();
                assert_eq!(buf, shared);
                c.load(area, 1, &mut buf, LoadMode::Keep).unwrap();
                assert_eq!(buf, shared);
                if area == 0 {
                    assert!(c.invalidate(area, 1).unwrap());
                }
            })
        })
        .collect();
    let writer = {
        let c = c.clone();
        thread::spawn(move || {
            c.writeback(1).unwrap();
            c.compact();
        })
    };
    for u in users {
        u.join().unwrap();
    }
    writer.join().unwrap();
    let mut buf = vec![0u8; PAGE_SIZE];
    c.load(1, 1, &mut buf, LoadMode::Keep).unwrap();
    assert_eq!(buf, shared);
    c.check_invariants().unwrap();
    assert!(c.invalidate(1, 1).unwrap());
    c.check_invariants().unwrap();
    assert_eq!(
        c.pool_stats().objects,
        0,
        "an object outlived its last reference"
    );
}

#[test]
fn shuttle_store_load_writeback_random() {
    shuttle::check_random(store_load_writeback, 1500);
}

#[test]
fn shuttle_store_load_writeback_pct() {
    shuttle::check_pct(store_load_writeback, 1500, 3);
}

#[test]
fn shuttle_dedup_random() {
    shuttle::check_random(dedup_shared_object, 1500);
}

#[test]
fn shuttle_dedup_pct() {
    shuttle::check_pct(dedup_shared_object, 1500, 3);
}
