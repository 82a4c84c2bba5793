//! The two policies that decide when pages go to the backing tier, each
//! against the default in one run: `uzswap-bench admission` (IO-aware
//! admission, on a fast and on a slow tier) and `uzswap-bench
//! proactive` (proactive writeback on a pool the workload overflows).
//!
//! Several threads store their share of real pages and then load them back
//! (exclusive, checking every byte). The tier is a backing file in
//! `$TMPDIR`: *fast* as it is (the page cache absorbs the writes, as on a
//! VM whose disk is cached by the host), *slow* with a fixed delay added to every read and write
//! (a disk). With admission on, a page goes straight to the tier while the
//! tier is idle and into the pool while it is busy.

use crate::note;
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};
use uzswap_cache::{Backing, BackingStore, Cache, CacheConfig, FileBacking, IoLimits, LoadMode};
use uzswap_workload::corpus::{DataKind, PAGE};

pub struct Args {
    pub mib: usize,
    pub threads: usize,
    pub data: DataKind,
    pub slow_us: u64,
    pub read_limit: u32,
    pub write_limit: u32,
}

/// A tier that takes `delay` longer for every read and write.
struct Delayed {
    inner: FileBacking,
    delay: Duration,
}

impl BackingStore for Delayed {
    fn write_slots(&self, first: u64, pages: &[&[u8]]) -> io::Result<()> {
        std::thread::sleep(self.delay);
        self.inner.write_slots(first, pages)
    }
    fn read_slot(&self, slot: u64, page: &mut [u8]) -> io::Result<()> {
        std::thread::sleep(self.delay);
        self.inner.read_slot(slot, page)
    }
    fn discard(&self, first: u64, count: u64) {
        self.inner.discard(first, count)
    }
    fn describe(&self) -> String {
        format!("{} (+{:?} per IO)", self.inner.describe(), self.delay)
    }
}

/// One configuration: stores then loads from `threads` threads.
fn one(
    args: &Args,
    pages: &uzswap_workload::corpus::Pages,
    delay: Duration,
    admission: bool,
) -> Result<Value> {
    let tier = Delayed {
        inner: FileBacking::create(&std::env::temp_dir())
            .with_context(|| format!("a backing file in {}", std::env::temp_dir().display()))?,
        delay,
    };
    let cache = Arc::new(Cache::new(CacheConfig {
        backing: Backing::Store(Box::new(tier)),
        io_limits: if admission {
            IoLimits {
                read_limit: args.read_limit,
                write_limit: args.write_limit,
            }
        } else {
            IoLimits::default()
        },
        ..CacheConfig::default()
    })?);
    cache.open_area(0)?;
    let n = pages.count();
    let per = n.div_ceil(args.threads);
    let t0 = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let hs: Vec<_> = (0..args.threads)
            .map(|t| {
                let cache = &cache;
                s.spawn(move || -> Result<()> {
                    for i in t * per..((t + 1) * per).min(n) {
                        cache.store(0, i as u64, pages.page(i))?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join().expect("a store thread panicked")?;
        }
        Ok(())
    })?;
    let store_s = t0.elapsed().as_secs_f64();
    let after_store = cache.stats();
    let t0 = Instant::now();
    let corrupt = std::thread::scope(|s| -> Result<u64> {
        let hs: Vec<_> = (0..args.threads)
            .map(|t| {
                let cache = &cache;
                s.spawn(move || -> Result<u64> {
                    let mut buf = vec![0u8; PAGE];
                    let mut bad = 0;
                    for i in t * per..((t + 1) * per).min(n) {
                        cache.load(0, i as u64, &mut buf, LoadMode::Exclusive)?;
                        bad += u64::from(buf != pages.page(i));
                    }
                    Ok(bad)
                })
            })
            .collect();
        let mut bad = 0;
        for h in hs {
            bad += h.join().expect("a load thread panicked")?;
        }
        Ok(bad)
    })?;
    let load_s = t0.elapsed().as_secs_f64();
    let st = cache.stats();
    Ok(json!({
        "admission": admission,
        "tier_delay_us": delay.as_micros() as u64,
        "store_pages_per_s": n as f64 / store_s.max(1e-9),
        "load_pages_per_s": n as f64 / load_s.max(1e-9),
        "pool_bytes_after_store": after_store.pool_total_size,
        "backing_pages_after_store": after_store.backing_pages,
        "reject_io": st.reject_io,
        "stores_to_backing": st.stores_to_backing,
        "loads_backing": st.loads_backing,
        "corrupt_pages": corrupt,
    }))
}

pub fn run(args: &Args) -> Result<Value> {
    let pages = uzswap_workload::corpus::load(args.data, args.mib * 256)?;
    note(&format!("data: {}", pages.source));
    let mut rows = Vec::new();
    for (tier, delay) in [
        ("fast", Duration::ZERO),
        ("slow", Duration::from_micros(args.slow_us)),
    ] {
        for admission in [false, true] {
            note(&format!(
                "{tier} tier, admission {}: {} threads store then load {} MiB ...",
                if admission { "on" } else { "off" },
                args.threads,
                args.mib
            ));
            let mut r = one(args, &pages, delay, admission)?;
            r["tier"] = json!(tier);
            note(&format!(
                "  store {:.0} pages/s, load {:.0} pages/s, pool after store {} B, sent to the tier by admission {}",
                r["store_pages_per_s"].as_f64().unwrap_or(0.0),
                r["load_pages_per_s"].as_f64().unwrap_or(0.0),
                r["pool_bytes_after_store"],
                r["reject_io"]
            ));
            rows.push(r);
        }
    }
    let f = |i: usize, k: &str| rows[i][k].as_f64().unwrap_or(0.0);
    let ratio = |on: usize, off: usize, k: &str| f(on, k) / f(off, k).max(1e-9);
    Ok(json!({
        "benchmark": "admission",
        "data": pages.source,
        "mib": args.mib,
        "threads": args.threads,
        "read_limit": args.read_limit,
        "write_limit": args.write_limit,
        "slow_tier_delay_us": args.slow_us,
        "fast_pool_ratio_on_vs_off": ratio(1, 0, "pool_bytes_after_store"),
        "fast_store_ratio_on_vs_off": ratio(1, 0, "store_pages_per_s"),
        "fast_load_ratio_on_vs_off": ratio(1, 0, "load_pages_per_s"),
        "slow_pool_ratio_on_vs_off": ratio(3, 2, "pool_bytes_after_store"),
        "slow_store_ratio_on_vs_off": ratio(3, 2, "store_pages_per_s"),
        "slow_load_ratio_on_vs_off": ratio(3, 2, "load_pages_per_s"),
        "corrupt_pages": rows.iter().map(|r| r["corrupt_pages"].as_u64().unwrap_or(0)).sum::<u64>(),
        "runs": rows,
    }))
}

/// `uzswap-bench proactive`: proactive writeback (off by default) against
/// none, on a pool that the workload overflows. One thread stores pages in
/// bursts with pauses (a program evicting as it runs), timing every store,
/// then loads every page back exclusively, checking it. Without proactive
/// writeback the pool fills and later stores wait for a direct write to
/// the tier; with it the writer thread keeps the pool under a share of its
/// limit during the pauses.
pub fn proactive(
    pages: &uzswap_workload::corpus::Pages,
    limit_mib: usize,
    share: u8,
    burst: usize,
    pause: Duration,
) -> Result<Value> {
    let mut rows = Vec::new();
    for on in [false, true] {
        let cache = Cache::new(CacheConfig {
            pool_limit: uzswap_cache::PoolLimit::Bytes((limit_mib as u64) << 20),
            backing: Backing::File(std::env::temp_dir()),
            proactive: on.then_some(uzswap_cache::Proactive {
                max_age: None,
                max_pool_percent_of_limit: Some(share),
            }),
            ..CacheConfig::default()
        })?;
        cache.open_area(0)?;
        let n = pages.count();
        let mut lat = Vec::with_capacity(n);
        let t0 = Instant::now();
        let mut paused = Duration::ZERO;
        for i in 0..n {
            let t = Instant::now();
            cache.store(0, i as u64, pages.page(i))?;
            lat.push(t.elapsed().as_nanos() as u64);
            if (i + 1) % burst == 0 {
                std::thread::sleep(pause);
                paused += pause;
            }
        }
        let store_busy_s = (t0.elapsed() - paused).as_secs_f64();
        let after = cache.stats();
        let mut buf = vec![0u8; PAGE];
        let mut corrupt = 0u64;
        let t = Instant::now();
        for i in 0..n {
            cache.load(0, i as u64, &mut buf, LoadMode::Exclusive)?;
            corrupt += u64::from(buf != pages.page(i));
        }
        let load_s = t.elapsed().as_secs_f64();
        let st = cache.stats();
        lat.sort_unstable();
        let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
        let row = json!({
            "proactive": on,
            "store_p50_us": pct(0.5),
            "store_p99_us": pct(0.99),
            "store_p999_us": pct(0.999),
            "store_pages_per_busy_s": n as f64 / store_busy_s.max(1e-9),
            "stores_to_backing": after.stores_to_backing,
            "pool_limit_hit": after.pool_limit_hit,
            "proactive_written_back_pages": after.proactive_written_back_pages,
            "written_back_pages": after.written_back_pages,
            "load_pages_per_s": n as f64 / load_s.max(1e-9),
            "loads_backing": st.loads_backing,
            "corrupt_pages": corrupt,
        });
        note(&format!(
            "proactive {}: store p50 {:.1} us p99 {:.1} us p99.9 {:.1} us, {} stores went straight to the tier, load {:.0} pages/s ({} from the tier)",
            if on { "on " } else { "off" },
            pct(0.5),
            pct(0.99),
            pct(0.999),
            after.stores_to_backing,
            n as f64 / load_s.max(1e-9),
            st.loads_backing
        ));
        rows.push(row);
    }
    let f = |i: usize, k: &str| rows[i][k].as_f64().unwrap_or(0.0);
    Ok(json!({
        "benchmark": "proactive",
        "data": pages.source,
        "pages": pages.count(),
        "pool_limit_mib": limit_mib,
        "share_percent": share,
        "burst_pages": burst,
        "pause_ms": pause.as_secs_f64() * 1000.0,
        "store_p99_ratio_on_vs_off": f(1, "store_p99_us") / f(0, "store_p99_us").max(1e-9),
        "load_ratio_on_vs_off": f(1, "load_pages_per_s") / f(0, "load_pages_per_s").max(1e-9),
        "corrupt_pages": rows.iter().map(|r| r["corrupt_pages"].as_u64().unwrap_or(0)).sum::<u64>(),
        "runs": rows,
    }))
}
