//! The store path: a page becomes a same-filled word, a pool object
//! (compressed, raw, or shared with an identical page), or a backing slot.
//!
//! In order: a same-filled page needs no memory; IO admission may send the
//! page straight to the backing tier (`admission.rs`); a full pool sends it
//! there too (or refuses it, without a tier); then the page is compressed
//! into this thread's `OUT` buffer with no lock held, matched against the
//! dedup index in encoded form, and copied into the pool. No shard lock
//! is taken until `Inner::insert` (entry.rs) publishes the entry, once its
//! place is complete; the dedup lookup takes a dedup shard lock, a direct
//! write to the backing tier the slot lock (to allocate a slot, not across
//! the write).

use super::{Inner, Obj, Place, Stored, RELAXED};
use crate::admission::Admit;
use crate::codec::{Codec, Compressor, COMPRESS_BOUND};
use crate::config::{Incompressible, Reject};
use crate::seal::SealId;
use crate::PAGE_SIZE;
use std::cell::RefCell;
use uzswap_os::sync::thread_local;
use uzswap_zpool::Handle;

/// The word a page repeats, if it is one 8-byte word over and over.
pub fn same_filled_word(page: &[u8]) -> Option<u64> {
    let (head, words, tail) = {
        // SAFETY: u64 has no invalid bit patterns; align_to splits safely.
        unsafe { page.align_to::<u64>() }
    };
    if head.is_empty() && tail.is_empty() && !words.is_empty() {
        let w = words[0];
        return words.iter().all(|&x| x == w).then_some(w);
    }
    let first = u64::from_ne_bytes(page.get(..8)?.try_into().ok()?);
    page.chunks_exact(8)
        .all(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes")) == first)
        .then_some(first)
}

/// Touches this thread's store buffers (see `crate::warm_thread`).
pub(crate) fn warm_thread() {
    OUT.with(|_| ());
    SCRATCH.with(|_| ());
}

thread_local! {
    /// Compression output of this thread's store.
    static OUT: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; COMPRESS_BOUND].into_boxed_slice());
    /// A page of scratch (sealing a direct write).
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; PAGE_SIZE].into_boxed_slice());
}

impl Inner {
    /// The pool-full state with the accept-threshold hysteresis.
    fn pool_full(&self) -> bool {
        let limit = self.limit.load(RELAXED);
        if limit == u64::MAX {
            return false;
        }
        let size = self.pool.pool_bytes();
        if self.full.load(RELAXED) {
            if size < self.limit_share(self.accept_percent) {
                self.full.store(false, RELAXED);
                return false;
            }
            true
        } else if size >= limit {
            self.full.store(true, RELAXED);
            true
        } else {
            false
        }
    }

    fn inflight(&self) -> (u32, u32) {
        let own = (
            self.inflight_reads.load(RELAXED),
            self.inflight_writes.load(RELAXED),
        );
        match self.backing.as_ref().and_then(|b| b.device_inflight()) {
            Some((r, w)) => (own.0.max(r), own.1.max(w)),
            None => own,
        }
    }

    /// Stores `page`; on a refusal the caller drops the old entry.
    pub(super) fn store(
        &self,
        area: u32,
        offset: u64,
        page: &[u8],
        cold: bool,
    ) -> Result<Stored, Reject> {
        if self.same_filled {
            if let Some(w) = same_filled_word(page) {
                self.insert(area, offset, Place::Same(w));
                return Ok(Stored::SameFilled);
            }
        }
        if self.backing.is_some()
            && self.io_limits.enabled()
            && self.admission.decide(self.io_limits, self.inflight()) == Admit::Backing
        {
            self.counters.reject_io.fetch_add(1, RELAXED);
            return self.store_to_backing(area, offset, page);
        }
        if self.pool_full() {
            self.counters.pool_limit_hit.fetch_add(1, RELAXED);
            self.wake_writer();
            if self.backing.is_none() {
                self.counters.reject_reclaim_fail.fetch_add(1, RELAXED);
                return Err(Reject::PoolFull);
            }
            return self.store_to_backing(area, offset, page);
        }
        let cold_codec = if cold { self.cold_compressor } else { None };
        let compressor =
            cold_codec.unwrap_or_else(|| Compressor::unpack(self.compressor.load(RELAXED)));
        OUT.with(|out| {
            let mut out = out.borrow_mut();
            let (data, codec): (&[u8], Codec) = match compressor.compress(page, &mut out) {
                Some(n) if n < PAGE_SIZE && n <= self.max_compressed => {
                    (&out[..n], compressor.codec())
                }
                r => {
                    let size = r.unwrap_or(PAGE_SIZE);
                    if self.incompressible == Incompressible::StoreRaw {
                        (page, Codec::Raw)
                    } else {
                        self.counters.reject_compress_poor.fetch_add(1, RELAXED);
                        if self.backing.is_some() {
                            return self.store_to_backing(area, offset, page);
                        }
                        return Err(Reject::CompressPoor { size });
                    }
                }
            };
            self.store_in_pool(area, offset, page, data, codec, cold_codec.is_some())
        })
    }

    /// Puts `page`, encoded as `data` with `codec`, into the pool: shared
    /// with an identical object if dedup is on and finds one, else copied
    /// into a new object (or, where the pool cannot allocate, written to
    /// the backing tier). `cold`: encoded with the cold compressor.
    fn store_in_pool(
        &self,
        area: u32,
        offset: u64,
        page: &[u8],
        data: &[u8],
        codec: Codec,
        cold: bool,
    ) -> Result<Stored, Reject> {
        let scope = self.scope(area);
        let size = data.len();
        let mut dhash = None;
        let mut shared = None;
        if self.dedup_on.load(RELAXED) {
            // Pages are matched in encoded form: equal encoded bytes
            // under one codec decode to equal pages, so a candidate is
            // confirmed by comparing bytes, without decoding it, and the
            // hash reads the (shorter) encoded object. The codec is part
            // of the key. A page encoded differently (another level)
            // merely misses a saving.
            let h = self.dedup.hash(data) ^ (codec as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            shared = self
                .dedup
                .find_and_ref(scope, h, |cand| self.object_is(cand, data));
            dhash = Some(h);
        }
        let handle = match shared {
            Some(h) => {
                self.counters.duplicate_pages.fetch_add(1, RELAXED);
                self.counters
                    .dedup_saved_bytes
                    .fetch_add(size as u64, RELAXED);
                h
            }
            None => match self.pool.malloc_write(data) {
                Ok(h) => {
                    if let Some(d) = dhash {
                        self.dedup.insert(scope, d, h);
                    }
                    h
                }
                Err(e) => {
                    self.counters.reject_alloc_fail.fetch_add(1, RELAXED);
                    if self.backing.is_some() {
                        return self.store_to_backing(area, offset, page);
                    }
                    return Err(Reject::Alloc(e.to_string()));
                }
            },
        };
        let obj = Obj::new(handle, size, codec, dhash);
        self.insert(area, offset, Place::Pool(obj));
        if cold && codec != Codec::Raw {
            self.counters.cold_stores.fetch_add(1, RELAXED);
        }
        if self.pool.pool_bytes() >= self.limit_share((100 + self.accept_percent) / 2) {
            self.wake_writer();
        }
        Ok(match (shared, codec) {
            (Some(_), _) => Stored::Duplicate { bytes: size },
            (None, Codec::Raw) => Stored::Raw,
            (None, _) => Stored::Compressed { bytes: data.len() },
        })
    }

    /// Whether the pool object `cand` holds exactly the bytes `data`.
    fn object_is(&self, cand: Handle, data: &[u8]) -> bool {
        let mut same = false;
        let _ = self.pool.map_read(cand, &mut |src| same = src == data);
        same
    }

    /// Seals and writes one page straight to the backing tier.
    fn store_to_backing(&self, area: u32, offset: u64, page: &[u8]) -> Result<Stored, Reject> {
        let backing = self.backing.as_ref().ok_or(Reject::PoolFull)?;
        let slot = {
            let mut slots = self.slots.lock();
            match slots.alloc(1).first() {
                Some(&(slot, _)) => slot,
                None => return Err(Reject::BackingFull { slots: slots.end() }),
            }
        };
        let seq = self.seq.fetch_add(1, RELAXED);
        let res = SCRATCH.with(|s| {
            let mut buf = s.borrow_mut();
            buf.copy_from_slice(page);
            let tag = self.sealer.read().seal(
                SealId {
                    area,
                    offset,
                    slot,
                    seq,
                },
                &mut buf,
            );
            self.inflight_writes.fetch_add(1, RELAXED);
            let r = backing.write_slots(slot, &[&buf[..]]);
            self.inflight_writes.fetch_sub(1, RELAXED);
            r.map(|()| tag)
        });
        self.counters.backing_writes.fetch_add(1, RELAXED);
        match res {
            Ok(tag) => {
                // The seal first: a load that finds the entry reads it.
                self.seals.lock().set(slot, seq, tag);
                self.insert(area, offset, Place::Backing { slot });
                self.counters.stores_to_backing.fetch_add(1, RELAXED);
                Ok(Stored::Backing)
            }
            Err(e) => {
                self.free_slot(slot);
                Err(Reject::BackingIo(e.to_string()))
            }
        }
    }
}
