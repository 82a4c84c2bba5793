//! Cache operation sequences against a model, over a tier whose slots the
//! input may corrupt: every load returns the page stored or an error (for a
//! corrupted slot), never other bytes; invariants hold throughout.
#![no_main]

mod common;

use common::Model;
use libfuzzer_sys::fuzz_target;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use uzswap_cache::{Backing, BackingStore, Cache, CacheConfig, Compressor, PoolLimit};

#[derive(Clone, Default)]
struct Mem(Arc<Mutex<HashMap<u64, Vec<u8>>>>);

impl BackingStore for Mem {
    fn write_slots(&self, first: u64, pages: &[&[u8]]) -> std::io::Result<()> {
        let mut m = self.0.lock();
        for (i, p) in pages.iter().enumerate() {
            m.insert(first + i as u64, p.to_vec());
        }
        Ok(())
    }
    fn read_slot(&self, slot: u64, page: &mut [u8]) -> std::io::Result<()> {
        let m = self.0.lock();
        let p = m.get(&slot).ok_or(std::io::ErrorKind::UnexpectedEof)?;
        page.copy_from_slice(p);
        Ok(())
    }
    fn describe(&self) -> String {
        "memory".into()
    }
}

fuzz_target!(|data: &[u8]| {
    let mem = Mem::default();
    let cache = Cache::new(CacheConfig {
        pool_limit: PoolLimit::Bytes(6 * 4096),
        backing: Backing::Store(Box::new(mem.clone())),
        background_writer: false,
        writeback_batch: 4,
        dedup: data.first().is_some_and(|b| b & 1 == 1),
        ..CacheConfig::default()
    })
    .unwrap();
    cache.open_area(0).unwrap();
    let mut model = Model::new(false);
    for ch in data.chunks(3).skip(1) {
        let (op, a, b) = (ch[0], *ch.get(1).unwrap_or(&0), *ch.get(2).unwrap_or(&0));
        let off = u64::from(a % 32);
        match op % 8 {
            6 => {
                // Corrupt a slot of the tier: a flipped bit, or another slot's bytes.
                let mut m = mem.0.lock();
                let slots: Vec<u64> = m.keys().copied().collect();
                if let Some(&s) = slots.get(usize::from(a) % slots.len().max(1)) {
                    if b & 1 == 0 {
                        m.get_mut(&s).unwrap()[usize::from(b) * 16] ^= 1 << (a % 8);
                    } else if let Some(&t) = slots.get(usize::from(b) % slots.len()) {
                        let p = m[&t].clone();
                        m.insert(s, p);
                    }
                    model.damaged = true;
                }
            }
            7 => {
                let c = [
                    Compressor::Lz4,
                    Compressor::Zstd { level: -1 },
                    Compressor::Deflate { level: 1 },
                    Compressor::Lz4Hc { level: 2 },
                ];
                cache.set_compressor(c[usize::from(b) % c.len()]).unwrap();
            }
            _ => model.step(&cache, op, off, b),
        }
    }
    model.check_all(&cache);
});
