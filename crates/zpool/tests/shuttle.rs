//! Model checking of the zsmalloc pool's locking with shuttle: small
//! configurations (two or three threads, a handful of objects, compaction
//! and the background compactor racing them), many explored schedules,
//! every byte verified and every invariant re-derived at the end.
//! Run with `cargo test -p uzswap-zpool --features shuttle --test shuttle`.
#![cfg(feature = "shuttle")]

use shuttle::sync::Arc;
use shuttle::thread;
use uzswap_zpool::{Handle, Zpool, ZsConfig, ZsPool};

fn pool() -> Arc<ZsPool> {
    Arc::new(
        ZsPool::new(ZsConfig {
            // Tiny zspages and an eager watermark, so that every few frees
            // empty a zspage or wake the compactor.
            max_pages_per_zspage: 1,
            compact_watermark_percent: Some(1),
            shards: Some(2),
            ..ZsConfig::default()
        })
        .unwrap(),
    )
}

fn bytes(tag: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| tag ^ (i as u8)).collect()
}

fn check(p: &ZsPool, h: Handle, want: &[u8]) {
    let mut buf = vec![0u8; 4096];
    let n = p.read(h, &mut buf).unwrap();
    assert_eq!(&buf[..n], want);
}

/// Two writers allocate, verify and free objects of one class while a third
/// thread compacts: no schedule may lose or mix bytes.
fn malloc_free_compact() {
    let p = pool();
    let workers: Vec<_> = (0..2u8)
        .map(|t| {
            let p = p.clone();
            thread::spawn(move || {
                // Four full zspages, then one object freed from each: the
                // class passes its watermark and the background compactor
                // moves objects while we keep reading and allocating.
                let mut mine: Vec<(Handle, Vec<u8>)> = (0..8u8)
                    .map(|i| {
                        let d = bytes(t * 16 + i, 1500);
                        (p.malloc_write(&d).unwrap(), d)
                    })
                    .collect();
                for i in [6, 4, 2, 0] {
                    let (h, d) = mine.remove(i);
                    check(&p, h, &d);
                    p.free(h).unwrap();
                }
                let d = bytes(t * 16 + 9, 1500);
                mine.push((p.malloc_write(&d).unwrap(), d));
                for (h, d) in &mine {
                    check(&p, *h, d);
                }
                mine
            })
        })
        .collect();
    let compactor = {
        let p = p.clone();
        thread::spawn(move || {
            p.compact();
        })
    };
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.join().unwrap());
    }
    compactor.join().unwrap();
    p.compact();
    for (h, d) in &all {
        check(&p, *h, d);
    }
    p.check_invariants().unwrap();
    MOVED.fetch_add(
        p.stats().objects_moved,
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// Objects moved by compaction over all explored schedules (std atomic:
/// outside the model), to show the schedules do exercise moves.
static MOVED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[test]
fn shuttle_random_schedules() {
    shuttle::check_random(malloc_free_compact, 4000);
    assert!(MOVED.load(std::sync::atomic::Ordering::Relaxed) > 0);
}

#[test]
fn shuttle_pct_schedules() {
    shuttle::check_pct(malloc_free_compact, 4000, 3);
}
