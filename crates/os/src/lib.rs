//! uzswap-os: what more than one crate of uzswap needs from the operating
//! system and the thread library, in one place.
//!
//! - [`PAGE_SIZE`]: the OS page, the unit the allocator, the cache and the
//!   pager all work in;
//! - [`rss_bytes`]: the process's resident set, which the tests and the
//!   benchmarks measure memory by; [`statm`]: a process's resident
//!   anonymous memory, cheaply enough to read every few milliseconds;
//! - [`spawn_helper`]: how every crate starts its background threads (the
//!   allocator's compactor, the cache's writer, the pager's handlers), so
//!   that a host that must tell its own threads apart (the preload runtime)
//!   sees each one before it runs (POSIX threads, not `std::thread`'s:
//!   see [`helper`] for why a forked child needs that);
//! - [`sync`]: the locks, atomics, threads and thread-locals of the
//!   allocator's and the cache's protocols, which the `shuttle` feature
//!   swaps for the model checker's;
//! - [`lock`]: the mutex, reader-writer lock and condition variable every
//!   crate uses, each one futex word (or two) with no table of waiters, so
//!   that a forked child can release what the parent's prepare hook held;
//! - [`fork`]: releasing after `fork()` the locks a prepare hook kept;
//! - [`threads`]: what each thread of a process is doing, for the reports
//!   of tests that hang, and whether any of the program's own is left;
//! - [`latency`]: the CPU latency request the fault handlers hold while
//!   faults arrive;
//! - [`sched`]: CPU affinity and the `SCHED_IDLE` policy of a thread (the
//!   pager's CPU handlers, the runtime's co-scheduling).
//!
//! This crate depends on no other crate of the project, and nothing here
//! knows about pools, caches or faults. The allocator's own `mmap` and
//! `madvise` calls stay in its `sys` module, and userfaultfd in the region
//! crate's: only what several crates share lives here.

pub mod cpu;
pub mod distance;
pub mod fdguard;
pub mod fork;
pub mod helper;
pub mod latency;
pub mod lock;
pub mod sched;
pub mod statm;
pub mod sync;
pub mod threads;

pub use helper::{spawn_helper, spawn_helper_serving, spawn_helper_warmed, Helper, StartBatch};

/// Size of an OS page, and the unit of everything in uzswap: pool pages,
/// cached pages, backing slots and faulted pages.
pub const PAGE_SIZE: usize = 4096;

/// Writes `line` and a newline to the standard error with one `write`,
/// taking no lock: `eprintln!` takes the standard library's stderr lock,
/// which a helper thread could hold at the instant of a fork and leave
/// taken in the child. For what uzswap's threads report.
pub fn say(line: &str) {
    let line = format!("{line}\n");
    // SAFETY: writes a local buffer to descriptor 2.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// Resident set size of this process in bytes, from `/proc/self/statm`.
pub fn rss_bytes() -> std::io::Result<u64> {
    let s = std::fs::read_to_string("/proc/self/statm")?;
    let resident: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| std::io::Error::other("unexpected /proc/self/statm format"))?;
    Ok(resident * PAGE_SIZE as u64)
}

/// The calling process's resident anonymous memory in bytes (`RssAnon`,
/// as `/proc/self/status` counts it): heap, anonymous mappings, stacks,
/// whatever maps them (the kernel's count, not the allocator's: memory an
/// allocator reserved but never touched is not in it). Read from `statm`
/// through a file kept open per thread ([`statm::own`]): cheap enough to
/// call every few milliseconds.
pub fn rss_anon_bytes() -> std::io::Result<u64> {
    statm::own()
}

/// Serialises this crate's tests that measure the process's memory: one
/// that allocates tens of MiB while another measures would move its
/// figures.
#[cfg(test)]
pub(crate) static MEMORY_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_anon_counts_touched_anonymous_memory() {
        let _m = MEMORY_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let before = rss_anon_bytes().unwrap();
        // black_box: an optimised build would drop an unused vector unmade.
        let v = std::hint::black_box(vec![1u8; 16 << 20]);
        let after = rss_anon_bytes().unwrap();
        assert!(after >= before + (15 << 20), "{before} -> {after}");
        drop(v);
    }

    #[test]
    fn rss_is_a_whole_number_of_pages_and_grows_with_touched_memory() {
        let _m = MEMORY_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        if std::env::var_os("UZSWAP_SANITIZER").is_some() {
            return; // a sanitizer's shadow memory moves the resident set
        }
        let before = rss_bytes().unwrap();
        assert!(before > 0);
        assert_eq!(before % PAGE_SIZE as u64, 0);
        // 64 MiB touched page by page: the resident set must see most of it
        // (the allocator may reuse a little that was resident already).
        let mut v = vec![0u8; 64 << 20];
        for i in (0..v.len()).step_by(PAGE_SIZE) {
            v[i] = 1;
        }
        let after = rss_bytes().unwrap();
        assert!(
            after >= before + (32 << 20),
            "rss {before} -> {after} after touching 64 MiB"
        );
        assert_eq!(std::hint::black_box(&v)[PAGE_SIZE], 1);
    }
}
