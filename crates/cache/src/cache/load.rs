//! The load path: a page read back from its word, its pool object or its
//! backing slot, in two modes.
//!
//! - `LoadMode::Keep` copies the entry's `(gen, place)` under the shard
//!   lock, reads without it, and takes the lock again to check that `gen`
//!   is unchanged; if not, the place may have been freed and reused while
//!   it was read, and the load starts over.
//! - `LoadMode::Exclusive` takes the entry out of the index first, so
//!   nothing else can free what it names: one lock round, and a pool object
//!   that no other entry shares is read and freed in one pool call. A
//!   failed read puts the entry back, unless the key was stored anew
//!   meanwhile (the newer page wins).
//!
//! A failed load zeroes the caller's page and counts the failure by where
//! it happened (`count_load`).

use super::{Inner, LoadMode, Loaded, Obj, Place, SlotSeal, RELAXED};
use crate::config::LoadError;
use crate::seal::SealId;

/// The outcome of reading a pool object: it was there and decompressed.
fn pool_read(ok: bool) -> Result<Loaded, LoadError> {
    if ok {
        Ok(Loaded::Pool)
    } else {
        Err(LoadError::Corrupt { where_: "pool" })
    }
}

/// Rebuilds a same-filled page from its word.
fn fill_word(page: &mut [u8], w: u64) {
    for c in page.chunks_exact_mut(8) {
        c.copy_from_slice(&w.to_ne_bytes());
    }
}

impl Inner {
    /// Fills `page` from the entry of `(area, offset)` (see the file's
    /// docs for the two modes).
    pub(super) fn load(
        &self,
        area: u32,
        offset: u64,
        page: &mut [u8],
        mode: LoadMode,
    ) -> Result<Loaded, LoadError> {
        let t0 = std::time::Instant::now();
        if mode == LoadMode::Exclusive {
            return self.load_exclusive(area, offset, page, t0);
        }
        let key = (area, offset);
        loop {
            let (gen, born, place) = {
                let mut s = self.shard(key).lock();
                let Some(e) = s.map.get_mut(&key) else {
                    drop(s);
                    return Err(self.miss(page));
                };
                e.mark_referenced();
                (e.gen, e.born, e.place)
            };
            let res = self.read_place(area, offset, place, page);
            // Valid only if the entry did not change while it was read.
            if self
                .shard(key)
                .lock()
                .map
                .get(&key)
                .is_none_or(|e| e.gen != gen)
            {
                continue;
            }
            if matches!(res, Ok(Loaded::Backing)) {
                self.note_backing_load(born);
            }
            return self.count_load(res, page, t0);
        }
    }

    /// An exclusive load takes the entry out first: from then on nothing
    /// else can free what it refers to, so one lock round suffices. If the
    /// read fails, the entry goes back (unless the key was stored anew
    /// meanwhile: the newer page wins).
    fn load_exclusive(
        &self,
        area: u32,
        offset: u64,
        page: &mut [u8],
        t0: std::time::Instant,
    ) -> Result<Loaded, LoadError> {
        let key = (area, offset);
        let Some(e) = self.shard(key).lock().map.remove(&key) else {
            return Err(self.miss(page));
        };
        let res = match e.place {
            // Not shared through dedup: read and free in one pool call.
            Place::Pool(obj) if obj.dedup().is_none() => {
                let res = self.take_pool(obj, page);
                if res.is_ok() {
                    self.account(&e.place, false);
                }
                res
            }
            place => {
                let res = self.read_place(area, offset, place, page);
                if res.is_ok() {
                    self.detach(area, place);
                }
                res
            }
        };
        if matches!(res, Ok(Loaded::Backing)) {
            self.note_backing_load(e.born);
        }
        if res.is_err() {
            // The entry was out of the index while it was read: if the key
            // was stored anew meanwhile, the newer page stays and this one
            // is let go. Else it goes back unmarked, so that a writeback
            // batch that had picked it sees it as no longer its victim.
            let mut s = self.shard(key).lock();
            if !s.map.contains_key(&key) {
                let mut e = e;
                e.set_writeback(false);
                s.map.insert(key, e);
            } else {
                drop(s);
                self.detach(area, e.place);
            }
        }
        self.count_load(res, page, t0)
    }

    fn miss(&self, page: &mut [u8]) -> LoadError {
        self.counters.load_misses.fetch_add(1, RELAXED);
        page.fill(0);
        LoadError::NotFound
    }

    fn read_place(
        &self,
        area: u32,
        offset: u64,
        place: Place,
        page: &mut [u8],
    ) -> Result<Loaded, LoadError> {
        match place {
            Place::Same(w) => {
                fill_word(page, w);
                Ok(Loaded::SameFilled)
            }
            Place::Pool(obj) => {
                let mut ok = false;
                let r = self.pool.map_read(obj.handle, &mut |src| {
                    ok = obj.codec.decompress(src, page).is_ok();
                });
                pool_read(r.is_ok() && ok)
            }
            Place::Backing { slot } => {
                // Without the shard lock (see the lock order in mod.rs):
                // the caller counts the read only if the entry is unchanged.
                let SlotSeal { seq, tag } = self.seals.lock().get(slot);
                self.read_backing(
                    SealId {
                        area,
                        offset,
                        slot,
                        seq,
                    },
                    &tag,
                    page,
                )
            }
        }
    }

    /// Decompresses a pool object into `page` and frees it, or leaves it
    /// (and says so) if it does not decompress.
    fn take_pool(&self, obj: Obj, page: &mut [u8]) -> Result<Loaded, LoadError> {
        let r = self.pool.map_read_free(obj.handle, &mut |src| {
            obj.codec.decompress(src, page).is_ok()
        });
        pool_read(r == Ok(true))
    }

    /// Counts a load that began at `t0` by where it was served, and its
    /// time for the pool and the backing tier.
    fn count_load(
        &self,
        res: Result<Loaded, LoadError>,
        page: &mut [u8],
        t0: std::time::Instant,
    ) -> Result<Loaded, LoadError> {
        let c = &self.counters;
        let ns = t0.elapsed().as_nanos() as u64;
        match &res {
            Ok(Loaded::Pool) => c.load_pool_ns.fetch_add(ns, RELAXED),
            Ok(Loaded::Backing) => c.load_backing_ns.fetch_add(ns, RELAXED),
            _ => 0,
        };
        match &res {
            Ok(Loaded::Pool) => &c.loads_pool,
            Ok(Loaded::Backing) => &c.loads_backing,
            Ok(Loaded::SameFilled) => &c.loads_same_filled,
            Err(e) => {
                page.fill(0);
                match e {
                    LoadError::Corrupt { where_: "pool" } => &c.decompress_fail,
                    LoadError::Corrupt { .. } => &c.backing_corrupt,
                    _ => &c.backing_read_fail,
                }
            }
        }
        .fetch_add(1, RELAXED);
        res
    }

    fn read_backing(
        &self,
        id: SealId,
        tag: &[u8; 16],
        page: &mut [u8],
    ) -> Result<Loaded, LoadError> {
        let backing = self
            .backing
            .as_ref()
            .expect("a backing entry implies a tier");
        self.inflight_reads.fetch_add(1, RELAXED);
        let r = backing.read_slot(id.slot, page);
        self.inflight_reads.fetch_sub(1, RELAXED);
        r.map_err(LoadError::Io)?;
        self.sealer
            .read()
            .open(id, page, tag)
            .map_err(|_| LoadError::Corrupt { where_: "backing" })?;
        Ok(Loaded::Backing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cache, CacheConfig, PoolLimit, PAGE_SIZE};

    /// Overwrites the pool object behind `(area, offset)` with bytes no
    /// codec accepts.
    fn damage(cache: &Cache, area: u32, offset: u64) {
        let key = (area, offset);
        let place = cache.inner.shard(key).lock().map.get(&key).map(|e| e.place);
        let Some(Place::Pool(obj)) = place else {
            panic!("({area}, {offset}) is not in the pool: {place:?}");
        };
        let junk = vec![0xff; obj.size as usize];
        cache.inner.pool.write(obj.handle, &junk).unwrap();
    }

    /// A pool object that no longer decompresses is an error on every load,
    /// exclusive ones included, and the entry survives it: it is neither
    /// freed (the allocator's invariants hold, the page still counts) nor
    /// dropped from the index, until invalidated or stored anew. With dedup
    /// on, the exclusive load takes another path (the object may be shared).
    #[test]
    fn a_damaged_pool_object_fails_loads_and_keeps_its_entry() {
        for dedup in [false, true] {
            let cache = Cache::new(CacheConfig {
                pool_limit: PoolLimit::Unlimited,
                dedup,
                ..CacheConfig::default()
            })
            .unwrap();
            cache.open_area(0).unwrap();
            let page: Vec<u8> = (0..PAGE_SIZE).map(|i| (i / 7 % 251) as u8).collect();
            cache.store(0, 1, &page).unwrap();
            cache.store(0, 2, &page).unwrap();
            damage(&cache, 0, 1);
            let mut buf = vec![1u8; PAGE_SIZE];
            for mode in [LoadMode::Exclusive, LoadMode::Keep, LoadMode::Exclusive] {
                let r = cache.load(0, 1, &mut buf, mode);
                assert!(
                    matches!(r, Err(LoadError::Corrupt { where_: "pool" })),
                    "dedup {dedup}, {mode:?}: {r:?}"
                );
                assert!(
                    buf.iter().all(|&b| b == 0),
                    "a failed load zeroes the buffer"
                );
                cache.check_invariants().unwrap();
            }
            let st = cache.stats();
            assert_eq!(st.decompress_fail, 3);
            assert_eq!(
                st.stored_pages, 2,
                "dedup {dedup}: the damaged entry still counts"
            );
            // With dedup the two offsets share the damaged object.
            if !dedup {
                cache.load(0, 2, &mut buf, LoadMode::Exclusive).unwrap();
                assert_eq!(buf, page);
            }
            cache.store(0, 1, &page).unwrap();
            cache.load(0, 1, &mut buf, LoadMode::Exclusive).unwrap();
            assert_eq!(
                buf, page,
                "a page stored anew over a damaged one reads back"
            );
            cache.check_invariants().unwrap();
        }
    }
}
