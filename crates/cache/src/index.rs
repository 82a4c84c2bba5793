//! The cache's index of one shard: `(area, offset)` → entry, kept dense.
//!
//! Pages of an area are numbered by offset, and the offsets in use come in
//! runs (a region's pages, a swap area's slots): the kernel keeps its swap
//! entries in an array by offset (an xarray) for that reason. Here a leaf
//! holds [`LEAF`] consecutive offsets of one area, and a hash map finds the
//! leaf. Against one hash map entry per page this does two things:
//! - **memory**: a stored page costs its entry in a leaf, plus a sixteenth
//!   of a map slot, instead of a map slot holding the key beside the entry
//!   with the map's spare capacity (157–230 bytes per stored page for map
//!   and queue, against the dense index's figure of `uzswap-bench cache` in
//!   docs/BENCHMARKS.md; the entry itself is 32);
//! - **locality**: loads and stores of neighbouring offsets touch the same
//!   leaf, so a sequential pass misses the CPU cache once per leaf instead
//!   of once per page (a hash spreads neighbours over the whole table).
//!
//! The price is sparse use: an offset alone in its leaf costs the whole
//! leaf (`LEAF` entries). A leaf is freed when its last entry goes.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Offsets per leaf.
pub(crate) const LEAF: usize = 16;
const LEAF_BITS: u32 = LEAF.trailing_zeros();

/// `(area, offset)`.
pub(crate) type Key = (u32, u64);

/// The hasher of the leaf map below, for `(u32, u64)` keys: multiply and
/// fold. Keys are page numbers or content hashes, not attacker-chosen
/// strings; the shard already spread them. (The dedup index uses it too:
/// SipHash cost a few percent of the store path there.)
#[derive(Default)]
pub(crate) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(u64::from(v));
    }
    fn write_u64(&mut self, v: u64) {
        let x = (self.0 ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 29);
    }
}

struct Leaf<V> {
    used: usize,
    slots: [Option<V>; LEAF],
}

/// A map from `(area, offset)` to `V`, in leaves of [`LEAF`] offsets.
pub(crate) struct DenseIndex<V> {
    leaves: HashMap<Key, Box<Leaf<V>>, BuildHasherDefault<KeyHasher>>,
    len: usize,
    /// The last leaf that emptied, kept for the next new one (a sequential
    /// pass empties and fills leaves in turn).
    spare: Option<Box<Leaf<V>>>,
}

impl<V> Default for DenseIndex<V> {
    fn default() -> Self {
        DenseIndex {
            leaves: HashMap::default(),
            len: 0,
            spare: None,
        }
    }
}

/// The leaf's key and the slot within it.
fn split(key: &Key) -> (Key, usize) {
    ((key.0, key.1 >> LEAF_BITS), (key.1 as usize) & (LEAF - 1))
}

/// The key in slot `i` of `leaf` (the inverse of [`split`]).
fn join(leaf: &Key, i: usize) -> Key {
    (leaf.0, (leaf.1 << LEAF_BITS) | i as u64)
}

/// The key of the leaf that holds `key`: what decides a key's shard, so
/// that a leaf lives in exactly one shard.
pub(crate) fn leaf_of(key: Key) -> Key {
    split(&key).0
}

impl<V> DenseIndex<V> {
    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn get(&self, key: &Key) -> Option<&V> {
        let (leaf, i) = split(key);
        self.leaves.get(&leaf)?.slots[i].as_ref()
    }

    pub(crate) fn get_mut(&mut self, key: &Key) -> Option<&mut V> {
        let (leaf, i) = split(key);
        self.leaves.get_mut(&leaf)?.slots[i].as_mut()
    }

    pub(crate) fn contains_key(&self, key: &Key) -> bool {
        self.get(key).is_some()
    }

    /// Sets the entry of `key`, returning the one it replaces.
    pub(crate) fn insert(&mut self, key: Key, v: V) -> Option<V> {
        let (leaf, i) = split(&key);
        let spare = &mut self.spare;
        let l = self.leaves.entry(leaf).or_insert_with(|| {
            spare.take().unwrap_or_else(|| {
                Box::new(Leaf {
                    used: 0,
                    slots: std::array::from_fn(|_| None),
                })
            })
        });
        let old = l.slots[i].replace(v);
        if old.is_none() {
            l.used += 1;
            self.len += 1;
        }
        old
    }

    /// Takes the entry of `key` out.
    pub(crate) fn remove(&mut self, key: &Key) -> Option<V> {
        let (leaf, i) = split(key);
        let l = self.leaves.get_mut(&leaf)?;
        let old = l.slots[i].take()?;
        l.used -= 1;
        self.len -= 1;
        if l.used == 0 {
            // Every slot is None again.
            self.spare = self.leaves.remove(&leaf);
        }
        Some(old)
    }

    /// Keeps the entries for which `f` says true.
    pub(crate) fn retain(&mut self, mut f: impl FnMut(&Key, &mut V) -> bool) {
        let mut gone = 0;
        self.leaves.retain(|leaf, l| {
            for (i, slot) in l.slots.iter_mut().enumerate() {
                if slot.as_mut().is_some_and(|v| !f(&join(leaf, i), v)) {
                    *slot = None;
                    l.used -= 1;
                    gone += 1;
                }
            }
            l.used > 0
        });
        self.spare = None;
        self.len -= gone;
    }

    /// Every entry with its key, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Key, &V)> + '_ {
        self.leaves.iter().flat_map(|(leaf, l)| {
            l.slots
                .iter()
                .enumerate()
                .filter_map(move |(i, s)| s.as_ref().map(|v| (join(leaf, i), v)))
        })
    }

    /// Heap bytes: the map's table (with its spare capacity) and the leaves.
    pub(crate) fn heap_bytes(&self) -> usize {
        let slot = std::mem::size_of::<(Key, Box<Leaf<V>>)>() + 1;
        let leaves = self.leaves.len() + usize::from(self.spare.is_some());
        self.leaves.capacity() * slot + leaves * std::mem::size_of::<Leaf<V>>()
    }

    /// Checks that the counts agree with the slots.
    pub(crate) fn check(&self) -> Result<(), String> {
        let mut n = 0;
        for (leaf, l) in &self.leaves {
            let used = l.slots.iter().filter(|s| s.is_some()).count();
            if used != l.used || used == 0 {
                return Err(format!(
                    "leaf {leaf:?}: {used} slots used, counted {}",
                    l.used
                ));
            }
            n += used;
        }
        if n != self.len {
            return Err(format!("index holds {n} entries, counted {}", self.len));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Random operations against a BTreeMap, on keys dense in places and
    /// sparse in others, across leaf edges and areas.
    #[test]
    fn behaves_like_a_map() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut idx = DenseIndex::default();
        let mut model = BTreeMap::new();
        for step in 0..20_000u64 {
            let r = next();
            let area = (r % 3) as u32;
            let offset = match (r >> 8) % 4 {
                0 => (r >> 16) % 40,            // dense, across leaf edges
                1 => (r >> 16) % 5_000,         // sparser
                2 => u64::MAX - (r >> 16) % 20, // the top of the range
                _ => (r >> 16) % (1 << 40),     // scattered
            };
            let key = (area, offset);
            match (r >> 4) % 8 {
                0..=2 => assert_eq!(idx.insert(key, step), model.insert(key, step)),
                3..=4 => assert_eq!(idx.remove(&key), model.remove(&key)),
                5 => {
                    if let Some(v) = idx.get_mut(&key) {
                        *v += 1;
                    }
                    if let Some(v) = model.get_mut(&key) {
                        *v += 1;
                    }
                }
                6 if step % 500 == 0 => {
                    let keep = |k: &Key, v: &mut u64| !(k.1 ^ *v).is_multiple_of(3);
                    idx.retain(keep);
                    model.retain(keep);
                }
                _ => assert_eq!(idx.get(&key), model.get(&key)),
            }
            assert_eq!(idx.len(), model.len());
        }
        idx.check().unwrap();
        let mut all: Vec<_> = idx.iter().map(|(k, v)| (k, *v)).collect();
        all.sort_unstable();
        let want: Vec<_> = model.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(all, want);
        // Emptied leaves are freed.
        let keys: Vec<Key> = model.keys().copied().collect();
        for k in keys {
            idx.remove(&k);
        }
        assert_eq!(idx.len(), 0);
        assert_eq!(idx.leaves.len(), 0);
    }

    #[test]
    fn dense_keys_share_leaves() {
        let mut idx = DenseIndex::default();
        for off in 0..1024u64 {
            idx.insert((7, off), [0u64; 7]);
        }
        assert_eq!(idx.leaves.len(), 1024 / LEAF);
        // 56-byte entries: the leaves cost about the entries themselves.
        let per_entry = idx.heap_bytes() as f64 / 1024.0;
        assert!(per_entry < 70.0, "{per_entry} bytes per entry");
        assert_eq!(leaf_of((7, 17)), leaf_of((7, 31)));
        assert_ne!(leaf_of((7, 15)), leaf_of((7, 16)));
    }
}
