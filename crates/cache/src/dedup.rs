//! Sharing of identical pages: a content index from page hash
//! to the pool objects holding pages with that hash, with reference counts.
//!
//! A hash only finds *candidates*: a page is treated as a duplicate of a
//! stored object only after the caller's `same` check compared the bytes.
//! The cache hashes and compares pages in encoded form (the compressed
//! object, or the raw page for a raw object, with the codec in the key):
//! equal encoded bytes under one codec decode to equal pages. So no hash
//! collision, accidental or crafted, can make a load return another page's
//! data. Tests force collisions through [`DedupIndex::with_hasher`].
//!
//! Sharing is scoped: a key is `(scope, hash)`, and the cache passes the
//! area as the scope by default (one tenant cannot learn from sharing or
//! timing whether another holds a page), or 0 for a global scope.
//!
//! # Protocol and races
//! - `find_and_ref` and `unref` take the shard lock of the key, so a lookup
//!   and the last unref of the same object are ordered: either the lookup
//!   sees the object and takes a reference before the unref (which then is
//!   not the last), or the unref removed it first and the lookup misses.
//!   The caller frees a pool object only after `unref` returned `true`,
//!   i.e. after it left the index.
//! - Two stores of identical pages racing may both miss and both insert:
//!   two objects, no sharing; correct, merely a missed saving.
//! - The `same` callback runs under the shard lock (it compares one
//!   candidate's bytes): it must not call back into the index.

use crate::index::KeyHasher;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use uzswap_os::sync::Mutex;
use uzswap_zpool::Handle;

const SHARDS: usize = 64;

/// One shared pool object.
#[derive(Debug, Clone, Copy)]
struct SharedObject {
    handle: Handle,
    /// Entries referring to the object; ≥ 1 while it is in the index.
    refs: u32,
}

type Key = (u32, u64);
/// Objects sharing one content hash: nearly always one (only a hash
/// collision makes two), kept inline.
type Objects = smallvec::SmallVec<[SharedObject; 1]>;
type Shard = Mutex<HashMap<Key, Objects, BuildHasherDefault<KeyHasher>>>;

/// Content index; see the module documentation.
pub struct DedupIndex {
    shards: Box<[Shard]>,
    hasher: fn(&[u8]) -> u64,
}

impl Default for DedupIndex {
    fn default() -> Self {
        Self::with_hasher(xxhash_rust::xxh3::xxh3_64)
    }
}

impl DedupIndex {
    /// An index using `hasher` (tests pass a constant to force collisions).
    pub fn with_hasher(hasher: fn(&[u8]) -> u64) -> DedupIndex {
        DedupIndex {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
            hasher,
        }
    }

    /// The hash of a page's bytes (the cache passes its encoded form), to
    /// pass back to the other calls.
    pub fn hash(&self, page: &[u8]) -> u64 {
        (self.hasher)(page)
    }

    fn shard(&self, key: Key) -> &Shard {
        // The hash is already uniform (or, in tests, deliberately not).
        &self.shards[(key.1 ^ u64::from(key.0)) as usize % SHARDS]
    }

    /// Finds an object in `scope` with hash `hash` for which `same` says the
    /// bytes are equal to the page being stored, takes a reference to it and
    /// returns its handle.
    pub fn find_and_ref(
        &self,
        scope: u32,
        hash: u64,
        mut same: impl FnMut(Handle) -> bool,
    ) -> Option<Handle> {
        let key = (scope, hash);
        let mut map = self.shard(key).lock();
        let list = map.get_mut(&key)?;
        let obj = list.iter_mut().find(|o| same(o.handle))?;
        obj.refs += 1;
        Some(obj.handle)
    }

    /// Registers a newly stored object with one reference.
    pub fn insert(&self, scope: u32, hash: u64, handle: Handle) {
        let key = (scope, hash);
        self.shard(key)
            .lock()
            .entry(key)
            .or_default()
            .push(SharedObject { handle, refs: 1 });
    }

    /// Drops one reference; returns `true` when it was the last one and the
    /// object left the index (the caller then frees it). Returns `false` also
    /// for an object the index does not hold (never registered).
    pub fn unref(&self, scope: u32, hash: u64, handle: Handle) -> bool {
        let key = (scope, hash);
        let mut map = self.shard(key).lock();
        let Some(list) = map.get_mut(&key) else {
            return false;
        };
        let Some(i) = list.iter().position(|o| o.handle == handle) else {
            return false;
        };
        list[i].refs -= 1;
        if list[i].refs > 0 {
            return false;
        }
        list.swap_remove(i);
        if list.is_empty() {
            map.remove(&key);
        }
        true
    }

    /// References held on `handle` (0 if not in the index).
    pub fn refs(&self, scope: u32, hash: u64, handle: Handle) -> u32 {
        let key = (scope, hash);
        self.shard(key)
            .lock()
            .get(&key)
            .and_then(|l| l.iter().find(|o| o.handle == handle))
            .map_or(0, |o| o.refs)
    }

    /// Objects in the index and the references on them (for invariants).
    pub fn totals(&self) -> (u64, u64) {
        let mut objects = 0;
        let mut refs = 0;
        for s in self.shards.iter() {
            for list in s.lock().values() {
                objects += list.len() as u64;
                refs += list.iter().map(|o| u64::from(o.refs)).sum::<u64>();
            }
        }
        (objects, refs)
    }

    /// Bytes of heap the index uses (approximate).
    pub fn metadata_bytes(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| {
                let m = s.lock();
                let slot = std::mem::size_of::<(Key, Objects)>() + 1;
                let spilled = m
                    .values()
                    .filter(|l| l.spilled())
                    .map(|l| l.capacity() * std::mem::size_of::<SharedObject>())
                    .sum::<usize>();
                (m.capacity() * slot + spilled) as u64
            })
            .sum()
    }
}

#[cfg(not(feature = "shuttle"))]
impl DedupIndex {
    /// Fork: takes every shard lock, in index order, and keeps them.
    pub(crate) fn fork_lock(&self) {
        for s in self.shards.iter() {
            std::mem::forget(s.lock());
        }
    }

    /// Releases what [`DedupIndex::fork_lock`] took.
    ///
    /// # Safety
    /// Only after `fork_lock` on this thread (or in the child of the fork
    /// that followed it).
    pub(crate) unsafe fn fork_unlock(&self, side: uzswap_os::fork::Side) {
        use uzswap_os::fork::AfterFork;
        for s in self.shards.iter() {
            // SAFETY: fork_lock took it and forgot the guard; in the child
            // this is the only thread (the caller's contract).
            unsafe { s.after_fork(side) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(n: u64) -> Handle {
        Handle::from_raw(n).unwrap()
    }

    #[test]
    fn references_count_and_last_unref_frees() {
        let d = DedupIndex::default();
        let page = [7u8; 4096];
        let x = d.hash(&page);
        assert_eq!(d.find_and_ref(1, x, |_| true), None);
        d.insert(1, x, h(10));
        assert_eq!(d.find_and_ref(1, x, |c| c == h(10)), Some(h(10)));
        assert_eq!(d.refs(1, x, h(10)), 2);
        assert!(!d.unref(1, x, h(10)));
        assert!(d.unref(1, x, h(10)));
        assert_eq!(d.totals(), (0, 0));
        assert!(!d.unref(1, x, h(10)), "an object not in the index");
    }

    #[test]
    fn colliding_hashes_share_only_equal_bytes() {
        // Every page hashes to 42: only the byte comparison tells them apart.
        let d = DedupIndex::with_hasher(|_| 42);
        let a = [1u8; 4096];
        let b = [2u8; 4096];
        let stored = [(h(1), a), (h(2), b)];
        let bytes_of = |hd: Handle| stored.iter().find(|(x, _)| *x == hd).unwrap().1;
        d.insert(0, d.hash(&a), h(1));
        // b collides with a but differs: not shared.
        assert_eq!(d.find_and_ref(0, d.hash(&b), |c| bytes_of(c) == b), None);
        d.insert(0, d.hash(&b), h(2));
        assert_eq!(
            d.find_and_ref(0, d.hash(&b), |c| bytes_of(c) == b),
            Some(h(2))
        );
        assert_eq!(
            d.find_and_ref(0, d.hash(&a), |c| bytes_of(c) == a),
            Some(h(1))
        );
        assert_eq!(d.totals(), (2, 4));
    }

    #[test]
    fn scopes_do_not_share() {
        let d = DedupIndex::default();
        d.insert(1, 5, h(1));
        assert_eq!(d.find_and_ref(2, 5, |_| true), None);
        assert_eq!(d.find_and_ref(1, 5, |_| true), Some(h(1)));
    }

    #[test]
    fn concurrent_ref_and_unref_never_free_a_referenced_object() {
        // Threads repeatedly take and drop references on one object while
        // one holds a base reference: the last unref is only ever reported
        // once, after everyone let go.
        let d = std::sync::Arc::new(DedupIndex::default());
        d.insert(0, 9, h(3));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let d = d.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        assert_eq!(d.find_and_ref(0, 9, |_| true), Some(h(3)));
                        assert!(!d.unref(0, 9, h(3)), "freed while referenced");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(d.unref(0, 9, h(3)));
    }
}
