//! The staging area victims are moved into (`sys::Staging`): what a move
//! reports for a mapped page, for one no longer there, and that clearing
//! empties the slots for the next batch.

use crate::common::skip;
use uzswap_region::sys::{self, Staging, Taken};
use uzswap_region::PAGE_SIZE;

#[test]
fn a_page_moves_out_once_and_its_slot_empties_on_clear() {
    let Some(st) = Staging::new(4) else {
        return skip("UFFDIO_MOVE (the staging area)");
    };
    assert_eq!(st.pages(), 4);
    let src = sys::map_anon(2 * PAGE_SIZE).expect("map");
    // SAFETY: our own fresh mapping of two pages.
    let mem = unsafe { std::slice::from_raw_parts_mut(src as *mut u8, 2 * PAGE_SIZE) };
    mem[..PAGE_SIZE].fill(0x5a);
    mem[PAGE_SIZE..].fill(0xa5);
    assert_eq!(st.take(0, src), Taken::Moved);
    // The page left: the source reads as a fresh zero page, the other
    // page stayed.
    assert_eq!(sys::mincore_count(src, PAGE_SIZE).unwrap(), 0);
    assert!(mem[..PAGE_SIZE].iter().all(|&b| b == 0));
    assert!(mem[PAGE_SIZE..].iter().all(|&b| b == 0xa5));
    // Reading it mapped the zero page: drop that, and nothing is there.
    // SAFETY: our own mapping; its contents are not needed.
    unsafe { sys::dontneed(src, PAGE_SIZE) }.unwrap();
    assert_eq!(st.take(1, src), Taken::Gone);
    assert_eq!(st.take(1, src + PAGE_SIZE), Taken::Moved);
    st.clear(2);
    // Both slots are empty again: moves into them succeed.
    mem[..PAGE_SIZE].fill(0x11);
    assert_eq!(st.take(0, src), Taken::Moved);
    assert_eq!(st.take(1, src), Taken::Gone);
    st.clear(1);
    // SAFETY: our own mapping, no longer used.
    unsafe { sys::unmap(src, 2 * PAGE_SIZE) };
}

/// A move into a slot past the area is refused before any system call:
/// the call panics with a message that names the slot and the area.
#[test]
fn a_slot_past_the_area_is_refused() {
    let Some(st) = Staging::new(2) else {
        return skip("UFFDIO_MOVE (the staging area)");
    };
    let refused = std::panic::catch_unwind(|| st.take(2, 0)).expect_err("slot 2 of 2 is taken");
    let msg = refused
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| refused.downcast_ref::<&str>().copied())
        .unwrap_or_default();
    assert_eq!(msg, "slot 2 is past the staging area of 2 pages");
}
