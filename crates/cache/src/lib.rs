//! uzswap-cache (to be built).
