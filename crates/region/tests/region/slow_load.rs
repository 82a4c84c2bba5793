//! A load holds no pager lock: while one page's load is stuck in the store
//! (a slow backing-file read, a retry pause), the pager's state, the
//! evictor and, with CPU handlers, other faults and events go on; an event
//! that takes the page meanwhile wins over the load.

use crate::common::*;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;
use uzswap_region::{PageState, Pager, PagerConfig, Region};

const HELD: usize = 3;

/// A region of 32 pages, each written, pages `HELD` and 10 evicted alone
/// (their neighbours resident: no readahead), loads of `HELD` held.
fn setup(cfg: PagerConfig) -> (Pager, Arc<TestStore>, Region) {
    let store = Arc::new(TestStore {
        hold_load: Some(HELD as u64),
        ..TestStore::default()
    });
    let pager = Pager::new(store.clone(), cfg).unwrap();
    let r = pager.region(32 * PAGE).unwrap();
    for p in 0..32 {
        fill(page_mut(r.as_ptr(), p), p, 1);
    }
    assert_eq!(r.evict(HELD..HELD + 1), 1);
    assert_eq!(r.evict(10..11), 1);
    (pager, store, r)
}

/// A thread reads page `HELD` of the region at `base`; returns once its
/// load is held in the store. The thread returns the page's bytes.
fn read_held(base: usize, store: &TestStore) -> JoinHandle<Vec<u8>> {
    let reader = std::thread::spawn(move || page_mut(base as *mut u8, HELD).to_vec());
    assert!(eventually(|| store.held.load(Ordering::SeqCst)));
    reader
}

/// Lets a held load go when dropped: a test that fails while a load is
/// held then reports its failure, where dropping the pager would wait for
/// the load for ever.
struct ReleaseOnDrop(Arc<TestStore>);

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        self.0.release.store(true, Ordering::SeqCst);
    }
}

/// Runs `f` on another thread; whether it returned within 10 s (a held
/// load is held for ever: anything that waited for it would not return).
fn returns_soon(f: impl FnOnce() + Send + 'static) -> bool {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(10)).is_ok()
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
    let _release = ReleaseOnDrop(store.clone());
    let pager = Arc::new(pager);
    let r = Arc::new(r);
    let base = r.as_ptr() as usize;
    let reader = read_held(base, &store);
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
    store.release.store(true, Ordering::SeqCst);
    assert_eq!(reader.join().unwrap(), wants(HELD));
    assert_eq!(r.page_state(HELD), Some(PageState::Clean));
    pager.check_invariants().unwrap();
}

/// A second handler (`cpu_handlers`), if the machine gives one. Whether it
/// does is a fact of the machine: a CPU handler starts where a thread may
/// bind itself to a CPU at `SCHED_IDLE` (a scratch thread tries first; no
/// affinity mask, or a refusal, is a skip). Where one may, a handler must
/// have started within 10 s (an idle-policy thread still gets a share of
/// a busy CPU): else the test fails.
fn with_cpu_handlers() -> Option<(Pager, Arc<TestStore>, Region)> {
    let cpu = uzswap_region::sys::allowed_cpus()
        .ok()
        .and_then(|c| c.first().copied());
    let may_pin = cpu.is_some_and(|cpu| {
        std::thread::spawn(move || uzswap_region::sys::pin_idle(cpu).is_ok())
            .join()
            .unwrap_or(false)
    });
    if !may_pin {
        skip("CPU handlers (a thread bound to a CPU at SCHED_IDLE)");
        return None;
    }
    let mut cfg = PagerConfig::new(64);
    cfg.cpu_handlers = true;
    let (pager, store, r) = setup(cfg);
    assert!(
        eventually(|| pager.stats().cpu_handlers > 0),
        "no CPU handler started within 10 s, though a thread may bind to a CPU at SCHED_IDLE"
    );
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
    let _release = ReleaseOnDrop(store.clone());
    let base = r.as_ptr() as usize;
    let reader = read_held(base, &store);
    assert!(returns_soon(move || {
        assert_eq!(page_mut(base as *mut u8, 10), &wants(10)[..]);
    }));
    assert_eq!(r.page_state(HELD), Some(PageState::Loading));
    assert_eq!(r.page_state(10), Some(PageState::Clean));
    pager.check_invariants().unwrap();
    store.release.store(true, Ordering::SeqCst);
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
    let _release = ReleaseOnDrop(store.clone());
    let base = r.as_ptr() as usize;
    let reader = read_held(base, &store);
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
    // The remove event wakes the faulting thread at once: it may fault
    // again and be served zeros (the page `Dirty`, the thread done) before
    // a look sees the page `Absent`. Either way the held load has lost.
    assert!(
        eventually(|| r.page_state(HELD) == Some(PageState::Absent)
            || (reader.is_finished() && r.page_state(HELD) == Some(PageState::Dirty))),
        "page {HELD} is {:?}",
        r.page_state(HELD)
    );
    assert!(!store.inner.contains(r.area(), HELD as u64));
    pager.check_invariants().unwrap();
    store.release.store(true, Ordering::SeqCst);
    assert_eq!(reader.join().unwrap(), vec![0u8; PAGE]);
    let st = pager.stats();
    assert_eq!(st.load_errors, 0, "{st:?}");
    assert!(eventually(|| pager.check_invariants().is_ok()));
    pager.check_invariants().unwrap();
}
