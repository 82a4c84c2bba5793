//! Co-scheduling: a process whose work is done by one thread, and that is
//! evicting, runs that thread on one CPU, and the runtime's threads for it
//! run on that CPU at idle priority.
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
//! to the other, idle, CPU away from its helpers. Under the same budget
//! `xz -9` takes 38.0 s with co-scheduling against 52.8 s without, a
//! Python dict 35 s against 43 s, with a third less CPU (`uzswap-bench
//! programs`, docs/BENCHMARKS.md).
//!
//! When: for [`SETTLE`] the process has had the same threads of its own
//! (the rest are the runtime's helpers), its pager evicted, and one thread
//! did the work: the only one, or one that used at least 5 % of a CPU
//! while the others together used less than a tenth of what it did (node's
//! main thread beside V8's and libuv's waiting threads; a JVM's main
//! thread beside its compiler and GC threads), and that thread, when it
//! is the process's first, waited for a CPU less than a quarter of the
//! settle time (another thread's `schedstat` is not read while it is not
//! pinned: see `first_thread_run_delay`): one that shares the CPUs
//! with others (a `make -j8`'s compilers on two CPUs wait three quarters)
//! would lose the CPU that comes free, and its helpers at idle priority
//! would get next to none (a `make -j8` under 198 MiB takes 1.08 × the
//! time it takes without co-scheduling: `uzswap-bench tree`,
//! docs/BENCHMARKS.md). The watcher reads /proc
//! only while its pager evicts, or while a thread is pinned. Only the busy
//! thread is pinned: the others keep their affinity, and a runtime sizing
//! a thread pool at start-up has not evicted for a settle time yet.
//!
//! Let go (the threads' own affinity back, the helpers' too and their
//! normal policy) when the process starts or ends a thread (a thread the
//! pinned one starts inherits the pin: all get the affinity back); when the
//! pinned thread waits for its CPU for more than a quarter of [`PERIOD`]
//! in [`CROWDED_PERIODS`] periods in a row (something else runs there: the
//! scheduler may then place it elsewhere; one such period alone is a
//! kernel worker's or an interrupt's work, which passes), or sits in a
//! fault at the end of as many periods in which it and its helpers
//! together ran less than a quarter of each (something else runs there,
//! and at idle priority the helpers that would serve its page get next to
//! none of the CPU); or when a fault has waited unread for [`STUCK`]
//! (another thread faulted, and the helpers at idle priority wait for the
//! busy one to block). After the last two, not again for [`BACKOFF`]. The
//! watcher itself is never pinned nor at idle priority, or it could not
//! see the CPU crowded. Without these releases, with a busy loop on each
//! CPU, `sort` under 48 MiB does not end in 120 s where it takes 44 s
//! without co-scheduling, and three forked Python workers, two pinned to
//! one CPU, never end (`uzswap-bench programs` on crowded CPUs,
//! docs/BENCHMARKS.md).
//!
//! What the program sees: `sched_getaffinity` (libc's, which this library
//! replaces) answers the affinity the thread had before it was pinned, so
//! a program sizing a pool by it is not misled. `fork()` unpins the
//! forking thread for the fork, so the child starts with the affinity it
//! would have had; a child started with `vfork` or `posix_spawn` inherits
//! the pin, and its runtime (`release_inherited`) gives it the affinity of
//! `uzswap run` back when it starts with one CPU where the run has more and
//! a thread of its parent runs on that CPU alone. A static binary started that way has
//! no runtime and keeps the one CPU.
//!
//! Only where the helpers may leave idle priority again
//! (`uzswap_os::sched::may_leave_idle`: root, `CAP_SYS_NICE` or
//! `RLIMIT_NICE`), and not with CPU handlers (they are bound per CPU).

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use uzswap_os::sched::{self, CpuSet};

/// How often the watcher looks.
pub const PERIOD: Duration = Duration::from_millis(10);
/// The longest the watcher sleeps while its process is unpinned and not
/// evicting: the pause doubles up to this from [`PERIOD`] (a tree's idle
/// processes woke 100 times a second for nothing). Eviction is seen this
/// much later at worst, against a [`SETTLE`] of a second before a pin.
pub const IDLE_PERIOD: Duration = Duration::from_millis(80);
/// How long a process must have had one thread of its own, and evicted,
/// before it is pinned.
pub const SETTLE: Duration = Duration::from_secs(1);
/// How long after a release for crowding before the thread is pinned again.
pub const BACKOFF: Duration = Duration::from_secs(10);
/// Periods in a row the pinned thread must wait for its CPU (more than a
/// quarter of each) before it is let go for crowding. One period is not
/// enough: a single period of 2.5-4 ms waiting (a kernel worker's turn on
/// that CPU) would let a Python program go about once in 30 s, and it
/// would then run unpinned for [`BACKOFF`] and a settle time (`uzswap-bench
/// programs`, docs/BENCHMARKS.md); a program that shares the CPU with
/// another busy one waits in every period.
pub const CROWDED_PERIODS: u32 = 3;
/// A fault unread this long while a thread is pinned waits behind it: the
/// helpers at idle priority run only when the pinned thread waits.
pub const STUCK: Duration = Duration::from_millis(5);

/// The CPU the busy thread is pinned to by us, -1 if none: set before the
/// pin is made and cleared after it is undone (read by
/// `sched_getaffinity`, the fork hooks and the statistics).
static PINNED_CPU: AtomicI64 = AtomicI64::new(-1);
/// The thread pinned: written before [`PINNED_CPU`] is set (and left
/// after it is cleared; read only while it is set).
static PINNED_TID: AtomicI64 = AtomicI64::new(-1);
/// The statistics ([`stats`]) besides [`PINNED_CPU`]: the watcher runs;
/// pins, releases, releases for crowding.
static ACTIVE: AtomicBool = AtomicBool::new(false);
static PINS: AtomicU64 = AtomicU64::new(0);
static RELEASES: AtomicU64 = AtomicU64::new(0);
static CROWDED: AtomicU64 = AtomicU64::new(0);
/// The watcher's thread, which stays out of the pin (0 before it runs).
static WATCHER: AtomicI32 = AtomicI32::new(0);

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
/// The CPU the busy thread is pinned to by us.
fn pinned_cpu() -> Option<usize> {
    usize::try_from(PINNED_CPU.load(Ordering::Acquire)).ok()
}

/// The thread pinned, while one is ([`PINNED_TID`] is read after
/// [`PINNED_CPU`] is seen set).
fn pinned_tid() -> Option<i32> {
    pinned_cpu()?;
    i32::try_from(PINNED_TID.load(Ordering::Relaxed)).ok()
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
#[derive(Clone, Debug, Default)]
pub struct Look {
    /// The program's own threads (not the runtime's), with the CPU time
    /// each has used so far (ns), sorted by tid.
    pub threads: Vec<(i32, u64)>,
    /// The pager's evictions so far.
    pub evictions: u64,
    /// How long the pinned thread waited for its CPU this period, ns.
    pub waited_ns: u64,
    /// The pinned thread waits for a page, and it and its helpers ran
    /// less than a quarter of this period: the helpers do not get the CPU
    /// to serve the page.
    pub starved: bool,
    /// A fault has waited unread for at least [`STUCK`] while the pinned
    /// thread runs: another thread faulted, and the helpers wait for the
    /// pinned one to block.
    pub fault_stuck: bool,
}

/// What to do after a look.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Nothing,
    /// Pin this thread.
    Pin(i32),
    /// Let go; `crowded`: because the thread waited for its CPU, or
    /// another thread's fault waited for the helpers.
    Release {
        crowded: bool,
    },
}

/// The watcher's state: the settle time under way; the thread pinned and
/// the threads there were when it was; when it may be pinned again.
#[derive(Debug, Default)]
pub struct Watch {
    since: Option<Settle>,
    pinned: Option<(i32, Vec<i32>)>,
    not_before: Option<Instant>,
    /// Periods in a row the pinned thread has waited for its CPU.
    waiting: u32,
}

/// Threads `(tid, CPU time so far, ns)`, sorted by tid.
type Threads = Vec<(i32, u64)>;

/// A settle time: since when the process has had the same threads, and
/// what was seen then.
#[derive(Debug)]
struct Settle {
    at: Instant,
    /// The pager's evictions then.
    evictions: u64,
    /// The threads then, with their CPU times.
    threads: Threads,
    /// How long each thread whose run delay could be read had waited,
    /// runnable, for a CPU then `(tid, ns)`.
    delays: Vec<(i32, u64)>,
}

fn tids(threads: &[(i32, u64)]) -> Vec<i32> {
    threads.iter().map(|&(t, _)| t).collect()
}

/// The thread that did the process's work between two snapshots of the
/// same threads: the only one, or one that used at least 5 % of a CPU
/// while the others together used less than a tenth of what it did (a
/// runtime's JIT, GC and I/O threads that wait).
fn the_busy_one(then: &[(i32, u64)], now: &[(i32, u64)], elapsed: Duration) -> Option<i32> {
    if let [(t, _)] = now {
        return Some(*t);
    }
    let used: Vec<(i32, u64)> = then
        .iter()
        .zip(now)
        .map(|(&(t, a), &(_, b))| (t, b.saturating_sub(a)))
        .collect();
    let &(busiest, most) = used.iter().max_by_key(|&&(_, u)| u)?;
    let rest: u64 = used.iter().map(|&(_, u)| u).sum::<u64>() - most;
    (most >= elapsed.as_nanos() as u64 / 20 && rest * 10 < most).then_some(busiest)
}

impl Watch {
    /// The decision at `now` (the caller carries it out and then calls
    /// [`Watch::pinned`] or [`Watch::released`]). `run_delay`: how long a
    /// thread of the process has waited, runnable, for a CPU so far (ns;
    /// asked when a settle time starts, for each thread, and at its end,
    /// for the busy one; `None`: not known, and a busy thread's crowding
    /// is then not judged).
    pub fn step(
        &mut self,
        now: Instant,
        look: &Look,
        run_delay: &dyn Fn(i32) -> Option<u64>,
    ) -> Step {
        if let Some((_, at_pin)) = &self.pinned {
            if tids(&look.threads) != *at_pin {
                // A thread started (it inherited the pin) or ended.
                return Step::Release { crowded: false };
            }
            let quarter = PERIOD.as_nanos() as u64 / 4;
            if look.waited_ns > quarter || look.starved {
                self.waiting += 1;
            } else {
                self.waiting = 0;
            }
            if self.waiting >= CROWDED_PERIODS || look.fault_stuck {
                return Step::Release { crowded: true };
            }
            return Step::Nothing;
        }
        let same = self
            .since
            .as_ref()
            .is_some_and(|s| tids(&s.threads) == tids(&look.threads));
        if !same {
            self.start_settle(now, look, run_delay);
            return Step::Nothing;
        }
        let Some(settle) = &self.since else {
            return Step::Nothing;
        };
        let elapsed = now.duration_since(settle.at);
        if elapsed < SETTLE {
            return Step::Nothing;
        }
        let evicting = look.evictions > settle.evictions;
        let busy = the_busy_one(&settle.threads, &look.threads, elapsed);
        let allowed = self.not_before.is_none_or(|t| now >= t);
        // A busy thread that waited for its CPU more than a quarter of the
        // settle time shares it with others (a parallel build's compilers,
        // another program): pinned, it could not move to the CPU that comes
        // free, and its helpers at idle priority would get next to none.
        // A delay not known (no `schedstat`, or not the first thread):
        // not judged, and the release for crowding cannot see it either.
        let crowded = |t: i32| {
            let &(_, then) = settle.delays.iter().find(|&&(d, _)| d == t)?;
            Some(run_delay(t)?.saturating_sub(then) > elapsed.as_nanos() as u64 / 4)
        };
        let step = match busy {
            Some(t) if evicting && allowed && crowded(t) != Some(true) => Step::Pin(t),
            _ => Step::Nothing,
        };
        // Whatever happens, the next settle time starts here.
        self.start_settle(now, look, run_delay);
        step
    }

    /// A settle time starts at `now`: the threads of `look`, with their
    /// CPU times and run delays.
    fn start_settle(&mut self, now: Instant, look: &Look, run_delay: &dyn Fn(i32) -> Option<u64>) {
        let delays = look
            .threads
            .iter()
            .filter_map(|&(t, _)| Some((t, run_delay(t)?)))
            .collect();
        self.since = Some(Settle {
            at: now,
            evictions: look.evictions,
            threads: look.threads.clone(),
            delays,
        });
    }

    /// Whether a thread is pinned now.
    pub fn is_pinned(&self) -> bool {
        self.pinned.is_some()
    }

    /// The pin of `tid` was carried out; `threads`: the program's threads
    /// then.
    pub fn pinned(&mut self, tid: i32, threads: &[(i32, u64)]) {
        self.pinned = Some((tid, tids(threads)));
        self.waiting = 0;
    }

    /// The thread was let go at `now` (or a pin could not be made).
    pub fn released(&mut self, now: Instant, crowded: bool) {
        self.pinned = None;
        self.since = None;
        if crowded {
            self.not_before = Some(now + BACKOFF);
        }
    }
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

/// The program's threads (not the runtime's helpers) and their CPU times.
fn own_threads(helpers: &[i32]) -> Vec<(i32, u64)> {
    sched::threads_cpu_ns(helpers)
}

fn watch() {
    WATCHER.store(crate::sys::gettid(), Ordering::Relaxed);
    let mut w = Watch::default();
    let mut waited = 0;
    // While a thread is pinned: when the last look was, and the CPU time
    // it and its helpers had used then.
    let mut ran_then: Option<(Instant, u64)> = None;
    let mut helpers_pinned = 0;
    let mut last_evictions = 0;
    let mut pause = PERIOD;
    loop {
        std::thread::sleep(pause);
        let Some(rt) = crate::RUNTIME.get() else {
            continue;
        };
        // Unpinned and not evicting, there is nothing to decide: no /proc
        // reads (every process of a tree has a watcher; an idle shell's
        // costs a clock wake-up and a counter, less and less often).
        let evictions = rt.space.pager().usage().evictions;
        if !w.is_pinned() && evictions == last_evictions {
            pause = (pause * 2).min(IDLE_PERIOD);
            continue;
        }
        pause = PERIOD;
        last_evictions = evictions;
        let helpers: Vec<i32> = uzswap_os::fork::helper_tids().collect();
        let threads = own_threads(&helpers);
        let pinned = pinned_tid();
        let now_waited = pinned.and_then(sched::run_delay_ns).unwrap_or(0);
        let ran = pinned.map(|p| (Instant::now(), pinned_and_helpers_cpu_ns(p, &threads)));
        let starved = match (ran_then, ran, pinned) {
            (Some((t0, then)), Some((t1, now)), Some(tid)) => {
                now.saturating_sub(then) < t1.duration_since(t0).as_nanos() as u64 / 4
                    && sched::waits_for_page(tid) == Some(true)
            }
            _ => false,
        };
        ran_then = ran;
        let look = Look {
            threads,
            evictions,
            waited_ns: now_waited.saturating_sub(waited),
            starved,
            // Not its own fault: the pinned thread runs meanwhile.
            fault_stuck: rt
                .space
                .pager()
                .fault_unread_for()
                .is_some_and(|d| d >= STUCK)
                && pinned.and_then(sched::runnable) == Some(true),
        };
        waited = now_waited;
        let now = Instant::now();
        match w.step(now, &look, &first_thread_run_delay) {
            Step::Pin(tid) => match pin(tid) {
                Ok(()) => {
                    w.pinned(tid, &look.threads);
                    waited = sched::run_delay_ns(tid).unwrap_or(0);
                    helpers_pinned = helpers.len();
                    PINS.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => w.released(now, true),
            },
            Step::Release { crowded } => {
                release();
                w.released(now, crowded);
                RELEASES.fetch_add(1, Ordering::Relaxed);
                if crowded {
                    CROWDED.fetch_add(1, Ordering::Relaxed);
                }
            }
            Step::Nothing if w.is_pinned() && helpers.len() != helpers_pinned => {
                // A helper started since (a writer, a forked child's
                // threads): it joins the others.
                if let Some(cpu) = pinned_cpu() {
                    pin_helpers(&CpuSet::one(cpu));
                }
                helpers_pinned = helpers.len();
            }
            Step::Nothing => {}
        }
    }
}

/// The run delay of the process's first thread (`sched::run_delay_ns`);
/// `None` for any other, whose `/proc` files the watcher opens only while
/// it is pinned (the invariant in crates/os: a file of another thread
/// makes the reaping of the process dearer).
fn first_thread_run_delay(tid: i32) -> Option<u64> {
    (u32::try_from(tid).ok() == Some(std::process::id()))
        .then(|| sched::run_delay_ns(tid))
        .flatten()
}

/// The CPU time the pinned thread (`pinned`, among `threads`) and its
/// helpers (all but the watcher) have used, ns.
fn pinned_and_helpers_cpu_ns(pinned: i32, threads: &[(i32, u64)]) -> u64 {
    let watcher = WATCHER.load(Ordering::Relaxed);
    let own = threads
        .iter()
        .find(|&&(t, _)| t == pinned)
        .map_or(0, |&(_, ns)| ns);
    let helpers: u64 = uzswap_os::fork::helper_tids()
        .filter(|&t| t != watcher)
        .filter_map(uzswap_os::cpu::thread_cpu_ns)
        .sum();
    own + helpers
}

/// Pins thread `tid` where it last ran, and the helpers with it at idle
/// priority.
fn pin(tid: i32) -> std::io::Result<()> {
    let original = sched::affinity(tid)?;
    let cpu = sched::last_cpu(tid)
        .filter(|&c| original.has(c))
        .ok_or_else(|| std::io::Error::other("the thread's CPU is not in its affinity"))?;
    let one = CpuSet::one(cpu);
    // The answer `sched_getaffinity` gives is right before the pin is.
    save_original(&original);
    PINNED_TID.store(i64::from(tid), Ordering::Relaxed);
    PINNED_CPU.store(cpu as i64, Ordering::Release);
    if let Err(e) = sched::set_affinity(tid, &one) {
        PINNED_CPU.store(-1, Ordering::Release);
        return Err(e);
    }
    pin_helpers(&one);
    Ok(())
}

/// Pins the helpers but the watcher to `one`, at idle priority.
fn pin_helpers(one: &CpuSet) {
    let watcher = WATCHER.load(Ordering::Relaxed);
    for tid in uzswap_os::fork::helper_tids().filter(|&t| t != watcher) {
        let _ = sched::set_affinity(tid, one);
        let _ = sched::set_idle(tid, true);
    }
}

/// Gives the threads on the pinned CPU the pinned thread's affinity from
/// before the pin, and the helpers their normal policy.
fn release() {
    let Some(cpu) = pinned_cpu() else {
        return;
    };
    let (one, original) = (CpuSet::one(cpu), original());
    for tid in uzswap_os::fork::helper_tids() {
        let _ = sched::set_idle(tid, false);
    }
    // The threads on the pinned CPU alone: the helpers, the pinned one, and
    // any it started (they inherited the pin). A thread the program placed
    // elsewhere itself keeps its affinity.
    for (tid, _) in sched::threads_cpu_ns(&[]) {
        if sched::affinity(tid).is_ok_and(|a| a == one) {
            let _ = sched::set_affinity(tid, &original);
        }
    }
    PINNED_CPU.store(-1, Ordering::Release);
}

/// `fork()` prepare: a pinned forking thread gets its own affinity back for
/// the fork, so that the child starts with it.
pub fn before_fork() {
    if pinned_cpu().is_some() && on_pinned_thread() {
        let _ = sched::set_affinity(0, &original());
    }
}

/// `fork()` in the parent: a pinned thread goes back to the CPU of its
/// helpers (it may have moved during the fork). If the watcher let it go
/// meanwhile, nothing is pinned and nothing is done.
pub fn after_fork_parent() {
    if let Some(cpu) = pinned_cpu() {
        if on_pinned_thread() && sched::set_affinity(0, &CpuSet::one(cpu)).is_err() {
            release();
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
    let parent = crate::sys::getppid();
    let (Ok(mine), Ok(tree)) = (
        sched::affinity(0),
        sched::affinity(i32::try_from(run).unwrap_or(0)),
    ) else {
        return;
    };
    if inherited_pin(&mine, &tree, &sched::thread_affinities(parent)) {
        let _ = sched::set_affinity(0, &tree);
    }
}

/// Whether `mine` looks like a pin inherited from a parent that
/// co-scheduling pinned: one CPU of the tree's, which has more, and a
/// thread of the parent (`parent`: their affinities) on that one CPU.
fn inherited_pin(mine: &CpuSet, tree: &CpuSet, parent: &[CpuSet]) -> bool {
    mine.count() == 1
        && tree.count() > 1
        && mine.cpus().iter().all(|&c| tree.has(c))
        && parent.contains(mine)
}

/// What `sched_getaffinity(pid)` answers the program while one of its
/// threads is pinned: the affinity from before the pin, for that thread
/// (`pid` 0 on it, or its tid; the process's pid when it is the main
/// thread). `None`: ask the kernel.
pub fn answer_for(pid: i32) -> Option<CpuSet> {
    pinned_cpu()?;
    let pinned = pinned_tid()?;
    (pid == pinned || (pid == 0 && on_pinned_thread())).then(original)
}

/// Whether the calling thread is the one pinned (or being pinned).
fn on_pinned_thread() -> bool {
    pinned_tid() == Some(crate::sys::gettid())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// A look at threads `(tid, CPU ns)`.
    fn look(threads: &[(i32, u64)], evictions: u64, waited_ns: u64) -> Look {
        Look {
            threads: threads.to_vec(),
            evictions,
            waited_ns,
            starved: false,
            fault_stuck: false,
        }
    }

    /// A thread that never waited for a CPU.
    fn never_waits(_: i32) -> Option<u64> {
        Some(0)
    }

    /// One thread of its own, with no CPU time to speak of.
    fn one(evictions: u64) -> Look {
        look(&[(10, 0)], evictions, 0)
    }

    #[test]
    fn only_a_pin_shared_with_the_parent_counts_as_inherited() {
        let all = CpuSet::from_bytes(&[0b11]);
        let (zero, one) = (CpuSet::one(0), CpuSet::one(1));
        assert!(inherited_pin(&one, &all, &[one]));
        // Any thread of the parent: the pinned one need not be its first.
        assert!(inherited_pin(&one, &all, &[all, one, all]));
        // The user's `taskset -c 1` from an unpinned parent.
        assert!(!inherited_pin(&one, &all, &[all, all]));
        assert!(!inherited_pin(&one, &all, &[zero]));
        assert!(!inherited_pin(&one, &all, &[]));
        // Nothing to give back: the tree has one CPU, or this has more.
        assert!(!inherited_pin(&one, &one, &[one]));
        assert!(!inherited_pin(&all, &all, &[all]));
        // Not the tree's CPU.
        assert!(!inherited_pin(&CpuSet::one(5), &all, &[CpuSet::one(5)]));
    }

    #[test]
    fn a_single_thread_that_evicts_for_the_settle_time_is_pinned() {
        let mut w = Watch::default();
        let t0 = Instant::now();
        assert_eq!(w.step(t0, &one(0), &never_waits), Step::Nothing);
        assert_eq!(
            w.step(t0 + SETTLE / 2, &one(50), &never_waits),
            Step::Nothing
        );
        assert_eq!(w.step(t0 + SETTLE, &one(100), &never_waits), Step::Pin(10));
        w.pinned(10, &one(100).threads);
        assert_eq!(
            w.step(t0 + SETTLE * 2, &one(200), &never_waits),
            Step::Nothing
        );
    }

    #[test]
    fn a_busy_thread_that_waited_for_its_cpu_a_quarter_of_the_settle_time_is_not_pinned() {
        use std::cell::Cell;
        let t0 = Instant::now();
        let quarter = SETTLE.as_nanos() as u64 / 4;
        // Its run delay: 5 ms at the start of the settle time, then as the
        // test sets it.
        let delay = Cell::new(5 * MS);
        let read = |_: i32| Some(delay.get());
        let mut w = Watch::default();
        assert_eq!(w.step(t0, &one(0), &read), Step::Nothing);
        // Waited just over a quarter (eight compilers on two CPUs wait
        // three quarters): not pinned.
        delay.set(5 * MS + quarter + 1);
        assert_eq!(w.step(t0 + SETTLE, &one(10), &read), Step::Nothing);
        // The next settle time counts from there: a quarter exactly is
        // not crowded.
        delay.set(delay.get() + quarter);
        assert_eq!(w.step(t0 + SETTLE * 2, &one(20), &read), Step::Pin(10));
        // A run delay that cannot be read says nothing either way.
        let mut w = Watch::default();
        w.step(t0, &one(0), &|_| None);
        assert_eq!(w.step(t0 + SETTLE, &one(10), &read), Step::Pin(10));
    }

    #[test]
    fn no_pin_without_eviction_or_with_a_second_thread_at_work() {
        let mut w = Watch::default();
        let t0 = Instant::now();
        assert_eq!(w.step(t0, &one(7), &never_waits), Step::Nothing);
        assert_eq!(w.step(t0 + SETTLE, &one(7), &never_waits), Step::Nothing);
        // A thread started resets the clock.
        let mut w = Watch::default();
        let two = |a, b, ev| look(&[(10, a), (11, b)], ev, 0);
        assert_eq!(w.step(t0, &one(0), &never_waits), Step::Nothing);
        assert_eq!(
            w.step(t0 + SETTLE / 2, &two(0, 0, 10), &never_waits),
            Step::Nothing
        );
        assert_eq!(
            w.step(t0 + SETTLE, &two(0, 0, 20), &never_waits),
            Step::Nothing
        );
        // Both at work (a Go program's threads, a JVM's parallel GC).
        let t1 = t0 + SETTLE / 2 + SETTLE;
        assert_eq!(
            w.step(t1, &two(400 * MS, 300 * MS, 30), &never_waits),
            Step::Nothing
        );
        // One at work, the other waiting: the busy one is pinned.
        let t2 = t1 + SETTLE;
        assert_eq!(
            w.step(
                t2,
                &two(400 * MS + 300 * MS, 300 * MS + 5 * MS, 40),
                &never_waits
            ),
            Step::Pin(10)
        );
        // Nobody at work (each waits for the other): no pin.
        let mut w = Watch::default();
        w.step(t0, &two(0, 0, 0), &never_waits);
        assert_eq!(
            w.step(t0 + SETTLE, &two(MS, MS / 2, 1), &never_waits),
            Step::Nothing
        );
    }

    #[test]
    fn a_new_thread_a_crowded_cpu_or_a_stuck_fault_lets_go_and_crowding_backs_off() {
        let mut w = Watch::default();
        let t0 = Instant::now();
        w.step(t0, &one(0), &never_waits);
        assert_eq!(w.step(t0 + SETTLE, &one(1), &never_waits), Step::Pin(10));
        w.pinned(10, &one(1).threads);
        let t1 = t0 + SETTLE;
        let two = look(&[(10, 0), (11, 0)], 2, 0);
        assert_eq!(
            w.step(t1, &two, &never_waits),
            Step::Release { crowded: false }
        );
        w.released(t1, false);
        // Not crowded: pinned again after a settle time.
        w.step(t1, &one(2), &never_waits);
        assert_eq!(w.step(t1 + SETTLE, &one(3), &never_waits), Step::Pin(10));
        w.pinned(10, &one(3).threads);
        let busy = PERIOD.as_nanos() as u64 / 2;
        // A period of waiting alone passes, and so do two in a row; as
        // many in a row as CROWDED_PERIODS let go.
        let waits = [busy, 0, busy, busy, 0];
        for (i, &waited) in waits.iter().enumerate() {
            let at = t1 + SETTLE + PERIOD * i as u32;
            assert_eq!(
                w.step(at, &look(&[(10, 0)], 4, waited), &never_waits),
                Step::Nothing
            );
        }
        for i in 1..CROWDED_PERIODS {
            let at = t1 + SETTLE + PERIOD * (waits.len() as u32 + i);
            assert_eq!(
                w.step(at, &look(&[(10, 0)], 4, busy), &never_waits),
                Step::Nothing
            );
        }
        assert_eq!(
            w.step(t1 + SETTLE * 2, &look(&[(10, 0)], 4, busy), &never_waits),
            Step::Release { crowded: true }
        );
        let t2 = t1 + SETTLE;
        w.released(t2, true);
        w.step(t2, &one(4), &never_waits);
        assert_eq!(w.step(t2 + SETTLE, &one(5), &never_waits), Step::Nothing);
        w.step(t2 + BACKOFF - SETTLE, &one(6), &never_waits);
        assert_eq!(w.step(t2 + BACKOFF, &one(7), &never_waits), Step::Pin(10));
        w.pinned(10, &one(7).threads);
        // Another thread's fault waits behind the pinned one.
        let mut stuck = one(8);
        stuck.fault_stuck = true;
        assert_eq!(
            w.step(t2 + BACKOFF, &stuck, &never_waits),
            Step::Release { crowded: true }
        );
        // The helpers starve while the pinned thread waits for a page, as
        // many periods in a row as CROWDED_PERIODS.
        let t3 = t2 + BACKOFF * 2;
        w.released(t2 + BACKOFF, true);
        w.step(t3, &one(9), &never_waits);
        assert_eq!(w.step(t3 + SETTLE, &one(10), &never_waits), Step::Pin(10));
        w.pinned(10, &one(10).threads);
        let mut starved = one(11);
        starved.starved = true;
        for i in 1..CROWDED_PERIODS {
            assert_eq!(
                w.step(t3 + SETTLE + PERIOD * i, &starved, &never_waits),
                Step::Nothing
            );
        }
        assert_eq!(
            w.step(t3 + SETTLE * 2, &starved, &never_waits),
            Step::Release { crowded: true }
        );
    }
}
