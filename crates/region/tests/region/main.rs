//! Integration tests of uzswap-region (one binary, one module per topic).
//! The fork test lives in its own binary (`tests/fork.rs`): its fork hook
//! brings back the pages of every pager in the process.

mod access;
mod basic;
mod charge;
mod common;
mod discard;
mod full;
mod in_thread;
mod lifecycle;
mod load_error;
mod policy;
mod slow_load;
mod soak;
mod staging;
mod stress;
mod syscalls;
mod zeros;
