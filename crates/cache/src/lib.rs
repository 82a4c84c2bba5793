//! uzswap-cache (being built): the zswap cache.
pub mod dedup;
