//! The staging area: where the evictor moves pages out of a region with
//! `UFFDIO_MOVE`, so that dropping them raises no remove event.

use std::io;

use super::mem::{dontneed, madvise, map_anon, map_anon_at, mincore_count, no_huge_pages, unmap};
use super::uffd::{api, feature, open_raw, Uffd, REGISTER_MODE_MISSING};
use super::{replace_fd, PAGE_SIZE};
use uzswap_os::fdguard::GuardedFd;

/// What became of a page [`Staging::take`] tried to move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// It is in the slot; the region has no page there any more.
    Moved,
    /// The region had no page there (the program discarded it).
    Gone,
    /// The kernel refused (this errno): the page is where it was. EBUSY
    /// for a page shared with a forked child, EINVAL for a mapping whose
    /// protection or flags differ from the staging area's.
    Refused(i32),
}

/// Where the evictor drops pages without a remove event: `pages` pages of
/// anonymous memory registered with a userfaultfd of its own that has
/// `UFFDIO_MOVE` and no events. A page moved here from a region leaves it
/// with no `MADV_DONTNEED` on the region, so the region's descriptor
/// reports nothing (each remove event is a round trip through a handler,
/// and until the thread that raised it runs again every resolving ioctl
/// fails with EAGAIN); the staging pages are then dropped together, which
/// reports nothing either (this descriptor has no events).
///
/// One page per ioctl, never with `ALLOW_SRC_HOLES`: on Linux 6.18 the
/// move loop keeps its error across retries, so a move that met a
/// transient EAGAIN (the page table changed under it) and then found a
/// hole at the source "moves the hole" forever, spinning in the kernel
/// (seen here: a test hung with the evictor at 100 % system time in
/// `move_pages`). Without holes, the same sequence ends: a page that did
/// move after the EAGAIN is reported as EEXIST at its (formerly empty)
/// destination, which [`Staging::take`] checks with `mincore`.
#[derive(Debug)]
pub struct Staging {
    uffd: Uffd,
    base: usize,
    pages: usize,
}

impl Staging {
    /// None if the kernel lacks `UFFDIO_MOVE` or the area cannot be set up
    /// (the evictor then drops pages with `MADV_DONTNEED` only).
    pub fn new(pages: usize) -> Option<Staging> {
        let fd = open_raw(None).ok()?;
        let got = api(&fd, feature::MOVE).ok()?;
        if got & feature::MOVE == 0 {
            return None;
        }
        let uffd = Uffd {
            fd: GuardedFd::new(fd),
            features: feature::MOVE,
            // Moves a page at a time: none crosses a chunk edge.
            edge: 0,
        };
        let len = pages * PAGE_SIZE;
        let base = map_anon(len).ok()?;
        let _ = no_huge_pages(base, len);
        // A forked child gets no copy: the area is the evictor's alone.
        // SAFETY: our own fresh mapping; MADV_DONTFORK changes no contents.
        let dontfork = unsafe { madvise(base, len, libc::MADV_DONTFORK) };
        if dontfork.is_err()
            || uffd
                .register_mode(base, len, REGISTER_MODE_MISSING)
                .is_err()
        {
            // SAFETY: our own fresh mapping, never handed out.
            unsafe { unmap(base, len) };
            return None;
        }
        Some(Staging { uffd, base, pages })
    }

    /// Pages the area holds.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// In a forked child: the area was not copied (`MADV_DONTFORK`) and its
    /// descriptor is the parent's. Maps the area again at the same address,
    /// registered with a new descriptor of its own in place of the old one.
    pub fn renew(&self) -> io::Result<()> {
        let len = self.pages * PAGE_SIZE;
        // SAFETY: the range is the staging area's, which this child did not
        // inherit (MADV_DONTFORK): nothing of the child's lives there.
        unsafe { map_anon_at(self.base, len) }?;
        let _ = no_huge_pages(self.base, len);
        // SAFETY: our own fresh mapping; MADV_DONTFORK changes no contents.
        unsafe { madvise(self.base, len, libc::MADV_DONTFORK) }?;
        let fd = open_raw(None).map_err(|e| io::Error::other(e.to_string()))?;
        api(&fd, feature::MOVE)?;
        replace_fd(&fd, &self.uffd.fd)?;
        self.uffd
            .register_mode(self.base, len, REGISTER_MODE_MISSING)
    }

    /// Moves the page at `src` into the empty slot `slot`.
    pub fn take(&self, slot: usize, src: usize) -> Taken {
        assert!(
            slot < self.pages,
            "slot {slot} is past the staging area of {} pages",
            self.pages
        );
        let dst = self.base + slot * PAGE_SIZE;
        match self.uffd.move_pages(dst, src, PAGE_SIZE) {
            Ok(()) => Taken::Moved,
            Err(e) if e.errno == libc::ENOENT => Taken::Gone,
            // The slot was empty, so only this move can have filled it
            // (see the type's docs); mincore tells.
            Err(e) if e.errno == libc::EEXIST => match mincore_count(dst, PAGE_SIZE) {
                Ok(1) => Taken::Moved,
                _ => Taken::Refused(e.errno),
            },
            Err(e) => Taken::Refused(e.errno),
        }
    }

    /// The page in slot `slot`.
    ///
    /// # Safety
    /// The slot must hold a page ([`Staging::take`] gave `Moved` and no
    /// [`Staging::clear`] since): an empty slot is a missing page of a
    /// descriptor nobody serves, and reading it would wait forever. The
    /// caller is the only user of the area meanwhile.
    pub unsafe fn slot(&self, slot: usize) -> &[u8] {
        assert!(
            slot < self.pages,
            "slot {slot} is past the staging area of {} pages",
            self.pages
        );
        // SAFETY: per the contract, the slot is mapped, private to the
        // caller, and stays so while the borrow of `self` lives.
        unsafe {
            std::slice::from_raw_parts((self.base + slot * PAGE_SIZE) as *const u8, PAGE_SIZE)
        }
    }

    /// Drops the first `n` slots (no event: the area's descriptor has
    /// none); they are empty afterwards.
    pub fn clear(&self, n: usize) {
        if n > 0 {
            // SAFETY: staging memory is ours alone; its pages were stored
            // (or are clean copies of stored pages) before they moved.
            let _ = unsafe { dontneed(self.base, n * PAGE_SIZE) };
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // SAFETY: the area is ours and nothing refers to it any more.
        unsafe { unmap(self.base, self.pages * PAGE_SIZE) };
    }
}
