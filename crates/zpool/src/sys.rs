//! The OS boundary of the allocator crate: every `libc` call lives here.
//!
//! Contract of [`PageArena`]:
//! - `alloc_run(n)` returns the address of `n` contiguous, page-aligned,
//!   readable and writable pages that read as zeros, or an error. `n` is in
//!   `1..=MAX_RUN_PAGES`.
//! - `free_run(addr, n)` takes back exactly a run that `alloc_run(n)`
//!   returned. The pages are released to the kernel at once
//!   (`MADV_DONTNEED`), so the process's resident set falls by `n` pages, and
//!   the run reads as zeros if it is handed out again.
//!
//! Why an arena and not one `mmap` per zspage: a pool of a few GiB holds
//! hundreds of thousands of zspages, past `vm.max_map_count` (65530), and
//! every `munmap` splits VMAs and flushes TLBs. The arena reserves big
//! `MAP_NORESERVE` chunks (one VMA each) and recycles runs through one free
//! list per run length. Virtual address space is cheap; resident memory is
//! what is given back.

use crate::sync::Mutex;
use crate::Error;
use std::ptr::NonNull;

/// Size of an OS page, and the unit of everything in the pool.
pub const PAGE_SIZE: usize = 4096;

/// Longest run the arena hands out, in pages.
pub const MAX_RUN_PAGES: usize = 16;

/// Bytes reserved per chunk of address space.
const CHUNK_BYTES: usize = 256 << 20;

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
}

/// A source of page runs; see the module documentation for its contract.
pub(crate) struct PageArena {
    inner: Mutex<ArenaInner>,
}

impl PageArena {
    pub(crate) fn new() -> PageArena {
        PageArena {
            inner: Mutex::new(ArenaInner {
                chunks: Vec::new(),
                bump: 0,
                free: (0..=MAX_RUN_PAGES).map(|_| Vec::new()).collect(),
            }),
        }
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

    /// Releases a run to the OS and keeps its addresses for reuse.
    ///
    /// # Safety
    /// `addr` and `n` must be a run returned by `alloc_run(n)` on this arena
    /// and not freed since; nothing may access it after this call.
    /// `touched` says whether any byte of the run was written since
    /// `alloc_run`; an untouched run holds no resident page, so the system
    /// call (and, with several threads, its TLB shootdown) is skipped.
    pub(crate) unsafe fn free_run(&self, addr: NonNull<u8>, n: usize, touched: bool) {
        if touched {
            // SAFETY: the caller guarantees the run is ours, whole and unused.
            unsafe { release(addr, n * PAGE_SIZE) };
        }
        self.inner.lock().free[n].push(addr.as_ptr() as usize);
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

/// Resident set size of this process in bytes, from `/proc/self/statm`.
pub fn rss_bytes() -> std::io::Result<u64> {
    let s = std::fs::read_to_string("/proc/self/statm")?;
    let resident: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| std::io::Error::other("unexpected /proc/self/statm format"))?;
    Ok(resident * PAGE_SIZE as u64)
}
