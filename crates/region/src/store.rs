//! Where evicted pages go: the [`PageStore`] trait, shaped after
//! `uzswap_cache::Cache` so that the cache can implement it directly, and
//! [`MemStore`], a small in-memory implementation for tests and examples.
//!
//! Keys are `(area, offset)`: `area` is a region's id ([`crate::Region::area`])
//! and `offset` the page's index inside the region (not a byte offset), as
//! the kernel's swap offset is a page index.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use uzswap_os::lock::Mutex;

/// What a successful store kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Stored {
    /// The page was compressed to `bytes` bytes.
    Compressed {
        /// Compressed size.
        bytes: usize,
    },
    /// The page is one repeated word; nothing but the word is kept.
    SameFilled,
}

// Where a load found the page, and whether it keeps the entry: the cache's
// own types, so that the cache implements the trait without translating.
pub use uzswap_cache::{LoadMode, Loaded};

/// Why a store was refused. The page stays resident.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The store is full (pool limit reached and no backing file room).
    #[error("the page store is full")]
    Full,
    /// Any other refusal (incompressible page with no backing file, ...).
    #[error("the page store refused the page: {0}")]
    Rejected(String),
}

/// Why a load failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// No entry for the key.
    #[error("no stored page for this key")]
    NotFound,
    /// The backing file could not be read.
    #[error("backing file read failed: {0}")]
    Io(String),
    /// The entry failed its integrity check or did not decompress.
    #[error("stored page is corrupt")]
    Corrupt,
}

/// A snapshot of a store's counters.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoreStats {
    /// Entries held.
    pub pages: u64,
    /// Entries that are same-filled pages.
    pub same_filled_pages: u64,
    /// Bytes of compressed payload held.
    pub payload_bytes: u64,
    /// Implementation-specific counters (name, value).
    pub extra: Vec<(String, u64)>,
}

/// A keyed store of 4 KiB pages. All methods may be called from any thread.
pub trait PageStore: Send + Sync {
    /// Prepares the store for keys of `area` (called when a region is made).
    fn open_area(&self, area: u32);
    /// Stores a copy of `page` (4096 bytes) under `(area, offset)`,
    /// replacing any entry for that key.
    fn store(&self, area: u32, offset: u64, page: &[u8]) -> Result<Stored, StoreError>;
    /// As [`PageStore::store`], for a page not expected back soon (the
    /// pager's victims that never joined the working set): a store may
    /// spend more effort on it. By default the same as `store`.
    fn store_cold(&self, area: u32, offset: u64, page: &[u8]) -> Result<Stored, StoreError> {
        self.store(area, offset, page)
    }
    /// Fills `page` with the stored bytes for `(area, offset)`.
    fn load(
        &self,
        area: u32,
        offset: u64,
        page: &mut [u8],
        mode: LoadMode,
    ) -> Result<Loaded, LoadError>;
    /// Drops the entry for `(area, offset)`, if any.
    fn invalidate(&self, area: u32, offset: u64);
    /// Drops every entry of `area` (called when a region is dropped).
    fn invalidate_area(&self, area: u32);
    /// Counters.
    fn stats(&self) -> StoreStats;
    /// Sets up the calling thread's per-thread state in the store, at the
    /// start of each pager thread, before it holds anything: a first use
    /// later may take the dynamic loader's lock, which a program thread
    /// can hold while it waits for that very thread (a fault in `dlopen`).
    fn warm_thread(&self) {}
    /// Fork (the pager's `pthread_atfork` hooks, see `pager/fork.rs`):
    /// takes every lock of the store and keeps it, so that the child's copy
    /// is consistent. Followed on the same thread by `fork_parent` or
    /// `fork_child`. The default is for stores without locks of their own.
    fn fork_prepare(&self) {}
    /// Releases what `fork_prepare` took, in the parent.
    ///
    /// # Safety
    /// Only after `fork_prepare` on this thread.
    unsafe fn fork_parent(&self) {}
    /// Releases what `fork_prepare` took, in the child, and makes the
    /// store the child's own (its threads, files and keys). An error means
    /// the child's store cannot be used safely.
    ///
    /// # Safety
    /// Only after `fork_prepare` on this thread, in the child.
    unsafe fn fork_child(&self) -> Result<(), String> {
        Ok(())
    }
    /// In the child, after `fork_child` and once every lock a parent thread
    /// could have waited on is released: starts the store's threads (none
    /// may start earlier: it could block on a lock still held).
    fn fork_child_start(&self) -> Result<(), String> {
        Ok(())
    }
}

enum Entry {
    Same(u64),
    Lz4(Box<[u8]>),
}

/// An in-memory [`PageStore`]: a hash map behind one mutex, lz4-compressed
/// entries, same-filled pages kept as their word. For tests and examples;
/// the real one is `uzswap_cache::Cache`.
#[derive(Default)]
pub struct MemStore {
    map: Mutex<HashMap<(u32, u64), Entry>>,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// Entries held for `area`.
    pub fn area_len(&self, area: u32) -> usize {
        self.map.lock().keys().filter(|k| k.0 == area).count()
    }

    /// Whether `(area, offset)` has an entry.
    pub fn contains(&self, area: u32, offset: u64) -> bool {
        self.map.lock().contains_key(&(area, offset))
    }

    /// Entries held in all.
    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn same_word(page: &[u8]) -> Option<u64> {
    let word = |c: &[u8]| u64::from_ne_bytes(c.try_into().expect("8-byte chunk"));
    let w = word(&page[..8]);
    page.chunks_exact(8).all(|c| word(c) == w).then_some(w)
}

impl PageStore for MemStore {
    fn fork_prepare(&self) {
        std::mem::forget(self.map.lock());
    }

    unsafe fn fork_parent(&self) {
        // SAFETY: fork_prepare took the lock on this thread and forgot it.
        unsafe { uzswap_os::fork::AfterFork::after_fork(&self.map, uzswap_os::fork::Side::Parent) };
    }

    unsafe fn fork_child(&self) -> Result<(), String> {
        // SAFETY: as in fork_parent; the child's copy of the lock, and this
        // is the child's only thread.
        unsafe { uzswap_os::fork::AfterFork::after_fork(&self.map, uzswap_os::fork::Side::Child) };
        Ok(())
    }

    fn open_area(&self, _area: u32) {}

    fn store(&self, area: u32, offset: u64, page: &[u8]) -> Result<Stored, StoreError> {
        let (e, s) = match same_word(page) {
            Some(w) => (Entry::Same(w), Stored::SameFilled),
            None => {
                let c = lz4_flex::block::compress(page).into_boxed_slice();
                let n = c.len();
                (Entry::Lz4(c), Stored::Compressed { bytes: n })
            }
        };
        self.map.lock().insert((area, offset), e);
        Ok(s)
    }

    fn load(
        &self,
        area: u32,
        offset: u64,
        page: &mut [u8],
        mode: LoadMode,
    ) -> Result<Loaded, LoadError> {
        let mut m = self.map.lock();
        let key = (area, offset);
        let r = match m.get(&key) {
            None => return Err(LoadError::NotFound),
            Some(Entry::Same(w)) => {
                let b = w.to_ne_bytes();
                for c in page.chunks_exact_mut(8) {
                    c.copy_from_slice(&b);
                }
                Loaded::SameFilled
            }
            Some(Entry::Lz4(c)) => {
                let n =
                    lz4_flex::block::decompress_into(c, page).map_err(|_| LoadError::Corrupt)?;
                if n != page.len() {
                    return Err(LoadError::Corrupt);
                }
                Loaded::Pool
            }
        };
        if mode == LoadMode::Exclusive {
            m.remove(&key);
        }
        Ok(r)
    }

    fn invalidate(&self, area: u32, offset: u64) {
        self.map.lock().remove(&(area, offset));
    }

    fn invalidate_area(&self, area: u32) {
        self.map.lock().retain(|k, _| k.0 != area);
    }

    fn stats(&self) -> StoreStats {
        let m = self.map.lock();
        let mut s = StoreStats::default();
        for e in m.values() {
            s.pages += 1;
            match e {
                Entry::Same(_) => s.same_filled_pages += 1,
                Entry::Lz4(c) => s.payload_bytes += c.len() as u64,
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_modes() {
        let s = MemStore::new();
        let mut p = vec![0u8; 4096];
        for (i, b) in p.iter_mut().enumerate() {
            *b = (i * 7 % 251) as u8;
        }
        assert!(matches!(s.store(1, 5, &p), Ok(Stored::Compressed { .. })));
        assert_eq!(s.store(1, 6, &[9u8; 4096]), Ok(Stored::SameFilled));
        let mut out = vec![0u8; 4096];
        assert_eq!(s.load(1, 5, &mut out, LoadMode::Keep), Ok(Loaded::Pool));
        assert_eq!(out, p);
        assert_eq!(
            s.load(1, 6, &mut out, LoadMode::Exclusive),
            Ok(Loaded::SameFilled)
        );
        assert_eq!(out, vec![9u8; 4096]);
        assert_eq!(
            s.load(1, 6, &mut out, LoadMode::Keep),
            Err(LoadError::NotFound)
        );
        s.invalidate_area(1);
        assert!(s.is_empty());
    }
}
