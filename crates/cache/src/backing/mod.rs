//! The backing tier: where written-back pages go.
//!
//! [`BackingStore`] is the small trait a tier implements: fixed 4 KiB slots,
//! vectored writes of adjacent slots, single-slot reads. The cache seals
//! (encrypts or checksums) pages before they reach the store, so a store
//! sees only opaque slots and needs no integrity logic of its own.
//! [`FileBacking`] is the default: a sparse local file, owner-only, unlinked
//! as soon as it is open. `FaultInjector` (feature `testing`) wraps any
//! store and fails on command, for tests and the soak.
//!
//! [`SlotMap`] hands out slots, preferring runs of adjacent free slots so a
//! writeback batch becomes one `pwritev`.
//!
//! One file per job:
//! - `mod.rs`: the trait and its contract, and what a tier says of its
//!   traffic ([`TierStats`]);
//! - `file.rs`: [`FileBacking`], the local file: its slots, how written
//!   pages leave the page cache, and how a fork shares the file;
//! - `readahead.rs`: the file's window read ahead ([`FILE_READ_AHEAD`],
//!   [`FILE_READ_AROUND`]);
//! - `slots.rs`: [`SlotMap`], the cache's free-slot bookkeeping;
//! - `faults.rs`: `FaultInjector`, a store that fails on command (feature
//!   `testing`).
//!
//! The file's system calls are the crate's `sys`.

#[cfg(feature = "testing")]
mod faults;
mod file;
mod readahead;
mod slots;

#[cfg(feature = "testing")]
pub use faults::{Fault, FaultInjector};
pub use file::{FileBacking, MAX_SHARED_FILES};
pub use readahead::{FILE_READ_AHEAD, FILE_READ_AROUND};
pub use slots::SlotMap;

use std::io;
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
/// gives the cache (tests arm a `FaultInjector` this way).
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
