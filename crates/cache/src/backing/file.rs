//! [`FileBacking`], the default tier: a local file of slots, sparse,
//! owner-only, unlinked as soon as it is open. Its window read ahead is
//! `readahead.rs`'s; a fork shares the file (see the type's docs).
//!
//! A page written back must leave memory, as the kernel's swap-out frees
//! it: [`FileBacking`] reads and writes with `RWF_DONTCACHE` (Linux 6.14
//! and filesystems that support it), so the file's pages leave the page
//! cache once on disk, or, where the flag is refused, waits for its writes
//! and drops them (`sync_file_range`, `POSIX_FADV_DONTNEED`). A file left
//! in the page cache would be memory outside the budget, read back at
//! memory's speed, which no swap device gives.

use super::readahead::Ahead;
use super::{BackingStore, TierStats};
use crate::sys::{self, Advice};
use crate::PAGE_SIZE;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use uzswap_os::fork::Side;

/// The default tier: a local file of slots.
///
/// # A fork shares the file
/// At a fork the file holds the slots of pages both processes may load
/// later. It stays where it is for both of them: from the fork on, each
/// writes to a new file of its own, and reads the slots it had from the
/// old one, which neither writes nor punches again ([`SharedFile`]). A
/// process lets go of its descriptor of the old file when the last of its
/// slots there is freed, and the kernel frees the file (unlinked) when
/// the last process does. A copy of the used slots into a file of the
/// child's own, made while its parent waits, costs far more (55 MiB for
/// each Python worker forked at 32 MiB, 40-90 ms a fork from a parent with
/// 160 MiB of records, and the copy left in the page cache, dirty, for
/// every child: see "runtime memory" in docs/BENCHMARKS.md, `workers.py
/// fork`); sharing the file costs an `open` in each process. The price: a
/// slot freed in a shared file is not reused, so a process that forks
/// again and again holds the space of its earlier files until it or its
/// children free their slots there.
///
/// Slot numbers go on across files: the current file holds slots from
/// `base` on, each shared file the range it held when it was shared.
pub struct FileBacking {
    /// The current file's descriptor number, guarded: a program that closes
    /// descriptors it did not open (a daemon, a child before `exec`) must
    /// not close it (`uzswap_os::fdguard`). Before `file`: unmarked first.
    _mark: uzswap_os::fdguard::Mark,
    /// The current file. Its descriptor number never changes: a fork puts
    /// the new file's description at this number (`dup3`).
    file: File,
    /// The first slot of the current file (slots below are in
    /// `shared`). Changed only by the fork hooks, with no write in flight
    /// (the cache's `fork_prepare` waits for writeback batches); see
    /// `reads` for reads.
    base: AtomicU64,
    /// Reads under way. A read counts itself before it looks at `base`;
    /// the parent's fork hook moves `base` on, then waits until no read
    /// that may have seen the old one is left before it puts the new file
    /// at the descriptor's number (`fork_share`).
    reads: AtomicU32,
    /// Files shared with processes forked from this one or that this one
    /// was forked from, oldest first (a leaf lock, never held across I/O).
    shared: uzswap_os::lock::Mutex<Vec<SharedFile>>,
    /// The parent's next file and a second descriptor of its current one,
    /// opened before the fork ([`BackingStore::fork_share_prepare`]), so
    /// that nothing can fail in the parent after it.
    next_file: uzswap_os::lock::Mutex<Option<(File, File)>>,
    /// The window read ahead (lock order: a leaf, held to move it, never
    /// across a system call).
    ahead: uzswap_os::lock::Mutex<Ahead>,
    read_ahead_hits: AtomicU64,
    /// `RWF_DONTCACHE` is taken by the kernel and the file's filesystem
    /// (cleared at the first refusal: then the pages are dropped by hand).
    dontcache: std::sync::atomic::AtomicBool,
    path: PathBuf,
    /// Where `device_inflight` looks (the file's directory: the file itself
    /// is unlinked).
    dir: PathBuf,
}

/// Most files a process shares since forks; past it, a fork copies the
/// slots for the child instead ([`BackingStore::fork_private`]).
pub const MAX_SHARED_FILES: usize = 16;

/// A file of slots that this process shares with another since a fork.
struct SharedFile {
    /// The slots it holds: `lo..hi`.
    lo: u64,
    hi: u64,
    /// Shared with readers that took it while no lock was held.
    view: Arc<SharedView>,
    /// How many of its slots this process still uses.
    live: u64,
}

impl SharedFile {
    fn holds(&self, slot: u64) -> bool {
        (self.lo..self.hi).contains(&slot)
    }
}

/// What a read of a shared file needs: the file and its own window read
/// ahead (a forked worker that reads its parent's data in order reads
/// the shared file in order).
struct SharedView {
    /// Guarded as the current file is (before `file`: unmarked first).
    _mark: uzswap_os::fdguard::Mark,
    file: File,
    ahead: uzswap_os::lock::Mutex<Ahead>,
}

impl FileBacking {
    /// Creates a backing file. `path` may name a directory (an unnamed file
    /// is made in it) or a file that must not exist yet. The file is created
    /// with mode 0600 and unlinked at once, so nothing stays on disk however
    /// the process ends.
    pub fn create(path: &Path) -> io::Result<FileBacking> {
        let (file, dir) = open_file(path)?;
        let (_mark, file) = uzswap_os::fdguard::guard(file);
        Ok(FileBacking {
            _mark,
            file,
            base: AtomicU64::new(0),
            reads: AtomicU32::new(0),
            shared: uzswap_os::lock::Mutex::new(Vec::new()),
            next_file: uzswap_os::lock::Mutex::new(None),
            ahead: uzswap_os::lock::Mutex::new(Ahead::default()),
            read_ahead_hits: AtomicU64::new(0),
            dontcache: std::sync::atomic::AtomicBool::new(true),
            path: path.to_path_buf(),
            dir,
        })
    }
}

/// Opens a new backing file at `path` (see [`FileBacking::create`]);
/// returns it and the directory it is in.
fn open_file(path: &Path) -> io::Result<(File, PathBuf)> {
    let (file, dir) = if path.is_dir() {
        let file = sys::open_unnamed(path).or_else(|_| {
            // Filesystems without O_TMPFILE: a named file, unlinked.
            let name = path.join(format!(".uzswap-{}-{}", std::process::id(), unique()));
            create_unlinked(&name)
        })?;
        (file, path.to_path_buf())
    } else {
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf();
        (create_unlinked(path)?, dir)
    };
    // Slots are read one at a time, in no order: readahead would only
    // bring pages into the page cache that nobody asked for.
    sys::fadvise(file.as_raw_fd(), 0, 0, Advice::Random);
    Ok((file, dir))
}

/// The file's descriptor, for callers that inspect the file (its size and
/// blocks) or, in fault tests, damage it behind the cache's back.
impl std::os::fd::AsFd for FileBacking {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.file)
    }
}

fn unique() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn create_unlinked(path: &Path) -> io::Result<File> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    std::fs::remove_file(path)?;
    Ok(file)
}

/// What a system call that moves bytes returned, `n`: `Some(bytes)`;
/// `None` when a signal interrupted it (call again); the error when it
/// failed, or an error of `zero_kind` saying `zero` when it moved nothing
/// (which would otherwise loop for ever).
fn progress(
    n: io::Result<usize>,
    zero_kind: io::ErrorKind,
    zero: &str,
) -> io::Result<Option<usize>> {
    match n {
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(None),
        Err(e) => Err(e),
        Ok(0) => Err(io::Error::new(zero_kind, zero.to_string())),
        Ok(n) => Ok(Some(n)),
    }
}

impl FileBacking {
    fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// The byte offset of a slot of the current file.
    fn offset(&self, slot: u64) -> u64 {
        let base = self.base.load(Ordering::Relaxed);
        debug_assert!(
            slot >= base,
            "slot {slot} is below the current file's {base}"
        );
        (slot - base) * PAGE_SIZE as u64
    }

    /// The shared file that holds `slot` and its first slot.
    fn shared_file(&self, slot: u64) -> Option<(Arc<SharedView>, u64)> {
        let shared = self.shared.lock();
        shared
            .iter()
            .find(|f| f.holds(slot))
            .map(|f| (Arc::clone(&f.view), f.lo))
    }

    /// Reads `slot` of the file `fd` whose first slot is `first`, moving
    /// that file's window read ahead (see `readahead.rs`).
    fn read_windowed(
        &self,
        fd: RawFd,
        first: u64,
        ahead: &uzswap_os::lock::Mutex<Ahead>,
        slot: u64,
        page: &mut [u8],
    ) -> io::Result<()> {
        let plan = ahead.lock().plan(slot);
        // The window's reads start before this slot's, which waits.
        advise_slots(fd, first, &plan.fetch, Advice::WillNeed);
        for gone in &plan.drop {
            advise_slots(fd, first, gone, Advice::DontNeed);
        }
        self.read_at(fd, (slot - first) * PAGE_SIZE as u64, page, page.len())?;
        if plan.ahead {
            self.read_ahead_hits.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Whether a read or write asks for `RWF_DONTCACHE`: while it is taken.
    fn use_dontcache(&self) -> bool {
        self.dontcache.load(Ordering::Relaxed)
    }

    /// Whether a failed call that asked for `RWF_DONTCACHE` (`dontcache`)
    /// was a refusal of it (`sys::refuses_dontcache`). It is not asked for
    /// again; the call is to be repeated without it.
    fn refused(&self, dontcache: bool, e: &io::Error) -> bool {
        let refusal = dontcache && sys::refuses_dontcache(e);
        if refusal {
            self.dontcache.store(false, Ordering::Relaxed);
        }
        refusal
    }

    /// Without `RWF_DONTCACHE`: waits until `len` bytes at `at` are on the
    /// device (an error here is the write's: the pages are not stored) and
    /// drops them from the page cache.
    fn drop_written(&self, at: u64, len: u64) -> io::Result<()> {
        sys::write_out(self.fd(), at, len)?;
        self.drop_cached(self.fd(), at, len);
        Ok(())
    }

    /// Reads `fd` from byte `start` into `buf` until it is full or the file
    /// ends, which is an error before `least` bytes; returns the bytes read.
    fn read_at(&self, fd: RawFd, start: u64, buf: &mut [u8], least: usize) -> io::Result<usize> {
        let mut dontcache = self.use_dontcache();
        let mut done = 0;
        while done < buf.len() {
            let n = sys::pread(fd, &mut buf[done..], start + done as u64, dontcache);
            if matches!(n, Ok(0)) && done >= least {
                break; // the file ends after the slots asked for
            }
            match progress(
                n,
                io::ErrorKind::UnexpectedEof,
                "the backing file ends before this slot",
            ) {
                Ok(Some(n)) => done += n,
                Ok(None) => {}
                Err(e) if self.refused(dontcache, &e) => dontcache = false,
                Err(e) => return Err(e),
            }
        }
        if !dontcache {
            self.drop_cached(fd, start, done as u64);
        }
        Ok(done)
    }

    /// Drops clean cached pages of a file (a hint: failure leaves them).
    fn drop_cached(&self, fd: RawFd, at: u64, len: u64) {
        advise(fd, at, len, Advice::DontNeed);
    }
}

/// [`advise`] of a range of slots of the file `fd` whose first slot is
/// `first` (the part of the range at or above it).
fn advise_slots(fd: RawFd, first: u64, slots: &std::ops::Range<u64>, advice: Advice) {
    let (lo, hi) = (slots.start.max(first), slots.end.max(first));
    let page = PAGE_SIZE as u64;
    advise(fd, (lo - first) * page, (hi - lo) * page, advice);
}

/// [`sys::fadvise`] of `len` bytes at `at`, if there are any (a length of
/// 0 would mean the whole file).
fn advise(fd: RawFd, at: u64, len: u64, advice: Advice) {
    if len == 0 {
        return;
    }
    sys::fadvise(fd, at, len, advice);
}

impl BackingStore for FileBacking {
    fn write_slots(&self, first: u64, pages: &[&[u8]]) -> io::Result<()> {
        let mut iov: Vec<io::IoSlice<'_>> = pages.iter().map(|p| io::IoSlice::new(p)).collect();
        let mut slices = &mut iov[..];
        let start = self.offset(first);
        let mut at = start;
        let mut dontcache = self.use_dontcache();
        while !slices.is_empty() {
            let n = sys::pwritev(self.fd(), slices, at, dontcache);
            let n = match progress(
                n,
                io::ErrorKind::WriteZero,
                "backing file accepted no bytes",
            ) {
                Ok(Some(n)) => n,
                Ok(None) => continue,
                Err(e) if self.refused(dontcache, &e) => {
                    dontcache = false;
                    continue;
                }
                Err(e) => return Err(e),
            };
            at += n as u64;
            io::IoSlice::advance_slices(&mut slices, n);
        }
        if !dontcache {
            self.drop_written(start, at - start)?;
        }
        Ok(())
    }

    fn read_slot(&self, slot: u64, page: &mut [u8]) -> io::Result<()> {
        /// Counts a read of the current file for as long as it lives.
        struct Reading<'a>(&'a AtomicU32);
        impl Drop for Reading<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Release);
            }
        }
        let reading = Reading(&self.reads);
        self.reads.fetch_add(1, Ordering::SeqCst);
        let base = self.base.load(Ordering::SeqCst);
        if slot >= base {
            return self.read_windowed(self.fd(), base, &self.ahead, slot, page);
        }
        // Not the current file: the parent's fork hook, which holds the
        // shared files' lock, need not wait for this read.
        drop(reading);
        // A slot of a file shared since a fork. The file stays open while
        // the read holds it, even if the slot's last user lets go
        // meanwhile.
        let (view, first) = self.shared_file(slot).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("slot {slot} is in no backing file this process still holds"),
            )
        })?;
        let fd = view.file.as_raw_fd();
        self.read_windowed(fd, first, &view.ahead, slot, page)
    }

    fn discard(&self, first: u64, count: u64) {
        if first < self.base.load(Ordering::Relaxed) {
            // A shared file's slots: another process may still read them.
            return;
        }
        // A failure only leaves the blocks in use.
        let _ = sys::punch_hole(self.fd(), self.offset(first), count * PAGE_SIZE as u64);
    }

    fn device_inflight(&self) -> Option<(u32, u32)> {
        crate::admission::device_inflight(&self.dir)
    }

    fn describe(&self) -> String {
        format!("backing file in {}", self.path.display())
    }

    /// Loads served from slots read ahead, and the files shared since forks;
    /// nothing else (the file's traffic is the cache's `backing_writes` and
    /// `loads_backing`).
    fn tier_stats(&self) -> TierStats {
        let shared = self.shared.lock();
        TierStats {
            read_ahead_hits: self.read_ahead_hits.load(Ordering::Relaxed),
            shared_files: shared.len() as u64,
            shared_slots: shared.iter().map(|f| f.live).sum(),
            ..TierStats::default()
        }
    }

    /// Copies the data extents of the first `end` slots (holes stay holes)
    /// to a new unnamed file beside this one and puts it in place of this
    /// one's descriptor (`dup3`): the descriptor number, and so `self`,
    /// stays valid, and from then on names the copy.
    fn fork_private(&self, end: u64) -> io::Result<()> {
        // The window is the shared file's: forgotten.
        // SAFETY: the child's only thread runs here (`fork_private`'s
        // contract: `Cache::fork_child`).
        let _ = unsafe { uzswap_os::fork::take_in_child(&self.ahead) };
        self.read_ahead_hits.store(0, Ordering::Relaxed);
        let copy = FileBacking::create(&self.dir)?;
        let (src, dst) = (self.file.as_raw_fd(), copy.file.as_raw_fd());
        let end = end * PAGE_SIZE as u64;
        let mut at = 0;
        while at < end {
            let data = match sys::seek_data(src, at) {
                Ok(data) if data < end => data,
                _ => break, // ENXIO: no data past `at`
            };
            let Ok(hole) = sys::seek_hole(src, data) else {
                break;
            };
            let hole = hole.min(end);
            let (mut from, mut to) = (data, data);
            while from < hole {
                let len = (hole - from) as usize;
                let n = sys::copy_range(src, &mut from, dst, &mut to, len);
                progress(
                    n,
                    io::ErrorKind::UnexpectedEof,
                    "the backing file ended while it was copied",
                )?;
            }
            at = hole;
        }
        // SAFETY: dup3 onto our own descriptor number: it atomically closes
        // the shared file there and names the copy instead; `copy` keeps
        // (and closes on drop) its own number.
        unsafe { uzswap_os::fdguard::replace(dst, src) }
    }

    /// While it holds fewer than [`MAX_SHARED_FILES`] shared files: each
    /// is a descriptor of the program's process, and a program that forks
    /// after every writeback would otherwise run out of them.
    fn shares_at_fork(&self) -> bool {
        self.shared.lock().len() < MAX_SHARED_FILES
    }

    fn fork_share_prepare(&self) -> io::Result<()> {
        let (file, _) = open_file(&self.dir)?;
        *self.next_file.lock() = Some((file, self.file.try_clone()?));
        Ok(())
    }

    /// The list of shared files (a leaf lock: a read of the statistics or
    /// a slot let go of may hold it at the fork).
    fn fork_lock(&self) {
        std::mem::forget(self.shared.lock());
    }

    unsafe fn fork_unlock(&self, side: Side) {
        use uzswap_os::fork::AfterFork;
        // SAFETY: fork_lock took it on this thread (the caller's contract).
        unsafe { self.shared.after_fork(side) };
    }

    /// See the type's docs ("A fork shares the file"). Runs in a fork hook
    /// with no I/O of this store in flight (the cache's contract).
    unsafe fn fork_share(&self, side: Side, next: u64, live: u64) -> io::Result<()> {
        // The parent opened its next file before the fork; the child's copy
        // of that descriptor is the parent's file, never the child's.
        let prepared = self.next_file.lock().take();
        let base = self.base.load(Ordering::Relaxed);
        let (file, old) = match side {
            Side::Parent if next == base => return Ok(()), // nothing shared
            Side::Parent => prepared.ok_or_else(|| {
                io::Error::other("the parent's next backing file was not opened before the fork")
            })?,
            Side::Child => {
                drop(prepared);
                (open_file(&self.dir)?.0, self.file.try_clone()?)
            }
        };
        // SAFETY: in the parent this thread holds the list's lock
        // (fork_lock); in the child it is the only thread (the caller's
        // contract).
        let shared = unsafe { &mut *self.shared.data_ptr() };
        if next > base && live > 0 {
            // The current file keeps its slots, shared from now on, under
            // a descriptor number of its own.
            shared.push(SharedFile {
                lo: base,
                hi: next,
                view: Arc::new({
                    let (_mark, file) = uzswap_os::fdguard::guard(old);
                    SharedView {
                        _mark,
                        file,
                        ahead: uzswap_os::lock::Mutex::new(Ahead::default()),
                    }
                }),
                live,
            });
        }
        // Reads of a slot below `next` go to the shared file from now on;
        // one that began with the old first slot may still read this
        // descriptor, which must name the old file until it is done.
        self.base.store(next, Ordering::SeqCst);
        match side {
            Side::Parent => {
                while self.reads.load(Ordering::SeqCst) != 0 {
                    std::thread::yield_now();
                }
            }
            // The child's only thread runs here: a count is a parent
            // thread's read, copied at the fork.
            Side::Child => self.reads.store(0, Ordering::SeqCst),
        }
        // SAFETY: dup3 onto our own descriptor number: it atomically puts
        // the new file's description there (the old one stays open through
        // `old` above, if any slot is shared); `file` closes its own
        // number on drop.
        unsafe { uzswap_os::fdguard::replace(file.as_raw_fd(), self.fd()) }?;
        // The window was the old file's.
        match side {
            Side::Parent => *self.ahead.lock() = Ahead::default(),
            Side::Child => {
                // SAFETY: the child's only thread runs here (the caller's
                // contract); so for the shared files' windows below, which
                // a read in the parent may have held (a hint: forgotten).
                let _ = unsafe { uzswap_os::fork::take_in_child(&self.ahead) };
                for f in shared.iter() {
                    // SAFETY: as above.
                    let _ = unsafe { uzswap_os::fork::take_in_child(&f.view.ahead) };
                }
            }
        }
        Ok(())
    }

    fn release_shared(&self, slot: u64) {
        let mut shared = self.shared.lock();
        if let Some(i) = shared.iter().position(|f| f.holds(slot)) {
            shared[i].live -= 1;
            if shared[i].live == 0 {
                // Closed once no read holds it; the kernel frees the
                // unlinked file when every process has let go.
                shared.remove(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backing::{FILE_READ_AHEAD, FILE_READ_AROUND};

    /// The parent's side of a fork that shares `b`'s slots below `next`,
    /// without forking.
    fn share(b: &FileBacking, next: u64, live: u64) {
        b.fork_share_prepare().unwrap();
        b.fork_lock();
        // SAFETY: between fork_lock and fork_unlock on this thread.
        unsafe {
            b.fork_share(Side::Parent, next, live).unwrap();
            b.fork_unlock(Side::Parent);
        }
    }

    /// A fork's share (the parent's side, without forking): the slots so
    /// far stay readable in the shared file, new ones go to a new file
    /// numbered on, and the shared file is let go of after its last slot.
    #[test]
    fn a_shared_file_keeps_its_slots_until_the_last_is_released() {
        let b = FileBacking::create(&std::env::temp_dir()).unwrap();
        let page = |v: u8| vec![v; PAGE_SIZE];
        let read = |slot: u64| {
            let mut buf = vec![0u8; PAGE_SIZE];
            b.read_slot(slot, &mut buf).map(|()| buf[0])
        };
        b.write_slots(0, &[&page(1), &page(2)]).unwrap();
        let next = 1 << 40;
        share(&b, next, 2);
        b.write_slots(next, &[&page(3), &page(4)]).unwrap();
        assert_eq!((read(0).unwrap(), read(1).unwrap()), (1, 2));
        assert_eq!((read(next).unwrap(), read(next + 1).unwrap()), (3, 4));
        let t = b.tier_stats();
        assert_eq!((t.shared_files, t.shared_slots), (1, 2));
        // A discard of shared slots is ignored: another process reads them.
        b.discard(0, 2);
        assert_eq!(read(1).unwrap(), 2);
        b.release_shared(0);
        assert_eq!(read(1).unwrap(), 2, "the file stays while a slot is used");
        b.release_shared(1);
        let t = b.tier_stats();
        assert_eq!((t.shared_files, t.shared_slots), (0, 0));
        let e = read(1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        // The new file's slots are where they were written.
        assert_eq!(read(next + 1).unwrap(), 4);
    }

    /// A process shares at most `MAX_SHARED_FILES` files; past that its
    /// forks copy (each shared file is a descriptor of the program's).
    #[test]
    fn a_process_shares_a_bounded_number_of_files() {
        let b = FileBacking::create(&std::env::temp_dir()).unwrap();
        let page = vec![7u8; PAGE_SIZE];
        let mut base = 0;
        for _ in 0..MAX_SHARED_FILES {
            assert!(b.shares_at_fork());
            b.write_slots(base, &[&page]).unwrap();
            share(&b, base + (1 << 40), 1);
            base += 1 << 40;
        }
        assert!(!b.shares_at_fork());
        b.release_shared(0);
        assert!(b.shares_at_fork(), "a file let go of makes room");
    }

    /// How many of the first `pages` pages of `b`'s file are in the page
    /// cache.
    fn cached_pages(b: &FileBacking, pages: usize) -> usize {
        crate::sys::cached_pages(b.fd(), pages)
    }

    /// Written-back pages leave the page cache, as swapped-out pages leave
    /// memory, on both paths (`RWF_DONTCACHE`, and the dropping by hand
    /// where it is refused); what is read back comes from the file, right,
    /// and what is read ahead stays cached only until the window moves on.
    #[test]
    fn written_back_pages_leave_the_page_cache() {
        for by_hand in [false, true] {
            let b = FileBacking::create(&std::env::temp_dir()).unwrap();
            if by_hand {
                b.dontcache.store(false, Ordering::Relaxed);
            }
            let pages: Vec<Vec<u8>> = (0..64u8).map(|i| vec![i ^ 0x5a; PAGE_SIZE]).collect();
            let refs: Vec<&[u8]> = pages.iter().map(|p| &p[..]).collect();
            b.write_slots(0, &refs).unwrap();
            // RWF_DONTCACHE drops the pages when their writeback ends.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while cached_pages(&b, 64) > 0 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            assert_eq!(cached_pages(&b, 64), 0, "by hand: {by_hand}");
            let mut page = vec![0u8; PAGE_SIZE];
            // A read asks the kernel for the slots after it: they are in
            // the page cache (or on their way) when it returns.
            b.read_slot(0, &mut page).unwrap();
            assert_eq!(page, pages[0]);
            let ahead = cached_pages(&b, 64);
            assert!(ahead >= FILE_READ_AROUND - 1, "{ahead} read ahead");
            for (i, want) in pages.iter().enumerate() {
                b.read_slot(i as u64, &mut page).unwrap();
                assert_eq!(&page, want, "slot {i}, by hand: {by_hand}");
            }
            // What is read ahead is cached until the window moves on: at
            // most two windows.
            let left = cached_pages(&b, 64);
            assert!(
                left <= 2 * FILE_READ_AHEAD,
                "{left} cached after reads, by hand: {by_hand}"
            );
        }
    }

    /// Page `slot` at version `v`: distinct per slot and version.
    fn versioned(slot: u64, v: u64) -> Vec<u8> {
        let mut p = vec![0u8; PAGE_SIZE];
        for (i, c) in p.chunks_exact_mut(8).enumerate() {
            c.copy_from_slice(&(slot << 32 ^ v << 16 ^ i as u64).to_le_bytes());
        }
        p
    }

    fn write_versions(b: &FileBacking, slots: std::ops::Range<u64>, v: u64) {
        let pages: Vec<Vec<u8>> = slots.clone().map(|s| versioned(s, v)).collect();
        let refs: Vec<&[u8]> = pages.iter().map(|p| &p[..]).collect();
        b.write_slots(slots.start, &refs).unwrap();
    }

    /// Slots read in order are read in clusters: most come from the slots
    /// read ahead, all right; slots read out of order read none ahead.
    #[test]
    fn reads_in_order_are_served_ahead_and_right() {
        let b = FileBacking::create(&std::env::temp_dir()).unwrap();
        write_versions(&b, 0..200, 1);
        let mut page = vec![0u8; PAGE_SIZE];
        // Out of order, none among the seven slots after the one before.
        for s in [150u64, 3, 77, 20, 199, 0, 41] {
            b.read_slot(s, &mut page).unwrap();
            assert!(page == versioned(s, 1), "slot {s}");
        }
        assert_eq!(b.tier_stats().read_ahead_hits, 0);
        for s in 0..200u64 {
            b.read_slot(s, &mut page).unwrap();
            assert!(page == versioned(s, 1), "slot {s}");
        }
        // Slots 0..8, then clusters of 16 from slot 8: 15 of each kept.
        let hits = b.tier_stats().read_ahead_hits;
        assert!(hits >= 180, "{hits} of 200 read ahead");
    }

    /// A slot written after its cluster was read is read as written, and a
    /// cluster read past the file's end keeps what there is.
    #[test]
    fn a_slot_written_after_it_was_read_ahead_reads_as_written() {
        let b = FileBacking::create(&std::env::temp_dir()).unwrap();
        write_versions(&b, 0..40, 1);
        let mut page = vec![0u8; PAGE_SIZE];
        b.read_slot(10, &mut page).unwrap(); // reads 10..18, keeps 11..18
        b.read_slot(11, &mut page).unwrap();
        assert_eq!(b.tier_stats().read_ahead_hits, 1);
        write_versions(&b, 14..15, 2);
        for s in 12..30u64 {
            b.read_slot(s, &mut page).unwrap();
            let v = if s == 14 { 2 } else { 1 };
            assert!(page == versioned(s, v), "slot {s}");
        }
        // Reads that run into the end of the file.
        for s in 30..40u64 {
            b.read_slot(s, &mut page).unwrap();
            assert!(page == versioned(s, 1), "slot {s}");
        }
        assert!(b.read_slot(40, &mut page).is_err(), "past the end");
    }

    /// Threads each rewrite and read back their own run of slots, in
    /// order, while the others do theirs next to it: clusters read ahead
    /// cross into the neighbours' runs as those are rewritten, and no read
    /// may ever return a page older than the slot's last write.
    #[test]
    fn reads_ahead_never_return_an_older_page_under_concurrent_writes() {
        const THREADS: u64 = 4;
        const RUN: u64 = 20;
        let b = FileBacking::create(&std::env::temp_dir()).unwrap();
        write_versions(&b, 0..THREADS * RUN, 0);
        std::thread::scope(|sc| {
            for t in 0..THREADS {
                let b = &b;
                sc.spawn(move || {
                    let run = t * RUN..(t + 1) * RUN;
                    let mut page = vec![0u8; PAGE_SIZE];
                    for v in 1..=3000u64 {
                        write_versions(b, run.clone(), v);
                        for s in run.clone() {
                            b.read_slot(s, &mut page).unwrap();
                            assert!(page == versioned(s, v), "slot {s} version {v}");
                        }
                    }
                });
            }
        });
        assert!(b.tier_stats().read_ahead_hits > 0);
    }

    #[test]
    fn file_backing_round_trips_and_is_private() {
        let dir = std::env::temp_dir();
        let b = FileBacking::create(&dir).unwrap();
        let pages: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i + 1; PAGE_SIZE]).collect();
        let refs: Vec<&[u8]> = pages.iter().map(|p| &p[..]).collect();
        b.write_slots(5, &refs).unwrap();
        let mut page = vec![0u8; PAGE_SIZE];
        b.read_slot(6, &mut page).unwrap();
        assert_eq!(page, pages[1]);
        // Never-written slots past the end are a short read, not zeros.
        assert!(b.read_slot(100, &mut page).is_err());
        b.discard(5, 1);
        // A named file: created 0600 and gone from the directory at once.
        let named = dir.join(format!("uzswap-test-{}", std::process::id()));
        let f = FileBacking::create(&named).unwrap();
        assert!(!named.exists());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            f.file.metadata().unwrap().permissions().mode() & 0o777,
            0o600
        );
    }
}
