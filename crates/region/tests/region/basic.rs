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
