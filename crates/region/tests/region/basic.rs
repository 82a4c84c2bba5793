use crate::common::*;
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
