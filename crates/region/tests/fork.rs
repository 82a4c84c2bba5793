//! fork() with evicted pages: the child must see the parent's bytes, never
//! zeros or stale data. In its own test binary because the fork hook
//! brings back the pages of every pager in the process.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use uzswap_region::{MemStore, PageState, Pager, PagerConfig, PAGE_SIZE};

fn fill(buf: &mut [u8], p: usize, v: u8) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (p as u8).wrapping_mul(31) ^ v ^ (i as u8);
    }
}

#[test]
fn child_sees_evicted_pages() {
    let store = Arc::new(MemStore::new());
    let pager = Pager::new(store, PagerConfig::new(32)).unwrap();
    let pages = 256;
    let r = pager.region(pages * PAGE_SIZE).unwrap();
    let base = r.as_ptr() as usize;
    let page = |p: usize| {
        // SAFETY: page p of the live region; the threads below use
        // disjoint pages.
        unsafe { std::slice::from_raw_parts_mut((base + p * PAGE_SIZE) as *mut u8, PAGE_SIZE) }
    };
    for p in 0..pages - 16 {
        fill(page(p), p, 1);
    }
    r.evict(0..pages);
    assert_eq!(r.page_state(5), Some(PageState::Stored));
    // A parent thread keeps writing its own pages through the fork.
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let mut v = 0u8;
            while !stop.load(Ordering::Relaxed) {
                for p in pages - 16..pages {
                    page(p)[100] = v;
                }
                v = v.wrapping_add(1);
            }
        });
        // SAFETY: the child only reads memory and calls _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut want = vec![0u8; PAGE_SIZE];
            let mut bad = 0;
            for p in 0..pages - 16 {
                fill(&mut want, p, 1);
                if page(p) != &want[..] {
                    bad += 1;
                }
            }
            // SAFETY: leaving the child without running the parent's
            // destructors or test harness.
            unsafe { libc::_exit(if bad == 0 { 0 } else { 1 + bad.min(100) }) };
        }
        // The parent changes pages after the fork: the child must not see it.
        for p in 0..8 {
            fill(page(p), p, 2);
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "child died: {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "child saw wrong pages");
        stop.store(true, Ordering::Relaxed);
    });
    let st = pager.stats();
    assert!(st.fork_prefaults >= 1);
    assert!(st.fork_prefault_pages >= (pages - 16 - 32) as u64, "{st:?}");
    // The parent's memory is intact and back under budget.
    let mut want = vec![0u8; PAGE_SIZE];
    for p in 0..pages - 16 {
        fill(&mut want, p, if p < 8 { 2 } else { 1 });
        assert_eq!(page(p), &want[..], "parent page {p}");
    }
    let mut ok = false;
    for _ in 0..200 {
        if pager.stats().resident_pages <= 32 {
            ok = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(ok, "evictor catches up after the fork");
    pager.check_invariants().unwrap();
}

/// The control: without the fork hook the child reads zeros where the
/// parent's pages were evicted (its copy of the region has no handler).
#[test]
fn without_prefault_the_child_would_see_zeros() {
    let store = Arc::new(MemStore::new());
    let mut cfg = PagerConfig::new(32);
    cfg.fork_prefault = false;
    let pager = Pager::new(store, cfg).unwrap();
    let r = pager.region(64 * PAGE_SIZE).unwrap();
    let base = r.as_ptr();
    for p in 0..64 {
        // SAFETY: page p of the live region.
        unsafe { std::ptr::write_bytes(base.add(p * PAGE_SIZE), 7, PAGE_SIZE) };
    }
    r.evict(0..64);
    // SAFETY: the child only reads memory and calls _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: page 3 of the region, plain memory in the child.
        let b = unsafe { std::ptr::read_volatile(base.add(3 * PAGE_SIZE)) };
        // SAFETY: leaving the child at once.
        unsafe { libc::_exit(b as i32) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert_eq!(libc::WEXITSTATUS(status), 0, "the child read zeros");
}
