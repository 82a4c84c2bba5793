//! Pages that map the shared zero page hold no memory: the budget does not
//! count them until they are written.

use crate::common::*;

/// Reading sixteen times the budget of untouched memory maps the zero
/// page and evicts nothing; writing it takes memory: within a period of
/// the evictor's looks the pages are counted again and evicted, and every
/// page keeps what was written. Many threads read and write at once, each
/// its own pages, each checking them.
#[test]
fn pages_mapped_as_zeros_are_not_charged_until_written() {
    if uzswap_region::sys::ZeroScan::new().is_none() {
        return skip("PAGEMAP_SCAN (Linux 6.7 and later)");
    }
    let _w = watchdog("zeros", 120);
    let mut cfg = uzswap_region::PagerConfig::new(64);
    cfg.uncharged_zero_pages = true;
    let (pager, _store) = pager_with(cfg);
    let r = pager.region(1024 * PAGE).unwrap();
    let base = r.as_ptr() as usize;
    let threads = 4;
    let per = 1024 / threads;
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                for p in t * per..(t + 1) * per {
                    assert_eq!(touch(base as *mut u8, p), 0, "page {p}");
                }
            });
        }
    });
    // Charged, they would all have been evicted but 64. A fault that maps
    // a run between the evictor's last look and its count can still cost
    // a batch of them.
    let st = pager.stats();
    assert!(
        st.evictions <= 64,
        "pages mapped as zeros were evicted: {st:?}"
    );
    assert!(
        st.resident_pages > 64,
        "the zero pages are resident to the pager: {st:?}"
    );
    assert!(
        eventually(|| pager.stats().zero_mapped_pages > 64),
        "the evictor did not find the zero pages: {:?}",
        pager.stats()
    );
    assert!(pager.usage().resident_pages <= 64, "{:?}", pager.usage());
    // Written without a fault of the pager's (the kernel copies the zero
    // page): the evictor's next full look counts them again.
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                for p in t * per..(t + 1) * per {
                    fill(page_mut(base as *mut u8, p), p, 5);
                }
            });
        }
    });
    assert!(
        eventually(|| pager.stats().evictions >= 1024 - 64),
        "written pages were not evicted: {:?}",
        pager.stats()
    );
    assert!(pager.usage().resident_pages <= 64, "{:?}", pager.usage());
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut want = vec![0u8; PAGE];
                for p in t * per..(t + 1) * per {
                    fill(&mut want, p, 5);
                    assert_eq!(page_mut(base as *mut u8, p), &want[..], "page {p}");
                }
            });
        }
    });
    pager.check_invariants().unwrap();
}
