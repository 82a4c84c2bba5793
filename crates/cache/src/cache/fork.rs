//! Fork: what a program's `pthread_atfork` hooks call so that a forked
//! child gets a working cache of its own, holding every page the parent's
//! held at the fork, without reading any of them into memory.
//!
//! 1. `fork_prepare` (parent, before `fork`) takes every lock of the cache
//!    in the lock order of `mod.rs`, then the pool's (`Zpool::fork_prepare`)
//!    and the sealer's, and keeps them: a thread inside the cache finishes
//!    its step first (a writeback batch its I/O), so the child's copy is
//!    consistent. With a backing tier it also opens a pipe.
//! 2. `fork_child` (child, where only the forking thread exists):
//!    - the backing store is shared with the parent. Where the store can
//!      (`BackingStore::shares_at_fork`: the file), both keep the slots
//!      used at the fork where they are, shared, written and discarded by
//!      neither again, and each writes new slots to a file of its own
//!      (`BackingStore::fork_share`, numbered on from the next file's
//!      first slot); the parent opened its next file in `fork_prepare`,
//!      where a failure still leaves the copy. Otherwise (a remote tier, or
//!      the parent could not open a file) the parent would reuse slots the
//!      child still needs: the child copies the used slots to a store of
//!      its own (`BackingStore::fork_private`, holes left out) and tells
//!      the parent through the pipe;
//!    - the sealer's key and sequence numbers were the parent's too: the
//!      child seals under a fresh key from here on (`Sealer::rekey`);
//!    - the locks are released; threads start only in `fork_child_start`,
//!      once the caller has released every other lock the prepare hooks
//!      hold (a thread started earlier could block on one of them).
//! 3. `fork_parent` shares its slots as the child does, or waits (at
//!    most `COPY_WAIT`) until the child has copied them or died, then
//!    releases the locks. Until then no slot of the parent is freed or
//!    written.
//!
//! The pool's pages and the index are the child's copy-on-write copy: both
//! processes go on with them independently.

use super::{Cache, Seals, RELAXED};
use crate::backing::SlotMap;
use crate::sys;
use std::os::fd::AsRawFd;
use std::time::Duration;
use uzswap_os::fork::{AfterFork, Side};

/// The slot numbers of one backing file: a file shared at a fork keeps
/// its numbers, and the next file's start this far above its first.
const FILE_SLOTS: u64 = 1 << 40;

/// How long the parent waits for a child to copy the backing file before it
/// goes on (a child that takes longer finds reused slots, which fail their
/// seal check: a loud error, never wrong bytes).
const COPY_WAIT: Duration = Duration::from_secs(120);

/// What a forked child could not set up.
#[derive(Debug, thiserror::Error)]
pub enum ForkError {
    /// The child's copy of the backing file could not be made.
    #[error("cannot copy the backing file for the forked child ({0}); free space where the backing file is, or fork before pages are written back")]
    Backing(std::io::Error),
    /// No fresh key for the child's writes.
    #[error("cannot draw a fresh key for the forked child: {0}")]
    Random(std::io::Error),
    /// The writer thread did not start.
    #[error("cannot start the forked child's writer thread: {0}")]
    Thread(std::io::Error),
}

impl Cache {
    /// Before `fork()`: takes every lock of the cache and keeps it. Must be
    /// followed, on the same thread, by [`Cache::fork_parent`] in the parent
    /// or [`Cache::fork_child`] in the child.
    pub fn fork_prepare(&self) {
        let i = &*self.inner;
        // Where the store can share its slots, the parent's next file is
        // opened now, before any lock is taken (a system call that may
        // fail: then the child copies instead). The plan is made under
        // the slot map's lock below: a writeback may have used the first
        // slots meanwhile.
        let can_share = i.backing.as_ref().is_some_and(|b| b.shares_at_fork());
        let prepared = can_share
            && i.slots.lock().used() > 0
            && i.backing
                .as_ref()
                .is_some_and(|b| b.fork_share_prepare().is_ok());
        // A pipe for the child's "copied" (if there is a store to copy).
        let pipe = i.backing.as_ref().and_then(|_| sys::pipe().ok());
        std::mem::forget(i.wb_gate.write());
        let slots = i.slots.lock();
        let used = slots.used();
        let share = can_share && (used == 0 || prepared);
        // With slots in use, the next file's numbers start above them all;
        // with none, the child's file starts where the parent's does.
        let next = if used > 0 {
            slots.base() + FILE_SLOTS
        } else {
            slots.base()
        };
        *self.fork_share.lock() = share.then_some((next, used));
        *self.fork_pipe.lock() = pipe.filter(|_| !share);
        std::mem::forget(slots);
        for s in i.shards.iter() {
            std::mem::forget(s.lock());
        }
        i.dedup.fork_lock();
        i.pool.fork_prepare();
        std::mem::forget(i.sealer.write());
        std::mem::forget(i.wake.0.lock());
        std::mem::forget(i.seals.lock());
        if let Some(b) = &i.backing {
            b.fork_lock();
        }
    }

    /// After `fork()`, in the parent: moves to its next backing file (the
    /// slots so far stay shared), or waits until the child has made its
    /// copy of the store (or died, or `COPY_WAIT` passed); then releases
    /// every lock.
    ///
    /// # Safety
    /// Only after [`Cache::fork_prepare`] on this thread, in the parent.
    pub unsafe fn fork_parent(&self) {
        if let Some((next, live)) = self.fork_share.lock().take() {
            // SAFETY: fork_prepare took the slot map's and the seals' locks
            // on this thread and forgot the guards; they are released
            // below, not before.
            let (slots, seals) = unsafe {
                (
                    &mut *self.inner.slots.data_ptr(),
                    &mut *self.inner.seals.data_ptr(),
                )
            };
            self.share_slots(Side::Parent, slots, seals, next, live)
                .expect("the parent's next backing file was opened before the fork");
        }
        if let Some((rx, tx)) = self.fork_pipe.lock().take() {
            drop(tx); // the child's end alone: EOF if it dies
                      // EINTR or a timeout: go on (see COPY_WAIT).
            sys::wait_readable(rx.as_raw_fd(), COPY_WAIT);
        }
        // SAFETY: fork_prepare took every lock on this thread.
        unsafe {
            self.fork_unlock(false);
        }
    }

    /// After `fork()`, in the child: releases every lock, moves to a
    /// backing file of its own (the slots so far shared with the parent,
    /// or copied where the store cannot share) and takes a fresh key.
    /// Starts no thread (see [`Cache::fork_child_start`]). An error leaves the child's cache
    /// without a safe backing tier: the caller must not go on using it.
    ///
    /// # Safety
    /// Only after [`Cache::fork_prepare`] on this thread, in the child (the
    /// only thread there).
    pub unsafe fn fork_child(&self) -> Result<(), ForkError> {
        let pipe = self.fork_pipe.lock().take();
        // SAFETY: fork_prepare took every lock on this thread; this is the
        // child, where no other thread exists to race the steps below.
        unsafe { self.fork_unlock(true) };
        let i = &*self.inner;
        let share = self.fork_share.lock().take();
        if let Some(b) = &i.backing {
            match share {
                Some((next, live)) => self
                    .share_slots(
                        Side::Child,
                        &mut i.slots.lock(),
                        &mut i.seals.lock(),
                        next,
                        live,
                    )
                    .map_err(ForkError::Backing)?,
                None => {
                    let end = i.slots.lock().end();
                    b.fork_private(end).map_err(ForkError::Backing)?;
                }
            }
            i.sealer
                .write()
                .rekey(i.seq.load(RELAXED))
                .map_err(ForkError::Random)?;
        }
        if let Some((rx, tx)) = pipe {
            drop(rx);
            let _ = sys::write_byte(tx.as_raw_fd(), 1);
        }
        Ok(())
    }

    /// Both sides of a fork that shares the backing store's slots: the
    /// store moves to a file of its own whose first slot is `next`, and
    /// the slot map starts over there.
    fn share_slots(
        &self,
        side: Side,
        slots: &mut SlotMap,
        seals: &mut Seals,
        next: u64,
        live: u64,
    ) -> std::io::Result<()> {
        let Some(b) = &self.inner.backing else {
            return Ok(());
        };
        // With nothing to share (`next` is the current file's first slot)
        // the parent goes on with its file and the child takes a new one.
        // SAFETY: the parent calls this between the store's fork_lock and
        // fork_unlock (fork_parent), the child after fork_unlock as its
        // only thread (fork_child).
        unsafe { b.fork_share(side, next, live) }?;
        if next != slots.base() {
            slots.rebase(next);
            seals.rebase(next);
        }
        Ok(())
    }

    /// In the child, after [`Cache::fork_child`], once every lock of the
    /// process that a parent thread could have waited on is released (a new
    /// thread may be given such a thread's stack, see
    /// `Zpool::fork_child`): starts the pool's threads and the writer.
    pub fn fork_child_start(&self) -> Result<(), ForkError> {
        self.inner.pool.fork_child_start();
        // The parent's writer thread is not here; its handle must never be
        // joined from this process.
        let mut w = self.writer.lock();
        if let Some(old) = w.take() {
            std::mem::forget(old);
            let inner = self.inner.clone();
            let t = uzswap_os::spawn_helper_warmed(
                "uzswap-writer",
                self.thread_start,
                crate::warm_thread,
                move || inner.writer_loop(),
            )
            .map_err(ForkError::Thread)?;
            *w = Some(t);
        }
        Ok(())
    }

    /// Releases what `fork_prepare` took, in the reverse order; in the
    /// child the pool restarts its threads, and the writer's condition
    /// variable forgets the parent's waiters.
    ///
    /// # Safety
    /// Only after [`Cache::fork_prepare`] on this thread.
    unsafe fn fork_unlock(&self, child: bool) {
        let i = &*self.inner;
        let side = if child { Side::Child } else { Side::Parent };
        // SAFETY: fork_prepare took each of these locks on this thread and
        // forgot the guard; nothing released them since; with `Child` this
        // is the child's only thread (the caller's contract). The same
        // holds for every block below.
        unsafe {
            if let Some(b) = &i.backing {
                b.fork_unlock(side);
            }
            i.seals.after_fork(side);
            i.wake.1.after_fork(side);
            i.wake.0.after_fork(side);
            i.sealer.after_fork(side);
            if child {
                i.pool.fork_child();
            } else {
                i.pool.fork_parent();
            }
            i.dedup.fork_unlock(side);
        }
        for s in i.shards.iter() {
            // SAFETY: as above.
            unsafe { s.after_fork(side) };
        }
        // SAFETY: as above.
        unsafe {
            i.slots.after_fork(side);
            i.wb_gate.after_fork(side);
        }
    }
}
