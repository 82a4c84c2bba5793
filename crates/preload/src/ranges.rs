//! A set of disjoint address ranges (page granular): the free part of the
//! managed address space.

use std::collections::BTreeMap;

/// Disjoint, non-adjacent half-open ranges `start..end`, keyed by start.
#[derive(Debug, Default, Clone)]
pub struct Ranges {
    map: BTreeMap<usize, usize>,
}

impl Ranges {
    pub fn new() -> Ranges {
        Ranges::default()
    }

    /// Adds `start..end` (a union: parts already present are fine).
    pub fn insert(&mut self, mut start: usize, mut end: usize) {
        if start >= end {
            return;
        }
        // Absorb every range that overlaps or touches start..end.
        if let Some((&s, &e)) = self.map.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
                self.map.remove(&s);
            }
        }
        while let Some((&s, &e)) = self.map.range(start..=end).next() {
            end = end.max(e);
            self.map.remove(&s);
        }
        self.map.insert(start, end);
    }

    /// Removes `start..end` (parts not present are fine).
    pub fn remove(&mut self, start: usize, end: usize) {
        if start >= end {
            return;
        }
        let first = self
            .map
            .range(..start)
            .next_back()
            .filter(|(_, &e)| e > start)
            .map(|(&s, _)| s)
            .unwrap_or(start);
        let hit: Vec<(usize, usize)> = self.map.range(first..end).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in hit {
            self.map.remove(&s);
            if s < start {
                self.map.insert(s, start);
            }
            if e > end {
                self.map.insert(end, e);
            }
        }
    }

    /// Whether all of `start..end` is in the set.
    pub fn contains(&self, start: usize, end: usize) -> bool {
        start >= end
            || self
                .map
                .range(..=start)
                .next_back()
                .is_some_and(|(_, &e)| e >= end)
    }

    /// The parts of `start..end` in the set, in order.
    pub fn overlap(&self, start: usize, end: usize) -> Vec<(usize, usize)> {
        let first = self
            .map
            .range(..start)
            .next_back()
            .filter(|(_, &e)| e > start)
            .map(|(&s, _)| s)
            .unwrap_or(start);
        self.map
            .range(first..end)
            .map(|(&s, &e)| (s.max(start), e.min(end)))
            .filter(|(s, e)| s < e)
            .collect()
    }

    /// Total bytes in the set.
    pub fn total(&self) -> usize {
        self.map.iter().map(|(s, e)| e - s).sum()
    }

    /// Takes the lowest `len` bytes that start at a multiple of `align`
    /// (a power of two) and returns their start.
    pub fn take_first_fit(&mut self, len: usize, align: usize) -> Option<usize> {
        debug_assert!(align.is_power_of_two());
        let at = self.map.iter().find_map(|(&s, &e)| {
            let a = s.checked_add(align - 1)? & !(align - 1);
            (a.checked_add(len)? <= e).then_some(a)
        })?;
        self.remove(at, at + len);
        Some(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(usize, usize),
        Remove(usize, usize),
        Take(usize, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        let range = (0usize..64, 1usize..16).prop_map(|(s, l)| (s, (s + l).min(64)));
        prop_oneof![
            range.clone().prop_map(|(s, e)| Op::Insert(s, e)),
            range.prop_map(|(s, e)| Op::Remove(s, e)),
            (1usize..12, 0u32..3).prop_map(|(l, a)| Op::Take(l, 1 << a)),
        ]
    }

    proptest! {
        /// Every operation agrees with a bitmap of 64 units, and the map
        /// stays disjoint and non-adjacent.
        #[test]
        fn agrees_with_a_bitmap(ops in proptest::collection::vec(op(), 1..60)) {
            let mut r = Ranges::new();
            let mut bits = [false; 64];
            for op in ops {
                match op {
                    Op::Insert(s, e) => { r.insert(s, e); bits[s..e].fill(true); }
                    Op::Remove(s, e) => { r.remove(s, e); bits[s..e].fill(false); }
                    Op::Take(len, align) => {
                        let want = (0..64).step_by(align)
                            .find(|&a| a + len <= 64 && bits[a..a + len].iter().all(|&b| b));
                        let got = r.take_first_fit(len, align);
                        prop_assert_eq!(got, want);
                        if let Some(a) = got { bits[a..a + len].fill(false); }
                    }
                }
                let mut prev_end = None;
                for (&s, &e) in &r.map {
                    prop_assert!(s < e);
                    if let Some(p) = prev_end { prop_assert!(s > p, "adjacent or overlapping"); }
                    prev_end = Some(e);
                }
                for (i, &b) in bits.iter().enumerate() {
                    prop_assert_eq!(r.contains(i, i + 1), b, "unit {}", i);
                }
                prop_assert_eq!(r.total(), bits.iter().filter(|&&b| b).count());
                let parts: usize = r.overlap(10, 40).iter().map(|(s, e)| e - s).sum();
                prop_assert_eq!(parts, bits[10..40].iter().filter(|&&b| b).count());
            }
        }
    }
}
