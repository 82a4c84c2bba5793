//! The remote tier against real servers: each test starts its own (a
//! single node or a three-master cluster, see `uzswap_remote::testing`)
//! and is skipped, saying so, when `redis-server` is not installed.

use std::sync::Arc;
use std::time::Duration;
use uzswap_cache::{
    Backing, BackingStore, Cache, CacheConfig, LoadError, LoadMode, PoolLimit, PAGE_SIZE,
};
use uzswap_remote::testing::{Cluster, Server};
use uzswap_remote::{RedisBacking, RemoteConfig, EXTENT_PAGES};

/// A page of pseudo-random bytes from `seed` (incompressible: the pool
/// fills fast and writeback has work).
fn page(seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut p = Vec::with_capacity(PAGE_SIZE);
    while p.len() < PAGE_SIZE {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p.extend_from_slice(&x.to_le_bytes());
    }
    p
}

fn quick() -> RemoteConfig {
    RemoteConfig {
        timeout: Duration::from_millis(500),
        ..RemoteConfig::default()
    }
}

/// Extents (keys) `round_trip` of `n` pages makes.
fn extents_of(n: u64) -> u64 {
    let per_run = |len: u64| len.div_ceil(EXTENT_PAGES as u64);
    (n / 64) * per_run(64) + per_run(n % 64)
}

/// Writes `n` pages in runs of 64 adjacent slots, reads each back.
fn round_trip(store: &RedisBacking, n: u64) {
    let pages: Vec<Vec<u8>> = (0..n).map(page).collect();
    for first in (0..n).step_by(64) {
        let run: Vec<&[u8]> = (first..(first + 64).min(n))
            .map(|s| &pages[s as usize][..])
            .collect();
        store.write_slots(first, &run).unwrap();
    }
    let mut buf = vec![0u8; PAGE_SIZE];
    for s in 0..n {
        store.read_slot(s, &mut buf).unwrap();
        assert!(buf == pages[s as usize], "slot {s} came back different");
    }
}

/// Every key of the store has a time-to-live.
fn ttls_set(conn: &mut redis::Connection, keys: &[String]) {
    for k in keys {
        let ttl: i64 = redis::cmd("TTL").arg(k).query(conn).unwrap();
        assert!(ttl > 0, "{k} has no time-to-live ({ttl})");
    }
}

#[test]
fn single_node_round_trip_ttl_and_nothing_left() {
    let Some(srv) = Server::start() else { return };
    let store = RedisBacking::connect_with(&srv.url(), quick()).unwrap();
    assert!(!store.is_cluster());
    round_trip(&store, 1000);
    // Runs of 64 adjacent slots go out as extents of 16 pages, a key each.
    assert_eq!(srv.dbsize(), extents_of(1000));
    let keys = srv.keys();
    assert!(keys
        .iter()
        .all(|k| k.starts_with(&format!("uzswap:{}:", store.namespace()))));
    ttls_set(&mut srv.conn(), &keys);
    let s = store.stats();
    assert_eq!(
        (s.live_bytes, s.tier.held_bytes),
        (1000 * 4096, 1000 * 4096)
    );
    // Discarding part of an extent holds it; discarding all of it (or
    // writing its slots again) unlinks it with the next write.
    store.discard(0, 8);
    store.discard(16, 16);
    let s = store.stats();
    // The dead extent counts as held until the next write unlinks it.
    assert_eq!((s.live_bytes, s.tier.held_bytes), (976 * 4096, 1000 * 4096));
    let mut buf = vec![0u8; PAGE_SIZE];
    assert!(store.read_slot(3, &mut buf).is_err(), "a discarded slot");
    store.read_slot(8, &mut buf).unwrap();
    assert!(buf == page(8), "its extent's other pages still read");
    store.write_slots(8, &[&page(5000)]).unwrap();
    store.read_slot(8, &mut buf).unwrap();
    assert!(buf == page(5000));
    assert_eq!(srv.dbsize(), extents_of(1000) - 1 + 1);
    let s = store.stats();
    assert_eq!(s.extents_unlinked, 1);
    assert_eq!((s.live_bytes, s.tier.held_bytes), (976 * 4096, 985 * 4096));
    let t = s.tier;
    // Read in order, an extent of 16 costs 3 round trips: its first page,
    // then 8 pages, then the last 7; 13 loads are read ahead.
    assert_eq!(t.read_ahead_hits, 62 * 13 + 6);
    assert!(t.round_trips >= 1000 / 64 + 1000 - t.read_ahead_hits);
    assert!(t.round_trips < 1000 / 2 && t.bytes_sent >= 1000 * 4096);
    assert!(t.bytes_received >= 1000 * 4096 && t.errors == 1);
    assert!(store.describe().contains("round trips"));
    drop(store);
    assert_eq!(srv.dbsize(), 0, "the store's keys are gone after drop");
}

#[test]
fn cluster_round_trip_spreads_keys_and_leaves_nothing() {
    let Some(cl) = Cluster::start() else { return };
    let store = RedisBacking::connect_with(&cl.url(), quick()).unwrap();
    assert!(store.is_cluster());
    round_trip(&store, 1500);
    let sizes = cl.dbsizes();
    assert_eq!(sizes.iter().sum::<u64>(), extents_of(1500));
    assert!(
        sizes.iter().all(|&n| n > 10),
        "keys spread over every master: {sizes:?}"
    );
    for n in &cl.nodes {
        ttls_set(&mut n.conn(), &n.keys());
    }
    // A seed by name (resolved by the client) works as by address.
    let named =
        RedisBacking::connect_with(&cl.url().replace("127.0.0.1", "localhost"), quick()).unwrap();
    assert!(named.is_cluster());
    round_trip(&named, 64);
    drop(named);
    // One seed of the cluster is enough: the store asks whether cluster
    // mode is on and follows the redirects.
    let one = RedisBacking::connect_with(&cl.nodes[1].url(), quick()).unwrap();
    assert!(one.is_cluster());
    round_trip(&one, 200);
    drop(one);
    drop(store);
    assert_eq!(cl.dbsizes(), [0, 0, 0]);
}

/// A cache with a small pool over `store`: pages go out and come back.
fn cache_over(store: Arc<RedisBacking>, background: bool) -> Cache {
    let c = Cache::new(CacheConfig {
        pool_limit: PoolLimit::Bytes(64 * 4096),
        backing: Backing::Store(Box::new(store)),
        background_writer: background,
        ..CacheConfig::default()
    })
    .unwrap();
    c.open_area(0).unwrap();
    c
}

fn cache_round_trip(url: &str) {
    let store = Arc::new(RedisBacking::connect_with(url, quick()).unwrap());
    let c = cache_over(store.clone(), true);
    let n = 2000u64;
    for i in 0..n {
        // The pool refuses for a moment while the writer catches up.
        let mut tries = 0;
        while c.store(0, i, &page(i)).is_err() {
            tries += 1;
            assert!(tries < 2000, "store {i} refused for good");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    c.writeback(usize::MAX).unwrap();
    let mut buf = vec![0u8; PAGE_SIZE];
    for i in 0..n {
        c.load(0, i, &mut buf, LoadMode::Keep).unwrap();
        assert!(buf == page(i), "page {i} came back different");
    }
    let s = c.stats();
    assert!(s.loads_backing > n / 2, "{s:?}");
    c.check_invariants().unwrap();
    for i in 0..n {
        c.load(0, i, &mut buf, LoadMode::Exclusive).unwrap();
        assert!(buf == page(i), "page {i} came back different");
    }
    drop(c);
    assert_eq!(Arc::strong_count(&store), 1);
}

#[test]
fn cache_round_trip_single_node() {
    let Some(srv) = Server::start() else { return };
    cache_round_trip(&srv.url());
    assert_eq!(srv.dbsize(), 0);
}

#[test]
fn cache_round_trip_cluster() {
    let Some(cl) = Cluster::start() else { return };
    cache_round_trip(&cl.url());
    assert_eq!(cl.dbsizes(), [0, 0, 0]);
}

/// Stores `0..n` and writes them all back.
fn fill_and_write_back(c: &Cache, n: u64, salt: u64) {
    for i in 0..n {
        c.store(0, i, &page(i ^ salt)).unwrap();
        if i % 32 == 31 {
            c.writeback(usize::MAX).unwrap();
        }
    }
    c.writeback(usize::MAX).unwrap();
    assert_eq!(c.stats().backing_pages, n);
}

#[test]
fn server_killed_loads_fail_then_reconnect_after_restart() {
    let Some(mut srv) = Server::start() else {
        return;
    };
    let store = Arc::new(RedisBacking::connect_with(&srv.url(), quick()).unwrap());
    let c = cache_over(store.clone(), false);
    fill_and_write_back(&c, 200, 0);
    srv.kill();
    let mut buf = vec![1u8; PAGE_SIZE];
    for i in 0..20 {
        match c.load(0, i, &mut buf, LoadMode::Keep) {
            Err(LoadError::Io(_)) => assert!(buf.iter().all(|&b| b == 0)),
            other => panic!("load {i} with the server dead: {other:?}"),
        }
    }
    // A new, empty server on the same port: old pages are missing (an
    // error, never other bytes), new ones go out and come back.
    srv.restart();
    for i in 0..20 {
        match c.load(0, i, &mut buf, LoadMode::Keep) {
            Err(LoadError::Io(e)) => assert!(e.to_string().contains("missing"), "{e}"),
            other => panic!("load {i} from the empty server: {other:?}"),
        }
    }
    for i in 0..200 {
        c.invalidate(0, i).unwrap();
    }
    fill_and_write_back(&c, 200, 0x55);
    for i in 0..200 {
        c.load(0, i, &mut buf, LoadMode::Keep).unwrap();
        assert!(buf == page(i ^ 0x55));
    }
    let s = store.stats().tier;
    assert!(
        s.errors >= 40 && s.missing >= 20 && s.connects >= 2,
        "{s:?}"
    );
    assert!(c.stats().backing_read_fail >= 40);
}

#[test]
fn deleted_key_is_missing_and_altered_value_is_refused() {
    let Some(srv) = Server::start() else { return };
    let store = Arc::new(RedisBacking::connect_with(&srv.url(), quick()).unwrap());
    // Directly: a deleted key is an error, not zeros.
    store.write_slots(9000, &[&page(1)]).unwrap();
    let (key, _) = store.key(9000).unwrap();
    let _: () = redis::cmd("DEL").arg(key).query(&mut srv.conn()).unwrap();
    let mut buf = vec![0u8; PAGE_SIZE];
    let e = store.read_slot(9000, &mut buf).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    // Through the cache: an extent whose pages were replaced with garbage,
    // or cut short, never gives a page back.
    let c = cache_over(store.clone(), false);
    fill_and_write_back(&c, 50, 0);
    let mut conn = srv.conn();
    let places: Vec<(String, usize)> = (0..50).map(|i| c_key(&store, &c, i)).collect();
    // Garbage over the even pages: their neighbours still open.
    for (key, at) in places.iter().step_by(2) {
        let _: () = redis::cmd("SETRANGE")
            .arg(key)
            .arg(*at)
            .arg(page(7777))
            .query(&mut conn)
            .unwrap();
    }
    // Then every extent cut short after its first 8 pages.
    let half = 8 * PAGE_SIZE;
    let mut keys: Vec<&String> = places.iter().map(|(k, _)| k).collect();
    keys.dedup();
    for key in keys {
        let v: Vec<u8> = redis::cmd("GETRANGE")
            .arg(key)
            .arg(0)
            .arg(half - 1)
            .query(&mut conn)
            .unwrap();
        let _: () = redis::cmd("SET").arg(key).arg(v).query(&mut conn).unwrap();
    }
    for (i, (_, at)) in places.iter().enumerate() {
        let got = c.load(0, i as u64, &mut buf, LoadMode::Keep);
        match got {
            Err(LoadError::Io(_)) if *at >= half => {}
            Err(LoadError::Corrupt { where_: "backing" }) if *at < half && i % 2 == 0 => {}
            Ok(_) if *at < half && i % 2 == 1 => {
                assert!(buf == page(i as u64), "page {i} came back different");
                continue;
            }
            other => panic!("load {i} (at {at} in its extent): {other:?}"),
        }
        assert!(buf.iter().all(|&b| b == 0), "a failed load gives zeros");
    }
    let altered = places
        .iter()
        .step_by(2)
        .filter(|(_, at)| *at < half)
        .count() as u64;
    assert!(altered > 0 && places.iter().any(|(_, at)| *at >= half));
    assert_eq!(c.stats().backing_corrupt, altered);
}

/// The extent key and byte offset of the slot behind cache key `i`.
fn c_key(store: &RedisBacking, c: &Cache, i: u64) -> (String, usize) {
    let slot = c.backing_slot(0, i).expect("written back");
    store.key(slot).expect("a written slot has an extent")
}

#[test]
fn concurrent_writers_and_loaders() {
    let Some(cl) = Cluster::start() else { return };
    let store = Arc::new(RedisBacking::connect_with(&cl.url(), quick()).unwrap());
    // The store alone: each thread its own slot range, written in runs
    // and read back while the others do the same.
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let store = &store;
            s.spawn(move || {
                let base = t * 10_000;
                let mut buf = vec![0u8; PAGE_SIZE];
                for round in 0..10u64 {
                    let pages: Vec<Vec<u8>> = (0..16).map(|i| page(base + i + round)).collect();
                    let refs: Vec<&[u8]> = pages.iter().map(|p| &p[..]).collect();
                    store.write_slots(base, &refs).unwrap();
                    for i in 0..16 {
                        store.read_slot(base + i, &mut buf).unwrap();
                        assert!(buf == pages[i as usize], "thread {t} slot {i}");
                    }
                }
            });
        }
    });
    // Through a cache with its writer running: threads store and load
    // their own keys.
    let c = cache_over(store.clone(), true);
    std::thread::scope(|s| {
        for t in 0..6u64 {
            let c = &c;
            s.spawn(move || {
                let mut buf = vec![0u8; PAGE_SIZE];
                let keys = (t * 1000)..(t * 1000 + 150);
                for k in keys.clone() {
                    while c.store(0, k, &page(k)).is_err() {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                for round in 0..3 {
                    for k in keys.clone() {
                        c.load(0, k, &mut buf, LoadMode::Keep).unwrap();
                        assert!(buf == page(k), "thread {t} key {k} round {round}");
                    }
                }
            });
        }
    });
    c.check_invariants().unwrap();
    assert!(c.stats().loads_backing > 0);
    drop(c);
    drop(store);
    assert_eq!(cl.dbsizes(), [0, 0, 0]);
}

#[test]
fn fork_private_copies_into_a_namespace_of_its_own() {
    let Some(srv) = Server::start() else { return };
    let store = RedisBacking::connect_with(&srv.url(), quick()).unwrap();
    round_trip(&store, 96);
    let old = store.namespace();
    let (old_key, at) = store.key(5).unwrap();
    store.fork_private(200).unwrap();
    assert_ne!(store.namespace(), old);
    assert_eq!(srv.dbsize(), 2 * extents_of(96));
    // The copy reads as the original did, and writes to it leave the
    // original alone.
    let mut buf = vec![0u8; PAGE_SIZE];
    for s in 0..96 {
        store.read_slot(s, &mut buf).unwrap();
        assert!(buf == page(s));
    }
    // 96..200 never held a key: nothing was copied for them.
    assert!(store.read_slot(97, &mut buf).is_err());
    store.write_slots(5, &[&page(999)]).unwrap();
    store.read_slot(5, &mut buf).unwrap();
    assert!(buf == page(999));
    let original: Vec<u8> = redis::cmd("GETRANGE")
        .arg(&old_key)
        .arg(at)
        .arg(at + PAGE_SIZE - 1)
        .query(&mut srv.conn())
        .unwrap();
    assert!(original == page(5), "the parent's namespace is untouched");
    ttls_set(&mut srv.conn(), &srv.keys());
    // The child's store cleans up its own namespace only.
    drop(store);
    assert_eq!(srv.dbsize(), extents_of(96));
    assert!(srv.keys().iter().all(|k| k.contains(&old)));
}

#[test]
fn sweep_deletes_what_a_runs_stores_left_and_nothing_else() {
    let Some(cl) = Cluster::start() else { return };
    let run = uzswap_remote::run_prefix().unwrap();
    let cfg = RemoteConfig {
        prefix: run.clone(),
        ..quick()
    };
    // Two stores of the run that never clean up (a process that exec'd,
    // one that was killed), and one of another run.
    for _ in 0..2 {
        let s = RedisBacking::connect_with(&cl.url(), cfg.clone()).unwrap();
        round_trip(&s, 300);
        std::mem::forget(s);
    }
    let other = RedisBacking::connect_with(&cl.url(), quick()).unwrap();
    round_trip(&other, 100);
    let swept = uzswap_remote::sweep(&cl.url(), &run, Duration::from_secs(1)).unwrap();
    assert_eq!(swept, 2 * extents_of(300));
    assert_eq!(
        cl.dbsizes().iter().sum::<u64>(),
        extents_of(100),
        "the other run's keys stay"
    );
    // A closed store (as at exit) stores nothing more.
    other.clear().unwrap();
    assert!(other.write_slots(0, &[&page(1)]).is_err());
    assert_eq!(cl.dbsizes(), [0, 0, 0]);
    let bad = RemoteConfig {
        prefix: "a*".into(),
        ..quick()
    };
    assert!(RedisBacking::connect_with(&cl.url(), bad).is_err());
}

/// Keys in use get their time-to-live renewed once half of it has
/// passed; a store that never cleans up (a killed run) leaves keys that
/// expire.
#[test]
fn keys_in_use_are_renewed_and_a_lost_stores_expire() {
    let Some(srv) = Server::start() else { return };
    let pttl = |key: &str| -> i64 { redis::cmd("PTTL").arg(key).query(&mut srv.conn()).unwrap() };
    let store = RedisBacking::connect_with(
        &srv.url(),
        RemoteConfig {
            ttl: Duration::from_secs(4),
            ..quick()
        },
    )
    .unwrap();
    round_trip(&store, 32); // two extents
    store.discard(16, 16); // the second is in use no more
    let (used, _) = store.key(0).unwrap();
    let lost = RedisBacking::connect_with(
        &srv.url(),
        RemoteConfig {
            ttl: Duration::from_secs(2),
            ..quick()
        },
    )
    .unwrap();
    round_trip(&lost, 16);
    std::mem::forget(lost);
    assert_eq!(srv.dbsize(), 3);
    std::thread::sleep(Duration::from_millis(2100));
    assert!(pttl(&used) < 2000, "{}", pttl(&used));
    assert_eq!(store.renew().unwrap(), 1, "only the extent in use");
    assert!(
        pttl(&used) > 3000,
        "renewed to the full 4 s: {}",
        pttl(&used)
    );
    assert_eq!(store.renew().unwrap(), 0, "not due again yet");
    std::thread::sleep(Duration::from_millis(500));
    // The lost store's key has expired (2 s); the dead extent is still
    // there until the next write unlinks it or it expires.
    let keys = srv.keys();
    assert!(
        keys.iter().all(|k| k.contains(&store.namespace())),
        "{keys:?}"
    );
    let mut buf = vec![0u8; PAGE_SIZE];
    store.read_slot(3, &mut buf).unwrap();
    assert!(buf == page(3));
}

/// Slots move between masters (with their keys) under a store that still
/// has the old slot map: it follows the redirects, every page reads back,
/// and writes go on.
#[test]
fn a_cluster_whose_slots_move_keeps_every_page() {
    let Some(cl) = Cluster::start() else { return };
    let store = RedisBacking::connect_with(&cl.url(), quick()).unwrap();
    round_trip(&store, 640);
    let before = cl.dbsizes();
    cl.move_slots(0, 1, 3000);
    cl.move_slots(2, 0, 2000);
    let after = cl.dbsizes();
    assert_ne!(before, after, "keys moved between masters");
    assert_eq!(after.iter().sum::<u64>(), extents_of(640));
    let mut buf = vec![0u8; PAGE_SIZE];
    for s in (0..640).rev() {
        store.read_slot(s, &mut buf).unwrap();
        assert!(buf == page(s), "slot {s} after the move");
    }
    // Written again, then read: the new map serves both.
    let pages: Vec<Vec<u8>> = (0..64).map(|i| page(10_000 + i)).collect();
    let refs: Vec<&[u8]> = pages.iter().map(|p| &p[..]).collect();
    store.write_slots(0, &refs).unwrap();
    for s in 0..64 {
        store.read_slot(s, &mut buf).unwrap();
        assert!(buf == page(10_000 + s));
    }
    drop(store);
    assert_eq!(cl.dbsizes(), [0, 0, 0]);
}
