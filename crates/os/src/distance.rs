//! Reuse distances counted in powers of two: how long ago, in events of
//! one clock (pages evicted, pages written back), a page that came back
//! had left. An LRU of `d` more entries would have kept every page that
//! came back from within `d` ([`Distances::within`]), the measure the
//! kernel's workingset code uses for refaults.

use std::sync::atomic::{AtomicU64, Ordering};

/// Buckets: 0 holds distance 0, bucket `i` the distances
/// `2^(i-1) ..= 2^i - 1`, the last everything from `2^31`.
pub const BUCKETS: usize = 33;

/// Counts by distance.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Distances(pub [u64; BUCKETS]);

impl Default for Distances {
    fn default() -> Distances {
        Distances([0; BUCKETS])
    }
}

fn bucket(distance: u64) -> usize {
    let d = distance.min(u64::from(u32::MAX));
    (64 - d.leading_zeros()) as usize
}

impl Distances {
    pub fn record(&mut self, distance: u64) {
        self.0[bucket(distance)] += 1;
    }

    /// Counts at distances up to `d`, the bucket that holds `d` taken in
    /// proportion.
    pub fn within(&self, d: u64) -> f64 {
        let mut n = 0.0;
        for (i, &c) in self.0.iter().enumerate() {
            let (lo, hi) = if i == 0 {
                (0, 0)
            } else {
                (1u64 << (i - 1), (1u64 << i) - 1)
            };
            if hi <= d {
                n += c as f64;
            } else {
                if lo <= d {
                    n += c as f64 * (d - lo + 1) as f64 / (hi - lo + 1) as f64;
                }
                break;
            }
        }
        n
    }

    /// The counts of `self` less those of `start`, which becomes `self`:
    /// a window's counts out of two running totals.
    pub fn since(&self, start: &[AtomicU64; BUCKETS]) -> Distances {
        let mut out = *self;
        for (n, s) in out.0.iter_mut().zip(start) {
            *n = n.saturating_sub(s.swap(*n, Ordering::Relaxed));
        }
        out
    }
}

/// [`Distances`] that many threads record into.
#[derive(Debug)]
pub struct AtomicDistances([AtomicU64; BUCKETS]);

impl Default for AtomicDistances {
    fn default() -> AtomicDistances {
        AtomicDistances(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl AtomicDistances {
    pub fn record(&self, distance: u64) {
        self.0[bucket(distance)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn load(&self) -> Distances {
        Distances(std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_within_a_distance_take_whole_buckets_and_part_of_one() {
        let mut h = Distances::default();
        for d in [0, 1, 2, 3, 4, 7, 1000] {
            h.record(d);
        }
        assert_eq!(h.within(0), 1.0);
        assert_eq!(h.within(3), 4.0);
        // 4..=7 holds two: half of them within 5.
        assert_eq!(h.within(5), 5.0);
        assert_eq!(h.within(7), 6.0);
        assert_eq!(h.within(u64::MAX >> 1), 7.0);
    }

    #[test]
    fn a_window_is_what_came_since_its_start() {
        let start: [AtomicU64; BUCKETS] = std::array::from_fn(|_| AtomicU64::new(0));
        let a = AtomicDistances::default();
        a.record(2);
        assert_eq!(a.load().since(&start).within(3), 1.0);
        a.record(3);
        a.record(1 << 40);
        let w = a.load().since(&start);
        assert_eq!((w.within(3), w.within(u64::MAX >> 1)), (1.0, 2.0));
    }
}
