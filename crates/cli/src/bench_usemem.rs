//! `uzswap bench usemem`: the usemem workload of seeds 000 and 002 over
//! uzswap memory kept under a resident budget, and with `--vs-kernel` the
//! same workload in plain anonymous memory under a memory cgroup of the same
//! budget with a swap file, once with the kernel's zswap and once without.

use crate::corpus::DataKind;
use crate::kernel::{note, usemem_in_cgroup, KernelRun, KernelSwap};
use crate::usemem::Pattern;
use anyhow::Result;
use serde_json::json;

pub struct Args {
    pub mib: usize,
    pub budget_mib: usize,
    pub data: DataKind,
    pub pattern: Pattern,
    pub passes: u32,
    pub compressor: String,
    pub vs_kernel: bool,
}

/// The kernel's compressor for ours: the same where the kernel has it.
fn kernel_compressor(ours: &str) -> &'static str {
    match ours.split(':').next().unwrap_or("") {
        "lz4" => "lz4",
        "zstd" => "zstd",
        "deflate" => "deflate",
        _ => "lzo",
    }
}

/// One kernel run (zswap with `compressor`, or plain swap with `None`).
/// Returns the run and the compressor the kernel really used.
pub fn kernel_run(args: &Args, compressor: Option<&str>) -> Result<(KernelRun, Option<String>)> {
    let mut ks = KernelSwap::setup((args.mib as u64) << 21, compressor)?;
    let cg = ks.cgroup((args.budget_mib as u64) << 20)?;
    let run = usemem_in_cgroup(&cg, args.data, args.mib, args.pattern, args.passes)?;
    let used = ks.compressor.clone();
    drop(ks);
    Ok((run, used))
}

pub fn run(args: &Args) -> Result<serde_json::Value> {
    let mut out = json!({
        "benchmark": "usemem",
        "mib": args.mib,
        "budget_mib": args.budget_mib,
        "data": format!("{:?}", args.data).to_lowercase(),
        "pattern": args.pattern,
        "passes": args.passes,
        "compressor": args.compressor,
    });
    if args.vs_kernel {
        let comp = kernel_compressor(&args.compressor);
        note(&format!(
            "kernel: zswap ({comp}) in a memory cgroup of {} MiB ...",
            args.budget_mib
        ));
        let (z, comp) = kernel_run(args, Some(comp))?;
        note(&format!(
            "kernel zswap: fill {:.0} KB/s, pass {:.0} KB/s, corrupt {}, peak pool {} B, peak cgroup+pool {} B",
            z.report.fill_kbps, z.report.pass_kbps, z.report.corrupt_pages, z.peak_zswap_pool_bytes, z.peak_memory_bytes
        ));
        note("kernel: plain swap ...");
        let (s, _) = kernel_run(args, None)?;
        note(&format!(
            "kernel swap: fill {:.0} KB/s, pass {:.0} KB/s, corrupt {}",
            s.report.fill_kbps, s.report.pass_kbps, s.report.corrupt_pages
        ));
        out["kernel_zswap_compressor"] = json!(comp);
        out["kernel_zswap_pass_kbps"] = json!(z.report.pass_kbps);
        out["kernel_swap_pass_kbps"] = json!(s.report.pass_kbps);
        out["kernel_zswap_pool_bytes"] = json!(z.peak_zswap_pool_bytes);
        out["kernel_zswap"] = serde_json::to_value(&z)?;
        out["kernel_swap"] = serde_json::to_value(&s)?;
    }
    Ok(out)
}
