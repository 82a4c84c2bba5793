//! uzswap-cache: zswap in userspace. A cache of 4 KiB pages keyed by
//! `(area, offset)` — the frontswap contract — that compresses pages into a
//! pool ([`uzswap_zpool`]), records same-filled pages without memory, can
//! share identical pages, and writes the least recently used entries back
//! to a backing tier (by default an encrypted, unlinked local file) when the
//! pool reaches its limit.
//!
//! Usable on its own: nothing here knows about page faults.
//!
//! ```
//! use uzswap_cache::{Cache, CacheConfig, LoadMode, PoolLimit};
//! let cache = Cache::new(CacheConfig {
//!     pool_limit: PoolLimit::Bytes(64 << 20),
//!     ..CacheConfig::default()
//! })?;
//! cache.open_area(0)?;
//! let page = [7u8; 4096];
//! cache.store(0, 42, &page)?;
//! let mut back = [0u8; 4096];
//! cache.load(0, 42, &mut back, LoadMode::Exclusive)?;
//! assert_eq!(back, page);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod admission;
pub mod backing;
mod cache;
pub mod codec;
mod config;
pub mod dedup;
mod index;
mod seal;
mod stats;
mod sys;

pub use admission::IoLimits;
pub use backing::{BackingStore, FileBacking, TierStats};
#[cfg(feature = "testing")]
pub use backing::{Fault, FaultInjector};
#[cfg(not(feature = "shuttle"))]
pub use cache::ForkError;
pub use cache::{same_filled_word, Cache, CacheUsage, LoadMode, Loaded, Stored, SHARDS};
pub use codec::{Codec, Compressor};
pub use config::{
    Backing, CacheConfig, DedupScope, Error, Incompressible, LoadError, PoolLimit, Proactive,
    Reject, StoreError, MAX_AREAS,
};
pub use stats::CacheStats;
/// The page size the cache works in (the OS page).
pub use uzswap_os::PAGE_SIZE;

/// Sets up the calling thread's per-thread buffers and codec states now.
///
/// Their first use registers a thread-local destructor, which takes the
/// dynamic loader's lock. A thread that may call the cache while a program
/// thread holds that lock (inside `dlopen`) and waits for it (a fault the
/// calling thread must resolve, as a pager's evictor and handlers do)
/// calls this first, before it holds anything.
pub fn warm_thread() {
    cache::warm_store_buffers();
    codec::warm_thread();
}
pub use uzswap_zpool::{AllocatorKind, PoolStats};
