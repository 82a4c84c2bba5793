//! `uzswap bench cache`: the zswap cache on real pages, side by side with the
//! raw codec on the same pages and, with `--vs-kernel`, with the kernel's
//! own zswap storing the same pages.

use crate::corpus::DataKind;
use crate::kernel::{note, usemem_in_cgroup, KernelSwap};
use crate::usemem::Pattern;
use anyhow::Result;
use serde_json::json;

/// The kernel's zswap on the same pages: a child fills `mib` MiB of plain
/// anonymous memory with them inside a 16 MiB memory cgroup, so nearly every
/// page goes through zswap; the pool and the stored bytes are read from
/// /proc/meminfo while the child still holds its memory.
pub fn kernel_zswap(data: DataKind, mib: usize, compressor: &str) -> Result<serde_json::Value> {
    let mut ks = KernelSwap::setup((mib as u64) << 21, Some(compressor))?;
    let cg = ks.cgroup(16 << 20)?;
    let run = usemem_in_cgroup(&cg, data, mib, Pattern::Seq, 0)?;
    let compressor = ks.compressor.clone().unwrap_or_default();
    drop(ks);
    let e = run.end;
    let total = (mib as u64) << 20;
    let ratio = e.pool_bytes as f64 / e.stored_bytes.max(1) as f64;
    note(&format!(
        "kernel zswap ({compressor}): pool {} B for {} B stored ({} pages out): effective_ratio {:.3}; pool / all {} MiB {:.3}",
        e.pool_bytes,
        e.stored_bytes,
        run.zswpout,
        ratio,
        mib,
        e.pool_bytes as f64 / total as f64
    ));
    Ok(json!({
        "compressor": compressor,
        "pool_bytes": e.pool_bytes,
        "stored_bytes": e.stored_bytes,
        "zswpout": run.zswpout,
        "effective_ratio": ratio,
        "pool_over_all_pages": e.pool_bytes as f64 / total as f64,
        "fill_kbps": run.report.fill_kbps,
    }))
}
