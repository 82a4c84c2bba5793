//! A failed load must not hand made-up bytes to the program: the page gets
//! a poison marker, so a user access raises SIGBUS and a kernel access
//! (here write(2) from the page) fails with EFAULT.

use crate::common::*;
use std::sync::Arc;
use uzswap_region::{Pager, PagerConfig};

#[test]
fn failed_load_poisons_the_page() {
    let store = Arc::new(TestStore {
        fail_load: Some(3),
        ..TestStore::default()
    });
    let pager = Pager::new(store, PagerConfig::new(16)).unwrap();
    if pager.features() & uzswap_region::sys::feature::POISON == 0 {
        return skip("UFFDIO_POISON");
    }
    let r = pager.region(8 * PAGE).unwrap();
    let base = r.as_ptr();
    for p in 0..8 {
        fill(page_mut(base, p), p, 1);
    }
    r.evict(0..8);
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: page 3 of the live region; the kernel reports the poisoned
    // page as EFAULT instead of reading it.
    let n = unsafe { libc::write(fds[1], base.add(3 * PAGE).cast(), PAGE) };
    let err = std::io::Error::last_os_error().raw_os_error();
    assert_eq!((n, err), (-1, Some(libc::EFAULT)));
    assert_eq!(pager.stats().load_errors, 1);
    // Its neighbours are fine.
    let mut want = vec![0u8; PAGE];
    fill(&mut want, 4, 1);
    assert_eq!(page_mut(base, 4), &want[..]);
    // SAFETY: closing our own descriptors.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}
