//! `uzswap-bench seal`: what encrypting the backing file costs. The same
//! real pages are stored, written back to a backing file in `$TMPDIR` and
//! loaded back from it (exclusive loads, every byte checked), once with
//! pages sealed by AES-256-GCM (the default) and once with the keyed
//! xxh3-128 checksum, in alternating rounds; the medians and their ratios
//! are reported.

use crate::note;
use crate::stats::{median, per_s};
use anyhow::{ensure, Context, Result};
use serde_json::{json, Value};
use std::time::Instant;
use uzswap_cache::{Backing, Cache, CacheConfig, LoadMode, PoolLimit};
use uzswap_workload::corpus::{DataKind, Pages, PAGE};

/// One round with one sealing: (writeback pages/s, load pages/s).
fn round(pages: &Pages, encrypt: bool) -> Result<(f64, f64)> {
    let cache = Cache::new(CacheConfig {
        pool_limit: PoolLimit::Unlimited,
        backing: Backing::File(std::env::temp_dir()),
        background_writer: false,
        encrypt,
        ..CacheConfig::default()
    })
    .context("making a cache with a backing file in $TMPDIR")?;
    let (written, wb) = fill_and_write_back(&cache, pages)?;
    let n = pages.count();
    let mut buf = vec![0u8; PAGE];
    let t = Instant::now();
    for i in 0..n {
        cache.load(0, i as u64, &mut buf, LoadMode::Exclusive)?;
        ensure!(buf == pages.page(i), "page {i} came back wrong");
    }
    // Rates per page that went through the file (the same-filled pages
    // among them cost next to nothing).
    let ld = per_s(written, t.elapsed());
    let st = cache.stats();
    ensure!(st.loads_backing as usize == written, "{st:?}");
    Ok((wb, ld))
}

/// Stores every page in area 0 of `cache` (opened here), then writes them
/// all back, timed: (pages written, writeback pages/s). Same-filled pages
/// never reach the tier: only what does is counted.
pub fn fill_and_write_back(cache: &Cache, pages: &Pages) -> Result<(usize, f64)> {
    cache.open_area(0)?;
    let n = pages.count();
    for i in 0..n {
        cache.store(0, i as u64, pages.page(i))?;
    }
    let t = Instant::now();
    let written = cache.writeback(n)?;
    Ok((written, per_s(written, t.elapsed())))
}

pub fn run(data: DataKind, mib: usize, rounds: usize) -> Result<Value> {
    ensure!(rounds > 0, "--rounds 0: give at least one round");
    let pages = uzswap_workload::corpus::load(data, mib * 256)?;
    note(&format!("data: {}", pages.source));
    let (mut ce, mut cl, mut ee, mut el) = (vec![], vec![], vec![], vec![]);
    for r in 0..rounds {
        let c = round(&pages, false)?;
        let e = round(&pages, true)?;
        note(&format!(
            "round {r}: checksum writeback {:.0} p/s, load {:.0} p/s; aes-256-gcm writeback {:.0} p/s, load {:.0} p/s",
            c.0, c.1, e.0, e.1
        ));
        ce.push(c.0);
        cl.push(c.1);
        ee.push(e.0);
        el.push(e.1);
    }
    let (cw, cl, ew, el) = (median(ce), median(cl), median(ee), median(el));
    let us = |a: f64, b: f64| (1e6 / a - 1e6 / b).max(0.0);
    Ok(json!({
        "data": pages.source,
        "pages": pages.count(),
        "rounds": rounds,
        "checksum": {"writeback_pages_per_s": cw, "load_pages_per_s": cl},
        "encrypt": {"writeback_pages_per_s": ew, "load_pages_per_s": el},
        "ratio_encrypt_vs_checksum": {"writeback": ew / cw, "load": el / cl},
        "encrypt_extra_us_per_page": {"writeback": us(ew, cw), "load": us(el, cl)},
    }))
}
