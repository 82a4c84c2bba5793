//! The compressed cache as the regions' page store: `uzswap_cache::Cache`
//! implements [`PageStore`] here, so a [`crate::Pager`] can evict into the
//! real pool and backing file.

use crate::store::{LoadError, LoadMode, Loaded, PageStore, StoreError, StoreStats, Stored};
use uzswap_cache as cache;

impl PageStore for cache::Cache {
    fn open_area(&self, area: u32) {
        // Area ids come from the pager's counter; one beyond the cache's
        // range makes every later store fail with a clear error instead.
        if let Err(e) = cache::Cache::open_area(self, area) {
            uzswap_os::say(&format!("uzswap: {e}"));
        }
    }

    fn store(&self, area: u32, offset: u64, page: &[u8]) -> Result<Stored, StoreError> {
        stored(cache::Cache::store(self, area, offset, page))
    }

    fn store_cold(&self, area: u32, offset: u64, page: &[u8]) -> Result<Stored, StoreError> {
        stored(cache::Cache::store_cold(self, area, offset, page))
    }

    fn load(
        &self,
        area: u32,
        offset: u64,
        page: &mut [u8],
        mode: LoadMode,
    ) -> Result<Loaded, LoadError> {
        cache::Cache::load(self, area, offset, page, mode).map_err(|e| match e {
            cache::LoadError::NotFound => LoadError::NotFound,
            cache::LoadError::Io(e) => LoadError::Io(e.to_string()),
            cache::LoadError::Corrupt { .. } => LoadError::Corrupt,
            e @ cache::LoadError::Invalid(_) => LoadError::Io(e.to_string()),
        })
    }

    fn invalidate(&self, area: u32, offset: u64) {
        let _ = cache::Cache::invalidate(self, area, offset);
    }

    fn invalidate_area(&self, area: u32) {
        let _ = cache::Cache::invalidate_area(self, area);
    }

    fn warm_thread(&self) {
        cache::warm_thread()
    }

    fn fork_prepare(&self) {
        cache::Cache::fork_prepare(self)
    }

    unsafe fn fork_parent(&self) {
        // SAFETY: the caller's contract is the cache's.
        unsafe { cache::Cache::fork_parent(self) }
    }

    unsafe fn fork_child(&self) -> Result<(), String> {
        // SAFETY: the caller's contract is the cache's.
        unsafe { cache::Cache::fork_child(self) }.map_err(|e| e.to_string())
    }

    fn fork_child_start(&self) -> Result<(), String> {
        cache::Cache::fork_child_start(self).map_err(|e| e.to_string())
    }

    fn stats(&self) -> StoreStats {
        let s = cache::Cache::stats(self);
        StoreStats {
            pages: s.stored_pages + s.backing_pages,
            same_filled_pages: s.same_filled_pages,
            payload_bytes: s.stored_payload_bytes,
            extra: s
                .pairs()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        }
    }
}

/// A cache store's outcome as the pager sees it.
fn stored(r: Result<cache::Stored, cache::StoreError>) -> Result<Stored, StoreError> {
    match r {
        Ok(cache::Stored::SameFilled) => Ok(Stored::SameFilled),
        Ok(cache::Stored::Compressed { bytes } | cache::Stored::Duplicate { bytes }) => {
            Ok(Stored::Compressed { bytes })
        }
        Ok(cache::Stored::Raw | cache::Stored::Backing) => Ok(Stored::Compressed {
            bytes: cache::PAGE_SIZE,
        }),
        Err(cache::StoreError::Refused(cache::Reject::PoolFull)) => Err(StoreError::Full),
        Err(e) => Err(StoreError::Rejected(e.to_string())),
    }
}
