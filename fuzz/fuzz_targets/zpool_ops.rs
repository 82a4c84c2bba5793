//! Allocator operation sequences against a model: every byte is a command
//! (malloc of a size drawn from the next bytes, free, write, read, compact,
//! stale use); the pool's contents must always equal the model's and its
//! invariants must hold after every step. Both allocators: the first byte
//! picks zsmalloc (bit 7 clear) or xcf (bit 7 set) and its geometry.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uzswap_zpool::xcf::{XcfConfig, XcfPool};
use uzswap_zpool::{Error, Handle, Zpool, ZsConfig, ZsPool};

fuzz_target!(|data: &[u8]| {
    let first = data.first().copied().unwrap_or(0);
    let shards = 1 + data.get(1).copied().unwrap_or(0) as usize % 2;
    let pool: Box<dyn Zpool> = if first & 0x80 == 0 {
        Box::new(
            ZsPool::new(ZsConfig {
                max_pages_per_zspage: 1 + (first as usize % 16),
                compact_watermark_percent: None,
                shards: Some(shards),
                ..ZsConfig::default()
            })
            .unwrap(),
        )
    } else {
        // Bit 6: a small limit, so malloc also takes the path that chains
        // scattered free blocks (and may fail with LimitReached).
        let limit_bytes = (first & 0x40 != 0).then_some((2 + u64::from(first % 8)) * 4096);
        Box::new(
            XcfPool::new(XcfConfig {
                shards,
                limit_bytes,
            })
            .unwrap(),
        )
    };
    let mut live: Vec<(Handle, Vec<u8>)> = Vec::new();
    let mut stale: Vec<Handle> = Vec::new();
    let mut it = data.iter().copied().skip(2);
    let mut buf = vec![0u8; 4096];
    while let Some(op) = it.next() {
        let arg = u16::from_le_bytes([it.next().unwrap_or(0), it.next().unwrap_or(0)]);
        match op % 6 {
            0 => {
                let size = 1 + arg as usize % 4096;
                let fill = op.wrapping_mul(31);
                let d: Vec<u8> = (0..size).map(|i| fill ^ i as u8).collect();
                match pool.malloc_write(&d) {
                    Ok(h) => live.push((h, d)),
                    Err(Error::LimitReached { .. }) => {}
                    Err(e) => panic!("malloc failed: {e}"),
                }
            }
            1 if !live.is_empty() => {
                let (h, d) = live.swap_remove(arg as usize % live.len());
                assert_eq!(pool.free(h).unwrap(), d.len());
                stale.push(h);
            }
            2 if !live.is_empty() => {
                let i = arg as usize % live.len();
                let d: Vec<u8> = live[i].1.iter().map(|b| b.wrapping_add(op)).collect();
                pool.write(live[i].0, &d).unwrap();
                live[i].1 = d;
            }
            3 if !live.is_empty() => {
                let (h, d) = &live[arg as usize % live.len()];
                let n = pool.read(*h, &mut buf).unwrap();
                assert_eq!(&buf[..n], &d[..]);
            }
            4 => {
                pool.compact();
            }
            5 if !stale.is_empty() => {
                let h = stale[arg as usize % stale.len()];
                if !live.iter().any(|(l, _)| *l == h) {
                    assert!(matches!(pool.read(h, &mut buf), Err(Error::StaleHandle(_))));
                }
            }
            _ => {}
        }
        pool.check_invariants().unwrap();
    }
    for (h, d) in &live {
        let n = pool.read(*h, &mut buf).unwrap();
        assert_eq!(&buf[..n], &d[..]);
    }
});
