use std::sync::Arc;
use uzswap_region::{
    LoadError, LoadMode, Loaded, MemStore, Pager, PagerConfig, StoreError, StoreStats, Stored,
};

pub const PAGE: usize = 4096;

/// A requirement of the test this machine lacks (`why` names it). With
/// `UZSWAP_TEST_STRICT=1` (CI sets it) the test fails here; otherwise this
/// says `skipped: {why}` and the caller returns, a skip.
pub fn skip(why: &str) {
    if std::env::var("UZSWAP_TEST_STRICT").is_ok_and(|v| v == "1") {
        panic!("required for this test: {why} (UZSWAP_TEST_STRICT=1)");
    }
    eprintln!("skipped: {why}");
}

pub fn pager(budget: usize) -> (Pager, Arc<MemStore>) {
    pager_with(PagerConfig::new(budget))
}

pub fn pager_with(cfg: PagerConfig) -> (Pager, Arc<MemStore>) {
    let store = Arc::new(MemStore::new());
    let p = Pager::new(store.clone(), cfg).expect("userfaultfd available (tests run as root)");
    (p, store)
}

/// The byte pattern of version `v` of page `p`: varied, and compressible
/// enough for lz4 to matter.
pub fn fill(buf: &mut [u8], p: usize, v: u32) {
    let seed = (p as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (v as u64) << 32;
    for (i, c) in buf.chunks_exact_mut(8).enumerate() {
        let x = if i % 4 == 0 {
            seed.wrapping_add(i as u64)
        } else {
            seed
        };
        c.copy_from_slice(&x.to_le_bytes());
    }
}

pub fn page_mut<'a>(base: *mut u8, p: usize) -> &'a mut [u8] {
    // SAFETY: tests index pages inside their region and synchronise access
    // to each page themselves.
    unsafe { std::slice::from_raw_parts_mut(base.add(p * PAGE), PAGE) }
}

/// Reads one byte of page `p`, for real (a `let _ =` would not).
pub fn touch(base: *mut u8, p: usize) -> u8 {
    // SAFETY: tests touch pages inside their live region.
    unsafe { std::ptr::read_volatile(base.add(p * PAGE)) }
}

/// Waits up to 10 s for `cond`: the handler processes an event after the
/// system call that raised it has returned. Not less: a CPU handler runs
/// under `SCHED_IDLE`, and with the tests of other binaries busy on every
/// CPU one that had read a remove event applied it more than a second
/// later (1 run in 20 of `slow_load`).
pub fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < end {
        if cond() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    cond()
}

/// Aborts the test process unless dropped within `secs`: a thread stuck in
/// a page fault cannot be interrupted, so a fault that is never resolved
/// would otherwise hang the test run instead of failing it.
pub struct Watchdog(Arc<std::sync::atomic::AtomicBool>);

pub fn watchdog(what: &'static str, secs: u64) -> Watchdog {
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        while std::time::Instant::now() < until {
            if d.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        // Straight to the process's stderr: the test harness captures
        // `eprintln!` (also on threads a test spawned) and prints it only
        // when the test ends, which an abort prevents.
        let msg = format!(
            "{what}: still running after {secs} s (a fault loops or is never woken)\n{}\n",
            uzswap_os::threads::describe(None)
        );
        let _ = std::io::Write::write_all(&mut std::io::stderr(), msg.as_bytes());
        std::process::abort();
    });
    Watchdog(done)
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A [`MemStore`] that counts plain and cold stores, can fail the loads of
/// one offset (as a corrupt backing file would), hold those of another
/// (as a slow read would) and run a hook before each store (to hold an
/// eviction at a chosen point).
#[derive(Default)]
pub struct TestStore {
    pub inner: uzswap_region::MemStore,
    /// Loads of this offset fail with `LoadError::Corrupt`.
    pub fail_load: Option<u64>,
    /// Loads of this offset set `held` and wait until `release` is set.
    pub hold_load: Option<u64>,
    pub held: std::sync::atomic::AtomicBool,
    pub release: std::sync::atomic::AtomicBool,
    pub plain: std::sync::atomic::AtomicU64,
    pub cold: std::sync::atomic::AtomicU64,
    /// While set, every store is refused (a full pool, no backing file).
    pub refuse: std::sync::atomic::AtomicBool,
    /// Called before every store, plain or cold.
    pub before_store: Option<fn()>,
}

impl TestStore {
    fn refusing(&self) -> Result<(), StoreError> {
        if let Some(hook) = self.before_store {
            hook();
        }
        if self.refuse.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Full);
        }
        Ok(())
    }
}

impl uzswap_region::PageStore for TestStore {
    fn open_area(&self, area: u32) {
        self.inner.open_area(area)
    }
    fn store(&self, area: u32, offset: u64, page: &[u8]) -> Result<Stored, StoreError> {
        self.refusing()?;
        self.plain
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.store(area, offset, page)
    }
    fn store_cold(&self, area: u32, offset: u64, page: &[u8]) -> Result<Stored, StoreError> {
        self.refusing()?;
        self.cold.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.store(area, offset, page)
    }
    fn load(
        &self,
        area: u32,
        offset: u64,
        page: &mut [u8],
        mode: LoadMode,
    ) -> Result<Loaded, LoadError> {
        if self.fail_load == Some(offset) {
            return Err(LoadError::Corrupt);
        }
        if self.hold_load == Some(offset) {
            self.held.store(true, std::sync::atomic::Ordering::SeqCst);
            while !self.release.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        self.inner.load(area, offset, page, mode)
    }
    fn invalidate(&self, area: u32, offset: u64) {
        self.inner.invalidate(area, offset)
    }
    fn invalidate_area(&self, area: u32) {
        self.inner.invalidate_area(area)
    }
    fn stats(&self) -> StoreStats {
        self.inner.stats()
    }
}

/// Sets its flag when dropped, also while a panic unwinds: a failed check
/// in a `std::thread::scope` then stops the threads the scope waits for.
pub struct StopOnDrop<'a>(pub &'a std::sync::atomic::AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}
