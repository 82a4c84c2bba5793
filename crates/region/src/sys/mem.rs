//! Mappings of our own memory: `mmap`, `madvise`, `munmap`, `mincore`,
//! and reads of our own pages that fail instead of crashing.

use std::io;

use super::PAGE_SIZE;

/// Maps `len` bytes of private anonymous read-write memory.
pub fn map_anon(len: usize) -> io::Result<usize> {
    // SAFETY: a new anonymous mapping at an address of the kernel's choice
    // aliases nothing; the result is checked for MAP_FAILED.
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
        return Err(io::Error::last_os_error());
    }
    Ok(p as usize)
}

/// A fresh anonymous read-write mapping at exactly `addr` (`MAP_FIXED`).
///
/// # Safety
/// Whatever was mapped at `addr..addr + len` is replaced: the caller must
/// own that range and nothing may still use it.
pub unsafe fn map_anon_at(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: the caller owns the range (function contract).
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `madvise(MADV_NOHUGEPAGE)`: the pager works in 4 KiB pages; a huge
/// page (a THP fault or a khugepaged collapse) would be evicted and
/// tracked as 512 unrelated pages.
pub fn no_huge_pages(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: only changes the huge-page policy of our own mapping; no
    // contents are affected.
    unsafe { madvise(addr, len, libc::MADV_NOHUGEPAGE) }
}

/// `madvise(2)` with `advice` on `[addr, addr+len)`.
///
/// # Safety
/// As `advice` requires: one that drops pages needs a range whose contents
/// may be lost.
pub(super) unsafe fn madvise(addr: usize, len: usize, advice: i32) -> io::Result<()> {
    // SAFETY: per the caller's contract; the kernel checks the range.
    let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Unmaps a range.
///
/// # Safety
/// Nothing may access `[addr, addr+len)` afterwards.
pub unsafe fn unmap(addr: usize, len: usize) {
    // SAFETY: per the caller's contract.
    unsafe { libc::munmap(addr as *mut libc::c_void, len) };
}

/// `madvise(MADV_DONTNEED)`: drops the pages of the range (they read as
/// zeros, or fault to the handler, afterwards). On a registered range with
/// EVENT_REMOVE this blocks until the handler has read the remove event.
///
/// # Safety
/// The range must be private anonymous memory whose contents may be lost.
pub unsafe fn dontneed(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: per the caller's contract.
    unsafe { madvise(addr, len, libc::MADV_DONTNEED) }
}

/// Copies the pages at our own addresses `pages` into consecutive pages of
/// `dst` (`pages.len()` pages) with `process_vm_readv`, one system call per
/// 1024 pages: if a page was unmapped meanwhile this fails with EFAULT
/// instead of crashing, and missing pages fault to the handler like any
/// kernel access.
pub fn read_own_pages(pages: &[usize], dst: &mut [u8]) -> io::Result<()> {
    assert_eq!(
        dst.len(),
        pages.len() * PAGE_SIZE,
        "one page of dst per address"
    );
    for (addrs, out) in pages.chunks(1024).zip(dst.chunks_mut(1024 * PAGE_SIZE)) {
        let local = libc::iovec {
            iov_base: out.as_mut_ptr().cast(),
            iov_len: out.len(),
        };
        let remote: Vec<libc::iovec> = addrs
            .iter()
            .map(|&a| libc::iovec {
                iov_base: a as *mut libc::c_void,
                iov_len: PAGE_SIZE,
            })
            .collect();
        // SAFETY: `local` describes writable memory we own exclusively; the
        // kernel validates every remote range against our address space
        // and returns an error for unmapped parts. The calling thread's id,
        // not the process's: the process id names the leader, which may
        // have exited (a zombie has no memory to read) while we run.
        let r = unsafe {
            libc::process_vm_readv(
                libc::gettid(),
                &local,
                1,
                remote.as_ptr(),
                remote.len() as _,
                0,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        if r as usize != out.len() {
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
    }
    Ok(())
}

/// Reads of our own pages that [`read_own_pages`] cannot make: a page of a
/// mapping the program made inaccessible (`mprotect(PROT_NONE)`: the JVM
/// and Go protect parts of their heaps so) fails there with EFAULT, while
/// `/proc/self/mem` reads it, the kernel forcing the access as for a
/// debugger. A missing page fails here (the kernel's forced access does
/// not wait for a userfaultfd handler) instead of faulting to the handler.
/// The file is opened at the first read, at a guarded number
/// (`uzswap_os::fdguard`), and closed with the value: an evictor holds one
/// for a batch, so a forked child never inherits one naming its parent.
#[derive(Default)]
pub struct ForcedRead {
    /// The mark before the file: unmarked first, then closed.
    file: Option<(uzswap_os::fdguard::Mark, std::fs::File)>,
}

impl ForcedRead {
    /// Copies our own page at `addr` into `dst` (one page).
    pub fn read_page(&mut self, addr: usize, dst: &mut [u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        assert_eq!(dst.len(), PAGE_SIZE, "one page");
        if self.file.is_none() {
            let f = std::fs::File::open("/proc/self/mem")?;
            self.file = Some(uzswap_os::fdguard::guard(f));
        }
        let (_, f) = self.file.as_ref().expect("opened above");
        f.read_exact_at(dst, addr as u64)
    }
}

/// Pages of `[addr, addr+len)` resident in memory, by `mincore(2)`.
pub fn mincore_count(addr: usize, len: usize) -> io::Result<usize> {
    Ok(mincore(addr, len)?.into_iter().filter(|&m| m).count())
}

/// Per page of `[addr, addr + len)`: whether the kernel has it mapped (a
/// page of zeros mapped by `UFFDIO_ZEROPAGE` counts; a write-protect or
/// poison marker does not).
pub fn mincore(addr: usize, len: usize) -> io::Result<Vec<bool>> {
    let n = len.div_ceil(PAGE_SIZE);
    let mut v = vec![0u8; n];
    // SAFETY: `v` has one byte per page of the range, as mincore requires;
    // the kernel checks the range itself.
    let r = unsafe { libc::mincore(addr as *mut libc::c_void, len, v.as_mut_ptr()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v.into_iter().map(|b| b & 1 != 0).collect())
}
