//! Test support: page generators and an in-memory backing tier that can be
//! inspected and corrupted.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use uzswap_cache::{BackingStore, PAGE_SIZE};
use uzswap_os::lock::Mutex;

/// Page kinds the generators make.
pub const KINDS: u8 = 6;

/// A deterministic page of kind `kind % KINDS` from `seed`: zero, one word,
/// text-like, half random, random, or one of 4 fixed pages (duplicates).
pub fn page(kind: u8, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let words: &[&[u8]] = &[
        b"swap ",
        b"cache ",
        b"page ",
        b"zspage ",
        b"handle ",
        b"class ",
        b"compact ",
        b"writeback ",
        b"lru ",
        b"pool ",
    ];
    let text = |rnd: &mut dyn FnMut() -> u64| {
        let mut p = Vec::with_capacity(PAGE_SIZE + 16);
        while p.len() < PAGE_SIZE {
            p.extend_from_slice(words[(rnd() % words.len() as u64) as usize]);
        }
        p.truncate(PAGE_SIZE);
        p
    };
    match kind % KINDS {
        0 => vec![0; PAGE_SIZE],
        1 => (seed | 1).to_ne_bytes().repeat(PAGE_SIZE / 8),
        2 => text(&mut rnd),
        3 => {
            let mut p = text(&mut rnd);
            for b in &mut p[..PAGE_SIZE / 2] {
                *b = rnd() as u8;
            }
            p
        }
        4 => (0..PAGE_SIZE).map(|_| rnd() as u8).collect(),
        _ => page(2, seed % 4 + 1_000_000),
    }
}

/// A backing tier in memory; slots can be read, corrupted or copied.
#[derive(Default, Clone)]
pub struct MemBacking {
    pub slots: Arc<Mutex<HashMap<u64, Vec<u8>>>>,
}

impl MemBacking {
    pub fn corrupt(&self, slot: u64) {
        if let Some(p) = self.slots.lock().get_mut(&slot) {
            p[100] ^= 0x40;
        }
    }
    pub fn copy(&self, from: u64, to: u64) {
        let mut s = self.slots.lock();
        let p = s[&from].clone();
        s.insert(to, p);
    }
    pub fn contains_bytes(&self, needle: &[u8]) -> bool {
        self.slots
            .lock()
            .values()
            .any(|p| p.windows(needle.len()).any(|w| w == needle))
    }
    pub fn written(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.slots.lock().keys().copied().collect();
        v.sort();
        v
    }
}

impl BackingStore for MemBacking {
    fn write_slots(&self, first: u64, pages: &[&[u8]]) -> io::Result<()> {
        let mut s = self.slots.lock();
        for (i, p) in pages.iter().enumerate() {
            assert_eq!(p.len(), PAGE_SIZE);
            s.insert(first + i as u64, p.to_vec());
        }
        Ok(())
    }
    fn read_slot(&self, slot: u64, page: &mut [u8]) -> io::Result<()> {
        match self.slots.lock().get(&slot) {
            Some(p) => {
                page.copy_from_slice(p);
                Ok(())
            }
            None => Err(io::Error::new(io::ErrorKind::UnexpectedEof, "no such slot")),
        }
    }
    fn describe(&self) -> String {
        "memory".into()
    }
}
