//! Sealing of pages written to the backing file.
//!
//! By default a page is encrypted with AES-256-GCM (ring) under a key made
//! fresh for each cache from the OS's random source and kept only in this
//! process's memory. The nonce is a per-cache write sequence number (never
//! reused under one key), and the associated data binds the ciphertext to
//! its key `(area, offset)`, its slot and that sequence number: a tampered
//! slot, a slot of another page, or an old write of the same slot all fail
//! to open. The 16-byte tag stays in memory (the cache's seal table, by
//! slot), never on disk.
//!
//! With encryption off, a keyed-by-position xxh3 checksum takes the tag's
//! place, so corruption and stale slots are still detected.
//!
//! A forked child inherits the key and the sequence counter. Parent and
//! child would then both seal their next writes under the same key and the
//! same sequence numbers, which GCM forbids, so the child takes a fresh key
//! ([`Sealer::rekey`]) for every sequence number from the fork on; it keeps
//! the old key to open what was sealed before.

use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};

/// What identifies one sealed write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SealId {
    pub area: u32,
    pub offset: u64,
    pub slot: u64,
    pub seq: u64,
}

impl SealId {
    fn aad(&self) -> [u8; 28] {
        let mut a = [0u8; 28];
        a[..4].copy_from_slice(&self.area.to_le_bytes());
        a[4..12].copy_from_slice(&self.offset.to_le_bytes());
        a[12..20].copy_from_slice(&self.slot.to_le_bytes());
        a[20..28].copy_from_slice(&self.seq.to_le_bytes());
        a
    }
}

/// A page that failed to open: wrong tag, i.e. tampered, stale or corrupt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SealBroken;

pub enum Sealer {
    /// The keys, each with the first sequence number it seals (ascending;
    /// the last one seals new writes).
    Aead(Vec<(u64, LessSafeKey)>),
    Checksum,
}

impl Sealer {
    /// A sealer with a fresh random key (`encrypt`) or checksums only.
    pub fn new(encrypt: bool) -> std::io::Result<Sealer> {
        if !encrypt {
            return Ok(Sealer::Checksum);
        }
        Ok(Sealer::Aead(vec![(0, fresh_key()?)]))
    }

    /// From sequence number `from` on, seals under a fresh key (earlier
    /// numbers still open under the key they were sealed with). `from`
    /// must be above every sequence number sealed so far. A key that
    /// sealed nothing yet (a second fork before any write) is replaced.
    #[cfg_attr(feature = "shuttle", allow(dead_code))] // for cache/fork.rs, not built in the model
    pub fn rekey(&mut self, from: u64) -> std::io::Result<()> {
        if let Sealer::Aead(keys) = self {
            let fresh = fresh_key()?;
            match keys.last_mut() {
                Some(last) if last.0 == from => last.1 = fresh,
                _ => {
                    debug_assert!(keys.last().is_none_or(|(f, _)| *f < from));
                    keys.push((from, fresh));
                }
            }
        }
        Ok(())
    }

    /// The key that seals (or sealed) write `seq`.
    fn key(keys: &[(u64, LessSafeKey)], seq: u64) -> &LessSafeKey {
        let i = keys.partition_point(|(from, _)| *from <= seq);
        &keys[i.saturating_sub(1)].1
    }

    pub fn encrypts(&self) -> bool {
        matches!(self, Sealer::Aead(_))
    }

    /// Seals `page` in place; returns the tag to keep.
    pub fn seal(&self, id: SealId, page: &mut [u8]) -> [u8; 16] {
        match self {
            Sealer::Aead(keys) => {
                let tag = Sealer::key(keys, id.seq)
                    .seal_in_place_separate_tag(nonce(id.seq), Aad::from(id.aad()), page)
                    .expect("a page is far below the cipher's length limit");
                tag.as_ref().try_into().expect("a 16-byte tag")
            }
            Sealer::Checksum => checksum(id, page),
        }
    }

    /// Opens `page` in place. On failure the buffer is zeroed, so no caller
    /// can mistake its contents for the page.
    pub fn open(&self, id: SealId, page: &mut [u8], tag: &[u8; 16]) -> Result<(), SealBroken> {
        let ok = match self {
            Sealer::Aead(keys) => Sealer::key(keys, id.seq)
                .open_in_place_separate_tag(
                    nonce(id.seq),
                    Aad::from(id.aad()),
                    Tag::from(*tag),
                    page,
                    0..,
                )
                .is_ok(),
            Sealer::Checksum => checksum(id, page) == *tag,
        };
        if ok {
            Ok(())
        } else {
            page.fill(0);
            Err(SealBroken)
        }
    }
}

/// The nonce of write `seq`: unique under one key, as GCM requires.
fn nonce(seq: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[..8].copy_from_slice(&seq.to_le_bytes());
    Nonce::assume_unique_for_key(n)
}

fn fresh_key() -> std::io::Result<LessSafeKey> {
    let mut key = [0u8; 32];
    crate::sys::getrandom(&mut key)?;
    let cipher = UnboundKey::new(&AES_256_GCM, &key)
        .map_err(|_| std::io::Error::other("AES-256-GCM refused a 32-byte key"))?;
    // The cipher holds its own expanded copy; wipe ours.
    key.iter_mut().for_each(|b| *b = 0);
    Ok(LessSafeKey::new(cipher))
}

fn checksum(id: SealId, page: &[u8]) -> [u8; 16] {
    let seed = xxhash_rust::xxh3::xxh3_64(&id.aad());
    xxhash_rust::xxh3::xxh3_128_with_seed(page, seed).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: SealId = SealId {
        area: 1,
        offset: 7,
        slot: 3,
        seq: 99,
    };

    #[test]
    fn sealed_pages_open_only_with_their_identity() {
        for encrypt in [true, false] {
            let s = Sealer::new(encrypt).unwrap();
            let page: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
            let mut buf = page.clone();
            let tag = s.seal(ID, &mut buf);
            assert_eq!(buf != page, encrypt, "ciphertext differs iff encrypting");
            let mut ok = buf.clone();
            s.open(ID, &mut ok, &tag).unwrap();
            assert_eq!(ok, page);
            for other in [
                SealId { area: 2, ..ID },
                SealId { offset: 8, ..ID },
                SealId { slot: 4, ..ID },
                SealId { seq: 100, ..ID },
            ] {
                let mut b = buf.clone();
                assert_eq!(s.open(other, &mut b, &tag), Err(SealBroken));
                assert!(b.iter().all(|&x| x == 0), "failed open leaves zeros");
            }
            let mut flipped = buf.clone();
            flipped[1234] ^= 0x10;
            assert_eq!(s.open(ID, &mut flipped, &tag), Err(SealBroken));
        }
    }

    #[test]
    fn a_new_key_seals_from_its_first_number_and_old_writes_still_open() {
        let mut s = Sealer::new(true).unwrap();
        let page = vec![7u8; 4096];
        let mut old = page.clone();
        let old_tag = s.seal(ID, &mut old);
        let mut same_seq_before = page.clone();
        let t_before = s.seal(SealId { seq: 200, ..ID }, &mut same_seq_before);
        s.rekey(150).unwrap();
        let mut after = page.clone();
        let t_after = s.seal(SealId { seq: 200, ..ID }, &mut after);
        // Same identity, same bytes, a different key: different ciphertext.
        assert_ne!(after, same_seq_before);
        assert_ne!(t_after, t_before);
        let mut o = old.clone();
        s.open(ID, &mut o, &old_tag).unwrap();
        assert_eq!(o, page);
        let mut a = after.clone();
        s.open(SealId { seq: 200, ..ID }, &mut a, &t_after).unwrap();
        assert_eq!(a, page);
    }

    #[test]
    fn a_second_fork_before_any_write_replaces_the_unused_key() {
        let mut s = Sealer::new(true).unwrap();
        let page = vec![9u8; 4096];
        let mut old = page.clone();
        let old_tag = s.seal(ID, &mut old);
        s.rekey(150).unwrap();
        s.rekey(150).unwrap();
        if let Sealer::Aead(keys) = &s {
            assert_eq!(keys.len(), 2, "the unused key was replaced, not kept");
        }
        let id = SealId { seq: 150, ..ID };
        let mut new = page.clone();
        let tag = s.seal(id, &mut new);
        let mut n = new.clone();
        s.open(id, &mut n, &tag).unwrap();
        assert_eq!(n, page);
        let mut o = old.clone();
        s.open(ID, &mut o, &old_tag).unwrap();
        assert_eq!(o, page);
    }

    #[test]
    fn keys_are_fresh() {
        let a = Sealer::new(true).unwrap();
        let b = Sealer::new(true).unwrap();
        let mut pa = vec![0u8; 4096];
        let mut pb = vec![0u8; 4096];
        a.seal(ID, &mut pa);
        b.seal(ID, &mut pb);
        assert_ne!(pa, pb);
    }
}
