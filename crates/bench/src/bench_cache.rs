//! `uzswap-bench cache`: the zswap cache on real pages, side by side with the
//! raw codec on the same pages and, with `--vs-kernel`, with the kernel's
//! own zswap storing the same pages.

use crate::kernel::{usemem_in_cgroup, KernelSwap};
use crate::note;
use crate::stats::{median, per_s};
use anyhow::Result;
use serde_json::json;
use uzswap_workload::corpus::DataKind;
use uzswap_workload::usemem::Pattern;

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

/// Options of `uzswap-bench cache`.
#[derive(Clone, Copy)]
pub struct Args {
    pub data: DataKind,
    pub mib: usize,
    pub compressor: uzswap_cache::Compressor,
    pub allocator: uzswap_cache::AllocatorKind,
    pub dedup: bool,
    pub vs_kernel: bool,
}

/// Pages per chunk of the interleaved timing in [`run`].
const CHUNK_PAGES: usize = 1024;

/// Timings of one operation done by the raw codec and by the cache on the
/// same chunks of pages, the two taking turns chunk by chunk (the order
/// alternating), so that the machine's drifts (frequency, a noisy
/// neighbour) hit both alike.
#[derive(Default)]
struct SideBySide {
    codec: std::time::Duration,
    cache: std::time::Duration,
    /// Per chunk: the cache's throughput over the codec's.
    ratios: Vec<f64>,
}

impl SideBySide {
    /// Times `codec(range)` and `cache(range)` on each chunk of `0..n`.
    fn run(
        n: usize,
        mut codec: impl FnMut(std::ops::Range<usize>) -> Result<()>,
        mut cache: impl FnMut(std::ops::Range<usize>) -> Result<()>,
    ) -> Result<SideBySide> {
        let mut r = SideBySide::default();
        for (k, start) in (0..n).step_by(CHUNK_PAGES).enumerate() {
            let range = start..(start + CHUNK_PAGES).min(n);
            let mut times = [std::time::Duration::ZERO; 2];
            for turn in 0..2 {
                // Even chunks: codec first; odd chunks: cache first.
                let side = turn ^ (k & 1);
                let t = std::time::Instant::now();
                if side == 0 {
                    codec(range.clone())?;
                } else {
                    cache(range.clone())?;
                }
                times[side] = t.elapsed();
            }
            r.codec += times[0];
            r.cache += times[1];
            r.ratios
                .push(times[0].as_secs_f64() / times[1].as_secs_f64().max(1e-9));
        }
        Ok(r)
    }

    /// The median of the per-chunk ratios.
    fn ratio(&self) -> f64 {
        median(self.ratios.clone())
    }
}

/// `uzswap-bench cache --allocator both`: the benchmark below once per
/// allocator, in one process on the same pages, plus the xcf/zsmalloc
/// ratios of store and load throughput.
pub fn run_allocators(
    a: &Args,
    kinds: &[uzswap_cache::AllocatorKind],
) -> Result<serde_json::Value> {
    let mut rows = Vec::new();
    for &allocator in kinds {
        rows.push(run(&Args { allocator, ..*a })?);
    }
    if let [row] = &rows[..] {
        return Ok(row.clone());
    }
    let ratios = crate::bench_pool::ratios_xcf_vs_zsmalloc(
        &rows,
        &[
            ("store", "store_pages_per_s"),
            ("load", "load_pages_per_s"),
            ("load_keep", "load_keep_pages_per_s"),
            ("effective_ratio", "effective_ratio"),
        ],
    );
    if let Some(r) = &ratios {
        note(&format!(
            "xcf / zsmalloc: store {:.3}, load {:.3}, load (keep) {:.3}, effective ratio {:.3}",
            r["store"].as_f64().unwrap_or(f64::NAN),
            r["load"].as_f64().unwrap_or(f64::NAN),
            r["load_keep"].as_f64().unwrap_or(f64::NAN),
            r["effective_ratio"].as_f64().unwrap_or(f64::NAN),
        ));
    }
    Ok(json!({
        "benchmark": "cache",
        "allocators": rows,
        "ratio_xcf_vs_zsmalloc": ratios,
    }))
}

/// `uzswap-bench cache`: stores every page into an unlimited cache, loads
/// every page back (kept, then exclusively), one thread, side by side with
/// the raw codec on the same pages.
pub fn run(a: &Args) -> Result<serde_json::Value> {
    use uzswap_cache::{Cache, CacheConfig, PoolLimit, PAGE_SIZE};
    let count = a.mib << 8;
    let pages = uzswap_workload::corpus::load(a.data, count)?;
    let comp = pages.composition();
    note(&format!(
        "{} pages of {:?} data: {comp:?}",
        pages.count(),
        a.data
    ));
    let n = pages.count();
    let cache = Cache::new(CacheConfig {
        compressor: a.compressor,
        allocator: a.allocator,
        pool_limit: PoolLimit::Unlimited,
        dedup: a.dedup,
        ..CacheConfig::default()
    })?;
    cache.open_area(0)?;
    let t = side_by_side(&cache, &pages, a.compressor)?;
    let (st, corrupt, raw_sum) = (t.st, t.corrupt, t.raw_sum);
    let pool_bytes = st.pool_total_size;
    let codec_c = per_s(n, t.store.codec);
    let codec_d = per_s(2 * n, t.load_keep.codec + t.load.codec);
    let (store_r, load_r, load_keep_r) = (t.store.ratio(), t.load.ratio(), t.load_keep.ratio());
    let (store, load, load_keep) = (
        per_s(n, t.store.cache),
        per_s(n, t.load.cache),
        per_s(n, t.load_keep.cache),
    );
    anyhow::ensure!(corrupt == 0, "{corrupt} pages came back wrong");
    let stored = st.stored_pages.max(1) as f64 * PAGE_SIZE as f64;
    // The kernel's zswap keeps no zero pages (the swap layer does): compare
    // with it on the non-zero pages.
    let nonzero = (st.stored_pages - comp.zero).max(1) as f64 * PAGE_SIZE as f64;
    let mut v = json!({
        "data": format!("{:?}", a.data).to_lowercase(),
        "compressor": a.compressor.to_string(),
        "allocator": format!("{:?}", a.allocator).to_lowercase(),
        "dedup": a.dedup,
        "composition": comp,
        "pages": n,
        "stored_pages": st.stored_pages,
        "same_filled_pages": st.same_filled_pages,
        "duplicate_pages": st.duplicate_pages,
        "dedup_saved_bytes": st.dedup_saved_bytes,
        // The duplicates' share of the payload, by bytes: what a perfect
        // dedup takes off the pool (their share by count is larger when
        // they compress better than the average page).
        "duplicate_payload_share": st.dedup_saved_bytes as f64 / st.stored_payload_bytes.max(1) as f64,
        "stored_incompressible_pages": st.stored_incompressible_pages,
        "pool_bytes": pool_bytes,
        "index_bytes": st.index_bytes,
        "payload_ratio": st.stored_payload_bytes as f64 / stored,
        "effective_ratio": pool_bytes as f64 / stored,
        "effective_ratio_nonzero": pool_bytes as f64 / nonzero,
        "codec_ratio": raw_sum as f64 / (n * PAGE_SIZE) as f64,
        "store_pages_per_s": store,
        "load_pages_per_s": load,
        "load_keep_pages_per_s": load_keep,
        "codec_compress_pages_per_s": codec_c,
        "codec_decompress_pages_per_s": codec_d,
        // Medians of the per-chunk ratios (codec and cache taking turns on
        // each chunk of CHUNK_PAGES pages): drifts of the machine cancel.
        "store_vs_codec": store_r,
        "load_vs_codec": load_r,
        "load_keep_vs_codec": load_keep_r,
        "ratio_chunk_pages": CHUNK_PAGES,
        "corrupt_pages": corrupt,
        "pool_after_loads": t.pool_after_loads,
    });
    note(&format!(
        "cache {}: store {:.0} pages/s ({:.2}x codec), load {:.0} pages/s ({:.2}x codec), effective_ratio {:.3} (non-zero pages {:.3})",
        a.compressor,
        store,
        store_r,
        load,
        load_r,
        pool_bytes as f64 / stored,
        pool_bytes as f64 / nonzero
    ));
    if a.vs_kernel {
        beside_kernel(a, pool_bytes as f64 / nonzero, &mut v)?;
    }
    Ok(v)
}

/// Adds the kernel's zswap on the same data to `v`, and the cache's
/// effective ratio on the non-zero pages (`ours`) against it.
fn beside_kernel(a: &Args, ours: f64, v: &mut serde_json::Value) -> Result<()> {
    // The kernel has no lz4 or zstd for zswap here: its default lzo is
    // the reference for them, deflate for deflate.
    let kc = match a.compressor {
        uzswap_cache::Compressor::Deflate { .. } => "deflate",
        _ => "lzo",
    };
    let k = kernel_zswap(a.data, a.mib, kc)?;
    let kr = k["effective_ratio"].as_f64().unwrap_or(f64::NAN);
    v["kernel"] = k;
    v["kernel_effective_ratio"] = json!(kr);
    v["effective_ratio_vs_kernel"] = json!(ours / kr);
    Ok(())
}

/// The cache and the raw codec `c` side by side on `pages`: stores, then
/// loads that keep the copy, an untimed check that every page comes back
/// exactly, and loads that free it.
fn side_by_side(
    cache: &uzswap_cache::Cache,
    pages: &uzswap_workload::corpus::Pages,
    c: uzswap_cache::Compressor,
) -> Result<Timed> {
    use uzswap_cache::codec::COMPRESS_BOUND;
    use uzswap_cache::{LoadMode, PAGE_SIZE};
    let n = pages.count();
    // The raw codec's output, one slot of COMPRESS_BOUND bytes per page.
    let mut out = vec![0u8; n * COMPRESS_BOUND];
    let mut sizes = vec![0usize; n];
    let store = SideBySide::run(
        n,
        |r| {
            for i in r {
                let dst = &mut out[i * COMPRESS_BOUND..(i + 1) * COMPRESS_BOUND];
                sizes[i] = c
                    .compress(pages.page(i), dst)
                    .ok_or_else(|| anyhow::anyhow!("{c} failed on page {i}"))?;
            }
            Ok(())
        },
        |r| {
            for i in r {
                cache.store(0, i as u64, pages.page(i))?;
            }
            Ok(())
        },
    )?;
    let raw_sum: u64 = sizes.iter().map(|&s| s as u64).sum();
    let st = cache.stats();
    let mut page = vec![0u8; PAGE_SIZE];
    let mut buf = vec![0u8; PAGE_SIZE];
    let mut decompress = |r: std::ops::Range<usize>| -> Result<()> {
        for i in r {
            let src = &out[i * COMPRESS_BOUND..i * COMPRESS_BOUND + sizes[i]];
            c.codec()
                .decompress(src, &mut page)
                .map_err(|_| anyhow::anyhow!("{c} did not round-trip page {i}"))?;
        }
        Ok(())
    };
    let load_keep = SideBySide::run(n, &mut decompress, |r| {
        for i in r {
            cache.load(0, i as u64, &mut buf, LoadMode::Keep)?;
        }
        Ok(())
    })?;
    // Untimed: every page comes back exactly.
    let mut corrupt = 0u64;
    for i in 0..n {
        cache.load(0, i as u64, &mut buf, LoadMode::Keep)?;
        corrupt += u64::from(buf != pages.page(i));
    }
    let load = SideBySide::run(n, &mut decompress, |r| {
        for i in r {
            cache.load(0, i as u64, &mut buf, LoadMode::Exclusive)?;
        }
        Ok(())
    })?;
    // What the allocator did behind the loads: background compactions and
    // batches of emptied pages given back to the kernel.
    let ps = cache.pool_stats();
    let pool_after_loads = json!({
        "compactions": ps.compactions,
        "objects_moved": ps.objects_moved,
        "release_batches": ps.extra("release_batches"),
        "releasing_pages": ps.extra("releasing_pages"),
        "pool_bytes": ps.pool_bytes,
    });
    Ok(Timed {
        store,
        load_keep,
        load,
        corrupt,
        raw_sum,
        st,
        pool_after_loads,
    })
}

/// What [`side_by_side`] timed and found.
struct Timed {
    store: SideBySide,
    load_keep: SideBySide,
    load: SideBySide,
    /// Pages that came back wrong.
    corrupt: u64,
    /// The raw codec's output, in bytes.
    raw_sum: u64,
    /// The cache's statistics after the stores.
    st: uzswap_cache::CacheStats,
    /// What the allocator did behind the loads.
    pool_after_loads: serde_json::Value,
}

/// `uzswap-bench dedup-cost`: what looking for duplicates costs the store
/// path on pages that have none. The chosen data with every repeated page
/// removed is stored into a fresh cache with dedup off, then into one with
/// dedup on (in turn first), `rounds` times in this process; the result is
/// the median of the per-round ratios (on / off), so drifts of the machine
/// between rounds cancel out.
pub fn dedup_cost(
    data: DataKind,
    mib: usize,
    compressor: uzswap_cache::Compressor,
    rounds: usize,
) -> Result<serde_json::Value> {
    use std::collections::HashSet;
    use uzswap_cache::{Cache, CacheConfig, PoolLimit};
    let all = uzswap_workload::corpus::load(data, mib << 8)?;
    let mut seen = HashSet::new();
    let unique: Vec<&[u8]> = (0..all.count())
        .map(|i| all.page(i))
        .filter(|p| seen.insert(*p))
        .collect();
    note(&format!(
        "{} distinct pages of {} ({:?} data: {})",
        unique.len(),
        all.count(),
        data,
        all.source
    ));
    let store_all = |dedup: bool| -> Result<(f64, u64)> {
        let cache = Cache::new(CacheConfig {
            compressor,
            pool_limit: PoolLimit::Unlimited,
            dedup,
            ..CacheConfig::default()
        })?;
        cache.open_area(0)?;
        let t = std::time::Instant::now();
        for (i, p) in unique.iter().enumerate() {
            cache.store(0, i as u64, p)?;
        }
        Ok((
            per_s(unique.len(), t.elapsed()),
            cache.stats().duplicate_pages,
        ))
    };
    let mut ratios = Vec::new();
    let mut rows = Vec::new();
    for r in 0..rounds {
        // Which goes first alternates, so that an order effect cancels.
        let ((off, _), (on, dups)) = if r % 2 == 0 {
            let off = store_all(false)?;
            (off, store_all(true)?)
        } else {
            let on = store_all(true)?;
            (store_all(false)?, on)
        };
        anyhow::ensure!(dups == 0, "{dups} duplicates found among distinct pages");
        note(&format!(
            "round {}: store {off:.0} pages/s without dedup, {on:.0} with ({:.3})",
            r + 1,
            on / off
        ));
        ratios.push(on / off);
        rows.push(json!({ "off_pages_per_s": off, "on_pages_per_s": on }));
    }
    let mid = median(ratios.clone());
    Ok(json!({
        "benchmark": "dedup-cost",
        "data": all.source,
        "distinct_pages": unique.len(),
        "compressor": compressor.to_string(),
        "rounds": rounds,
        "store_ratio_on_vs_off_median": mid,
        "store_ratio_on_vs_off": ratios,
        "runs": rows,
    }))
}
