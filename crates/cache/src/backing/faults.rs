//! A store that fails on command ([`FaultInjector`]), for the fault tests
//! and the soak: it wraps any [`BackingStore`] and makes its next writes or
//! reads fail in the way it is armed with.

use super::BackingStore;
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use uzswap_os::fork::Side;

/// What a [`FaultInjector`] does to the next operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Writes fail with EIO.
    WriteError,
    /// Writes fail with ENOSPC (a full disk).
    NoSpace,
    /// Writes stop half-way and report a short write.
    ShortWrite,
    /// Reads fail with EIO.
    ReadError,
    /// Reads return the slot with one bit flipped.
    FlipBit,
    /// Reads find the file truncated (EOF).
    Truncated,
}

/// Wraps a store and injects faults: `arm(fault, count)` makes the next
/// `count` matching operations fail that way. Counts what it injected.
pub struct FaultInjector<S> {
    inner: S,
    fault: uzswap_os::lock::Mutex<Option<(Fault, u64)>>,
    injected: AtomicU64,
    /// Reported as the device's in-flight (reads, writes), for admission
    /// tests: packed reads << 16 | writes; u32::MAX means "unknown".
    inflight: AtomicU32,
}

impl<S: BackingStore> FaultInjector<S> {
    pub fn new(inner: S) -> FaultInjector<S> {
        FaultInjector {
            inner,
            fault: uzswap_os::lock::Mutex::new(None),
            injected: AtomicU64::new(0),
            inflight: AtomicU32::new(u32::MAX),
        }
    }

    /// The next `count` operations of the fault's kind fail.
    pub fn arm(&self, fault: Fault, count: u64) {
        *self.fault.lock() = Some((fault, count));
    }

    /// Stops injecting.
    pub fn disarm(&self) {
        *self.fault.lock() = None;
    }

    /// Faults injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    /// Injects faults of every kind at random until `stop` is set, for
    /// soak tests: windows of 1-10 ms armed with one kind (a single fault
    /// for reads, 1-3 for writes), 20-40 ms apart. So one operation retried
    /// a few milliseconds later gets through: a test can insist that no
    /// page is lost for good.
    pub fn chaos(&self, stop: &std::sync::atomic::AtomicBool, seed: u64) {
        const KINDS: [Fault; 6] = [
            Fault::WriteError,
            Fault::NoSpace,
            Fault::ShortWrite,
            Fault::ReadError,
            Fault::FlipBit,
            Fault::Truncated,
        ];
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let ms = |v: u64| std::time::Duration::from_millis(v);
        while !stop.load(Ordering::Relaxed) {
            let f = KINDS[next(KINDS.len() as u64) as usize];
            let n = match f {
                Fault::ReadError | Fault::FlipBit | Fault::Truncated => 1,
                _ => 1 + next(3),
            };
            self.arm(f, n);
            std::thread::sleep(ms(1 + next(10)));
            self.disarm();
            std::thread::sleep(ms(20 + next(20)));
        }
    }

    /// Makes `device_inflight` report these counts.
    pub fn set_device_inflight(&self, reads: u16, writes: u16) {
        self.inflight.store(
            u32::from(reads) << 16 | u32::from(writes),
            Ordering::Relaxed,
        );
    }

    fn take(&self, want: &[Fault]) -> Option<Fault> {
        let mut f = self.fault.lock();
        let (fault, count) = (*f)?;
        if !want.contains(&fault) {
            return None;
        }
        *f = if count > 1 {
            Some((fault, count - 1))
        } else {
            None
        };
        self.injected.fetch_add(1, Ordering::Relaxed);
        Some(fault)
    }
}

impl<S: BackingStore> BackingStore for FaultInjector<S> {
    fn write_slots(&self, first: u64, pages: &[&[u8]]) -> io::Result<()> {
        match self.take(&[Fault::WriteError, Fault::NoSpace, Fault::ShortWrite]) {
            Some(Fault::WriteError) => Err(io::Error::from_raw_os_error(crate::sys::EIO)),
            Some(Fault::NoSpace) => Err(io::Error::from_raw_os_error(crate::sys::ENOSPC)),
            Some(_) => {
                // Half of the data reaches the file, then the write stops.
                let half = pages.len() / 2;
                if half > 0 {
                    self.inner.write_slots(first, &pages[..half])?;
                }
                Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    "short write (injected)",
                ))
            }
            None => self.inner.write_slots(first, pages),
        }
    }

    fn read_slot(&self, slot: u64, page: &mut [u8]) -> io::Result<()> {
        match self.take(&[Fault::ReadError, Fault::FlipBit, Fault::Truncated]) {
            Some(Fault::ReadError) => Err(io::Error::from_raw_os_error(crate::sys::EIO)),
            Some(Fault::Truncated) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "backing file truncated (injected)",
            )),
            Some(_) => {
                self.inner.read_slot(slot, page)?;
                let bit = (slot as usize * 8191 + 3) % (page.len() * 8);
                page[bit / 8] ^= 1 << (bit % 8);
                Ok(())
            }
            None => self.inner.read_slot(slot, page),
        }
    }

    fn discard(&self, first: u64, count: u64) {
        self.inner.discard(first, count)
    }

    fn device_inflight(&self) -> Option<(u32, u32)> {
        match self.inflight.load(Ordering::Relaxed) {
            u32::MAX => self.inner.device_inflight(),
            v => Some((v >> 16, v & 0xffff)),
        }
    }

    fn describe(&self) -> String {
        format!("fault-injecting {}", self.inner.describe())
    }

    fn fork_private(&self, end: u64) -> io::Result<()> {
        self.inner.fork_private(end)
    }

    fn shares_at_fork(&self) -> bool {
        self.inner.shares_at_fork()
    }

    fn fork_share_prepare(&self) -> io::Result<()> {
        self.inner.fork_share_prepare()
    }

    fn fork_lock(&self) {
        self.inner.fork_lock()
    }

    unsafe fn fork_unlock(&self, side: Side) {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.fork_unlock(side) }
    }

    unsafe fn fork_share(&self, side: Side, next: u64, live: u64) -> io::Result<()> {
        // SAFETY: the caller's contract, passed on.
        unsafe { self.inner.fork_share(side, next, live) }
    }

    fn release_shared(&self, slot: u64) {
        self.inner.release_shared(slot)
    }
}
