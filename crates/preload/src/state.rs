//! The runtime's state: whether it runs, the runtime itself, and which
//! threads are its own (their memory is never managed).

use libc::c_void;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};
use uzswap_cache::Cache;
use uzswap_contract::RunConfig;

use crate::{share, space};

/// Set once everything is running: from then on the program's `malloc` and
/// anonymous mappings are managed.
pub(crate) static READY: AtomicBool = AtomicBool::new(false);
/// A fork is between this library's prepare hook and its parent or child
/// hook: `malloc` and new mappings go to glibc and the kernel meanwhile.
/// The space's lock is held across the fork, and in the child the pager
/// starts its threads before this library's child hook releases it; a new
/// thread's start-up allocations come before it is marked internal.
pub(crate) static FORKING: AtomicBool = AtomicBool::new(false);
/// Set in a forked child that did not take over the pager (its parent
/// held few evicted pages and brought them back for the fork): nothing new
/// is managed there, its mappings are the kernel's.
pub(crate) static FORKED: AtomicBool = AtomicBool::new(false);
/// The process that set things up (a forked child is not it).
pub(crate) static OWNER_PID: AtomicI32 = AtomicI32::new(0);

/// Everything the runtime runs, set once by the constructor.
pub(crate) struct Runtime {
    pub(crate) space: space::Space,
    pub(crate) cache: Arc<Cache>,
    /// This process's slot in the tree's ledger, if `uzswap run` made one.
    pub(crate) share: Option<Arc<share::Share>>,
    pub(crate) config: RunConfig,
    pub(crate) started: std::time::Instant,
}

pub(crate) static RUNTIME: OnceLock<Runtime> = OnceLock::new();

thread_local! {
    /// Depth of "this thread is the runtime's own" (helper threads set it
    /// for good, the constructor and fork hook for their duration).
    static INTERNAL: Cell<u32> = const { Cell::new(0) };
}

/// Whether the calling thread is one of the runtime's own (its memory must
/// not be managed).
#[inline]
pub fn internal() -> bool {
    INTERNAL.with(|c| c.get() > 0)
}

pub(crate) fn enter_internal() {
    INTERNAL.with(|c| c.set(c.get() + 1));
}

pub(crate) fn leave_internal() {
    INTERNAL.with(|c| c.set(c.get().saturating_sub(1)));
}

/// Marks the calling thread internal while it lives.
pub(crate) struct InternalGuard(());

impl InternalGuard {
    pub(crate) fn enter() -> InternalGuard {
        enter_internal();
        InternalGuard(())
    }
}

impl Drop for InternalGuard {
    fn drop(&mut self) {
        leave_internal();
    }
}

/// Marks a helper thread of the pager or the cache for its whole life.
pub(crate) fn mark_thread_internal() {
    enter_internal();
}

/// The runtime, if the calling thread's memory is to be managed.
#[inline]
pub(crate) fn managed() -> Option<&'static Runtime> {
    if !READY.load(Ordering::Acquire)
        || internal()
        || FORKING.load(Ordering::Acquire)
        || FORKED.load(Ordering::Relaxed)
    {
        return None;
    }
    RUNTIME.get()
}

/// The runtime, if it is running in this process (whatever the calling
/// thread).
#[inline]
pub(crate) fn runtime() -> Option<&'static Runtime> {
    if !READY.load(Ordering::Acquire) || FORKED.load(Ordering::Relaxed) {
        return None;
    }
    RUNTIME.get()
}

/// Whether `p` came from the managed heap (also in a forked child, whose
/// inherited blocks still belong to mimalloc).
#[inline]
pub(crate) fn is_managed_ptr(p: *mut c_void) -> bool {
    READY.load(Ordering::Acquire) && RUNTIME.get().is_some_and(|rt| rt.space.owns(p as usize))
}
