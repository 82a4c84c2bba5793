//! `uzswap-bench remote`: the backing tiers side by side. The same real
//! pages are stored in a cache, written back to the tier in the cache's
//! batches (`Cache::writeback`, one write of adjacent slots per batch: a
//! `pwritev` for the file, one pipeline of extents for Redis), then loaded
//! back one at a time (exclusive loads, each timed, every byte checked):
//! the first half in order (where a tier's read-ahead helps), the second
//! half in a shuffled order (where it cannot: every load a round trip).
//! Tiers: the local file in `$TMPDIR`, one Redis node and a three-master
//! Redis cluster on loopback, each started here and stopped after
//! (`uzswap_remote::testing`); without `redis-server` the Redis rows are
//! left out, with a note.

use crate::bench_seal::fill_and_write_back;
use crate::note;
use crate::stats::median;
use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use std::time::Instant;
use uzswap_cache::{Backing, Cache, CacheConfig, LoadMode, PoolLimit};
use uzswap_remote::testing::{Cluster, Server};
use uzswap_remote::RedisBacking;
use uzswap_workload::corpus::{DataKind, Pages, PAGE};

/// Load latencies of one round, in ns: in order, and shuffled.
#[derive(Default)]
struct Loads {
    ordered: Vec<u64>,
    shuffled: Vec<u64>,
}

/// `0..n` in a scattered order: steps of a stride coprime with `n`, about
/// 0.38 n, so that no two loads in a row are neighbours.
fn shuffled(n: usize) -> impl Iterator<Item = usize> {
    let m = n.max(1);
    let step = (m * 38 / 100 + 1..).find(|&s| gcd(s, m) == 1).unwrap_or(1);
    (0..n).map(move |i| i * step % m)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// One round on one tier: (writeback pages/s, load latencies).
fn round(pages: &Pages, backing: Backing) -> Result<(f64, Loads)> {
    let cache = Cache::new(CacheConfig {
        pool_limit: PoolLimit::Unlimited,
        backing,
        background_writer: false,
        ..CacheConfig::default()
    })
    .context("making a cache over the tier")?;
    let (written, wb) = fill_and_write_back(&cache, pages)?;
    let n = pages.count();
    let half = n / 2;
    let mut buf = vec![0u8; PAGE];
    let mut lat = Loads::default();
    let order = (0..half).chain(shuffled(n - half).map(|i| half + i));
    for i in order {
        let t = Instant::now();
        let how = cache.load(0, i as u64, &mut buf, LoadMode::Exclusive)?;
        let ns = t.elapsed().as_nanos() as u64;
        ensure!(buf == pages.page(i), "page {i} came back wrong");
        if how == uzswap_cache::Loaded::Backing {
            if i < half {
                lat.ordered.push(ns);
            } else {
                lat.shuffled.push(ns);
            }
        }
    }
    let loaded = lat.ordered.len() + lat.shuffled.len();
    ensure!(
        loaded == written,
        "{loaded} loads from the tier, {written} written"
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
    let (mut wbs, mut all) = (Vec::new(), Loads::default());
    for r in 0..rounds {
        let (wb, lat) = round(pages, make()?)?;
        note(&format!(
            "{name} round {r}: writeback {wb:.0} pages/s, {} + {} loads",
            lat.ordered.len(),
            lat.shuffled.len()
        ));
        wbs.push(wb);
        all.ordered.extend(lat.ordered);
        all.shuffled.extend(lat.shuffled);
    }
    let pct = |v: &mut Vec<u64>, p: f64| {
        v.sort_unstable();
        v.get(((v.len().max(1) - 1) as f64 * p) as usize)
            .map_or(0.0, |&x| x as f64 / 1000.0)
    };
    let (o50, o99) = (pct(&mut all.ordered, 0.5), pct(&mut all.ordered, 0.99));
    let (s50, s99) = (pct(&mut all.shuffled, 0.5), pct(&mut all.shuffled, 0.99));
    let row = json!({
        "tier": name,
        "writeback_pages_per_s": median(wbs),
        "load_p50_us": s50,
        "load_p99_us": s99,
        "loads": all.shuffled.len(),
        "ordered_load_p50_us": o50,
        "ordered_load_p99_us": o99,
        "ordered_loads": all.ordered.len(),
    });
    note(&format!(
        "{name}: writeback {:.0} pages/s; loads shuffled p50 {s50:.1} us p99 {s99:.1} us, in order p50 {o50:.1} us p99 {o99:.1} us",
        row["writeback_pages_per_s"].as_f64().unwrap_or(0.0),
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_shuffle_is_a_permutation_without_neighbours_in_a_row() {
        for n in [0, 1, 2, 7, 100, 13926] {
            let v: Vec<usize> = super::shuffled(n).collect();
            let mut sorted = v.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n = {n}");
            if n > 4 {
                assert!(v.windows(2).all(|w| w[0].abs_diff(w[1]) > 1), "n = {n}");
            }
        }
    }
}
