//! `uzswap-bench remote`: the backing tiers side by side. The same real
//! pages are stored in a cache, written back to the tier in the cache's
//! batches (`Cache::writeback`, one write of adjacent slots per batch: a
//! `pwritev` for the file, one pipeline of SETs for Redis), then loaded
//! back one at a time (exclusive loads, each timed, every byte checked).
//! Tiers: the local file in `$TMPDIR`, one Redis node and a three-master
//! Redis cluster on loopback, each started here and stopped after
//! (`uzswap_remote::testing`); without `redis-server` the Redis rows are
//! left out, with a note.

use crate::bench_cache::median;
use crate::bench_seal::fill_and_write_back;
use crate::note;
use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use std::time::Instant;
use uzswap_cache::{Backing, Cache, CacheConfig, LoadMode, PoolLimit};
use uzswap_remote::testing::{Cluster, Server};
use uzswap_remote::RedisBacking;
use uzswap_workload::corpus::{DataKind, Pages, PAGE};

/// One round on one tier: (writeback pages/s, load latencies in ns).
fn round(pages: &Pages, backing: Backing) -> Result<(f64, Vec<u64>)> {
    let cache = Cache::new(CacheConfig {
        pool_limit: PoolLimit::Unlimited,
        backing,
        background_writer: false,
        ..CacheConfig::default()
    })
    .context("making a cache over the tier")?;
    let (written, wb) = fill_and_write_back(&cache, pages)?;
    let n = pages.count();
    let mut buf = vec![0u8; PAGE];
    let mut lat = Vec::with_capacity(written);
    for i in 0..n {
        let t = Instant::now();
        let how = cache.load(0, i as u64, &mut buf, LoadMode::Exclusive)?;
        let ns = t.elapsed().as_nanos() as u64;
        ensure!(buf == pages.page(i), "page {i} came back wrong");
        if how == uzswap_cache::Loaded::Backing {
            lat.push(ns);
        }
    }
    ensure!(
        lat.len() == written,
        "{} loads from the tier, {written} written",
        lat.len()
    );
    Ok((wb, lat))
}

/// Rounds on one tier: its row.
fn tier(
    name: &str,
    pages: &Pages,
    rounds: usize,
    make: &dyn Fn() -> Result<Backing>,
) -> Result<Value> {
    let (mut wbs, mut all) = (Vec::new(), Vec::new());
    for r in 0..rounds {
        let (wb, lat) = round(pages, make()?)?;
        note(&format!(
            "{name} round {r}: writeback {wb:.0} pages/s, {} loads",
            lat.len()
        ));
        wbs.push(wb);
        all.extend(lat);
    }
    all.sort_unstable();
    let pct = |p: f64| all[((all.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    let row = json!({
        "tier": name,
        "writeback_pages_per_s": median(wbs),
        "load_p50_us": pct(0.5),
        "load_p99_us": pct(0.99),
        "loads": all.len(),
    });
    note(&format!(
        "{name}: writeback {:.0} pages/s, load p50 {:.1} us p99 {:.1} us",
        row["writeback_pages_per_s"].as_f64().unwrap_or(0.0),
        pct(0.5),
        pct(0.99)
    ));
    Ok(row)
}

pub fn run(data: DataKind, mib: usize, rounds: usize) -> Result<Value> {
    ensure!(rounds > 0, "--rounds 0: give at least one round");
    let pages = uzswap_workload::corpus::load(data, mib * 256)?;
    note(&format!("data: {}", pages.source));
    let mut rows = vec![tier("file", &pages, rounds, &|| {
        Ok(Backing::File(std::env::temp_dir()))
    })?];
    let redis = |url: String| {
        move || -> Result<Backing> {
            let store = RedisBacking::connect(&url)?;
            Ok(Backing::Store(Box::new(store)))
        }
    };
    match Server::start() {
        Some(node) => rows.push(tier("redis-node", &pages, rounds, &redis(node.url()))?),
        None => note("no Redis rows: redis-server is not installed"),
    }
    if let Some(cluster) = Cluster::start() {
        rows.push(tier(
            "redis-cluster",
            &pages,
            rounds,
            &redis(cluster.url()),
        )?);
    }
    Ok(json!({
        "data": pages.source,
        "pages": pages.count(),
        "rounds": rounds,
        "tiers": rows,
    }))
}
