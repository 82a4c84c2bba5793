//! The allocator's synchronization primitives, in one place so that tests
//! can swap them for shuttle's model-checked ones (cargo feature
//! `shuttle`): under that feature every lock, atomic and thread of the pool
//! is scheduled by shuttle, which explores interleavings.
//!
//! The API is parking_lot's (no poisoning), plus [`wait`], which takes and
//! returns the guard so both backends fit.

#[cfg(not(feature = "shuttle"))]
mod imp {
    pub(crate) use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};
    pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64};
    pub(crate) use std::thread;

    /// Blocks on `cv` until notified.
    pub(crate) fn wait<'a, T>(cv: &Condvar, mut guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        cv.wait(&mut guard);
        guard
    }
}

#[cfg(feature = "shuttle")]
mod imp {
    pub(crate) use shuttle::sync::atomic::{AtomicBool, AtomicU64};
    pub(crate) use shuttle::sync::MutexGuard;
    pub(crate) use shuttle::thread;

    /// A mutex with parking_lot's API over shuttle's.
    #[derive(Default)]
    pub(crate) struct Mutex<T>(shuttle::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(v: T) -> Self {
            Mutex(shuttle::sync::Mutex::new(v))
        }
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().expect("no poisoning under test")
        }
        pub(crate) fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().expect("no poisoning under test")
        }
    }

    /// A reader-writer lock with parking_lot's API over shuttle's.
    pub(crate) struct RwLock<T>(shuttle::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(v: T) -> Self {
            RwLock(shuttle::sync::RwLock::new(v))
        }
        pub(crate) fn read(&self) -> shuttle::sync::RwLockReadGuard<'_, T> {
            self.0.read().expect("no poisoning under test")
        }
        pub(crate) fn write(&self) -> shuttle::sync::RwLockWriteGuard<'_, T> {
            self.0.write().expect("no poisoning under test")
        }
    }

    #[derive(Default)]
    pub(crate) struct Condvar(shuttle::sync::Condvar);

    impl Condvar {
        pub(crate) fn new() -> Self {
            Condvar(shuttle::sync::Condvar::new())
        }
        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }
        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    pub(crate) fn wait<'a, T>(cv: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        cv.0.wait(guard).expect("no poisoning under test")
    }
}

pub(crate) use imp::*;
