//! Configuration and errors of the cache.

use crate::admission::IoLimits;
use crate::backing::BackingStore;
use crate::codec::{BadCompressor, Compressor};
use std::path::PathBuf;
use std::time::Duration;
use uzswap_zpool::AllocatorKind;

/// The pool's size limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolLimit {
    /// A share of the machine's RAM (the kernel's `max_pool_percent`).
    Percent(u8),
    /// An absolute size in bytes.
    Bytes(u64),
    /// No limit: nothing is ever written back for room.
    Unlimited,
}

impl Default for PoolLimit {
    fn default() -> Self {
        // The kernel's default max_pool_percent.
        PoolLimit::Percent(20)
    }
}

/// What to do with a page that does not compress below the threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Incompressible {
    /// Keep it uncompressed in the pool (today's kernel).
    #[default]
    StoreRaw,
    /// Refuse it (the first zswap's `max_compression_ratio`); with a backing tier
    /// it goes there instead.
    Reject,
}

/// Which pages may share one object when dedup is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DedupScope {
    /// Only pages of the same area (one region, one tenant): no tenant can
    /// learn from sharing or timing what another holds.
    #[default]
    Area,
    /// Pages of every area of the cache.
    Global,
}

/// The backing tier.
#[derive(Default)]
pub enum Backing {
    /// None: when the pool is full, stores are refused.
    #[default]
    None,
    /// A local file; the path may be a directory (an unnamed file is made
    /// in it) or a file name that does not exist yet.
    File(PathBuf),
    /// Any other tier.
    Store(Box<dyn BackingStore>),
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backing::None => write!(f, "None"),
            Backing::File(p) => write!(f, "File({})", p.display()),
            Backing::Store(s) => write!(f, "Store({})", s.describe()),
        }
    }
}

/// Background writeback before the pool is full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proactive {
    /// Entries stored longer ago than this are written back.
    pub max_age: Option<Duration>,
    /// Keep the pool at most this share of its limit (writes back the
    /// coldest entries beyond it).
    pub max_pool_percent_of_limit: Option<u8>,
}

/// Everything the cache can be told at creation.
#[derive(Debug)]
pub struct CacheConfig {
    /// The compressor for new stores (switchable later).
    pub compressor: Compressor,
    /// The allocator of the pool.
    pub allocator: AllocatorKind,
    /// Shards of the pool's allocator. Stores made on different CPUs go to
    /// different shards, each with all the size classes and so its own
    /// partly filled zspage in each; more shards let stores on many
    /// threads run apart, at that cost in memory. None: the allocator's
    /// default (zsmalloc: one per CPU, at most four; xcf: four). A user
    /// whose stores all come from one thread (a pager's evictor) wants 1.
    pub pool_shards: Option<usize>,
    /// The pool limit (changeable later).
    pub pool_limit: PoolLimit,
    /// Once full, stores are refused until the pool falls below this share
    /// of the limit (the kernel's accept_threshold_percent, 90).
    pub accept_threshold_percent: u8,
    /// A page compressing to more than this share of a page counts as
    /// incompressible (100: only pages that do not shrink at all).
    pub max_compressed_percent: u8,
    /// What to do with incompressible pages.
    pub incompressible: Incompressible,
    /// Record pages of one repeated 8-byte word without pool memory.
    pub same_filled: bool,
    /// The compressor for pages stored with [`crate::Cache::store_cold`]:
    /// pages the caller does not expect back soon (a pager's victims that
    /// never joined its working set) can take a denser, slower
    /// codec while pages that come back keep the fast one, as zram
    /// recompresses its idle pages with a second algorithm. None: the
    /// main compressor for every page.
    pub cold_compressor: Option<Compressor>,
    /// Share identical pages (changeable later).
    pub dedup: bool,
    /// Which pages may share.
    pub dedup_scope: DedupScope,
    /// The backing tier.
    pub backing: Backing,
    /// The most the backing tier may hold, in bytes (None: unbounded).
    pub backing_max_bytes: Option<u64>,
    /// Encrypt written-back pages (else: checksum them).
    pub encrypt: bool,
    /// Entries written back per batch.
    pub writeback_batch: usize,
    /// IO-aware admission limits (0, 0: off).
    pub io_limits: IoLimits,
    /// Background writeback before the pool is full (None: off).
    pub proactive: Option<Proactive>,
    /// Run the background writer thread (tests may drive writeback by hand).
    pub background_writer: bool,
    /// Called first on the writer thread (e.g. to mark it as the runtime's
    /// own thread, as `uzswap run` does).
    pub thread_start: Option<fn()>,
    /// Test hook (feature `testing`): the hash dedup uses to find
    /// candidates (a constant forces every page to collide). None: xxh3.
    #[cfg(feature = "testing")]
    pub dedup_hasher: Option<fn(&[u8]) -> u64>,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            compressor: Compressor::Lz4,
            allocator: AllocatorKind::Zsmalloc,
            pool_shards: None,
            pool_limit: PoolLimit::default(),
            accept_threshold_percent: 90,
            max_compressed_percent: 100,
            incompressible: Incompressible::StoreRaw,
            same_filled: true,
            cold_compressor: None,
            dedup: false,
            dedup_scope: DedupScope::Area,
            backing: Backing::None,
            backing_max_bytes: None,
            encrypt: true,
            writeback_batch: 64,
            io_limits: IoLimits::default(),
            proactive: None,
            background_writer: true,
            thread_start: None,
            #[cfg(feature = "testing")]
            dedup_hasher: None,
        }
    }
}

/// The most area ids a cache serves (ids 0..MAX_AREAS).
pub const MAX_AREAS: u32 = 1 << 16;

/// Errors of the cache's entry points.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A page buffer of the wrong length.
    #[error("a page must be exactly 4096 bytes, got {len}: pass one whole page")]
    BadPageSize {
        /// The length given.
        len: usize,
    },
    /// An area id out of range.
    #[error("area {area} is out of range: area ids are 0..{MAX_AREAS}")]
    AreaOutOfRange {
        /// The id given.
        area: u32,
    },
    /// An area not opened.
    #[error("area {area} is not open: call open_area({area}) first")]
    UnknownArea {
        /// The id given.
        area: u32,
    },
    /// A configuration value out of range.
    #[error("invalid cache configuration: {0}")]
    Config(String),
    /// A compressor name or level not understood.
    #[error(transparent)]
    Compressor(#[from] BadCompressor),
    /// The backing file could not be created.
    #[error("cannot create the backing file at {path}: {source}; pass a writable directory or a new file name")]
    BackingCreate {
        /// Where.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The OS random source failed (no key for the backing file).
    #[error("cannot make an encryption key: {0}; the OS random source (getrandom) must work, or set encrypt: false to checksum instead")]
    Random(std::io::Error),
    /// The pool could not be built.
    #[error(transparent)]
    Pool(#[from] uzswap_zpool::Error),
    /// Writeback was asked of a cache without a backing tier.
    #[error("the cache has no backing tier: configure one (Backing::File) to write back")]
    NoBacking,
}

/// Why a store was refused. The caller still owns the page; nothing of it
/// was kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    /// The pool is at its limit (or above, until it falls below the accept
    /// threshold) and there is no backing tier to take the page.
    #[error(
        "the pool is full and there is no backing tier; raise the pool limit or add a backing file"
    )]
    PoolFull,
    /// The page compressed too poorly and the policy refuses such pages.
    #[error("the page compressed too poorly ({size} bytes): keep such pages raw (Incompressible::StoreRaw), raise max_compressed_percent, or add a backing tier")]
    CompressPoor {
        /// Its compressed size.
        size: usize,
    },
    /// The allocator refused the object.
    #[error("the pool allocator refused the object: {0}; add a backing tier to take such pages")]
    Alloc(String),
    /// The page had to go to the backing tier, which is full.
    #[error("the backing tier is full ({slots} slots); raise its limit or free space")]
    BackingFull {
        /// Its size in slots.
        slots: u64,
    },
    /// The page had to go to the backing tier, and the write failed.
    #[error("writing to the backing tier failed: {0}; check the file system under the backing file (space, errors)")]
    BackingIo(String),
}

/// Store failures: bad input or a refusal.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Bad arguments.
    #[error(transparent)]
    Invalid(#[from] Error),
    /// The cache declined the page.
    #[error("page refused: {0}")]
    Refused(#[from] Reject),
}

/// Load failures. On any of them the caller's buffer holds zeros, never
/// some other page's bytes.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Bad arguments.
    #[error(transparent)]
    Invalid(#[from] Error),
    /// The cache does not hold the key.
    #[error("no page stored under this key")]
    NotFound,
    /// The backing tier could not be read. The entry is kept.
    #[error("reading the backing tier failed: {0}; the entry is kept: retry, or check the device under the backing file")]
    Io(std::io::Error),
    /// The stored data did not authenticate or decompress. The entry is
    /// kept (a later load fails the same way); invalidate it to drop it.
    #[error("the stored page is corrupt ({where_}); it is not returned and the entry is kept: invalidate it and rebuild the data")]
    Corrupt {
        /// "pool" or "backing".
        where_: &'static str,
    },
}

pub(crate) fn validate(cfg: &CacheConfig) -> Result<(), Error> {
    let pct = |name: &str, v: u8| {
        if (1..=100).contains(&v) {
            Ok(())
        } else {
            Err(Error::Config(format!("{name} must be 1..=100, got {v}")))
        }
    };
    pct("accept_threshold_percent", cfg.accept_threshold_percent)?;
    pct("max_compressed_percent", cfg.max_compressed_percent)?;
    if let PoolLimit::Percent(p) = cfg.pool_limit {
        pct("pool limit percent", p)?;
    }
    if let PoolLimit::Bytes(0) = cfg.pool_limit {
        return Err(Error::Config(
            "pool limit of 0 bytes: use PoolLimit::Bytes(n > 0)".into(),
        ));
    }
    if !(1..=1024).contains(&cfg.writeback_batch) {
        return Err(Error::Config(format!(
            "writeback_batch must be 1..=1024, got {}",
            cfg.writeback_batch
        )));
    }
    if let Some(p) = cfg.proactive {
        if let Some(s) = p.max_pool_percent_of_limit {
            pct("proactive max_pool_percent_of_limit", s)?;
        }
        if p.max_age.is_none() && p.max_pool_percent_of_limit.is_none() {
            return Err(Error::Config(
                "proactive writeback needs max_age or max_pool_percent_of_limit".into(),
            ));
        }
    }
    if cfg.backing_max_bytes == Some(0) {
        return Err(Error::Config(
            "backing_max_bytes of 0: use None for unbounded or at least 4096".into(),
        ));
    }
    cfg.compressor.validate()?;
    if let Some(c) = cfg.cold_compressor {
        c.validate()?;
    }
    Ok(())
}

/// Total RAM, for percent limits.
pub(crate) fn total_ram() -> u64 {
    // Where it cannot be read: 8 GiB.
    crate::sys::total_ram().unwrap_or(8 << 30)
}

impl PoolLimit {
    pub(crate) fn bytes(self) -> u64 {
        match self {
            PoolLimit::Percent(p) => total_ram() / 100 * u64::from(p),
            PoolLimit::Bytes(b) => b,
            PoolLimit::Unlimited => u64::MAX,
        }
    }
}
