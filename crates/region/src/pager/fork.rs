//! Fork: the `pthread_atfork` hooks that stop eviction and bring every
//! evicted page back before `fork()`, so that the child (which has no
//! handler) reads real bytes.

use super::handler::PageBuf;
use super::state::PageState;
use super::Shared;
use crate::sys::{self, PAGE_SIZE};
use parking_lot::Mutex;
use std::sync::{Arc, Weak};

/// Every pager of the process (the hooks skip the dropped ones).
static REGISTRY: Mutex<Vec<Weak<Shared>>> = parking_lot::const_mutex(Vec::new());
/// The pagers whose gate `fork_prepare` holds, for the parent and child
/// hooks to release.
static FORK_HELD: Mutex<Vec<Arc<Shared>>> = parking_lot::const_mutex(Vec::new());
static ATFORK: std::sync::Once = std::sync::Once::new();

/// Lists a new pager for the fork hooks (installed with the first pager).
pub(super) fn register(sh: &Arc<Shared>) {
    REGISTRY.lock().push(Arc::downgrade(sh));
    ATFORK.call_once(|| {
        sys::atfork(fork_prepare, fork_parent, fork_child).expect("pthread_atfork");
    });
}

/// The gate is the one lock taken without a guard: it is taken here and
/// released in `fork_parent` or `fork_child`, other calls of the same
/// thread; the guard is forgotten and the lock released by hand there.
unsafe extern "C" fn fork_prepare() {
    let list: Vec<Arc<Shared>> = REGISTRY
        .lock()
        .iter()
        .filter_map(Weak::upgrade)
        .filter(|s| s.cfg.fork_prefault && s.pid == sys::getpid())
        .collect();
    for s in &list {
        std::mem::forget(s.gate.lock());
        s.prefault_all_locked();
    }
    *FORK_HELD.lock() = list;
}

unsafe extern "C" fn fork_parent() {
    for s in std::mem::take(&mut *FORK_HELD.lock()) {
        // SAFETY: fork_prepare locked the gate of every pager in FORK_HELD
        // on this thread, forgot the guard, and nothing unlocked it since.
        unsafe { s.gate.force_unlock() };
        let _g = s.state.lock();
        s.work_cv.notify_one();
    }
}

unsafe extern "C" fn fork_child() {
    let held = std::mem::take(&mut *FORK_HELD.lock());
    for s in &held {
        // SAFETY: as in fork_parent; the child's copy of the lock is held by
        // the (only) thread that runs this hook.
        unsafe { s.gate.force_unlock() };
    }
    // The child never uses the pager: keep the references from running
    // any destructor there.
    std::mem::forget(held);
}

impl Shared {
    /// Brings every stored page back, write-protected and clean. The gate
    /// must be held (no eviction in flight).
    pub(super) fn prefault_all_locked(&self) -> usize {
        let mut buf = PageBuf::new(1);
        let mut n = 0;
        let todo: Vec<(usize, u32, u64)> = {
            let s = self.state.lock();
            let mut v = Vec::new();
            for (start, seg) in &s.segs {
                let a = &s.areas[&seg.area];
                for i in 0..seg.len / PAGE_SIZE {
                    let p = seg.first + i as u64;
                    if matches!(
                        a.meta[p as usize].st,
                        PageState::Stored | PageState::Loading
                    ) {
                        v.push((start + i * PAGE_SIZE, seg.area, p));
                    }
                }
            }
            v
        };
        for (addr, area, page) in todo {
            if self.prefault_page(addr, area, page, &mut buf) {
                n += 1;
            }
        }
        let mut s = self.state.lock();
        s.stats.fork_prefaults += 1;
        s.stats.fork_prefault_pages += n as u64;
        s.stats.peak_resident_pages = s.stats.peak_resident_pages.max(s.resident as u64);
        n
    }
}
