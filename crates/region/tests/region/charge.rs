use crate::common::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use uzswap_region::{Charge, PagerConfig};

/// Memory the host reports through `PagerConfig::charge` comes out of the
/// budget: region pages are kept within what is left, the limit follows
/// the charge while nothing faults, and never falls below a quarter of the
/// budget. Every page keeps its contents throughout.
#[test]
fn charged_memory_comes_out_of_the_budget() {
    let charged = Arc::new(AtomicU64::new(96 * PAGE as u64));
    let reading = charged.clone();
    let (pager, _store) = pager_with(PagerConfig {
        charge: Some(Charge(Arc::new(move || reading.load(Ordering::Relaxed)))),
        ..PagerConfig::new(256)
    });
    let r = pager.region(1024 * PAGE).unwrap();
    let base = r.as_ptr();
    for p in 0..1024 {
        fill(page_mut(base, p), p, 1);
    }
    let st = pager.stats();
    assert_eq!((st.charged_bytes, st.limit_pages), (96 * PAGE as u64, 160));
    assert!(st.peak_resident_pages <= 160, "{st:?}");
    assert!(r.mincore_resident().unwrap() <= 160);

    // The charge grows while the program is idle: the evictor notices it
    // without a fault to wake it.
    charged.store(150 * PAGE as u64, Ordering::Relaxed);
    let settled = |limit: u64| {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < end {
            let st = pager.stats();
            if st.limit_pages == limit && st.resident_pages <= limit {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        false
    };
    assert!(settled(106), "{:?}", pager.stats());
    assert!(r.mincore_resident().unwrap() <= 106);

    // A charge above three quarters of the budget leaves the regions a
    // quarter of it.
    charged.store(1 << 30, Ordering::Relaxed);
    assert!(settled(64), "{:?}", pager.stats());
    let mut want = vec![0u8; PAGE];
    for p in (0..1024).rev() {
        fill(&mut want, p, 1);
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
    }
    assert!(pager.stats().peak_resident_pages <= 160);
    assert!(r.mincore_resident().unwrap() <= 64);
    pager.check_invariants().unwrap();
}

/// A charge that holds the limit at the floor, far below the budget (a
/// process of a tree whose runtime takes nearly all its share) still leaves
/// the floor's pages to run in: eviction stops short of the limit by a
/// margin scaled to the limit, not to the budget, so a working set under
/// the floor stays resident. With the budget's margin (256 pages here)
/// eviction ran down to no page at all and every access faulted.
#[test]
fn a_limit_at_the_floor_keeps_a_small_working_set_resident() {
    const BUDGET: usize = 8192;
    const FLOOR: usize = 256;
    let (pager, _store) = pager_with(PagerConfig {
        charge: Some(Charge(Arc::new(|| 1 << 40))),
        floor_pages: Some(FLOOR),
        ..PagerConfig::new(BUDGET)
    });
    let r = pager.region(2048 * PAGE).unwrap();
    let base = r.as_ptr();
    for p in 0..2048 {
        fill(page_mut(base, p), p, 1);
    }
    assert_eq!(pager.stats().limit_pages, FLOOR as u64);
    let faults = |st: &uzswap_region::PagerStats| {
        st.faults_zero + st.faults_pool + st.faults_backing + st.faults_same_filled
    };
    let before = faults(&pager.stats());
    let mut want = vec![0u8; PAGE];
    const HOT: usize = 128;
    for _ in 0..20 {
        for p in 0..HOT {
            fill(&mut want, p, 1);
            assert_eq!(page_mut(base, p), &want[..], "page {p}");
        }
    }
    let st = pager.stats();
    // The first pass brings the hot pages back (readahead may bring more);
    // the other nineteen find them resident.
    assert!(faults(&st) - before <= 2 * HOT as u64, "{st:?}");
    assert!(st.resident_pages >= HOT as u64, "{st:?}");
    pager.check_invariants().unwrap();
}

/// An idle pager reads its charge less and less often (an idle process of
/// a tree need not wake 100 times a second), and a charge that grows
/// meanwhile is still acted on: the limit follows it and the pages over it
/// leave, contents intact.
#[test]
fn an_idle_pager_reads_its_charge_less_often() {
    let charged = Arc::new(AtomicU64::new(0));
    let readings = Arc::new(AtomicU64::new(0));
    let (c, n) = (charged.clone(), readings.clone());
    let (pager, _store) = pager_with(PagerConfig {
        charge: Some(Charge(Arc::new(move || {
            n.fetch_add(1, Ordering::Relaxed);
            c.load(Ordering::Relaxed)
        }))),
        ..PagerConfig::new(256)
    });
    let r = pager.region(128 * PAGE).unwrap();
    let base = r.as_ptr();
    for p in 0..128 {
        fill(page_mut(base, p), p, 4);
    }
    // Past the back-off (10 + 20 + 40 ms), then one second idle: at the
    // charge period's 10 ms that would be 100 readings.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let before = readings.load(Ordering::Relaxed);
    std::thread::sleep(std::time::Duration::from_secs(1));
    let idle = readings.load(Ordering::Relaxed) - before;
    assert!(idle <= 1000 / 80 + 2, "{idle} readings in an idle second");
    assert!(idle >= 1, "the charge was not read at all");

    charged.store(200 * PAGE as u64, Ordering::Relaxed);
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while pager.stats().resident_pages > 64 && std::time::Instant::now() < end {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let st = pager.stats();
    assert_eq!(st.limit_pages, 64, "{st:?}");
    assert!(st.resident_pages <= 64, "{st:?}");
    let mut want = vec![0u8; PAGE];
    for p in 0..128 {
        fill(&mut want, p, 4);
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
    }
    pager.check_invariants().unwrap();
}

/// Before a fork whose child takes the pager over, the host asks for room
/// for what the child will copy (`PagerConfig::fork_room`): the limit
/// comes down by that room at once and the evictor brings the resident
/// pages under it (the call waits for it a bounded time; the test allows
/// more, for a loaded machine); the limit stays that much lower for a
/// while (rooms of forks in a row add up), then comes back. Every page
/// keeps its contents. Without the room, the resident pages stayed at the
/// limit.
#[test]
fn room_is_made_before_a_fork() {
    const BUDGET: usize = 1024;
    const ROOM: usize = 256;
    let (pager, _store) = pager_with(PagerConfig {
        charge: Some(Charge(Arc::new(|| 0))),
        fork_room: Some(Charge(Arc::new(|| (ROOM * PAGE) as u64))),
        ..PagerConfig::new(BUDGET)
    });
    let r = pager.region(4096 * PAGE).unwrap();
    let base = r.as_ptr();
    for p in 0..4096 {
        fill(page_mut(base, p), p, 1);
    }
    let before = pager.stats();
    assert!(before.resident_pages > (BUDGET - ROOM) as u64, "{before:?}");
    let under = |limit: usize| {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let st = pager.stats();
            if st.resident_pages <= limit as u64 {
                return true;
            }
            if std::time::Instant::now() > end {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    };

    pager.make_room_for_fork();
    let st = pager.stats();
    assert_eq!(st.limit_pages, (BUDGET - ROOM) as u64, "{st:?}");
    assert!(under(BUDGET - ROOM), "{:?}", pager.stats());
    assert!(r.mincore_resident().unwrap() <= BUDGET - ROOM);

    // A second fork right after: the rooms add up.
    pager.make_room_for_fork();
    let st = pager.stats();
    assert_eq!(st.limit_pages, (BUDGET - 2 * ROOM) as u64, "{st:?}");
    assert!(under(BUDGET - 2 * ROOM), "{:?}", pager.stats());

    // Once the room is no longer held, the limit is the charge's again:
    // touching every page brings the resident set back up to it.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let mut want = vec![0u8; PAGE];
    for p in 0..4096 {
        fill(&mut want, p, 1);
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
    }
    let st = pager.stats();
    assert_eq!(st.limit_pages, BUDGET as u64, "{st:?}");
    assert!(st.resident_pages > (BUDGET - ROOM) as u64, "{st:?}");
    pager.check_invariants().unwrap();
}

/// A process whose resident set shrank gives back the memory of its victim
/// lists: the entries of pages that left are dropped and the lists' spare
/// capacity returned, while the process is idle (the evictor looks after
/// them at every reading of the charge). Before, the lists stayed at their
/// largest: an idle Python parent of a tree held 768 KiB of lists for 273
/// entries.
#[test]
fn the_victim_lists_shrink_with_the_resident_set() {
    const PAGES: usize = 32768;
    let (pager, _store) = pager_with(PagerConfig {
        charge: Some(Charge(Arc::new(|| 0))),
        ..PagerConfig::new(PAGES + 1024)
    });
    let r = pager.region(PAGES * PAGE).unwrap();
    let base = r.as_ptr();
    for p in 0..PAGES {
        fill(page_mut(base, p), p, 1);
    }
    let full = pager.stats();
    assert!(full.lists_bytes >= (PAGES * 12) as u64, "{full:?}");
    // The program gives back all but its last 100 pages.
    let keep = 100;
    // SAFETY: the region's own pages, which nothing else references.
    let rc = unsafe { libc::madvise(base.cast(), (PAGES - keep) * PAGE, libc::MADV_DONTNEED) };
    assert_eq!(rc, 0);
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let small = loop {
        let st = pager.stats();
        if st.resident_pages <= keep as u64 && st.lists_bytes <= 64 << 10 {
            break st;
        }
        assert!(std::time::Instant::now() < end, "{st:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert!(small.list_entries <= (keep + 2048) as u64, "{small:?}");
    let mut want = vec![0u8; PAGE];
    for p in PAGES - keep..PAGES {
        fill(&mut want, p, 1);
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
    }
    pager.check_invariants().unwrap();
}

/// Pages the program made `PROT_NONE` while they were resident (the JVM
/// and Go protect parts of their heaps so) are evicted like any other, and
/// come back whole once the program makes them accessible again. Unread
/// (a read by `process_vm_readv` fails there), they went back to the
/// lists and came round again: once they were all that was resident, the
/// evictor spun and the limit was never reached (a JVM under `uzswap run
/// --memory-max 80M` hung so).
#[test]
fn pages_the_program_made_inaccessible_are_evicted() {
    let _w = watchdog("pages_the_program_made_inaccessible_are_evicted", 60);
    let charged = Arc::new(AtomicU64::new(0));
    let reading = charged.clone();
    let (pager, _store) = pager_with(PagerConfig {
        charge: Some(Charge(Arc::new(move || reading.load(Ordering::Relaxed)))),
        ..PagerConfig::new(256)
    });
    const PAGES: usize = 192;
    let r = pager.region(PAGES * PAGE).unwrap();
    let base = r.as_ptr();
    for p in 0..PAGES {
        fill(page_mut(base, p), p, 3);
    }
    let protect = |prot: i32| {
        // SAFETY: the whole region, which this test owns.
        let rc = unsafe { libc::mprotect(base.cast(), PAGES * PAGE, prot) };
        assert_eq!(rc, 0, "mprotect: {}", std::io::Error::last_os_error());
    };
    protect(libc::PROT_NONE);
    // A charge that leaves the regions a quarter of the budget: the
    // protected pages are the only ones to take.
    charged.store(1 << 30, Ordering::Relaxed);
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let settled = loop {
        let st = pager.stats();
        if st.limit_pages == 64 && st.resident_pages <= 64 {
            break true;
        }
        if std::time::Instant::now() > end {
            break false;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert!(settled, "{:?}", pager.stats());
    assert!(r.mincore_resident().unwrap() <= 64);
    protect(libc::PROT_READ | libc::PROT_WRITE);
    let mut want = vec![0u8; PAGE];
    for p in 0..PAGES {
        fill(&mut want, p, 3);
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
    }
    pager.check_invariants().unwrap();
}
