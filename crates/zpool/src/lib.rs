//! uzswap-zpool: allocators for compressed pages.
//!
//! This crate is the lowest layer of uzswap. It knows nothing of caches,
//! compression or faults: it hands out *handles* to objects of 1..=4096 bytes
//! and keeps them readable while it moves objects around to fight
//! fragmentation. Of the project's crates it depends only on uzswap-os
//! (page size, helper threads, and the sync shim that the `shuttle` feature
//! switches to the model checker's primitives).
//!
//! # Glossary
//! - **page**: a 4096-byte OS page, the unit the pool takes from and gives
//!   back to the kernel.
//! - **zspage**: a run of 1..=N contiguous pages that one size class carves
//!   into equal slots; objects may straddle the page boundaries inside it.
//! - **class**: all zspages holding objects of one rounded size. Classes with
//!   the same geometry (pages per zspage, objects per zspage) are merged.
//! - **handle**: the opaque name of an object. It stays valid, and the bytes
//!   behind it unchanged, while compaction moves the object.
//! - **pool bytes**: pages held × 4096, the memory the pool costs the process
//!   (object metadata is reported apart, as `metadata_bytes`).
//!
//! # Allocators
//! - [`zsmalloc::ZsPool`]: size classes in 16-byte steps, zspages, per-class
//!   locks, compaction by class watermark, as the kernel's zsmalloc.
//! - [`xcf`]: a scatter-gather allocator after zcache's xcfmalloc (objects as chains
//!   of blocks that may span pages).
//!
//! Both implement [`Zpool`], so a cache can take either, chosen at creation.

pub mod stats;
mod sys;
pub mod xcf;
pub mod zsmalloc;

pub use stats::{ClassStats, CompactReport, PoolStats};
pub use sys::RELEASE_BATCH_PAGES;
pub use zsmalloc::{ZsConfig, ZsPool};

use std::num::NonZeroU64;
use uzswap_os::PAGE_SIZE;

/// Largest object a pool stores: one page.
pub const MAX_OBJECT_SIZE: usize = PAGE_SIZE;

/// The name of an allocated object.
///
/// A handle is opaque: its bits encode where the allocator keeps the
/// object's bookkeeping, plus a generation and a pool tag, so that a handle
/// that was freed (stale) or that belongs to another pool (foreign) is
/// detected and refused with an error instead of reaching other memory.
/// `Option<Handle>` is 8 bytes.
#[derive(Copy, Clone, Eq, PartialEq, Hash, Debug, PartialOrd, Ord)]
pub struct Handle(NonZeroU64);

impl Handle {
    /// Builds a handle from its raw bits (as given by [`Handle::to_raw`]).
    /// Returns `None` for 0, which is never a handle.
    pub fn from_raw(raw: u64) -> Option<Handle> {
        NonZeroU64::new(raw).map(Handle)
    }

    /// The raw bits, for storing a handle compactly.
    pub fn to_raw(self) -> u64 {
        self.0.get()
    }
}

/// What went wrong in a pool call. Each variant's text says what to do.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// The requested object size is outside 1..=4096.
    #[error("object size {size} is out of range: a pool stores objects of 1..={max} bytes; store larger data in several objects")]
    InvalidSize { size: usize, max: usize },
    /// The handle was freed (or never allocated in this slot).
    #[error("stale handle {0:#x}: its object was freed; a handle must not be used after free()")]
    StaleHandle(u64),
    /// The handle was made by another pool (or is not a handle at all).
    #[error("foreign handle {0:#x}: it was not made by this pool; pass each handle to the pool that returned it")]
    ForeignHandle(u64),
    /// A buffer passed to read or write does not match the object's size.
    #[error("buffer of {got} bytes does not fit object of {object} bytes: {what}")]
    BadBuffer {
        got: usize,
        object: usize,
        what: &'static str,
    },
    /// Taking more pages would pass the pool's hard limit.
    #[error(
        "pool limit of {limit_bytes} bytes reached: free objects, compact, or raise the limit"
    )]
    LimitReached { limit_bytes: u64 },
    /// The operating system refused memory.
    #[error(
        "the OS refused {bytes} bytes of memory ({errno}): reduce the pool size or free memory"
    )]
    OutOfMemory { bytes: usize, errno: i32 },
    /// A configuration value is out of range.
    #[error("invalid pool configuration: {0}")]
    Config(String),
}

/// The allocator interface shared by every pool of this crate.
///
/// Every method may be called from many threads at once. Methods that take a
/// handle validate it and return [`Error::StaleHandle`] or
/// [`Error::ForeignHandle`] rather than touch memory they do not own.
pub trait Zpool: Send + Sync {
    /// Short name of the allocator ("zsmalloc", "xcf").
    fn name(&self) -> &'static str;

    /// Allocates an object of `size` bytes (1..=4096). Its contents are
    /// unspecified until written (in practice zeros: freed memory is wiped).
    fn malloc(&self, size: usize) -> Result<Handle, Error>;

    /// Frees an object; returns its size. The handle becomes stale.
    fn free(&self, handle: Handle) -> Result<usize, Error>;

    /// The size the object was allocated with.
    fn object_size(&self, handle: Handle) -> Result<usize, Error>;

    /// Overwrites the whole object. `data.len()` must equal its size.
    fn write(&self, handle: Handle, data: &[u8]) -> Result<(), Error>;

    /// Copies the object into `buf` (which must be at least its size);
    /// returns the size.
    fn read(&self, handle: Handle, buf: &mut [u8]) -> Result<usize, Error>;

    /// Calls `f` with the object's bytes: in place when the object is
    /// contiguous in memory (zero-copy), through a bounce buffer when not.
    /// The object cannot move or be freed while `f` runs; `f` must not call
    /// back into the pool.
    fn map_read(&self, handle: Handle, f: &mut dyn FnMut(&[u8])) -> Result<(), Error>;

    /// [`Self::map_read`], then frees the object if `f` returned true (an
    /// exclusive load: read it, and let it go unless the read failed).
    /// Returns whether it was freed. An allocator may do both under one
    /// lock, which then stays held while `f` runs.
    fn map_read_free(
        &self,
        handle: Handle,
        f: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<bool, Error> {
        let mut free = false;
        self.map_read(handle, &mut |obj| free = f(obj))?;
        if free {
            self.free(handle)?;
        }
        Ok(free)
    }

    /// Allocates an object holding a copy of `data`.
    fn malloc_write(&self, data: &[u8]) -> Result<Handle, Error> {
        let handle = self.malloc(data.len())?;
        if let Err(e) = self.write(handle, data) {
            // The handle is fresh and ours: freeing it cannot fail.
            let _ = self.free(handle);
            return Err(e);
        }
        Ok(handle)
    }

    /// Moves objects out of sparse zspages into full ones and returns the
    /// emptied pages to the OS. Handles stay valid.
    fn compact(&self) -> CompactReport;

    /// A snapshot of the per-class table and the totals.
    fn stats(&self) -> PoolStats;

    /// Pages held × page size.
    fn pool_bytes(&self) -> u64;

    /// Sets (or removes) the hard limit on pool bytes. Lowering it below the
    /// current size frees nothing: later allocations that need a page fail.
    fn set_limit(&self, limit_bytes: Option<u64>);

    /// Walks every structure and re-derives every counter; returns a
    /// description of the first broken invariant. For tests; takes every
    /// lock of the pool in turn.
    fn check_invariants(&self) -> Result<(), String>;

    /// Fork: takes every lock of the pool, in the pool's own lock order, and
    /// keeps them all held (a thread inside the pool finishes its call
    /// first), so that the child's copy of the pool is consistent. Must be
    /// followed, on the same thread, by [`Self::fork_parent`] (in the
    /// parent) or [`Self::fork_child`] (in the child); meanwhile this thread
    /// must not call the pool (it would wait for itself).
    ///
    /// For a `pthread_atfork` prepare handler. Handles stay valid in both
    /// processes: the child's pool is a copy-on-write copy of the parent's.
    /// Panics under the `shuttle` feature (the model checker never forks).
    fn fork_prepare(&self);

    /// Releases every lock [`Self::fork_prepare`] took.
    ///
    /// # Safety
    /// Only after `fork_prepare` on this thread, in the parent.
    unsafe fn fork_parent(&self);

    /// Releases every lock [`Self::fork_prepare`] took, in the child.
    /// Starts no thread: threads start only once every lock the prepare
    /// hooks of the process hold was released ([`Self::fork_child_start`]),
    /// since a thread started earlier could block on one of them.
    ///
    /// # Safety
    /// Only after `fork_prepare` on this thread, in the child, where this
    /// thread is the only one.
    unsafe fn fork_child(&self);

    /// In the child, after [`Self::fork_child`] (and after every other lock
    /// a parent thread could have waited on is released): restarts the
    /// pool's helper threads (zsmalloc's compactor), which do not exist in
    /// the child. Work queued for them before the fork is kept and done by
    /// the new ones.
    fn fork_child_start(&self) {}
}

/// Which allocator to build; see [`new_pool`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum AllocatorKind {
    /// The zsmalloc-class allocator.
    #[default]
    Zsmalloc,
    /// The scatter-gather allocator after zcache's xcfmalloc.
    Xcf,
}

impl std::str::FromStr for AllocatorKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "zsmalloc" => Ok(AllocatorKind::Zsmalloc),
            "xcf" | "xcfmalloc" => Ok(AllocatorKind::Xcf),
            other => Err(Error::Config(format!(
                "unknown allocator {other:?}: choose zsmalloc or xcf"
            ))),
        }
    }
}

/// Builds a pool of the given kind with a hard limit (None: unlimited) and
/// `shards` shards (None: the allocator's default: zsmalloc one per CPU up
/// to four, xcf four);
/// `thread_start` is run first on any helper thread the pool starts (see
/// [`uzswap_os::spawn_helper`]).
#[allow(clippy::needless_update)] // the configs grow; defaults fill the rest
pub fn new_pool(
    kind: AllocatorKind,
    limit_bytes: Option<u64>,
    shards: Option<usize>,
    thread_start: Option<fn()>,
) -> Result<std::sync::Arc<dyn Zpool>, Error> {
    Ok(match kind {
        AllocatorKind::Zsmalloc => std::sync::Arc::new(ZsPool::new(ZsConfig {
            limit_bytes,
            shards,
            thread_start,
            ..ZsConfig::default()
        })?),
        AllocatorKind::Xcf => {
            let d = xcf::XcfConfig::default();
            std::sync::Arc::new(xcf::XcfPool::new(xcf::XcfConfig {
                limit_bytes,
                shards: shards.unwrap_or(d.shards),
                ..d
            })?)
        }
    })
}

/// Checks an object size against the range every pool accepts.
pub(crate) fn check_size(size: usize) -> Result<(), Error> {
    if size == 0 || size > MAX_OBJECT_SIZE {
        return Err(Error::InvalidSize {
            size,
            max: MAX_OBJECT_SIZE,
        });
    }
    Ok(())
}
