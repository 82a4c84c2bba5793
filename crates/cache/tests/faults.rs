//! Fault injection through the backing-store trait: for each fault, what the
//! caller sees, what the counters say, and that no stored page is lost or
//! altered.

mod common;

use common::{page, MemBacking};
use std::sync::Arc;
use uzswap_cache::{
    Backing, Cache, CacheConfig, Fault, FaultInjector, LoadError, LoadMode, PoolLimit, Reject,
    StoreError, PAGE_SIZE,
};

const PAGES: u64 = 64;

fn setup(limit_pages: u64) -> (Cache, Arc<FaultInjector<MemBacking>>) {
    let inj = Arc::new(FaultInjector::new(MemBacking::default()));
    let c = Cache::new(CacheConfig {
        pool_limit: PoolLimit::Bytes(limit_pages * 4096),
        backing: Backing::Store(Box::new(inj.clone())),
        background_writer: false,
        writeback_batch: 16,
        ..CacheConfig::default()
    })
    .unwrap();
    c.open_area(0).unwrap();
    (c, inj)
}

fn all_intact(c: &Cache) {
    let mut buf = vec![0u8; PAGE_SIZE];
    for i in 0..PAGES {
        c.load(0, i, &mut buf, LoadMode::Keep)
            .unwrap_or_else(|e| panic!("page {i}: {e}"));
        assert!(buf == page(3, i), "page {i} altered");
    }
    c.check_invariants().unwrap();
}

#[test]
fn failed_writeback_keeps_pages_in_the_pool() {
    for fault in [Fault::WriteError, Fault::NoSpace, Fault::ShortWrite] {
        let (c, inj) = setup(1 << 10);
        for i in 0..PAGES {
            c.store(0, i, &page(3, i)).unwrap();
        }
        inj.arm(fault, u64::MAX);
        assert_eq!(
            c.writeback(32).unwrap(),
            0,
            "{fault:?}: nothing written back"
        );
        let st = c.stats();
        assert!(
            st.writeback_fail > 0 && st.written_back_pages == 0,
            "{fault:?}: {st:?}"
        );
        assert_eq!(
            st.stored_pages, PAGES,
            "{fault:?}: every page still in the pool"
        );
        assert_eq!(st.backing_slots_used, 0, "{fault:?}: failed slots freed");
        all_intact(&c);
        // The tier recovers: the same pages now go out.
        inj.disarm();
        assert_eq!(c.writeback(32).unwrap(), 32, "{fault:?} {:?}", c.stats());
        all_intact(&c);
        assert!(inj.injected() > 0);
    }
}

#[test]
fn failed_direct_write_refuses_the_store() {
    for fault in [Fault::WriteError, Fault::NoSpace, Fault::ShortWrite] {
        // A pool of 2 pages: random pages (stored raw) fill it at once.
        let (c, inj) = setup(2);
        c.store(0, 0, &page(4, 0)).unwrap();
        c.store(0, 1, &page(4, 1)).unwrap();
        inj.arm(fault, 1);
        let r = c.store(0, 2, &page(4, 2));
        assert!(
            matches!(r, Err(StoreError::Refused(Reject::BackingIo(_)))),
            "{fault:?}: {r:?}"
        );
        // Nothing kept for the refused key; the earlier pages intact.
        let mut buf = vec![0u8; PAGE_SIZE];
        assert!(matches!(
            c.load(0, 2, &mut buf, LoadMode::Keep),
            Err(LoadError::NotFound)
        ));
        for i in 0..2 {
            c.load(0, i, &mut buf, LoadMode::Keep).unwrap();
            assert_eq!(buf, page(4, i));
        }
        // The next store goes to the (recovered) tier.
        c.store(0, 2, &page(4, 2)).unwrap();
        c.load(0, 2, &mut buf, LoadMode::Keep).unwrap();
        assert_eq!(buf, page(4, 2));
        c.check_invariants().unwrap();
    }
}

#[test]
fn read_faults_are_errors_and_lose_nothing() {
    for fault in [Fault::ReadError, Fault::FlipBit, Fault::Truncated] {
        let (c, inj) = setup(1 << 10);
        for i in 0..PAGES {
            c.store(0, i, &page(3, i)).unwrap();
        }
        assert_eq!(c.writeback(PAGES as usize).unwrap(), PAGES as usize);
        inj.arm(fault, 1);
        let mut buf = vec![0xaau8; PAGE_SIZE];
        let r = c.load(0, 5, &mut buf, LoadMode::Exclusive);
        match fault {
            Fault::FlipBit => assert!(matches!(r, Err(LoadError::Corrupt { .. })), "{r:?}"),
            _ => assert!(matches!(r, Err(LoadError::Io(_))), "{fault:?}: {r:?}"),
        }
        assert!(
            buf.iter().all(|&b| b == 0),
            "{fault:?}: no stale bytes handed out"
        );
        let st = c.stats();
        assert_eq!(st.backing_corrupt + st.backing_read_fail, 1, "{st:?}");
        // The entry was kept, even for an exclusive load: a retry succeeds.
        all_intact(&c);
    }
}

#[test]
fn a_full_backing_tier_refuses_cleanly() {
    let inj = Arc::new(FaultInjector::new(MemBacking::default()));
    let c = Cache::new(CacheConfig {
        pool_limit: PoolLimit::Bytes(2 * 4096),
        backing: Backing::Store(Box::new(inj)),
        backing_max_bytes: Some(4 * 4096),
        background_writer: false,
        ..CacheConfig::default()
    })
    .unwrap();
    c.open_area(0).unwrap();
    let mut kept = Vec::new();
    for i in 0..10u64 {
        match c.store(0, i, &page(4, i)) {
            Ok(_) => kept.push(i),
            Err(StoreError::Refused(Reject::BackingFull { slots: 4 })) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(kept.len(), 6, "2 in the pool, 4 in the tier");
    let mut buf = vec![0u8; PAGE_SIZE];
    for i in kept {
        c.load(0, i, &mut buf, LoadMode::Keep).unwrap();
        assert_eq!(buf, page(4, i));
    }
    c.check_invariants().unwrap();
}

#[test]
fn io_admission_sends_pages_to_the_tier_while_idle() {
    let inj = Arc::new(FaultInjector::new(MemBacking::default()));
    let c = Cache::new(CacheConfig {
        backing: Backing::Store(Box::new(inj.clone())),
        io_limits: uzswap_cache::IoLimits {
            read_limit: 0,
            write_limit: 8,
        },
        background_writer: false,
        ..CacheConfig::default()
    })
    .unwrap();
    c.open_area(0).unwrap();
    inj.set_device_inflight(0, 0);
    c.store(0, 0, &page(2, 0)).unwrap();
    assert_eq!(c.stats().reject_io, 1, "idle: straight to the tier");
    inj.set_device_inflight(0, 9);
    c.store(0, 1, &page(2, 1)).unwrap();
    inj.set_device_inflight(0, 5);
    c.store(0, 2, &page(2, 2)).unwrap();
    assert_eq!(
        c.stats().reject_io,
        1,
        "busy, and still busy above half the limit"
    );
    inj.set_device_inflight(0, 4);
    c.store(0, 3, &page(2, 3)).unwrap();
    let st = c.stats();
    assert_eq!((st.reject_io, st.stored_pages), (2, 2), "{st:?}");
    c.check_invariants().unwrap();
}
