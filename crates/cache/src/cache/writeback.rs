//! Writeback: moving the least recently used pool entries to the backing
//! tier, one batch at a time.
//!
//! A batch marks its victims `writeback` under their shard locks (loads
//! keep reading them from the pool meanwhile), then, with no shard lock
//! held, decompresses and seals them into adjacent slots and writes each
//! run of adjacent slots with one vectored write. Then it commits each
//! victim whose entry still has the same `gen` (and its mark): the entry
//! moves to its slot and the pool object is freed. A victim invalidated or
//! replaced meanwhile has its slot freed instead. A failed write leaves the
//! victims in the pool, back in the LRU queue.
//!
//! A batch holds `wb_gate` shared from start to end, so that the invariant
//! check (which takes it exclusively) never sees a marked entry.

use super::{Inner, LruItem, Obj, Place, RELAXED, SHARDS};
use crate::backing::BackingStore;
use crate::index::Key;
use crate::seal::SealId;
use crate::PAGE_SIZE;

/// A victim of a writeback batch.
struct Victim {
    key: Key,
    /// The entry's gen when picked (checked again at commit).
    gen: u32,
    /// Its pool object, read without the shard lock.
    obj: Obj,
    /// Slot, sequence number and tag once sealed.
    sealed: Option<(u64, u64, [u8; 16])>,
}

impl Inner {
    /// Picks up to `max` victims from the LRU queues (second chance), or
    /// only entries older than `min_age` seconds.
    ///
    /// As with one global list: first every entry not used since it was
    /// queued, from the front of each shard's queue (`per_shard` at a time,
    /// so a batch spreads over shards), while used ones lose their mark and
    /// go to the back; only when no shard has such an entry left, the ones
    /// passed over. (Neighbouring offsets share a shard, so taking a shard's
    /// quota of passed-over entries before other shards ran out of unused
    /// ones would write back the hot half of a working set.)
    fn pick_victims(&self, max: usize, min_age: Option<u32>) -> Vec<Victim> {
        let mut victims = Vec::with_capacity(max);
        let per_shard = max.div_ceil(8).max(1);
        let start = self.cursor.fetch_add(1, RELAXED);
        let now = self.now();
        // Per shard, entries sent to the back of its queue by this pick.
        let mut passed = vec![0usize; SHARDS];
        for second_round in [false, true] {
            loop {
                let before = victims.len();
                for i in 0..SHARDS {
                    if victims.len() >= max {
                        break;
                    }
                    let idx = (start + i) % SHARDS;
                    let mut s = self.shards[idx].lock();
                    // The first round looks only at what it has not passed
                    // over (the front of the queue).
                    let mut budget = if second_round {
                        s.lru.len()
                    } else {
                        s.lru.len().saturating_sub(passed[idx])
                    };
                    let mut taken = 0;
                    while taken < per_shard && victims.len() < max && budget > 0 {
                        budget -= 1;
                        let Some(it) = s.lru.pop_front() else { break };
                        let Some(e) = s.map.get_mut(&it.key()) else {
                            continue;
                        };
                        let Place::Pool(obj) = &mut e.place else {
                            continue;
                        };
                        if e.gen != it.gen || obj.writeback {
                            continue;
                        }
                        if let Some(age) = min_age {
                            if now.saturating_sub(e.born) < age {
                                s.lru.push_front(it);
                                break;
                            }
                        }
                        if obj.referenced {
                            obj.referenced = false;
                            s.lru.push_back(it);
                            passed[idx] += 1;
                            self.counters.writeback_second_chance.fetch_add(1, RELAXED);
                            continue;
                        }
                        obj.writeback = true;
                        taken += 1;
                        victims.push(Victim {
                            key: it.key(),
                            gen: it.gen,
                            obj: *obj,
                            sealed: None,
                        });
                    }
                }
                if victims.len() == before || victims.len() >= max {
                    break;
                }
            }
        }
        victims
    }

    /// One writeback batch; returns the pages written back. In steps:
    /// pick the victims, decompress them, give them slots and seal them,
    /// write each run of adjacent slots, record the seals, commit.
    pub(super) fn writeback_batch(&self, max: usize, min_age: Option<u32>) -> usize {
        let Some(backing) = self.backing.as_ref() else {
            return 0;
        };
        let _gate = self.wb_gate.read();
        let mut victims = self.pick_victims(max, min_age);
        if victims.is_empty() {
            return 0;
        }
        let (mut buf, readable) = self.decompress_victims(&victims);
        self.seal_victims(&mut victims, &readable, &mut buf);
        let written = self.write_runs(&**backing, &victims, &buf);
        self.record_seals(&victims, &written);
        let (done, failed) = self.commit(&victims, &written);
        let c = &self.counters;
        c.writeback_batches.fetch_add(1, RELAXED);
        c.written_back_pages.fetch_add(done as u64, RELAXED);
        if failed {
            c.writeback_fail.fetch_add(1, RELAXED);
        }
        done
    }

    /// Decompresses each victim into its page of a batch buffer; returns
    /// the buffer and which victims could be read.
    fn decompress_victims(&self, victims: &[Victim]) -> (Vec<u8>, Vec<bool>) {
        let mut buf = vec![0u8; victims.len() * PAGE_SIZE];
        let mut readable = vec![false; victims.len()];
        for (i, v) in victims.iter().enumerate() {
            let page = &mut buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
            let mut ok = false;
            // A stale handle means the entry was dropped meanwhile; the
            // commit sees that and skips it.
            let _ = self.pool.map_read(v.obj.handle, &mut |src| {
                ok = v.obj.codec.decompress(src, page).is_ok();
            });
            readable[i] = ok;
        }
        (buf, readable)
    }

    /// Allocates slots for the readable victims (fewer where the tier is
    /// full), assigns them in order and seals each victim's page in `buf`.
    fn seal_victims(&self, victims: &mut [Victim], readable: &[bool], buf: &mut [u8]) {
        let wanted = readable.iter().filter(|&&r| r).count() as u64;
        let runs = self.slots.lock().alloc(wanted);
        let mut slot_iter = runs.iter().flat_map(|&(s, n)| s..s + n);
        for (i, v) in victims.iter_mut().enumerate() {
            if !readable[i] {
                continue;
            }
            let Some(slot) = slot_iter.next() else { break };
            let seq = self.seq.fetch_add(1, RELAXED);
            let id = SealId {
                area: v.key.0,
                offset: v.key.1,
                slot,
                seq,
            };
            let tag = self
                .sealer
                .read()
                .seal(id, &mut buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE]);
            v.sealed = Some((slot, seq, tag));
        }
    }

    /// Writes each run of adjacent sealed slots with one vectored write;
    /// returns which victims were written.
    fn write_runs(&self, backing: &dyn BackingStore, victims: &[Victim], buf: &[u8]) -> Vec<bool> {
        let mut written = vec![false; victims.len()];
        let mut i = 0;
        while i < victims.len() {
            let Some((first, _, _)) = victims[i].sealed else {
                i += 1;
                continue;
            };
            let mut j = i + 1;
            while j < victims.len()
                && victims[j]
                    .sealed
                    .is_some_and(|(s, _, _)| s == first + (j - i) as u64)
            {
                j += 1;
            }
            let pages: Vec<&[u8]> = (i..j)
                .map(|k| &buf[k * PAGE_SIZE..(k + 1) * PAGE_SIZE])
                .collect();
            self.inflight_writes.fetch_add((j - i) as u32, RELAXED);
            let ok = backing.write_slots(first, &pages).is_ok();
            self.inflight_writes.fetch_sub((j - i) as u32, RELAXED);
            self.counters.backing_writes.fetch_add(1, RELAXED);
            written[i..j].iter_mut().for_each(|w| *w = ok);
            i = j;
        }
        written
    }

    /// Records the seals of the written slots, before any entry names its
    /// slot (a load that finds the entry reads the seal).
    fn record_seals(&self, victims: &[Victim], written: &[bool]) {
        let mut seals = self.seals.lock();
        for (v, _) in victims.iter().zip(written).filter(|(_, &ok)| ok) {
            if let Some((slot, seq, tag)) = v.sealed {
                seals.set(slot, seq, tag);
            }
        }
    }

    /// Commits the batch: each victim still ours moves to its slot if it
    /// was written, or back to the pool's LRU; the slots of the others are
    /// freed. Returns the pages moved and whether a write failed.
    ///
    /// No shard lock was held since the pick: under the lock again, a
    /// victim is still ours only if its entry has the gen it was picked
    /// with and its mark (a store or invalidation meanwhile replaced or
    /// removed the entry, and let go of the object itself).
    fn commit(&self, victims: &[Victim], written: &[bool]) -> (usize, bool) {
        let mut done = 0;
        let mut failed = false;
        for (v, ok) in victims.iter().zip(written) {
            let mut s = self.shard(v.key).lock();
            let ours = s
                .map
                .get(&v.key)
                .is_some_and(|e| e.gen == v.gen && e.writeback());
            match (ours, *ok, v.sealed) {
                (true, true, Some((slot, _, _))) => {
                    let gen = s.bump();
                    let e = s.map.get_mut(&v.key).expect("checked above");
                    e.gen = gen;
                    e.born = self.backing_clock();
                    e.place = Place::Backing { slot };
                    // The entry names the slot now: a reader that copied
                    // the pool place sees the new gen and retries, so the
                    // object is freed without the lock.
                    drop(s);
                    self.account(&Place::Pool(v.obj), false);
                    self.account(&Place::Backing { slot }, true);
                    self.free_obj(v.key.0, v.obj);
                    done += 1;
                }
                (true, _, sealed) => {
                    // Not written: back to the pool's LRU, to try later.
                    failed |= sealed.is_some();
                    let e = s.map.get_mut(&v.key).expect("checked above");
                    e.set_writeback(false);
                    s.lru.push_back(LruItem::new(v.key, v.gen));
                    drop(s);
                    if let Some((slot, _, _)) = sealed {
                        self.free_slot(slot);
                    }
                }
                (false, _, sealed) => {
                    drop(s);
                    if let Some((slot, _, _)) = sealed {
                        self.free_slot(slot);
                    }
                }
            }
        }
        (done, failed)
    }
}
