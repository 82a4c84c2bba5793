//! fork() with evicted pages: the child must see the parent's bytes, never
//! zeros or stale data. In its own test binary because the fork hooks act
//! on every pager in the process.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use uzswap_cache::{Backing, Cache, CacheConfig, PoolLimit};
use uzswap_region::{ForkChild, MemStore, PageState, Pager, PagerConfig, Region, PAGE_SIZE};

fn fill(buf: &mut [u8], p: usize, v: u8) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = (p as u8).wrapping_mul(31) ^ v ^ (i as u8);
    }
}

#[test]
fn with_prefault_the_child_sees_evicted_pages_brought_back() {
    let store = Arc::new(MemStore::new());
    let mut cfg = PagerConfig::new(32);
    cfg.fork = ForkChild::Prefault;
    let pager = Pager::new(store, cfg).unwrap();
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

/// The control: without the fork hooks the child reads zeros where the
/// parent's pages were evicted (its copy of the region has no handler).
#[test]
fn unmanaged_the_child_would_see_zeros() {
    let store = Arc::new(MemStore::new());
    let mut cfg = PagerConfig::new(32);
    cfg.fork = uzswap_region::ForkChild::Unmanaged;
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

/// A pager that takes every fork over, whatever its store holds (these
/// tests fork with fewer pages than the default threshold).
fn managed_at_any_size(budget: usize) -> PagerConfig {
    let mut cfg = PagerConfig::new(budget);
    cfg.fork_manage_min_pages = 0;
    cfg
}

/// A cache with a pool of `pool_bytes` (the rest goes to a backing file)
/// under a pager of `budget` pages that takes every fork over.
fn cache_pager(budget: usize, pool_bytes: u64) -> (Arc<Cache>, Pager) {
    cache_pager_with(managed_at_any_size(budget), pool_bytes)
}

fn cache_pager_with(cfg: PagerConfig, pool_bytes: u64) -> (Arc<Cache>, Pager) {
    let cache = Arc::new(
        Cache::new(CacheConfig {
            pool_limit: PoolLimit::Bytes(pool_bytes),
            backing: Backing::File(std::env::temp_dir()),
            ..CacheConfig::default()
        })
        .unwrap(),
    );
    let pager = Pager::new(cache.clone(), cfg).unwrap();
    (cache, pager)
}

/// Writes version 1 of `pages` pages of `r` and evicts them, then waits
/// until the cache's writer has put more than half of them in the backing
/// file (the pool's overflow).
fn write_back_half(
    cache: &Cache,
    r: &Region,
    pages: usize,
    page: &dyn Fn(usize) -> &'static mut [u8],
) {
    for p in 0..pages {
        versioned(page(p), p, 1);
    }
    r.evict(0..pages);
    for _ in 0..400 {
        if cache.stats().backing_pages > (pages / 2) as u64 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let st = cache.stats();
    assert!(st.backing_pages > (pages / 2) as u64, "{st:?}");
}

/// The contents of page `p` at version `v`: a header (page number,
/// version), a random-looking part that compresses a little, then a
/// pattern.
fn versioned(buf: &mut [u8], p: usize, v: u64) {
    buf[..8].copy_from_slice(&(p as u64).to_le_bytes());
    buf[8..16].copy_from_slice(&v.to_le_bytes());
    let mut x = (p as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ v;
    for (i, b) in buf[16..].iter_mut().enumerate() {
        if i < 1024 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        } else {
            *b = (i as u8) ^ (v as u8) ^ (p as u8);
        }
    }
}

/// Writes version `v` of each page of `pages` of the region at `base`.
///
/// # Safety
/// The pages are the caller's region's, and no other thread uses them.
unsafe fn write_versions(base: usize, pages: std::ops::Range<usize>, v: u64) {
    for p in pages {
        // SAFETY: as the caller promised.
        let page =
            unsafe { std::slice::from_raw_parts_mut((base + p * PAGE_SIZE) as *mut u8, PAGE_SIZE) };
        versioned(page, p, v);
    }
}

/// How many pages of `pages` of the region at `base` do not hold version
/// `v`, whole. Safety: as [`write_versions`].
unsafe fn pages_not_at(base: usize, pages: std::ops::Range<usize>, v: u64) -> usize {
    pages
        .filter(|&p| {
            // SAFETY: as the caller promised.
            let page = unsafe {
                std::slice::from_raw_parts((base + p * PAGE_SIZE) as *const u8, PAGE_SIZE)
            };
            version_of(page, p) != Some(v)
        })
        .count()
}

/// The version page `p` holds if it is whole and consistent, else None.
fn version_of(page: &[u8], p: usize) -> Option<u64> {
    let v = u64::from_le_bytes(page[8..16].try_into().unwrap());
    let mut want = vec![0u8; PAGE_SIZE];
    versioned(&mut want, p, v);
    (page == &want[..]).then_some(v)
}

fn pipe() -> (i32, i32) {
    let mut fds = [0; 2];
    // SAFETY: pipe fills two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    (fds[0], fds[1])
}

fn wait_child(pid: i32) {
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status),
        "the child was killed by signal {} (a page it could not load?)",
        libc::WTERMSIG(status)
    );
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "the child failed (its exit status is its check's number)"
    );
}

/// The child's wait status, or None if it had not ended within `limit`:
/// then what its threads were doing goes to the standard error and it is
/// killed and reaped.
fn wait_or_kill(pid: i32, limit: std::time::Duration) -> Option<i32> {
    let waited = std::time::Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: polling our own child.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            return Some(status);
        }
        if waited.elapsed() > limit {
            eprintln!("{}", uzswap_os::threads::describe(Some(pid as u32)));
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// In a child: `code` as the exit status if `ok` is false (no destructors,
/// no harness). The reason goes straight to the standard error: the
/// harness's capture of `eprintln!` is a buffer in the child's memory,
/// gone with it.
fn child_check(ok: bool, code: i32, what: &str) {
    if !ok {
        let m = format!("child: {what}\n");
        // SAFETY: a write of our own buffer, then leaving the child at once.
        unsafe {
            libc::write(2, m.as_ptr().cast(), m.len());
            libc::_exit(code)
        };
    }
}

/// Waits until the pager has evicted nothing for 50 ms (at most 10 s):
/// the cache's invariant check wants a cache no thread changes, and an
/// evictor still draining to its stop threshold stores pages while the
/// check walks the index (seen: `stored_pages: counter 360, index holds
/// 362`, in about one run in fourteen under AddressSanitizer).
fn evictor_settled(pager: &Pager) {
    let mut last = pager.stats().evictions;
    for _ in 0..200 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let now = pager.stats().evictions;
        if now == last {
            return;
        }
        last = now;
    }
}

/// The default, `ForkChild::Managed`: the parent brings nothing back for
/// the fork, the child serves the parent's evicted pages (pool and backing
/// file) from its own copy, evicts its own pages, and the two never see
/// each other's writes, including the parent's reuse of backing slots the
/// child still needs. The backing file is not copied: both keep reading
/// the slots used at the fork from it, write to files of their own, and
/// let go of it when their last slot there is freed.
#[test]
fn a_managed_child_serves_evicted_pages_from_its_own_copy() {
    const BUDGET: usize = 64;
    const PAGES: usize = 2048;
    let (cache, pager) = cache_pager(BUDGET, 512 << 10);
    let r = pager.region(PAGES * PAGE_SIZE).unwrap();
    let base = r.as_ptr() as usize;
    let page = |p: usize| {
        // SAFETY: page p of the live region, used by one thread at a time.
        unsafe { std::slice::from_raw_parts_mut((base + p * PAGE_SIZE) as *mut u8, PAGE_SIZE) }
    };
    write_back_half(&cache, &r, PAGES, &page);
    let (go_r, go_w) = pipe();
    // SAFETY: the child runs this test's code only, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // Wait until the parent has rewritten half its pages (freeing and
        // reusing backing slots); EOF if it died.
        let mut b = [0u8; 1];
        // SAFETY: our copy of the write end, then one byte into a local.
        let n = unsafe {
            libc::close(go_w);
            libc::read(go_r, b.as_mut_ptr().cast(), 1)
        };
        child_check(n == 1, 7, "the parent went away");
        let st = cache.stats();
        child_check(
            st.backing_shared_files >= 1 && st.backing_shared_slots > (PAGES / 2) as u64,
            8,
            &format!("the child shares no file with its parent: {st:?}"),
        );
        let mut bad = 0;
        for p in 0..PAGES {
            if version_of(page(p), p) != Some(1) {
                bad += 1;
            }
        }
        child_check(bad == 0, 2, &format!("{bad} pages not as at the fork"));
        let st = pager.stats();
        child_check(
            st.faults_backing > 0 && st.faults_pool + st.faults_same_filled > 0,
            3,
            &format!("the child served no evicted page itself: {st:?}"),
        );
        // The child's own writes go through its own eviction.
        for p in 0..PAGES {
            versioned(page(p), p, 3);
        }
        for p in 0..PAGES {
            if version_of(page(p), p) != Some(3) {
                bad += 1;
            }
        }
        child_check(bad == 0, 4, &format!("{bad} of the child's pages lost"));
        // Every page was read and written again: no slot of the shared
        // file is the child's any more, and it let go of the file.
        let st = cache.stats();
        child_check(
            st.backing_shared_files == 0 && st.backing_shared_slots == 0,
            9,
            &format!("the child still holds the shared file: {st:?}"),
        );
        let st = pager.stats();
        child_check(st.evictions > PAGES as u64 / 2, 5, &format!("{st:?}"));
        evictor_settled(&pager);
        let (pc, cc) = (pager.check_invariants(), cache.check_invariants());
        child_check(pc.is_ok() && cc.is_ok(), 6, &format!("{pc:?} {cc:?}"));
        // SAFETY: leaving the child without the harness.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: the child's end.
    unsafe { libc::close(go_r) };
    let st = pager.stats();
    assert_eq!(st.fork_prefault_pages, 0, "nothing comes back for the fork");
    assert!(
        st.resident_pages <= BUDGET as u64,
        "the fork left the parent at its budget: {st:?}"
    );
    // At least one file: the other tests of this binary fork too, and
    // every fork shares each cache's slots.
    let shared = cache.stats();
    assert!(
        shared.backing_shared_files >= 1 && shared.backing_shared_slots > (PAGES / 2) as u64,
        "the parent's slots at the fork are shared, not copied: {shared:?}"
    );
    let written = |c: &Cache| {
        let s = c.stats();
        s.written_back_pages + s.stores_to_backing
    };
    let writes = written(&cache);
    for p in 0..PAGES / 2 {
        versioned(page(p), p, 2);
    }
    for _ in 0..400 {
        if written(&cache) > writes + 64 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(
        written(&cache) > writes + 64,
        "the parent wrote back after the fork: {:?}",
        cache.stats()
    );
    // SAFETY: one byte from a local.
    assert_eq!(unsafe { libc::write(go_w, [1u8].as_ptr().cast(), 1) }, 1);
    wait_child(pid);
    for p in 0..PAGES {
        let want = if p < PAGES / 2 { 2 } else { 1 };
        assert_eq!(version_of(page(p), p), Some(want), "parent page {p}");
    }
    evictor_settled(&pager);
    pager.check_invariants().unwrap();
    cache.check_invariants().unwrap();
}

/// Writers rewrite pages under a small budget (eviction never stops) while
/// the main thread forks again and again; each child checks that every
/// page is whole and at least as new as it was when the fork began, then
/// writes and reads back pages of its own.
#[test]
fn fork_during_heavy_eviction_loses_nothing() {
    heavy_eviction_across_forks(managed_at_any_size(48));
}

/// The same with the region cut into chunks of 16 pages for the access
/// signal: the child inherits the chunk mappings, registers them again and
/// samples its own (`AccessLook::renew`).
#[test]
fn fork_during_heavy_eviction_with_chunks_loses_nothing() {
    let mut cfg = managed_at_any_size(48);
    cfg.access_chunk = 16 * PAGE_SIZE;
    heavy_eviction_across_forks(cfg);
}

fn heavy_eviction_across_forks(cfg: PagerConfig) {
    const PAGES: usize = 768;
    let (cache, pager) = cache_pager_with(cfg, 256 << 10);
    let r = pager.region(PAGES * PAGE_SIZE).unwrap();
    let base = r.as_ptr() as usize;
    let page = |p: usize| {
        // SAFETY: page p of the live region; writers own disjoint pages
        // and write them only under `fence`, which the fork holds.
        unsafe { std::slice::from_raw_parts_mut((base + p * PAGE_SIZE) as *mut u8, PAGE_SIZE) }
    };
    for p in 0..PAGES {
        versioned(page(p), p, 0);
    }
    let versions: Vec<AtomicU64> = (0..PAGES).map(|_| AtomicU64::new(0)).collect();
    let fence = std::sync::RwLock::new(());
    let stop = AtomicBool::new(false);
    const WRITERS: usize = 2;
    /// Stops the writers however the loop below ends (a failed check
    /// panics, and the scope then waits for them).
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|sc| {
        let _stop = StopOnDrop(&stop);
        for w in 0..WRITERS {
            let (page, versions, fence, stop) = (&page, &versions, &fence, &stop);
            sc.spawn(move || {
                let mut x = w as u64 + 1;
                while !stop.load(Ordering::Relaxed) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let p = (x as usize % (PAGES / WRITERS)) * WRITERS + w;
                    let _g = fence.read().unwrap();
                    let v = versions[p].load(Ordering::Relaxed) + 1;
                    versioned(page(p), p, v);
                    versions[p].store(v, Ordering::Relaxed);
                }
            });
        }
        for round in 0..8 {
            std::thread::sleep(std::time::Duration::from_millis(30));
            let g = fence.write().unwrap();
            let at_fork: Vec<u64> = versions.iter().map(|v| v.load(Ordering::Relaxed)).collect();
            // SAFETY: the child runs this test's code only, then _exit.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                // The fence and the writers are the parent's: touch neither.
                std::mem::forget(g);
                let mut bad = 0;
                for (p, &v) in at_fork.iter().enumerate() {
                    if version_of(page(p), p) != Some(v) {
                        bad += 1;
                    }
                }
                child_check(bad == 0, 2, &format!("round {round}: {bad} pages wrong"));
                for p in (0..PAGES).step_by(3) {
                    versioned(page(p), p, 1000 + round);
                }
                for (p, &v) in at_fork.iter().enumerate() {
                    let want = if p % 3 == 0 { 1000 + round } else { v };
                    if version_of(page(p), p) != Some(want) {
                        bad += 1;
                    }
                }
                child_check(
                    bad == 0,
                    3,
                    &format!("round {round}: {bad} own pages wrong"),
                );
                child_check(
                    pager.check_invariants().is_ok(),
                    4,
                    &format!("{:?}", pager.check_invariants()),
                );
                // SAFETY: leaving the child without the harness.
                unsafe { libc::_exit(0) };
            }
            drop(g);
            wait_child(pid);
        }
    });
    for (p, v) in versions.iter().enumerate() {
        let want = v.load(Ordering::Relaxed);
        assert_eq!(version_of(page(p), p), Some(want), "parent page {p}");
    }
    let st = pager.stats();
    assert!(st.evictions > PAGES as u64, "eviction ran: {st:?}");
    assert_eq!(st.fork_prefault_pages, 0);
    evictor_settled(&pager);
    pager.check_invariants().unwrap();
    cache.check_invariants().unwrap();
}

/// In-thread faults (`PagerConfig::in_thread_faults`) across fork: the
/// child takes the pager over and serves the parent's evicted pages in its
/// own SIGBUS handler, writes and evicts its own, and the parent sees none
/// of it. Then a genuine SIGBUS (a file mapping read past the file's end)
/// still kills a child: the handler passes what is not a region's on.
/// (One test: a process has at most one in-thread pager.)
#[test]
fn in_thread_faults_across_fork() {
    let mut cfg = managed_at_any_size(32);
    cfg.in_thread_faults = true;
    let pager = Pager::new(Arc::new(MemStore::new()), cfg).unwrap();
    let pages = 128;
    let r = pager.region(pages * PAGE_SIZE).unwrap();
    let base = r.as_ptr() as usize;
    let page = |p: usize| {
        // SAFETY: page p of the live region, used by one thread at a time.
        unsafe { std::slice::from_raw_parts_mut((base + p * PAGE_SIZE) as *mut u8, PAGE_SIZE) }
    };
    for p in 0..pages {
        versioned(page(p), p, 1);
    }
    r.evict(0..pages);
    assert_eq!(r.page_state(7), Some(PageState::Stored));
    // SAFETY: the child reads and writes its memory and calls _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        child_check(
            uzswap_region::fork_child_managed(),
            10,
            "the child did not take over",
        );
        for p in 0..pages {
            child_check(version_of(page(p), p) == Some(1), 11, "a parent's page");
        }
        for p in (0..pages).step_by(2) {
            versioned(page(p), p, 2);
        }
        r.evict(0..pages);
        for p in 0..pages {
            let v = if p % 2 == 0 { 2 } else { 1 };
            child_check(version_of(page(p), p) == Some(v), 12, "a child's page");
        }
        // SAFETY: leaving the child without the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    wait_child(pid);
    for p in 0..pages {
        assert_eq!(version_of(page(p), p), Some(1), "page {p} in the parent");
    }

    let path = std::env::temp_dir().join(format!("uzswap-sigbus-{}", std::process::id()));
    // Readable (the child maps it for reading), empty.
    let mut opts = std::fs::File::options();
    let f = opts.read(true).write(true).create_new(true).open(&path);
    let f = f.unwrap();
    std::fs::remove_file(&path).unwrap();
    // SAFETY: the child maps an empty file and reads past its end.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        use std::os::fd::AsRawFd;
        // SAFETY: a new shared mapping of our file; reading it past the
        // file's end raises SIGBUS, which is the point.
        unsafe {
            let m = libc::mmap(
                std::ptr::null_mut(),
                PAGE_SIZE,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            );
            child_check(m != libc::MAP_FAILED, 20, "mmap");
            let b = std::ptr::read_volatile(m.cast::<u8>());
            libc::_exit(21 + i32::from(b));
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGBUS,
        "the child was not killed by SIGBUS (status {status:#x})"
    );
}

/// A fork while another thread drops a pager: the dropping thread holds
/// that pager's list of threads while it joins them, and the child's hook
/// must not wait for a lock whose holder did not come with it. Each child
/// exits at once; one that has not exited after 10 s hangs in the hook.
///
/// It guards two hangs: the list's lock (within a few forks), and, within
/// a few hundred, a lock of Rust's standard library
/// (`stack_overflow::thread_info`) that a parent thread holds while it
/// starts or ends a `std::thread`, on which the child's new handler thread
/// would wait for ever; so the helpers are POSIX threads.
/// Forks while the evictor looks for pages that map the zero page: a child
/// never inherits the look's lock taken. A thread keeps mapping zero runs
/// (the program discards a range, then reads and writes in it, so the
/// evictor looks at new runs before every batch) while the main thread
/// forks again and again; each child writes four budgets' worth of pages,
/// which only its evictor can make room for. Unless the fork hooks hold
/// the look, a child's evictor can wait for it for ever (as a Python
/// worker would).
#[test]
fn a_fork_while_the_evictor_looks_at_zero_runs_does_not_hang() {
    const BUDGET: usize = 64;
    const OWN: usize = 4 * BUDGET; // the children's pages
    const CHUNK: usize = 512;
    const PAGES: usize = OWN + 32 * CHUNK;
    let mut cfg = managed_at_any_size(BUDGET);
    cfg.uncharged_zero_pages = true;
    let pager = Pager::new(Arc::new(MemStore::new()), cfg).unwrap();
    let r = pager.region(PAGES * PAGE_SIZE).unwrap();
    let base = r.as_ptr() as usize;
    let stop = AtomicBool::new(false);
    let looks = || pager.stats().zero_readahead_pages;
    std::thread::scope(|sc| {
        let stop = &stop;
        sc.spawn(move || {
            let mut c = 0;
            while !stop.load(Ordering::Relaxed) {
                let lo = base + (OWN + (c % 32) * CHUNK) * PAGE_SIZE;
                // SAFETY: a range of the live region that only this thread
                // uses; the pager takes the discard as the program's.
                unsafe {
                    libc::madvise(
                        lo as *mut libc::c_void,
                        CHUNK * PAGE_SIZE,
                        libc::MADV_DONTNEED,
                    )
                };
                for i in (0..CHUNK).step_by(16) {
                    let p = (lo + i * PAGE_SIZE) as *mut u8;
                    // SAFETY: as above; a read maps a zero run, the write
                    // makes one page of it memory.
                    unsafe {
                        std::ptr::read_volatile(p);
                        std::ptr::write_volatile(p.add(8), 1);
                    }
                }
                c += 1;
            }
        });
        let before = looks();
        let t0 = std::time::Instant::now();
        let mut forks = 0;
        while t0.elapsed() < std::time::Duration::from_secs(2) || forks < 40 {
            // SAFETY: the child runs this test's code only, then _exit.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                // SAFETY: the child's own pages of the region, this thread
                // alone.
                let bad = unsafe {
                    write_versions(base, 0..OWN, 7);
                    pages_not_at(base, 0..OWN, 7)
                };
                child_check(bad == 0, 2, &format!("{bad} pages lost"));
                // SAFETY: leaving the child without the harness.
                unsafe { libc::_exit(0) };
            }
            forks += 1;
            let Some(status) = wait_or_kill(pid, std::time::Duration::from_secs(20)) else {
                stop.store(true, Ordering::Relaxed);
                panic!("fork {forks}: the child hung");
            };
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "fork {forks}: the child failed, status {status:#x}"
            );
        }
        stop.store(true, Ordering::Relaxed);
        assert!(looks() > before, "no zero runs were mapped meanwhile");
    });
}

/// A child's look for pages that map the zero page reads its own page
/// tables, not its parent's. The parent maps a region as zeros by reading
/// it (uncharged: no memory); the child writes every page (memory now,
/// without a fault the pager sees) and must find that out at its next
/// full look and evict down to its budget. Looking at the parent's tables,
/// where the pages still map the zero page, it would hold them all.
#[test]
fn a_managed_childs_zero_look_reads_its_own_page_tables() {
    const BUDGET: usize = 256;
    const PAGES: usize = 4 * BUDGET;
    let mut cfg = managed_at_any_size(BUDGET);
    cfg.uncharged_zero_pages = true;
    let pager = Pager::new(Arc::new(MemStore::new()), cfg).unwrap();
    let r = pager.region(PAGES * PAGE_SIZE).unwrap();
    let base = r.as_ptr() as usize;
    for p in 0..PAGES {
        // SAFETY: page p of the live region, this thread alone.
        unsafe { std::ptr::read_volatile((base + p * PAGE_SIZE) as *const u8) };
    }
    let t0 = std::time::Instant::now();
    while pager.stats().zero_mapped_pages < (PAGES - BUDGET) as u64 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "the parent's zero pages were not found: {:?}",
            pager.stats()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // (A few of the pages may have been evicted before the evictor's first
    // look found them mapping zeros, on a busy machine: they come back as
    // zeros when the child writes them.)
    // SAFETY: the child runs this test's code only, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: the child's copy of the region, this thread alone.
        unsafe { write_versions(base, 0..PAGES, 9) };
        let t0 = std::time::Instant::now();
        let mut st = pager.stats();
        while st.resident_pages > BUDGET as u64 && t0.elapsed() < std::time::Duration::from_secs(10)
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
            st = pager.stats();
        }
        child_check(
            st.resident_pages <= BUDGET as u64 && st.evictions > 0,
            2,
            &format!("the child holds its written pages as zeros: {st:?}"),
        );
        // SAFETY: as above.
        let bad = unsafe { pages_not_at(base, 0..PAGES, 9) };
        child_check(bad == 0, 3, &format!("{bad} pages lost"));
        // SAFETY: leaving the child without the harness.
        unsafe { libc::_exit(0) };
    }
    // The parent stays (its page tables with it) until the child is done.
    wait_child(pid);
    for p in 0..PAGES {
        // SAFETY: page p of the region, this thread alone.
        let b = unsafe { std::ptr::read_volatile((base + p * PAGE_SIZE + 100) as *const u8) };
        assert_eq!(b, 0, "the parent's page {p} changed");
    }
}

/// The child's memory once the fork hooks have run: what it has written
/// since the fork (`Private_Dirty` of `/proc/self/smaps_rollup`, in bytes).
/// Right after a fork every page is the parent's, shared copy-on-write.
fn private_dirty_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/smaps_rollup").ok()?;
    let line = text.lines().find(|l| l.starts_with("Private_Dirty:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A child takes the pager over without copying its page records: the
/// records of a large reservation the program barely used are zero pages
/// in the parent, and writing each (16-20 bytes a page) in the child would
/// make it a private copy of them all, 10 MiB for the 2 GiB here (6.3 MiB
/// in each forked worker of the fork test program, `workers.py fork`).
#[test]
fn a_managed_child_does_not_copy_the_page_records() {
    const PAGES: usize = 512 << 10; // 2 GiB reserved
    let pager = Pager::new(Arc::new(MemStore::new()), managed_at_any_size(64)).unwrap();
    let r = pager.region(PAGES * PAGE_SIZE).unwrap();
    let base = r.as_ptr() as usize;
    // A few hundred pages used, spread over the whole reservation, and
    // some of them evicted: the records the child must carry.
    let mut buf = vec![0u8; PAGE_SIZE];
    for p in (0..PAGES).step_by(2048) {
        fill(&mut buf, p, 5);
        // SAFETY: page p of the live region, this thread alone.
        unsafe {
            std::ptr::copy_nonoverlapping(
                buf.as_ptr(),
                (base + p * PAGE_SIZE) as *mut u8,
                PAGE_SIZE,
            )
        };
    }
    r.evict(0..PAGES);
    evictor_settled(&pager);
    // SAFETY: the child reads its memory and /proc, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let copied = private_dirty_bytes();
        child_check(copied.is_some(), 2, "no smaps_rollup");
        let copied = copied.unwrap_or(0);
        // The child's new threads, stacks and descriptors take a little;
        // a copy of the records would be 8-10 MiB. (A sanitizer's shadow
        // memory and quarantine take several MiB of their own.)
        let sanitized = std::env::var_os("UZSWAP_SANITIZER").is_some();
        child_check(
            sanitized || copied < 3 << 20,
            3,
            &format!("the child wrote {} KiB after the fork", copied >> 10),
        );
        // And what it took over is right.
        let mut want = vec![0u8; PAGE_SIZE];
        for p in (0..PAGES).step_by(2048) {
            fill(&mut want, p, 5);
            // SAFETY: page p of the region, this thread alone.
            let got = unsafe {
                std::slice::from_raw_parts((base + p * PAGE_SIZE) as *const u8, PAGE_SIZE)
            };
            child_check(got == &want[..], 4, &format!("page {p} not as at the fork"));
        }
        // SAFETY: leaving the child without the harness.
        unsafe { libc::_exit(0) };
    }
    wait_child(pid);
    drop(r);
}

/// Forks while another thread makes and drops pagers: the child's fork
/// hook never waits on a lock that thread held, and the child can make a
/// pager of its own (the list of pagers, which making one takes, was left
/// taken in a child forked while another thread made one).
#[test]
fn a_fork_while_another_thread_drops_a_pager_does_not_hang() {
    let _own = Pager::new(Arc::new(MemStore::new()), managed_at_any_size(16)).unwrap();
    let stop = AtomicBool::new(false);
    let dropped = AtomicU64::new(0);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let p = Pager::new(Arc::new(MemStore::new()), managed_at_any_size(16)).unwrap();
                drop(p);
                dropped.fetch_add(1, Ordering::Relaxed);
            }
        });
        let t0 = std::time::Instant::now();
        let mut forks = 0;
        while t0.elapsed() < std::time::Duration::from_secs(3) || forks < 20 {
            // SAFETY: the child makes a pager, then calls _exit.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let made = Pager::new(Arc::new(MemStore::new()), managed_at_any_size(16)).is_ok();
                // SAFETY: leaving the child at once, no destructors.
                unsafe { libc::_exit(if made { 0 } else { 1 }) };
            }
            forks += 1;
            let Some(status) = wait_or_kill(pid, std::time::Duration::from_secs(10)) else {
                stop.store(true, Ordering::Relaxed);
                panic!("fork {forks}: the child hung");
            };
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "child {forks} status {status:#x}"
            );
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        dropped.load(Ordering::Relaxed) > 0,
        "no pager was dropped meanwhile"
    );
}

/// A thread reads the cache's statistics, which look at the backing
/// file's shared files under their lock, while the main thread forks again
/// and again with slots in the file: no child finds that lock taken by a
/// thread it does not have (the prepare hook holds it across the fork),
/// and each reads its pages back. It passed without the hold too, in 3
/// runs of 300 forks: the lock is held for a few instructions of each
/// read. It guards the hold; it never showed the hang.
#[test]
fn a_fork_while_another_thread_reads_the_statistics_does_not_hang() {
    const PAGES: usize = 256;
    const FORKS: usize = 100;
    let (cache, pager) = cache_pager(32, 64 << 10);
    let r = pager.region(PAGES * PAGE_SIZE).unwrap();
    let base = r.as_ptr() as usize;
    let page = |p: usize| {
        // SAFETY: page p of the live region, used by one thread at a time.
        unsafe { std::slice::from_raw_parts_mut((base + p * PAGE_SIZE) as *mut u8, PAGE_SIZE) }
    };
    write_back_half(&cache, &r, PAGES, &page);
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (cache, stop) = (cache.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += cache.stats().backing_shared_files;
            }
            n
        })
    };
    let mut hung = 0;
    for i in 0..FORKS {
        // SAFETY: the child runs this test's code only, then _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let st = cache.stats();
            let bad = (0..PAGES)
                .filter(|&p| version_of(page(p), p) != Some(1))
                .count();
            child_check(
                bad == 0,
                2,
                &format!("{bad} pages not as at the fork: {st:?}"),
            );
            // SAFETY: leaving the child without the harness.
            unsafe { libc::_exit(0) };
        }
        match wait_or_kill(pid, std::time::Duration::from_secs(20)) {
            Some(status) => assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "fork {i}: the child failed ({status:#x})"
            ),
            None => hung += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    assert_eq!(hung, 0, "children that never ended, of {FORKS}");
}
