//! `uzswap-bench pool`: the allocator under real compressed pages.
//!
//! 1. Fill: the lz4-compressed 4 KiB pages of real files (a page that does
//!    not compress below 4096 bytes is stored raw, as zswap does) are stored
//!    with `malloc_write`; overhead = pool bytes / payload bytes − 1.
//! 2. Churn: for j = 2..=10, refill to the original object
//!    count, free a random (1 − 1/j) share, measure the overhead, compact,
//!    measure again. The worst step is reported.
//! 3. Throughput: malloc+free pairs on a working set of 32 Ki objects with
//!    the same size distribution, on one thread and on two.
//! 4. With `--vs-kernel`, the same pages written to a fresh zram device
//!    with lz4: the kernel's zsmalloc overhead from mm_stat, side by side.
//!
//! Store is the fill (`malloc_write` of every object), load a `read` of
//! every object afterwards in a seeded random order (the median pass of at
//! least 7 and at least 0.5 s). With `--allocator both` every step runs for xcf
//! and then zsmalloc on the same compressed objects, and the result holds
//! one row per allocator plus xcf/zsmalloc ratios: the zsmalloc table (pages
//! stored, pages the pool uses, descriptors, effective compression) with
//! `--data zero` or `--data text75`.

use crate::kernel::ZramDevice;
use crate::note;
use anyhow::{Context, Result};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;
use uzswap_workload::corpus::{self, DataKind, PAGE};
use uzswap_zpool::{new_pool, AllocatorKind, Handle, Zpool, ZsConfig, ZsPool};

pub struct Args {
    pub data: DataKind,
    pub mib: usize,
    /// One allocator, or several measured in turn on the same objects.
    pub allocators: Vec<AllocatorKind>,
    pub vs_kernel: bool,
    pub pair_seconds: f64,
    /// zsmalloc only: largest zspage in pages.
    pub max_pages: usize,
    /// MiB of distinct pages, repeated up to `mib` (None: all distinct).
    pub distinct_mib: Option<usize>,
}

fn make_pool(args: &Args, kind: AllocatorKind) -> Result<Arc<dyn Zpool>> {
    Ok(match kind {
        AllocatorKind::Zsmalloc => Arc::new(ZsPool::new(ZsConfig {
            max_pages_per_zspage: args.max_pages,
            ..ZsConfig::default()
        })?),
        kind => new_pool(kind, None, None, None)?,
    })
}

/// Compresses every page with lz4; pages that do not shrink stay raw.
pub fn compress_all(pages: &corpus::Pages) -> Vec<Vec<u8>> {
    let mut out = vec![0u8; lz4_flex::block::get_maximum_output_size(PAGE)];
    (0..pages.count())
        .map(|i| {
            let page = pages.page(i);
            let n = lz4_flex::block::compress_into(page, &mut out).expect("buffer is large enough");
            if n >= PAGE {
                page.to_vec()
            } else {
                out[..n].to_vec()
            }
        })
        .collect()
}

pub fn run(args: &Args) -> Result<serde_json::Value> {
    let count = args.mib * 256;
    note(&format!(
        "loading {} MiB of {:?} pages ...",
        args.mib, args.data
    ));
    let distinct = args.distinct_mib.map_or(count, |d| d * 256);
    let pages = corpus::load(args.data, distinct)?.cycled(count);
    note(&format!("data: {}", pages.source));
    let objs = compress_all(&pages);
    let payload: u64 = objs.iter().map(|o| o.len() as u64).sum();
    let mut rows = Vec::new();
    for &kind in &args.allocators {
        rows.push(run_one(args, kind, &objs)?);
    }
    let common = json!({
        "benchmark": "pool",
        "data": format!("{:?}", args.data).to_lowercase(),
        "data_source": pages.source,
        "data_composition": pages.composition(),
        "mib": args.mib,
        "objects": count,
        "distinct_pages": distinct,
        "payload_bytes": payload,
        "max_pages_per_zspage": args.max_pages,
    });
    let mut out = if let [row] = &rows[..] {
        // One allocator: its figures at the top level, as before.
        let mut out = row.clone();
        merge(&mut out, &common);
        out
    } else {
        let mut out = common;
        if let Some(r) = ratios_xcf_vs_zsmalloc(
            &rows,
            &[
                ("store", "store_mops"),
                ("load", "load_mops"),
                ("malloc_free_pairs_1t", "malloc_free_pairs_per_s_1t"),
                ("malloc_free_pairs_2t", "malloc_free_pairs_per_s_2t"),
                (
                    "malloc_write_free_pairs_1t",
                    "malloc_write_free_pairs_per_s_1t",
                ),
                (
                    "malloc_write_free_pairs_2t",
                    "malloc_write_free_pairs_per_s_2t",
                ),
                ("effective_compression", "effective_compression"),
            ],
        ) {
            out["ratio_xcf_vs_zsmalloc"] = r;
        }
        note(&table(&rows));
        out["allocators"] = json!(rows);
        out
    };
    if args.vs_kernel {
        out["kernel_zram"] = kernel_reference(&pages, payload)?;
    }
    Ok(out)
}

/// `{name: xcf[key] / zsmalloc[key]}` for each `(name, key)`, from rows
/// that carry an `"allocator"`; None unless both allocators have a row.
pub fn ratios_xcf_vs_zsmalloc(
    rows: &[serde_json::Value],
    keys: &[(&str, &str)],
) -> Option<serde_json::Value> {
    let by = |name: &str| rows.iter().find(|r| r["allocator"] == name);
    let (x, z) = (by("xcf")?, by("zsmalloc")?);
    let f = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap_or(f64::NAN);
    Some(
        keys.iter()
            .map(|&(name, k)| (name.to_string(), json!(f(x, k) / f(z, k))))
            .collect::<serde_json::Map<_, _>>()
            .into(),
    )
}

fn merge(into: &mut serde_json::Value, from: &serde_json::Value) {
    if let (Some(a), Some(b)) = (into.as_object_mut(), from.as_object()) {
        for (k, v) in b {
            a.insert(k.clone(), v.clone());
        }
    }
}

/// Seed 003's table, one line per allocator.
fn table(rows: &[serde_json::Value]) -> String {
    let mut t = format!(
        "{:<9} {:>12} {:>10} {:>11} {:>9} {:>10} {:>13} {:>9} {:>9}\n",
        "allocator",
        "pages_stored",
        "pool_pages",
        "descriptors",
        "eff_compr",
        "fill_ovh",
        "compacted_ovh",
        "store_M/s",
        "load_M/s"
    );
    for r in rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        t += &format!(
            "{:<9} {:>12} {:>10} {:>11} {:>8.2}% {:>9.2}% {:>12.2}% {:>9.3} {:>9.3}\n",
            r["allocator"].as_str().unwrap_or("?"),
            r["pages_stored"].as_u64().unwrap_or(0),
            r["pool_pages"].as_u64().unwrap_or(0),
            r.get("descriptors").map_or("-".into(), |d| d.to_string()),
            f("effective_compression") * 100.0,
            f("overhead_fill_pct"),
            f("overhead_compacted_pct"),
            f("store_mops"),
            f("load_mops"),
        );
    }
    t
}

/// The load phase reads every object once per pass, for at least this many
/// passes and this long (a pass over a small pool takes milliseconds).
const LOAD_PASSES: usize = 7;
const LOAD_SECONDS: f64 = 0.5;

/// Fill, load, churn and pairs for one allocator on the given objects.
fn run_one(args: &Args, kind: AllocatorKind, objs: &[Vec<u8>]) -> Result<serde_json::Value> {
    let count = objs.len();
    let payload: u64 = objs.iter().map(|o| o.len() as u64).sum();
    let pool = make_pool(args, kind)?;
    note(&format!("allocator {}", pool.name()));

    // 1. Fill.
    let t = Instant::now();
    let mut live: Vec<(Handle, usize)> = Vec::with_capacity(count);
    for (i, o) in objs.iter().enumerate() {
        live.push((pool.malloc_write(o)?, i));
    }
    let fill_s = t.elapsed().as_secs_f64();
    let st = pool.stats();
    let fill_overhead = st.overhead();
    note(&st.table());
    note(&format!(
        "fill: {} objects, payload {} B, pool {} B, overhead {:.2} %, {:.0} malloc_write/s",
        count,
        payload,
        st.pool_bytes,
        fill_overhead * 100.0,
        count as f64 / fill_s
    ));
    let pages_stored = count as u64;
    let pool_pages = st.pages_held;
    let descriptors = st.extra("descriptors");

    let load_s = load_passes(pool.as_ref(), &live)?;
    note(&format!(
        "load: {:.0} reads/s; pool pages {pool_pages} for {pages_stored} pages stored: effective compression {:.2} %",
        count as f64 / load_s,
        pool_pages as f64 / pages_stored as f64 * 100.0
    ));

    // 2. Churn.
    let Churn {
        worst_before,
        worst_after,
        steps,
        freed,
        free_s,
    } = churn(pool.as_ref(), objs, live)?;

    // 3. Pairs.
    let sizes: Vec<usize> = objs.iter().map(Vec::len).collect();
    let one = pairs_per_s(args, kind, &sizes, 1, false)?;
    let two = pairs_per_s(args, kind, &sizes, 2, false)?;
    note(&format!(
        "malloc+free pairs/s: 1 thread {one:.0}, 2 threads {two:.0} ({:.2}x)",
        two / one
    ));
    let one_w = pairs_per_s(args, kind, &sizes, 1, true)?;
    let two_w = pairs_per_s(args, kind, &sizes, 2, true)?;
    note(&format!(
        "malloc_write+free pairs/s (object bytes copied in, wiped on free): 1 thread {one_w:.0}, 2 threads {two_w:.0} ({:.2}x)",
        two_w / one_w
    ));

    let mut row = json!({
        "allocator": pool.name(),
        "pages_stored": pages_stored,
        "pool_pages": pool_pages,
        "effective_compression": pool_pages as f64 / pages_stored as f64,
        "pool_bytes": st.pool_bytes,
        "metadata_bytes": st.metadata_bytes,
        "overhead": fill_overhead,
        "overhead_fill_pct": fill_overhead * 100.0,
        "overhead_compacted_pct": worst_after * 100.0,
        "churn_overhead_before_compact": worst_before,
        "churn_overhead_after_compact": worst_after,
        "churn_steps": steps,
        "store_mops": count as f64 / fill_s / 1e6,
        "load_mops": count as f64 / load_s / 1e6,
        "malloc_per_s": count as f64 / fill_s,
        "free_per_s": freed as f64 / free_s,
        "malloc_free_pairs_per_s_1t": one,
        "malloc_free_pairs_per_s_2t": two,
        "scaling_2t": two / one,
        "malloc_write_free_pairs_per_s_1t": one_w,
        "malloc_write_free_pairs_per_s_2t": two_w,
        "scaling_write_2t": two_w / one_w,
    });
    if let Some(d) = descriptors {
        row["descriptors"] = json!(d);
        row["blocks_per_object"] = json!(st
            .extra("blocks")
            .map_or(f64::NAN, |b| b as f64 / count as f64));
    }
    Ok(row)
}

/// The load phase: every object read once a pass, in an order fixed by a
/// seed (the same for every allocator), as a cache's loads come; returns
/// the median pass's seconds.
fn load_passes(pool: &dyn Zpool, live: &[(Handle, usize)]) -> Result<f64> {
    let count = live.len();
    let mut order: Vec<usize> = (0..count).collect();
    order.shuffle(&mut rand::rngs::SmallRng::seed_from_u64(3));
    let mut buf = vec![0u8; PAGE];
    let mut passes = Vec::with_capacity(LOAD_PASSES);
    let t_all = Instant::now();
    while passes.len() < LOAD_PASSES || t_all.elapsed().as_secs_f64() < LOAD_SECONDS {
        let t = Instant::now();
        for &i in &order {
            pool.read(live[i].0, &mut buf)?;
        }
        passes.push(t.elapsed().as_secs_f64());
    }
    Ok(crate::stats::median(passes))
}

/// What [`churn`] measured.
struct Churn {
    /// The worst overhead before and after a compaction.
    worst_before: f64,
    worst_after: f64,
    /// Each step's figures.
    steps: Vec<serde_json::Value>,
    /// Objects freed, and the seconds the frees took.
    freed: u64,
    free_s: f64,
}

/// The churn: for j = 2..=10, refill to the original object count, free a
/// random (1 − 1/j) share, compact; every survivor verified at the end,
/// then freed.
fn churn(pool: &dyn Zpool, objs: &[Vec<u8>], mut live: Vec<(Handle, usize)>) -> Result<Churn> {
    let count = objs.len();
    let mut buf = vec![0u8; PAGE];
    let mut r = rand::rngs::SmallRng::seed_from_u64(42);
    let mut worst_before: f64 = 0.0;
    let mut worst_after: f64 = 0.0;
    let mut steps = Vec::new();
    let (mut freed, mut free_s) = (0u64, 0f64);
    let mut next = 0usize;
    for j in 2..=10usize {
        while live.len() < count {
            let i = next % count;
            next += 1;
            live.push((pool.malloc_write(&objs[i])?, i));
        }
        live.shuffle(&mut r);
        let keep = live.len() / j;
        let t = Instant::now();
        for (h, _) in live.drain(keep..) {
            pool.free(h)?;
            freed += 1;
        }
        free_s += t.elapsed().as_secs_f64();
        let before = pool.stats().overhead();
        let t = Instant::now();
        let rep = pool.compact();
        let compact_s = t.elapsed().as_secs_f64();
        let after = pool.stats().overhead();
        note(&format!(
            "churn 1/{j}: kept {keep}, overhead {:.2} % -> compact (moved {}, freed {} pages, {:.1} ms) -> {:.2} %",
            before * 100.0,
            rep.objects_moved,
            rep.pages_freed,
            compact_s * 1e3,
            after * 100.0
        ));
        worst_before = worst_before.max(before);
        worst_after = worst_after.max(after);
        steps.push(json!({"keep_fraction": format!("1/{j}"), "overhead_before_compact": before,
            "overhead_after_compact": after, "objects_moved": rep.objects_moved, "pages_freed": rep.pages_freed}));
    }
    // Verify every survivor before letting go.
    for &(h, i) in &live {
        let n = pool.read(h, &mut buf)?;
        anyhow::ensure!(buf[..n] == objs[i][..], "object {i} changed in the pool");
    }
    for (h, _) in live.drain(..) {
        pool.free(h)?;
    }
    Ok(Churn {
        worst_before,
        worst_after,
        steps,
        freed,
        free_s,
    })
}

/// malloc+free pairs per second over a working set, on `threads` threads.
/// With `write`, each new object is also filled with bytes (as a store
/// does), which costs the copy, the wipe on free and page faults.
fn pairs_per_s(
    args: &Args,
    kind: AllocatorKind,
    sizes: &[usize],
    threads: usize,
    write: bool,
) -> Result<f64> {
    const WORKING_SET: usize = 32 << 10;
    let seconds = args.pair_seconds;
    let pool = make_pool(args, kind)?;
    let sizes = Arc::new(sizes.to_vec());
    let start = Arc::new(std::sync::Barrier::new(threads));
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (pool, sizes, start) = (pool.clone(), sizes.clone(), start.clone());
            std::thread::spawn(move || -> Result<(u64, f64)> {
                let mut r = rand::rngs::SmallRng::seed_from_u64(t as u64);
                let data = vec![0x5au8; PAGE];
                let alloc = |size: usize| {
                    if write {
                        pool.malloc_write(&data[..size])
                    } else {
                        pool.malloc(size)
                    }
                };
                let mut set: Vec<Handle> = (0..WORKING_SET)
                    .map(|_| alloc(sizes[r.gen_range(0..sizes.len())]))
                    .collect::<Result<_, _>>()?;
                // Pre-drawn random numbers keep the RNG out of the timing.
                let picks: Vec<(usize, usize)> = (0..1 << 16)
                    .map(|_| {
                        (
                            r.gen_range(0..WORKING_SET),
                            sizes[r.gen_range(0..sizes.len())],
                        )
                    })
                    .collect();
                start.wait();
                let t0 = Instant::now();
                let mut n = 0u64;
                for batch in picks.chunks(4096).cycle() {
                    for &(slot, size) in batch {
                        pool.free(set[slot])?;
                        set[slot] = alloc(size)?;
                    }
                    n += batch.len() as u64;
                    if t0.elapsed().as_secs_f64() >= seconds {
                        break;
                    }
                }
                Ok((n, t0.elapsed().as_secs_f64()))
            })
        })
        .collect();
    let mut total = 0f64;
    for w in workers {
        let (n, s) = w.join().expect("bench thread panicked")?;
        total += n as f64 / s;
    }
    Ok(total)
}

/// The kernel's zsmalloc on the same pages, through a fresh zram device.
fn kernel_reference(pages: &corpus::Pages, payload: u64) -> Result<serde_json::Value> {
    let dev = ZramDevice::create("lz4", (pages.bytes.len() as u64) * 2)
        .context("the kernel reference needs root and the zram module")?;
    dev.write_pages(&pages.bytes)?;
    let s = dev.mm_stat()?;
    dev.compact()?;
    let c = dev.mm_stat()?;
    let overhead = s.mem_used_total as f64 / s.compr_data_size.max(1) as f64 - 1.0;
    note(&format!(
        "kernel zram (lz4): compr_data_size {} B, mem_used_total {} B, overhead {:.2} % (our payload {} B)",
        s.compr_data_size,
        s.mem_used_total,
        overhead * 100.0,
        payload
    ));
    Ok(json!({
        "device": format!("zram{}", dev.id),
        "mm_stat": s,
        "overhead": overhead,
        "mm_stat_after_compact": c,
    }))
}
