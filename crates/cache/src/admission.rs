//! IO-aware admission: while the backing device is idle, a page
//! goes straight to the backing file (cheap, and the pool's memory is saved
//! for when it helps); only while the device is busy are pages taken into
//! the compressed pool, sparing the device.
//!
//! "Busy" means in-flight reads reach `read_limit` or in-flight writes reach
//! `write_limit` (a limit of 0 is not checked). With hysteresis the policy
//! does not flap: once busy
//! it stays busy until every checked count has fallen to half its limit or
//! below, and once idle it becomes busy only when a limit is reached again.

use std::sync::atomic::{AtomicBool, Ordering};

/// Where the policy sends a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Into the compressed pool (the device is busy).
    Pool,
    /// Straight to the backing file (the device is idle).
    Backing,
}

/// Limits of the policy; both 0 turns it off (every page to the pool).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoLimits {
    pub read_limit: u32,
    pub write_limit: u32,
}

impl IoLimits {
    pub fn enabled(&self) -> bool {
        self.read_limit != 0 || self.write_limit != 0
    }
}

/// The policy's state: busy or idle.
#[derive(Debug, Default)]
pub struct IoAdmission {
    busy: AtomicBool,
}

impl IoAdmission {
    /// Decides for one page given the in-flight (reads, writes).
    pub fn decide(&self, limits: IoLimits, inflight: (u32, u32)) -> Admit {
        if !limits.enabled() {
            return Admit::Pool;
        }
        let (reads, writes) = inflight;
        let over = |count: u32, limit: u32| limit != 0 && count >= limit;
        let above_low = |count: u32, limit: u32| limit != 0 && count > limit / 2;
        // Relaxed: the flag is a hint shared by racing stores; a stale read
        // sends one page the other way, which is always correct.
        let was_busy = self.busy.load(Ordering::Relaxed);
        let busy = if was_busy {
            above_low(reads, limits.read_limit) || above_low(writes, limits.write_limit)
        } else {
            over(reads, limits.read_limit) || over(writes, limits.write_limit)
        };
        if busy != was_busy {
            self.busy.store(busy, Ordering::Relaxed);
        }
        if busy {
            Admit::Pool
        } else {
            Admit::Backing
        }
    }
}

/// In-flight (reads, writes) of the block device holding `path`, from
/// `/sys/dev/block/MAJ:MIN/inflight`; `None` where the file is not on a
/// block device (tmpfs, overlay) or the counts cannot be read.
pub fn device_inflight(path: &std::path::Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    let (maj, min) = crate::sys::major_minor(dev);
    let s = std::fs::read_to_string(format!("/sys/dev/block/{maj}:{min}/inflight")).ok()?;
    let mut it = s.split_whitespace().map(|v| v.parse::<u32>().ok());
    Some((it.next()??, it.next()??))
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: IoLimits = IoLimits {
        read_limit: 4,
        write_limit: 8,
    };

    #[test]
    fn idle_device_goes_to_backing_busy_to_pool() {
        let a = IoAdmission::default();
        assert_eq!(a.decide(L, (0, 0)), Admit::Backing);
        assert_eq!(a.decide(L, (3, 7)), Admit::Backing);
        assert_eq!(a.decide(L, (0, 8)), Admit::Pool);
        let b = IoAdmission::default();
        assert_eq!(b.decide(L, (4, 0)), Admit::Pool);
    }

    #[test]
    fn hysteresis_keeps_busy_until_half_the_limit() {
        let a = IoAdmission::default();
        assert_eq!(a.decide(L, (0, 8)), Admit::Pool);
        // Below the limit but above half: still busy, no flapping.
        assert_eq!(a.decide(L, (0, 5)), Admit::Pool);
        assert_eq!(a.decide(L, (3, 4)), Admit::Pool, "reads above half");
        assert_eq!(a.decide(L, (2, 4)), Admit::Backing);
        // Idle again: needs the full limit to turn busy.
        assert_eq!(a.decide(L, (0, 7)), Admit::Backing);
    }

    #[test]
    fn disabled_policy_admits_everything_to_the_pool() {
        let a = IoAdmission::default();
        assert_eq!(a.decide(IoLimits::default(), (0, 0)), Admit::Pool);
        assert!(!IoLimits::default().enabled());
    }

    #[test]
    fn only_set_limits_are_checked() {
        let w = IoLimits {
            read_limit: 0,
            write_limit: 2,
        };
        let a = IoAdmission::default();
        assert_eq!(a.decide(w, (100, 0)), Admit::Backing);
        assert_eq!(a.decide(w, (0, 2)), Admit::Pool);
    }

    #[test]
    fn device_inflight_reads_sysfs_or_says_none() {
        // The root file system of the test machine may or may not be a block
        // device; either way the call must not fail loudly.
        let r = device_inflight(std::path::Path::new("/"));
        if let Some((reads, writes)) = r {
            assert!(reads < 1_000_000 && writes < 1_000_000);
        }
        assert_eq!(device_inflight(std::path::Path::new("/no/such/file")), None);
    }
}
