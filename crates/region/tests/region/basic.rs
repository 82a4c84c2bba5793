use crate::common::*;
use std::sync::Arc;
use uzswap_region::PageState;

#[test]
fn untouched_pages_read_zero_and_written_pages_survive_eviction() {
    let (pager, store) = pager(64);
    let r = pager.region(256 * PAGE).unwrap();
    let base = r.as_ptr();
    assert!(page_mut(base, 3).iter().all(|b| *b == 0));
    for p in 0..256 {
        fill(page_mut(base, p), p, 1);
    }
    let mut want = vec![0u8; PAGE];
    for p in 0..256 {
        fill(&mut want, p, 1);
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
    }
    let st = pager.stats();
    assert!(st.evictions > 0, "{st:?}");
    assert!(st.peak_resident_pages <= 64, "{st:?}");
    assert!(r.mincore_resident().unwrap() <= 64);
    pager.check_invariants().unwrap();
    // Explicit eviction, then a read brings it back clean.
    r.evict(0..256);
    assert_eq!(r.page_state(10), Some(PageState::Stored));
    fill(&mut want, 10, 1);
    assert_eq!(page_mut(base, 10), &want[..]);
    assert_eq!(r.page_state(10), Some(PageState::Clean));
    let drops = pager.stats().clean_drops;
    assert_eq!(r.evict(10..11), 1);
    assert_eq!(pager.stats().clean_drops, drops + 1);
    assert!(store.contains(r.area(), 10));
    drop(r);
    assert_eq!(store.len(), 0);
}

/// Victims with only stored pages between them leave in one discard (one
/// remove event, one TLB flush), and the stored pages between them, which
/// that call covers, keep their contents.
#[test]
fn scattered_victims_leave_in_one_discard() {
    let mut cfg = uzswap_region::PagerConfig::new(64);
    cfg.readahead_max = 0; // bring back exactly the pages touched
    let (pager, store) = pager_with(cfg);
    let r = pager.region(256 * PAGE).unwrap();
    let base = r.as_ptr();
    for p in 0..256 {
        fill(page_mut(base, p), p, 1);
    }
    r.evict(0..256);
    let mut want = vec![0u8; PAGE];
    // Every eighth page back: half only read (clean), half rewritten.
    for p in (0..256).step_by(8) {
        fill(&mut want, p, 1);
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
        if p % 16 == 0 {
            fill(page_mut(base, p), p, 2);
        }
    }
    assert!(r.page_state(9) == Some(PageState::Stored));
    let calls = pager.stats().discard_calls;
    assert_eq!(r.evict(0..256), 32);
    assert_eq!(pager.stats().discard_calls, calls + 1, "one span");
    assert_eq!(store.len(), 256);
    for p in 0..256 {
        assert_eq!(r.page_state(p), Some(PageState::Stored), "page {p}");
    }
    for p in 0..256 {
        fill(&mut want, p, if p % 16 == 0 { 2 } else { 1 });
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
    }
    pager.check_invariants().unwrap();
}

/// First touches that follow one another map the untouched pages after
/// them as zeros (zero readahead): far fewer faults than pages, every page
/// reads zero until written, writes made to such a page without a fault of
/// ours survive its eviction, and the resident set stays in the budget.
#[test]
fn sequential_first_touches_are_served_in_runs() {
    let (pager, store) = pager(256);
    let r = pager.region(1024 * PAGE).unwrap();
    let base = r.as_ptr();
    // Read pass over the first half: zeros, in runs.
    for p in 0..512 {
        assert!(page_mut(base, p).iter().all(|b| *b == 0), "page {p}");
    }
    let st = pager.stats();
    assert!(st.faults_zero < 512 / 4, "{st:?}");
    assert!(st.zero_readahead_pages > 0, "{st:?}");
    // Write pass over everything: the first half was mapped as the zero
    // page (the kernel copies it on write), the second half faults anew.
    for p in 0..1024 {
        fill(page_mut(base, p), p, 3);
    }
    let st = pager.stats();
    assert!(st.evictions > 0, "{st:?}");
    assert!(st.peak_resident_pages <= 256, "{st:?}");
    assert!(r.mincore_resident().unwrap() <= 256);
    r.evict(0..1024);
    let mut want = vec![0u8; PAGE];
    for p in 0..1024 {
        fill(&mut want, p, 3);
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
    }
    pager.check_invariants().unwrap();
    drop(r);
    assert_eq!(store.len(), 0);
}

/// First touches that skip pages (an allocator writing block headers)
/// never grow the zero readahead window; with most of the budget free the
/// wide window serves them in runs all the same. Every page reads zero
/// until written and keeps what was written; near the limit the runs stop
/// at the free budget.
#[test]
fn sparse_first_touches_with_room_are_served_in_wide_runs() {
    let mut cfg = uzswap_region::PagerConfig::new(4096);
    cfg.zero_readahead_wide = 256;
    let (pager, _store) = pager_with(cfg);
    let r = pager.region(1024 * PAGE).unwrap();
    let base = r.as_ptr();
    for p in (0..1024).step_by(4) {
        assert_eq!(touch(base, p), 0, "page {p}");
    }
    let st = pager.stats();
    assert!(st.faults_zero <= 8, "256 touches: {st:?}");
    for p in 0..1024 {
        assert!(page_mut(base, p).iter().all(|b| *b == 0), "page {p}");
        fill(page_mut(base, p), p, 7);
    }
    let mut want = vec![0u8; PAGE];
    for p in 0..1024 {
        fill(&mut want, p, 7);
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
    }
    pager.check_invariants().unwrap();

    // Without room: the same touches in a budget of 64 pages fault far
    // more often, and the resident set stays within it.
    let mut cfg = uzswap_region::PagerConfig::new(64);
    cfg.zero_readahead_wide = 256;
    let (pager, _store) = pager_with(cfg);
    let r = pager.region(1024 * PAGE).unwrap();
    let base = r.as_ptr();
    for p in (0..1024).step_by(4) {
        fill(page_mut(base, p), p, 9);
    }
    let st = pager.stats();
    assert!(st.faults_zero >= 128, "{st:?}");
    assert!(st.peak_resident_pages <= 64, "{st:?}");
    for p in (0..1024).step_by(4) {
        fill(&mut want, p, 9);
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
    }
    pager.check_invariants().unwrap();
}

/// With zero readahead off, one page per first-touch fault.
#[test]
fn zero_readahead_off_maps_one_page_per_fault() {
    let mut cfg = uzswap_region::PagerConfig::new(256);
    cfg.zero_readahead_max = 0;
    let (pager, _store) = pager_with(cfg);
    let r = pager.region(64 * PAGE).unwrap();
    let base = r.as_ptr();
    for p in 0..64 {
        fill(page_mut(base, p), p, 1);
    }
    let st = pager.stats();
    assert_eq!(st.faults_zero, 64, "{st:?}");
    assert_eq!(st.zero_readahead_pages, 0, "{st:?}");
}

/// A run of first touches that reaches a part of the region the program
/// made `PROT_NONE` (the JVM and Go commit heaps that way): the run stops
/// there (one `UFFDIO_ZEROPAGE` maps within one mapping) and the faulting
/// page is still served.
#[test]
fn zero_readahead_stops_at_another_mapping() {
    let _w = watchdog("zero_readahead_stops_at_another_mapping", 30);
    let (pager, _store) = pager(256);
    let r = pager.region(64 * PAGE).unwrap();
    let base = r.as_ptr();
    let protect = |from: usize, prot: i32| {
        // SAFETY: pages from..64 of the region, which this test owns.
        let rc = unsafe { libc::mprotect(base.add(from * PAGE).cast(), (64 - from) * PAGE, prot) };
        assert_eq!(rc, 0, "mprotect: {}", std::io::Error::last_os_error());
    };
    protect(16, libc::PROT_NONE);
    for p in 0..16 {
        assert_eq!(touch(base, p), 0, "page {p}");
    }
    assert!(pager.stats().zero_readahead_pages > 0);
    protect(16, libc::PROT_READ | libc::PROT_WRITE);
    for p in 0..64 {
        fill(page_mut(base, p), p, 5);
    }
    let mut want = vec![0u8; PAGE];
    for p in 0..64 {
        fill(&mut want, p, 5);
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
    }
    pager.check_invariants().unwrap();
}

/// Dirty victims apart from each other leave by moves before they are
/// stored (no write protection); when the store refuses them they are
/// copied back where they were, `Dirty`, contents intact, and nothing is
/// left stored for them.
#[test]
fn moved_out_victims_the_store_refuses_come_back_in_place() {
    let store = Arc::new(TestStore::default());
    let mut cfg = uzswap_region::PagerConfig::new(1024);
    cfg.readahead_max = 0;
    let pager = uzswap_region::Pager::new(store.clone(), cfg).unwrap();
    if !pager.evicts_by_move() {
        return skip("UFFDIO_MOVE (evictions by move)");
    }
    let r = pager.region(64 * PAGE).unwrap();
    let base = r.as_ptr();
    // Every fourth page written (dirty), each evicted alone: a span of
    // one victim.
    for p in (0..64).step_by(4) {
        fill(page_mut(base, p), p, 1);
    }
    let evict_each = || (0..64).step_by(4).map(|p| r.evict(p..p + 1)).sum::<usize>();
    store
        .refuse
        .store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(evict_each(), 0, "the store refused every page");
    let st = pager.stats();
    assert_eq!(st.evict_moved_back, 16, "{st:?}");
    assert_eq!(st.store_rejected, 16, "{st:?}");
    let mut want = vec![0u8; PAGE];
    for p in (0..64).step_by(4) {
        assert_eq!(r.page_state(p), Some(PageState::Dirty), "page {p}");
        fill(&mut want, p, 1);
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
    }
    assert_eq!(store.inner.len(), 0);
    // Accepted now: moved first, stored, and read back right.
    store
        .refuse
        .store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(evict_each(), 16);
    let st = pager.stats();
    assert_eq!(st.evict_moved_first, 16, "{st:?}");
    for p in (0..64).step_by(4) {
        assert_eq!(r.page_state(p), Some(PageState::Stored), "page {p}");
        fill(&mut want, p, 1);
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
    }
    pager.check_invariants().unwrap();
}
