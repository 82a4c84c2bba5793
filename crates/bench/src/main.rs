//! `uzswap-bench`: the benchmarks of uzswap, apart from the product binary
//! (not published). Each prints a table and progress on stderr and, with
//! `--json`, one JSON object on stdout. Several change the machine as root
//! (swap, zswap parameters, memory cgroups, zram devices) for a side by side
//! with the kernel; a guard in `kernel.rs` puts everything back.
//!
//! Arguments are parsed and validated first (clap), then turned into each
//! benchmark's options; `main` only maps errors to exit codes. The hidden
//! `internal-*` commands are children this binary re-executes itself as
//! (a workload in a memory cgroup), not commands for people.

mod bench_admission;
mod bench_cache;
mod bench_pool;
mod bench_remote;
mod bench_run;
mod bench_seal;
mod bench_tree;
mod bench_usemem;
mod kernel;
mod stats;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::io::Write;
use uzswap_workload::{corpus, usemem};
use uzswap_zpool::AllocatorKind;

#[derive(Parser)]
#[command(
    name = "uzswap-bench",
    version,
    about = "Benchmarks of uzswap: the allocators, the cache and `uzswap run`, on real pages \
             and side by side with the kernel's zswap",
    long_about = "Benchmarks of uzswap: the allocators, the cache and `uzswap run`, on real \
                  pages and side by side with the kernel's zswap. Each prints a table on \
                  stderr and, with --json, one JSON object on stdout. Flags named --vs-kernel \
                  (and `run` unless --skip-kernel) need root: they set up swap, zswap, memory \
                  cgroups or zram and restore them afterwards."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// The options of the benchmarks that write pages to a backing tier and
/// load them back in rounds (`seal`, `remote`).
#[derive(clap::Args)]
struct TierRounds {
    /// MiB of pages.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    mib: u64,
    #[arg(long, value_enum, default_value = "mixed")]
    data: corpus::DataKind,
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=99))]
    rounds: u64,
    /// Print the result as one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Subcommand)]
enum Cmd {
    /// The allocator under real lz4-compressed pages: fill, churn, throughput.
    Pool {
        #[arg(long, value_enum, default_value = "text")]
        data: corpus::DataKind,
        /// MiB of original pages.
        #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=8192))]
        mib: u32,
        /// zsmalloc, xcf, or both (each in turn on the same objects, with
        /// xcf/zsmalloc ratios).
        #[arg(long, default_value = "zsmalloc", value_parser = parse_allocators)]
        allocator: Allocators,
        /// Also measure the kernel's zsmalloc on the same pages through zram
        /// (needs root; the device is removed afterwards).
        #[arg(long)]
        vs_kernel: bool,
        /// zsmalloc: largest zspage, in pages (1..=16).
        #[arg(long, default_value_t = 8)]
        max_pages: usize,
        /// Draw only this many MiB of distinct pages and repeat them in order
        /// up to --mib (the allocator sees object sizes only): lets the pool
        /// reach 1 GiB and more on a machine with fewer distinct real pages.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=8192))]
        distinct_mib: Option<u32>,
        /// Seconds for each malloc+free throughput run.
        #[arg(long, default_value_t = 1.0)]
        pair_seconds: f64,
        /// Print the result as one JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// The zswap cache on real pages against the raw codec on the same
    /// pages (and, with --vs-kernel, the kernel's zswap).
    Cache {
        #[arg(long, value_enum, default_value = "mixed")]
        data: corpus::DataKind,
        /// lz4, lz4hc[:LEVEL], zstd[:LEVEL], deflate[:LEVEL].
        #[arg(long, default_value = "lz4")]
        compressor: uzswap_cache::Compressor,
        /// MiB of original pages.
        #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=8192))]
        mib: u64,
        /// zsmalloc, xcf, or both (each in turn on the same pages, with
        /// xcf/zsmalloc ratios).
        #[arg(long, default_value = "zsmalloc", value_parser = parse_allocators)]
        allocator: Allocators,
        /// Share identical pages.
        #[arg(long, default_value = "off", value_parser = parse_on_off, action = clap::ArgAction::Set)]
        dedup: bool,
        /// Also store the same pages through the kernel's zswap (root;
        /// swap and zswap settings are restored afterwards).
        #[arg(long)]
        vs_kernel: bool,
        #[arg(long)]
        json: bool,
    },
    /// What dedup costs the store path on pages without duplicates: store
    /// throughput with dedup on against off, alternating in one process.
    DedupCost {
        #[arg(long, value_enum, default_value = "text")]
        data: corpus::DataKind,
        /// MiB of pages loaded (repeated pages are then removed).
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
        mib: u64,
        #[arg(long, default_value = "lz4")]
        compressor: uzswap_cache::Compressor,
        /// Rounds of off-then-on (the median ratio is reported).
        #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u64).range(1..=1000))]
        rounds: u64,
        #[arg(long)]
        json: bool,
    },
    /// Proactive writeback off and on, on a pool the workload overflows:
    /// store latency (bursts with pauses), then loads.
    Proactive {
        /// MiB of pages stored.
        #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=4096))]
        mib: u64,
        /// Pool limit in MiB.
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
        limit_mib: u64,
        /// Share of the limit proactive writeback keeps the pool under.
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(1..=100))]
        share: u8,
        /// Pages stored per burst.
        #[arg(long, default_value_t = 512)]
        burst: usize,
        /// Pause between bursts, in ms.
        #[arg(long, default_value_t = 20)]
        pause_ms: u64,
        #[arg(long, value_enum, default_value = "mixed")]
        data: corpus::DataKind,
        #[arg(long)]
        json: bool,
    },
    /// What encrypting the backing file costs: writeback and loads from
    /// the file with AES-256-GCM (the default) against the keyed
    /// checksum, on the same pages, in alternating rounds.
    Seal(TierRounds),
    /// The backing tiers side by side: the local file, one Redis node and
    /// a three-master Redis cluster on loopback (started here; left out
    /// without redis-server): writeback pages/s and load latency p50/p99.
    Remote(TierRounds),
    /// IO-aware admission (a page goes straight to the backing file while
    /// the file is idle, into the pool while it is busy) on a fast tier (a
    /// page-cached file) and on a slow one (the same file with a delay per
    /// IO), each with admission off and on: store and load throughput, pool
    /// memory.
    Admission {
        /// MiB of pages stored, then loaded back.
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
        mib: u64,
        #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=64))]
        threads: u64,
        #[arg(long, value_enum, default_value = "mixed")]
        data: corpus::DataKind,
        /// Delay added to every read and write of the slow tier, in µs.
        #[arg(long, default_value_t = 200)]
        slow_us: u64,
        /// Reads in flight at which the tier counts as busy.
        #[arg(long, default_value_t = 1)]
        read_limit: u32,
        /// Writes in flight at which the tier counts as busy.
        #[arg(long, default_value_t = 1)]
        write_limit: u32,
        #[arg(long)]
        json: bool,
    },
    /// An unmodified C program (usemem, built here from
    /// workloads/usemem.c) under `uzswap run --memory-max`, against the
    /// same binary in a memory cgroup of the same size with the kernel's
    /// zswap (root; swap, zswap settings and the cgroup are restored).
    Run(bench_run::Args),
    /// A process tree under one budget: a parallel build of real C sources
    /// (make -jN) or a Python multiprocessing program, unconstrained, under
    /// `uzswap run --memory-max`, and in a memory cgroup of the same limit
    /// with the kernel's zswap (each shrinker/readahead configuration) and
    /// with plain swap (root; every setting is restored).
    Tree(bench_tree::Args),
    /// Real programs (a Python dict, a node Map, a JVM HashMap, a cgo Go
    /// map, xz -9, sort; on request `go-ext`, the Go map in pure Go linked
    /// by the system's linker), each checking or hashing its result,
    /// unconstrained, under `uzswap run --memory-max B` (B a quarter of the
    /// footprint), and under the kernel's zswap and plain swap in a memory
    /// cgroup of the same limit (root; every setting is restored).
    Programs(bench_tree::ProgramsArgs),
    /// The usemem workload (fill, then read-check-rewrite passes) under a
    /// resident budget, optionally against the kernel's zswap and swap.
    Usemem(bench_usemem::Args),
    /// (internal) the kernel's zswap on the given pages.
    #[command(hide = true)]
    InternalKernelZswap {
        #[arg(long, value_enum)]
        data: corpus::DataKind,
        #[arg(long)]
        mib: usize,
        #[arg(long)]
        compressor: String,
    },
    /// (internal) the workload child of the kernel reference runs.
    #[command(hide = true)]
    InternalUsemem {
        #[arg(long)]
        cgroup: std::path::PathBuf,
        #[arg(long, value_enum)]
        data: corpus::DataKind,
        #[arg(long)]
        mib: usize,
        #[arg(long, value_enum)]
        pattern: usemem::Pattern,
        #[arg(long)]
        passes: u32,
    },
}

/// The allocators a benchmark runs, in turn.
#[derive(Clone, Debug)]
struct Allocators(Vec<AllocatorKind>);

fn parse_allocators(s: &str) -> Result<Allocators, String> {
    Ok(Allocators(match s {
        "both" => vec![AllocatorKind::Xcf, AllocatorKind::Zsmalloc],
        one => vec![parse_allocator(one)?],
    }))
}

fn parse_allocator(s: &str) -> Result<AllocatorKind, String> {
    s.parse().map_err(|e: uzswap_zpool::Error| e.to_string())
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("expected on or off, got {s:?}")),
    }
}

/// Writes a progress line to stderr (a benchmark keeps stdout for JSON).
fn note(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// The result: one JSON line with --json, else pretty-printed.
fn emit(json: bool, v: &serde_json::Value) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{v}")?;
    } else {
        writeln!(out, "{}", serde_json::to_string_pretty(v)?)?;
    }
    Ok(())
}

/// Runs the benchmark `cli` names: those of programs under a budget (and
/// the kernel's helpers) here, those of the cache and its tiers through
/// [`run_cache`].
fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Usemem(args) => emit(args.json, &bench_usemem::run(&args)?),
        Cmd::Tree(args) => {
            let v = bench_tree::run(&args)?;
            eprint!("{}", bench_tree::table(&v));
            emit(args.sides.json, &v)
        }
        Cmd::Programs(args) => {
            let v = bench_tree::run_programs(&args)?;
            eprint!("{}", bench_tree::table(&v));
            emit(args.sides.json, &v)
        }
        Cmd::Run(args) => {
            let v = bench_run::run(&args)?;
            if !args.json {
                eprint!("{}", bench_run::table(&v));
            }
            emit(args.json, &v)
        }
        Cmd::InternalKernelZswap {
            data,
            mib,
            compressor,
        } => emit(true, &bench_cache::kernel_zswap(data, mib, &compressor)?),
        Cmd::InternalUsemem {
            cgroup,
            data,
            mib,
            pattern,
            passes,
        } => kernel::usemem_child(&cgroup, data, mib, pattern, passes),
        cmd => run_cache(cmd),
    }
}

/// Runs a benchmark of the cache or its pool, in this process, or one of
/// the backing tiers through [`run_tier`].
fn run_cache(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::DedupCost {
            data,
            mib,
            compressor,
            rounds,
            json,
        } => {
            let v = bench_cache::dedup_cost(data, mib as usize, compressor, rounds as usize)?;
            emit(json, &v)
        }
        Cmd::Cache {
            data,
            compressor,
            mib,
            allocator,
            dedup,
            vs_kernel,
            json,
        } => {
            let v = bench_cache::run_allocators(
                &bench_cache::Args {
                    data,
                    mib: mib as usize,
                    compressor,
                    allocator: allocator.0[0],
                    dedup,
                    vs_kernel,
                },
                &allocator.0,
            )?;
            emit(json, &v)
        }
        Cmd::Pool {
            data,
            mib,
            allocator,
            vs_kernel,
            pair_seconds,
            max_pages,
            distinct_mib,
            json,
        } => {
            if let Some(d) = distinct_mib.filter(|&d| d > mib) {
                anyhow::bail!("--distinct-mib {d} is larger than --mib {mib}: give at most {mib}");
            }
            let v = bench_pool::run(&bench_pool::Args {
                data,
                mib: mib as usize,
                distinct_mib: distinct_mib.map(|d| d as usize),
                allocators: allocator.0,
                vs_kernel,
                pair_seconds,
                max_pages,
            })?;
            emit(json, &v)
        }
        cmd => run_tier(cmd),
    }
}

/// Runs a benchmark of the backing tiers and the policies that fill them,
/// in this process.
fn run_tier(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Proactive {
            mib,
            limit_mib,
            share,
            burst,
            pause_ms,
            data,
            json,
        } => {
            anyhow::ensure!(burst > 0, "--burst 0: give at least one page per burst");
            let pages = corpus::load(data, mib as usize * 256)?;
            note(&format!("data: {}", pages.source));
            let v = bench_admission::proactive(
                &pages,
                limit_mib as usize,
                share,
                burst,
                std::time::Duration::from_millis(pause_ms),
            )?;
            emit(json, &v)
        }
        Cmd::Admission {
            mib,
            threads,
            data,
            slow_us,
            read_limit,
            write_limit,
            json,
        } => {
            let v = bench_admission::run(&bench_admission::Args {
                mib: mib as usize,
                threads: threads as usize,
                data,
                slow_us,
                read_limit,
                write_limit,
            })?;
            emit(json, &v)
        }
        Cmd::Seal(a) => emit(
            a.json,
            &bench_seal::run(a.data, a.mib as usize, a.rounds as usize)?,
        ),
        Cmd::Remote(a) => emit(
            a.json,
            &bench_remote::run(a.data, a.mib as usize, a.rounds as usize)?,
        ),
        _ => unreachable!("`run` and `run_cache` run the others"),
    }
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        // A closed pipe (uzswap-bench ... | head) is not an error.
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        {
            std::process::exit(0);
        }
        eprintln!("uzswap-bench: error: {e:#}");
        std::process::exit(1);
    }
}
