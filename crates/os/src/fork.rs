//! Releasing, after a `fork()`, the locks that a `pthread_atfork` prepare
//! hook took and kept (their guards were forgotten): the allocator's
//! (`Zpool::fork_prepare`), the cache's, the pager's and the preload
//! runtime's all go through [`AfterFork`].
//!
//! In the parent a lock is simply force-unlocked. In the child that is not
//! enough with parking_lot: its waiters sit in one global table (keyed by
//! the lock's address, kept in ordinary memory, so the child has a copy of
//! it), and a parent thread that was parked on a pool lock at the fork is
//! still listed there, although it does not exist in the child. Unlocking
//! would pick that dead thread, and parking_lot's eventual fairness may
//! *hand the lock over* to it instead of unlocking: the lock would then stay
//! held forever. Listed first, the dead thread would also take the
//! wake-up meant for a live waiter later on. So in the child the dead
//! waiters of every lock (and of the compactor's condvar) are removed from
//! the table first ([`parking_lot_core::unpark_all`] on the lock's keys;
//! the wake-up it sends goes to a thread that does not exist, which is
//! harmless), and the lock is released after.
//!
//! The keys are the address of the raw lock (and that address plus one,
//! the queue of a writer waiting for readers to leave an `RwLock`), and the
//! address of the condvar: parking_lot's own choice, the same in every
//! release so far. The allocator's `tests/fork.rs` forks while a thread is
//! parked on a pool lock, so a change there shows as a failing test.
//!
//! A parent thread that held one of the table's bucket locks at the instant
//! of the fork (a few instructions around each park and unpark of any
//! parking_lot lock in the process) would leave that bucket locked in the
//! child, which then blocks the first time it parks or unparks anything
//! hashed to it. The helper threads are the ones that park here (on the
//! very locks the prepare hooks hold), so the last prepare hook calls
//! [`settle_helpers`]: it waits until every helper thread
//! ([`crate::spawn_helper`]) is asleep, and a sleeping thread holds no
//! bucket lock (its holder never sleeps inside, it can only be preempted,
//! and is then runnable). What remains is a helper woken by a timeout in
//! the microseconds between that check and the fork; and a program of its
//! own that uses parking_lot from several threads has the window anyway.
//! The window is real: on 2026-11-26 (522e0e3) a child of bash forked for a
//! command substitution (pyenv's `python3` shim, under `uzswap run`) hung
//! in `forget_waiters`, on a bucket lock of the table, once in about twenty
//! runs of the shim; the evictor, which waits with a 10 ms timeout while
//! it charges, is the likely holder. Closing it needs the helpers out of
//! every timed wait before the fork (open, issue 28).
//!
//! Under the `shuttle` feature the shim's locks are the model checker's,
//! which never forks: releasing them panics there.

/// Which process a lock is released in after the fork.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Side {
    Parent,
    /// The child, where the calling thread is the only one.
    Child,
}

/// Panics under the model checker, whose locks cannot be released by force
/// (and which never forks anyway).
pub fn check_supported() {
    if cfg!(feature = "shuttle") {
        panic!(
            "Zpool::fork_* is not available under the `shuttle` feature: the model checker's \
             locks cannot be held across a fork (and it never forks)"
        );
    }
}

/// A primitive that `fork_prepare` left in a state to be undone after the
/// fork.
pub trait AfterFork {
    /// For a lock: releases it (held by this thread since `fork_prepare`,
    /// its guard forgotten), in the child after removing the parent's
    /// parked threads from parking_lot's table. For a condvar: in the child,
    /// removes the parent's parked threads; nothing in the parent.
    ///
    /// # Safety
    /// For a lock, this thread holds it (exclusively) through a forgotten
    /// guard and uses nothing it guards afterwards. With `Side::Child`, this
    /// thread is the only one in the process.
    unsafe fn after_fork(&self, side: Side);
}

/// Removes every thread parked under `key` from parking_lot's table.
///
/// # Safety
/// `key` is a key of a primitive of ours, and no thread of this process
/// waits under it (in the child, the listed threads are the parent's).
unsafe fn forget_waiters(key: usize) {
    // SAFETY: the key is ours (per the contract), and the threads listed
    // under it do not exist: waking them writes only to their (copied, still
    // mapped) thread data and makes a futex call nobody waits for.
    unsafe { parking_lot_core::unpark_all(key, parking_lot_core::DEFAULT_UNPARK_TOKEN) };
}

impl<T> AfterFork for parking_lot::Mutex<T> {
    unsafe fn after_fork(&self, side: Side) {
        if side == Side::Child {
            // SAFETY: `raw` is used only for its address, the key
            // parking_lot parks the mutex's waiters under; the caller says
            // this thread is the only one.
            unsafe { forget_waiters(self.raw() as *const parking_lot::RawMutex as usize) };
        }
        // SAFETY: the caller holds the mutex through a forgotten guard.
        unsafe { self.force_unlock() };
    }
}

impl<T> AfterFork for parking_lot::RwLock<T> {
    unsafe fn after_fork(&self, side: Side) {
        if side == Side::Child {
            // SAFETY: `raw` is used only for its address: parking_lot parks
            // a lock's waiters under it, and a writer waiting for readers
            // under it plus one. The caller says this thread is the only one.
            unsafe {
                let key = self.raw() as *const parking_lot::RawRwLock as usize;
                forget_waiters(key);
                forget_waiters(key + 1);
            }
        }
        // SAFETY: the caller holds the write lock through a forgotten guard.
        unsafe { self.force_unlock_write() };
    }
}

impl AfterFork for parking_lot::Condvar {
    unsafe fn after_fork(&self, side: Side) {
        if side == Side::Child {
            // SAFETY: parking_lot parks a condvar's waiters under its
            // address; the caller says this thread is the only one.
            unsafe { forget_waiters(self as *const parking_lot::Condvar as usize) };
        }
    }
}

// The model checker's primitives (uzswap_os::sync's shim under the
// feature; without it they are parking_lot's, above).
#[cfg(feature = "shuttle")]
impl<T> AfterFork for crate::sync::Mutex<T> {
    unsafe fn after_fork(&self, _: Side) {
        check_supported();
    }
}

#[cfg(feature = "shuttle")]
impl<T> AfterFork for crate::sync::RwLock<T> {
    unsafe fn after_fork(&self, _: Side) {
        check_supported();
    }
}

#[cfg(feature = "shuttle")]
impl AfterFork for crate::sync::Condvar {
    unsafe fn after_fork(&self, _: Side) {
        check_supported();
    }
}

/// The helper threads alive ([`crate::spawn_helper`]), by kernel thread id;
/// 0 is a free slot. Lock-free, so that a thread registering at the fork
/// leaves nothing locked in the child.
static HELPERS: [std::sync::atomic::AtomicI32; 512] =
    [const { std::sync::atomic::AtomicI32::new(0) }; 512];

/// The kernel thread ids of the helper threads alive now.
pub fn helper_tids() -> impl Iterator<Item = i32> {
    HELPERS
        .iter()
        .map(|s| s.load(std::sync::atomic::Ordering::Acquire))
        .filter(|&t| t != 0)
}

/// Lists the calling helper thread while it lives.
pub(crate) struct HelperGuard(Option<usize>);

impl HelperGuard {
    pub(crate) fn enter() -> HelperGuard {
        use std::sync::atomic::Ordering;
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        // A full table only leaves the thread out of `settle_helpers`.
        let slot = HELPERS.iter().position(|s| {
            s.compare_exchange(0, tid, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        });
        HelperGuard(slot)
    }
}

impl Drop for HelperGuard {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            HELPERS[i].store(0, std::sync::atomic::Ordering::Release);
        }
    }
}

/// Waits, at most `limit`, until every helper thread of this process is
/// asleep (state `S` or `D` in `/proc/self/task/TID/stat`) or gone. Call in
/// the last `pthread_atfork` prepare hook, after every lock is held: see
/// the module docs. Returns whether they all were.
pub fn settle_helpers(limit: std::time::Duration) -> bool {
    use std::sync::atomic::Ordering;
    let until = std::time::Instant::now() + limit;
    loop {
        let busy = HELPERS.iter().any(|s| {
            let tid = s.load(Ordering::Acquire);
            tid != 0 && !asleep(tid)
        });
        if !busy {
            return true;
        }
        if std::time::Instant::now() >= until {
            return false;
        }
        // nanosleep: no lock of any kind.
        std::thread::sleep(std::time::Duration::from_micros(50));
    }
}

/// Whether thread `tid` of this process sleeps (or no longer exists).
fn asleep(tid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")) else {
        return true;
    };
    // The state follows the command, which is in parentheses and may hold
    // spaces or parentheses itself.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    matches!(state, Some("S" | "D" | "Z" | "X"))
}

/// In a forked child: the parent's helper threads are not here.
pub fn forget_helpers() {
    for s in &HELPERS {
        s.store(0, std::sync::atomic::Ordering::Release);
    }
}

/// Sets up the calling thread's entry for parking_lot's table now. Its
/// first use registers a thread-local destructor, which takes the dynamic
/// loader's lock; a helper thread that would first park while a program
/// thread holds that lock (inside `dlopen`) and waits on a fault only the
/// helper can resolve would never go on. [`crate::spawn_helper`] calls it
/// before the new thread counts as started.
pub fn warm_thread() {
    // A park whose validation fails returns at once; getting there creates
    // the thread's entry. The key is this function's own address, which no
    // lock uses.
    let key = warm_thread as *const () as usize;
    // SAFETY: the validation callback fails, so nothing is parked; the
    // callbacks do nothing else.
    unsafe {
        parking_lot_core::park(
            key,
            || false,
            || {},
            |_, _| {},
            parking_lot_core::DEFAULT_PARK_TOKEN,
            None,
        );
    }
}
