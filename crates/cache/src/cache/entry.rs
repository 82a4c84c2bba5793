//! Putting entries into the index and taking them out, and letting go of
//! what a removed entry held. A new page's entry goes in through
//! [`Inner::insert`] (which lets go of the entry it replaces); an entry
//! leaves through [`Inner::remove`] (every entry of an area through
//! [`Inner::remove_area`]; or through an exclusive load, load.rs); what it
//! held goes through [`Inner::detach`], which frees its pool object (once
//! no dedup sharer is left) or its backing slot. A writeback commit changes
//! an entry's place in place (writeback.rs). The gauges of `stats.rs`
//! (`stored_pages`, `backing_pages`, ...) move only through
//! [`Inner::account`].
//!
//! An entry is taken out of its shard under the shard lock, and what it
//! held is freed after the lock is dropped: once out of the index nothing
//! else can reach it, and a reader that copied its place before takes the
//! lock again, sees the entry gone or its `gen` changed, and retries.

use super::{Entry, Inner, LruItem, Obj, Place, RELAXED};
use crate::codec::Codec;

impl Inner {
    /// Counts a place into (`add`) or out of the gauges.
    pub(super) fn account(&self, place: &Place, add: bool) {
        let c = &self.counters;
        let bump = |a: &std::sync::atomic::AtomicU64, v: u64| {
            if add {
                a.fetch_add(v, RELAXED);
            } else {
                a.fetch_sub(v, RELAXED);
            }
        };
        match place {
            Place::Same(_) => {
                bump(&c.stored_pages, 1);
                bump(&c.same_filled_pages, 1);
            }
            Place::Pool(o) => {
                bump(&c.stored_pages, 1);
                bump(&c.stored_payload_bytes, u64::from(o.size));
                if o.codec == Codec::Raw {
                    bump(&c.stored_incompressible_pages, 1);
                }
            }
            Place::Backing { .. } => bump(&c.backing_pages, 1),
        }
    }

    /// Inserts an entry (replacing and releasing any old one).
    pub(super) fn insert(&self, area: u32, offset: u64, place: Place) {
        let key = (area, offset);
        let born = match place {
            Place::Backing { .. } => self.backing_clock(),
            _ => self.now(),
        };
        self.account(&place, true);
        let old = {
            let mut s = self.shard(key).lock();
            let gen = s.bump();
            if matches!(place, Place::Pool(_)) {
                s.lru.push_back(LruItem::new(key, gen));
            }
            let old = s.map.insert(key, Entry { gen, born, place });
            s.trim_lru();
            old
        };
        // The replaced entry is out of the index: its object or slot is
        // freed without the lock (see the file's docs).
        if let Some(old) = old {
            self.detach(area, old.place);
        }
    }

    /// Removes the entry of a key, if any, and frees what it held.
    pub(super) fn remove(&self, area: u32, offset: u64) -> bool {
        let key = (area, offset);
        let old = self.shard(key).lock().map.remove(&key);
        old.map(|e| self.detach(area, e.place)).is_some()
    }

    /// Removes every entry of `area` and frees what they held; returns how
    /// many there were.
    pub(super) fn remove_area(&self, area: u32) -> u64 {
        let mut n = 0;
        for shard in self.shards.iter() {
            let mut dropped = Vec::new();
            shard.lock().map.retain(|k, e| {
                if k.0 == area {
                    dropped.push(e.place);
                    false
                } else {
                    true
                }
            });
            n += dropped.len() as u64;
            // Out of the index under the lock: nothing else reaches these
            // places any more, so they are freed without it.
            for p in dropped {
                self.detach(area, p);
            }
        }
        n
    }

    /// Uncounts a removed entry's place and frees what it held.
    pub(super) fn detach(&self, area: u32, place: Place) {
        self.account(&place, false);
        match place {
            Place::Same(_) => {}
            Place::Pool(obj) => self.free_obj(area, obj),
            Place::Backing { slot } => self.free_slot(slot),
        }
    }

    /// Lets go of an entry's pool object: frees it unless dedup sharers
    /// remain (then it only stops counting as saved bytes).
    pub(super) fn free_obj(&self, area: u32, obj: Obj) {
        let last = match obj.dedup() {
            Some(h) => self.dedup.unref(self.scope(area), h, obj.handle),
            None => true,
        };
        if !last {
            self.counters
                .dedup_saved_bytes
                .fetch_sub(u64::from(obj.size), RELAXED);
        }
        if last {
            self.pool
                .free(obj.handle)
                .expect("an entry's object is live until its entry lets go");
        }
    }

    /// Frees a backing slot (lock 2, `slots`); one of a file shared since a
    /// fork is only let go of (the store closes the file after its last).
    pub(super) fn free_slot(&self, slot: u64) {
        let mut slots = self.slots.lock();
        if slot < slots.base() {
            drop(slots);
            if let Some(b) = &self.backing {
                b.release_shared(slot);
            }
            return;
        }
        let (start, len) = slots.free(slot);
        // Give the file's blocks back in batches, not one page at a time.
        // Under the lock: once it is released the extent may be handed out
        // and written, and a late hole punch would erase the new data.
        if len % 16 == 0 {
            if let Some(b) = &self.backing {
                b.discard(start, len);
            }
        }
    }
}
