//! The names both sides use: the environment variables `uzswap run` sets
//! and the runtime reads, the statistics socket, the final statistics
//! file. These constants are the only place the strings are written.

use std::path::{Path, PathBuf};

/// The resident budget in bytes ([`crate::RunConfig::memory_max`]). Unset:
/// the runtime manages nothing and the program runs as if not preloaded.
pub const MEMORY_MAX: &str = "UZSWAP_MEMORY_MAX";
/// The pool's limit in bytes ([`crate::RunConfig::pool_max`]; unset: 20 %
/// of RAM).
pub const POOL_MAX: &str = "UZSWAP_POOL_MAX";
/// The compressor ([`crate::RunConfig::compressor`]; unset: lz4).
pub const COMPRESSOR: &str = "UZSWAP_COMPRESSOR";
/// The compressor of cold pages ([`crate::RunConfig::cold_compressor`];
/// unset or empty: none).
pub const COLD_COMPRESSOR: &str = "UZSWAP_COLD_COMPRESSOR";
/// The backing file or directory, or a Redis address
/// `redis://HOST:PORT[,...]` ([`crate::RunConfig::backing`]; unset or
/// empty: none).
pub const BACKING: &str = "UZSWAP_BACKING";
/// `1` or `0`: store identical pages once ([`crate::RunConfig::dedup`]).
pub const DEDUP: &str = "UZSWAP_DEDUP";
/// `1` or `0`: keep the pool's copy of a page brought back
/// ([`crate::RunConfig::keep_clean`]).
pub const KEEP_CLEAN: &str = "UZSWAP_KEEP_CLEAN";
/// `1` or `0`: a fault handler on every CPU
/// ([`crate::RunConfig::cpu_handlers`]).
pub const CPU_HANDLERS: &str = "UZSWAP_CPU_HANDLERS";
/// `1` or `0` (unset: `1`): co-scheduling
/// ([`crate::RunConfig::cosched`]).
pub const COSCHED: &str = "UZSWAP_COSCHED";
/// `1` or `0` (unset: `1`): the CPU latency request while faults arrive
/// ([`crate::RunConfig::latency_hold`]).
pub const LATENCY_HOLD: &str = "UZSWAP_LATENCY_HOLD";
/// `1` or `0` (unset: `0`): victims chosen by the access signal
/// ([`crate::RunConfig::access_signal`]).
pub const ACCESS_SIGNAL: &str = "UZSWAP_ACCESS_SIGNAL";
/// Where the final statistics go, before the pid is appended
/// ([`crate::RunConfig::final_stats`], [`final_stats_path`]; unset or
/// empty: nowhere).
pub const FINAL_STATS: &str = "UZSWAP_FINAL_STATS";
/// Bytes of address space reserved for the program's managed mappings
/// ([`crate::RunConfig::reserve`]; unset: [`crate::DEFAULT_RESERVE`]).
pub const RESERVE: &str = "UZSWAP_RESERVE";

/// The ledger of the process tree ([`crate::RunConfig::ledger`]): a path
/// `/proc/PID/fd/N` to the memory file `uzswap run` made (unset or empty:
/// the budget is this process's alone).
pub const LEDGER: &str = "UZSWAP_LEDGER";
/// What the keys of a remote backing tier start with
/// ([`crate::RunConfig::remote_prefix`]; unset or empty: `uzswap`).
pub const REMOTE_PREFIX: &str = "UZSWAP_REMOTE_PREFIX";

/// Every variable the runtime reads. `uzswap run` removes these from the
/// environment it passes on before it sets its own
/// ([`crate::RunConfig::to_env`]), so a value inherited from its own
/// environment never reaches the runtime as if asked for.
pub const ALL: [&str; 15] = [
    MEMORY_MAX,
    POOL_MAX,
    COMPRESSOR,
    COLD_COMPRESSOR,
    BACKING,
    DEDUP,
    KEEP_CLEAN,
    CPU_HANDLERS,
    COSCHED,
    LATENCY_HOLD,
    ACCESS_SIGNAL,
    FINAL_STATS,
    RESERVE,
    LEDGER,
    REMOTE_PREFIX,
];

/// The preload library's path, read by `uzswap run` only (when
/// `--preload-lib` is not given); the runtime never reads it.
pub const PRELOAD_LIB: &str = "UZSWAP_PRELOAD_LIB";

/// The abstract unix socket on which the runtime of process `pid` serves
/// its statistics (`uzswap stats PID` connects to it).
pub fn socket_name(pid: u32) -> String {
    format!("uzswap-stats.{pid}")
}

/// The file the final statistics of process `pid` go to, given the base
/// path of [`FINAL_STATS`]: every managed process of a tree (each image it
/// executes) writes its own, and `uzswap run` reads its child's.
pub fn final_stats_path(base: &Path, pid: u32) -> PathBuf {
    let mut p = base.as_os_str().to_owned();
    p.push(format!(".{pid}"));
    PathBuf::from(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_prefixed() {
        let mut all = ALL.to_vec();
        all.push(PRELOAD_LIB);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), ALL.len() + 1);
        assert!(all.iter().all(|n| n.starts_with("UZSWAP_")));
    }

    #[test]
    fn the_final_path_appends_the_pid() {
        assert_eq!(
            final_stats_path(Path::new("/tmp/x/stats.json"), 42),
            PathBuf::from("/tmp/x/stats.json.42")
        );
        assert_eq!(socket_name(7), "uzswap-stats.7");
    }
}
