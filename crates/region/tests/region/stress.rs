//! Many threads read and write random pages of a region 8x larger than the
//! budget, each page checked against a shadow version, while eviction runs
//! all the time. Not a benchmark.

use crate::common::*;
use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use uzswap_os::lock::Mutex;

pub const BUDGET: usize = 128;

#[test]
fn threads_on_a_region_eight_times_the_budget() {
    let (pager, store) = pager(BUDGET);
    hammer(&pager);
    // Where the kernel has UFFDIO_MOVE, victims of short spans leave by a
    // move to the staging area (the test below takes the path without).
    let st = pager.stats();
    if pager.evicts_by_move() {
        assert!(st.evict_moved_pages > 0, "{st:?}");
        assert!(st.evict_moved_first > 0, "{st:?}");
    }
    assert_eq!(store.len(), 0);
}

/// The same with victims dropped by `MADV_DONTNEED` only (no moves to the
/// staging area): the path kernels without `UFFDIO_MOVE` take, and the one
/// long spans take everywhere.
#[test]
fn threads_on_a_region_dropping_pages_without_moves() {
    let mut cfg = uzswap_region::PagerConfig::new(BUDGET);
    cfg.evict_by_move = false;
    let (pager, store) = pager_with(cfg);
    hammer(&pager);
    assert_eq!(pager.stats().evict_moved_pages, 0);
    assert!(pager.stats().discard_calls > 0);
    assert_eq!(store.len(), 0);
}

/// The same with the region cut into chunks of 16 pages for the access
/// signal (`PagerConfig::access_chunk`): faults, readahead runs, discards
/// and moves cross chunk edges all the time, and victims come from the
/// cold queue as well as the lists.
#[test]
fn threads_on_a_region_cut_into_chunks() {
    let mut cfg = uzswap_region::PagerConfig::new(BUDGET);
    cfg.access_chunk = 16 * PAGE;
    let (pager, store) = pager_with(cfg);
    hammer(&pager);
    let st = pager.stats();
    assert_eq!(st.access_signal, "chunks", "{st:?}");
    assert!(st.access_chunks >= 64, "{st:?}");
    assert!(st.access_samples > 0, "{st:?}");
    assert_eq!(store.len(), 0);
}

/// The same with exclusive loads (`keep_clean: false`): a page brought back
/// leaves the store at once, so every eviction stores it anew.
#[test]
fn threads_on_a_region_with_exclusive_loads() {
    let mut cfg = uzswap_region::PagerConfig::new(BUDGET);
    cfg.keep_clean = false;
    let (pager, store) = pager_with(cfg);
    hammer(&pager);
    let st = pager.stats();
    assert_eq!(st.clean_drops, 0, "no page is clean without a kept copy");
    assert_eq!(st.faults_wp, 0, "pages come back writable");
    assert!(st.faults_pool > 0);
    assert_eq!(store.len(), 0);
}

/// The same with a fault handler on each CPU (`cpu_handlers`): faults are
/// read and resolved by several threads, handed between them, and events
/// handled by whichever reads them.
#[test]
fn threads_on_a_region_with_cpu_handlers() {
    let mut cfg = uzswap_region::PagerConfig::new(BUDGET);
    cfg.cpu_handlers = true;
    let (pager, store) = pager_with(cfg);
    hammer(&pager);
    let st = pager.stats();
    assert!(st.cpu_handlers >= 1, "{st:?}");
    assert!(st.faults_local + st.faults_remote > 0, "{st:?}");
    assert_eq!(store.len(), 0);
}

/// The same over the real compressed cache, with a pool of a quarter of the
/// evicted pages, so that writeback to the (encrypted) backing file and
/// loads from it happen all the time.
#[test]
fn threads_on_a_region_over_the_compressed_cache() {
    over_the_compressed_cache(uzswap_region::PagerConfig::new(BUDGET));
}

/// The body of the test above, for a pager made with `cfg`.
pub fn over_the_compressed_cache(cfg: uzswap_region::PagerConfig) {
    let cache = std::sync::Arc::new(
        uzswap_cache::Cache::new(uzswap_cache::CacheConfig {
            pool_limit: uzswap_cache::PoolLimit::Bytes((BUDGET * PAGE) as u64),
            backing: uzswap_cache::Backing::File(std::env::temp_dir()),
            writeback_batch: 32,
            ..uzswap_cache::CacheConfig::default()
        })
        .unwrap(),
    );
    let pager = uzswap_region::Pager::new(cache.clone(), cfg).unwrap();
    hammer(&pager);
    let st = cache.stats();
    eprintln!("{st:?}");
    assert!(st.loads_backing > 0 && st.loads_pool > 0, "{st:?}");
    assert_eq!(
        st.stored_pages + st.backing_pages,
        0,
        "region drop released all"
    );
    assert_eq!(st.backing_slots_used, 0);
    cache.check_invariants().unwrap();
}

/// The same with dedup on and page contents drawn from a few patterns, so
/// that most stored pages share an object with others: a page written
/// while its object is shared, loaded (exclusively: the load drops one
/// reference), evicted again or dropped with the region, must never take
/// another page's bytes with it.
#[test]
fn threads_on_a_region_over_the_cache_with_dedup() {
    over_the_cache_with_dedup(uzswap_region::PagerConfig::new(BUDGET));
}

/// The body of the test above, for a pager made with `cfg` (exclusive
/// loads: `keep_clean` is turned off).
pub fn over_the_cache_with_dedup(cfg: uzswap_region::PagerConfig) {
    let cache = std::sync::Arc::new(
        uzswap_cache::Cache::new(uzswap_cache::CacheConfig {
            dedup: true,
            ..uzswap_cache::CacheConfig::default()
        })
        .unwrap(),
    );
    let pager = uzswap_region::Pager::new(
        cache.clone(),
        uzswap_region::PagerConfig {
            keep_clean: false,
            ..cfg
        },
    )
    .unwrap();
    fn few_patterns(buf: &mut [u8], p: usize, v: u32) {
        fill(buf, p % 5, v % 3);
    }
    let report = hammer_for(&pager, Duration::from_secs(4), true, few_patterns);
    assert_eq!(report.pages_lost, 0);
    let st = cache.stats();
    eprintln!("{st:?}");
    assert!(st.duplicate_pages > 1000, "dedup ran: {st:?}");
    assert_eq!(st.stored_pages, 0, "region drop released all");
    cache.check_invariants().unwrap();
}

/// Threads read, check and rewrite random pages of a region 8x the budget
/// for 4 s; then every page is checked and the region dropped.
pub fn hammer(pager: &uzswap_region::Pager) {
    let report = hammer_for(pager, Duration::from_secs(4), true, fill);
    assert_eq!(report.pages_lost, 0);
    let st = pager.stats();
    eprintln!("{}", serde_json::to_string_pretty(&st).unwrap());
    assert!(st.evictions > 1000, "eviction ran: {}", st.evictions);
    // Every discard call releases one page at least (no program discards
    // here to take a page away meanwhile).
    assert!(
        st.discard_calls > 0 && st.discard_calls <= st.evictions + st.clean_drops,
        "{} discard calls for {} pages",
        st.discard_calls,
        st.evictions + st.clean_drops
    );
    assert!(st.peak_resident_pages <= BUDGET as u64);
    assert_eq!(st.load_errors, 0);
}

/// What [`hammer_for`] did.
pub struct Report {
    pub operations: u64,
    pub pages_checked: u64,
    /// Pages that read back other than last written (in the run or in the
    /// final check).
    pub pages_lost: u64,
}

/// Four threads read, check and rewrite random pages of a region 8x the
/// budget for `run`; then every page is checked and the region dropped.
/// With `strict_budget`, resident pages are sampled (mincore) and must stay
/// within the budget: not when the store may refuse pages (the budget turns
/// soft then).
/// `content(buf, p, v)` writes version `v` of page `p` (0 is never written).
pub fn hammer_for(
    pager: &uzswap_region::Pager,
    run: Duration,
    strict_budget: bool,
    content: fn(&mut [u8], usize, u32),
) -> Report {
    const PAGES: usize = 8 * BUDGET;
    const THREADS: usize = 4;
    // A hang fails the test with every thread's kernel stack, in well
    // under the CI's limit.
    let _w = watchdog("hammer", 300);
    let r = pager.region(PAGES * PAGE).unwrap();
    let base = r.as_ptr() as usize;
    // version 0: never written, reads as zeros.
    let shadow: Vec<Mutex<u32>> = (0..PAGES).map(|_| Mutex::new(0)).collect();
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + run;
    let errors = std::sync::atomic::AtomicU64::new(0);
    let operations = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|sc| {
        for t in 0..THREADS {
            let shadow = &shadow;
            let (errors, operations) = (&errors, &operations);
            let stop = &stop;
            sc.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                let mut want = vec![0u8; PAGE];
                let mut ops = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let p = rng.gen_range(0..PAGES);
                    let mut v = shadow[p].lock();
                    let page = page_mut(base as *mut u8, p);
                    if *v == 0 {
                        want.fill(0);
                    } else {
                        content(&mut want, p, *v);
                    }
                    if page != &want[..] {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    if rng.gen_bool(0.3) {
                        *v += 1;
                        // Partial writes too: a write to the middle of a
                        // page mid-eviction must not be lost.
                        content(&mut want, p, *v);
                        if rng.gen_bool(0.5) {
                            page.copy_from_slice(&want);
                        } else {
                            page[..2048].copy_from_slice(&want[..2048]);
                            page[2048..].copy_from_slice(&want[2048..]);
                        }
                    }
                    ops += 1;
                }
                operations.fetch_add(ops, Ordering::Relaxed);
            });
        }
        // A failed check below stops the threads too (the scope would wait
        // for them for ever, and the watchdog would hide the message).
        let _stop = StopOnDrop(&stop);
        let mut checks = 0;
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            if strict_budget {
                // Under the pager's state lock (see `mincore_resident`).
                let resident = r.mincore_resident().unwrap();
                assert!(resident <= BUDGET, "mincore says {resident} pages resident");
            }
            pager.check_invariants().unwrap();
            checks += 1;
        }
        assert!(checks > 10);
        stop.store(true, Ordering::Relaxed);
    });
    // Final full check.
    let mut want = vec![0u8; PAGE];
    for (p, v) in shadow.iter().enumerate() {
        let v = *v.lock();
        if v == 0 {
            want.fill(0);
        } else {
            content(&mut want, p, v);
        }
        if page_mut(base as *mut u8, p) != &want[..] {
            eprintln!("page {p} differs from version {v}");
            errors.fetch_add(1, Ordering::Relaxed);
        }
    }
    pager.check_invariants().unwrap();
    drop(r);
    Report {
        operations: operations.into_inner(),
        pages_checked: PAGES as u64,
        pages_lost: errors.into_inner(),
    }
}

/// The budget as the kernel sees it, sampled without a pause while four
/// threads write random pages of a region 8x the budget: `mincore` never
/// reports more pages than the budget. (Its walk takes one page table at a
/// time; unsynchronised with faults it would count a page that left behind
/// it and one that came in ahead of it, up to 135 for 128.)
#[test]
fn mincore_never_sees_more_than_the_budget() {
    mincore_within_budget(uzswap_region::PagerConfig::new(BUDGET));
}

/// The body of the test above, for a pager made with `cfg`.
pub fn mincore_within_budget(cfg: uzswap_region::PagerConfig) {
    const PAGES: usize = 8 * BUDGET;
    let _w = watchdog("mincore_within_budget", 120);
    let (pager, _store) = pager_with(cfg);
    let r = pager.region(PAGES * PAGE).unwrap();
    let base = r.as_ptr() as usize;
    let stop = AtomicBool::new(false);
    // Sampling without a pause (while it holds the state lock the faults
    // wait), at least 2 s and on until enough evictions ran (a loaded
    // machine does fewer per second), at most 30 s.
    let start = Instant::now();
    let mut samples = 0u64;
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let stop = &stop;
            sc.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(200 + t);
                while !stop.load(Ordering::Relaxed) {
                    let p = rng.gen_range(0..PAGES);
                    // Each thread its own bytes of the page: no two write
                    // the same ones.
                    page_mut(base as *mut u8, p)[t as usize * 8] = 1;
                }
            });
        }
        let _stop = StopOnDrop(&stop);
        loop {
            let resident = r.mincore_resident().unwrap();
            assert!(resident <= BUDGET, "mincore says {resident} pages resident");
            samples += 1;
            if samples.is_multiple_of(256) {
                let t = start.elapsed();
                let enough = pager.stats().evictions >= 2_000;
                if (t >= Duration::from_secs(2) && enough) || t >= Duration::from_secs(30) {
                    break;
                }
            }
        }
    });
    let st = pager.stats();
    eprintln!(
        "{samples} samples in {:?}, {} evictions",
        start.elapsed(),
        st.evictions
    );
    assert!(st.evictions > 1000, "eviction ran: {st:?}");
    assert!(st.peak_resident_pages <= BUDGET as u64, "{st:?}");
    pager.check_invariants().unwrap();
}

/// Like the test above, but threads also discard pages (MADV_DONTNEED, a
/// discarded page must read as zeros) and write pages from the kernel
/// (read(2) from a pipe into the page), racing with eviction.
#[test]
fn discards_and_syscalls_race_with_eviction() {
    discards_and_syscalls(uzswap_region::PagerConfig::new(64));
}

/// The same with a fault handler on each CPU: a fault read after a
/// discard's remove event must not be resolved before that event is
/// handled, whichever handler reads each.
#[test]
fn discards_and_syscalls_race_with_eviction_and_cpu_handlers() {
    let mut cfg = uzswap_region::PagerConfig::new(64);
    cfg.cpu_handlers = true;
    discards_and_syscalls(cfg);
}

/// The same with exclusive loads (what `uzswap run` uses): every victim is
/// write-protected, stored and discarded, and the random access leaves
/// victims scattered, so they leave in spans over stored pages (one
/// discard each, `OwnSpan`): a program discard inside a span in flight
/// must still read as zeros, a stored page the span covers keep its bytes,
/// and a fault there be woken when the span's call returned.
#[test]
fn discards_and_syscalls_race_with_eviction_and_exclusive_loads() {
    let mut cfg = uzswap_region::PagerConfig::new(64);
    cfg.keep_clean = false;
    cfg.cpu_handlers = true;
    discards_and_syscalls(cfg);
}

fn discards_and_syscalls(cfg: uzswap_region::PagerConfig) {
    const BUDGET: usize = 64;
    const PAGES: usize = 8 * BUDGET;
    assert_eq!(cfg.budget_pages, BUDGET);
    let _w = watchdog("discards_and_syscalls", 300);
    let (pager, store) = pager_with(cfg);
    let r = pager.region(PAGES * PAGE).unwrap();
    let base = r.as_ptr() as usize;
    let shadow: Vec<Mutex<u32>> = (0..PAGES).map(|_| Mutex::new(0)).collect();
    // At least 3 s, and on until enough evictions and discards raced (a
    // loaded machine does fewer per second), at most 60 s.
    let deadline = Instant::now() + Duration::from_secs(3);
    let hard_deadline = Instant::now() + Duration::from_secs(60);
    let done = AtomicBool::new(false);
    let errors = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|sc| {
        for t in 0..3u64 {
            let shadow = &shadow;
            let errors = &errors;
            let done = &done;
            sc.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(100 + t);
                let mut want = vec![0u8; PAGE];
                let mut fds = [0; 2];
                // SAFETY: pipe writes two descriptors into the array.
                assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
                while !done.load(Ordering::Relaxed) && Instant::now() < hard_deadline {
                    let p = rng.gen_range(0..PAGES);
                    let mut v = shadow[p].lock();
                    let page = page_mut(base as *mut u8, p);
                    if *v == 0 {
                        want.fill(0);
                    } else {
                        fill(&mut want, p, *v);
                    }
                    if page != &want[..] {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    match rng.gen_range(0..10) {
                        0..=3 => {}
                        4..=6 => {
                            *v += 1;
                            fill(&mut want, p, *v);
                            page.copy_from_slice(&want);
                        }
                        7 | 8 => {
                            *v += 1;
                            fill(&mut want, p, *v);
                            // SAFETY: our pipe, our buffers; the page is
                            // live region memory we hold the lock of.
                            unsafe {
                                assert_eq!(
                                    libc::write(fds[1], want.as_ptr().cast(), PAGE),
                                    PAGE as isize
                                );
                                assert_eq!(
                                    libc::read(fds[0], page.as_mut_ptr().cast(), PAGE),
                                    PAGE as isize
                                );
                            }
                        }
                        _ => {
                            // SAFETY: one page of the live region whose
                            // contents we mean to drop.
                            let rc = unsafe {
                                libc::madvise(page.as_mut_ptr().cast(), PAGE, libc::MADV_DONTNEED)
                            };
                            assert_eq!(rc, 0);
                            *v = 0;
                        }
                    }
                }
                // SAFETY: closing our own descriptors.
                unsafe {
                    libc::close(fds[0]);
                    libc::close(fds[1]);
                }
            });
        }
        // The pager's invariants hold at every moment it is not mid-step.
        loop {
            std::thread::sleep(Duration::from_millis(20));
            pager.check_invariants().unwrap();
            let st = pager.stats();
            let enough = st.evictions > 150 && st.discarded_pages > 150;
            let now = Instant::now();
            if (now >= deadline && enough) || now >= hard_deadline {
                break;
            }
        }
        done.store(true, Ordering::Relaxed);
    });
    assert_eq!(errors.load(Ordering::Relaxed), 0);
    let mut want = vec![0u8; PAGE];
    for (p, v) in shadow.iter().enumerate() {
        let v = *v.lock();
        if v == 0 {
            want.fill(0);
        } else {
            fill(&mut want, p, v);
        }
        assert_eq!(page_mut(base as *mut u8, p), &want[..], "page {p}");
    }
    let st = pager.stats();
    assert!(st.evictions > 100 && st.discarded_pages > 100, "{st:?}");
    // Scattered victims share discards (`OwnSpan`).
    assert!(st.discard_calls < st.evictions + st.clean_drops, "{st:?}");
    // A page discarded while being evicted is served past the budget (the
    // evictor itself reads it): at most one batch over.
    let batch = uzswap_region::PagerConfig::new(BUDGET).evict_batch;
    assert!(st.peak_resident_pages <= (BUDGET + batch) as u64, "{st:?}");
    pager.check_invariants().unwrap();
    drop(r);
    assert!(eventually(|| store.is_empty()));
}
