//! Exclusive loads from several threads at once: stores the pages of a few
//! large shared libraries of the machine (machine code), then has `T`
//! threads (default 2) load them exclusively, each its own runs of 16
//! pages, checking every page. Prints the median of 9 rounds in thousands of
//! pages per second. Run it against two builds to compare them; it is a
//! measurement, not a test.
//!
//! `T=2 cargo run --release -p uzswap-cache --example exclusive_threads`

use std::sync::Arc;
use uzswap_cache::{Cache, CacheConfig, LoadMode, PoolLimit, PAGE_SIZE};

const FILES: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/libz3.so.4",
    "/usr/lib/x86_64-linux-gnu/libx265.so.199",
    "/usr/lib/x86_64-linux-gnu/libLLVM-14.so.1",
];

fn main() {
    let mut data = Vec::new();
    for f in FILES {
        if let Ok(d) = std::fs::read(f) {
            data.extend_from_slice(&d);
        }
    }
    let n = (data.len() / PAGE_SIZE).min(32768);
    assert!(n > 0, "none of {FILES:?} could be read: edit FILES");
    let data = Arc::new(data);
    let cache = Arc::new(
        Cache::new(CacheConfig {
            pool_limit: PoolLimit::Unlimited,
            ..CacheConfig::default()
        })
        .expect("cache"),
    );
    cache.open_area(0).expect("area 0");
    let threads: usize = std::env::var("T")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(2);
    let mut rates = Vec::new();
    for _ in 0..9 {
        for i in 0..n {
            cache
                .store(0, i as u64, &data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE])
                .expect("store");
        }
        let t = std::time::Instant::now();
        let workers: Vec<_> = (0..threads)
            .map(|k| {
                let (cache, data) = (cache.clone(), data.clone());
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; PAGE_SIZE];
                    for i in (0..n).filter(|i| (i / 16) % threads == k) {
                        cache
                            .load(0, i as u64, &mut buf, LoadMode::Exclusive)
                            .expect("load");
                        assert_eq!(buf, data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]);
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
        rates.push(n as f64 / t.elapsed().as_secs_f64() / 1000.0);
    }
    rates.sort_by(f64::total_cmp);
    println!(
        "{threads} threads, {n} pages: median {:.0} k pages/s (min {:.0}, max {:.0})",
        rates[4], rates[0], rates[8]
    );
}
