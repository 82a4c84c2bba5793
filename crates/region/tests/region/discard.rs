//! The program discards region memory (MADV_DONTNEED, munmap) or moves it
//! (mremap): the store must drop or move what it held.

use crate::common::*;
use uzswap_region::{PageState, PagerConfig};

fn setup(
    pages: usize,
) -> (
    uzswap_region::Pager,
    std::sync::Arc<uzswap_region::MemStore>,
    uzswap_region::Region,
) {
    let (pager, store) = pager(32);
    let r = pager.region(pages * PAGE).unwrap();
    for p in 0..pages {
        fill(page_mut(r.as_ptr(), p), p, 1);
    }
    (pager, store, r)
}

#[test]
fn madvise_dontneed_on_evicted_pages_reads_zeros() {
    let (pager, store, r) = setup(64);
    let base = r.as_ptr();
    r.evict(0..64);
    // Mix states: some back clean, some dirty, some still stored.
    touch(base, 10);
    page_mut(base, 11)[5] = 1;
    assert_eq!(r.page_state(10), Some(PageState::Clean));
    assert_eq!(r.page_state(11), Some(PageState::Dirty));
    assert!(store.contains(r.area(), 12));
    // SAFETY: pages 8..16 of the live region; their contents may go.
    let rc = unsafe { libc::madvise(base.add(8 * PAGE).cast(), 8 * PAGE, libc::MADV_DONTNEED) };
    assert_eq!(rc, 0);
    for p in 8..16 {
        assert!(
            eventually(|| !store.contains(r.area(), p as u64)),
            "entry of page {p} dropped"
        );
        assert!(
            page_mut(base, p).iter().all(|b| *b == 0),
            "page {p} reads zeros"
        );
    }
    let mut want = vec![0u8; PAGE];
    for p in (0..8).chain(16..64) {
        fill(&mut want, p, 1);
        assert_eq!(page_mut(base, p), &want[..], "page {p} untouched");
    }
    assert!(pager.stats().discarded_pages >= 8);
    pager.check_invariants().unwrap();
}

#[test]
fn munmap_of_evicted_pages_drops_entries() {
    let (pager, store, r) = setup(64);
    let base = r.as_ptr();
    r.evict(0..64);
    assert_eq!(store.area_len(r.area()), 64);
    // SAFETY: pages 20..30 of the region are unmapped, then a fresh
    // anonymous mapping takes their place before anything reads them.
    unsafe {
        assert_eq!(libc::munmap(base.add(20 * PAGE).cast(), 10 * PAGE), 0);
        let p = libc::mmap(
            base.add(20 * PAGE).cast(),
            10 * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        );
        assert_eq!(p, base.add(20 * PAGE).cast());
    }
    assert!(eventually(|| store.area_len(r.area()) == 54));
    for p in 20..30 {
        assert!(page_mut(base, p).iter().all(|b| *b == 0));
    }
    let mut want = vec![0u8; PAGE];
    for p in (0..20).chain(30..64) {
        fill(&mut want, p, 1);
        assert_eq!(page_mut(base, p), &want[..]);
    }
    pager.check_invariants().unwrap();
    drop(r);
    // The hole we mapped is not the region's: unmap it ourselves.
    // SAFETY: our own mapping, no longer used.
    unsafe { libc::munmap(base.add(20 * PAGE).cast(), 10 * PAGE) };
    assert_eq!(store.len(), 0);
}

#[test]
fn mremap_moves_stored_pages_with_the_mapping() {
    let (pager, store, r) = setup(32);
    let base = r.as_ptr();
    r.evict(0..32);
    // Reserve a destination, then move the whole region there.
    // SAFETY: a fresh reservation; mremap moves our live region onto it,
    // and the old address is not used afterwards (the pager follows the
    // remap event, and the Region's drop unmaps where the pages now are).
    let to = unsafe {
        let dst = libc::mmap(
            std::ptr::null_mut(),
            32 * PAGE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(dst, libc::MAP_FAILED);
        let to = libc::mremap(
            base.cast(),
            32 * PAGE,
            32 * PAGE,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            dst,
        );
        assert_eq!(to, dst);
        to as *mut u8
    };
    let mut want = vec![0u8; PAGE];
    for p in 0..32 {
        fill(&mut want, p, 1);
        assert_eq!(page_mut(to, p), &want[..], "moved page {p}");
    }
    assert!(pager.stats().remaps >= 1);
    drop(r);
    assert_eq!(store.len(), 0);
}

#[test]
fn partial_mremap_splits_the_region() {
    let (pager, store, r) = setup(32);
    let base = r.as_ptr();
    r.evict(0..32);
    // SAFETY: pages 8..16 of the live region move onto a fresh
    // reservation; the test reads them only at their new address.
    let to = unsafe {
        let dst = libc::mmap(
            std::ptr::null_mut(),
            8 * PAGE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(dst, libc::MAP_FAILED);
        let to = libc::mremap(
            base.add(8 * PAGE).cast(),
            8 * PAGE,
            8 * PAGE,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            dst,
        );
        assert_eq!(to, dst);
        to as *mut u8
    };
    let mut want = vec![0u8; PAGE];
    for p in 0..8 {
        fill(&mut want, p + 8, 1);
        assert_eq!(page_mut(to, p), &want[..], "moved page {}", p + 8);
    }
    for p in (0..8).chain(16..32) {
        fill(&mut want, p, 1);
        assert_eq!(page_mut(base, p), &want[..], "page {p} in place");
    }
    pager.check_invariants().unwrap();
    // The hole left behind is unmapped; the Region's drop unmaps both parts.
    drop(r);
    assert_eq!(store.len(), 0);
}

/// The program discards pages the evictor is dropping at that moment and
/// writes them again at once, while other pages keep the evictor busy: the
/// evictor's own drop must never take the page the program wrote after its
/// discard (it would lose the write, and the pager would believe a page
/// mapped that is not), and a page taken by the program's discard under a
/// fault must read as zeros, not fault forever.
#[test]
fn rewrite_right_after_discard_survives_the_evictors_drop() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const BUDGET: usize = 16;
    const PAGES: usize = 512;
    const HOT: usize = 8;
    let (pager, _store) = pager(BUDGET);
    let r = pager.region(PAGES * PAGE).unwrap();
    let base = r.as_ptr() as usize;
    let stop = AtomicBool::new(false);
    let errors = AtomicU64::new(0);
    let rounds = AtomicU64::new(0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let _w = watchdog("rewrite_right_after_discard", 60);
    std::thread::scope(|sc| {
        // Pressure: every other page, round and round, so that the hot
        // pages are picked as victims all the time.
        sc.spawn(|| {
            let mut v = 1;
            while !stop.load(Ordering::Relaxed) {
                for p in HOT..PAGES {
                    page_mut(base as *mut u8, p)[0] = v;
                }
                v = v.wrapping_add(1);
            }
        });
        let errors = &errors;
        let rounds = &rounds;
        sc.spawn(move || {
            let mut want = vec![0u8; PAGE];
            let mut v = 1u32;
            while std::time::Instant::now() < deadline {
                for p in 0..HOT {
                    let page = page_mut(base as *mut u8, p);
                    // SAFETY: one page of the live region, ours to drop.
                    let rc = unsafe {
                        libc::madvise(page.as_mut_ptr().cast(), PAGE, libc::MADV_DONTNEED)
                    };
                    assert_eq!(rc, 0);
                    fill(&mut want, p, v);
                    page.copy_from_slice(&want);
                    std::thread::yield_now();
                    if page != &want[..] {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
                v += 1;
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        });
        // The pager's invariants hold at every moment it is not mid-step.
        let end = std::time::Instant::now() + std::time::Duration::from_millis(3200);
        while std::time::Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_millis(20));
            pager.check_invariants().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    let st = pager.stats();
    assert!(
        rounds.load(Ordering::Relaxed) > 20 && st.evictions > 1000,
        "{st:?}"
    );
    assert_eq!(errors.load(Ordering::Relaxed), 0, "{st:?}");
    pager.check_invariants().unwrap();
}

/// The program unmaps the end of a region, maps something of its own in
/// the hole at once, and drops the region: the drop must unmap only what
/// is still the region's. (`munmap` returns once the handler has read the
/// unmap event, possibly before it has handled it; a drop that read the
/// region's ranges in between would unmap the program's new mapping.)
#[test]
fn dropping_a_region_right_after_munmap_leaves_the_hole_alone() {
    let (pager, _store) = pager(64);
    let mut taken = 0;
    for round in 0..1000 {
        let r = pager.region(16 * PAGE).unwrap();
        let base = r.as_ptr();
        for p in 0..16 {
            fill(page_mut(base, p), p, 1);
        }
        let hole = base.wrapping_add(12 * PAGE);
        // SAFETY: the last 4 pages of the region are unmapped, then a
        // mapping of ours takes their place; nothing else uses them.
        unsafe {
            assert_eq!(libc::munmap(hole.cast(), 4 * PAGE), 0);
            let p = libc::mmap(
                hole.cast(),
                4 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            );
            if p == libc::MAP_FAILED {
                // Another test's mapping took the hole first.
                taken += 1;
                drop(r);
                continue;
            }
            assert_eq!(p, hole.cast());
        }
        drop(r);
        let mut vec = [0u8; 4];
        // SAFETY: mincore only reports on the range; ENOMEM if unmapped.
        let rc = unsafe { libc::mincore(hole.cast(), 4 * PAGE, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "round {round}: the program's mapping was unmapped");
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(hole.cast(), 4 * PAGE) };
    }
    assert!(taken < 500, "the hole was taken {taken} times in 1000");
    pager.check_invariants().unwrap();
}

/// A first touch's wide zero run raced with the program's discard of the
/// pages after it, from two threads at once each round. The handler may
/// read the fault and the remove event in one batch while the discard's
/// zap is under way: no page may end up mapped while the pager holds it
/// not resident (the program's writes would meet no fault, and an eviction
/// span with the page in a gap would drop them, as it did to node's heap),
/// and the pages written after the discard returned keep what was written
/// through an eviction of everything.
#[test]
fn a_discard_racing_a_wide_zero_run_loses_no_write() {
    discard_racing_zero_runs(|cfg| cfg);
}

/// A pager that maps the runs in-thread (its SIGBUS handler), while the
/// remove events go through its handler thread.
pub fn discard_racing_zero_runs(with: impl FnOnce(PagerConfig) -> PagerConfig) {
    const CHUNK: usize = 256;
    const ROUNDS: usize = 2000;
    const WRITTEN: std::ops::Range<usize> = 8..16;
    let _w = watchdog("a discard racing zero runs", 300);
    let mut cfg = PagerConfig::new(2 * CHUNK * ROUNDS);
    cfg.zero_readahead_wide = CHUNK;
    let (pager, _store) = pager_with(with(cfg));
    let r = pager.region(CHUNK * ROUNDS * PAGE).unwrap();
    let base = r.as_ptr() as usize;
    let go = std::sync::Barrier::new(2);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            for c in 0..ROUNDS {
                go.wait();
                let at = base + (c * CHUNK + WRITTEN.start) * PAGE;
                let len = (CHUNK - WRITTEN.start) * PAGE;
                // SAFETY: pages of the live region that no thread uses
                // until the round's second barrier.
                let rc = unsafe { libc::madvise(at as *mut _, len, libc::MADV_DONTNEED) };
                assert_eq!(rc, 0);
                go.wait();
            }
        });
        for c in 0..ROUNDS {
            go.wait();
            page_mut(base as *mut u8, c * CHUNK)[0] = 1;
            go.wait();
        }
    });
    pager.check_invariants().unwrap();
    let written = || (0..ROUNDS).flat_map(|c| WRITTEN.map(move |i| c * CHUNK + i));
    for p in written() {
        fill(page_mut(base as *mut u8, p), p, 5);
    }
    r.evict(0..CHUNK * ROUNDS);
    let mut want = vec![0u8; PAGE];
    for p in written() {
        fill(&mut want, p, 5);
        assert_eq!(page_mut(base as *mut u8, p), &want[..], "page {p}");
    }
    pager.check_invariants().unwrap();
}
