//! `uzswap`: thin glue over the library crates: the demo, the benchmarks.
//! Arguments are parsed and validated first (clap), then turned into the
//! real configuration; `main` only maps errors to exit codes.

mod bench_admission;
mod bench_cache;
mod bench_pool;
mod bench_run;
mod bench_seal;
mod bench_usemem;
mod corpus;
mod kernel;
mod run;
mod stats;
mod usemem;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::io::Write;
use uzswap_zpool::AllocatorKind;

#[derive(Parser)]
#[command(
    name = "uzswap",
    version,
    about = "zswap, the Linux compressed swap cache, in userspace"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a usemem workload on real pages in a quarter of the memory it
    /// needs, and print what the cache did.
    Demo {
        /// MiB the workload uses.
        #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(8..=8192))]
        mib: u32,
    },
    /// Run an unmodified program with its memory kept under a resident
    /// budget: cold pages are compressed into the pool (and the coldest
    /// written to the backing file); a fault brings them back. The budget
    /// applies to each process the program executes. Exits with the
    /// program's status (128+N if it died of signal N; 125 if it could not
    /// be started under uzswap).
    #[command(arg_required_else_help = true)]
    Run(run::Args),
    /// Live statistics of a program under `uzswap run` (its pid, or the pid
    /// of `uzswap run` itself).
    Stats {
        pid: u32,
        /// One JSON object.
        #[arg(long, conflicts_with = "prometheus")]
        json: bool,
        /// Prometheus text exposition format.
        #[arg(long)]
        prometheus: bool,
    },
    /// Benchmarks; each prints one JSON object on stdout with --json.
    #[command(subcommand)]
    Bench(Bench),
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

#[derive(Subcommand)]
enum Bench {
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
        /// reach seed 004's 1 GiB scale on a machine with fewer real pages.
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
    Seal {
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
        mib: u64,
        #[arg(long, value_enum, default_value = "mixed")]
        data: corpus::DataKind,
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=99))]
        rounds: u64,
        #[arg(long)]
        json: bool,
    },
    /// IO-aware admission (seed 002) on a fast tier (a page-cached file)
    /// and on a slow one (the same file with a delay per IO), each with
    /// admission off and on: store and load throughput, pool memory.
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
    /// The usemem workload (fill, then read-check-rewrite passes) under a
    /// resident budget, optionally against the kernel's zswap and swap.
    Usemem(bench_usemem::Args),
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

fn emit(json: bool, v: &serde_json::Value) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{v}")?;
    } else {
        writeln!(out, "{}", serde_json::to_string_pretty(v)?)?;
    }
    Ok(())
}

/// The main job on the embedded default: an unmodified C program (the
/// usemem workload, built here) run by `uzswap run` in a quarter of the
/// memory it uses, on real mixed pages; its cold pages are compressed into
/// the pool, capped at an eighth so that the coldest are written back to
/// an encrypted, unlinked file in `$TMPDIR`. Shows the live statistics
/// once the pool is in use, and the run's summary at the end.
fn demo(mib: u32) -> Result<()> {
    use anyhow::Context;
    use std::io::BufRead;
    let mib = mib as usize;
    let w = bench_run::prepare(corpus::DataKind::Mixed, mib)?;
    kernel::note(&format!("data: {}", w.source));
    let (budget, pool) = (mib / 4, mib / 8);
    let tmp = std::env::temp_dir();
    kernel::note(&format!(
        "uzswap run --memory-max {budget}M --pool-max {pool}M --backing-file {} -- usemem ({mib} MiB, 2 passes, skewed)",
        tmp.display()
    ));
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .arg("run")
        .args(["--memory-max", &format!("{budget}M")])
        .args(["--pool-max", &format!("{pool}M")])
        .arg("--backing-file")
        .arg(&tmp)
        .arg("--")
        .arg(&w.bin)
        .args(w.args(mib, 2, usemem::Pattern::Skewed))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("starting uzswap run")?;
    let pid = child.id();
    // The live view, as `uzswap stats PID` shows it, once pages are coming
    // back from the pool.
    let mut out = std::io::stdout().lock();
    for _ in 0..600 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let Ok(v) = stats::get(pid) else { continue };
        if v.pager.faults_pool > 0 {
            writeln!(out, "live, from `uzswap stats {pid}`:")?;
            write!(out, "{}", stats::text(&v))?;
            break;
        }
    }
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    let status = child.wait()?;
    let report: usemem::Report = serde_json::from_str(line.trim()).with_context(|| {
        format!("the workload printed no report ({status}); uzswap run's messages above say why")
    })?;
    writeln!(
        out,
        "usemem: {} pages, fill {:.0} KB/s, {} passes {:.0} KB/s, corrupt pages: {}",
        report.pages, report.fill_kbps, report.passes, report.pass_kbps, report.corrupt_pages
    )?;
    anyhow::ensure!(
        report.corrupt_pages == 0 && status.success(),
        "{} pages came back wrong ({status})",
        report.corrupt_pages
    );
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Demo { mib } => demo(mib),
        Cmd::Run(args) => {
            let outcome = match run::run(&args) {
                Ok(o) => o,
                Err(e) => {
                    // 125, as env(1) and timeout(1): uzswap itself failed
                    // and the program did not run.
                    eprintln!("uzswap: error: {e:#}");
                    std::process::exit(125);
                }
            };
            if !args.quiet {
                eprint!("{}", run::summary(&args, &outcome));
            }
            std::process::exit(outcome.code);
        }
        Cmd::Stats {
            pid,
            json,
            prometheus,
        } => {
            let v = stats::get(pid)?;
            let mut out = std::io::stdout().lock();
            if json {
                writeln!(out, "{v}")?;
            } else if prometheus {
                write!(out, "{}", stats::prometheus(&v))?;
            } else {
                write!(out, "{}", stats::text(&v))?;
            }
            Ok(())
        }
        Cmd::Bench(Bench::Usemem(args)) => emit(args.json, &bench_usemem::run(&args)?),
        Cmd::Bench(Bench::DedupCost {
            data,
            mib,
            compressor,
            rounds,
            json,
        }) => {
            let v = bench_cache::dedup_cost(data, mib as usize, compressor, rounds as usize)?;
            emit(json, &v)
        }
        Cmd::Bench(Bench::Proactive {
            mib,
            limit_mib,
            share,
            burst,
            pause_ms,
            data,
            json,
        }) => {
            anyhow::ensure!(burst > 0, "--burst 0: give at least one page per burst");
            let pages = corpus::load(data, mib as usize * 256)?;
            kernel::note(&format!("data: {}", pages.source));
            let v = bench_admission::proactive(
                &pages,
                limit_mib as usize,
                share,
                burst,
                std::time::Duration::from_millis(pause_ms),
            )?;
            emit(json, &v)
        }
        Cmd::Bench(Bench::Admission {
            mib,
            threads,
            data,
            slow_us,
            read_limit,
            write_limit,
            json,
        }) => {
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
        Cmd::Bench(Bench::Seal {
            mib,
            data,
            rounds,
            json,
        }) => emit(json, &bench_seal::run(data, mib as usize, rounds as usize)?),
        Cmd::Bench(Bench::Run(args)) => {
            let v = bench_run::run(&args)?;
            if !args.json {
                eprint!("{}", bench_run::table(&v));
            }
            emit(args.json, &v)
        }
        Cmd::Bench(Bench::Cache {
            data,
            compressor,
            mib,
            allocator,
            dedup,
            vs_kernel,
            json,
        }) => {
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
        Cmd::Bench(Bench::Pool {
            data,
            mib,
            allocator,
            vs_kernel,
            pair_seconds,
            max_pages,
            distinct_mib,
            json,
        }) => {
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
    }
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        // A closed pipe (uzswap ... | head) is not an error.
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        {
            std::process::exit(0);
        }
        eprintln!("uzswap: error: {e:#}");
        std::process::exit(1);
    }
}
