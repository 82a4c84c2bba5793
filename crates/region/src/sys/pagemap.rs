//! `PAGEMAP_SCAN` (`linux/fs.h`, Linux 6.7) on our own page map: which of
//! our pages map the shared zero page.

use std::io;
use std::os::fd::AsRawFd;

use super::mem::map_anon;
use super::PAGE_SIZE;

/// `struct pm_scan_arg`.
#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `struct page_region`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}

/// `PAGE_IS_PFNZERO`: the page table maps the shared zero page.
const PAGE_IS_PFNZERO: u64 = 1 << 5;
/// `PAGEMAP_SCAN`: `_IOWR('f', 16, struct pm_scan_arg)`.
const PAGEMAP_SCAN: u64 =
    (3 << 30) | ((std::mem::size_of::<PmScanArg>() as u64) << 16) | ((b'f' as u64) << 8) | 16;

/// Finds which of our own pages map the shared zero page (`PAGEMAP_SCAN`
/// on `/proc/self/pagemap`): pages a first touch or a read mapped as zeros
/// and nothing wrote since. Dropping one frees no memory.
pub struct ZeroScan {
    /// `pagemap`'s number, guarded (`uzswap_os::fdguard`; before it, so
    /// that it is unmarked first).
    mark: uzswap_os::fdguard::Mark,
    pagemap: std::fs::File,
    regions: Vec<PageRegion>,
}

impl ZeroScan {
    /// None where the kernel has no `PAGEMAP_SCAN` (it came in Linux 6.7) or
    /// `/proc` is not mounted.
    pub fn new() -> Option<ZeroScan> {
        let (mark, pagemap) =
            uzswap_os::fdguard::guard(std::fs::File::open("/proc/self/pagemap").ok()?);
        let mut z = ZeroScan {
            mark,
            pagemap,
            regions: vec![PageRegion::default(); 64],
        };
        let probe = map_anon(PAGE_SIZE).ok()?;
        let works = z.zero_runs(probe, probe + PAGE_SIZE, |_, _| {}).is_ok();
        // SAFETY: the page was mapped just above and is ours alone.
        unsafe { libc::munmap(probe as *mut libc::c_void, PAGE_SIZE) };
        works.then_some(z)
    }

    /// Opens the calling process's own `pagemap` in place of the one
    /// opened before a fork: that descriptor names the parent's memory
    /// whichever process uses it.
    pub fn renew(&mut self) -> io::Result<()> {
        let (mark, pagemap) = uzswap_os::fdguard::guard(std::fs::File::open("/proc/self/pagemap")?);
        // The old number's mark goes first, then its file.
        self.mark = mark;
        self.pagemap = pagemap;
        Ok(())
    }

    /// Calls `each(lo, hi)` for every run of pages of `[lo, hi)` that map
    /// the zero page, in address order.
    pub fn zero_runs(
        &mut self,
        lo: usize,
        hi: usize,
        mut each: impl FnMut(usize, usize),
    ) -> io::Result<()> {
        let mut at = lo as u64;
        while at < hi as u64 {
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                start: at,
                end: hi as u64,
                vec: self.regions.as_mut_ptr() as u64,
                vec_len: self.regions.len() as u64,
                category_mask: PAGE_IS_PFNZERO,
                return_mask: PAGE_IS_PFNZERO,
                ..PmScanArg::default()
            };
            // SAFETY: `arg` is a valid pm_scan_arg whose `vec` points at
            // `vec_len` writable page_region records we own; the kernel
            // only reads our page tables.
            let n = unsafe {
                libc::ioctl(
                    self.pagemap.as_raw_fd(),
                    PAGEMAP_SCAN as _,
                    &mut arg as *mut PmScanArg,
                )
            };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            for r in &self.regions[..n as usize] {
                each(r.start as usize, r.end as usize);
            }
            if arg.walk_end <= at {
                break;
            }
            at = arg.walk_end;
        }
        Ok(())
    }
}
