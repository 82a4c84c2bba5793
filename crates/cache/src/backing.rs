//! The backing tier: where written-back pages go.
//!
//! [`BackingStore`] is the small trait a tier implements: fixed 4 KiB slots,
//! vectored writes of adjacent slots, single-slot reads. The cache seals
//! (encrypts or checksums) pages before they reach the store, so a store
//! sees only opaque slots and needs no integrity logic of its own.
//! [`FileBacking`] is the default: a sparse local file, owner-only, unlinked
//! as soon as it is open. [`FaultInjector`] wraps any store and fails on
//! command, for tests and the soak.
//!
//! [`SlotMap`] hands out slots, preferring runs of adjacent free slots so a
//! writeback batch becomes one `pwritev`.
//!
//! # Reading ahead (the file)
//! A read of a slot outside the window read ahead asks the kernel to read
//! the [`FILE_READ_AROUND`] − 1 slots after it into the page cache
//! (`POSIX_FADV_WILLNEED`, which starts the reads and returns), then reads
//! its own slot; [`FILE_READ_AHEAD`] slots when it follows the slot read
//! last. A window that served no read halves the next one read around a
//! slot, down to the slot alone, and one that did doubles it back, as the
//! kernel sizes its swap readahead by its hits: a program that reads its
//! pages back at random asks the disk for no page it will not use. A read
//! that follows inside the window and finds half of it or less ahead asks
//! for the next window at once, so that reads in order find their slots
//! read before they ask, as the kernel's swap readahead starts a cluster's
//! reads and waits only for the page it needs. Pages written back together
//! lie in adjacent slots, and a program that reads its data again in order
//! faults them back one after another.
//!
//! What is read ahead is the file's own page cache, which writes, hole
//! punches and reads keep coherent: a page read from it is the slot's last
//! write, whatever the window's state, which is only a hint (threads that
//! race on it cost a read, never a wrong page). When the window moves, the
//! pages it leaves behind are dropped (`POSIX_FADV_DONTNEED`), so about
//! two windows of pages (a few dozen) are in the page cache for a file,
//! outside the budget; a page still being read when its window is dropped
//! stays until the kernel reclaims it.
//!
//! A page written back must leave memory, as the kernel's swap-out frees
//! it: [`FileBacking`] reads and writes with `RWF_DONTCACHE` (Linux 6.14
//! and filesystems that support it), so the file's pages leave the page
//! cache once on disk, or, where the flag is refused, waits for its writes
//! and drops them (`sync_file_range`, `POSIX_FADV_DONTNEED`). A file left
//! in the page cache would be memory outside the budget, read back at
//! memory's speed, which no swap device gives.

use crate::PAGE_SIZE;
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use uzswap_os::fork::Side;

/// What a tier says of its own traffic, for the statistics: a remote
/// tier's round trips and bytes; for a local file only its reads ahead
/// (its traffic is the cache's `backing_writes` and `loads_backing`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    /// Round trips to a server: one per command or pipeline sent.
    pub round_trips: u64,
    /// Bytes of keys and values sent.
    pub bytes_sent: u64,
    /// Bytes of values received.
    pub bytes_received: u64,
    /// Calls that failed (connection, timeout, error reply, missing key).
    pub errors: u64,
    /// Of those, loads whose key was gone (expired, evicted, flushed).
    pub missing: u64,
    /// Connections made (the first and every reconnection).
    pub connects: u64,
    /// Loads served from pages read ahead with an earlier load (no round
    /// trip).
    pub read_ahead_hits: u64,
    /// Bytes the tier holds, freed slots' bytes it cannot yet release
    /// included.
    pub held_bytes: u64,
    /// Files shared since forks (see [`FileBacking`], "A fork shares the
    /// file").
    pub shared_files: u64,
    /// The slots of those files this process still uses.
    pub shared_slots: u64,
}

/// A tier of fixed-size (`PAGE_SIZE`) slots addressed by number.
pub trait BackingStore: Send + Sync {
    /// Writes `pages` (each `PAGE_SIZE` bytes) to slots `first..first+n`.
    /// Either all are written or an error is returned (a short write is an
    /// error).
    fn write_slots(&self, first: u64, pages: &[&[u8]]) -> io::Result<()>;
    /// Reads slot `slot` into `page` (`PAGE_SIZE` bytes); a short read is an
    /// error.
    fn read_slot(&self, slot: u64, page: &mut [u8]) -> io::Result<()>;
    /// Says the slots are free; a store may release their space.
    fn discard(&self, _first: u64, _count: u64) {}
    /// Reads and writes in flight on the device under the store, if known
    /// (the cache adds its own in-flight counts).
    fn device_inflight(&self) -> Option<(u32, u32)> {
        None
    }
    /// For messages: where the slots live.
    fn describe(&self) -> String;
    /// The tier's own traffic (none by default).
    fn tier_stats(&self) -> TierStats {
        TierStats::default()
    }
    /// Upkeep, called by the cache's writer thread about once a second
    /// (no cache lock held): a remote tier renews its keys' time-to-live.
    fn maintain(&self) {}
    /// In a forked child (see `Cache::fork_child`): parent and child share
    /// the store, and each will write slots the other may still read. The
    /// child makes the store its own: it copies slots `0..end` (the used
    /// ones; the rest may be left out) to a new store and uses that from
    /// now on. A store that cannot says so (the default).
    fn fork_private(&self, _end: u64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{} cannot be copied for a forked child", self.describe()),
        ))
    }
    /// Whether the slots written before a fork can stay where they are,
    /// shared by the parent and the child ([`BackingStore::fork_share`]),
    /// instead of being copied for the child
    /// ([`BackingStore::fork_private`]). Not by default.
    fn shares_at_fork(&self) -> bool {
        false
    }
    /// Before `fork()`, in the parent, when the slots will be shared: makes
    /// ready what the parent writes to after the fork, so that the one step
    /// that can fail comes while the caller can still copy instead.
    fn fork_share_prepare(&self) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{} cannot be shared with a forked child", self.describe()),
        ))
    }
    /// Before `fork()`, after the cache's own locks: takes the store's
    /// locks that another thread may hold (a statistics read, a slot
    /// released) and keeps them, so that the child's copy of what they
    /// guard is whole. Nothing by default.
    fn fork_lock(&self) {}
    /// After `fork()`: releases what [`BackingStore::fork_lock`] took.
    ///
    /// # Safety
    /// This thread called `fork_lock` before the fork and nothing released
    /// it since; with `Side::Child` it is the child's only thread.
    unsafe fn fork_unlock(&self, _side: Side) {}
    /// After `fork()`, in the parent (after [`BackingStore::fork_share_prepare`])
    /// and in the child alike: slots below `next` are shared with the other
    /// process from now on. This store never writes nor discards them
    /// again and reads them as before; `live` of them are in use in this
    /// process, and [`BackingStore::release_shared`] says when each stops
    /// being. New slots are numbered from `next`. An error in the child
    /// leaves it without a safe store (the caller must not go on).
    ///
    /// # Safety
    /// In the parent, between [`BackingStore::fork_lock`] and
    /// [`BackingStore::fork_unlock`] on this thread; in the child, after
    /// `fork_unlock`, as its only thread.
    unsafe fn fork_share(&self, _side: Side, _next: u64, _live: u64) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{} cannot be shared with a forked child", self.describe()),
        ))
    }
    /// A slot below the last [`BackingStore::fork_share`]'s `next` is no
    /// longer used by this process.
    fn release_shared(&self, _slot: u64) {}
}

/// A shared store is a store: the caller can keep a handle on a tier it
/// gives the cache (tests arm a [`FaultInjector`] this way).
impl<S: BackingStore + ?Sized> BackingStore for std::sync::Arc<S> {
    fn write_slots(&self, first: u64, pages: &[&[u8]]) -> io::Result<()> {
        (**self).write_slots(first, pages)
    }
    fn read_slot(&self, slot: u64, page: &mut [u8]) -> io::Result<()> {
        (**self).read_slot(slot, page)
    }
    fn discard(&self, first: u64, count: u64) {
        (**self).discard(first, count)
    }
    fn device_inflight(&self) -> Option<(u32, u32)> {
        (**self).device_inflight()
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn tier_stats(&self) -> TierStats {
        (**self).tier_stats()
    }
    fn maintain(&self) {
        (**self).maintain()
    }
    fn fork_private(&self, end: u64) -> io::Result<()> {
        (**self).fork_private(end)
    }
    fn shares_at_fork(&self) -> bool {
        (**self).shares_at_fork()
    }
    fn fork_share_prepare(&self) -> io::Result<()> {
        (**self).fork_share_prepare()
    }
    fn fork_lock(&self) {
        (**self).fork_lock()
    }
    unsafe fn fork_unlock(&self, side: Side) {
        // SAFETY: the caller's contract, passed on.
        unsafe { (**self).fork_unlock(side) }
    }
    unsafe fn fork_share(&self, side: Side, next: u64, live: u64) -> io::Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe { (**self).fork_share(side, next, live) }
    }
    fn release_shared(&self, slot: u64) {
        (**self).release_shared(slot)
    }
}

/// Most slots one read of the file asks for when reads follow each other
/// (its own and those after it; see "Reading ahead").
pub const FILE_READ_AHEAD: usize = 16;
/// Slots one read of the file asks for otherwise (the kernel's default
/// swap cluster, `vm.page-cluster` 3), at most.
pub const FILE_READ_AROUND: usize = 8;
/// Halvings of [`FILE_READ_AROUND`] that leave the slot alone.
const AROUND_SHORTEST: u32 = FILE_READ_AROUND.trailing_zeros();

/// The window read ahead: slots `lo..hi` were asked of the kernel; `next`
/// is one past the slot read last; `hit` is set once a read is served from
/// the window; `short` is how many times the window read around a slot has
/// been halved (see "Reading ahead").
#[derive(Default, Debug, PartialEq)]
struct Ahead {
    lo: u64,
    hi: u64,
    next: u64,
    hit: bool,
    short: u32,
}

/// What a read does besides reading its slot, decided under the lock and
/// done after it ([`Ahead::plan`]).
#[derive(Debug, PartialEq)]
struct Plan {
    /// The slot is in the window read ahead.
    ahead: bool,
    /// Slots to ask the kernel to read now.
    fetch: std::ops::Range<u64>,
    /// Slots the window left behind, to drop from the page cache.
    drop: [std::ops::Range<u64>; 2],
}

impl Ahead {
    /// Moves the window for a read of `slot` (see "Reading ahead").
    fn plan(&mut self, slot: u64) -> Plan {
        const AHEAD: u64 = FILE_READ_AHEAD as u64;
        let follows = self.next == slot && slot != 0;
        self.next = slot + 1;
        if (self.lo..self.hi).contains(&slot) {
            self.hit = true;
            if follows && self.hi - slot <= AHEAD / 2 {
                // Running out while following: the next window now, and
                // the slots read before this one leave.
                let fetch = self.hi..self.hi + AHEAD;
                let drop = if self.lo < slot { self.lo..slot } else { 0..0 };
                self.lo = slot;
                self.hi = fetch.end;
                return Plan {
                    ahead: true,
                    fetch,
                    drop: [drop, 0..0],
                };
            }
            return Plan {
                ahead: true,
                fetch: 0..0,
                drop: [0..0, 0..0],
            };
        }
        let n = if follows {
            AHEAD
        } else {
            // A window that served no read halves the next one read
            // around a slot, down to the slot alone; one that did doubles
            // it back.
            if self.lo < self.hi {
                self.short = if self.hit {
                    self.short.saturating_sub(1)
                } else {
                    (self.short + 1).min(AROUND_SHORTEST)
                };
            }
            FILE_READ_AROUND as u64 >> self.short
        };
        self.hit = false;
        let fetch = slot + 1..slot + n;
        // The old window less the new one: up to two pieces.
        let (lo, hi) = (self.lo, self.hi);
        let piece = |a: u64, b: u64| if a < b { a..b } else { 0..0 };
        let drop = [piece(lo, hi.min(fetch.start)), piece(lo.max(fetch.end), hi)];
        self.lo = fetch.start;
        self.hi = fetch.end;
        Plan {
            ahead: false,
            fetch,
            drop,
        }
    }
}

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
        Ok(FileBacking {
            _mark: uzswap_os::fdguard::Mark::new(&file),
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
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE)
            .open(path)
            .or_else(|_| {
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
    // SAFETY: a hint on our own descriptor.
    unsafe {
        libc::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
            0,
            libc::POSIX_FADV_RANDOM,
        )
    };
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
fn progress(n: isize, zero_kind: io::ErrorKind, zero: &str) -> io::Result<Option<usize>> {
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(None);
        }
        return Err(e);
    }
    if n == 0 {
        return Err(io::Error::new(zero_kind, zero.to_string()));
    }
    Ok(Some(n as usize))
}

impl FileBacking {
    fn fd(&self) -> libc::c_int {
        std::os::fd::AsRawFd::as_raw_fd(&self.file)
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
    /// that file's window read ahead (see "Reading ahead").
    fn read_windowed(
        &self,
        fd: libc::c_int,
        first: u64,
        ahead: &uzswap_os::lock::Mutex<Ahead>,
        slot: u64,
        page: &mut [u8],
    ) -> io::Result<()> {
        let plan = ahead.lock().plan(slot);
        // The window's reads start before this slot's, which waits.
        advise_slots(fd, first, &plan.fetch, libc::POSIX_FADV_WILLNEED);
        for gone in &plan.drop {
            advise_slots(fd, first, gone, libc::POSIX_FADV_DONTNEED);
        }
        self.read_at(fd, (slot - first) * PAGE_SIZE as u64, page, page.len())?;
        if plan.ahead {
            self.read_ahead_hits.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The flags of a read or write: `RWF_DONTCACHE` while it is taken.
    fn rwf(&self) -> libc::c_int {
        if self.dontcache.load(Ordering::Relaxed) {
            libc::RWF_DONTCACHE
        } else {
            0
        }
    }

    /// Whether a failed call with `flags` was a refusal of `RWF_DONTCACHE`
    /// (an older kernel: EINVAL; a filesystem without it: EOPNOTSUPP). It
    /// is not asked for again; the call is to be repeated without it.
    fn refused(&self, flags: libc::c_int, e: &io::Error) -> bool {
        let refusal =
            flags != 0 && matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL));
        if refusal {
            self.dontcache.store(false, Ordering::Relaxed);
        }
        refusal
    }

    /// Without `RWF_DONTCACHE`: waits until `len` bytes at `at` are on the
    /// device (an error here is the write's: the pages are not stored) and
    /// drops them from the page cache.
    fn drop_written(&self, at: u64, len: u64) -> io::Result<()> {
        // SAFETY: plain system calls on our own descriptor.
        let r = unsafe {
            libc::sync_file_range(
                self.fd(),
                at as libc::off64_t,
                len as libc::off64_t,
                libc::SYNC_FILE_RANGE_WAIT_BEFORE
                    | libc::SYNC_FILE_RANGE_WRITE
                    | libc::SYNC_FILE_RANGE_WAIT_AFTER,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        self.drop_cached(self.fd(), at, len);
        Ok(())
    }

    /// Reads `fd` from byte `start` into `buf` until it is full or the file
    /// ends, which is an error before `least` bytes; returns the bytes read.
    fn read_at(
        &self,
        fd: libc::c_int,
        start: u64,
        buf: &mut [u8],
        least: usize,
    ) -> io::Result<usize> {
        let mut flags = self.rwf();
        let mut done = 0;
        while done < buf.len() {
            let rest = &mut buf[done..];
            let iov = libc::iovec {
                iov_base: rest.as_mut_ptr().cast(),
                iov_len: rest.len(),
            };
            // SAFETY: the iovec points into `buf`, live and exclusively
            // ours for the call; the fd is ours and open.
            let n =
                unsafe { libc::preadv2(fd, &iov, 1, (start + done as u64) as libc::off_t, flags) };
            if n == 0 && done >= least {
                break; // the file ends after the slots asked for
            }
            match progress(
                n,
                io::ErrorKind::UnexpectedEof,
                "the backing file ends before this slot",
            ) {
                Ok(Some(n)) => done += n,
                Ok(None) => {}
                Err(e) if self.refused(flags, &e) => flags = 0,
                Err(e) => return Err(e),
            }
        }
        if flags == 0 {
            self.drop_cached(fd, start, done as u64);
        }
        Ok(done)
    }

    /// Drops clean cached pages of a file (a hint: failure leaves them).
    fn drop_cached(&self, fd: libc::c_int, at: u64, len: u64) {
        advise(fd, at, len, libc::POSIX_FADV_DONTNEED);
    }
}

/// [`advise`] of a range of slots of the file `fd` whose first slot is
/// `first` (the part of the range at or above it).
fn advise_slots(fd: libc::c_int, first: u64, slots: &std::ops::Range<u64>, advice: libc::c_int) {
    let (lo, hi) = (slots.start.max(first), slots.end.max(first));
    let page = PAGE_SIZE as u64;
    advise(fd, (lo - first) * page, (hi - lo) * page, advice);
}

/// `posix_fadvise` of `len` bytes at `at` (a hint: failure is ignored).
fn advise(fd: libc::c_int, at: u64, len: u64, advice: libc::c_int) {
    if len == 0 {
        return;
    }
    // SAFETY: a hint on one of our own descriptors.
    unsafe { libc::posix_fadvise(fd, at as libc::off_t, len as libc::off_t, advice) };
}

impl BackingStore for FileBacking {
    fn write_slots(&self, first: u64, pages: &[&[u8]]) -> io::Result<()> {
        let mut iov: Vec<io::IoSlice<'_>> = pages.iter().map(|p| io::IoSlice::new(p)).collect();
        let mut slices = &mut iov[..];
        let start = self.offset(first);
        let mut at = start;
        let mut flags = self.rwf();
        while !slices.is_empty() {
            // SAFETY: the iovecs point into live slices for the call's
            // duration; the fd is ours and open.
            let n = unsafe {
                libc::pwritev2(
                    self.fd(),
                    slices.as_ptr().cast(),
                    slices.len().min(1024) as libc::c_int,
                    at as libc::off_t,
                    flags,
                )
            };
            let n = match progress(
                n,
                io::ErrorKind::WriteZero,
                "backing file accepted no bytes",
            ) {
                Ok(Some(n)) => n,
                Ok(None) => continue,
                Err(e) if self.refused(flags, &e) => {
                    flags = 0;
                    continue;
                }
                Err(e) => return Err(e),
            };
            at += n as u64;
            io::IoSlice::advance_slices(&mut slices, n);
        }
        if flags == 0 {
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
        let fd = std::os::fd::AsRawFd::as_raw_fd(&view.file);
        self.read_windowed(fd, first, &view.ahead, slot, page)
    }

    fn discard(&self, first: u64, count: u64) {
        if first < self.base.load(Ordering::Relaxed) {
            // A shared file's slots: another process may still read them.
            return;
        }
        // SAFETY: plain syscall on our fd; failure only leaves blocks in use.
        unsafe {
            libc::fallocate(
                self.fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                self.offset(first) as libc::off_t,
                (count * PAGE_SIZE as u64) as libc::off_t,
            );
        }
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
        use std::os::fd::AsRawFd;
        // The window is the shared file's: forgotten.
        // SAFETY: the child's only thread runs here (`fork_private`'s
        // contract: `Cache::fork_child`).
        let _ = unsafe { uzswap_os::fork::take_in_child(&self.ahead) };
        self.read_ahead_hits.store(0, Ordering::Relaxed);
        let copy = FileBacking::create(&self.dir)?;
        let (src, dst) = (self.file.as_raw_fd(), copy.file.as_raw_fd());
        let end = (end * PAGE_SIZE as u64) as libc::off_t;
        let mut at: libc::off_t = 0;
        while at < end {
            // SAFETY: lseek on our own descriptor.
            let data = unsafe { libc::lseek(src, at, libc::SEEK_DATA) };
            if data < 0 || data >= end {
                break; // ENXIO: no data past `at`
            }
            // SAFETY: as above.
            let hole = unsafe { libc::lseek(src, data, libc::SEEK_HOLE) }.min(end);
            let (mut from, mut to) = (data, data);
            while from < hole {
                // SAFETY: both descriptors are ours; the offsets are locals.
                let n = unsafe {
                    libc::copy_file_range(src, &mut from, dst, &mut to, (hole - from) as usize, 0)
                };
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
        if unsafe { libc::dup3(dst, src, libc::O_CLOEXEC) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
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
        use std::os::fd::AsRawFd;
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
                view: Arc::new(SharedView {
                    _mark: uzswap_os::fdguard::Mark::new(&old),
                    file: old,
                    ahead: uzswap_os::lock::Mutex::new(Ahead::default()),
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
        if unsafe { libc::dup3(file.as_raw_fd(), self.fd(), libc::O_CLOEXEC) } < 0 {
            return Err(io::Error::last_os_error());
        }
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

/// What a [`FaultInjector`] does to the next operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Writes fail with EIO.
    WriteError,
    /// Writes fail with ENOSPC (a full disk).
    NoSpace,
    /// Writes stop half-way and report a short write.
    ShortWrite,
    /// Reads fail with EIO.
    ReadError,
    /// Reads return the slot with one bit flipped.
    FlipBit,
    /// Reads find the file truncated (EOF).
    Truncated,
}

/// Wraps a store and injects faults: `arm(fault, count)` makes the next
/// `count` matching operations fail that way. Counts what it injected.
pub struct FaultInjector<S> {
    inner: S,
    fault: uzswap_os::lock::Mutex<Option<(Fault, u64)>>,
    injected: AtomicU64,
    /// Reported as the device's in-flight (reads, writes), for admission
    /// tests: packed reads << 16 | writes; u32::MAX means "unknown".
    inflight: AtomicU32,
}

impl<S: BackingStore> FaultInjector<S> {
    pub fn new(inner: S) -> FaultInjector<S> {
        FaultInjector {
            inner,
            fault: uzswap_os::lock::Mutex::new(None),
            injected: AtomicU64::new(0),
            inflight: AtomicU32::new(u32::MAX),
        }
    }

    /// The next `count` operations of the fault's kind fail.
    pub fn arm(&self, fault: Fault, count: u64) {
        *self.fault.lock() = Some((fault, count));
    }

    /// Stops injecting.
    pub fn disarm(&self) {
        *self.fault.lock() = None;
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// Injects faults of every kind at random until `stop` is set, for
    /// soak tests: windows of 1-10 ms armed with one kind (a single fault
    /// for reads, 1-3 for writes), 20-40 ms apart. So one operation retried
    /// a few milliseconds later gets through: a test can insist that no
    /// page is lost for good.
    pub fn chaos(&self, stop: &std::sync::atomic::AtomicBool, seed: u64) {
        const KINDS: [Fault; 6] = [
            Fault::WriteError,
            Fault::NoSpace,
            Fault::ShortWrite,
            Fault::ReadError,
            Fault::FlipBit,
            Fault::Truncated,
        ];
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let ms = |v: u64| std::time::Duration::from_millis(v);
        while !stop.load(Ordering::Relaxed) {
            let f = KINDS[next(KINDS.len() as u64) as usize];
            let n = match f {
                Fault::ReadError | Fault::FlipBit | Fault::Truncated => 1,
                _ => 1 + next(3),
            };
            self.arm(f, n);
            std::thread::sleep(ms(1 + next(10)));
            self.disarm();
            std::thread::sleep(ms(20 + next(20)));
        }
    }

    /// Makes `device_inflight` report these counts.
    pub fn set_device_inflight(&self, reads: u16, writes: u16) {
        self.inflight.store(
            u32::from(reads) << 16 | u32::from(writes),
            Ordering::Relaxed,
        );
    }

    fn take(&self, want: &[Fault]) -> Option<Fault> {
        let mut f = self.fault.lock();
        let (fault, count) = (*f)?;
        if !want.contains(&fault) {
            return None;
        }
        *f = if count > 1 {
            Some((fault, count - 1))
        } else {
            None
        };
        self.injected.fetch_add(1, Ordering::Relaxed);
        Some(fault)
    }
}

impl<S: BackingStore> BackingStore for FaultInjector<S> {
    fn write_slots(&self, first: u64, pages: &[&[u8]]) -> io::Result<()> {
        match self.take(&[Fault::WriteError, Fault::NoSpace, Fault::ShortWrite]) {
            Some(Fault::WriteError) => Err(io::Error::from_raw_os_error(libc::EIO)),
            Some(Fault::NoSpace) => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            Some(_) => {
                // Half of the data reaches the file, then the write stops.
                let half = pages.len() / 2;
                if half > 0 {
                    self.inner.write_slots(first, &pages[..half])?;
                }
                Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "short write (injected)",
                ))
            }
            None => self.inner.write_slots(first, pages),
        }
    }

    fn read_slot(&self, slot: u64, page: &mut [u8]) -> io::Result<()> {
        match self.take(&[Fault::ReadError, Fault::FlipBit, Fault::Truncated]) {
            Some(Fault::ReadError) => Err(io::Error::from_raw_os_error(libc::EIO)),
            Some(Fault::Truncated) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "backing file truncated (injected)",
            )),
            Some(_) => {
                self.inner.read_slot(slot, page)?;
                let bit = (slot as usize * 8191 + 3) % (page.len() * 8);
                page[bit / 8] ^= 1 << (bit % 8);
                Ok(())
            }
            None => self.inner.read_slot(slot, page),
        }
    }

    fn discard(&self, first: u64, count: u64) {
        self.inner.discard(first, count)
    }

    fn device_inflight(&self) -> Option<(u32, u32)> {
        match self.inflight.load(Ordering::Relaxed) {
            u32::MAX => self.inner.device_inflight(),
            v => Some((v >> 16, v & 0xffff)),
        }
    }

    fn describe(&self) -> String {
        format!("fault-injecting {}", self.inner.describe())
    }

    fn fork_private(&self, end: u64) -> io::Result<()> {
        self.inner.fork_private(end)
    }

    fn shares_at_fork(&self) -> bool {
        self.inner.shares_at_fork()
    }

    fn fork_share_prepare(&self) -> io::Result<()> {
        self.inner.fork_share_prepare()
    }

    fn fork_lock(&self) {
        self.inner.fork_lock()
    }

    unsafe fn fork_unlock(&self, side: Side) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.fork_unlock(side) }
    }

    unsafe fn fork_share(&self, side: Side, next: u64, live: u64) -> io::Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.fork_share(side, next, live) }
    }

    fn release_shared(&self, slot: u64) {
        self.inner.release_shared(slot)
    }
}

/// Free-slot bookkeeping: free extents (start → length) below `end`, the
/// first never-used slot. Allocation prefers one extent that holds the whole
/// run, then the end of the file, then pieces.
///
/// Slots are numbered from `base`, the current file's first slot (see
/// [`FileBacking`], "A fork shares the file"): [`SlotMap::rebase`] starts
/// a new file's numbering.
#[derive(Debug, Default)]
pub struct SlotMap {
    free: BTreeMap<u64, u64>,
    base: u64,
    end: u64,
    capacity: Option<u64>,
    used: u64,
}

impl SlotMap {
    pub fn new(capacity: Option<u64>) -> SlotMap {
        SlotMap {
            capacity,
            ..SlotMap::default()
        }
    }

    pub fn used(&self) -> u64 {
        self.used
    }

    /// Slots past the last used one are never read: the current file's
    /// high mark, in slots from its first.
    pub fn end(&self) -> u64 {
        self.end - self.base
    }

    /// The current file's first slot: slots below it are in files shared
    /// since a fork, which this map does not hand out.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Starts over for a new file whose first slot is `base` (at a fork,
    /// after the slots so far became shared): every slot below is
    /// forgotten.
    pub fn rebase(&mut self, base: u64) {
        debug_assert!(base >= self.end, "slot {base} is below the high mark");
        *self = SlotMap {
            base,
            end: base,
            capacity: self.capacity,
            ..SlotMap::default()
        };
    }

    /// Allocates up to `n` slots as runs `(first, len)`; fewer (possibly
    /// none) when the capacity is reached.
    pub fn alloc(&mut self, n: u64) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        let mut want = n;
        if let Some((&start, &len)) = self.free.iter().find(|(_, &len)| len >= want) {
            self.take_extent(start, len, want, &mut runs);
            want = 0;
        }
        if want > 0 {
            let room = self
                .capacity
                .map_or(u64::MAX, |c| c.saturating_sub(self.end - self.base));
            let tail = want.min(room);
            if tail > 0 {
                runs.push((self.end, tail));
                self.end += tail;
                self.used += tail;
                want -= tail;
            }
        }
        while want > 0 {
            let Some((&start, &len)) = self.free.iter().next() else {
                break;
            };
            let take = want.min(len);
            self.take_extent(start, len, take, &mut runs);
            want -= take;
        }
        runs
    }

    fn take_extent(&mut self, start: u64, len: u64, take: u64, runs: &mut Vec<(u64, u64)>) {
        self.free.remove(&start);
        if len > take {
            self.free.insert(start + take, len - take);
        }
        runs.push((start, take));
        self.used += take;
    }

    /// Returns a slot; merges it with free neighbours. Returns the merged
    /// extent so the caller may discard it.
    pub fn free(&mut self, slot: u64) -> (u64, u64) {
        debug_assert!(slot < self.end);
        self.used -= 1;
        let mut start = slot;
        let mut len = 1;
        if let Some((&s, &l)) = self.free.range(..slot).next_back() {
            debug_assert!(s + l <= slot, "slot {slot} freed twice");
            if s + l == slot {
                self.free.remove(&s);
                start = s;
                len += l;
            }
        }
        if let Some(l) = self.free.remove(&(slot + 1)) {
            len += l;
        }
        if start + len == self.end {
            // The tail shrinks back: the file's high mark falls.
            self.end = start;
        } else {
            self.free.insert(start, len);
        }
        (start, len)
    }

    /// Whether `slot` is allocated (for invariant checks).
    pub fn is_used(&self, slot: u64) -> bool {
        slot >= self.base
            && slot < self.end
            && self
                .free
                .range(..=slot)
                .next_back()
                .is_none_or(|(&s, &l)| slot >= s + l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn slot_runs_are_adjacent_and_reused() {
        let mut m = SlotMap::new(None);
        assert_eq!(m.alloc(8), vec![(0, 8)]);
        for s in [2, 3, 4, 6] {
            m.free(s);
        }
        assert_eq!(m.used(), 4);
        // A run of 3 fits in the extent 2..5.
        assert_eq!(m.alloc(3), vec![(2, 3)]);
        // A run of 4 does not fit in 6..7: taken from the end.
        assert_eq!(m.alloc(4), vec![(8, 4)]);
        assert!(m.is_used(5) && !m.is_used(6) && m.is_used(11));
        for s in 0..12 {
            if s != 6 {
                m.free(s);
            }
        }
        assert_eq!((m.used(), m.end()), (0, 0), "everything merged back");
    }

    #[test]
    fn capacity_limits_and_pieces() {
        let mut m = SlotMap::new(Some(6));
        assert_eq!(m.alloc(4), vec![(0, 4)]);
        m.free(1);
        assert_eq!(m.alloc(4), vec![(4, 2), (1, 1)]);
        assert!(m.alloc(1).is_empty());
    }

    /// How many of the first `pages` pages of `b`'s file are in the page
    /// cache (`mincore` of a shared mapping of it).
    fn cached_pages(b: &FileBacking, pages: usize) -> usize {
        let len = pages * PAGE_SIZE;
        // SAFETY: maps our own descriptor read-only for this function; the
        // mapping is unmapped before it returns, and `vec` has a byte per
        // page.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                b.fd(),
                0,
            );
            assert_ne!(p, libc::MAP_FAILED, "{}", io::Error::last_os_error());
            let mut vec = vec![0u8; pages];
            assert_eq!(libc::mincore(p, len, vec.as_mut_ptr()), 0);
            libc::munmap(p, len);
            vec.iter().filter(|&&v| v & 1 == 1).count()
        }
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

    /// The window: a read outside it asks for the slots after it (more
    /// when it follows the last), a read in order that runs low asks for
    /// the next window, and what a window leaves behind is dropped.
    #[test]
    fn the_window_moves_ahead_of_reads_in_order_and_drops_what_it_leaves() {
        let mut a = Ahead::default();
        let p = a.plan(100);
        assert_eq!((p.ahead, p.fetch), (false, 101..108));
        assert_eq!(p.drop, [0..0, 0..0]);
        // In the window, following, half a window or less ahead: the
        // next window at once.
        let p = a.plan(101);
        assert_eq!((p.ahead, p.fetch), (true, 108..124));
        assert_eq!(p.drop, [0..0, 0..0]);
        // More than half a window ahead: nothing to do.
        for s in 102..116 {
            assert_eq!(
                a.plan(s),
                Plan {
                    ahead: true,
                    fetch: 0..0,
                    drop: [0..0, 0..0]
                }
            );
        }
        // Half or less again: the next window, and the slots read leave.
        let p = a.plan(116);
        assert_eq!((p.ahead, p.fetch), (true, 124..140));
        assert_eq!(p.drop, [101..116, 0..0]);
        assert_eq!((a.lo, a.hi), (116, 140));
        // A jump: a window around the new slot; the old one is dropped,
        // less what the new one holds again.
        let p = a.plan(210);
        assert_eq!((p.ahead, p.fetch), (false, 211..218));
        assert_eq!(p.drop, [116..140, 0..0]);
        // Overlapping windows (the old one served a read): only what the
        // new one does not hold leaves.
        assert!(a.plan(213).ahead);
        let p = a.plan(205);
        assert_eq!(p.fetch, 206..213);
        assert_eq!(p.drop, [0..0, 213..218]);
        // Outside the window, not following: a short one; following the
        // slot read last: a long one.
        let mut b = Ahead::default();
        assert_eq!(b.plan(130).fetch, 131..138);
        let p = b.plan(131);
        assert_eq!((p.ahead, p.fetch), (true, 138..154));
        assert_eq!((b.lo, b.hi), (131, 154));
        let mut c = Ahead {
            next: 40,
            ..Ahead::default()
        };
        assert_eq!(c.plan(40).fetch, 41..56);
    }

    /// Reads at random make the window read around a slot shorter, down
    /// to none; a window that serves a read makes it longer again.
    #[test]
    fn windows_that_serve_no_read_shrink_and_served_ones_grow() {
        let mut a = Ahead::default();
        let mut sizes = Vec::new();
        for s in [1000u64, 5000, 9000, 13000, 17000] {
            let p = a.plan(s);
            assert!(!p.ahead);
            sizes.push(p.fetch.end - p.fetch.start);
        }
        assert_eq!(sizes, vec![7, 3, 1, 0, 0]);
        // Reads in order still read ahead: a long window, which serves.
        assert_eq!(a.plan(17001).fetch, 17002..17017);
        assert!(a.plan(17002).ahead);
        // The next jump finds the window served: twice as long as before.
        assert_eq!(a.plan(30000).fetch, 30001..30002);
        assert!(a.plan(30001).ahead);
        let p = a.plan(40000);
        assert_eq!(p.fetch, 40001..40004);
        assert_eq!(p.drop, [30001..30018, 0..0]);
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
