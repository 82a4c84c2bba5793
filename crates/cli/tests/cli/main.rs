//! Integration tests of the `uzswap` binary (one binary, one module per
//! topic). Most run real programs under `uzswap run` with the preload
//! runtime.
//!
//! A test whose requirement this machine lacks (userfaultfd, a compiler, a
//! runtime, sources) goes through [`common::skip`]: it passes with a note,
//! or fails where `UZSWAP_TEST_STRICT=1` is set (as CI does), so that a
//! machine that cannot run a test never counts it as passed.

#[macro_use]
mod common;

mod cosched;
mod life;
mod record;
mod run;
mod runtime_heap;
mod runtimes;
mod stats_tree;
mod tree;
