//! A load holds no pager lock: while one page's load is stuck in the store
//! (a slow backing-file read, a retry pause), the pager's state, the
//! evictor and, with CPU handlers, other faults and events go on; an event
//! that takes the page meanwhile wins over the load.

use crate::common::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;
use uzswap_region::{
    LoadError, LoadMode, Loaded, MemStore, PageState, PageStore, Pager, PagerConfig, StoreError,
    StoreStats, Stored,
};

/// A [`MemStore`] whose loads of offset `hold` wait until `open` is set.
struct SlowStore {
    inner: MemStore,
    hold: AtomicU64,
    entered: AtomicBool,
    open: AtomicBool,
}

impl SlowStore {
    fn new() -> SlowStore {
        SlowStore {
            inner: MemStore::new(),
            hold: AtomicU64::new(u64::MAX),
            entered: AtomicBool::new(false),
            open: AtomicBool::new(false),
        }
    }
}

impl PageStore for SlowStore {
    fn open_area(&self, area: u32) {
        self.inner.open_area(area)
    }
    fn store(&self, area: u32, offset: u64, page: &[u8]) -> Result<Stored, StoreError> {
        self.inner.store(area, offset, page)
    }
    fn load(
        &self,
        area: u32,
        offset: u64,
        page: &mut [u8],
        mode: LoadMode,
    ) -> Result<Loaded, LoadError> {
        if offset == self.hold.load(Ordering::SeqCst) {
            self.entered.store(true, Ordering::SeqCst);
            while !self.open.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
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

const HELD: usize = 3;

/// A region of 32 pages, each written, pages `HELD` and 10 evicted alone
/// (their neighbours resident: no readahead), loads of `HELD` held.
fn setup(cfg: PagerConfig) -> (Pager, Arc<SlowStore>, uzswap_region::Region) {
    let store = Arc::new(SlowStore::new());
    let pager = Pager::new(store.clone(), cfg).unwrap();
    let r = pager.region(32 * PAGE).unwrap();
    for p in 0..32 {
        fill(page_mut(r.as_ptr(), p), p, 1);
    }
    assert_eq!(r.evict(HELD..HELD + 1), 1);
    assert_eq!(r.evict(10..11), 1);
    store.hold.store(HELD as u64, Ordering::SeqCst);
    (pager, store, r)
}

/// Runs `f` on another thread; whether it returned within 2 s.
fn returns_soon(f: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(2)).is_ok()
}

fn wants(p: usize) -> Vec<u8> {
    let mut want = vec![0u8; PAGE];
    fill(&mut want, p, 1);
    want
}

/// With the main handler alone faults are still handled one at a time, but
/// the state lock is free while a load waits: the pager answers, and the
/// evictor evicts (by moves, which need no handler), meanwhile.
#[test]
fn a_slow_load_leaves_the_pager_and_the_evictor_free() {
    let _w = watchdog("a_slow_load_leaves_the_pager_and_the_evictor_free", 60);
    let (pager, store, r) = setup(PagerConfig::new(64));
    let pager = Arc::new(pager);
    let r = Arc::new(r);
    let base = r.as_ptr() as usize;
    let reader = std::thread::spawn(move || page_mut(base as *mut u8, HELD).to_vec());
    assert!(eventually(|| store.entered.load(Ordering::SeqCst)));
    assert_eq!(r.page_state(HELD), Some(PageState::Loading));
    let p = pager.clone();
    assert!(returns_soon(move || {
        p.stats();
        p.check_invariants().unwrap();
    }));
    if pager.evicts_by_move() {
        let r2 = r.clone();
        assert!(returns_soon(move || assert_eq!(r2.evict(20..24), 4)));
        assert_eq!(r.page_state(21), Some(PageState::Stored));
    }
    store.open.store(true, Ordering::SeqCst);
    assert_eq!(reader.join().unwrap(), wants(HELD));
    assert_eq!(r.page_state(HELD), Some(PageState::Clean));
    pager.check_invariants().unwrap();
}

/// A second handler (`cpu_handlers`), if the machine gives one.
fn with_cpu_handlers() -> Option<(Pager, Arc<SlowStore>, uzswap_region::Region)> {
    let mut cfg = PagerConfig::new(64);
    cfg.cpu_handlers = true;
    let (pager, store, r) = setup(cfg);
    if !eventually(|| pager.stats().cpu_handlers > 0) {
        eprintln!("no CPU handler started: skipped");
        return None;
    }
    Some((pager, store, r))
}

/// With CPU handlers, a fault on another page is loaded and mapped while
/// the first load waits.
#[test]
fn another_fault_completes_while_a_load_waits() {
    let _w = watchdog("another_fault_completes_while_a_load_waits", 60);
    let Some((pager, store, r)) = with_cpu_handlers() else {
        return;
    };
    let base = r.as_ptr() as usize;
    let reader = std::thread::spawn(move || page_mut(base as *mut u8, HELD).to_vec());
    assert!(eventually(|| store.entered.load(Ordering::SeqCst)));
    assert!(returns_soon(move || {
        assert_eq!(page_mut(base as *mut u8, 10), &wants(10)[..]);
    }));
    assert_eq!(r.page_state(HELD), Some(PageState::Loading));
    assert_eq!(r.page_state(10), Some(PageState::Clean));
    pager.check_invariants().unwrap();
    store.open.store(true, Ordering::SeqCst);
    assert_eq!(reader.join().unwrap(), wants(HELD));
    pager.check_invariants().unwrap();
}

/// The program discards the page while its load waits: the remove event
/// wins. The load's bytes are thrown away, the store's entry goes, and the
/// faulting thread, woken, faults again and reads zeros.
#[test]
fn a_discard_during_a_load_wins() {
    let _w = watchdog("a_discard_during_a_load_wins", 60);
    let Some((pager, store, r)) = with_cpu_handlers() else {
        return;
    };
    let base = r.as_ptr() as usize;
    let reader = std::thread::spawn(move || page_mut(base as *mut u8, HELD).to_vec());
    assert!(eventually(|| store.entered.load(Ordering::SeqCst)));
    assert!(returns_soon(move || {
        // SAFETY: one page of the live region whose contents we drop.
        let rc = unsafe {
            libc::madvise(
                (base + HELD * PAGE) as *mut libc::c_void,
                PAGE,
                libc::MADV_DONTNEED,
            )
        };
        assert_eq!(rc, 0);
    }));
    assert!(eventually(|| r.page_state(HELD) == Some(PageState::Absent)));
    assert!(!store.inner.contains(r.area(), HELD as u64));
    pager.check_invariants().unwrap();
    store.open.store(true, Ordering::SeqCst);
    assert_eq!(reader.join().unwrap(), vec![0u8; PAGE]);
    let st = pager.stats();
    assert_eq!(st.load_errors, 0, "{st:?}");
    assert!(eventually(|| pager.check_invariants().is_ok()));
    pager.check_invariants().unwrap();
}
