//! The invariant check: re-derives every gauge from the index and checks
//! it against the counters, the allocator, the dedup index and the slot
//! map. For tests; it takes every lock of the cache in turn (see the lock
//! order in `mod.rs`), `wb_gate` exclusively so that no batch is half done.

use super::{shard_of, Inner, Obj, Place};
use crate::backing::SlotMap;
use crate::codec::Codec;
use std::collections::HashMap;

/// What the walk of the index counts ([`Inner::tally_index`]).
#[derive(Default)]
struct Tally {
    same: u64,
    pooled: u64,
    raw: u64,
    payload: u64,
    backed: u64,
    /// Backing entries whose slot is in a file shared since a fork.
    shared_slots: u64,
    /// The pool objects the entries name, by handle: the first entry's
    /// dedup scope, the object, and how many entries name it.
    handles: HashMap<u64, (u32, Obj, u32)>,
}

impl Inner {
    /// Returns a description of the first broken invariant.
    pub(super) fn check_invariants(&self) -> Result<(), String> {
        let _gate = self.wb_gate.write();
        let c = self.counters.snapshot();
        let slots = self.slots.lock();
        let t = self.tally_index(&slots)?;
        let want = [
            ("stored_pages", c.stored_pages, t.same + t.pooled),
            ("same_filled_pages", c.same_filled_pages, t.same),
            (
                "stored_incompressible_pages",
                c.stored_incompressible_pages,
                t.raw,
            ),
            ("stored_payload_bytes", c.stored_payload_bytes, t.payload),
            ("backing_pages", c.backing_pages, t.backed),
            (
                "backing slots used",
                slots.used(),
                t.backed - t.shared_slots,
            ),
        ];
        for (name, have, counted) in want {
            if have != counted {
                return Err(format!("{name}: counter {have}, index holds {counted}"));
            }
        }
        let saved: u64 = t
            .handles
            .values()
            .map(|(_, o, refs)| u64::from(o.size) * u64::from(refs - 1))
            .sum();
        if c.dedup_saved_bytes != saved {
            return Err(format!(
                "dedup_saved_bytes: counter {}, shared objects save {saved}",
                c.dedup_saved_bytes
            ));
        }
        self.check_objects(&t.handles)?;
        drop(slots);
        self.pool.check_invariants()
    }

    /// Walks every shard (under `slots`, which the caller holds): checks
    /// each entry's shard, mark, object size and slot, and counts them.
    fn tally_index(&self, slots: &SlotMap) -> Result<Tally, String> {
        let mut t = Tally::default();
        let mut slots_seen = std::collections::HashSet::new();
        for (i, shard) in self.shards.iter().enumerate() {
            let s = shard.lock();
            s.map.check().map_err(|e| format!("shard {i}: {e}"))?;
            for (key, e) in s.map.iter() {
                if shard_of(key) != i {
                    return Err(format!("{key:?} in shard {i}"));
                }
                if e.writeback() {
                    return Err(format!("{key:?} still marked for writeback"));
                }
                match e.place {
                    Place::Same(_) => t.same += 1,
                    Place::Pool(o) => {
                        t.pooled += 1;
                        t.payload += u64::from(o.size);
                        t.raw += u64::from(o.codec == Codec::Raw);
                        let size = self
                            .pool
                            .object_size(o.handle)
                            .map_err(|err| format!("{key:?}: {err}"))?;
                        if size != o.size as usize {
                            return Err(format!("{key:?}: object {size} B, entry says {}", o.size));
                        }
                        let r =
                            t.handles
                                .entry(o.handle.to_raw())
                                .or_insert((self.scope(key.0), o, 0));
                        r.2 += 1;
                        if r.2 > 1 && (o.dedup().is_none() || r.0 != self.scope(key.0)) {
                            return Err(format!("{key:?} shares an object outside dedup"));
                        }
                    }
                    Place::Backing { slot } => {
                        t.backed += 1;
                        // A slot below the slot map's base is in a file
                        // shared since a fork, which the map does not keep.
                        t.shared_slots += u64::from(slot < slots.base());
                        if (slot >= slots.base() && !slots.is_used(slot))
                            || !slots_seen.insert(slot)
                        {
                            return Err(format!("{key:?}: slot {slot} free or shared"));
                        }
                    }
                }
            }
        }
        Ok(t)
    }

    /// Checks the pool objects the entries name against the pool's count
    /// and the dedup index's references and registrations.
    fn check_objects(&self, handles: &HashMap<u64, (u32, Obj, u32)>) -> Result<(), String> {
        let objects = self.pool.stats().objects;
        if objects != handles.len() as u64 {
            return Err(format!(
                "pool holds {objects} objects, entries refer to {}",
                handles.len()
            ));
        }
        for (scope, o, refs) in handles.values() {
            if let Some(h) = o.dedup() {
                let have = self.dedup.refs(*scope, h, o.handle);
                if have != *refs {
                    return Err(format!(
                        "dedup refs {have} for an object {refs} entries use"
                    ));
                }
            }
        }
        let (dedup_objects, _) = self.dedup.totals();
        let registered = handles
            .values()
            .filter(|(_, o, _)| o.dedup().is_some())
            .count();
        if dedup_objects != registered as u64 {
            return Err(format!(
                "dedup index holds {dedup_objects} objects, entries register {registered}"
            ));
        }
        Ok(())
    }
}
