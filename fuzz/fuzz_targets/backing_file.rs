//! Reading a corrupted backing file: cache operations against a model over
//! the real file tier (`FileBacking`: vectored writes, hole punching), while
//! the input damages the file behind the cache's back: flipped bits, one
//! slot's bytes copied over another (a replay), zeroed ranges, truncation
//! and growth. Every load returns the page stored, or an error (zeros in
//! the buffer) once the file was damaged; never other bytes. Invariants
//! hold throughout.
#![no_main]

mod common;

use common::Model;
use libfuzzer_sys::fuzz_target;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use uzswap_cache::{Backing, Cache, CacheConfig, FileBacking, PoolLimit, PAGE_SIZE};

const SLOTS: u64 = 24;

fuzz_target!(|data: &[u8]| {
    let tier = Arc::new(
        FileBacking::create(&std::env::temp_dir()).expect("a backing file in the temp dir"),
    );
    // A second descriptor on the same (unlinked) file, to damage it.
    let file = File::from(tier.as_fd().try_clone_to_owned().unwrap());
    let cache = Cache::new(CacheConfig {
        pool_limit: PoolLimit::Bytes(4 * 4096),
        backing: Backing::Store(Box::new(tier.clone())),
        backing_max_bytes: Some(SLOTS * PAGE_SIZE as u64),
        background_writer: false,
        writeback_batch: 4,
        encrypt: data.first().is_some_and(|b| b & 1 == 0),
        ..CacheConfig::default()
    })
    .unwrap();
    cache.open_area(0).unwrap();
    let mut model = Model::new(true);
    for ch in data.chunks(4).skip(1) {
        let at = |i: usize| *ch.get(i).unwrap_or(&0);
        let (op, a, b, c) = (at(0), at(1), at(2), at(3));
        let off = u64::from(a % 16);
        match op % 8 {
            0..=5 => model.step(&cache, op, off, b),
            _ => {
                // Damage the file where slots are (or were).
                let len = file.metadata().unwrap().len();
                let slot = u64::from(b) % SLOTS;
                let pos = slot * PAGE_SIZE as u64 + u64::from(c) * 16;
                match a % 5 {
                    0 => {
                        let mut x = [0u8];
                        if pos < len && file.read_exact_at(&mut x, pos).is_ok() {
                            x[0] ^= 1 << (c % 8);
                            file.write_all_at(&x, pos).unwrap();
                        }
                    }
                    1 => {
                        let from = u64::from(c) % SLOTS * PAGE_SIZE as u64;
                        let mut p = vec![0u8; PAGE_SIZE];
                        if file.read_exact_at(&mut p, from).is_ok() {
                            file.write_all_at(&p, slot * PAGE_SIZE as u64).unwrap();
                        }
                    }
                    2 => file.write_all_at(&[0u8; 64], pos).unwrap(),
                    3 => file
                        .set_len(slot * PAGE_SIZE as u64 + u64::from(c))
                        .unwrap(),
                    _ => file.set_len(len + u64::from(c) * 64).unwrap(),
                }
                model.damaged = true;
            }
        }
    }
    // Every page still stored loads as stored, or (once the file was
    // damaged) fails; never other bytes.
    model.check_all(&cache);
});
