//! In-thread faults (`PagerConfig::in_thread_faults`): faults resolved in a
//! SIGBUS handler on the faulting thread. One such pager per process: the
//! tests here take `ONE` in turn.

use crate::common::*;
use crate::stress::{
    hammer, mincore_within_budget, over_the_cache_with_dedup, over_the_compressed_cache, BUDGET,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use uzswap_os::lock::Mutex;
use uzswap_region::{PageState, Pager, PagerConfig, PagerError, PinError};

/// Held by each test with an in-thread pager.
static ONE: Mutex<()> = Mutex::new(());

fn in_thread(budget: usize) -> PagerConfig {
    let mut cfg = PagerConfig::new(budget);
    cfg.in_thread_faults = true;
    cfg
}

/// `discard.rs`'s race of a first touch's zero run with the program's
/// discard of the pages after it, with the runs mapped in-thread (63
/// pages at most) and the remove events read by the handler thread.
#[test]
fn a_discard_racing_in_thread_zero_runs_loses_no_write() {
    let _one = ONE.lock();
    crate::discard::discard_racing_zero_runs(|mut cfg| {
        cfg.in_thread_faults = true;
        cfg
    });
}

/// The stress test of `stress.rs` (four threads, a region 8x the budget,
/// a shadow version of every page, eviction all the time) with faults
/// resolved in-thread.
#[test]
fn threads_on_a_region_with_in_thread_faults() {
    let _one = ONE.lock();
    let (pager, store) = pager_with(in_thread(BUDGET));
    hammer(&pager);
    let st = pager.stats();
    assert!(st.faults_pool > 0, "{st:?}");
    drop(pager);
    assert_eq!(store.len(), 0);
}

/// The same with victims dropped by `MADV_DONTNEED` only (remove events
/// through the handler thread while faults are resolved in-thread).
#[test]
fn threads_on_a_region_with_in_thread_faults_without_moves() {
    let _one = ONE.lock();
    let mut cfg = in_thread(BUDGET);
    cfg.evict_by_move = false;
    let (pager, _store) = pager_with(cfg);
    hammer(&pager);
}

/// The stress test over the real cache (pool, writeback to the encrypted
/// backing file, loads from it) with faults resolved in-thread: the
/// cache's load runs in the SIGBUS handler.
#[test]
fn threads_on_a_region_over_the_compressed_cache_in_thread() {
    let _one = ONE.lock();
    over_the_compressed_cache(in_thread(BUDGET));
}

/// The same with dedup on (shared pool objects).
#[test]
fn threads_on_a_region_over_the_cache_with_dedup_in_thread() {
    let _one = ONE.lock();
    over_the_cache_with_dedup(in_thread(BUDGET));
}

/// `mincore` sampled without a pause never sees more than the budget with
/// faults resolved in-thread (a count taken outside the state lock would
/// let it see 129 for 128).
#[test]
fn mincore_never_sees_more_than_the_budget_in_thread() {
    let _one = ONE.lock();
    mincore_within_budget(in_thread(BUDGET));
}

/// `write(2)` from and `read(2)` into evicted region memory fail with
/// EFAULT in this mode (the kernel cannot raise SIGBUS for its own
/// access); after `pin` they work, and the bytes are right.
#[test]
fn a_syscall_on_evicted_memory_fails_until_pinned() {
    let _one = ONE.lock();
    let (pager, _store) = pager_with(in_thread(32));
    let pages = 8;
    let r = pager.region(pages * PAGE).unwrap();
    let base = r.as_ptr();
    for p in 0..pages {
        fill(page_mut(base, p), p, 1);
    }
    assert_eq!(r.evict(0..pages), pages);
    let (rd, wr) = pipe();
    // SAFETY: base is a live region mapping of `pages` pages.
    let n = unsafe { libc::write(wr, base.cast(), PAGE) };
    assert_eq!(n, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EFAULT)
    );
    {
        let _pin = r.pin(0..2 * PAGE).unwrap();
        assert_eq!(r.page_state(0), Some(PageState::Dirty));
        // SAFETY: as above; pinned.
        let n = unsafe { libc::write(wr, base.cast(), 2 * PAGE) };
        assert_eq!(n, 2 * PAGE as isize);
        let mut got = vec![0u8; 2 * PAGE];
        // SAFETY: `got` is writable memory of that length.
        let n = unsafe { libc::read(rd, got.as_mut_ptr().cast(), 2 * PAGE) };
        assert_eq!(n, 2 * PAGE as isize);
        let mut want = vec![0u8; PAGE];
        for p in 0..2 {
            fill(&mut want, p, 1);
            assert_eq!(&got[p * PAGE..(p + 1) * PAGE], &want[..], "page {p}");
        }
        // Pinned pages stay: the evictor leaves them.
        assert_eq!(r.evict(0..2), 0);
    }
    // read(2) into evicted memory: EFAULT, then pinned: the bytes land.
    let mut src = vec![0u8; PAGE];
    fill(&mut src, 5, 9);
    // SAFETY: `src` is readable memory of a page.
    let n = unsafe { libc::write(wr, src.as_ptr().cast(), PAGE) };
    assert_eq!(n, PAGE as isize);
    let dst = 5 * PAGE;
    // SAFETY: page 5 of the live region.
    let n = unsafe { libc::read(rd, base.add(dst).cast(), PAGE) };
    assert_eq!(n, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EFAULT)
    );
    {
        let _pin = r.pin(dst..dst + PAGE).unwrap();
        // SAFETY: as above; pinned.
        let n = unsafe { libc::read(rd, base.add(dst).cast(), PAGE) };
        assert_eq!(n, PAGE as isize);
    }
    assert_eq!(page_mut(base, 5), &src[..]);
    // Unpinned pages are victims again (with what readahead brought).
    assert!(r.evict(0..pages) >= 3, "pages 0, 1 and 5 were resident");
    assert!((0..pages).all(|p| r.page_state(p) == Some(PageState::Stored)));
    assert!(matches!(
        r.pin(0..pages * PAGE + 1),
        Err(PinError::OutOfRange { .. })
    ));
    let big = pager.region(20 * PAGE).unwrap();
    assert!(matches!(
        big.pin(0..20 * PAGE),
        Err(PinError::TooLarge { .. })
    ));
    pager.check_invariants().unwrap();
    // SAFETY: closing our own pipe.
    unsafe {
        libc::close(rd);
        libc::close(wr);
    }
}

/// Two threads fault on one stored page at once, over and over: both see
/// its bytes, one loads it and the other waits (or finds it mapped).
#[test]
fn two_threads_fault_one_page() {
    let _one = ONE.lock();
    let (pager, _store) = pager_with(in_thread(32));
    let r = pager.region(4 * PAGE).unwrap();
    let base = r.as_ptr() as usize;
    let mut want = vec![0u8; PAGE];
    for round in 0..500u32 {
        fill(page_mut(base as *mut u8, 1), 1, round + 1);
        fill(&mut want, 1, round + 1);
        assert_eq!(r.evict(1..2), 1);
        let go = Barrier::new(2);
        std::thread::scope(|sc| {
            for _ in 0..2 {
                let (go, want) = (&go, &want);
                sc.spawn(move || {
                    go.wait();
                    assert_eq!(page_mut(base as *mut u8, 1), &want[..], "round {round}");
                });
            }
        });
    }
    pager.check_invariants().unwrap();
}

/// A second thread faults on a page whose load is held in the store: it
/// waits (parked on the settle sequence) until the load maps the page.
#[test]
fn a_fault_on_a_page_being_loaded_waits_for_the_load() {
    let _one = ONE.lock();
    let store = Arc::new(TestStore {
        hold_load: Some(3),
        ..TestStore::default()
    });
    let pager = Pager::new(store.clone(), in_thread(32)).unwrap();
    let r = pager.region(8 * PAGE).unwrap();
    let base = r.as_ptr() as usize;
    for p in 0..8 {
        fill(page_mut(base as *mut u8, p), p, 1);
    }
    assert_eq!(r.evict(3..4), 1);
    let first = std::thread::spawn(move || page_mut(base as *mut u8, 3).to_vec());
    assert!(eventually(|| store.held.load(Ordering::SeqCst)));
    assert_eq!(r.page_state(3), Some(PageState::Loading));
    let second = std::thread::spawn(move || page_mut(base as *mut u8, 3).to_vec());
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(!second.is_finished(), "the second fault waits for the load");
    store.release.store(true, Ordering::SeqCst);
    let mut want = vec![0u8; PAGE];
    fill(&mut want, 3, 1);
    assert_eq!(first.join().unwrap(), want);
    assert_eq!(second.join().unwrap(), want);
    pager.check_invariants().unwrap();
}

/// Writes and reads of a page the evictor keeps taking: a write to a page
/// mid-eviction aborts it or waits for it, a read of one being dropped
/// waits for the drop and loads the page; no version is ever lost.
///
/// A write fault on the page (loaded `Clean`, protected) that cleared its
/// protection after releasing the state lock would let an eviction that
/// had claimed, protected, read and stored the page meanwhile drop it with
/// the old copy: page 0 would read back version 20 after version 24 had
/// been written (under AddressSanitizer, `.ci/sanitize`, about 1 run in
/// 40). `unprotect_against_eviction_*` makes that interleaving.
#[test]
fn faults_on_a_page_under_eviction() {
    let _one = ONE.lock();
    page_under_eviction(in_thread(32));
}

/// The same with faults served by the handler thread (the default mode).
#[test]
fn faults_on_a_page_under_eviction_by_the_handler_thread() {
    page_under_eviction(PagerConfig::new(32));
}

fn page_under_eviction(cfg: PagerConfig) {
    let (pager, _store) = pager_with(cfg);
    let r = pager.region(16 * PAGE).unwrap();
    let base = r.as_ptr() as usize;
    let stop = AtomicBool::new(false);
    let _w = watchdog("faults_on_a_page_under_eviction", 180);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                r.evict(0..16);
            }
        });
        // A failed check below stops the evicting thread too (the scope
        // would wait for it for ever).
        let _stop = StopOnDrop(&stop);
        let mut want = vec![0u8; PAGE];
        // Until enough evictions met faults (slow on a loaded machine),
        // for a minute at most.
        let end = std::time::Instant::now() + std::time::Duration::from_secs(60);
        for v in 1.. {
            if v % 64 == 0 {
                let st = pager.stats();
                let enough = st.evictions >= 500 && st.faults_parked >= 5;
                if enough || std::time::Instant::now() > end {
                    break;
                }
            }
            let p = (v % 4) as usize;
            if v > 4 {
                fill(&mut want, p, v - 4);
                assert_eq!(
                    page_mut(base as *mut u8, p),
                    &want[..],
                    "page {p} version {}",
                    v - 4
                );
            }
            fill(page_mut(base as *mut u8, p), p, v);
        }
        stop.store(true, Ordering::Relaxed);
    });
    let st = pager.stats();
    eprintln!("{}", serde_json::to_string_pretty(&st).unwrap());
    assert!(st.evictions >= 500, "{st:?}");
    assert!(
        st.faults_parked >= 5,
        "faults met pages under eviction: {st:?}"
    );
    pager.check_invariants().unwrap();
}

/// What the mode refuses: a second in-thread pager in the process, and
/// CPU handlers with it.
#[test]
fn one_in_thread_pager_per_process() {
    let _one = ONE.lock();
    let (first, _s) = pager_with(in_thread(32));
    let second = Pager::new(Arc::new(uzswap_region::MemStore::new()), in_thread(32));
    assert!(
        matches!(second, Err(PagerError::InThreadTaken)),
        "{:?}",
        second.err()
    );
    drop(first);
    let mut cfg = in_thread(32);
    cfg.cpu_handlers = true;
    assert!(matches!(
        Pager::new(Arc::new(uzswap_region::MemStore::new()), cfg),
        Err(PagerError::Config(_))
    ));
    // The first gone, another may take its place.
    let (_again, _s) = pager_with(in_thread(32));
}

fn pipe() -> (i32, i32) {
    let mut fds = [0; 2];
    // SAFETY: pipe fills two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    (fds[0], fds[1])
}

/// The steps of `unprotect_against_eviction` (one such test runs at a
/// time: both take `ONE`).
mod race {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    /// The next write fault's unprotect lets the eviction run first.
    pub static ARMED: AtomicBool = AtomicBool::new(false);
    /// The eviction may start.
    pub static GO: AtomicBool = AtomicBool::new(false);
    /// The eviction is in its store (the page protected and read).
    pub static STORING: AtomicBool = AtomicBool::new(false);
    /// The program's write is done.
    pub static WRITTEN: AtomicBool = AtomicBool::new(false);

    pub fn reset() {
        for f in [&ARMED, &GO, &STORING, &WRITTEN] {
            f.store(false, Ordering::SeqCst);
        }
    }

    /// Waits (yielding) until `flag` is set, at most `ms`; whether it was.
    /// Async-signal-safe (atomics, clock_gettime, sched_yield).
    pub fn wait_for(flag: &AtomicBool, ms: u64) -> bool {
        let end = Instant::now() + Duration::from_millis(ms);
        while !flag.load(Ordering::SeqCst) {
            if Instant::now() > end {
                return false;
            }
            std::thread::yield_now();
        }
        true
    }

    /// `PagerConfig::test_before_unprotect`: once armed, starts the
    /// eviction and gives it until it is storing the page (it cannot get
    /// there while the fault holds the page).
    pub fn before_unprotect() {
        if ARMED.swap(false, Ordering::SeqCst) {
            GO.store(true, Ordering::SeqCst);
            wait_for(&STORING, 200);
        }
    }

    /// `TestStore::before_store`: the first store after `GO` waits for
    /// the write (at most a second): the eviction holds its copy while
    /// the write happens.
    pub fn hold() {
        if GO.load(Ordering::SeqCst) && !STORING.swap(true, Ordering::SeqCst) {
            wait_for(&WRITTEN, 1000);
        }
    }
}

/// A write to a clean page (loaded write-protected, its copy kept) while
/// the evictor takes it: the write fault makes the page `Dirty` and
/// clears its protection, and the eviction must either see the page
/// `Dirty` only once it is writable (and then protect it again, so that
/// the write is read or faults and aborts), or the fault must see it
/// `Evicting`. Here the eviction is let run between the fault's decision
/// and its unprotect: it claims the page, protects it, reads it and
/// stores it; an unprotect that lands then lets the write in unseen, and
/// the page is dropped with its old copy (the write lost, as
/// `faults_on_a_page_under_eviction` saw 1 run in 40 under ASan).
fn unprotect_against_eviction(mut cfg: PagerConfig) {
    // The write-protect path (a page moved out first cannot be written
    // late: the write faults as missing and waits).
    cfg.evict_by_move = false;
    cfg.test_before_unprotect = Some(race::before_unprotect);
    race::reset();
    let store = Arc::new(TestStore {
        before_store: Some(race::hold),
        ..TestStore::default()
    });
    let pager = Pager::new(store, cfg).expect("userfaultfd available (tests run as root)");
    let _w = watchdog("unprotect_against_eviction", 60);
    let r = pager.region(PAGE).unwrap();
    let base = r.as_ptr();
    let mut want = vec![0u8; PAGE];
    fill(page_mut(base, 0), 0, 1);
    assert_eq!(r.evict(0..1), 1);
    fill(&mut want, 0, 1);
    assert_eq!(page_mut(base, 0), &want[..]);
    assert_eq!(r.page_state(0), Some(PageState::Clean));
    race::ARMED.store(true, Ordering::SeqCst);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            assert!(race::wait_for(&race::GO, 10_000), "no write fault");
            r.evict(0..1);
        });
        fill(page_mut(base, 0), 0, 2);
        race::WRITTEN.store(true, Ordering::SeqCst);
    });
    assert!(race::GO.load(Ordering::SeqCst), "the hook ran");
    fill(&mut want, 0, 2);
    assert!(
        page_mut(base, 0) == &want[..],
        "the write of version 2 is lost: {:?}",
        pager.stats()
    );
    pager.check_invariants().unwrap();
    drop(r);
    drop(pager);
    race::reset();
}

#[test]
fn unprotect_against_eviction_in_thread() {
    let _one = ONE.lock();
    unprotect_against_eviction(in_thread(32));
}

#[test]
fn unprotect_against_eviction_by_the_handler_thread() {
    let _one = ONE.lock();
    unprotect_against_eviction(PagerConfig::new(32));
}
