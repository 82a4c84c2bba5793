//! The OS boundary of the allocator crate: every `libc` call lives here.
//!
//! Contract of [`PageArena`]:
//! - `alloc_run(n)` returns the address of `n` contiguous, page-aligned,
//!   readable and writable pages that read as zeros, or an error. `n` is in
//!   `1..=MAX_RUN_PAGES`.
//! - `free_run(addr, n)` takes back exactly a run that `alloc_run(n)`
//!   returned. Its pages are released to the kernel (`MADV_DONTNEED`), so the
//!   process's resident set falls by `n` pages, and the run reads as zeros if
//!   it is handed out again.
//! - Release is batched: a freed run waits in a short *pending* list until
//!   [`RELEASE_BATCH_PAGES`] pages are pending, and the whole batch then goes
//!   back in one `process_madvise` call (runs adjacent in memory merged).
//!   Measured here, `madvise` of a 4-page run costs about 4 µs, most of it
//!   per call (entry, TLB flush); one call per batch of 16 such runs costs
//!   about half per run. And a release made by another thread than the one
//!   using the pool costs that thread a TLB-shootdown interrupt per call (a
//!   VM exit here): batches of 256 pages rather than 64 raised exclusive
//!   loads on machine code from 0.89 to 0.91 of the raw decompressor
//!   (docs/BENCHMARKS.md). `free_run` hands the full batch to its caller,
//!   which releases it at once ([`PageArena::release`]) or has a background
//!   thread do it (zsmalloc's compactor), off the path that freed the
//!   object. So at most `RELEASE_BATCH_PAGES` pages per arena, plus the
//!   batches being released, are freed but still resident
//!   ([`PageArena::releasing_pages`]); [`PageArena::flush`] releases them
//!   all at once (compaction calls it).
//!
//! Why an arena and not one `mmap` per zspage: a pool of a few GiB holds
//! hundreds of thousands of zspages, past `vm.max_map_count` (65530), and
//! every `munmap` splits VMAs and flushes TLBs. The arena reserves big
//! `MAP_NORESERVE` chunks (one VMA each) and recycles runs through one free
//! list per run length. Virtual address space is cheap; resident memory is
//! what is given back.

use crate::Error;
use std::ptr::NonNull;
use uzswap_os::fork::{AfterFork, Side};
use uzswap_os::sync::{Mutex, MutexGuard};
use uzswap_os::PAGE_SIZE;

/// Longest run the arena hands out, in pages.
pub const MAX_RUN_PAGES: usize = 16;

/// Bytes reserved per chunk of address space.
const CHUNK_BYTES: usize = 256 << 20;

/// Freed pages an arena collects before releasing them in one call (two
/// under the model checker, so that its small scenarios hand batches to the
/// background thread too). At most this many pages (1 MiB) per arena stay
/// resident after their objects were freed, until the batch fills or the
/// pool is compacted. Fewer would cost more: each release call interrupts
/// the CPUs running the pool's threads (a TLB shootdown).
pub const RELEASE_BATCH_PAGES: usize = if cfg!(feature = "shuttle") { 2 } else { 256 };

/// Freed runs waiting to be given back to the kernel together. Obtained
/// from [`PageArena::free_run`], and must be passed to
/// [`PageArena::release`] of the same arena (until then the runs are
/// neither resident-free nor reusable).
#[must_use = "a batch must be passed to PageArena::release"]
pub(crate) struct ReleaseBatch {
    runs: Vec<(usize, usize)>,
    pages: usize,
}

impl ReleaseBatch {
    /// Pages in the batch.
    pub(crate) fn pages(&self) -> usize {
        self.pages
    }
}

/// Run lists of released batches an arena keeps for reuse.
const SPARE_LISTS: usize = 4;

struct Chunk {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: a Chunk is an owned mapping; its address may be used from any
// thread (the memory behind it is guarded by the arena's users).
unsafe impl Send for Chunk {}

struct ArenaInner {
    chunks: Vec<Chunk>,
    /// Bytes of the last chunk already handed out.
    bump: usize,
    /// Free runs by length: `free[n]` holds runs of exactly `n` pages.
    free: Vec<Vec<usize>>,
    /// Freed runs (address, pages) not yet released to the kernel.
    pending: Vec<(usize, usize)>,
    pending_pages: usize,
    /// Emptied run lists of released batches, reused for the next pending
    /// lists (so neither freeing nor releasing allocates).
    spare_lists: Vec<Vec<(usize, usize)>>,
    /// Pages of batches handed out by `free_run` and not yet released.
    in_flight_pages: usize,
    /// Batches released, for the statistics.
    batches: u64,
}

/// A source of page runs; see the module documentation for its contract.
pub(crate) struct PageArena {
    inner: Mutex<ArenaInner>,
}

/// The arena's lock, taken for a fork (see `Zpool::fork_prepare`).
pub(crate) struct ArenaForkGuard<'a>(MutexGuard<'a, ArenaInner>);

impl ArenaForkGuard<'_> {
    /// Pages of the batches handed out by `free_run` and not released yet.
    /// A batch is either queued where a thread that survives the fork finds
    /// it (zsmalloc's compactor state) or in the hands of a thread
    /// releasing it outside every lock; a fork in the second case would
    /// lose its runs in the child, and leave `flush` there waiting for them
    /// forever. So `fork_prepare` retries until every batch is queued.
    pub(crate) fn in_flight_pages(&self) -> usize {
        self.0.in_flight_pages
    }

    /// Keeps the lock held past this guard, until
    /// [`PageArena::unlock_after_fork`].
    pub(crate) fn keep(self) {
        std::mem::forget(self.0);
    }
}

impl PageArena {
    pub(crate) fn new() -> PageArena {
        PageArena {
            inner: Mutex::new(ArenaInner {
                chunks: Vec::new(),
                bump: 0,
                free: (0..=MAX_RUN_PAGES).map(|_| Vec::new()).collect(),
                pending: Vec::new(),
                pending_pages: 0,
                spare_lists: Vec::new(),
                in_flight_pages: 0,
                batches: 0,
            }),
        }
    }

    /// Locks the arena for a fork; see [`ArenaForkGuard`].
    pub(crate) fn lock_for_fork(&self) -> ArenaForkGuard<'_> {
        ArenaForkGuard(self.inner.lock())
    }

    /// Releases the lock that [`ArenaForkGuard::keep`] kept.
    ///
    /// # Safety
    /// As [`AfterFork::after_fork`]: this thread kept the lock, and is the
    /// only thread with `Side::Child`.
    pub(crate) unsafe fn unlock_after_fork(&self, side: Side) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.inner.after_fork(side) };
    }

    /// Returns `n` zeroed contiguous pages.
    pub(crate) fn alloc_run(&self, n: usize) -> Result<NonNull<u8>, Error> {
        assert!((1..=MAX_RUN_PAGES).contains(&n), "run of {n} pages");
        let len = n * PAGE_SIZE;
        let mut a = self.inner.lock();
        if let Some(addr) = a.free[n].pop() {
            return Ok(NonNull::new(addr as *mut u8).expect("arena address is non-null"));
        }
        let need_chunk = match a.chunks.last() {
            None => true,
            Some(c) => a.bump + len > c.len,
        };
        if need_chunk {
            // The tail of the old chunk is too short for this run: give it to
            // the free lists in the largest runs it holds, so it is not lost.
            if let Some(c) = a.chunks.last() {
                let (base, clen) = (c.base.as_ptr() as usize, c.len);
                let mut off = a.bump;
                while off < clen {
                    let k = ((clen - off) / PAGE_SIZE).min(MAX_RUN_PAGES);
                    a.free[k].push(base + off);
                    off += k * PAGE_SIZE;
                }
            }
            let base = map_reserve(CHUNK_BYTES)?;
            a.chunks.push(Chunk {
                base,
                len: CHUNK_BYTES,
            });
            a.bump = 0;
        }
        let c = a.chunks.last().expect("a chunk was just ensured");
        let addr = c.base.as_ptr() as usize + a.bump;
        a.bump += len;
        Ok(NonNull::new(addr as *mut u8).expect("arena address is non-null"))
    }

    /// Takes a run back. An untouched run is reusable at once; a touched one
    /// joins the pending list, and when that holds a batch's worth of pages
    /// the batch is returned, for the caller to pass to [`Self::release`]
    /// (now or from another thread).
    ///
    /// # Safety
    /// `addr` and `n` must be a run returned by `alloc_run(n)` on this arena
    /// and not freed since; nothing may access it after this call.
    /// `touched` says whether any byte of the run was written since
    /// `alloc_run`; an untouched run holds no resident page, so the system
    /// call (and, with several threads, its TLB shootdown) is skipped.
    #[must_use = "a returned batch must be passed to PageArena::release"]
    pub(crate) unsafe fn free_run(
        &self,
        addr: NonNull<u8>,
        n: usize,
        touched: bool,
    ) -> Option<ReleaseBatch> {
        let mut a = self.inner.lock();
        if !touched {
            a.free[n].push(addr.as_ptr() as usize);
            return None;
        }
        a.pending.push((addr.as_ptr() as usize, n));
        a.pending_pages += n;
        if a.pending_pages < RELEASE_BATCH_PAGES {
            return None;
        }
        Some(Self::take_pending(&mut a))
    }

    fn take_pending(a: &mut ArenaInner) -> ReleaseBatch {
        let pages = std::mem::take(&mut a.pending_pages);
        a.in_flight_pages += pages;
        let next = a
            .spare_lists
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(RELEASE_BATCH_PAGES));
        ReleaseBatch {
            runs: std::mem::replace(&mut a.pending, next),
            pages,
        }
    }

    /// Gives a batch's pages back to the kernel and makes its runs
    /// reusable.
    pub(crate) fn release(&self, mut b: ReleaseBatch) {
        // SAFETY: every run of the batch was freed through `free_run` (whose
        // contract says nobody uses it any more) and is not handed out again
        // before the loop below puts it back on a free list.
        unsafe { release_runs(&mut b.runs) };
        let mut a = self.inner.lock();
        for &(addr, n) in &b.runs {
            a.free[n].push(addr);
        }
        a.in_flight_pages -= b.pages;
        a.batches += 1;
        // At most one list per batch that can be in flight at once.
        if a.spare_lists.len() < SPARE_LISTS {
            b.runs.clear();
            a.spare_lists.push(b.runs);
        }
    }

    /// Releases the pending runs now, and waits for batches other threads
    /// are releasing, so the resident set has fallen when it returns.
    pub(crate) fn flush(&self) {
        let b = {
            let mut a = self.inner.lock();
            (a.pending_pages > 0).then(|| Self::take_pending(&mut a))
        };
        if let Some(b) = b {
            self.release(b);
        }
        while self.inner.lock().in_flight_pages > 0 {
            uzswap_os::sync::thread::yield_now();
        }
    }

    /// Freed pages not yet given back to the kernel (pending or in a batch
    /// being released), and the batches released so far.
    pub(crate) fn releasing_pages(&self) -> (u64, u64) {
        let a = self.inner.lock();
        ((a.pending_pages + a.in_flight_pages) as u64, a.batches)
    }

    /// Gives `n` pages at `addr` (inside a run that stays allocated) back to
    /// the OS; they read as zeros when touched again.
    ///
    /// # Safety
    /// The pages must lie inside a run handed out by this arena and not
    /// freed, and nobody may access them concurrently.
    pub(crate) unsafe fn decommit(&self, addr: NonNull<u8>, n: usize) {
        // SAFETY: forwarded from the caller's contract.
        unsafe { release(addr, n * PAGE_SIZE) };
    }

    /// Bytes of bookkeeping the arena keeps on the heap.
    pub(crate) fn metadata_bytes(&self) -> usize {
        let a = self.inner.lock();
        a.free.iter().map(|v| v.capacity() * 8).sum::<usize>()
            + (a.pending.capacity() + a.spare_lists.iter().map(Vec::capacity).sum::<usize>())
                * std::mem::size_of::<(usize, usize)>()
            + a.chunks.capacity() * std::mem::size_of::<Chunk>()
    }
}

impl Drop for PageArena {
    fn drop(&mut self) {
        for c in self.inner.get_mut().chunks.drain(..) {
            // SAFETY: the chunk was mapped by map_reserve with this length
            // and the arena is being dropped, so no run is in use any more
            // (every pool frees its runs or is dropped with the arena).
            unsafe { libc::munmap(c.base.as_ptr().cast(), c.len) };
        }
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Reserves `len` bytes of zeroed, lazily backed, read-write memory.
fn map_reserve(len: usize) -> Result<NonNull<u8>, Error> {
    // SAFETY: an anonymous private mapping at an address of the kernel's
    // choosing aliases nothing; the result is checked for MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::OutOfMemory {
            bytes: len,
            errno: errno(),
        });
    }
    Ok(NonNull::new(p.cast()).expect("mmap returned a non-null address"))
}

/// Gives the pages of `[addr, addr+len)` back to the kernel; they read as
/// zeros afterwards.
///
/// # Safety
/// The range must be page-aligned memory of a private anonymous mapping that
/// nobody reads or writes concurrently.
unsafe fn release(addr: NonNull<u8>, len: usize) {
    // SAFETY: per the contract above; MADV_DONTNEED on private anonymous
    // memory only drops its pages (they come back zero-filled).
    let r = unsafe { libc::madvise(addr.as_ptr().cast(), len, libc::MADV_DONTNEED) };
    debug_assert_eq!(r, 0, "madvise(MADV_DONTNEED) failed: errno {}", errno());
}

/// Gives the pages of every run back to the kernel, runs adjacent in memory
/// merged, in one `process_madvise` call per 256 ranges (a batch) where the kernel
/// allows it for the calling process (Linux 6.13 and later), else in one
/// `madvise` per range. Sorts `runs` by address. Allocates nothing, so a
/// forked child may call it whatever the parent's threads held.
///
/// # Safety
/// Every run must be page-aligned memory of a private anonymous mapping that
/// nobody reads or writes concurrently.
unsafe fn release_runs(runs: &mut [(usize, usize)]) {
    const IOVECS: usize = 256;
    runs.sort_unstable();
    let empty = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    let mut iov = [empty; IOVECS];
    let mut n = 0;
    for &(addr, pages) in runs.iter() {
        let len = pages * PAGE_SIZE;
        if n > 0 && iov[n - 1].iov_base as usize + iov[n - 1].iov_len == addr {
            iov[n - 1].iov_len += len;
            continue;
        }
        if n == IOVECS {
            // SAFETY: forwarded from this function's contract.
            unsafe { advise_dontneed(&iov) };
            n = 0;
        }
        iov[n] = libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        };
        n += 1;
    }
    // SAFETY: forwarded from this function's contract.
    unsafe { advise_dontneed(&iov[..n]) };
}

/// `MADV_DONTNEED` on every range: one `process_madvise` call, or one
/// `madvise` per range where that is refused or stops part way.
///
/// # Safety
/// As for [`release_runs`].
unsafe fn advise_dontneed(iov: &[libc::iovec]) {
    use std::sync::atomic::{AtomicBool, Ordering};
    // Cleared when the kernel (older than 6.13) or a seccomp filter refuses the
    // call, so that it is not tried for every batch.
    static SUPPORTED: AtomicBool = AtomicBool::new(true);
    if iov.is_empty() {
        return;
    }
    let total: usize = iov.iter().map(|v| v.iov_len).sum();
    let fd = self_pidfd().filter(|_| SUPPORTED.load(Ordering::Relaxed));
    let done = match fd {
        // SAFETY: the ranges are ours per the contract; the pidfd names this
        // very process (see `self_pidfd`).
        Some(fd) => unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                fd,
                iov.as_ptr(),
                iov.len(),
                libc::MADV_DONTNEED,
                0u32,
            )
        },
        None => -1,
    };
    if usize::try_from(done).ok() == Some(total) {
        return;
    }
    if fd.is_some() && done < 0 && matches!(errno(), libc::EINVAL | libc::ENOSYS | libc::EPERM) {
        SUPPORTED.store(false, Ordering::Relaxed);
    }
    // Advising a range twice is harmless.
    for v in iov {
        // SAFETY: per this function's contract.
        unsafe {
            release(
                NonNull::new(v.iov_base.cast()).expect("non-null"),
                v.iov_len,
            )
        };
    }
}

/// A pidfd for this process, opened once per process (a forked child opens
/// its own and closes the copy of its parent's, which names the parent), or
/// `None` if pidfds are not available. High in the table and guarded
/// (`uzswap_os::fdguard`): the pool lives in a program's process.
fn self_pidfd() -> Option<i32> {
    use std::sync::atomic::{AtomicI64, Ordering};
    // (pid << 32) | fd of the last pidfd opened; 0 for none yet.
    static CACHED: AtomicI64 = AtomicI64::new(0);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let c = CACHED.load(Ordering::Acquire);
    if c != 0 && (c >> 32) as i32 == pid {
        let fd = c as i32;
        return (fd >= 0).then_some(fd);
    }
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor
    // (always close-on-exec).
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    let fd = if fd < 0 {
        -1
    } else {
        let fd = uzswap_os::fdguard::lift_raw(fd);
        uzswap_os::fdguard::mark(fd);
        fd
    };
    let new = (i64::from(pid) << 32) | i64::from(fd as u32);
    if CACHED
        .compare_exchange(c, new, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        if fd >= 0 {
            // Another thread cached its own descriptor first: use that one.
            uzswap_os::fdguard::unmark(fd);
            // SAFETY: fd was opened above and is not shared.
            unsafe { libc::close(fd) };
        }
        return self_pidfd();
    }
    let inherited = c as i32;
    if c != 0 && inherited >= 0 {
        // The copy of the parent's pidfd this process inherited: no thread
        // uses it (each looks at the pid beside it first).
        uzswap_os::fdguard::unmark(inherited);
        // SAFETY: our copy of the parent's descriptor, named by no one now.
        unsafe { libc::close(inherited) };
    }
    (fd >= 0).then_some(fd)
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;

    /// Which of the `n` pages at `addr` are resident (mincore).
    fn resident(addr: usize, n: usize) -> Vec<bool> {
        let mut v = vec![0u8; n];
        // SAFETY: the range is mapped (an arena chunk) and v has n entries.
        let r = unsafe { libc::mincore(addr as *mut libc::c_void, n * PAGE_SIZE, v.as_mut_ptr()) };
        assert_eq!(r, 0, "mincore: errno {}", errno());
        v.iter().map(|b| b & 1 == 1).collect()
    }

    #[test]
    fn freed_runs_wait_for_a_batch_then_leave_memory_and_read_zero() {
        let arena = PageArena::new();
        let runs: Vec<NonNull<u8>> = (0..RELEASE_BATCH_PAGES / 2)
            .map(|_| arena.alloc_run(2).unwrap())
            .collect();
        for r in &runs {
            // SAFETY: a fresh 2-page run of ours.
            unsafe { std::ptr::write_bytes(r.as_ptr(), 0xA5, 2 * PAGE_SIZE) };
        }
        let mut batch = None;
        for (i, r) in runs.iter().enumerate() {
            // SAFETY: each run is freed once and not used afterwards.
            let b = unsafe { arena.free_run(*r, 2, true) };
            if i + 1 < runs.len() {
                assert!(b.is_none(), "a batch after only {} pages", 2 * (i + 1));
            } else {
                batch = b;
            }
        }
        let batch = batch.expect("the 64th page completes a batch");
        assert_eq!(batch.pages, RELEASE_BATCH_PAGES);
        assert_eq!(arena.releasing_pages(), (RELEASE_BATCH_PAGES as u64, 0));
        // Freed but not released yet: still resident.
        assert!(runs
            .iter()
            .all(|r| resident(r.as_ptr() as usize, 2) == [true, true]));
        arena.release(batch);
        assert_eq!(arena.releasing_pages(), (0, 1));
        for r in &runs {
            assert_eq!(resident(r.as_ptr() as usize, 2), [false, false]);
        }
        // Reused runs read as zeros.
        for _ in 0..runs.len() {
            let r = arena.alloc_run(2).unwrap();
            assert!(runs.contains(&r), "a released run is reused");
            // SAFETY: a 2-page run of ours, just handed out.
            let bytes = unsafe { std::slice::from_raw_parts(r.as_ptr(), 2 * PAGE_SIZE) };
            assert!(bytes.iter().all(|&b| b == 0));
        }
    }

    /// More scattered ranges than one call takes, among pages that stay:
    /// exactly the given ones leave memory.
    #[test]
    fn scattered_runs_are_released_and_their_neighbours_kept() {
        let arena = PageArena::new();
        let base = arena.alloc_run(16).unwrap().as_ptr() as usize;
        let mut pages = vec![base];
        for _ in 0..20 {
            pages.push(arena.alloc_run(16).unwrap().as_ptr() as usize);
        }
        for &p in &pages {
            // SAFETY: runs of ours, 16 pages each.
            unsafe { std::ptr::write_bytes(p as *mut u8, 7, 16 * PAGE_SIZE) };
        }
        // Every other page of every run: 160 separate ranges, plus one
        // whole run given as two adjacent halves (merged into one range).
        let mut runs: Vec<(usize, usize)> = pages[..20]
            .iter()
            .flat_map(|&p| (0..16).step_by(2).map(move |i| (p + i * PAGE_SIZE, 1)))
            .collect();
        runs.push((pages[20] + 8 * PAGE_SIZE, 8));
        runs.push((pages[20], 8));
        runs.reverse();
        // SAFETY: the runs are ours and nobody touches them meanwhile.
        unsafe { release_runs(&mut runs) };
        for &p in &pages[..20] {
            let want: Vec<bool> = (0..16).map(|i| i % 2 == 1).collect();
            assert_eq!(resident(p, 16), want);
            // SAFETY: a kept page of ours.
            assert_eq!(unsafe { *((p + PAGE_SIZE) as *const u8) }, 7);
        }
        assert_eq!(resident(pages[20], 16), [false; 16]);
    }

    #[test]
    fn flush_releases_a_partial_batch() {
        let arena = PageArena::new();
        let r = arena.alloc_run(3).unwrap();
        // SAFETY: a fresh 3-page run of ours.
        unsafe { std::ptr::write_bytes(r.as_ptr(), 1, 3 * PAGE_SIZE) };
        // SAFETY: freed once, not used afterwards.
        assert!(unsafe { arena.free_run(r, 3, true) }.is_none());
        assert_eq!(arena.releasing_pages().0, 3);
        arena.flush();
        assert_eq!(arena.releasing_pages(), (0, 1));
        assert_eq!(resident(r.as_ptr() as usize, 3), [false; 3]);
    }

    /// A forked child releases its own pages, never its parent's. (The
    /// pidfd the parent cached names the parent; `self_pidfd` opens a new
    /// one per process, and the kernel also refuses `MADV_DONTNEED` through
    /// another process's pidfd, which sends the child to the `madvise`
    /// fallback.)
    #[test]
    fn a_forked_child_releases_its_own_pages() {
        let arena = PageArena::new();
        let r = arena.alloc_run(1).unwrap();
        let page = r.as_ptr() as usize;
        // SAFETY: a fresh page of ours.
        unsafe { std::ptr::write_bytes(r.as_ptr(), 0xAA, PAGE_SIZE) };
        assert!(self_pidfd().is_some(), "pidfd_open is available here");
        // SAFETY: the child only makes system calls (release_runs allocates
        // nothing) and reads its own copy of the page, then leaves with
        // _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: errno {}", errno());
        if pid == 0 {
            // SAFETY: the child's copy of the page, used by nobody else.
            unsafe { release_runs(&mut [(page, 1)]) };
            // SAFETY: as above; the page is still mapped.
            let first = unsafe { *(page as *const u8) };
            // SAFETY: _exit ends the child without running the parent's
            // destructors.
            unsafe { libc::_exit(i32::from(first != 0)) };
        }
        let mut status = 0;
        // SAFETY: pid is our child; status is a valid out-pointer.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child's page was not released (status {status:#x})"
        );
        // SAFETY: our page, still allocated.
        let parent = unsafe { std::slice::from_raw_parts(page as *const u8, PAGE_SIZE) };
        assert!(
            parent.iter().all(|&b| b == 0xAA),
            "the child released the parent's page"
        );
    }
}
