//! `uzswap-bench usemem`: the usemem workload of seeds 000 and 002 over
//! uzswap memory kept under a resident budget, and with `--vs-kernel` the
//! same workload in plain anonymous memory under a memory cgroup of the same
//! budget with a swap file, once with the kernel's zswap and once without.

use crate::bench_run::kernel_compressor;
use crate::kernel::{usemem_in_cgroup, KernelRun, KernelSwap};
use crate::note;
use anyhow::{Context, Result};
use serde_json::json;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub w: uzswap_workload::usemem::WorkloadArgs,
    #[arg(long, default_value_t = 3)]
    pub passes: u32,
    /// Also run the same workload under a memory cgroup with the
    /// kernel's zswap, and with plain swap (root; restored afterwards).
    #[arg(long)]
    pub vs_kernel: bool,
    /// Keep the pool's copy of pages brought back (mapped
    /// write-protected) so that evicting them unwritten needs no
    /// compression; off: exclusive loads, as the kernel.
    #[arg(long, default_value = "on", value_parser = crate::parse_on_off, action = clap::ArgAction::Set)]
    pub keep_clean: bool,
    /// Pay for the cache's index out of the budget (`PagerConfig::charge`),
    /// as `uzswap run` pays for its heap: resident region pages plus the
    /// index stay within the budget, the pool is outside it as the
    /// kernel's zswap pool is outside a v1 memory cgroup's limit.
    #[arg(long, default_value = "on", value_parser = crate::parse_on_off, action = clap::ArgAction::Set)]
    pub charge_index: bool,
    /// Resolve faults on the faulting thread's CPU (`PagerConfig::
    /// cpu_handlers`); off: one handler thread serves every fault.
    #[arg(long, default_value = "off", value_parser = crate::parse_on_off, action = clap::ArgAction::Set)]
    pub cpu_handlers: bool,
    /// Resolve faults on the faulting thread itself, in a SIGBUS handler
    /// (`PagerConfig::in_thread_faults`); off: a handler thread serves
    /// every fault.
    #[arg(long, default_value = "off", value_parser = crate::parse_on_off, action = clap::ArgAction::Set)]
    pub in_thread_faults: bool,
    /// Hold the CPU latency request while faults arrive
    /// (`PagerConfig::latency_hold`; root only): idle CPUs poll instead of
    /// halting.
    #[arg(long, default_value = "on", value_parser = crate::parse_on_off, action = clap::ArgAction::Set)]
    pub latency_hold: bool,
    /// Hold the same request (0 µs) through the kernel's runs, so that both
    /// sides run with the same idle states (root only).
    #[arg(long, default_value = "off", value_parser = crate::parse_on_off, action = clap::ArgAction::Set)]
    pub kernel_latency_hold: bool,
    /// Choose victims by use, reads included: the region cut into chunk
    /// mappings whose accessed bits the evictor samples
    /// (`PagerConfig::access_chunk`, the pager's `ACCESS_CHUNK`, as
    /// `uzswap run` does); off: by the lists alone.
    #[arg(long, default_value = "off", value_parser = crate::parse_on_off, action = clap::ArgAction::Set)]
    pub access_signal: bool,
    /// Most stored pages brought back with a faulting one
    /// (`PagerConfig::readahead_max`; default the pager's).
    #[arg(long)]
    pub readahead_max: Option<usize>,
    /// Compress victims that never joined the working set (never on the
    /// pager's active list this residency) with this codec instead
    /// (`CacheConfig::cold_compressor`), e.g. zstd:-1: a denser pool for
    /// pages unlikely to come back soon, the fast codec for the rest.
    #[arg(long)]
    pub cold_compressor: Option<String>,
    /// Where pages written back go: a file in $TMPDIR, or a Redis node
    /// started on loopback for the run (needs redis-server).
    #[arg(long, value_enum, default_value_t = Tier::File)]
    pub tier: Tier,
    /// The pool's limit in MiB (default: 20 % of RAM, as the kernel's
    /// zswap): a small pool makes the workload reach the backing tier.
    #[arg(long)]
    pub pool_mib: Option<u64>,
    /// Store identical pages once (`CacheConfig::dedup`).
    #[arg(long, default_value = "off", value_parser = crate::parse_on_off, action = clap::ArgAction::Set)]
    pub dedup: bool,
    #[arg(long)]
    pub json: bool,
}

/// The backing tier of `--tier`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Tier {
    File,
    Redis,
}

/// One kernel run (zswap with `compressor`, or plain swap with `None`).
/// Returns the run and the compressor the kernel really used.
pub fn kernel_run(args: &Args, compressor: Option<&str>) -> Result<(KernelRun, Option<String>)> {
    let mut ks = KernelSwap::setup((args.w.mib() as u64) << 21, compressor)?;
    let cg = ks.cgroup((args.w.budget_mib() as u64) << 20)?;
    let run = usemem_in_cgroup(&cg, args.w.data, args.w.mib(), args.w.pattern, args.passes)?;
    let used = ks.compressor.clone();
    drop(ks);
    Ok((run, used))
}

pub fn run(args: &Args) -> Result<serde_json::Value> {
    let mut out = json!({
        "benchmark": "usemem",
        "mib": args.w.mib(),
        "budget_mib": args.w.budget_mib(),
        "data": format!("{:?}", args.w.data).to_lowercase(),
        "pattern": args.w.pattern,
        "passes": args.passes,
        "compressor": args.w.compressor,
        "keep_clean": args.keep_clean,
        "charge_index": args.charge_index,
        "cpu_handlers": args.cpu_handlers,
        "in_thread_faults": args.in_thread_faults,
        "latency_hold": args.latency_hold,
        "kernel_latency_hold": args.kernel_latency_hold,
        "access_signal": args.access_signal,
        "readahead_max": args.readahead_max,
        "dedup": args.dedup,
        "cold_compressor": args.cold_compressor,
    });
    let ours = uzswap_run(args)?;
    let pass_kbps = ours["pass_kbps"].as_f64().unwrap_or(0.0);
    for (k, v) in ours.as_object().expect("an object") {
        out[k] = v.clone();
    }
    if args.vs_kernel {
        // Released when this process ends, whatever the path out.
        if args.kernel_latency_hold {
            uzswap_os::latency::hold();
            out["kernel_latency_hold_state"] = json!(uzswap_os::latency::stats().state);
        }
        let comp = kernel_compressor(&args.w.compressor);
        note(&format!(
            "kernel: zswap ({comp}) in a memory cgroup of {} MiB ...",
            args.w.budget_mib()
        ));
        // A failed kernel run (its child OOM-killed, say) is reported in
        // the result, not allowed to discard uzswap's figures.
        let (z, comp) = match kernel_run(args, Some(comp)) {
            Ok(r) => r,
            Err(e) => {
                note(&format!("kernel zswap run failed: {e:#}"));
                out["kernel_error"] = json!(format!("{e:#}"));
                return Ok(out);
            }
        };
        note(&format!(
            "kernel zswap: fill {:.0} KB/s, pass {:.0} KB/s, corrupt {}, faults seen by the program {} p50 {:.1} us p99 {:.1} us mean {:.1} us, peak pool {} B, peak cgroup+pool {} B",
            z.report.fill_kbps, z.report.pass_kbps, z.report.corrupt_pages, z.report.faults_seen, z.report.fault_p50_us, z.report.fault_p99_us, z.report.fault_mean_us, z.peak_zswap_pool_bytes, z.peak_memory_bytes
        ));
        note("kernel: plain swap ...");
        let (s, _) = match kernel_run(args, None) {
            Ok(r) => r,
            Err(e) => {
                note(&format!("kernel swap run failed: {e:#}"));
                out["kernel_error"] = json!(format!("{e:#}"));
                return Ok(out);
            }
        };
        note(&format!(
            "kernel swap: fill {:.0} KB/s, pass {:.0} KB/s, corrupt {}",
            s.report.fill_kbps, s.report.pass_kbps, s.report.corrupt_pages
        ));
        out["kernel_zswap_compressor"] = json!(comp);
        out["kernel_zswap_pass_kbps"] = json!(z.report.pass_kbps);
        out["kernel_swap_pass_kbps"] = json!(s.report.pass_kbps);
        out["kernel_zswap_pool_bytes"] = json!(z.peak_zswap_pool_bytes);
        out["kernel_zswap_fault_p50_us"] = json!(z.report.fault_p50_us);
        out["kernel_zswap_fault_p99_us"] = json!(z.report.fault_p99_us);
        out["kernel_zswap_fault_mean_us"] = json!(z.report.fault_mean_us);
        out["ratio_vs_kernel_zswap"] = json!(pass_kbps / z.report.pass_kbps.max(1e-9));
        out["kernel_peak_memory_bytes"] = json!(z.peak_memory_bytes);
        out["kernel_zswap"] = serde_json::to_value(&z)?;
        out["kernel_swap"] = serde_json::to_value(&s)?;
    }
    Ok(out)
}

/// The cache (over the file or Redis tier `args` names) and the pager
/// over it that the usemem run under uzswap uses, and the Redis server
/// started for `--tier redis`, to be kept until the run ends.
fn make_pager(
    args: &Args,
    compressor: uzswap_cache::Compressor,
    cold_compressor: Option<uzswap_cache::Compressor>,
) -> Result<(
    Arc<uzswap_cache::Cache>,
    Arc<uzswap_region::Pager>,
    Option<uzswap_remote::testing::Server>,
)> {
    let mut server = None;
    let backing = match args.tier {
        Tier::File => uzswap_cache::Backing::File(std::env::temp_dir()),
        Tier::Redis => {
            let srv = uzswap_remote::testing::Server::start()
                .context("--tier redis needs redis-server (apt-get install redis-server)")?;
            let store = uzswap_remote::RedisBacking::connect(&srv.url())?;
            server = Some(srv);
            uzswap_cache::Backing::Store(Box::new(store))
        }
    };
    let pool_limit = args
        .pool_mib
        .map_or(uzswap_cache::CacheConfig::default().pool_limit, |m| {
            uzswap_cache::PoolLimit::Bytes(m << 20)
        });
    let cache = Arc::new(uzswap_cache::Cache::new(uzswap_cache::CacheConfig {
        compressor,
        backing,
        pool_limit,
        dedup: args.dedup,
        cold_compressor,
        ..uzswap_cache::CacheConfig::default()
    })?);
    let charge = args.charge_index.then(|| {
        let cache = cache.clone();
        uzswap_region::Charge(Arc::new(move || cache.stats().index_bytes))
    });
    let mut cfg = uzswap_region::PagerConfig {
        keep_clean: args.keep_clean,
        cpu_handlers: args.cpu_handlers,
        in_thread_faults: args.in_thread_faults,
        latency_hold: args.latency_hold,
        access_chunk: if args.access_signal {
            uzswap_region::ACCESS_CHUNK
        } else {
            0
        },
        charge,
        ..uzswap_region::PagerConfig::new(args.w.budget_mib() << 8)
    };
    if let Some(n) = args.readahead_max {
        cfg.readahead_max = n;
    }
    let pager = Arc::new(uzswap_region::Pager::new(cache.clone(), cfg)?);
    Ok((cache, pager, server))
}

/// The workload in a uzswap region with a resident budget, over the cache
/// (pool limit the default 20 % of RAM, as the kernel's zswap; an encrypted
/// backing file in $TMPDIR). Memory is sampled every 10 ms: the process's
/// RSS above what it held before the region existed, and uzswap's own
/// account (resident region pages + pool + index).
fn uzswap_run(args: &Args) -> Result<serde_json::Value> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    // Checked before the corpus is read (seconds).
    let compressor: uzswap_cache::Compressor = args.w.compressor.parse()?;
    let cold_compressor = args
        .cold_compressor
        .as_deref()
        .map(str::parse::<uzswap_cache::Compressor>)
        .transpose()
        .context("--cold-compressor")?;
    let pages = uzswap_workload::corpus::load_for_workload(args.w.data, args.w.mib())?;
    note(&format!("data: {}", pages.source));
    // The server of `--tier redis`, kept until the run ends.
    let (cache, pager, server) = make_pager(args, compressor, cold_compressor)?;
    let base_rss = uzswap_os::rss_bytes().unwrap_or(0);
    let mut region = pager.region(args.w.mib() << 20)?;
    let stop = Arc::new(AtomicBool::new(false));
    let peak_rss = Arc::new(AtomicU64::new(0));
    let peak_own = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (cache, pager, stop, peak_rss, peak_own) = (
            cache.clone(),
            pager.clone(),
            stop.clone(),
            peak_rss.clone(),
            peak_own.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let rss = uzswap_os::rss_bytes().unwrap_or(0).saturating_sub(base_rss);
                peak_rss.fetch_max(rss, Ordering::Relaxed);
                let st = cache.stats();
                let own = pager.stats().resident_pages * 4096 + st.pool_total_size + st.index_bytes;
                peak_own.fetch_max(own, Ordering::Relaxed);
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        })
    };
    note(&format!(
        "uzswap: usemem over {} MiB, budget {} MiB, {compressor}{} ...",
        args.w.mib(),
        args.w.budget_mib(),
        cold_compressor.map_or(String::new(), |c| format!(" (cold victims: {c})"))
    ));
    let report =
        uzswap_workload::usemem::run(region.as_mut_slice(), &pages, args.w.pattern, args.passes);
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    let ps = pager.stats();
    let cs = cache.stats();
    drop(region);
    drop(pager);
    drop(cache);
    drop(server);
    note(&format!(
        "uzswap: {:?} tier: {} pages written back, {} faults from it",
        args.tier, cs.written_back_pages, ps.faults_backing
    ));
    note(&format!(
        "uzswap: fill {:.0} KB/s, pass {:.0} KB/s, corrupt {}, faults seen by the program {} p50 {:.1} us p99 {:.1} us mean {:.1} us (in the handler: p50 {:.1} us p99 {:.1} us), pool {} B",
        report.fill_kbps,
        report.pass_kbps,
        report.corrupt_pages,
        report.faults_seen,
        report.fault_p50_us,
        report.fault_p99_us,
        report.fault_mean_us,
        ps.fault_latency.p50_us,
        ps.fault_latency.p99_us,
        cs.pool_total_size
    ));
    Ok(json!({
        "fill_kbps": report.fill_kbps,
        "pass_kbps": report.pass_kbps,
        "corrupt_pages": report.corrupt_pages,
        "fault_p50_us": report.fault_p50_us,
        "fault_p99_us": report.fault_p99_us,
        "fault_mean_us": report.fault_mean_us,
        "faults_seen": report.faults_seen,
        "handler_fault_p50_us": ps.fault_latency.p50_us,
        "handler_fault_p99_us": ps.fault_latency.p99_us,
        "peak_rss_bytes": peak_rss.load(Ordering::Relaxed),
        "peak_memory_bytes": peak_own.load(Ordering::Relaxed),
        "pool_bytes": cs.pool_total_size,
        "tier": format!("{:?}", args.tier).to_lowercase(),
        "pager": serde_json::to_value(&ps)?,
        "cache": serde_json::to_value(&cs)?,
    }))
}
