//! The access signal (`pager/access.rs`): regions cut into chunk mappings,
//! and victims chosen by what the program read, not only by what it wrote.

use crate::common::*;
use uzswap_region::{PagerConfig, ACCESS_CHUNK};

/// The mappings of `/proc/self/maps` that lie inside `[lo, hi)`.
fn mappings_inside(lo: usize, hi: usize) -> usize {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let range = l.split(' ').next()?;
            let (a, b) = range.split_once('-')?;
            Some((
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            ))
        })
        .filter(|&(a, b)| a >= lo && b <= hi)
        .count()
}

fn chunked(budget: usize) -> PagerConfig {
    let mut cfg = PagerConfig::new(budget);
    cfg.access_chunk = ACCESS_CHUNK;
    cfg
}

/// A region is one mapping until the program reaches it; the sample
/// before which it did cuts what it reached (and a chunk beyond) into one
/// mapping a chunk.
#[test]
fn a_region_is_cut_into_one_mapping_a_chunk_where_it_is_used() {
    let (pager, _store) = pager_with(chunked(64));
    let len = 32 * ACCESS_CHUNK;
    let r = pager.region(len).unwrap();
    let lo = r.as_ptr() as usize;
    assert_eq!(mappings_inside(lo, lo + len), 1);
    // The first half used: faults and evictions across every chunk edge
    // keep every page.
    let base = r.as_ptr();
    let pages = len / 2 / PAGE;
    for p in 0..pages {
        fill(page_mut(base, p), p, 1);
    }
    pager.sample_access_now();
    let n = mappings_inside(lo, lo + len);
    assert!((17..=19).contains(&n), "{n} mappings");
    let st = pager.stats();
    assert_eq!(st.access_signal, "chunks", "{st:?}");
    assert!(st.access_chunks >= 16, "{st:?}");
    let mut want = vec![0u8; PAGE];
    for p in (0..pages).rev() {
        fill(&mut want, p, 1);
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
    }
    assert!(pager.stats().evictions > 0);
    pager.check_invariants().unwrap();

    let (off, _store) = crate::common::pager(64);
    let r = off.region(len).unwrap();
    let base = r.as_ptr();
    for p in 0..pages {
        fill(page_mut(base, p), p, 1);
    }
    let lo = base as usize;
    assert_eq!(mappings_inside(lo, lo + len), 1);
    assert_eq!(off.stats().access_signal, "off");
}

/// Pages of the hot set that faults brought back while the program read
/// it over and over and wrote a stream of pages it never read again.
fn hot_refaults(access_chunk: usize) -> (u64, uzswap_region::PagerStats) {
    const CHUNK_PAGES: usize = ACCESS_CHUNK / PAGE;
    let mut cfg = PagerConfig::new(512);
    cfg.readahead_max = 0;
    cfg.access_chunk = access_chunk;
    let (pager, _store) = pager_with(cfg);
    let pages = 64 * CHUNK_PAGES;
    let r = pager.region(pages * PAGE).unwrap();
    let base = r.as_ptr();
    // Chunk-aligned pages of the region (its start need not be aligned).
    let first = (base as usize).next_multiple_of(ACCESS_CHUNK);
    let p0 = (first - base as usize) / PAGE;
    let hot = p0..p0 + 2 * CHUNK_PAGES;
    // Written first, so that the lists alone take the hot set first.
    for p in hot.clone() {
        fill(page_mut(base, p), p, 1);
    }
    let sweep = || {
        let mut sum = 0u64;
        for p in hot.clone() {
            sum += touch(base, p) as u64;
        }
        sum
    };
    pager.sample_access_now();
    sweep();
    pager.sample_access_now();
    let before = pager.stats().faults_pool;
    let stream = hot.end..hot.end + 40 * CHUNK_PAGES;
    for (i, p) in stream.enumerate() {
        fill(page_mut(base, p), p, 1);
        if i % 64 == 63 {
            sweep();
            pager.sample_access_now();
        }
    }
    let st = pager.stats();
    let mut want = vec![0u8; PAGE];
    for p in hot.clone() {
        fill(&mut want, p, 1);
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
    }
    pager.check_invariants().unwrap();
    (st.faults_pool - before, st)
}

/// A hot set that is only read, written before a stream that pushes it
/// out: the lists alone see no use of it and evict it; the signal sees
/// its chunks read and keeps it.
#[test]
fn pages_read_over_and_over_stay_resident() {
    let (with, st) = hot_refaults(ACCESS_CHUNK);
    let (without, st_off) = hot_refaults(0);
    eprintln!("hot refaults: {with} with the signal, {without} without");
    assert!(
        st.access_samples > 0 && st.access_cold_victims > 0,
        "{st:?}"
    );
    assert!(st.access_second_chances > 0, "{st:?}");
    assert!(without >= 200, "{without} refaults without; {st_off:?}");
    assert!(
        with * 4 <= without,
        "{with} with, {without} without; {st:?}"
    );
}

/// A region of `pages` pages of `pager`, written (version 1), cut into
/// chunks by a sample, and evicted.
fn written_chunks_evicted(pager: &uzswap_region::Pager, pages: usize) -> uzswap_region::Region {
    let r = pager.region(pages * PAGE).unwrap();
    let base = r.as_ptr();
    for p in 0..pages {
        fill(page_mut(base, p), p, 1);
    }
    pager.sample_access_now();
    assert!(mappings_inside(base as usize, base as usize + pages * PAGE) >= 4);
    r.evict(0..pages);
    r
}

/// `mprotect` over chunk edges: evicted pages read back through a
/// read-only range that spans chunks, then written once it is writable
/// again; readahead runs stop at each edge.
#[test]
fn mprotect_over_chunk_edges_keeps_every_page() {
    let (pager, _store) = pager_with(chunked(64));
    let pages = 4 * ACCESS_CHUNK / PAGE;
    let r = written_chunks_evicted(&pager, pages);
    let base = r.as_ptr();
    // SAFETY: our own region; the test only reads it while read-only.
    let ro = unsafe { libc::mprotect(base.cast(), pages * PAGE, libc::PROT_READ) };
    assert_eq!(ro, 0);
    let mut want = vec![0u8; PAGE];
    for p in 0..pages {
        fill(&mut want, p, 1);
        assert_eq!(page_mut(base, p), &want[..], "page {p} read-only");
    }
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    // SAFETY: as above, writable again.
    let back = unsafe { libc::mprotect(base.cast(), pages * PAGE, rw) };
    assert_eq!(back, 0);
    for p in 0..pages {
        fill(page_mut(base, p), p, 2);
    }
    for p in (0..pages).rev() {
        fill(&mut want, p, 2);
        assert_eq!(page_mut(base, p), &want[..], "page {p} rewritten");
    }
    pager.check_invariants().unwrap();
}

/// The kernel moves no registered range across mappings: an `mremap` of
/// chunked region memory that spans a chunk edge fails, loudly, and every
/// page stays where it was, with its contents. (`uzswap run` never passes
/// a program's `mremap` of managed memory to the kernel.)
#[test]
fn mremap_across_a_chunk_edge_fails_and_loses_nothing() {
    let (pager, _store) = pager_with(chunked(64));
    let pages = 4 * ACCESS_CHUNK / PAGE;
    let r = written_chunks_evicted(&pager, pages);
    let base = r.as_ptr();
    // SAFETY: a fresh reservation as the destination; on failure nothing
    // moved, and the test reads the region at its own address.
    let moved = unsafe {
        let dst = libc::mmap(
            std::ptr::null_mut(),
            pages * PAGE,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(dst, libc::MAP_FAILED);
        let to = libc::mremap(
            base.cast(),
            pages * PAGE,
            pages * PAGE,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            dst,
        );
        libc::munmap(dst, pages * PAGE);
        to
    };
    assert_eq!(moved, libc::MAP_FAILED, "the kernel moved a chunked range");
    let mut want = vec![0u8; PAGE];
    for p in 0..pages {
        fill(&mut want, p, 1);
        assert_eq!(page_mut(base, p), &want[..], "page {p}");
    }
    pager.check_invariants().unwrap();
}
