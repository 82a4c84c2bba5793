//! Region drop, the unavailable-userfaultfd error, configuration errors.

use crate::common::*;
use uzswap_region::{OpenError, PagerConfig, PagerError};

#[test]
fn dropping_a_region_releases_its_store_entries() {
    let (pager, store) = pager(32);
    let keep = pager.region(64 * PAGE).unwrap();
    let r = pager.region(256 * PAGE).unwrap();
    for p in 0..256 {
        fill(page_mut(r.as_ptr(), p), p, 1);
    }
    for p in 0..64 {
        fill(page_mut(keep.as_ptr(), p), p, 9);
    }
    assert!(store.area_len(r.area()) > 100);
    // Drop while the evictor is busy with the other region.
    let kb = keep.as_ptr() as usize;
    let h = std::thread::spawn(move || {
        for round in 0..20 {
            for p in 0..64 {
                page_mut(kb as *mut u8, p)[0] = round;
            }
        }
    });
    drop(r);
    h.join().unwrap();
    assert_eq!(store.area_len(r_area_after_drop()), 0);
    pager.check_invariants().unwrap();
    assert!(pager.stats().resident_pages <= 32);
    let area = keep.area();
    drop(keep);
    assert_eq!(store.area_len(area), 0);
    assert_eq!(store.len(), 0);
    assert_eq!(pager.stats().resident_pages, 0);
}

fn r_area_after_drop() -> u32 {
    // Areas are numbered from 1 in creation order: `keep` is 1, `r` is 2.
    2
}

#[test]
fn unavailable_userfaultfd_says_what_to_change() {
    let store = std::sync::Arc::new(uzswap_region::MemStore::new());
    let mut cfg = PagerConfig::new(64);
    cfg.inject_open_errno = Some(libc::EPERM);
    let e = match uzswap_region::Pager::new(store.clone(), cfg) {
        Err(e) => e,
        Ok(_) => panic!("the injected failure must surface"),
    };
    assert!(
        matches!(e, PagerError::Open(OpenError::NotPermitted { .. })),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains("vm.unprivileged_userfaultfd=1"), "{msg}");
    assert!(msg.contains("/dev/userfaultfd"), "{msg}");
    assert!(msg.contains("CAP_SYS_PTRACE"), "{msg}");

    let mut cfg = PagerConfig::new(64);
    cfg.inject_open_errno = Some(libc::ENOSYS);
    let e = uzswap_region::Pager::new(store.clone(), cfg).err().unwrap();
    assert!(
        matches!(e, PagerError::Open(OpenError::NotSupported)),
        "{e:?}"
    );

    let e = uzswap_region::Pager::new(store, PagerConfig::new(4))
        .err()
        .unwrap();
    assert!(matches!(e, PagerError::Config(_)));
}

#[test]
fn stats_serialize() {
    let (pager, _store) = pager(16);
    let r = pager.region(4 * PAGE).unwrap();
    page_mut(r.as_ptr(), 0)[0] = 1;
    let j = serde_json::to_value(pager.stats()).unwrap();
    assert_eq!(j["faults_zero"], 1);
    assert!(j["fault_latency"]["p50_us"].is_number());
}
