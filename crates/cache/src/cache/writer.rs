//! The writer thread: sleeps until a store finds the pool filling up (or a
//! tick passes), then writes back until the pool is below its target, and
//! runs the proactive policies (`CacheConfig::proactive`).
//!
//! Wake-up protocol: `wake_pending` keeps stores from taking the wake lock
//! once a wake-up is on its way; the flag under `wake.0` is what the
//! thread waits on, so a notification sent before it sleeps is not lost.
//! `stop` ends the loop; [`Inner::stop_writer`] sets it and wakes the
//! thread, and `Drop for Cache` then joins it.

use super::{Inner, RELAXED};
use std::sync::atomic::Ordering;
use std::time::Duration;

impl Inner {
    /// Wakes the writer thread (if there is a backing tier), unless a
    /// wake-up is already on its way.
    pub(super) fn wake_writer(&self) {
        if self.backing.is_some() && !self.wake_pending.swap(true, RELAXED) {
            let mut w = self.wake.0.lock();
            *w = true;
            self.wake.1.notify_one();
        }
    }

    /// The writer thread's body: runs until `stop`.
    pub(super) fn writer_loop(&self) {
        let tick = if self.proactive.is_some() {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(1)
        };
        while !self.stop.load(Ordering::SeqCst) {
            {
                let mut w = self.wake.0.lock();
                if !*w {
                    w = uzswap_os::sync::wait_for(&self.wake.1, w, tick);
                }
                *w = false;
            }
            // The wake lock is dropped before any work: stores that find
            // the pool full meanwhile set the flag again (once
            // `wake_pending` is cleared) and the next round sees it.
            self.wake_pending.store(false, RELAXED);
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            self.reclaim();
            if let Some(b) = &self.backing {
                b.maintain();
            }
        }
    }

    /// Writes back until the pool is below its target; then the proactive
    /// policies.
    fn reclaim(&self) {
        let mut target = self.limit_share(self.accept_percent);
        let mut min_age = None;
        if let Some(p) = self.proactive {
            if let Some(share) = p.max_pool_percent_of_limit {
                target = target.min(self.limit_share(u64::from(share)));
            }
            min_age = p.max_age.map(|a| a.as_secs().max(1) as u32);
        }
        let high = if self.proactive.is_some() {
            target
        } else {
            self.limit_share((100 + self.accept_percent) / 2)
        };
        if self.pool.pool_bytes() >= high {
            let mut since_compact = 0;
            while self.pool.pool_bytes() > target && !self.stop.load(RELAXED) {
                let n = self.writeback_batch(self.batch, None);
                if self.proactive.is_some() {
                    self.counters
                        .proactive_written_back_pages
                        .fetch_add(n as u64, RELAXED);
                }
                since_compact += n;
                let payload = self.counters.stored_payload_bytes.load(RELAXED);
                // Freed objects become free pages only once their zspages
                // empty: compact when the pool holds much more than its data.
                if since_compact >= 256 && payload < self.pool.pool_bytes() / 10 * 9 {
                    self.pool.compact();
                    self.counters.writer_compactions.fetch_add(1, RELAXED);
                    since_compact = 0;
                }
                if n == 0 {
                    break;
                }
            }
        }
        if let Some(age) = min_age {
            loop {
                let n = self.writeback_batch(self.batch, Some(age));
                self.counters
                    .proactive_written_back_pages
                    .fetch_add(n as u64, RELAXED);
                if n == 0 || self.stop.load(RELAXED) {
                    break;
                }
            }
        }
    }

    /// Tells the writer thread to stop, and wakes it.
    pub(super) fn stop_writer(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let mut w = self.wake.0.lock();
        *w = true;
        self.wake.1.notify_all();
    }
}
