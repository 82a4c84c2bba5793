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
//!   sees each one before it runs;
//! - [`sync`]: the locks, atomics, threads and thread-locals of the
//!   allocator's and the cache's protocols, which the `shuttle` feature
//!   swaps for the model checker's;
//! - [`lock`]: the mutex, reader-writer lock and condition variable every
//!   crate uses, each one futex word (or two) with no table of waiters, so
//!   that a forked child can release what the parent's prepare hook held;
//! - [`fork`]: releasing after `fork()` the locks a prepare hook kept;
//! - [`threads`]: what each thread of a process is doing, for the reports
//!   of tests that hang;
//! - [`sched`]: CPU affinity and the `SCHED_IDLE` policy of a thread (the
//!   pager's CPU handlers, the runtime's co-scheduling).
//!
//! This crate depends on no other crate of the project, and nothing here
//! knows about pools, caches or faults. The allocator's own `mmap` and
//! `madvise` calls stay in its `sys` module, and userfaultfd in the region
//! crate's: only what several crates share lives here.

pub mod cpu;
pub mod fork;
pub mod lock;
pub mod sched;
pub mod statm;
pub mod sync;
pub mod threads;

/// Size of an OS page, and the unit of everything in uzswap: pool pages,
/// cached pages, backing slots and faulted pages.
pub const PAGE_SIZE: usize = 4096;

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

/// Starts a named helper thread that runs `thread_start` (if any) and then
/// `body`, and returns only once `thread_start` has returned on it.
///
/// Why wait: a host that tells its own threads apart through
/// `thread_start` (the preload runtime sends their `malloc` to a different
/// heap) must know that the thread's start-up, including the allocations
/// the thread library makes before `body` runs, is over before it switches
/// anything on.
///
/// The thread is an OS thread even under the `shuttle` feature: code that
/// is model-checked starts its threads through [`sync::thread`] instead.
pub fn spawn_helper<F>(
    name: &str,
    thread_start: Option<fn()>,
    body: F,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    spawn_helper_warmed(name, thread_start, || {}, body)
}

/// As [`spawn_helper`], with `warm` run on the new thread before the
/// caller goes on (after `thread_start`): for per-thread state whose first
/// use would take the dynamic loader's lock (a thread-local with a
/// destructor registers it through the loader, which a program thread may
/// hold inside `dlopen` while it waits on a fault only the helper resolves).
pub fn spawn_helper_warmed<F, W>(
    name: &str,
    thread_start: Option<fn()>,
    warm: W,
    body: F,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
    W: FnOnce() + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
    let t = spawn_listed(
        name,
        thread_start,
        move || {
            warm();
            let _ = tx.send(());
        },
        body,
    )?;
    rx.recv()
        .map_err(|_| std::io::Error::other(format!("helper thread {name} died at start")))?;
    Ok(t)
}

/// As [`spawn_helper`], but while the thread starts the calling thread
/// runs `meanwhile(started)`, which must return once `started` is true
/// (the new thread sets it after `thread_start`, before `body`). For a
/// caller that must keep serving something the new thread's start-up may
/// wait for (a forked child's first fault handler: the thread library
/// touches memory that only a handler can bring back).
pub fn spawn_helper_serving<F, W>(
    name: &str,
    thread_start: Option<fn()>,
    warm: W,
    body: F,
    meanwhile: impl FnOnce(&std::sync::atomic::AtomicBool),
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
    W: FnOnce() + Send + 'static,
{
    let started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = started.clone();
    let t = spawn_listed(
        name,
        thread_start,
        move || {
            warm();
            flag.store(true, std::sync::atomic::Ordering::Release)
        },
        body,
    )?;
    meanwhile(&started);
    Ok(t)
}

/// A helper thread: `thread_start`, then listed as a helper
/// ([`fork::helper_tids`], for the CPU accounting), then `started`, then
/// `body`.
fn spawn_listed<F, S>(
    name: &str,
    thread_start: Option<fn()>,
    started: S,
    body: F,
) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
    S: FnOnce() + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if let Some(f) = thread_start {
                f();
            }
            let _listed = fork::HelperGuard::enter();
            started();
            body()
        })
}

/// Serialises this crate's tests that measure the process's memory: one
/// that allocates tens of MiB while another measures would move its
/// figures.
#[cfg(test)]
pub(crate) static MEMORY_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

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

    static STARTED: AtomicBool = AtomicBool::new(false);

    fn mark() {
        // Slow on purpose: spawn_helper must still wait for it.
        std::thread::sleep(std::time::Duration::from_millis(20));
        STARTED.store(true, Ordering::SeqCst);
    }

    #[test]
    fn spawn_helper_returns_after_thread_start_ran_on_the_thread() {
        let t = spawn_helper("uzswap-test", Some(mark), || {
            assert_eq!(std::thread::current().name(), Some("uzswap-test"));
        })
        .unwrap();
        assert!(STARTED.load(Ordering::SeqCst), "thread_start had not run");
        t.join().unwrap();
        // Without a start hook it simply runs the body.
        let (tx, rx) = std::sync::mpsc::channel();
        spawn_helper("uzswap-test-2", None, move || tx.send(7).unwrap())
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(rx.recv().unwrap(), 7);
    }
}
