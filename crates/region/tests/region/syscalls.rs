//! Kernel-mode accesses to evicted region memory: write(2) from it and
//! read(2) into it must behave as on ordinary memory.

use crate::common::*;
use std::io::{Read, Seek, SeekFrom, Write};
use uzswap_region::PageState;

#[test]
fn write_from_and_read_into_evicted_memory() {
    let (pager, _store) = pager(16);
    let pages = 64;
    let r = pager.region(pages * PAGE).unwrap();
    let base = r.as_ptr();
    for p in 0..pages {
        fill(page_mut(base, p), p, 1);
    }
    r.evict(0..pages);
    assert!((0..pages).all(|p| r.page_state(p) == Some(PageState::Stored)));

    let path = std::env::temp_dir().join(format!("uzswap-region-{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    // write(2) from evicted memory: one syscall over all pages.
    // SAFETY: the region is live and nobody writes it meanwhile.
    let all = unsafe { std::slice::from_raw_parts(base, pages * PAGE) };
    f.write_all(all).unwrap();
    let mut back = vec![0u8; pages * PAGE];
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_exact(&mut back).unwrap();
    let mut want = vec![0u8; PAGE];
    for p in 0..pages {
        fill(&mut want, p, 1);
        assert_eq!(
            &back[p * PAGE..(p + 1) * PAGE],
            &want[..],
            "write(2) page {p}"
        );
    }

    // read(2) into evicted memory (Stored pages) and into clean pages
    // (write-protected): the kernel's write must fault and be resolved.
    for p in 0..pages {
        fill(&mut back[p * PAGE..(p + 1) * PAGE], p, 2);
    }
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(&back).unwrap();
    r.evict(0..pages);
    // Bring a few back clean (read faults map them write-protected).
    for p in (0..pages).step_by(7) {
        touch(base, p);
    }
    f.seek(SeekFrom::Start(0)).unwrap();
    // SAFETY: the region is live and only this read(2) writes it.
    let dst = unsafe { std::slice::from_raw_parts_mut(base, pages * PAGE) };
    f.read_exact(dst).unwrap();
    for p in 0..pages {
        fill(&mut want, p, 2);
        assert_eq!(page_mut(base, p), &want[..], "read(2) page {p}");
    }
    assert!(pager.stats().peak_resident_pages <= 16);
    pager.check_invariants().unwrap();
}

#[test]
fn pipe_round_trip_through_evicted_memory() {
    let (pager, _store) = pager(16);
    let r = pager.region(8 * PAGE).unwrap();
    let base = r.as_ptr();
    for p in 0..8 {
        fill(page_mut(base, p), p, 5);
    }
    r.evict(0..8);
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into the array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: page 3 of the live region is readable; fds[1] is our pipe.
    let n = unsafe { libc::write(fds[1], base.add(3 * PAGE).cast(), PAGE) };
    assert_eq!(n, PAGE as isize);
    // SAFETY: page 6 of the live region is writable; fds[0] is our pipe.
    let n = unsafe { libc::read(fds[0], base.add(6 * PAGE).cast(), PAGE) };
    assert_eq!(n, PAGE as isize);
    let mut want = vec![0u8; PAGE];
    fill(&mut want, 3, 5);
    assert_eq!(page_mut(base, 6), &want[..]);
    // SAFETY: closing our own descriptors.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}
