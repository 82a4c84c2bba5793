//! Helper threads: how every crate of uzswap starts its background threads
//! (the allocator's compactor, the cache's writer, the pager's handlers and
//! evictor, the runtime's watchers).
//!
//! They are plain POSIX threads, started with `pthread_create` and not
//! through `std::thread`, because a helper may be started in a forked child
//! (the pager and the cache start theirs again there, from the fork hook).
//! In a Rust program, a thread that `std::thread` starts or ends takes a
//! process-wide lock of the standard library (the table of thread stacks
//! for its stack-overflow report). If another thread of the parent was
//! starting or ending at the instant of the fork, the child's copy of that
//! lock stays taken for ever, and the child's first new thread waits on it
//! for ever: about once in 179 forks of
//! `a_fork_while_another_thread_drops_a_pager_does_not_hang` with
//! `std::thread`, the forked child's handler thread would stick in its
//! start-up, and every fault of the child wait too. Nothing the standard
//! library holds is taken on
//! the way in or out of a helper here: the thread library's own state is
//! made safe across `fork()` by the C library.
//!
//! What is given up: the standard library's report of a helper's stack
//! overflow (the process still dies of it, by `SIGSEGV`), and its name in
//! a panic message (the helper's name is printed after it instead).
//!
//! A helper blocks every signal but those a fault raises on the faulting
//! thread (`SIGSEGV`, `SIGBUS`, `SIGILL`, `SIGFPE`, `SIGTRAP`): a signal
//! sent to the process goes to a thread that does not block it, and a
//! program that blocks one in its own threads (to take it with
//! `sigwait`, `sigtimedwait` or `signalfd`, or to keep it pending) must
//! not have it delivered to a helper instead. The mask is set in the
//! creating thread around `pthread_create`, so the new thread has it from
//! its first instruction.

use std::cell::Cell;
use std::ffi::c_void;
use std::panic::AssertUnwindSafe;

/// A helper's stack, as `std::thread` gives its threads by default.
const STACK_BYTES: usize = 2 << 20;

/// What a helper's body ended with: `Err` holds a panic's payload.
type Outcome = std::thread::Result<()>;

/// The work a new thread runs.
type Start = Box<dyn FnOnce() + Send>;

/// A running (or finished, not yet joined) helper thread. Dropped without
/// [`Helper::join`], the thread is detached and runs on.
#[derive(Debug)]
pub struct Helper {
    thread: libc::pthread_t,
    /// Joined or detached already.
    done: bool,
}

impl Helper {
    /// Waits for the thread to end: `Err` with the payload if its body
    /// panicked (the panic was reported on stderr as it happened).
    ///
    /// # Panics
    /// If called from the helper itself, which would wait for ever.
    pub fn join(mut self) -> Outcome {
        let mut ret: *mut c_void = std::ptr::null_mut();
        // SAFETY: `thread` was started by `spawn` and is neither joined nor
        // detached (`done` is false until here; `self` is consumed).
        let r = unsafe { libc::pthread_join(self.thread, &mut ret) };
        self.done = true;
        assert_eq!(r, 0, "joining a helper thread: error {r}");
        // SAFETY: `start` returned this pointer from `Box::into_raw` of an
        // `Outcome`, and a thread is joined once, so it is taken once.
        *unsafe { Box::from_raw(ret.cast::<Outcome>()) }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if !self.done {
            // The outcome of a detached thread is never read: a box of two
            // words leaks when it ends.
            // SAFETY: neither joined nor detached before (`done`).
            unsafe { libc::pthread_detach(self.thread) };
        }
    }
}

/// The new thread's entry: names itself, runs the work, and returns its
/// outcome boxed for `join`.
extern "C" fn start(arg: *mut c_void) -> *mut c_void {
    // SAFETY: `spawn` passed `Box::into_raw` of a `(name, Start)` and gave
    // up the box; this is the only thread that takes it.
    let boxed = unsafe { Box::from_raw(arg.cast::<(std::ffi::CString, Start)>()) };
    let (name, work) = *boxed;
    // SAFETY: a thread may name itself; the name is at most 15 bytes and
    // NUL-terminated (`spawn`).
    unsafe { libc::pthread_setname_np(libc::pthread_self(), name.as_ptr()) };
    let outcome: Outcome = std::panic::catch_unwind(AssertUnwindSafe(work));
    if outcome.is_err() {
        crate::say(&format!(
            "uzswap: the helper thread {} panicked (reported above)",
            name.to_string_lossy()
        ));
    }
    Box::into_raw(Box::new(outcome)).cast()
}

/// Starts `work` on a new helper thread named `name` (cut to the 15 bytes
/// the kernel keeps).
fn spawn(name: &str, work: Start) -> std::io::Result<Helper> {
    let mut short: Vec<u8> = name.bytes().filter(|&b| b != 0).take(15).collect();
    while std::str::from_utf8(&short).is_err() {
        short.pop();
    }
    let name = std::ffi::CString::new(short).expect("NUL bytes were taken out");
    let arg = Box::into_raw(Box::new((name, work)));
    // SAFETY: a zeroed attribute object is what pthread_attr_init fills in.
    let mut attr: libc::pthread_attr_t = unsafe { std::mem::zeroed() };
    let mut thread: libc::pthread_t = 0;
    // SAFETY: `attr` is initialised before use and destroyed after; on
    // success `start` owns `arg`, on failure it is taken back below.
    let r = unsafe {
        libc::pthread_attr_init(&mut attr);
        libc::pthread_attr_setstacksize(&mut attr, STACK_BYTES);
        let mask = HelperMask::block();
        let r = libc::pthread_create(&mut thread, &attr, start, arg.cast());
        drop(mask);
        libc::pthread_attr_destroy(&mut attr);
        r
    };
    if r != 0 {
        // SAFETY: the thread was not created, so `arg` is still ours.
        drop(unsafe { Box::from_raw(arg) });
        return Err(std::io::Error::from_raw_os_error(r));
    }
    Ok(Helper {
        thread,
        done: false,
    })
}

/// The calling thread's signal mask, with every asynchronous signal blocked
/// while this lives (see the module docs); dropped, the mask is restored.
struct HelperMask(libc::sigset_t);

impl HelperMask {
    fn block() -> HelperMask {
        // SAFETY: sigfillset/sigdelset fill a set of our own; the old mask
        // is written by pthread_sigmask before it is ever read.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut set);
            for sig in [
                libc::SIGSEGV,
                libc::SIGBUS,
                libc::SIGILL,
                libc::SIGFPE,
                libc::SIGTRAP,
            ] {
                libc::sigdelset(&mut set, sig);
            }
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            HelperMask(old)
        }
    }
}

impl Drop for HelperMask {
    fn drop(&mut self) {
        // SAFETY: restores the mask `block` saved on this same thread.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
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
/// is model-checked starts its threads through [`crate::sync::thread`]
/// instead.
pub fn spawn_helper<F>(name: &str, thread_start: Option<fn()>, body: F) -> std::io::Result<Helper>
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
) -> std::io::Result<Helper>
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
    let start = Starting {
        name: name.to_owned(),
        rx,
    };
    if BATCHING.with(Cell::get) {
        BATCH.lock().get_or_insert_with(Vec::new).push(start);
    } else {
        start.wait()?;
    }
    Ok(t)
}

/// A helper on its way up: `thread_start` and `warm` have run on it once a
/// message (or, if it died first, the end of the channel) arrives.
struct Starting {
    name: String,
    rx: std::sync::mpsc::Receiver<()>,
}

impl Starting {
    fn wait(self) -> std::io::Result<()> {
        self.rx.recv().map_err(|_| {
            std::io::Error::other(format!("helper thread {} died at start", self.name))
        })
    }
}

/// The starts of the open [`StartBatch`] (None: none is open).
static BATCH: crate::lock::Mutex<Option<Vec<Starting>>> = crate::lock::Mutex::new(None);

thread_local! {
    /// This thread opened the [`StartBatch`]: its starts join it. (Const,
    /// without a destructor: a first use registers nothing with the
    /// dynamic loader.)
    static BATCHING: Cell<bool> = const { Cell::new(false) };
}

/// Helpers started together: while a batch is open, [`spawn_helper`] and
/// [`spawn_helper_warmed`] return without waiting for the new thread's
/// `thread_start` and `warm`, and [`StartBatch::wait`] waits for them all
/// at once. For a host that starts several helpers before it switches
/// anything on (the preload runtime starts six in every process, the
/// program's and each of its children's): each wait is a wake-up of a new
/// thread, a scheduler's time slice on a busy machine, and waited one
/// after the other they made each process of a parallel build start that
/// many slices later.
///
/// One batch at a time, opened and waited for by one thread; only that
/// thread's starts join it (another thread's wait as they always do).
/// Dropped without `wait`, it waits all the same.
pub struct StartBatch(());

impl StartBatch {
    /// Opens the batch.
    ///
    /// # Panics
    /// If one is open already.
    pub fn open() -> StartBatch {
        let mut b = BATCH.lock();
        assert!(b.is_none(), "a helper start batch is open already");
        *b = Some(Vec::new());
        BATCHING.with(|c| c.set(true));
        StartBatch(())
    }

    /// Waits until every helper started since [`StartBatch::open`] has run
    /// its `thread_start` and `warm`; the first that died at its start is
    /// the error.
    pub fn wait(self) -> std::io::Result<()> {
        self.close()
    }

    fn close(&self) -> std::io::Result<()> {
        BATCHING.with(|c| c.set(false));
        let starts = BATCH.lock().take().unwrap_or_default();
        let mut first = Ok(());
        for s in starts {
            let r = s.wait();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

impl Drop for StartBatch {
    fn drop(&mut self) {
        let _ = self.close();
    }
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
) -> std::io::Result<Helper>
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
/// ([`crate::fork::helper_tids`], for the CPU accounting), then `started`,
/// then `body`.
fn spawn_listed<F, S>(
    name: &str,
    thread_start: Option<fn()>,
    started: S,
    body: F,
) -> std::io::Result<Helper>
where
    F: FnOnce() + Send + 'static,
    S: FnOnce() + Send + 'static,
{
    spawn(
        name,
        Box::new(move || {
            if let Some(f) = thread_start {
                f();
            }
            let _listed = crate::fork::HelperGuard::enter();
            started();
            body()
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    static STARTED: AtomicBool = AtomicBool::new(false);

    fn mark() {
        // Slow on purpose: spawn_helper must still wait for it.
        std::thread::sleep(std::time::Duration::from_millis(20));
        STARTED.store(true, Ordering::SeqCst);
    }

    /// Whether the calling thread blocks `sig`.
    fn blocks(sig: libc::c_int) -> bool {
        // SAFETY: reads the calling thread's mask into a set of our own.
        unsafe {
            let mut cur: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
            libc::sigismember(&cur, sig) == 1
        }
    }

    #[test]
    fn a_helper_blocks_the_signals_sent_to_the_process_and_its_creator_keeps_its_mask() {
        let before: Vec<bool> = [libc::SIGUSR1, libc::SIGTERM, libc::SIGCHLD]
            .iter()
            .map(|&s| blocks(s))
            .collect();
        let h = spawn_helper("test-mask", None, || {
            for s in [
                libc::SIGUSR1,
                libc::SIGTERM,
                libc::SIGINT,
                libc::SIGCHLD,
                libc::SIGRTMIN(),
            ] {
                assert!(blocks(s), "signal {s} not blocked in a helper");
            }
            for s in [
                libc::SIGSEGV,
                libc::SIGBUS,
                libc::SIGILL,
                libc::SIGFPE,
                libc::SIGTRAP,
            ] {
                assert!(!blocks(s), "fault signal {s} blocked in a helper");
            }
        })
        .unwrap();
        h.join().unwrap();
        let after: Vec<bool> = [libc::SIGUSR1, libc::SIGTERM, libc::SIGCHLD]
            .iter()
            .map(|&s| blocks(s))
            .collect();
        assert_eq!(before, after, "the creating thread's mask changed");
    }

    /// The calling thread's name, as the kernel keeps it.
    fn own_name() -> String {
        std::fs::read_to_string("/proc/thread-self/comm")
            .unwrap()
            .trim_end()
            .to_owned()
    }

    #[test]
    fn spawn_helper_returns_after_thread_start_ran_on_the_thread() {
        let t = spawn_helper("uzswap-test", Some(mark), || {
            assert_eq!(own_name(), "uzswap-test");
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

    #[test]
    fn a_long_name_is_cut_to_what_the_kernel_keeps() {
        spawn_helper("uzswap-a-very-long-name", None, || {
            assert_eq!(own_name(), "uzswap-a-very-l");
        })
        .unwrap()
        .join()
        .unwrap();
    }

    #[test]
    fn a_panicking_body_is_reported_by_join() {
        let t = spawn_helper("uzswap-panics", None, || panic!("on purpose")).unwrap();
        let payload = t.join().unwrap_err();
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"on purpose"));
    }

    static GO: AtomicBool = AtomicBool::new(false);
    static GATED_STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    /// Waits for GO (at most 10 s), then counts itself started.
    fn gated() {
        let t0 = std::time::Instant::now();
        while !GO.load(Ordering::SeqCst) && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        GATED_STARTED.fetch_add(1, Ordering::SeqCst);
    }

    /// In a batch, starts return before the new threads ran `thread_start`
    /// (held here until GO), and the batch's wait returns only once all
    /// have. Without the batch, the first start would have waited for its
    /// thread (up to gated's 10 s) and the count would not be 0.
    #[test]
    fn a_batch_waits_once_for_all_its_starts() {
        let batch = StartBatch::open();
        let a = spawn_helper("uzswap-batch-a", Some(gated), || {}).unwrap();
        let b = spawn_helper_warmed("uzswap-batch-b", Some(gated), || {}, || {}).unwrap();
        assert_eq!(GATED_STARTED.load(Ordering::SeqCst), 0);
        GO.store(true, Ordering::SeqCst);
        batch.wait().unwrap();
        assert_eq!(GATED_STARTED.load(Ordering::SeqCst), 2);
        a.join().unwrap();
        b.join().unwrap();
        // Closed: a start waits for its thread again.
        let c = spawn_helper("uzswap-batch-c", Some(gated), || {}).unwrap();
        assert_eq!(GATED_STARTED.load(Ordering::SeqCst), 3);
        c.join().unwrap();
    }

    #[test]
    fn a_dropped_handle_lets_the_thread_run_on() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        drop(
            spawn_helper("uzswap-detach", None, move || {
                go_rx.recv().unwrap();
                tx.send(1).unwrap();
            })
            .unwrap(),
        );
        go_tx.send(()).unwrap();
        assert_eq!(rx.recv().unwrap(), 1);
    }
}
