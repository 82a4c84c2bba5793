//! A failed load must not hand made-up bytes to the program: the page gets
//! a poison marker, so a user access raises SIGBUS and a kernel access
//! (here write(2) from the page) fails with EFAULT.

use crate::common::*;
use std::sync::Arc;
use uzswap_region::{
    LoadError, LoadMode, Loaded, MemStore, PageStore, Pager, PagerConfig, StoreError, StoreStats,
    Stored,
};

struct Failing {
    inner: MemStore,
    fail_page: u64,
}

impl PageStore for Failing {
    fn open_area(&self, area: u32) {
        self.inner.open_area(area)
    }
    fn store(&self, area: u32, offset: u64, page: &[u8]) -> Result<Stored, StoreError> {
        self.inner.store(area, offset, page)
    }
    fn load(
        &self,
        area: u32,
        offset: u64,
        page: &mut [u8],
        mode: LoadMode,
    ) -> Result<Loaded, LoadError> {
        if offset == self.fail_page {
            return Err(LoadError::Corrupt);
        }
        self.inner.load(area, offset, page, mode)
    }
    fn invalidate(&self, area: u32, offset: u64) {
        self.inner.invalidate(area, offset)
    }
    fn invalidate_area(&self, area: u32) {
        self.inner.invalidate_area(area)
    }
    fn stats(&self) -> StoreStats {
        self.inner.stats()
    }
}

#[test]
fn failed_load_poisons_the_page() {
    let store = Arc::new(Failing {
        inner: MemStore::new(),
        fail_page: 3,
    });
    let pager = Pager::new(store, PagerConfig::new(16)).unwrap();
    if pager.features() & uzswap_region::sys::feature::POISON == 0 {
        eprintln!("kernel without UFFDIO_POISON: skipped");
        return;
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
