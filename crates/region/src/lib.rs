//! uzswap-region (to be built).
