//! Releasing, after a `fork()`, the locks that a `pthread_atfork` prepare
//! hook took and kept (their guards were forgotten): the allocator's
//! (`Zpool::fork_prepare`), the cache's, the pager's and the preload
//! runtime's all go through [`AfterFork`].
//!
//! In the parent a lock is simply released, waking a thread that waits on
//! it. In the child, whose only thread is the forking one, a lock is reset:
//! its word is written free ([`crate::lock::RawMutex::reset`]). The threads
//! that the word may count as waiting were the parent's; they are not in
//! the child, and nothing but that word refers to them (the locks of
//! [`crate::lock`] keep no table of waiters, unlike parking_lot's, whose
//! process-wide table could be left locked in the child by a parent thread
//! inside it at the instant of the fork: a bash child under `uzswap run`
//! would hang there about once in twenty forks). A
//! condition variable needs nothing: waiting on one is a futex wait on its
//! counter, and the count of waiters only saves a wake-up call, so the
//! parent's stale count costs at most one system call per notify.
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
    /// its guard forgotten): in the parent as an unlock, in the child by
    /// resetting its word. For a condvar: nothing.
    ///
    /// # Safety
    /// For a lock, this thread holds it (exclusively) through a forgotten
    /// guard and uses nothing it guards afterwards. With `Side::Child`, this
    /// thread is the only one in the process.
    unsafe fn after_fork(&self, side: Side);
}

impl<T> AfterFork for crate::lock::Mutex<T> {
    unsafe fn after_fork(&self, side: Side) {
        match side {
            // SAFETY: the caller holds the mutex through a forgotten guard
            // and, in the child, is the only thread.
            Side::Child => unsafe { self.raw().reset() },
            // SAFETY: the caller holds the mutex through a forgotten guard.
            Side::Parent => unsafe { self.force_unlock() },
        }
    }
}

impl<T> AfterFork for crate::lock::RwLock<T> {
    unsafe fn after_fork(&self, side: Side) {
        match side {
            // SAFETY: the caller holds the write lock through a forgotten
            // guard and, in the child, is the only thread.
            Side::Child => unsafe { self.raw().reset() },
            // SAFETY: the caller holds the write lock through a forgotten
            // guard.
            Side::Parent => unsafe { self.force_unlock_write() },
        }
    }
}

impl AfterFork for crate::lock::Condvar {
    /// Nothing to undo (see the module docs).
    unsafe fn after_fork(&self, _: Side) {}
}

// The model checker's primitives (uzswap_os::sync's shim under the
// feature; without it they are crate::lock's, above).
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

/// In a forked child, for a lock no prepare hook took: takes what `m`
/// holds, leaving the default. A parent thread may have held it at the
/// fork; that thread is not in the child, and the lock stays held there.
/// Then the lock is reset and what it guarded, perhaps half changed, is
/// left unread (leaked, never dropped): `None`.
///
/// # Safety
/// The calling thread is the only one in the process (a fork's child
/// hook), so a held lock's holder was a parent thread.
pub unsafe fn take_in_child<T: Default>(m: &crate::lock::Mutex<T>) -> Option<T> {
    if let Some(mut held) = m.try_lock() {
        return Some(std::mem::take(&mut *held));
    }
    // SAFETY: the holder was a thread of the parent (the caller's
    // contract), and nothing but the lock's word refers to its waiters
    // (see the module docs); the value is overwritten without being read
    // or dropped.
    unsafe {
        m.raw().reset();
        std::ptr::write(m.data_ptr(), T::default());
    }
    None
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
        // A full table only leaves the thread out of the CPU accounting.
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

/// In a forked child: the parent's helper threads are not here.
pub fn forget_helpers() {
    for s in &HELPERS {
        s.store(0, std::sync::atomic::Ordering::Release);
    }
}
