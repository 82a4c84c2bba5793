//! The synchronization primitives of the allocator's and the cache's
//! protocols, in one place so that tests can swap them for shuttle's
//! model-checked ones (cargo feature `shuttle`): under that feature every
//! lock, atomic, thread and thread-local taken from here is scheduled by
//! shuttle, which explores interleavings.
//!
//! The primitives are [`crate::lock`]'s (futex words, no table of waiters,
//! safe to release in a forked child) with parking_lot's API (no
//! poisoning), plus [`wait`] and [`wait_for`], which take and return the
//! guard so both backends fit.
//!
//! The zpool and cache crates both take their primitives from here, and
//! each one's `shuttle` feature turns on this crate's, so one feature
//! switch puts the allocator and the cache together under the model
//! checker. Its `thread_local!` is shuttle's under the feature: shuttle
//! runs every model thread on one OS thread, so per-thread scratch buffers
//! held across a lock would otherwise be shared between model threads.
//!
//! What the model checker need not schedule (statistics counters, the
//! backing store's test-only fault switch, the xcf allocator, which is not
//! model-checked) takes std's types or [`crate::lock`]'s directly.

#[cfg(not(feature = "shuttle"))]
mod imp {
    pub use crate::lock::{Condvar, Mutex, MutexGuard, RwLock};
    pub use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize};
    pub use std::thread;
    pub use std::thread_local;

    /// Blocks on `cv` until notified (or spuriously: callers re-check).
    pub fn wait<'a, T>(cv: &Condvar, mut guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        cv.wait(&mut guard);
        guard
    }

    /// Blocks on `cv` until notified or `timeout` passed.
    pub fn wait_for<'a, T>(
        cv: &Condvar,
        mut guard: MutexGuard<'a, T>,
        timeout: std::time::Duration,
    ) -> MutexGuard<'a, T> {
        cv.wait_for(&mut guard, timeout);
        guard
    }
}

#[cfg(feature = "shuttle")]
mod imp {
    pub use shuttle::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize};
    pub use shuttle::sync::MutexGuard;
    pub use shuttle::thread;
    pub use shuttle::thread_local;

    /// A mutex with parking_lot's API over shuttle's.
    #[derive(Default)]
    pub struct Mutex<T>(shuttle::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub fn new(v: T) -> Self {
            Mutex(shuttle::sync::Mutex::new(v))
        }
        pub fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().expect("no poisoning under test")
        }
        pub fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().expect("no poisoning under test")
        }
    }

    /// A reader-writer lock with parking_lot's API over shuttle's.
    pub struct RwLock<T>(shuttle::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub fn new(v: T) -> Self {
            RwLock(shuttle::sync::RwLock::new(v))
        }
        pub fn read(&self) -> shuttle::sync::RwLockReadGuard<'_, T> {
            self.0.read().expect("no poisoning under test")
        }
        pub fn write(&self) -> shuttle::sync::RwLockWriteGuard<'_, T> {
            self.0.write().expect("no poisoning under test")
        }
    }

    #[derive(Default)]
    pub struct Condvar(shuttle::sync::Condvar);

    impl Condvar {
        pub fn new() -> Self {
            Condvar(shuttle::sync::Condvar::new())
        }
        pub fn notify_one(&self) {
            self.0.notify_one();
        }
        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    pub fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        cv.0.wait(guard).expect("no poisoning under test")
    }

    /// Shuttle's timed wait never times out: a waiter is woken only by a
    /// notification, which the code under test must therefore send.
    pub fn wait_for<'a, T>(
        cv: &Condvar,
        guard: MutexGuard<'a, T>,
        timeout: std::time::Duration,
    ) -> MutexGuard<'a, T> {
        cv.0.wait_timeout(guard, timeout)
            .expect("no poisoning under test")
            .0
    }
}

pub use imp::*;
