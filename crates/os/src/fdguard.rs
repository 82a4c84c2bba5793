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
//! A guarded descriptor is also moved high in the table when it is guarded
//! ([`lift`]): into a band above the soft limit on descriptors, at the
//! top below the hard one ([`BAND`] numbers, which `uzswap run` reserves),
//! else just below the soft limit. A program that looks at the
//! numbers it expects to be free or closed (CPython's `fd_status.py`
//! tries every number below `sysconf(_SC_OPEN_MAX)`; a `pass_fds` must
//! arrive alone) does not meet the runtime's among its own. Files the
//! runtime opens for one read (a thread's `/proc` files while a process
//! evicts) hold a low number for the microseconds of that read.
//!
//! The marks are a fixed table of bits (descriptors below
//! [`GUARDED_MAX`]; a descriptor above is not guarded), set when a
//! [`GuardedFd`] is made and cleared when it is dropped, before it closes.
//! A forked child inherits the table with the descriptors it names.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

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

/// Marks `fd` without a [`Mark`] to drop: for a descriptor held in a
/// static (`crate::latency`, the pool's pidfd), unmarked with [`unmark`]
/// before it is closed.
pub fn mark(fd: RawFd) {
    if let Some((w, b)) = bit(fd) {
        MARKS[w].fetch_or(b, Ordering::AcqRel);
    }
}

/// Takes the mark of `fd` away.
pub fn unmark(fd: RawFd) {
    if let Some((w, b)) = bit(fd) {
        MARKS[w].fetch_and(!b, Ordering::AcqRel);
    }
}

/// How many numbers above the soft limit on descriptors, and below the
/// hard one, the runtime's may take ([`lift_raw`]). `uzswap run` leaves
/// that room where the two limits are closer ([`reserve_band`]).
pub const BAND: u64 = 64;

/// The process whose thread has the soft limit raised now (0: none): it is
/// raised and put back by one thread at a time ([`with_soft_limit`]). A
/// forked child whose parent was lifting at the fork finds the parent's pid
/// here and takes it over (the parent's thread does not run in the child).
/// A program thread's `getrlimit` in that window reads the raised limit.
static LIFTING: AtomicU32 = AtomicU32::new(0);

fn limits() -> Option<libc::rlimit> {
    // SAFETY: getrlimit fills a struct of our own.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        (libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0).then_some(r)
    }
}

fn set_limits(r: &libc::rlimit) -> bool {
    // SAFETY: setrlimit reads a struct of our own.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, r) == 0 }
}

/// The band of numbers the runtime's descriptors take where there is
/// one: the top [`BAND`] numbers below the hard limit (or below
/// [`GUARDED_MAX`] where that is lower), if all of them lie above the soft
/// limit. At the top, not just above the soft limit: a program that lowers
/// its soft limit under descriptors it keeps open, and then looks just
/// above it (CPython's `test_close_fds_when_max_fd_is_lowered`), does not
/// meet the runtime's either.
fn band(lim: &libc::rlimit) -> Option<u64> {
    let top = lim.rlim_max.min(GUARDED_MAX as u64);
    top.checked_sub(BAND).filter(|&at| at >= lim.rlim_cur)
}

/// Lowers this process's soft limit on descriptors so that [`BAND`]
/// numbers lie between it and the hard limit (which a process may not
/// raise without privilege), for the runtime's descriptors of a program
/// started from here; nothing where the room is there already, the soft
/// limit is too small to give it (under `4 × BAND`) or the hard limit is
/// past what can be guarded. Returns the soft limit the program will see.
pub fn reserve_band() -> Option<u64> {
    let lim = limits()?;
    if band(&lim).is_some() || lim.rlim_cur < 4 * BAND || lim.rlim_max > GUARDED_MAX as u64 {
        return Some(lim.rlim_cur);
    }
    let lowered = libc::rlimit {
        rlim_cur: lim.rlim_max - BAND,
        rlim_max: lim.rlim_max,
    };
    set_limits(&lowered).then_some(lowered.rlim_cur)
}

/// `fd` duplicated (close-on-exec) to the lowest free number at or above
/// `at` and its old number closed; None (and `fd` left as it was) if no
/// such number can be had.
fn move_to(fd: RawFd, at: u64) -> Option<RawFd> {
    let at = RawFd::try_from(at).ok()?;
    // SAFETY: duplicates the caller's descriptor; the old number is closed
    // only once the duplicate exists, and nothing else refers to it (the
    // caller's contract).
    unsafe {
        let hi = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, at);
        if hi < 0 {
            return None;
        }
        libc::close(fd);
        Some(hi)
    }
}

/// Runs `f` with the soft limit on descriptors raised to `soft` (within
/// the hard one: no privilege) and puts it back after, unless the program
/// set a limit of its own meanwhile (then its own stays). The kernel
/// hands out, and `dup3` takes, only numbers below the soft limit; a
/// descriptor above it works as any other. One thread at a time; None
/// where the limit cannot be set.
fn with_soft_limit<T>(soft: u64, f: impl FnOnce() -> T) -> Option<T> {
    let pid = std::process::id();
    loop {
        let held = LIFTING.load(Ordering::Acquire);
        // Free, or a parent's that a fork left behind.
        if held != pid
            && LIFTING
                .compare_exchange(held, pid, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            break;
        }
        std::thread::yield_now();
    }
    let out = limits().and_then(|lim| {
        let raised = libc::rlimit {
            rlim_cur: soft.max(lim.rlim_cur),
            rlim_max: lim.rlim_max,
        };
        if !set_limits(&raised) {
            return None;
        }
        let out = f();
        if limits().is_some_and(|now| now.rlim_cur == raised.rlim_cur) {
            set_limits(&lim);
        }
        Some(out)
    });
    LIFTING.store(0, Ordering::Release);
    out
}

/// `dup3(src, dst, O_CLOEXEC)`: makes the descriptor number `dst` name
/// `src`'s open file, atomically closing the file it named; `src` stays as
/// it is. `dst` may be a lifted number above the soft limit.
///
/// # Safety
/// `dst` is a descriptor of the caller's own (held open by an object of
/// the caller), and nothing relies on it naming its old file any more: its
/// owner names the new one through it from now on.
pub unsafe fn replace(src: RawFd, dst: RawFd) -> std::io::Result<()> {
    // SAFETY: `dst` may be replaced (the caller's contract); `src` is only
    // read.
    let dup = || unsafe { libc::dup3(src, dst, libc::O_CLOEXEC) };
    let r = match limits() {
        Some(lim) if dst >= 0 && dst as u64 >= lim.rlim_cur => {
            with_soft_limit(dst as u64 + 1, dup).unwrap_or(-1)
        }
        _ => dup(),
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Moves the descriptor `fd` (the caller's, close-on-exec) high in the
/// table, closing its old number, and returns the new number: into the
/// band above the soft limit on descriptors where there is one ([`band`]),
/// else among the `BAND` numbers below the soft limit;
/// `fd` itself where both fail (a table full up there): a low number works
/// as well, it is only seen. Numbers stay below [`GUARDED_MAX`].
pub fn lift_raw(fd: RawFd) -> RawFd {
    let Some(lim) = limits() else { return fd };
    let soft = lim.rlim_cur;
    if let Some(at) = band(&lim) {
        if fd as u64 >= at {
            return fd;
        }
        // Into the band, where a program that looks at every number it
        // may have (`sysconf(_SC_OPEN_MAX)`, CPython's `fd_status.py`)
        // never looks.
        if let Some(hi) = with_soft_limit(at + BAND, || move_to(fd, at)).flatten() {
            return hi;
        }
    }
    let at = soft.min(GUARDED_MAX as u64).saturating_sub(BAND).max(3);
    if fd as u64 >= at {
        return fd;
    }
    move_to(fd, at).unwrap_or(fd)
}

/// [`lift_raw`] for an owned descriptor of any kind (`File`, `OwnedFd`,
/// `UnixListener`).
pub fn lift<F: From<OwnedFd> + Into<OwnedFd>>(f: F) -> F {
    let raw = f.into().into_raw_fd();
    // SAFETY: the number was ours alone (taken from the owner above);
    // lift_raw returns a number that is ours alone in its place.
    F::from(unsafe { OwnedFd::from_raw_fd(lift_raw(raw)) })
}

/// Lifts `f` ([`lift`]) and guards its number: hold the [`Mark`] in a
/// field declared *before* `f`'s, so that it is dropped, and the number
/// unmarked, before the descriptor closes.
pub fn guard<F: From<OwnedFd> + Into<OwnedFd> + AsRawFd>(f: F) -> (Mark, F) {
    let f = lift(f);
    (Mark::new(f.as_raw_fd()), f)
}

/// The guard on a descriptor number that another value holds ([`guard`]).
#[derive(Debug)]
pub struct Mark(RawFd);

impl Mark {
    fn new(fd: RawFd) -> Mark {
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
    /// Lifts `fd` ([`lift`]) and guards its number until this is dropped.
    pub fn new(fd: OwnedFd) -> GuardedFd {
        let (_mark, fd) = guard(fd);
        GuardedFd { _mark, fd }
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
    fn a_guarded_descriptor_is_lifted_and_marked_until_dropped() {
        let f = std::fs::File::open("/dev/null").unwrap();
        let low = f.as_raw_fd();
        let g = GuardedFd::new(OwnedFd::from(f));
        let raw = g.as_raw_fd();
        let lim = limits().unwrap();
        // In the band above the soft limit where there is one, else just
        // below it.
        let floor = if let Some(at) = band(&lim) {
            at
        } else {
            lim.rlim_cur - BAND
        };
        assert!(
            raw as u64 >= floor && raw > low,
            "{raw} is not lifted to {floor}"
        );
        // The limit is as it was.
        let now = limits().unwrap();
        assert_eq!((now.rlim_cur, now.rlim_max), (lim.rlim_cur, lim.rlim_max));
        // The low number was closed when it moved.
        // SAFETY: asks the kernel about a number; nothing is changed.
        assert_eq!(unsafe { libc::fcntl(low, libc::F_GETFD) }, -1);
        // SAFETY: as above.
        let flags = unsafe { libc::fcntl(raw, libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
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
