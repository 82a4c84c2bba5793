//! `uzswap-bench run`: one unmodified C program (`workloads/usemem.c`)
//! under `uzswap run --memory-max B`, and the same binary under a memory
//! cgroup (v1) of B with the kernel's zswap and a swap file, in one run.
//!
//! Memory is compared as each side's own account of what the workload
//! costs: for uzswap the program's peak anonymous resident memory (`RssAnon`:
//! its resident managed pages, the compressed pool, the runtime's heap);
//! for the kernel the cgroup's usage plus the zswap pool (the pool is not
//! charged to the cgroup). The corpus the program checks against is a
//! read-only file mapping on both sides, charged to neither.

use crate::kernel::{measure_in_cgroup, KernelSwap};
use crate::note;
use crate::stats::median;
use anyhow::{bail, ensure, Context, Result};
use serde_json::{json, Value};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use uzswap_workload::usemem::Report;
use uzswap_workload::usemem_c::{self, Program};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub w: uzswap_workload::usemem::WorkloadArgs,
    #[arg(long, default_value_t = 2)]
    pub passes: u32,
    /// Only the uzswap side (no root needed).
    #[arg(long)]
    pub skip_kernel: bool,
    /// Rounds of both sides, the order alternating (uzswap first in odd
    /// rounds, the kernel in even ones); the ratios reported are the
    /// medians of the rounds' ratios, with their range. One round moves
    /// by ±10 % on a shared VM.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub rounds: u32,
    /// In every round, uzswap once more with the kernel's total memory as
    /// its budget (the cgroup's peak plus the zswap pool, which a v1
    /// cgroup leaves outside its limit): the two designs compared at equal
    /// memory.
    #[arg(long)]
    pub equal_total: bool,
    /// `uzswap run --cpu-handlers`.
    #[arg(long)]
    pub cpu_handlers: bool,
    /// `uzswap run --dedup`.
    #[arg(long)]
    pub dedup: bool,
    /// `uzswap run --cold-compressor NAME`.
    #[arg(long)]
    pub cold_compressor: Option<uzswap_cache::Compressor>,
    /// The `uzswap` binary to run (default: the one beside this
    /// executable, as `cargo build --release` leaves it).
    #[arg(long, value_name = "PATH")]
    pub uzswap: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

/// The `uzswap` binary: `explicit`, or the one beside this executable
/// (cargo puts every binary of the workspace in one directory).
pub(crate) fn find_uzswap(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        ensure!(
            p.is_file(),
            "--uzswap {}: no such file; give the path of a built uzswap binary",
            p.display()
        );
        return Ok(p.to_path_buf());
    }
    let exe = std::env::current_exe().context("locating the uzswap-bench binary")?;
    let beside = exe.with_file_name("uzswap");
    ensure!(
        beside.is_file(),
        "no uzswap binary beside this one ({}): build both with `cargo build --release` \
         (`-p uzswap-bench` alone does not build uzswap), or give --uzswap PATH",
        beside.display()
    );
    Ok(beside)
}

/// The children of `pid` (the program `uzswap run` started).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(c.split_whitespace().filter_map(|x| x.parse::<u32>().ok()));
        }
    }
    out
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
fn uzswap_side(args: &Args, uzswap: &Path, w: &Program, budget_mib: u64) -> Result<Value> {
    let stats_path = w.dir().join("final.json");
    let mut child = Command::new(uzswap)
        .arg("run")
        .arg("-q")
        .arg("--memory-max")
        .arg(format!("{budget_mib}M"))
        .arg("--compressor")
        .arg(&args.w.compressor)
        .arg("--backing-file")
        .arg(std::env::temp_dir())
        .arg("--stats-json")
        .arg(&stats_path)
        .args(args.cpu_handlers.then_some("--cpu-handlers"))
        .args(args.dedup.then_some("--dedup"))
        .args(
            args.cold_compressor
                .iter()
                .flat_map(|c| ["--cold-compressor".to_string(), c.to_string()]),
        )
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
                if let Some(&p) = children(run_pid).first() {
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
        "budget_mib": budget_mib,
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
        "lz4hc" => "lz4hc",
        "zstd" => "zstd",
        "deflate" => "deflate",
        _ => "lzo",
    }
}

fn kernel_side(args: &Args, w: &Program) -> Result<Value> {
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
    // Before the corpus is read: a missing binary is found in a moment.
    let uzswap = find_uzswap(args.uzswap.as_deref())?;
    let w = usemem_c::build(args.w.data, args.w.mib())?;
    note(&format!("data: {}", w.source));
    let mut out = json!({
        "benchmark": "run",
        "workload": "workloads/usemem.c (the same binary on both sides)",
        "data": w.source,
        "mib": args.w.mib(),
        "budget_mib": args.w.budget_mib(),
        "pattern": args.w.pattern,
        "passes": args.passes,
        "compressor": args.w.compressor,
        "rounds": args.rounds,
        "equal_total": args.equal_total,
        "cpu_handlers": args.cpu_handlers,
        "dedup": args.dedup,
        "cold_compressor": args.cold_compressor.map(|c| c.to_string()),
    });
    let mut rounds = Vec::new();
    let mut kernel_error = None;
    for i in 0..args.rounds {
        if args.rounds > 1 {
            note(&format!("round {} of {}", i + 1, args.rounds));
        }
        let with_kernel = !args.skip_kernel && kernel_error.is_none();
        // Alternating the order spreads a drift of the machine over both.
        let kernel_first = with_kernel && i % 2 == 1;
        let mut k = None;
        if kernel_first {
            k = Some(noted_kernel_side(args, &w));
        }
        let ours = noted_uzswap_side(args, &uzswap, &w, args.w.budget_mib() as u64)?;
        if with_kernel && !kernel_first {
            k = Some(noted_kernel_side(args, &w));
        }
        let equal = match &k {
            Some(Ok(k)) if args.equal_total => {
                let total = num(k, "peak_memory_bytes") as u64;
                Some(noted_uzswap_side(
                    args,
                    &uzswap,
                    &w,
                    total.div_ceil(1 << 20),
                )?)
            }
            _ => None,
        };
        let k = match k {
            Some(Err(e)) => {
                // Reported, not allowed to discard uzswap's figures; no
                // further kernel runs on a machine where one failed.
                kernel_error = Some(format!("{e:#}"));
                None
            }
            Some(Ok(k)) => Some(k),
            None => None,
        };
        rounds.push(round(ours, k, equal));
    }
    let summary = summarize(rounds);
    for (key, v) in summary.as_object().expect("an object") {
        out[key] = v.clone();
    }
    if let Some(e) = kernel_error {
        out["kernel_error"] = json!(e);
    }
    Ok(out)
}

fn noted_uzswap_side(args: &Args, uzswap: &Path, w: &Program, budget_mib: u64) -> Result<Value> {
    note(&format!(
        "uzswap run --memory-max {budget_mib}M -- usemem {} MiB, {} passes, {:?} ...",
        args.w.mib(),
        args.passes,
        args.w.pattern
    ));
    let ours = uzswap_side(args, uzswap, w, budget_mib)?;
    note(&format!(
        "uzswap: fill {:.0} KB/s, pass {:.0} KB/s, corrupt {}, peak memory {} B, fault p50 {} us",
        ours["fill_kbps"].as_f64().unwrap_or(0.0),
        ours["pass_kbps"].as_f64().unwrap_or(0.0),
        ours["corrupt_pages"],
        ours["peak_memory_bytes"],
        ours["fault_p50_us"]
    ));
    Ok(ours)
}

fn noted_kernel_side(args: &Args, w: &Program) -> Result<Value> {
    note(&format!(
        "kernel: the same binary in a {} MiB memory cgroup with zswap ...",
        args.w.budget_mib()
    ));
    let k = kernel_side(args, w);
    match &k {
        Ok(k) => note(&format!(
            "kernel zswap ({}): fill {:.0} KB/s, pass {:.0} KB/s, corrupt {}, peak memory {} B",
            k["compressor"],
            k["fill_kbps"].as_f64().unwrap_or(0.0),
            k["pass_kbps"].as_f64().unwrap_or(0.0),
            k["corrupt_pages"],
            k["peak_memory_bytes"]
        )),
        Err(e) => note(&format!("kernel run failed: {e:#}")),
    }
    k
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(0.0)
}

/// One round: both sides and their ratios (none without a kernel side),
/// and uzswap at the kernel's total memory where it ran.
fn round(ours: Value, k: Option<Value>, equal: Option<Value>) -> Value {
    let Some(k) = k else {
        return json!({ "uzswap": ours });
    };
    let mut r = json!({
        "throughput_ratio_vs_kernel": num(&ours, "pass_kbps") / num(&k, "pass_kbps").max(1e-9),
        "fill_ratio_vs_kernel": num(&ours, "fill_kbps") / num(&k, "fill_kbps").max(1e-9),
        "memory_ratio_vs_kernel":
            num(&ours, "peak_memory_bytes") / num(&k, "peak_memory_bytes").max(1.0),
        "uzswap": ours,
        "kernel": k,
    });
    if let Some(e) = equal {
        r["throughput_ratio_vs_kernel_equal_total"] =
            json!(num(&e, "pass_kbps") / num(&r["kernel"], "pass_kbps").max(1e-9));
        r["uzswap_equal_total"] = e;
    }
    r
}

/// The result of all rounds: corrupt pages summed over them; throughput,
/// memory and their ratios the medians over the rounds, ratios with their
/// range; `uzswap` and `kernel` in full from the median round (the one of
/// the median throughput ratio, or of the median throughput without a
/// kernel side); the rounds themselves without the final statistics.
fn summarize(rounds: Vec<Value>) -> Value {
    // The rounds' values at a JSON pointer.
    let of = |at: &str| -> Vec<f64> {
        rounds
            .iter()
            .filter_map(|r| r.pointer(at).and_then(Value::as_f64))
            .collect()
    };
    let corrupt = |at: &str| -> u64 {
        rounds
            .iter()
            .filter_map(|r| r.pointer(at).and_then(Value::as_u64))
            .sum()
    };
    let with_kernel = rounds.iter().all(|r| r.get("kernel").is_some());
    let mid = median_index(&of(if with_kernel {
        "/throughput_ratio_vs_kernel"
    } else {
        "/uzswap/pass_kbps"
    }));
    let mut out = json!({
        "corrupt_pages": corrupt("/uzswap/corrupt_pages"),
        "pass_kbps": median(of("/uzswap/pass_kbps")),
        "peak_memory_bytes": median(of("/uzswap/peak_memory_bytes")),
        "median_round": mid,
        "uzswap": rounds[mid]["uzswap"],
    });
    if with_kernel {
        out["kernel"] = rounds[mid]["kernel"].clone();
        out["kernel_corrupt_pages"] = json!(corrupt("/kernel/corrupt_pages"));
        if let Some(e) = rounds[mid].get("uzswap_equal_total") {
            out["uzswap_equal_total"] = e.clone();
            out["equal_total_corrupt_pages"] = json!(corrupt("/uzswap_equal_total/corrupt_pages"));
        }
        out["kernel_peak_memory_bytes"] = json!(median(of("/kernel/peak_memory_bytes")));
        for key in [
            "throughput_ratio_vs_kernel",
            "fill_ratio_vs_kernel",
            "memory_ratio_vs_kernel",
            "throughput_ratio_vs_kernel_equal_total",
        ] {
            let v = of(&format!("/{key}"));
            if v.is_empty() {
                continue;
            }
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            out[key] = json!(median(v));
            out[format!("{key}_range")] = json!([lo, hi]);
        }
    }
    out["each_round"] = rounds
        .into_iter()
        .map(|mut r| {
            for side in ["uzswap", "uzswap_equal_total"] {
                if let Some(o) = r.get_mut(side).and_then(Value::as_object_mut) {
                    o.remove("stats");
                }
            }
            r
        })
        .collect();
    out
}

/// The index of the median of `v` (the upper middle of an even count).
fn median_index(v: &[f64]) -> usize {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    idx[v.len() / 2]
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
    if let Some(e) = v.get("uzswap_equal_total") {
        s += &row(&format!("uzswap {}M", e["budget_mib"]), e);
        s += &format!(
            "at the kernel's total memory: throughput {:.2}x the kernel's\n",
            v["throughput_ratio_vs_kernel_equal_total"]
                .as_f64()
                .unwrap_or(0.0)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(pass: f64, fill: f64, mem: f64, corrupt: u64) -> Value {
        json!({
            "pass_kbps": pass,
            "fill_kbps": fill,
            "peak_memory_bytes": mem,
            "corrupt_pages": corrupt,
            "stats": { "big": true },
        })
    }

    #[test]
    fn rounds_give_median_ratios_with_their_range() {
        let rounds = vec![
            round(
                side(90.0, 10.0, 100.0, 0),
                Some(side(100.0, 20.0, 100.0, 0)),
                None,
            ),
            round(
                side(120.0, 10.0, 110.0, 2),
                Some(side(100.0, 20.0, 100.0, 1)),
                None,
            ),
            round(
                side(100.0, 10.0, 105.0, 0),
                Some(side(100.0, 10.0, 100.0, 0)),
                None,
            ),
        ];
        let s = summarize(rounds);
        let f = |k: &str| s[k].as_f64().unwrap();
        assert_eq!(f("throughput_ratio_vs_kernel"), 1.0);
        assert_eq!(s["throughput_ratio_vs_kernel_range"], json!([0.9, 1.2]));
        assert_eq!(f("memory_ratio_vs_kernel"), 1.05);
        assert_eq!(s["memory_ratio_vs_kernel_range"], json!([1.0, 1.1]));
        assert_eq!(f("fill_ratio_vs_kernel"), 0.5);
        // The median round's sides come in full, the others without stats.
        assert_eq!(s["median_round"], json!(2));
        assert_eq!(s["uzswap"]["pass_kbps"], json!(100.0));
        assert_eq!(s["uzswap"]["stats"]["big"], json!(true));
        assert_eq!(s["kernel"]["fill_kbps"], json!(10.0));
        assert_eq!(s["each_round"].as_array().unwrap().len(), 3);
        assert!(s["each_round"][0]["uzswap"].get("stats").is_none());
        // Corruption anywhere shows, summed per side.
        assert_eq!(s["corrupt_pages"], json!(2));
        assert_eq!(s["kernel_corrupt_pages"], json!(1));
        assert_eq!(f("pass_kbps"), 100.0);
        assert_eq!(f("kernel_peak_memory_bytes"), 100.0);
    }

    #[test]
    fn without_a_kernel_side_there_are_no_ratios() {
        let s = summarize(vec![
            round(side(50.0, 1.0, 7.0, 0), None, None),
            round(side(70.0, 1.0, 9.0, 0), None, None),
        ]);
        assert!(s.get("throughput_ratio_vs_kernel").is_none());
        assert!(s.get("kernel").is_none());
        // Upper middle of two.
        assert_eq!(s["median_round"], json!(1));
        assert_eq!(s["pass_kbps"], json!(70.0));
    }

    #[test]
    fn the_equal_total_side_has_its_own_ratio_and_corruption_count() {
        let rounds = vec![
            round(
                side(90.0, 10.0, 100.0, 0),
                Some(side(100.0, 20.0, 100.0, 0)),
                Some(side(150.0, 10.0, 190.0, 0)),
            ),
            round(
                side(100.0, 10.0, 100.0, 0),
                Some(side(100.0, 20.0, 100.0, 0)),
                Some(side(110.0, 10.0, 190.0, 3)),
            ),
        ];
        let s = summarize(rounds);
        assert_eq!(s["throughput_ratio_vs_kernel_equal_total"], json!(1.5));
        assert_eq!(
            s["throughput_ratio_vs_kernel_equal_total_range"],
            json!([1.1, 1.5])
        );
        assert_eq!(s["equal_total_corrupt_pages"], json!(3));
        assert!(s["each_round"][0]["uzswap_equal_total"]
            .get("stats")
            .is_none());
        assert!(table(&s).contains("at the kernel's total memory: throughput 1.50x"));
    }
}
