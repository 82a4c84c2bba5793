//! `uzswap run`'s flags ([`Args`]), the parsers of their values, and the
//! configuration the program's runtime gets from them, checked before
//! anything runs.

use anyhow::Result;
use uzswap_contract::{BackingTier, RunConfig};

/// What `uzswap run` was asked to do.
#[derive(clap::Args)]
pub struct Args {
    /// The memory of the whole program, bytes or with K, M, G: every
    /// process it starts, together, holds at most this much of resident
    /// heap and anonymous memory, compressed pools and uzswap's own
    /// bookkeeping (as a memory cgroup's limit holds a tree with the
    /// kernel's zswap). Shared among the processes by where it is used.
    #[arg(long, value_parser = parse_size)]
    pub memory_max: u64,
    /// Caps each process's compressed pool (inside --memory-max, which it
    /// is part of); when the pool is full the least recently used pages go
    /// to the backing file. Default: none beyond the process's share, which
    /// is split between resident pages and the pool by what faults from
    /// each cost (from half: a quarter to all of it).
    #[arg(long, value_parser = parse_size)]
    pub pool_max: Option<u64>,
    /// lz4, lz4hc[:LEVEL], zstd[:LEVEL], deflate[:LEVEL].
    #[arg(long, default_value = "lz4")]
    pub compressor: uzswap_cache::Compressor,
    /// Compress pages that never joined the program's working set (evicted
    /// without having been on the pager's active list since they came in)
    /// with this codec instead, e.g. zstd:-1: a denser pool for pages
    /// unlikely to come back soon, --compressor's speed for the rest.
    #[arg(long)]
    pub cold_compressor: Option<uzswap_cache::Compressor>,
    /// Store identical pages once: a page whose compressed
    /// bytes match a stored one's takes a reference to it instead of pool
    /// memory. Costs a hash per store and an index entry per object.
    #[arg(long)]
    pub dedup: bool,
    /// Where pages that do not fit the pool are written back: a directory
    /// (an unnamed, encrypted file is made in it) or a new file's path.
    /// Default: an unnamed file in $TMPDIR (or /tmp).
    #[arg(long, conflicts_with = "no_backing_file")]
    pub backing_file: Option<std::path::PathBuf>,
    /// Write nothing back: pages the pool cannot take stay resident, and a
    /// program whose compressed pages outgrow the budget goes over it (said
    /// at once on stderr).
    #[arg(long)]
    pub no_backing_file: bool,
    /// Write pages back to a Redis or Valkey server instead of a file:
    /// redis://HOST:PORT, or several HOST:PORT of one cluster separated by
    /// commas. Pages are encrypted before they leave; keys expire after
    /// 24 hours and are deleted at exit.
    #[arg(long, value_name = "URL", conflicts_with_all = ["backing_file", "no_backing_file"])]
    pub backing: Option<String>,
    /// Keep the pool's copy of a page brought back (mapped write-protected),
    /// so that evicting it again unwritten needs no compression. Costs pool
    /// memory for resident pages and a fault on the first write; off, a
    /// load frees the copy as the kernel's zswap does (measured faster and
    /// smaller on usemem: docs/BENCHMARKS.md).
    #[arg(long)]
    pub keep_clean: bool,
    /// Resolve each fault on the faulting thread's CPU: a handler bound to
    /// every CPU at idle priority (it spins on idle CPUs for 2 ms after a
    /// fault). Faster fills and sequential passes on a VM, where waking a
    /// thread on another CPU is expensive (docs/BENCHMARKS.md).
    #[arg(long)]
    pub cpu_handlers: bool,
    /// Turn co-scheduling off. By default the thread that does a process's
    /// work (its only one, or one busy beside threads that wait), once the
    /// process has been evicting for a second, runs on one CPU together
    /// with uzswap's threads for it, which run there at idle priority, only
    /// while it waits for a page: no CPU is woken or interrupted for its
    /// faults and evictions (measured faster and cheaper on a VM:
    /// docs/BENCHMARKS.md). It is let go again when the process starts or
    /// ends a thread, when it waits for its CPU, or when another thread's
    /// fault waits behind it. Needs the right to leave idle priority (root,
    /// CAP_SYS_NICE or RLIMIT_NICE); without it, off.
    #[arg(long)]
    pub no_cosched: bool,
    /// Do not hold a CPU latency request while faults arrive. By default
    /// (as root) each process holds one of 0 µs on /dev/cpu_dma_latency
    /// from the first fault of a burst until its handlers have seen none
    /// for 5 ms: idle CPUs poll instead of halting, so handing a fault to
    /// the handler thread and back wakes no halted CPU (10-30 µs each on
    /// a VM whose idle CPUs halt). Costs CPU time on idle CPUs while held.
    #[arg(long)]
    pub no_latency_hold: bool,
    /// Choose victims by use, reads included: each process's managed
    /// memory is cut into 512 KiB mappings (every other one shown as `rr`
    /// in smaps), whose accessed bits the runtime reads while it evicts,
    /// so that pages the program reads again stay resident and pages of
    /// chunks nobody reused leave first. Off by default: a parallel build
    /// ran no faster with it (docs/BENCHMARKS.md).
    #[arg(long)]
    pub access_signal: bool,
    /// Serve the whole program's metrics for Prometheus over HTTP at
    /// HOST:PORT/metrics while it runs (as `uzswap stats --serve`).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,
    /// Write the final statistics (JSON) to this file.
    #[arg(long)]
    pub stats_json: Option<std::path::PathBuf>,
    /// Record the run as a time series in FILE (JSON Lines, flushed as it
    /// goes): the whole program's measured memory against the budget, and
    /// every process's resident, pool, runtime, backing file, allotment,
    /// faults and evictions. `uzswap plot FILE` draws it.
    #[arg(long, value_name = "FILE")]
    pub record: Option<std::path::PathBuf>,
    /// How often --record takes a sample: 100ms (the default and the
    /// least: the arbiter measures the tree that often), 1s, 2.5s.
    /// Rounded to a multiple of 100 ms.
    #[arg(long, value_name = "TIME", requires = "record", value_parser = parse_interval)]
    pub record_interval: Option<std::time::Duration>,
    /// Preload this file as the runtime instead of the copy built into
    /// uzswap (e.g. one built with debugging information: `cargo build
    /// -p uzswap-preload`). Also UZSWAP_PRELOAD_LIB.
    #[arg(long, value_name = "FILE")]
    pub preload_lib: Option<std::path::PathBuf>,
    /// No start line and no summary.
    #[arg(long, short)]
    pub quiet: bool,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROG"
    )]
    pub prog: Vec<std::ffi::OsString>,
}

/// Parses a size: a number of bytes with an optional binary suffix
/// (`K`, `M`, `G`, `T`; `KiB`, `MB` and the like mean the same).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (examples: 4096, 512K, 64M, 2G)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use K, M, G or T)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Parses `--record-interval`: seconds, or with `ms` or `s`.
pub fn parse_interval(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let (num, scale) = match t.strip_suffix("ms") {
        Some(n) => (n, 1e-3),
        None => (t.strip_suffix('s').unwrap_or(t), 1.0),
    };
    let secs = num
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(|v| v * scale)
        .ok_or_else(|| format!("{s:?} is not a time (examples: 100ms, 1s, 2.5)"))?;
    let least = crate::arbiter::SAMPLE.as_secs_f64();
    if secs < least - 1e-9 {
        return Err(format!(
            "{s:?} is shorter than {} ms, how often the tree is measured: give 100ms or more",
            crate::arbiter::SAMPLE.as_millis()
        ));
    }
    if secs > 86_400.0 {
        return Err(format!("{s:?} is over a day: give a shorter interval"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

/// The configuration the program's runtime gets: the flags, and
/// `UZSWAP_RESERVE` from this process's environment (there is no flag for
/// it). Checked here, before anything runs.
pub(super) fn run_config(a: &Args) -> Result<RunConfig> {
    let config = RunConfig {
        memory_max: a.memory_max,
        pool_max: a.pool_max,
        compressor: a.compressor,
        cold_compressor: a.cold_compressor,
        backing: backing_of(a),
        keep_clean: a.keep_clean,
        cpu_handlers: a.cpu_handlers,
        cosched: !a.no_cosched,
        latency_hold: !a.no_latency_hold,
        access_signal: a.access_signal,
        dedup: a.dedup,
        final_stats: None, // set once its directory exists
        reserve: RunConfig::reserve_from_lookup(|n: &str| std::env::var_os(n))?,
        ledger: None, // set once it exists
        remote_prefix: None,
    };
    config.validate()?;
    Ok(config)
}

/// For messages: where pages are written back.
pub(super) fn tier_noun(a: &Args) -> &'static str {
    backing_of(a).map_or("no backing tier", |t| t.noun())
}

/// The tier pages are written back to: the server of --backing, the file
/// or directory named, none with --no-backing-file, else `$TMPDIR`.
pub(super) fn backing_of(a: &Args) -> Option<BackingTier> {
    if let Some(url) = &a.backing {
        Some(BackingTier::Redis(url.clone()))
    } else if a.no_backing_file {
        None
    } else {
        Some(BackingTier::File(
            a.backing_file.clone().unwrap_or_else(std::env::temp_dir),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_intervals_parse_and_refuse_less_than_a_sample() {
        let ms = |s: &str| parse_interval(s).map(|d| d.as_millis());
        assert_eq!(ms("100ms"), Ok(100));
        assert_eq!(ms("1s"), Ok(1000));
        assert_eq!(ms(" 2.5 "), Ok(2500));
        assert!(ms("50ms").unwrap_err().contains("100ms or more"));
        assert!(ms("0").is_err());
        assert!(ms("soon").unwrap_err().contains("not a time"));
        assert!(ms("-1s").is_err());
        assert!(ms("2d").is_err());
    }

    #[test]
    fn sizes_parse_with_binary_units_and_refuse_nonsense() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size(" 2GiB "), Ok(2 << 30));
        assert_eq!(parse_size("1t"), Ok(1 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("12X").unwrap_err().contains("unknown unit"));
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("99999999999T")
            .unwrap_err()
            .contains("too large"));
    }
}
