//! Memory really returns to the OS: the process's resident set, read from
//! /proc/self/statm, falls when a filled pool is emptied. One test in its own
//! binary, so no other test's allocations blur the figure.

use uzswap_os::rss_bytes;
use uzswap_zpool::{new_pool, AllocatorKind};

#[test]
fn emptied_pool_gives_memory_back_to_the_os() {
    if std::env::var_os("UZSWAP_SANITIZER").is_some() {
        // A sanitizer's shadow memory and quarantine move RSS on its own.
        eprintln!("skipped: RSS is not meaningful under a sanitizer");
        return;
    }
    const FILL: usize = 128 << 20;
    for kind in [AllocatorKind::Zsmalloc, AllocatorKind::Xcf] {
        let p = new_pool(kind, None, None, None).unwrap();
        let base = rss_bytes().unwrap();
        let obj: Vec<u8> = (0..2500u32).map(|i| (i * 31 % 251) as u8).collect();
        let handles: Vec<_> = (0..FILL / obj.len())
            .map(|_| p.malloc_write(&obj).unwrap())
            .collect();
        let full = rss_bytes().unwrap();
        assert!(
            full - base >= (FILL as u64) * 9 / 10,
            "{kind:?}: filling {FILL} bytes raised RSS by only {}",
            full - base
        );
        // Free all but every 64th object, then compact: most pages go back.
        for (i, h) in handles.iter().enumerate() {
            if i % 64 != 0 {
                p.free(*h).unwrap();
            }
        }
        p.compact();
        let after = rss_bytes().unwrap();
        let pool = p.pool_bytes();
        assert!(
            after < base + (FILL as u64) / 10,
            "{kind:?}: RSS {base} -> {full} -> {after} bytes (pool {pool})"
        );
        assert!(pool < (FILL as u64) / 20, "pool still holds {pool} bytes");
        p.check_invariants().unwrap();
    }
}
