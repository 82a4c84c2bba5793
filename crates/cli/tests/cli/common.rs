//! What the `uzswap` integration tests share: the binary, whether this
//! machine can run them, a process tree's pids and memory from /proc,
//! running `uzswap run` while a sampler watches its tree, and holding the
//! tree's sampled memory to its budget.

use std::io::{BufRead, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

pub const MIB: u64 = 1 << 20;

pub fn uzswap() -> Command {
    Command::new(env!("CARGO_BIN_EXE_uzswap"))
}

/// Why `uzswap run` cannot run here, if it cannot.
pub fn unavailable() -> Option<String> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| match uzswap_region::sys::Uffd::open(0, None) {
        Ok(_) => None,
        Err(e) => Some(format!("userfaultfd unavailable: {e}")),
    })
    .clone()
}

/// Whether a missing requirement fails the test instead of skipping it:
/// `UZSWAP_TEST_STRICT=1` (CI sets it).
pub fn strict() -> bool {
    std::env::var_os("UZSWAP_TEST_STRICT").is_some_and(|v| v == "1")
}

/// A test that cannot run here, for `why`: says so on stderr (the caller
/// then returns), or, under [`strict`], fails it.
pub fn skip(why: &str) {
    assert!(
        !strict(),
        "required for this test: {why} (UZSWAP_TEST_STRICT=1)"
    );
    eprintln!("skipped: {why}");
}

/// Returns from the test through [`skip`] where userfaultfd is
/// unavailable.
macro_rules! require_uffd {
    () => {
        if let Some(why) = $crate::common::unavailable() {
            $crate::common::skip(&why);
            return;
        }
    };
}

/// Every descendant of `pid` (not `pid` itself), parents before children.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        out.extend(uzswap_ledger::proc_sample::children(out[i]));
        i += 1;
    }
    out.remove(0);
    out
}

/// Ends a `uzswap run` the test started and its program: every
/// descendant killed, children first (`sh` does not pass a signal on, and
/// once `uzswap run` is gone its children are init's and no longer found
/// among its descendants), then `uzswap run` itself asked to end with
/// SIGTERM and reaped. Not SIGKILL: it would leave its private directory
/// in `$TMPDIR` behind. One still running 10 s later is killed, so a test
/// is held up here no longer than that.
pub fn end_run(run: &mut std::process::Child) {
    for p in descendants(run.id()).into_iter().rev() {
        // SAFETY: a signal to a process this test started.
        unsafe { libc::kill(p as i32, libc::SIGKILL) };
    }
    // SAFETY: a signal to the process this test started (not reaped yet:
    // its pid is still its own).
    unsafe { libc::kill(run.id() as i32, libc::SIGTERM) };
    let t0 = Instant::now();
    while matches!(run.try_wait(), Ok(None)) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = run.kill();
    let _ = run.wait();
}

/// `VmRSS` of a process, in bytes.
pub fn vm_rss(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    l.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|k| k * 1024)
}

/// What a `uzswap run` printed and how it ended.
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` (a `uzswap run ...`), calling `sample` with its pid every
/// `every` on another thread until it ends, and `during` with its pid and
/// its stdout once it started (what `during` leaves unread is kept).
pub fn run_sampling(
    mut cmd: Command,
    every: Duration,
    mut sample: impl FnMut(u32) + Send + 'static,
    during: impl FnOnce(u32, &mut dyn BufRead),
) -> Finished {
    let _one = one_at_a_time();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start uzswap");
    let pid = child.id();
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        let t0 = Instant::now();
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                sample(pid);
                if t0.elapsed() >= RUN_LIMIT {
                    // A hang fails the test, with where every thread of
                    // the tree sleeps, instead of holding up the suite.
                    eprintln!(
                        "uzswap run (pid {pid}) still running after {} s: killed",
                        RUN_LIMIT.as_secs()
                    );
                    let mut pids = descendants(pid);
                    pids.push(pid);
                    for &p in &pids {
                        eprintln!("{}", uzswap_os::threads::describe(Some(p)));
                    }
                    for &p in &pids {
                        // SAFETY: signalling processes of the test's tree.
                        unsafe { libc::kill(p as i32, libc::SIGKILL) };
                    }
                    return;
                }
                std::thread::sleep(every);
            }
        })
    };
    let mut err_pipe = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        err_pipe.read_to_string(&mut s).unwrap();
        s
    });
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    during(pid, &mut out);
    let mut stdout = String::new();
    out.read_to_string(&mut stdout).unwrap();
    let stderr = err_reader.join().unwrap();
    let status = child.wait().unwrap();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    Finished {
        code: status.code(),
        stdout,
        stderr,
    }
}

/// Runs one sampled `uzswap run` at a time in the test binary (the harness
/// runs its tests on as many threads as there are CPUs). These runs hold a
/// tree's memory to its budget, which its evictors keep it to only as fast
/// as they get a CPU: with the seven trees of `tree.rs` started together on
/// two CPUs, Python workers spawned at once held 1.2 x their budget for a
/// sample, which no single run here does. How a tree holds its budget on
/// a busy machine is measured by the benchmarks, not assumed by a test.
fn one_at_a_time() -> RwLockWriteGuard<'static, ()> {
    // A test that failed while running still let go: the next may run.
    RUNS.write().unwrap_or_else(PoisonError::into_inner)
}

/// Lets a test's trees run beside other such tests but not beside a
/// sampled run ([`run_sampling`]); held for the whole test, taken once.
pub fn beside_others() -> RwLockReadGuard<'static, ()> {
    RUNS.read().unwrap_or_else(PoisonError::into_inner)
}

/// Sampled runs take it alone, other trees together.
static RUNS: RwLock<()> = RwLock::new(());

/// How long one `uzswap run` of a test may take before it is killed.
pub const RUN_LIMIT: Duration = Duration::from_secs(300);

// ---- a tree's memory under `uzswap run`, sampled as the kernel counts it --

/// The tree may pass the budget by this share, after start-up.
pub const OVER_SHARE: f64 = 0.05;
/// And by this much besides: what processes allocate between two of
/// their evictor's readings of their share (every 10 ms, later when the
/// machine's CPUs are busy: 7.9 MiB over 64 MiB was seen with a parallel
/// build running beside the test), a new process's first pages before its
/// first allotment, and the ledger's own pages.
pub const SLACK: u64 = 8 * MIB;
/// Samples before this do not count: the dynamic loader and the runtimes
/// start before any allotment.
pub const STARTUP: Duration = Duration::from_millis(500);

/// Whether `cmd` fails to run here (then [`skip`]ped: "no `what`").
pub fn missing(what: &str, cmd: &[&str]) -> bool {
    let ok = Command::new(cmd[0])
        .args(&cmd[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        skip(&format!("no {what}"));
    }
    !ok
}

pub fn programs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs")
}

/// A private scratch directory, removed at the end of the test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("uzswap-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn pss_anon(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("Pss_Anon:"))?.to_owned();
            l.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kb| kb * 1024)
}

/// What one `uzswap run` did.
pub struct Ran {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    /// The tree's largest sampled Pss_Anon after start-up.
    pub peak: u64,
    /// Most processes seen at once.
    pub processes: usize,
}

/// Runs `uzswap run ARGS` from `dir`, sampling the tree's memory every
/// 100 ms; `during` gets the pid of `uzswap run` and a line reader of the
/// program's stdout once it started.
pub fn run_with(dir: &Path, args: &[&str], during: impl FnOnce(u32, &mut dyn BufRead)) -> Ran {
    let peak = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let sample = {
        let (peak, most) = (peak.clone(), most.clone());
        let t0 = Instant::now();
        move |pid: u32| {
            let mut pids = descendants(pid);
            most.fetch_max(pids.len() as u64, Ordering::Relaxed);
            pids.push(pid);
            let total: u64 = pids.iter().map(|&p| pss_anon(p)).sum();
            if t0.elapsed() >= STARTUP {
                peak.fetch_max(total, Ordering::Relaxed);
            }
        }
    };
    let mut cmd = uzswap();
    cmd.arg("run").args(args).current_dir(dir);
    let f = run_sampling(cmd, Duration::from_millis(100), sample, during);
    eprintln!(
        "uzswap run {args:?}\n--- stdout\n{}--- stderr\n{}---",
        f.stdout, f.stderr
    );
    Ran {
        code: f.code,
        stdout: f.stdout,
        stderr: f.stderr,
        peak: peak.load(Ordering::Relaxed),
        processes: most.load(Ordering::Relaxed) as usize,
    }
}

pub fn run(dir: &Path, args: &[&str]) -> Ran {
    run_with(dir, args, |_, _| {})
}

/// The tree stayed within the budget (plus the stated slack) after
/// start-up.
pub fn assert_within(r: &Ran, budget: u64) {
    let bound = (budget as f64 * (1.0 + OVER_SHARE)) as u64 + SLACK;
    assert!(r.peak > 0, "no memory was sampled");
    assert!(
        r.peak <= bound,
        "the tree held {:.1} MiB, over {:.1} MiB (budget {} MiB + {}% + {} MiB)",
        r.peak as f64 / MIB as f64,
        bound as f64 / MIB as f64,
        budget / MIB,
        OVER_SHARE * 100.0,
        SLACK / MIB
    );
}

/// The final statistics `uzswap run --stats-json PATH` wrote.
pub fn final_stats(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("--stats-json was written");
    serde_json::from_str(&text).expect("--stats-json holds JSON")
}
