//! `uzswap bench run`: one unmodified C program (`workloads/usemem.c`)
//! under `uzswap run --memory-max B`, and the same binary under a memory
//! cgroup (v1) of B with the kernel's zswap and a swap file, in one run.
//!
//! Memory is compared as each side's own account of what the workload
//! costs: for uzswap the program's peak anonymous resident memory (`RssAnon`:
//! its resident managed pages, the compressed pool, the runtime's heap);
//! for the kernel the cgroup's usage plus the zswap pool (the pool is not
//! charged to the cgroup). The corpus the program checks against is a
//! read-only file mapping on both sides, charged to neither.

use crate::corpus::DataKind;
use crate::kernel::{measure_in_cgroup, note, KernelSwap};
use crate::run::TempDir;
use crate::usemem::{Pattern, Report};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// The workload's source, compiled on the machine that runs it.
const USEMEM_C: &str = include_str!("../workloads/usemem.c");

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub w: crate::usemem::WorkloadArgs,
    #[arg(long, default_value_t = 2)]
    pub passes: u32,
    /// Only the uzswap side (no root needed).
    #[arg(long)]
    pub skip_kernel: bool,
    #[arg(long)]
    pub json: bool,
}

/// The C workload, built, and its corpus file.
pub struct Workload {
    pub dir: TempDir,
    pub bin: PathBuf,
    pub corpus: PathBuf,
    pub source: String,
}

/// Writes the corpus pages for `mib` of workload to a file and compiles
/// the workload with `cc`.
pub fn prepare(data: DataKind, mib: usize) -> Result<Workload> {
    let dir = TempDir::new()?;
    let pages = crate::corpus::load_for_workload(data, mib)?;
    let corpus = dir.0.join("corpus.pages");
    std::fs::write(&corpus, &pages.bytes)
        .with_context(|| format!("writing {} (is $TMPDIR full?)", corpus.display()))?;
    let src = dir.0.join("usemem.c");
    std::fs::write(&src, USEMEM_C)?;
    let bin = dir.0.join("usemem");
    let out = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .context("the workload is C: a C compiler (cc) is needed; install gcc or clang")?;
    if !out.status.success() {
        bail!(
            "cc could not build the usemem workload:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(Workload {
        dir,
        bin,
        corpus,
        source: pages.source,
    })
}

impl Workload {
    /// The workload's arguments.
    pub fn args(&self, mib: usize, passes: u32, pattern: Pattern) -> Vec<String> {
        vec![
            self.corpus.to_string_lossy().into_owned(),
            mib.to_string(),
            passes.to_string(),
            format!("{pattern:?}").to_lowercase(),
        ]
    }
}

/// A field of `/proc/PID/status`, in bytes.
fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let l = s.lines().find(|l| l.starts_with(field))?;
    l.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|k| k * 1024)
}

/// The uzswap side: `uzswap run` of the workload, sampling the program's
/// anonymous resident memory every 10 ms.
fn uzswap_side(args: &Args, w: &Workload) -> Result<Value> {
    let stats_path = w.dir.0.join("final.json");
    let exe = std::env::current_exe().context("locating the uzswap binary")?;
    let mut child = Command::new(exe)
        .arg("run")
        .arg("-q")
        .arg("--memory-max")
        .arg(format!("{}M", args.w.budget_mib()))
        .arg("--compressor")
        .arg(&args.w.compressor)
        .arg("--backing-file")
        .arg(std::env::temp_dir())
        .arg("--stats-json")
        .arg(&stats_path)
        .arg("--")
        .arg(&w.bin)
        .args(w.args(args.w.mib(), args.passes, args.w.pattern))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting uzswap run")?;
    let run_pid = child.id();
    let stop = Arc::new(AtomicBool::new(false));
    let peak_anon = Arc::new(AtomicU64::new(0));
    let peak_rss = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, peak_anon, peak_rss) = (stop.clone(), peak_anon.clone(), peak_rss.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(&p) = crate::stats::children(run_pid).first() {
                    if let Some(a) = status_bytes(p, "RssAnon:") {
                        peak_anon.fetch_max(a, Ordering::Relaxed);
                    }
                    if let Some(r) = status_bytes(p, "VmRSS:") {
                        peak_rss.fetch_max(r, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        })
    };
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    let status = child.wait()?;
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    if line.trim().is_empty() {
        bail!("the workload under uzswap run printed no report ({status}); uzswap run's messages above say why");
    }
    let report: Report = serde_json::from_str(line.trim()).context("parsing the report")?;
    let stats: Value = std::fs::read(&stats_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    let n = |p: &str| stats.pointer(p).cloned().unwrap_or(Value::Null);
    Ok(json!({
        "exit_status": status.code(),
        "fill_kbps": report.fill_kbps,
        "pass_kbps": report.pass_kbps,
        "corrupt_pages": report.corrupt_pages,
        "peak_memory_bytes": peak_anon.load(Ordering::Relaxed),
        "peak_rss_bytes": peak_rss.load(Ordering::Relaxed),
        "fault_p50_us": n("/pager/fault_latency/p50_us"),
        "fault_p99_us": n("/pager/fault_latency/p99_us"),
        "pool_bytes_at_exit": n("/cache/pool_total_size"),
        "written_back_pages": n("/cache/written_back_pages"),
        "stats": stats,
    }))
}

/// The kernel's compressor for ours: the same where the kernel has it.
pub fn kernel_compressor(ours: &str) -> &'static str {
    match ours.split(':').next().unwrap_or("") {
        "lz4" => "lz4",
        "zstd" => "zstd",
        "deflate" => "deflate",
        _ => "lzo",
    }
}

fn kernel_side(args: &Args, w: &Workload) -> Result<Value> {
    let mut ks = KernelSwap::setup(
        (args.w.mib() as u64) << 21,
        Some(kernel_compressor(&args.w.compressor)),
    )?;
    let cg = ks.cgroup((args.w.budget_mib() as u64) << 20)?;
    let mut cmd = Command::new(&w.bin);
    cmd.args(w.args(args.w.mib(), args.passes, args.w.pattern))
        .arg(cg.join("tasks"));
    let run = measure_in_cgroup(&cg, cmd)?;
    let compressor = ks.compressor.clone();
    drop(ks); // swap off, zswap parameters back, cgroup removed
    Ok(json!({
        "compressor": compressor,
        "fill_kbps": run.report.fill_kbps,
        "pass_kbps": run.report.pass_kbps,
        "corrupt_pages": run.report.corrupt_pages,
        "peak_memory_bytes": run.peak_memory_bytes,
        "peak_zswap_pool_bytes": run.peak_zswap_pool_bytes,
        "cgroup_max_usage_bytes": run.cgroup_max_usage_bytes,
        "zswpout": run.zswpout,
        "zswpwb": run.zswpwb,
        "pswpout": run.pswpout,
    }))
}

pub fn run(args: &Args) -> Result<Value> {
    let w = prepare(args.w.data, args.w.mib())?;
    note(&format!("data: {}", w.source));
    note(&format!(
        "uzswap run --memory-max {}M -- usemem {} MiB, {} passes, {:?} ...",
        args.w.budget_mib(),
        args.w.mib(),
        args.passes,
        args.w.pattern
    ));
    let ours = uzswap_side(args, &w)?;
    note(&format!(
        "uzswap: fill {:.0} KB/s, pass {:.0} KB/s, corrupt {}, peak memory {} B, fault p50 {} us",
        ours["fill_kbps"].as_f64().unwrap_or(0.0),
        ours["pass_kbps"].as_f64().unwrap_or(0.0),
        ours["corrupt_pages"],
        ours["peak_memory_bytes"],
        ours["fault_p50_us"]
    ));
    let mut out = json!({
        "benchmark": "run",
        "workload": "workloads/usemem.c (the same binary on both sides)",
        "data": w.source,
        "mib": args.w.mib(),
        "budget_mib": args.w.budget_mib(),
        "pattern": args.w.pattern,
        "passes": args.passes,
        "compressor": args.w.compressor,
        "corrupt_pages": ours["corrupt_pages"],
        "pass_kbps": ours["pass_kbps"],
        "peak_memory_bytes": ours["peak_memory_bytes"],
        "uzswap": ours,
    });
    if args.skip_kernel {
        return Ok(out);
    }
    note(&format!(
        "kernel: the same binary in a {} MiB memory cgroup with zswap ...",
        args.w.budget_mib()
    ));
    let k = match kernel_side(args, &w) {
        Ok(k) => k,
        Err(e) => {
            // Reported, not allowed to discard uzswap's figures.
            note(&format!("kernel run failed: {e:#}"));
            out["kernel_error"] = json!(format!("{e:#}"));
            return Ok(out);
        }
    };
    note(&format!(
        "kernel zswap ({}): fill {:.0} KB/s, pass {:.0} KB/s, corrupt {}, peak memory {} B",
        k["compressor"],
        k["fill_kbps"].as_f64().unwrap_or(0.0),
        k["pass_kbps"].as_f64().unwrap_or(0.0),
        k["corrupt_pages"],
        k["peak_memory_bytes"]
    ));
    let f = |v: &Value, key: &str| v[key].as_f64().unwrap_or(0.0);
    out["throughput_ratio_vs_kernel"] = json!(f(&out, "pass_kbps") / f(&k, "pass_kbps").max(1e-9));
    out["fill_ratio_vs_kernel"] =
        json!(f(&out["uzswap"], "fill_kbps") / f(&k, "fill_kbps").max(1e-9));
    out["kernel_peak_memory_bytes"] = k["peak_memory_bytes"].clone();
    out["memory_ratio_vs_kernel"] =
        json!(f(&out, "peak_memory_bytes") / f(&k, "peak_memory_bytes").max(1.0));
    out["kernel_corrupt_pages"] = k["corrupt_pages"].clone();
    out["kernel"] = k;
    Ok(out)
}

/// A table of the result, for stderr.
pub fn table(v: &Value) -> String {
    let mut s = String::new();
    let row = |name: &str, x: &Value| {
        format!(
            "{name:<14} {:>12.0} {:>12.0} {:>8} {:>14}\n",
            x["pass_kbps"].as_f64().unwrap_or(0.0),
            x["fill_kbps"].as_f64().unwrap_or(0.0),
            x["corrupt_pages"],
            x["peak_memory_bytes"]
        )
    };
    s += &format!(
        "{:<14} {:>12} {:>12} {:>8} {:>14}\n",
        "", "pass KB/s", "fill KB/s", "corrupt", "peak memory B"
    );
    s += &row("uzswap run", &v["uzswap"]);
    if v.get("kernel").is_some() {
        s += &row("kernel zswap", &v["kernel"]);
        s += &format!(
            "throughput {:.2}x the kernel's, memory {:.2}x\n",
            v["throughput_ratio_vs_kernel"].as_f64().unwrap_or(0.0),
            v["memory_ratio_vs_kernel"].as_f64().unwrap_or(0.0)
        );
    }
    s
}
