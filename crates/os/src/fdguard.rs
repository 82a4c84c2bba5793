//! Descriptors the runtime keeps open whatever the program closes.
//!
//! A program may close descriptors it did not open: a child between
//! `fork()` and `exec()` closing all but a few (Python's `subprocess` with
//! `preexec_fn`, `close_range(3, ~0)`), a daemon closing everything at
//! its start. Closing the runtime's userfaultfd would turn every evicted
//! page into zeros; closing its eventfds stops its threads. So those
//! descriptors are held in [`GuardedFd`] (or beside a [`Mark`]: the
//! backing file's), which marks their numbers here,
//! and the preload's `close`, `close_range` and `closefrom` skip marked
//! numbers (the call succeeds as if they had been closed). They are all
//! close-on-exec: an `exec` still ends them.
//!
//! The marks are a fixed table of bits (descriptors below
//! [`GUARDED_MAX`]; a descriptor above is not guarded), set when a
//! [`GuardedFd`] is made and cleared when it is dropped, before it closes.
//! A forked child inherits the table with the descriptors it names.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// Descriptors below this can be guarded.
pub const GUARDED_MAX: usize = 1 << 16;
const WORDS: usize = GUARDED_MAX / 64;

static MARKS: [AtomicU64; WORDS] = [const { AtomicU64::new(0) }; WORDS];

fn bit(fd: RawFd) -> Option<(usize, u64)> {
    let n = usize::try_from(fd).ok().filter(|&n| n < GUARDED_MAX)?;
    Some((n / 64, 1u64 << (n % 64)))
}

/// Whether `fd` is one of the runtime's guarded descriptors.
pub fn is_guarded(fd: RawFd) -> bool {
    bit(fd).is_some_and(|(w, b)| MARKS[w].load(Ordering::Acquire) & b != 0)
}

/// The guarded descriptors in `first..=last`, in order (a word of the
/// table at a time: no allocation, cheap where nothing is guarded).
pub fn guarded_in(first: u32, last: u32) -> impl Iterator<Item = u32> {
    let end = (u64::from(last) + 1).min(GUARDED_MAX as u64) as u32;
    let first = first.min(end);
    (first as usize / 64..(end as usize).div_ceil(64))
        .flat_map(|w| {
            let mut bits = MARKS[w].load(Ordering::Acquire);
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let b = bits.trailing_zeros();
                    bits &= bits - 1;
                    (w * 64) as u32 + b
                })
            })
        })
        .filter(move |&fd| fd >= first && fd < end)
}

/// The guard on a descriptor number that another value holds (a `File`):
/// a field declared *before* that value's, so that it is dropped, and the
/// number unmarked, before the descriptor is closed.
/// Marks `fd` without a [`Mark`] to drop: for a descriptor held in a
/// static (`crate::latency`), unmarked with [`unmark`] before it is closed.
pub(crate) fn mark(fd: RawFd) {
    if let Some((w, b)) = bit(fd) {
        MARKS[w].fetch_or(b, Ordering::AcqRel);
    }
}

/// Takes the mark of `fd` away.
pub(crate) fn unmark(fd: RawFd) {
    if let Some((w, b)) = bit(fd) {
        MARKS[w].fetch_and(!b, Ordering::AcqRel);
    }
}

#[derive(Debug)]
pub struct Mark(RawFd);

impl Mark {
    /// Guards `fd`'s number until this is dropped.
    pub fn new(fd: &impl AsRawFd) -> Mark {
        let fd = fd.as_raw_fd();
        mark(fd);
        Mark(fd)
    }
}

impl Drop for Mark {
    fn drop(&mut self) {
        unmark(self.0);
    }
}

/// A descriptor of the runtime that the program cannot close (see the
/// module docs). Closes it when dropped, as `OwnedFd` does.
#[derive(Debug)]
pub struct GuardedFd {
    // Dropped first: unmarked before the descriptor closes.
    _mark: Mark,
    fd: OwnedFd,
}

impl GuardedFd {
    /// Guards `fd`'s number until this is dropped.
    pub fn new(fd: OwnedFd) -> GuardedFd {
        GuardedFd {
            _mark: Mark::new(&fd),
            fd,
        }
    }
}

impl AsRawFd for GuardedFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for GuardedFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guarded_descriptor_is_marked_until_dropped() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let raw = f.as_raw_fd();
        assert!(!is_guarded(raw));
        let g = GuardedFd::new(OwnedFd::from(f));
        assert!(is_guarded(raw));
        assert_eq!(
            guarded_in(0, u32::MAX)
                .filter(|&n| n as RawFd == raw)
                .count(),
            1
        );
        assert_eq!(
            guarded_in(raw as u32 + 1, u32::MAX)
                .filter(|&n| n as RawFd == raw)
                .count(),
            0
        );
        drop(g);
        assert!(!is_guarded(raw));
        assert!(!is_guarded(-1) && !is_guarded(GUARDED_MAX as RawFd));
    }
}
