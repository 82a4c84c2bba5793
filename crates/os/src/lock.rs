//! Locks and a condition variable whose whole state is one or two 32-bit
//! words of their own, waited on with the futex system call: no table of
//! waiters elsewhere in the process, no per-thread record.
//!
//! Why not parking_lot's: it lists parked threads in one process-wide hash
//! table whose buckets have locks of their own. A thread of the parent
//! inside one of those buckets at the instant of a `fork()` leaves it
//! locked in the child, which then hangs the first time it parks or wakes
//! anything hashed there; and a lock released in the child must first have
//! the parent's (absent) waiters taken off that table: a bash child under
//! `uzswap run` can hang in such a bucket lock. With
//! the state in the lock's own word, a lock the prepare hook held is
//! released in the child by writing that word ([`RawMutex::reset`]): the
//! parent's waiters were only ever counted there, and nothing else refers
//! to them.
//!
//! The locks are unfair, like std's: a released lock goes to whichever
//! thread takes it first, a woken one or a newcomer. A few rounds of
//! spinning and yielding come before sleeping, since our critical sections
//! are short (no compression, I/O or sleep is ever done under a lock).

use lock_api::GuardSend;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Rounds of busy waiting on a held lock before sleeping on it: the
/// first few spin (2, 4, 8 pauses), the rest give the CPU away
/// (`sched_yield`), so that a holder preempted on this CPU can finish. On a
/// machine of two CPUs the holder of our short critical sections is often
/// just that; sleeping at once cost a futex wait and wake per contended
/// hand-over (parking_lot, which these replace, waits the same way).
const SPIN_ROUNDS: u32 = 3;
const YIELD_ROUNDS: u32 = 7;

/// Sleeps while `word` holds `expected`, at most `timeout` (spurious
/// returns are possible; callers re-check). Async-signal-safe: one system
/// call, nothing allocated.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    futex_wait_in(word, expected, timeout, libc::FUTEX_PRIVATE_FLAG);
}

/// Wakes at most `n` threads sleeping on `word`. Async-signal-safe.
pub fn futex_wake(word: &AtomicU32, n: i32) {
    futex_wake_in(word, n, libc::FUTEX_PRIVATE_FLAG);
}

/// [`futex_wait`] on a word in memory shared between processes (a
/// `MAP_SHARED` mapping): woken by [`futex_wake_shared`] from any process
/// that maps it.
pub fn futex_wait_shared(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    futex_wait_in(word, expected, timeout, 0);
}

/// [`futex_wake`] for a word in memory shared between processes.
pub fn futex_wake_shared(word: &AtomicU32, n: i32) {
    futex_wake_in(word, n, 0);
}

fn futex_wait_in(word: &AtomicU32, expected: u32, timeout: Option<Duration>, flags: i32) {
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live 32-bit atomic; the timeout, when given, is a
    // valid relative timespec that outlives the call. EINTR, EAGAIN and
    // ETIMEDOUT are all "return and re-check".
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | flags,
            expected,
            ts_ptr,
        );
    }
}

fn futex_wake_in(word: &AtomicU32, n: i32, flags: i32) {
    // SAFETY: `word` is a live 32-bit atomic; waking has no other effect.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | flags, n);
    }
}

/// Waits while `word` is `busy`, spinning then yielding (see
/// [`SPIN_ROUNDS`]); returns the last value seen.
fn spin_while(word: &AtomicU32, busy: impl Fn(u32) -> bool) -> u32 {
    let mut v = word.load(Ordering::Relaxed);
    for round in 0..SPIN_ROUNDS + YIELD_ROUNDS {
        if !busy(v) {
            break;
        }
        if round < SPIN_ROUNDS {
            for _ in 0..2u32 << round {
                std::hint::spin_loop();
            }
        } else {
            std::thread::yield_now();
        }
        v = word.load(Ordering::Relaxed);
    }
    v
}

// -- Mutex ------------------------------------------------------------------

const UNLOCKED: u32 = 0;
const LOCKED: u32 = 1;

/// A mutual-exclusion lock: `state` is 0 free or 1 held, and `sleepers`
/// counts the threads that may sleep on it, so that an unlock wakes one
/// only when someone may sleep (a count of its own rather than a
/// "contended" state, which would have the thread that takes the lock
/// after sleeping wake another at its unlock whether any sleeps or not).
/// No wake-up is lost, as with the reader-writer lock's: a sleeper counts
/// itself, then reads `state`; an unlock writes `state`, then reads the
/// count; both sequentially consistent.
pub struct RawMutex {
    state: AtomicU32,
    sleepers: AtomicU32,
}

impl RawMutex {
    #[cold]
    fn lock_contended(&self) {
        loop {
            if spin_while(&self.state, |s| s == LOCKED) == UNLOCKED
                && self
                    .state
                    .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            if self.state.load(Ordering::SeqCst) == LOCKED {
                futex_wait(&self.state, LOCKED, None);
            }
            self.sleepers.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Marks the lock free without waking anyone: in a forked child, for a
    /// lock that this thread held through the fork (every thread that
    /// could be waiting on it was the parent's).
    ///
    /// # Safety
    /// This thread holds the lock (its guard forgotten) and is the only
    /// thread of the process.
    pub unsafe fn reset(&self) {
        self.state.store(UNLOCKED, Ordering::Release);
        self.sleepers.store(0, Ordering::Release);
    }
}

// SAFETY: the lock admits one holder at a time: it is taken only by a
// 0 -> 1 transition with Acquire, and released with a (sequentially
// consistent, so also Release) write of 0.
unsafe impl lock_api::RawMutex for RawMutex {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: RawMutex = RawMutex {
        state: AtomicU32::new(UNLOCKED),
        sleepers: AtomicU32::new(0),
    };

    type GuardMarker = GuardSend;

    #[inline]
    fn lock(&self) {
        if !self.try_lock() {
            self.lock_contended();
        }
    }

    #[inline]
    fn try_lock(&self) -> bool {
        self.state
            .compare_exchange(UNLOCKED, LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    #[inline]
    unsafe fn unlock(&self) {
        self.state.swap(UNLOCKED, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            futex_wake(&self.state, 1);
        }
    }

    #[inline]
    fn is_locked(&self) -> bool {
        self.state.load(Ordering::Relaxed) != UNLOCKED
    }
}

// -- RwLock -----------------------------------------------------------------

/// Held for writing.
const WRITE_LOCKED: u32 = u32::MAX;
/// Added per reader (the low bit is "a writer waits").
const READER: u32 = 2;
/// A writer waits: new readers wait too, so writers are not starved.
const WRITER_WAITS: u32 = 1;

/// A reader-writer lock: `state` is `WRITE_LOCKED`, or twice the number
/// of readers plus [`WRITER_WAITS`]. Readers sleep on `state`; writers on
/// `writer_wake`, which a release that may let a writer in bumps. Each
/// kind of sleeper is counted, so that a release wakes only when someone
/// may sleep (the allocator's class locks are taken for writing at every
/// store and free: two wake calls at each release tripled the futex calls
/// of a run).
///
/// No wake-up is lost: a sleeper counts itself, then reads `state`, then
/// sleeps only on the value read; a release writes `state`, then reads the
/// count. Both sides are sequentially consistent, so either the release
/// sees the sleeper's count or the sleeper sees the released state.
pub struct RawRwLock {
    state: AtomicU32,
    writer_wake: AtomicU32,
    readers_sleeping: AtomicU32,
    writers_sleeping: AtomicU32,
}

impl RawRwLock {
    #[cold]
    fn lock_shared_contended(&self) {
        loop {
            let s = spin_while(&self.state, |s| s & WRITER_WAITS != 0);
            if s & WRITER_WAITS == 0 {
                assert!(s < WRITE_LOCKED - 2 * READER, "too many readers");
                if self
                    .state
                    .compare_exchange_weak(s, s + READER, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
                continue;
            }
            // Write-locked (odd) or a writer waits: sleep until a writer
            // releases it.
            self.readers_sleeping.fetch_add(1, Ordering::SeqCst);
            let s = self.state.load(Ordering::SeqCst);
            if s & WRITER_WAITS != 0 {
                futex_wait(&self.state, s, None);
            }
            self.readers_sleeping.fetch_sub(1, Ordering::Relaxed);
        }
    }

    #[cold]
    fn lock_exclusive_contended(&self) {
        let mut s = self.state.load(Ordering::Relaxed);
        loop {
            // No readers, no writer: take it (keeping no "waits" mark: a
            // writer still sleeping sets it again when it wakes).
            if s <= WRITER_WAITS {
                match self.state.compare_exchange(
                    s,
                    WRITE_LOCKED,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => return,
                    Err(e) => {
                        s = e;
                        continue;
                    }
                }
            }
            // Readers hold it: say that a writer waits, so no reader joins.
            if s & WRITER_WAITS == 0 {
                match self.state.compare_exchange(
                    s,
                    s + WRITER_WAITS,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {}
                    Err(e) => {
                        s = e;
                        continue;
                    }
                }
            }
            // Sleep until a release bumps `writer_wake`: counted first, then
            // the counter read, then the state looked at again, so that a
            // release in between is seen.
            self.writers_sleeping.fetch_add(1, Ordering::SeqCst);
            let w = self.writer_wake.load(Ordering::Acquire);
            s = self.state.load(Ordering::SeqCst);
            if s > WRITER_WAITS {
                futex_wait(&self.writer_wake, w, None);
                s = self.state.load(Ordering::Relaxed);
            }
            self.writers_sleeping.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Lets one sleeping writer (if any) look at the lock again.
    fn wake_writer(&self) {
        if self.writers_sleeping.load(Ordering::SeqCst) > 0 {
            self.writer_wake.fetch_add(1, Ordering::Release);
            futex_wake(&self.writer_wake, 1);
        }
    }

    /// Like [`RawMutex::reset`], for a lock held for writing through the
    /// fork.
    ///
    /// # Safety
    /// As for [`RawMutex::reset`].
    pub unsafe fn reset(&self) {
        self.state.store(0, Ordering::Release);
        self.writer_wake.store(0, Ordering::Release);
        self.readers_sleeping.store(0, Ordering::Release);
        self.writers_sleeping.store(0, Ordering::Release);
    }
}

// SAFETY: a writer takes the lock only from 0 (or the bare "waits" mark,
// i.e. no reader) to WRITE_LOCKED; a reader only adds to an even state,
// which WRITE_LOCKED (odd) never is; both with Acquire, released with
// Release (or stronger).
unsafe impl lock_api::RawRwLock for RawRwLock {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: RawRwLock = RawRwLock {
        state: AtomicU32::new(0),
        writer_wake: AtomicU32::new(0),
        readers_sleeping: AtomicU32::new(0),
        writers_sleeping: AtomicU32::new(0),
    };

    type GuardMarker = GuardSend;

    #[inline]
    fn lock_shared(&self) {
        if !self.try_lock_shared() {
            self.lock_shared_contended();
        }
    }

    #[inline]
    fn try_lock_shared(&self) -> bool {
        let s = self.state.load(Ordering::Relaxed);
        s & WRITER_WAITS == 0
            && s < WRITE_LOCKED - 2 * READER
            && self
                .state
                .compare_exchange(s, s + READER, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
    }

    #[inline]
    unsafe fn unlock_shared(&self) {
        let before = self.state.fetch_sub(READER, Ordering::SeqCst);
        // The last reader out while a writer waits lets it in.
        if before == READER + WRITER_WAITS {
            self.wake_writer();
        }
    }

    #[inline]
    fn lock_exclusive(&self) {
        if !self.try_lock_exclusive() {
            self.lock_exclusive_contended();
        }
    }

    #[inline]
    fn try_lock_exclusive(&self) -> bool {
        self.state
            .compare_exchange(0, WRITE_LOCKED, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    #[inline]
    unsafe fn unlock_exclusive(&self) {
        self.state.swap(0, Ordering::SeqCst);
        // One writer and every reader may come: whoever is first takes it
        // (a writer that loses sets "waits" again and sleeps).
        self.wake_writer();
        if self.readers_sleeping.load(Ordering::SeqCst) > 0 {
            futex_wake(&self.state, i32::MAX);
        }
    }

    #[inline]
    fn is_locked(&self) -> bool {
        self.state.load(Ordering::Relaxed) > WRITER_WAITS
    }
}

/// A mutex over [`RawMutex`], with parking_lot's API (no poisoning).
pub type Mutex<T> = lock_api::Mutex<RawMutex, T>;
pub type MutexGuard<'a, T> = lock_api::MutexGuard<'a, RawMutex, T>;
/// A reader-writer lock over [`RawRwLock`], with parking_lot's API.
pub type RwLock<T> = lock_api::RwLock<RawRwLock, T>;

// -- Condvar ----------------------------------------------------------------

/// Whether a timed wait on a [`Condvar`] ended by its timeout.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    pub fn timed_out(self) -> bool {
        self.0
    }
}

/// A condition variable for [`Mutex`]: a counter bumped by every notify,
/// on which waiters sleep, and the number of waiters (so a notify with
/// nobody waiting makes no system call).
///
/// Waits may end spuriously, as std's may: every caller waits in a loop
/// that re-checks its condition under the mutex.
pub struct Condvar {
    counter: AtomicU32,
    waiters: AtomicU32,
}

impl Default for Condvar {
    fn default() -> Self {
        Self::new()
    }
}

impl Condvar {
    pub const fn new() -> Condvar {
        Condvar {
            counter: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
        }
    }

    /// Wakes one waiter, if any.
    pub fn notify_one(&self) {
        self.counter.fetch_add(1, Ordering::Relaxed);
        if self.waiters.load(Ordering::Relaxed) > 0 {
            futex_wake(&self.counter, 1);
        }
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) {
        self.counter.fetch_add(1, Ordering::Relaxed);
        if self.waiters.load(Ordering::Relaxed) > 0 {
            futex_wake(&self.counter, i32::MAX);
        }
    }

    /// Releases the guard's mutex, sleeps until notified (or spuriously),
    /// and takes the mutex again.
    pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        self.wait_inner(guard, None);
    }

    /// As [`Condvar::wait`], at most `timeout`.
    pub fn wait_for<T>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        timeout: Duration,
    ) -> WaitTimeoutResult {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.wait_until(guard, deadline),
            // Past any clock's end: a wait without a timeout.
            None => {
                self.wait_inner(guard, None);
                WaitTimeoutResult(false)
            }
        }
    }

    /// As [`Condvar::wait`], until `deadline` at the latest.
    pub fn wait_until<T>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        deadline: Instant,
    ) -> WaitTimeoutResult {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return WaitTimeoutResult(true);
        }
        self.wait_inner(guard, Some(left));
        WaitTimeoutResult(Instant::now() >= deadline)
    }

    fn wait_inner<T>(&self, guard: &mut MutexGuard<'_, T>, timeout: Option<Duration>) {
        // Counted and read while the mutex is held: a notifier that changes
        // the condition under the mutex and notifies after sees the waiter
        // (the mutex orders the two), and bumps the counter after it was
        // read here, so the sleep below returns at once.
        self.waiters.fetch_add(1, Ordering::Relaxed);
        let seen = self.counter.load(Ordering::Relaxed);
        let mutex = MutexGuard::mutex(guard);
        // SAFETY: the guard is held by this thread and not used until the
        // mutex is taken again below.
        unsafe { mutex.force_unlock() };
        futex_wait(&self.counter, seen, timeout);
        // SAFETY: the mutex is taken again for the guard that still exists
        // (it was released above without dropping the guard).
        unsafe { lock_api::RawMutex::lock(mutex.raw()) };
        self.waiters.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    #[test]
    fn a_mutex_keeps_its_counter_exact_under_many_threads() {
        let m = Arc::new(Mutex::new((0u64, 0u64)));
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..20_000 {
                        let mut g = m.lock();
                        // Two fields written apart: a second holder would
                        // see them differ.
                        assert_eq!(g.0, g.1);
                        g.0 += 1;
                        std::hint::spin_loop();
                        g.1 += 1;
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(*m.lock(), (160_000, 160_000));
        assert!(!m.is_locked());
    }

    #[test]
    fn readers_share_and_a_writer_is_alone() {
        let l = Arc::new(RwLock::new((0u64, 0u64)));
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let (l, stop) = (l.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut reads = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let g = l.read();
                        assert_eq!(g.0, g.1, "a reader saw a write half done");
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        let writers: Vec<_> = (0..3)
            .map(|_| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..5_000 {
                        let mut g = l.write();
                        g.0 += 1;
                        std::hint::spin_loop();
                        g.1 += 1;
                    }
                })
            })
            .collect();
        // Writers finish although readers never stop coming: a waiting
        // writer holds new readers off.
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
        assert!(reads > 0);
        assert_eq!(*l.read(), (15_000, 15_000));
        // Two readers at once.
        let a = l.read();
        assert!(l.try_read().is_some());
        assert!(l.try_write().is_none());
        drop(a);
        assert!(l.try_write().is_some());
    }

    #[test]
    fn a_condvar_hands_every_item_over_and_a_timed_wait_times_out() {
        let q = Arc::new((Mutex::new(Vec::<u32>::new()), Condvar::new()));
        let consumer = {
            let q = q.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                let mut g = q.0.lock();
                while got.len() < 10_000 {
                    if let Some(v) = g.pop() {
                        got.push(v);
                    } else {
                        q.1.wait(&mut g);
                    }
                }
                got
            })
        };
        for i in 0..10_000 {
            q.0.lock().push(i);
            q.1.notify_one();
        }
        let mut got = consumer.join().unwrap();
        got.sort_unstable();
        assert_eq!(got, (0..10_000).collect::<Vec<_>>());

        let mut g = q.0.lock();
        let t0 = Instant::now();
        assert!(q.1.wait_for(&mut g, Duration::from_millis(30)).timed_out());
        assert!(t0.elapsed() >= Duration::from_millis(30));
        let past = Instant::now();
        assert!(q.1.wait_until(&mut g, past).timed_out());
    }

    #[test]
    fn a_lock_held_through_a_fork_is_free_in_the_child_after_reset() {
        let m = Arc::new(Mutex::new(7u32));
        // A thread sleeps on the lock at the fork: its state says so.
        let g = m.lock();
        let sleeper = {
            let m = m.clone();
            std::thread::spawn(move || *m.lock())
        };
        while m.sleepers() == 0 {
            std::thread::yield_now();
        }
        std::mem::forget(g);
        // SAFETY: the child only resets the lock, takes it and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // SAFETY: held through the forgotten guard; the only thread.
            unsafe { m.raw().reset() };
            let ok = m.try_lock().is_some_and(|v| *v == 7);
            // SAFETY: exiting the child without running the parent's
            // destructors or exit handlers.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
        // SAFETY: this thread holds it through the forgotten guard.
        unsafe { m.force_unlock() };
        assert_eq!(sleeper.join().unwrap(), 7);
    }

    trait Sleepers {
        fn sleepers(&self) -> u32;
    }
    impl<T> Sleepers for Mutex<T> {
        fn sleepers(&self) -> u32 {
            // SAFETY: only reads the count.
            unsafe { self.raw().sleepers.load(Ordering::Relaxed) }
        }
    }
}
