//! What the cache fuzz targets share: the pages they store, and a model of
//! the cache that runs the operations both targets decode from their input
//! and checks every load against it.

use std::collections::HashMap;
use uzswap_cache::{Cache, LoadError, LoadMode, PAGE_SIZE};

/// A page from one byte of kind and one of seed: zero, one byte repeated,
/// text-like or noise-like.
pub fn page(kind: u8, seed: u8) -> Vec<u8> {
    match kind % 4 {
        0 => vec![0; PAGE_SIZE],
        1 => vec![seed; PAGE_SIZE],
        2 => (0..PAGE_SIZE).map(|i| (i / 7) as u8 ^ seed).collect(),
        _ => (0..PAGE_SIZE as u32)
            .map(|i| {
                (i.wrapping_mul(2_654_435_761)
                    .rotate_left(u32::from(seed) % 32)
                    >> 24) as u8
            })
            .collect(),
    }
}

/// The pages area 0 of a cache should hold.
pub struct Model {
    pages: HashMap<u64, Vec<u8>>,
    /// The tier was damaged: a load of a stored page may fail (with zeros
    /// in the buffer), never return other bytes.
    pub damaged: bool,
    /// Stores may be refused (a bounded tier); a refused store drops the
    /// old entry, as the cache's contract says.
    pub stores_may_fail: bool,
    buf: Vec<u8>,
}

impl Model {
    pub fn new(stores_may_fail: bool) -> Model {
        Model {
            pages: HashMap::new(),
            damaged: false,
            stores_may_fail,
            buf: vec![0u8; PAGE_SIZE],
        }
    }

    /// Runs operation `op % 8` (0..=5: store, load, invalidate, writeback;
    /// bit 3 picks an exclusive load) on key `off` with argument `b`,
    /// checking the cache's answer.
    pub fn step(&mut self, cache: &Cache, op: u8, off: u64, b: u8) {
        match op % 8 {
            0 | 1 => {
                let p = page(b, off as u8);
                match cache.store(0, off, &p) {
                    Ok(_) => {
                        self.pages.insert(off, p);
                    }
                    Err(_) if self.stores_may_fail => {
                        self.pages.remove(&off);
                    }
                    Err(e) => panic!("store refused: {e}"),
                }
            }
            2 | 3 => {
                let mode = if op & 8 == 0 {
                    LoadMode::Keep
                } else {
                    LoadMode::Exclusive
                };
                self.load(cache, off, mode);
            }
            4 => assert_eq!(
                cache.invalidate(0, off).unwrap(),
                self.pages.remove(&off).is_some()
            ),
            5 => {
                let _ = cache.writeback(usize::from(b % 8) + 1);
            }
            _ => unreachable!("the targets decode their own operations 6 and 7"),
        }
    }

    fn load(&mut self, cache: &Cache, off: u64, mode: LoadMode) {
        let buf = &mut self.buf;
        match (cache.load(0, off, buf, mode), self.pages.get(&off)) {
            (Ok(_), Some(want)) => {
                assert!(buf == want, "a load returned bytes other than stored");
                if mode == LoadMode::Exclusive {
                    self.pages.remove(&off);
                }
            }
            (Err(LoadError::NotFound), None) => {}
            (Err(LoadError::Corrupt { .. } | LoadError::Io(_)), Some(_)) if self.damaged => {
                assert!(
                    buf.iter().all(|&x| x == 0),
                    "a failed load left data in the buffer"
                );
            }
            (r, m) => panic!("{r:?} with the model holding the page: {}", m.is_some()),
        }
    }

    /// Loads every page the model holds, then checks the cache's
    /// invariants.
    pub fn check_all(&mut self, cache: &Cache) {
        let keys: Vec<u64> = self.pages.keys().copied().collect();
        for off in keys {
            self.load(cache, off, LoadMode::Keep);
        }
        cache.check_invariants().unwrap();
    }
}
