//! uzswap-cache (being built): the zswap cache.
pub mod admission;
pub mod dedup;
