//! The scatter-gather allocator of seed 003 (work in progress).
use crate::{CompactReport, Error, Handle, PoolStats, Zpool};

/// Configuration of a [`XcfPool`].
#[derive(Clone, Debug, Default)]
pub struct XcfConfig {
    /// Hard limit on pool bytes.
    pub limit_bytes: Option<u64>,
}

/// The scatter-gather pool.
pub struct XcfPool {}

impl XcfPool {
    /// Creates a pool.
    pub fn new(_config: XcfConfig) -> Result<XcfPool, Error> {
        todo!()
    }
}

impl Zpool for XcfPool {
    fn name(&self) -> &'static str {
        "xcf"
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
