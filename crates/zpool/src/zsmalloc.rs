//! The zsmalloc-class allocator (work in progress).
use crate::{CompactReport, Error, Handle, PoolStats, Zpool};

/// Configuration of a [`ZsPool`].
#[derive(Clone, Debug)]
pub struct ZsConfig {
    /// Hard limit on pool bytes.
    pub limit_bytes: Option<u64>,
    /// Largest zspage, in pages (1..=16, default 8).
    pub max_pages_per_zspage: usize,
}

impl Default for ZsConfig {
    fn default() -> Self {
        ZsConfig {
            limit_bytes: None,
            max_pages_per_zspage: 8,
        }
    }
}

/// The zsmalloc-class pool.
pub struct ZsPool {}

impl ZsPool {
    /// Creates a pool.
    pub fn new(_config: ZsConfig) -> Result<ZsPool, Error> {
        todo!()
    }
}

impl Zpool for ZsPool {
    fn name(&self) -> &'static str {
        "zsmalloc"
    }
    fn malloc(&self, _size: usize) -> Result<Handle, Error> {
        todo!()
    }
    fn free(&self, _handle: Handle) -> Result<usize, Error> {
        todo!()
    }
    fn object_size(&self, _handle: Handle) -> Result<usize, Error> {
        todo!()
    }
    fn write(&self, _handle: Handle, _data: &[u8]) -> Result<(), Error> {
        todo!()
    }
    fn read(&self, _handle: Handle, _buf: &mut [u8]) -> Result<usize, Error> {
        todo!()
    }
    fn map_read(&self, _handle: Handle, _f: &mut dyn FnMut(&[u8])) -> Result<(), Error> {
        todo!()
    }
    fn compact(&self) -> CompactReport {
        todo!()
    }
    fn stats(&self) -> PoolStats {
        todo!()
    }
    fn pool_bytes(&self) -> u64 {
        todo!()
    }
    fn set_limit(&self, _limit_bytes: Option<u64>) {
        todo!()
    }
    fn check_invariants(&self) -> Result<(), String> {
        todo!()
    }
}
