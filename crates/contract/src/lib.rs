//! uzswap-contract: what `uzswap run` and the preload runtime it starts in
//! a program agree on, written once so that the two sides cannot drift.
//!
//! - **The run configuration** ([`RunConfig`], `config.rs`): every setting
//!   the runtime reads, as typed fields; [`RunConfig::validate`] is the one
//!   place their rules live; [`RunConfig::to_env`] and
//!   [`RunConfig::from_env`] carry it across `exec` in `UZSWAP_*`
//!   variables.
//! - **The names** (`names.rs`): the variables ([`names::ALL`]), the
//!   statistics socket ([`socket_name`]) and the final statistics file
//!   ([`final_stats_path`]).
//! - **The statistics schema** ([`Snapshot`], `snapshot.rs`): what the
//!   runtime serves and writes and `uzswap run`/`uzswap stats` read, one
//!   serde type on both sides; a renamed field is a compile error in the
//!   code that renders it and a parse error in JSON of another build.
//!
//! # The variables
//! | variable | setting | unset |
//! |---|---|---|
//! | `UZSWAP_MEMORY_MAX` | resident budget, bytes (at least 65536) | nothing is managed |
//! | `UZSWAP_POOL_MAX` | pool limit, bytes (not 0) | 20 % of RAM |
//! | `UZSWAP_COMPRESSOR` | `lz4`, `lz4hc[:L]`, `zstd[:L]`, `deflate[:L]` | `lz4` |
//! | `UZSWAP_COLD_COMPRESSOR` | the same, for pages that never joined the working set | none (empty: none) |
//! | `UZSWAP_BACKING` | backing directory or file, or `redis://HOST:PORT[,HOST:PORT...]` | none (empty: none) |
//! | `UZSWAP_REMOTE_PREFIX` | what a remote tier's keys start with (`uzswap run` gives each run its own) | `uzswap` (empty: `uzswap`) |
//! | `UZSWAP_DEDUP`, `UZSWAP_KEEP_CLEAN`, `UZSWAP_CPU_HANDLERS` | `1` or `0` | `0` |
//! | `UZSWAP_COSCHED` | `1` or `0` | `1` |
//! | `UZSWAP_FINAL_STATS` | base path of the final statistics (`.PID` appended) | none written (empty: none) |
//! | `UZSWAP_RESERVE` | address space reserved for managed mappings, bytes | 1 TiB |
//!
//! `UZSWAP_RESERVE` is the one `uzswap run` has no flag for: the runtime
//! reserves that much address space (`PROT_NONE`, no memory; rounded up to
//! 256 MiB chunks) at start and serves every managed mapping from it, so
//! a program whose anonymous mappings (heap included) outgrow it sees
//! `mmap` and `malloc` fail with `ENOMEM`. Raise it for a program that maps
//! more than 1 TiB; lower it where the address space is limited (`ulimit
//! -v`). `uzswap run` passes on the value in its own environment, checked
//! before the program starts.
//!
//! # Architecture invariant
//! This crate computes nothing at run time: no threads, no I/O, no global
//! state. The runtime calls it before `malloc` is switched over and from
//! its statistics thread.

pub mod config;
pub mod names;
pub mod snapshot;

pub use config::{BackingTier, ConfigError, RunConfig, DEFAULT_RESERVE, MIN_MEMORY_MAX};
pub use names::{final_stats_path, socket_name};
pub use snapshot::{
    CoschedStats, PoolSection, RuntimeHeap, Snapshot, SnapshotError, SpaceStats, SCHEMA_VERSION,
};
