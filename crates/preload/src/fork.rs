//! The fork hooks of this library (`pthread_atfork`, registered at
//! start-up after the pager's): new memory goes to glibc and the kernel
//! during the fork, the space and the ledger slot are held across it, and
//! a managed child takes its own slot and statistics socket.

use std::sync::atomic::Ordering;

use crate::start::start_cosched;
use crate::state::{
    enter_internal, leave_internal, mark_thread_internal, runtime, FORKED, FORKING, OWNER_PID,
};
use crate::{cosched, stats, sys};

pub(crate) extern "C" fn fork_prepare() {
    enter_internal();
    FORKING.store(true, Ordering::Release);
    cosched::before_fork();
    if let Some(rt) = runtime() {
        // Before any lock: the evictor makes the room, and its charge takes
        // the ledger slot's lock.
        rt.space.pager().make_room_for_fork();
        rt.space.lock_for_fork();
        if let Some(sh) = &rt.share {
            sh.hold_for_fork();
        }
    }
}

pub(crate) extern "C" fn fork_parent() {
    if let Some(rt) = runtime() {
        if let Some(sh) = &rt.share {
            // SAFETY: fork_prepare took it on this thread.
            unsafe { sh.release_after_fork() };
        }
        rt.space.unlock_after_fork();
    }
    cosched::after_fork_parent();
    FORKING.store(false, Ordering::Release);
    leave_internal();
}

/// The child of a `fork()` without exec: the pager's own hook, which ran
/// first, has taken over the child's copy of the memory (its evicted pages
/// stay evicted, in the child's copy of the pool and of the backing file),
/// so the child is managed like any process of the tree: it takes a slot
/// of its own in the ledger and answers `uzswap stats` on its own socket.
pub(crate) extern "C" fn fork_child() {
    cosched::after_fork_child();
    if let Some(rt) = runtime() {
        if let Some(sh) = &rt.share {
            // SAFETY: fork_prepare took it on this thread (the parent's,
            // of which this is the copy).
            unsafe { sh.release_after_fork() };
        }
        rt.space.unlock_after_fork();
        if !uzswap_region::fork_child_managed() {
            // The pager brought the parent's pages back for this fork: the
            // child runs unmanaged, as a small launcher or subshell should.
            FORKED.store(true, Ordering::Relaxed);
            FORKING.store(false, Ordering::Release);
            leave_internal();
            return;
        }
        OWNER_PID.store(std::process::id() as i32, Ordering::Relaxed);
        if let Some(sh) = &rt.share {
            if let Err(e) = sh.rejoin() {
                sys::warn(&format!(
                    "a forked child ({}) has no slot of its own in the budget's ledger: {e}; its memory counts as unreported",
                    std::process::id()
                ));
            }
        }
        if let Err(e) = stats::serve(mark_thread_internal) {
            sys::warn(&format!(
                "a forked child ({}) cannot answer uzswap stats: {e}",
                std::process::id()
            ));
        }
        start_cosched();
    }
    FORKING.store(false, Ordering::Release);
    leave_internal();
}
