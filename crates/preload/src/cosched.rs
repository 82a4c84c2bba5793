//! Co-scheduling: a process with one thread of its own that is evicting
//! runs on one CPU, and the runtime's threads for it run on that CPU at
//! idle priority.
//!
//! Why: on the 2-vCPU VM of docs/BENCHMARKS.md a fault served by the
//! handler thread on the other CPU costs an inter-processor interrupt to
//! wake the program (about 10 µs of the handler's `UFFDIO_COPY`), and every
//! page the evictor moves out flushes the TLB of the program's CPU, another
//! interrupt (about 8 µs of the evictor's time each). The kernel does both
//! on the faulting CPU. With the program and its helpers on one CPU there
//! is no interrupt at all; at idle priority a helper runs only while the
//! program waits (for a page, or for room), so it never delays it; and the
//! program's thread is pinned there, or the scheduler would keep moving it
//! to the other, idle, CPU away from its helpers. Measured on 2026-11-26:
//! `xz -9` under the same budget 52.8 s → 38.0 s, a Python dict 43 s →
//! 35 s, with a third less CPU (docs/benchmarks/notes/2026-11-26-cosched.md).
//!
//! When: the process has had exactly one thread of its own (the rest are
//! the runtime's helpers) for [`SETTLE`] and its pager evicted meanwhile
//! (the watcher reads /proc only while its pager evicts, or while pinned).
//! Programs that start threads at once (JVMs, node, Go) are never pinned,
//! and never see a one-CPU affinity while they size their thread pools.
//!
//! Let go (the thread's own affinity back, the helpers' too and their
//! normal policy) when the process starts a second thread of its own (its
//! threads all get the affinity back), or when the pinned thread waits for
//! its CPU for more than a quarter of [`PERIOD`] (something else runs there:
//! the scheduler may then place it elsewhere); after that, not again for
//! [`BACKOFF`].
//!
//! What the program sees: `sched_getaffinity` (libc's, which this library
//! replaces) answers the affinity the thread had before it was pinned, so
//! a program sizing a pool by it is not misled. `fork()` unpins the
//! forking thread for the fork, so the child starts with the affinity it
//! would have had; a child started with `vfork` or `posix_spawn` inherits
//! the pin, and its runtime (`release_inherited`) gives it the affinity of
//! `uzswap run` back when it starts with one CPU where the run has more and
//! its parent runs on that CPU alone. A static binary started that way has
//! no runtime and keeps the one CPU.
//!
//! Only where the helpers may leave idle priority again
//! (`uzswap_os::sched::may_leave_idle`: root, `CAP_SYS_NICE` or
//! `RLIMIT_NICE`), and not with CPU handlers (they are bound per CPU).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use uzswap_os::sched::{self, CpuSet};

/// How often the watcher looks.
pub const PERIOD: Duration = Duration::from_millis(10);
/// How long a process must have had one thread of its own, and evicted,
/// before it is pinned.
pub const SETTLE: Duration = Duration::from_secs(1);
/// How long after a release for crowding before the thread is pinned again.
pub const BACKOFF: Duration = Duration::from_secs(10);

/// The CPU the main thread is pinned to by us, -1 if none: set before the
/// pin is made and cleared after it is undone (read by
/// `sched_getaffinity`, the fork hooks and the statistics).
static PINNED_CPU: AtomicI64 = AtomicI64::new(-1);
/// The statistics ([`stats`]) besides [`PINNED_CPU`]: the watcher runs;
/// pins, releases, releases for crowding.
static ACTIVE: AtomicBool = AtomicBool::new(false);
static PINS: AtomicU64 = AtomicU64::new(0);
static RELEASES: AtomicU64 = AtomicU64::new(0);
static CROWDED: AtomicU64 = AtomicU64::new(0);

/// What co-scheduling has done in this process.
pub fn stats() -> uzswap_contract::CoschedStats {
    uzswap_contract::CoschedStats {
        active: ACTIVE.load(Ordering::Relaxed),
        pinned_cpu: pinned_cpu().and_then(|c| u32::try_from(c).ok()),
        pins: PINS.load(Ordering::Relaxed),
        releases: RELEASES.load(Ordering::Relaxed),
        crowded: CROWDED.load(Ordering::Relaxed),
    }
}
/// The CPU the main thread is pinned to by us.
fn pinned_cpu() -> Option<usize> {
    usize::try_from(PINNED_CPU.load(Ordering::Acquire)).ok()
}

/// Its affinity before the pin, written before [`PINNED_CPU`] is set and
/// read after it is seen set. Atomics, not a lock: the fork hooks and the
/// program's `sched_getaffinity` read it, and a lock a helper held at a
/// fork would stay held in the child.
static ORIGINAL: [AtomicU64; 16] = [const { AtomicU64::new(0) }; 16];

fn save_original(set: &CpuSet) {
    for (word, bytes) in ORIGINAL.iter().zip(set.as_bytes().chunks(8)) {
        let mut w = [0u8; 8];
        w[..bytes.len()].copy_from_slice(bytes);
        word.store(u64::from_ne_bytes(w), Ordering::Relaxed);
    }
}

fn original() -> CpuSet {
    let mut bytes = [0u8; 128];
    for (word, chunk) in ORIGINAL.iter().zip(bytes.chunks_mut(8)) {
        chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_ne_bytes());
    }
    CpuSet::from_bytes(&bytes)
}

/// What the watcher saw in one period.
#[derive(Clone, Copy, Debug)]
pub struct Look {
    /// Threads of the program (not the runtime's).
    pub own_threads: usize,
    /// The pager's evictions so far.
    pub evictions: u64,
    /// How long the main thread waited for its CPU this period, ns.
    pub waited_ns: u64,
}

/// What to do after a look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Nothing,
    Pin,
    /// Let go; `crowded`: because the thread waited for its CPU.
    Release {
        crowded: bool,
    },
}

/// The watcher's state: when the process last became single-threaded, with
/// the evictions then; whether it is pinned; when it may be pinned again.
#[derive(Debug, Default)]
pub struct Watch {
    single_since: Option<(Instant, u64)>,
    pinned: bool,
    not_before: Option<Instant>,
}

impl Watch {
    /// The decision at `now` (the caller carries it out and then calls
    /// [`Watch::pinned`] or [`Watch::released`]).
    pub fn step(&mut self, now: Instant, look: Look) -> Step {
        if self.pinned {
            if look.own_threads != 1 {
                return Step::Release { crowded: false };
            }
            if look.waited_ns > PERIOD.as_nanos() as u64 / 4 {
                return Step::Release { crowded: true };
            }
            return Step::Nothing;
        }
        if look.own_threads != 1 {
            self.single_since = None;
            return Step::Nothing;
        }
        let (since, evictions_then) = *self.single_since.get_or_insert((now, look.evictions));
        let settled = now.duration_since(since) >= SETTLE;
        let evicting = look.evictions > evictions_then;
        let allowed = self.not_before.is_none_or(|t| now >= t);
        if settled && !evicting {
            // Quiet for a whole settle time: look again from here.
            self.single_since = Some((now, look.evictions));
        }
        if settled && evicting && allowed {
            Step::Pin
        } else {
            Step::Nothing
        }
    }

    /// Whether the thread is pinned now.
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// The pin was carried out.
    pub fn pinned(&mut self) {
        self.pinned = true;
    }

    /// The thread was let go at `now` (or a pin could not be made).
    pub fn released(&mut self, now: Instant, crowded: bool) {
        self.pinned = false;
        self.single_since = None;
        if crowded {
            self.not_before = Some(now + BACKOFF);
        }
    }
}

/// This process's pid: its main thread's tid.
fn own_pid() -> i32 {
    std::process::id() as i32
}

/// Whether co-scheduling can work here (see the module's docs).
pub fn possible() -> bool {
    sched::may_leave_idle() && sched::affinity(0).is_ok_and(|s| s.count() > 1)
}

/// Starts the watcher thread.
pub fn start(thread_start: fn()) -> std::io::Result<()> {
    uzswap_os::spawn_helper("uzswap-cosched", Some(thread_start), watch)?;
    ACTIVE.store(true, Ordering::Relaxed);
    Ok(())
}

fn watch() {
    let main = own_pid();
    let mut w = Watch::default();
    let mut waited = sched::run_delay_ns(main).unwrap_or(0);
    let mut helpers_pinned = 0;
    let mut last_evictions = 0;
    loop {
        std::thread::sleep(PERIOD);
        let Some(rt) = crate::RUNTIME.get() else {
            continue;
        };
        // Unpinned and not evicting, there is nothing to decide: no /proc
        // reads (every process of a tree has a watcher; an idle shell's
        // costs a clock wake-up and a counter).
        let evictions = rt.space.pager().usage().evictions;
        if !w.is_pinned() && evictions == last_evictions {
            continue;
        }
        last_evictions = evictions;
        let helpers = uzswap_os::fork::helper_tids().count();
        let Some(threads) = sched::thread_count() else {
            continue;
        };
        let Some(now_waited) = sched::run_delay_ns(main) else {
            return; // the main thread is gone: nothing to follow
        };
        let look = Look {
            own_threads: threads.saturating_sub(helpers),
            evictions,
            waited_ns: now_waited.saturating_sub(waited),
        };
        waited = now_waited;
        let now = Instant::now();
        match w.step(now, look) {
            Step::Pin => match pin(main) {
                Ok(()) => {
                    w.pinned();
                    helpers_pinned = helpers;
                    PINS.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => w.released(now, true),
            },
            Step::Release { crowded } => {
                release(main);
                w.released(now, crowded);
                RELEASES.fetch_add(1, Ordering::Relaxed);
                if crowded {
                    CROWDED.fetch_add(1, Ordering::Relaxed);
                }
            }
            Step::Nothing if w.is_pinned() && helpers != helpers_pinned => {
                // A helper started since (a writer, a forked child's
                // threads): it joins the others.
                if let Some(cpu) = pinned_cpu() {
                    pin_helpers(&CpuSet::one(cpu));
                }
                helpers_pinned = helpers;
            }
            Step::Nothing => {}
        }
    }
}

/// Pins the main thread where it last ran, and the helpers with it at idle
/// priority.
fn pin(main: i32) -> std::io::Result<()> {
    let original = sched::affinity(main)?;
    let cpu = sched::last_cpu(main)
        .filter(|&c| original.has(c))
        .ok_or_else(|| std::io::Error::other("the main thread's CPU is not in its affinity"))?;
    let one = CpuSet::one(cpu);
    // The answer `sched_getaffinity` gives is right before the pin is.
    save_original(&original);
    PINNED_CPU.store(cpu as i64, Ordering::Release);
    if let Err(e) = sched::set_affinity(main, &one) {
        PINNED_CPU.store(-1, Ordering::Release);
        return Err(e);
    }
    pin_helpers(&one);
    Ok(())
}

fn pin_helpers(one: &CpuSet) {
    for tid in uzswap_os::fork::helper_tids() {
        let _ = sched::set_affinity(tid, one);
        let _ = sched::set_idle(tid, true);
    }
}

/// Gives every thread of the process its affinity from before the pin, and
/// the helpers their normal policy.
fn release(main: i32) {
    if pinned_cpu().is_none() {
        return;
    }
    let original = original();
    for tid in uzswap_os::fork::helper_tids() {
        let _ = sched::set_idle(tid, false);
    }
    // Every thread: the helpers, and any the program started (it inherited
    // the pin).
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            if let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) {
                let _ = sched::set_affinity(tid, &original);
            }
        }
    } else {
        let _ = sched::set_affinity(main, &original);
    }
    PINNED_CPU.store(-1, Ordering::Release);
}

/// `fork()` prepare: a pinned forking thread gets its own affinity back for
/// the fork, so that the child starts with it.
pub fn before_fork() {
    if pinned_cpu().is_some() {
        let _ = sched::set_affinity(0, &original());
    }
}

/// `fork()` in the parent: a pinned thread goes back to the CPU of its
/// helpers (it may have moved during the fork). If the watcher let it go
/// meanwhile, nothing is pinned and nothing is done.
pub fn after_fork_parent() {
    if let Some(cpu) = pinned_cpu() {
        if sched::set_affinity(0, &CpuSet::one(cpu)).is_err() {
            release(own_pid());
        }
    }
}

/// `fork()` in the child: nothing is pinned there (its watcher starts
/// afresh; [`start`]).
pub fn after_fork_child() {
    PINNED_CPU.store(-1, Ordering::Release);
    ACTIVE.store(false, Ordering::Relaxed);
    for n in [&PINS, &RELEASES, &CROWDED] {
        n.store(0, Ordering::Relaxed);
    }
}

/// At start-up: a process started by a pinned thread with `vfork` or
/// `posix_spawn` (which run no fork handlers) inherited its one CPU; it
/// gets the affinity of the `uzswap run` that started the tree back
/// (`run` is its pid) if that has more CPUs and its parent runs on that
/// one CPU alone too. A process the user started on one CPU from a parent
/// that is not (`taskset -c N prog` in a script) keeps it.
pub fn release_inherited(run: u32) {
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() };
    let (Ok(mine), Ok(tree), Ok(theirs)) = (
        sched::affinity(0),
        sched::affinity(i32::try_from(run).unwrap_or(0)),
        sched::affinity(parent),
    ) else {
        return;
    };
    if inherited_pin(&mine, &tree, &theirs) {
        let _ = sched::set_affinity(0, &tree);
    }
}

/// Whether `mine` looks like a pin inherited from a parent that
/// co-scheduling pinned: one CPU of the tree's, which has more, and the
/// parent's affinity the same one CPU.
fn inherited_pin(mine: &CpuSet, tree: &CpuSet, parent: &CpuSet) -> bool {
    mine.count() == 1
        && tree.count() > 1
        && mine.cpus().iter().all(|&c| tree.has(c))
        && parent == mine
}

/// What `sched_getaffinity(pid)` answers the program while its main thread
/// is pinned: the affinity from before the pin, for the main thread (`pid`
/// 0 on it, or the process's pid). `None`: ask the kernel.
pub fn answer_for(pid: i32) -> Option<CpuSet> {
    pinned_cpu()?;
    let me = own_pid();
    // SAFETY: gettid has no preconditions.
    let on_main = unsafe { libc::gettid() } == me;
    (pid == me || (pid == 0 && on_main)).then(original)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn look(own_threads: usize, evictions: u64, waited_ns: u64) -> Look {
        Look {
            own_threads,
            evictions,
            waited_ns,
        }
    }

    #[test]
    fn only_a_pin_shared_with_the_parent_counts_as_inherited() {
        let all = CpuSet::from_bytes(&[0b11]);
        let (zero, one) = (CpuSet::one(0), CpuSet::one(1));
        assert!(inherited_pin(&one, &all, &one));
        // The user's `taskset -c 1` from an unpinned parent.
        assert!(!inherited_pin(&one, &all, &all));
        assert!(!inherited_pin(&one, &all, &zero));
        // Nothing to give back: the tree has one CPU, or this has more.
        assert!(!inherited_pin(&one, &one, &one));
        assert!(!inherited_pin(&all, &all, &all));
        // Not the tree's CPU.
        assert!(!inherited_pin(&CpuSet::one(5), &all, &CpuSet::one(5)));
    }

    #[test]
    fn a_single_thread_that_evicts_for_the_settle_time_is_pinned() {
        let mut w = Watch::default();
        let t0 = Instant::now();
        assert_eq!(w.step(t0, look(1, 0, 0)), Step::Nothing);
        assert_eq!(w.step(t0 + SETTLE / 2, look(1, 50, 0)), Step::Nothing);
        assert_eq!(w.step(t0 + SETTLE, look(1, 100, 0)), Step::Pin);
        w.pinned();
        assert_eq!(w.step(t0 + SETTLE * 2, look(1, 200, 0)), Step::Nothing);
    }

    #[test]
    fn no_pin_without_eviction_or_with_a_second_thread() {
        let mut w = Watch::default();
        let t0 = Instant::now();
        assert_eq!(w.step(t0, look(1, 7, 0)), Step::Nothing);
        assert_eq!(w.step(t0 + SETTLE, look(1, 7, 0)), Step::Nothing);
        // A second thread resets the clock: a JVM, node or Go process.
        let mut w = Watch::default();
        assert_eq!(w.step(t0, look(1, 0, 0)), Step::Nothing);
        assert_eq!(w.step(t0 + SETTLE / 2, look(3, 10, 0)), Step::Nothing);
        assert_eq!(w.step(t0 + SETTLE, look(1, 20, 0)), Step::Nothing);
        assert_eq!(w.step(t0 + SETTLE * 3 / 2, look(1, 30, 0)), Step::Nothing);
        assert_eq!(w.step(t0 + SETTLE * 2, look(1, 40, 0)), Step::Pin);
    }

    #[test]
    fn a_new_thread_or_a_crowded_cpu_lets_go_and_crowding_backs_off() {
        let mut w = Watch::default();
        let t0 = Instant::now();
        w.step(t0, look(1, 0, 0));
        assert_eq!(w.step(t0 + SETTLE, look(1, 1, 0)), Step::Pin);
        w.pinned();
        let t1 = t0 + SETTLE;
        assert_eq!(w.step(t1, look(2, 2, 0)), Step::Release { crowded: false });
        w.released(t1, false);
        // Not crowded: pinned again after a settle time.
        w.step(t1, look(1, 2, 0));
        assert_eq!(w.step(t1 + SETTLE, look(1, 3, 0)), Step::Pin);
        w.pinned();
        let busy = PERIOD.as_nanos() as u64 / 2;
        assert_eq!(
            w.step(t1 + SETTLE, look(1, 4, busy)),
            Step::Release { crowded: true }
        );
        let t2 = t1 + SETTLE;
        w.released(t2, true);
        w.step(t2, look(1, 4, 0));
        assert_eq!(w.step(t2 + SETTLE, look(1, 5, 0)), Step::Nothing);
        assert_eq!(w.step(t2 + BACKOFF, look(1, 6, 0)), Step::Pin);
    }
}
