//! `uzswap-bench tree`: a whole process tree under one memory budget B: a
//! parallel build of real C sources at each `-jN` (or a Python
//! multiprocessing program), run on four sides in one run:
//! 1. unconstrained (the reference: wall time, the tree's peak, and the
//!    outputs every other side must reproduce byte for byte);
//! 2. `uzswap run --memory-max B` (its tree sampled from /proc here, and
//!    its own `--stats-json` tree figures);
//! 3. the kernel: a memory cgroup (v1) of limit B with a swap file and
//!    zswap (lzo) in each configuration of the zswap shrinker (on/off) ×
//!    swap readahead (`vm.page-cluster` 3/0); the fastest that completed
//!    without an OOM kill is "the kernel";
//! 4. plain swap (zswap off) in the same cgroup;
//! 5. the fastest zswap configuration again with its pool inside B, as a
//!    cgroup v2 charges it (`systemd-run -p MemoryMax=B` on a v2 machine):
//!    the v1 controller leaves the pool outside its limit, so the limit is
//!    steered every 10 ms to B less the pool's size then ([`steer`]). An
//!    emulation, not a v2 cgroup: one burst of reclaim can grow the pool
//!    by tens of MiB between two steps, and the tree then holds more than
//!    B until the limit has come down (its over-target samples say how
//!    long).
//!
//! Memory is each side's own account of the tree: `Pss_Anon` summed over
//! the processes for the unconstrained and uzswap sides (uzswap's includes
//! `uzswap run` itself, as its budget does), sampled every 100 ms; the
//! cgroup's usage plus the zswap pool for the kernel sides (the v1
//! controller leaves the pool outside its limit), sampled at one instant;
//! the kernel sides' tree `Pss_Anon` is read too (every side pays the same
//! sampling).
//! The first [`STARTUP_SAMPLES`] samples do not count for the peak, as in
//! `uzswap run`'s own accounting.
//!
//! Everything changed on the machine is put back by [`KernelSwap`]'s drop
//! on every exit path; Ctrl-C and SIGTERM are caught, the running program's
//! process group is killed, and the benchmark returns an error through
//! those drops rather than dying with the machine changed.

use crate::bench_cache::median;
use crate::kernel::{KernelSwap, ZswapSample};
use crate::note;
use crate::tree_workload::{Kind, Outputs, Workload, CFLAGS};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uzswap_ledger::tree;

const MIB: u64 = 1 << 20;
/// How often every side's memory is sampled.
const SAMPLE: Duration = Duration::from_millis(100);
/// Samples after the start that do not count for the peak (the loader,
/// the runtimes' start-up), as `uzswap run` counts its own peak.
const STARTUP_SAMPLES: usize = 3;
/// The memory target: the tree at or below this × B at every sample.
const MEMORY_TARGET: f64 = 1.05;
/// Default budget of the python workload.
const PYTHON_BUDGET_MIB: u64 = 128;
const ZSWAP_PARAMS: &str = "/sys/module/zswap/parameters";
const PAGE_CLUSTER: &str = "/proc/sys/vm/page-cluster";

/// Which kernel configurations run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelConfigs {
    /// All four in the first round of each -jN, then only the fastest.
    Best,
    /// All four in every round.
    All,
}

/// What every case runs: the sides, their rounds and limits.
#[derive(clap::Args, Clone)]
pub struct Sides {
    /// Rounds of every side, the order reversed in every other round; the
    /// wall times reported are the medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
    #[arg(long, value_enum, default_value = "all")]
    pub kernel_configs: KernelConfigs,
    /// Only the unconstrained and uzswap sides (no root needed).
    #[arg(long)]
    pub skip_kernel: bool,
    /// Without the run of uzswap at the kernel's total memory: by default,
    /// once the fastest kernel configuration is known, uzswap runs again
    /// with B = that configuration's peak (its cgroup plus its pool, which
    /// the v1 controller leaves outside the limit), for a comparison at
    /// equal total memory.
    #[arg(long)]
    pub skip_equal_total: bool,
    /// Without the run of the fastest kernel configuration with its pool
    /// inside B (the v1 limit steered to B less the pool every 10 ms, as a
    /// v2 cgroup's limit holds both).
    #[arg(long)]
    pub skip_pool_inside: bool,
    /// A run still going after this many seconds is killed and reported
    /// as timed out (a configuration that crawls). Default: 30 times the
    /// unconstrained run's wall time, at least 120 s.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub timeout_seconds: Option<u64>,
    /// The `uzswap` binary (default: the one beside this executable).
    #[arg(long, value_name = "PATH")]
    pub uzswap: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, value_enum, default_value = "build")]
    pub workload: Kind,
    /// The build's parallelism, comma-separated (other workloads: ignored).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8",
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub jobs: Vec<u32>,
    /// The budget B of every side, MiB. Default: half of the unconstrained
    /// peak at each -jN for the build, 128 for python, a quarter of the
    /// unconstrained peak for the real programs.
    #[arg(long, value_parser = clap::value_parser!(u64).range(8..=1 << 20))]
    pub budget_mib: Option<u64>,
    #[command(flatten)]
    pub sides: Sides,
}

#[derive(clap::Args)]
pub struct ProgramsArgs {
    /// The programs, comma-separated; one the machine lacks is left out
    /// with a note.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "pydict,node,jvm,go,xz,sort"
    )]
    pub programs: Vec<Kind>,
    /// Each program's size as a multiple of its default (footprints of
    /// 170-400 MB at 1).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// The budget B of each program as a share of its unconstrained peak.
    #[arg(long, default_value_t = 0.25)]
    pub budget_share: f64,
    #[command(flatten)]
    pub sides: Sides,
}

/// One configuration of the kernel side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KernelConfig {
    /// zswap on (lzo), or plain swap.
    zswap: bool,
    shrinker: bool,
    page_cluster: u32,
}

impl KernelConfig {
    fn name(&self) -> String {
        if !self.zswap {
            return format!("swap pc{}", self.page_cluster);
        }
        format!(
            "zswap shrinker={} pc{}",
            if self.shrinker { "Y" } else { "N" },
            self.page_cluster
        )
    }
}

const ZSWAP_CONFIGS: [KernelConfig; 4] = [
    KernelConfig {
        zswap: true,
        shrinker: false,
        page_cluster: 3,
    },
    KernelConfig {
        zswap: true,
        shrinker: true,
        page_cluster: 3,
    },
    KernelConfig {
        zswap: true,
        shrinker: false,
        page_cluster: 0,
    },
    KernelConfig {
        zswap: true,
        shrinker: true,
        page_cluster: 0,
    },
];
const PLAIN_SWAP: KernelConfig = KernelConfig {
    zswap: false,
    shrinker: false,
    page_cluster: 3,
};

// ---------------------------------------------------------------------
// Interruption: a flag the signal handler sets and every wait checks.

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Catches SIGINT and SIGTERM for the rest of the process: they set
/// [`INTERRUPTED`] instead of killing it with the machine changed.
fn catch_interrupts() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask"
        // value; the handler only stores to an atomic (async-signal-safe).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted: the program was killed and the machine's settings put back");
    }
    Ok(())
}

// ---------------------------------------------------------------------
// Running one program while sampling it.

/// One look at a side's memory.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    /// What is held against B: the tree's Pss_Anon, or cgroup + pool.
    memory: u64,
    /// Kernel sides: the cgroup's usage and the zswap pool, same instant.
    cgroup: u64,
    zswap_pool: u64,
    /// Kernel sides: the tree's `Pss_Anon`, read as on the other sides (so
    /// that every side pays the same sampling, and for the anonymous part
    /// of the cgroup's usage).
    tree_pss_anon: u64,
}

/// What one run of a program gave.
struct Ran {
    wall_seconds: f64,
    /// CPU time (user + system) of the program and every descendant.
    cpu_seconds: f64,
    /// The machine's 1-minute load average when it ended (others' work
    /// on a shared machine shows here).
    load_average: f64,
    status: std::process::ExitStatus,
    /// Killed at the deadline.
    timed_out: bool,
    samples: Vec<Sample>,
    /// Its stdout and stderr.
    log: String,
}

impl Ran {
    /// The CPU time, if it was all counted: of a run killed at the
    /// deadline it was not (the processes orphaned by the kill are reaped
    /// by init, not by this benchmark, and the runtimes' reports stopped
    /// at the kill).
    fn cpu(&self) -> Option<f64> {
        (!self.timed_out).then_some(self.cpu_seconds)
    }

    fn counted(&self) -> impl Iterator<Item = &Sample> {
        self.samples.iter().skip(STARTUP_SAMPLES)
    }

    fn peak(&self) -> u64 {
        self.counted().map(|s| s.memory).max().unwrap_or(0)
    }

    fn over(&self, limit: u64) -> usize {
        self.counted().filter(|s| s.memory > limit).count()
    }
}

/// Kills the process group of a program still running when dropped (an
/// error or an interruption in the middle of a run).
struct Group(Option<std::process::Child>);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            // SAFETY: kill has no memory preconditions; the group is the
            // child's own (process_group(0)).
            unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
            let _ = c.wait();
        }
    }
}

/// Runs `cmd` in `dir` as its own process group, output to a log file,
/// sampling `probe(pid)` every [`SAMPLE`] until it exits, or killing the
/// group at `deadline`.
fn run_sampled(
    mut cmd: Command,
    dir: &Path,
    deadline: Duration,
    probe: impl Fn(u32) -> Sample + Send + 'static,
) -> Result<Ran> {
    check_interrupted()?;
    let log_path = dir.join("run.log");
    let log = std::fs::File::create(&log_path)?;
    cmd.current_dir(dir)
        .env_remove("MAKEFLAGS")
        .env_remove("MFLAGS")
        .env_remove("MAKELEVEL")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let cpu_before = children_cpu_seconds();
    let started = Instant::now();
    let mut group = Group(Some(cmd.spawn().context("starting the program")?));
    let pid = group.0.as_ref().expect("spawned").id();
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = {
        let (stop, samples) = (Arc::clone(&stop), Arc::clone(&samples));
        std::thread::spawn(move || {
            let mut next = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let s = probe(pid);
                samples.lock().expect("sampler").push(s);
                next += SAMPLE;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
        })
    };
    let mut timed_out = false;
    let status = loop {
        if let Some(st) = group.0.as_mut().expect("running").try_wait()? {
            break st;
        }
        if !timed_out && started.elapsed() > deadline {
            timed_out = true;
            note(&format!(
                "still running after {} s: killed (--timeout-seconds)",
                deadline.as_secs()
            ));
            // SAFETY: kill has no memory preconditions; the group is the
            // child's own.
            unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
        }
        if INTERRUPTED.load(Ordering::SeqCst) {
            drop(group); // kills the program's whole group
            stop.store(true, Ordering::Relaxed);
            let _ = sampler.join();
            check_interrupted()?;
            unreachable!("interrupted");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let wall_seconds = started.elapsed().as_secs_f64();
    group.0 = None;
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    check_interrupted()?;
    let samples = std::mem::take(&mut *samples.lock().expect("sampler"));
    Ok(Ran {
        wall_seconds,
        cpu_seconds: children_cpu_seconds() - cpu_before,
        load_average: std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0),
        status,
        timed_out,
        samples,
        log: std::fs::read_to_string(&log_path).unwrap_or_default(),
    })
}

/// User and system CPU seconds of every child waited for so far (and of
/// their descendants each waited for).
fn children_cpu_seconds() -> f64 {
    // SAFETY: a zeroed rusage is a valid out-parameter for getrusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// The tree under `root` as the kernel counts it.
fn tree_probe(root: u32) -> Sample {
    Sample {
        memory: tree::sample(root, &[]).pss_anon,
        ..Sample::default()
    }
}

fn read_u64(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// A counter of a cgroup's `memory.oom_control` (`oom_kill`).
fn oom_kills(cg: &Path) -> u64 {
    std::fs::read_to_string(cg.join("memory.oom_control"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The last lines of a run's log, for an error message.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(6)..].join("\n")
}

// ---------------------------------------------------------------------
// The sides.

/// Fields every side reports.
fn common(ran: &Ran, w: &Workload, reference: Option<&Outputs>) -> Result<(Value, Outputs)> {
    let outputs = w.outputs(&ran.log)?;
    let differing = reference.map(|r| outputs.differing(r)).unwrap_or_default();
    let identical = match reference {
        Some(r) => &outputs == r,
        None => w.complete(&outputs),
    };
    if !differing.is_empty() {
        note(&format!(
            "outputs differ from the unconstrained run's: {}",
            differing.join(" ")
        ));
    }
    Ok((
        json!({
            "outputs_differing": differing,
            "wall_seconds": ran.wall_seconds,
            "cpu_seconds": ran.cpu(),
            "load_average_at_end": ran.load_average,
            "exit_status": ran.status.code(),
            "timed_out": ran.timed_out,
            "signal": std::os::unix::process::ExitStatusExt::signal(&ran.status),
            "peak_memory_bytes": ran.peak(),
            "samples": ran.samples.len(),
            "outputs_identical": identical,
        }),
        outputs,
    ))
}

fn unconstrained(w: &Workload, jobs: u32, reference: Option<&Outputs>) -> Result<(Value, Outputs)> {
    w.reset()?;
    let argv = w.argv(jobs);
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    let ran = run_sampled(cmd, w.dir(), Duration::MAX, tree_probe)?;
    if !ran.status.success() {
        bail!(
            "the unconstrained run of `{}` failed ({}):\n{}",
            argv.join(" "),
            ran.status,
            tail(&ran.log)
        );
    }
    let (mut v, outputs) = common(&ran, w, reference)?;
    v["oom_killed"] = json!(false);
    Ok((v, outputs))
}

fn uzswap_side(
    w: &Workload,
    jobs: u32,
    budget: u64,
    deadline: Duration,
    uzswap: &Path,
    reference: &Outputs,
) -> Result<Value> {
    w.reset()?;
    let stats_path = w.dir().join("uzswap-stats.json");
    let _ = std::fs::remove_file(&stats_path);
    let mut cmd = Command::new(uzswap);
    cmd.arg("run")
        .arg("--memory-max")
        .arg(budget.to_string())
        .arg("--stats-json")
        .arg(&stats_path)
        .arg("--")
        .args(w.argv(jobs));
    let ran = run_sampled(cmd, w.dir(), deadline, tree_probe)?;
    let (mut v, _) = common(&ran, w, Some(reference))?;
    let stats: Value = std::fs::read(&stats_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    let procs: Vec<&Value> = stats
        .pointer("/tree/processes")
        .and_then(Value::as_object)
        .map(|m| m.values().collect())
        .unwrap_or_default();
    let sum = |k: &str| -> u64 { procs.iter().filter_map(|p| p[k].as_u64()).sum() };
    let root = |p: &str| stats.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    v["oom_killed"] = json!(false);
    v["budget_bytes"] = json!(budget);
    v["over_target_samples"] = json!(ran.over((budget as f64 * MEMORY_TARGET) as u64));
    v["stats_peak_bytes"] = stats
        .pointer("/tree/peak_bytes")
        .cloned()
        .unwrap_or(Value::Null);
    v["stats_over_budget"] = stats
        .pointer("/tree/over_budget")
        .cloned()
        .unwrap_or(Value::Null);
    v["over_budget_reasons"] = stats
        .pointer("/tree/over_budget_reasons")
        .cloned()
        .unwrap_or(Value::Null);
    v["managed_processes"] = json!(procs.len());
    v["max_processes"] = stats
        .pointer("/tree/max_processes")
        .cloned()
        .unwrap_or(Value::Null);
    // Over the tree: pages evicted (to the pool or the backing file) and
    // faults resolved, from every process's last report.
    v["tree_evictions"] = json!(sum("evictions"));
    v["tree_faults"] = json!(sum("faults"));
    // CPU time by the runtimes' reports: uzswap's threads inside the
    // program's processes, and `uzswap run` itself.
    // None of a run killed at the deadline: its last reports are stale.
    for k in ["runtime_cpu_seconds", "run_cpu_seconds"] {
        v[k] = ran
            .cpu()
            .and_then(|_| stats.pointer(&format!("/tree/{k}")).cloned())
            .unwrap_or(Value::Null);
    }
    // The split of all CPU time (`cpu_seconds`, every process waited for,
    // `uzswap run` included): uzswap's (its threads, `uzswap run`) and the
    // program's (the rest).
    if let (Some(rt), Some(run), Some(all)) = (
        v["runtime_cpu_seconds"].as_f64(),
        v["run_cpu_seconds"].as_f64(),
        ran.cpu(),
    ) {
        v["uzswap_cpu_seconds"] = json!(rt + run);
        v["program_cpu_seconds"] = json!((all - rt - run).max(0.0));
    }
    // Written to and read back from the backing file: only the root
    // process's final statistics have these counters.
    v["backing_out_pages"] =
        json!(root("/cache/written_back_pages") + root("/cache/stores_to_backing"));
    v["backing_in_pages"] = json!(root("/cache/loads_backing"));
    v["backing_counts_root_only"] = json!(true);
    v["headline"] = json!(ran
        .log
        .lines()
        .find(|l| l.starts_with("uzswap: the program's memory peaked"))
        .unwrap_or(""));
    if !ran.status.success() {
        // A failed or timed-out run has no time.
        v["wall_seconds"] = Value::Null;
        note(&format!(
            "uzswap side failed ({}{}):\n{}",
            ran.status,
            if ran.timed_out { ", timed out" } else { "" },
            tail(&ran.log)
        ));
    }
    Ok(v)
}

/// The lowest limit [`steer`] sets: a quarter of B (a pool that grows past
/// three quarters of B would otherwise take the program's last page).
const STEER_FLOOR_SHARE: u64 = 4;

/// The most a lowered limit lies below the cgroup's usage: the write makes
/// the kernel reclaim that much in the steering thread before it returns.
const STEER_STEP: u64 = 4 * MIB;

/// Holds a v1 cgroup's usage plus the zswap pool within `budget`, as a v2
/// cgroup charges the pool: moves the limit towards `budget` less `pool`
/// when that differs from the limit set last (`last`) by a MiB or more.
/// Raised at once; lowered at most [`STEER_STEP`] below `usage` a call (a
/// write of a limit far below the usage reclaims all the difference before
/// it returns, while the program goes on growing against the old limit;
/// or fails with EBUSY). Returns the limit now.
fn steer(cg: &Path, budget: u64, pool: u64, usage: u64, last: u64) -> u64 {
    let page = |b: u64| b.div_ceil(4096) * 4096;
    let want = page(budget.saturating_sub(pool).max(budget / STEER_FLOOR_SHARE));
    let next = if want >= last {
        want
    } else {
        want.max(page(usage.saturating_sub(STEER_STEP))).min(last)
    };
    if next.abs_diff(last) < MIB {
        return last;
    }
    match std::fs::write(cg.join("memory.limit_in_bytes"), next.to_string()) {
        Ok(()) => next,
        Err(_) => last, // EBUSY: nothing reclaimable now; the next call retries
    }
}

/// How often [`Steering`] follows the pool: a tenth of [`SAMPLE`], as a
/// program filling its memory grows the pool by tens of MiB in a sample.
const STEER_EVERY: Duration = Duration::from_millis(10);

/// A thread that [`steer`]s a cgroup's limit every [`STEER_EVERY`] until
/// stopped or dropped (an error on the way out stops it too).
struct Steering {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl Drop for Steering {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Steering {
    fn start(cg: PathBuf, budget: u64) -> Steering {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let (mut limit, mut lowest) = (budget, budget);
            while !flag.load(Ordering::Relaxed) {
                let pool = ZswapSample::read().map(|z| z.pool_bytes).unwrap_or(0);
                let usage = read_u64(&cg.join("memory.usage_in_bytes"));
                limit = steer(&cg, budget, pool, usage, limit);
                lowest = lowest.min(limit);
                std::thread::sleep(STEER_EVERY);
            }
            lowest
        });
        Steering {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the thread; the lowest limit it set.
    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().map_or(0, |t| t.join().unwrap_or(0))
    }
}

/// One kernel configuration in a fresh cgroup of limit `budget`; with
/// `pool_inside`, the limit is steered to hold the pool too ([`steer`]).
#[allow(clippy::too_many_arguments)]
fn kernel_side(
    ks: &mut KernelSwap,
    cfg: KernelConfig,
    w: &Workload,
    jobs: u32,
    budget: u64,
    deadline: Duration,
    reference: &Outputs,
    pool_inside: bool,
) -> Result<Value> {
    let name = if pool_inside {
        format!("{}, pool inside B", cfg.name())
    } else {
        cfg.name()
    };
    let label = w.kind.label(jobs);
    note(&format!("{label}: kernel, {name} ..."));
    ks.set(
        &format!("{ZSWAP_PARAMS}/enabled"),
        if cfg.zswap { "Y" } else { "N" },
    )?;
    if cfg.zswap {
        ks.set(
            &format!("{ZSWAP_PARAMS}/shrinker_enabled"),
            if cfg.shrinker { "Y" } else { "N" },
        )?;
    }
    ks.set(PAGE_CLUSTER, &cfg.page_cluster.to_string())?;
    w.reset()?;
    let cg = ks.cgroup(budget)?;
    let argv = w.argv(jobs);
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("echo $$ > \"$0\" && exec \"$@\"")
        .arg(cg.join("tasks"))
        .args(&argv);
    let start = ZswapSample::read()?;
    let probe_cg = cg.clone();
    let steering = pool_inside.then(|| Steering::start(cg.clone(), budget));
    let ran = run_sampled(cmd, w.dir(), deadline, move |root| {
        let tree_pss_anon = tree::sample(root, &[]).pss_anon;
        let cgroup = read_u64(&probe_cg.join("memory.usage_in_bytes"));
        let zswap_pool = ZswapSample::read().map(|z| z.pool_bytes).unwrap_or(0);
        Sample {
            memory: cgroup + zswap_pool,
            cgroup,
            zswap_pool,
            tree_pss_anon,
        }
    })?;
    let end = ZswapSample::read()?;
    let ooms = oom_kills(&cg);
    let (mut v, _) = common(&ran, w, Some(reference))?;
    let oom = ooms > 0 || ran.status.code() == Some(137);
    v["config"] = json!(name);
    v["pool_inside"] = json!(pool_inside);
    if let Some(st) = steering {
        v["lowest_limit_bytes"] = json!(st.stop());
        v["over_target_samples"] = json!(ran.over((budget as f64 * MEMORY_TARGET) as u64));
    }
    v["zswap"] = json!(cfg.zswap);
    v["shrinker_enabled"] = json!(cfg.shrinker);
    v["page_cluster"] = json!(cfg.page_cluster);
    v["compressor"] = json!(cfg.zswap.then(|| ks.compressor.clone()));
    v["oom_killed"] = json!(oom);
    v["oom_kills"] = json!(ooms);
    v["completed"] = json!(ran.status.success() && !oom);
    v["peak_cgroup_bytes"] = json!(ran.counted().map(|s| s.cgroup).max().unwrap_or(0));
    v["peak_zswap_pool_bytes"] = json!(ran.counted().map(|s| s.zswap_pool).max().unwrap_or(0));
    v["peak_tree_pss_anon_bytes"] =
        json!(ran.counted().map(|s| s.tree_pss_anon).max().unwrap_or(0));
    v["cgroup_max_usage_bytes"] = json!(read_u64(&cg.join("memory.max_usage_in_bytes")));
    v["pswpout"] = json!(end.pswpout - start.pswpout);
    v["pswpin"] = json!(end.pswpin - start.pswpin);
    v["zswpout"] = json!(end.zswpout - start.zswpout);
    v["zswpin"] = json!(end.zswpin - start.zswpin);
    v["zswpwb"] = json!(end.zswpwb - start.zswpwb);
    v["swpout_zero"] = json!(end.swpout_zero - start.swpout_zero);
    v["swpin_zero"] = json!(end.swpin_zero - start.swpin_zero);
    if oom || !ran.status.success() {
        // A failed configuration has no time.
        v["wall_seconds"] = Value::Null;
        note(&format!(
            "{label}: kernel {name}: failed ({}, {ooms} OOM kills{})",
            ran.status,
            if ran.timed_out { ", timed out" } else { "" }
        ));
    } else {
        note(&format!(
            "{label}: kernel {name} {:.1} s, peak {} MiB",
            f(&v, "wall_seconds").unwrap_or(f64::NAN),
            v["peak_memory_bytes"].as_u64().unwrap_or(0) / MIB
        ));
    }
    Ok(v)
}

// ---------------------------------------------------------------------
// Rounds and results.

/// A side over the rounds: the round of the median wall time in full, the
/// wall time the median, the peak the largest, outputs identical and
/// completion only if in every round, OOM if in any.
fn combine(runs: Vec<Value>) -> Value {
    if runs.is_empty() {
        return Value::Null;
    }
    let walls: Vec<f64> = runs
        .iter()
        .filter_map(|r| r["wall_seconds"].as_f64())
        .collect();
    let failed = walls.len() < runs.len();
    let mut out = if failed {
        runs.iter()
            .find(|r| r["wall_seconds"].is_null())
            .cloned()
            .expect("a failed round")
    } else {
        let m = median(walls.clone());
        runs.iter()
            .find(|r| r["wall_seconds"].as_f64() == Some(m))
            .cloned()
            .expect("the median round")
    };
    let all = |k: &str| runs.iter().all(|r| r[k].as_bool().unwrap_or(false));
    let any = |k: &str| runs.iter().any(|r| r[k].as_bool().unwrap_or(false));
    out["outputs_identical"] = json!(all("outputs_identical"));
    out["oom_killed"] = json!(any("oom_killed"));
    if let Some(max) = runs
        .iter()
        .filter_map(|r| r["peak_memory_bytes"].as_u64())
        .max()
    {
        out["peak_memory_bytes"] = json!(max);
    }
    if runs.len() > 1 {
        out["wall_seconds_each_round"] = runs.iter().map(|r| r["wall_seconds"].clone()).collect();
    }
    if !failed && runs.len() > 1 {
        out["wall_seconds"] = json!(median(walls));
    }
    out
}

fn f(v: &Value, k: &str) -> Option<f64> {
    v[k].as_f64()
}

/// One program (one -jN of the build): every side, `rounds` times, at the
/// budget `budget_of` gives for the unconstrained peak.
fn case(
    args: &Sides,
    w: &Workload,
    jobs: u32,
    budget_of: impl Fn(u64) -> u64,
    uzswap: &Path,
) -> Result<Value> {
    let label = w.kind.label(jobs);
    note(&format!("{label}: unconstrained (reference) ..."));
    let (first, reference) = unconstrained(w, jobs, None)?;
    if !first["outputs_identical"].as_bool().unwrap_or(false) {
        bail!("{label}: the unconstrained run did not produce every output: {first}");
    }
    let unconstrained_peak = first["peak_memory_bytes"].as_u64().unwrap_or(0);
    let budget = budget_of(unconstrained_peak);
    let deadline = Duration::from_secs(args.timeout_seconds.unwrap_or_else(|| {
        (first["wall_seconds"].as_f64().unwrap_or(0.0) * 30.0).max(120.0) as u64
    }));
    note(&format!(
        "{label}: {:.1} s, peak {} MiB; budget {} MiB",
        first["wall_seconds"].as_f64().unwrap_or(0.0),
        unconstrained_peak / MIB,
        budget / MIB
    ));
    // One run of uzswap at budget `b`, said on stderr.
    let ours_at = |b: u64, what: &str| -> Result<Value> {
        note(&format!(
            "{label}: uzswap run --memory-max {} MiB{what} ...",
            b / MIB
        ));
        let v = uzswap_side(w, jobs, b, deadline, uzswap, &reference)?;
        note(&format!(
            "{label}: uzswap{what} {}, tree peak {} MiB (its own account {} MiB), identical {}",
            f(&v, "wall_seconds")
                .map(|t| format!("{t:.1} s"))
                .unwrap_or_else(|| "failed or timed out".into()),
            v["peak_memory_bytes"].as_u64().unwrap_or(0) / MIB,
            v["stats_peak_bytes"].as_u64().unwrap_or(0) / MIB,
            v["outputs_identical"]
        ));
        Ok(v)
    };
    // The kernel's swap: set up once for the case, put back at its end.
    let mut ks = if args.skip_kernel {
        None
    } else {
        Some(KernelSwap::setup(
            (unconstrained_peak * 3 / 2).max(256 * MIB),
            Some("lzo"),
        )?)
    };
    let mut free_runs = vec![first];
    let mut ours = Vec::new();
    let mut kernel: Vec<Vec<Value>> = vec![Vec::new(); ZSWAP_CONFIGS.len()];
    let mut swap = Vec::new();
    let mut best: Option<usize> = None;
    for round in 0..args.rounds {
        // Order of this round's sides; reversed in odd rounds.
        let mut order: Vec<usize> = (0..3 + ZSWAP_CONFIGS.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for side in order {
            match side {
                0 if round > 0 => {
                    note(&format!("{label}: unconstrained ..."));
                    free_runs.push(unconstrained(w, jobs, Some(&reference))?.0);
                }
                0 => {}
                1 => ours.push(ours_at(budget, "")?),
                2 => {
                    let Some(ks) = ks.as_mut() else { continue };
                    swap.push(kernel_side(
                        ks, PLAIN_SWAP, w, jobs, budget, deadline, &reference, false,
                    )?);
                }
                k => {
                    let Some(ks) = ks.as_mut() else { continue };
                    let i = k - 3;
                    if args.kernel_configs == KernelConfigs::Best && round > 0 && best != Some(i) {
                        continue;
                    }
                    let cfg = ZSWAP_CONFIGS[i];
                    let v = kernel_side(ks, cfg, w, jobs, budget, deadline, &reference, false)?;
                    kernel[i].push(v);
                }
            }
        }
        if round == 0 && ks.is_some() {
            best = fastest(
                &kernel
                    .iter()
                    .map(|r| combine(r.clone()))
                    .collect::<Vec<_>>(),
            );
        }
    }
    // The fastest configuration again, its pool held inside B.
    let mut inside = Vec::new();
    if let (Some(ks), Some(b), false) = (ks.as_mut(), best, args.skip_pool_inside) {
        let cfg = ZSWAP_CONFIGS[b];
        for _ in 0..args.rounds {
            inside.push(kernel_side(
                ks, cfg, w, jobs, budget, deadline, &reference, true,
            )?);
        }
    }
    drop(ks); // swap off, zswap and page-cluster back, cgroups removed
              // uzswap at the fastest kernel configuration's total memory.
    let mut equal = Vec::new();
    let best_total = best
        .and_then(|b| combine(kernel[b].clone())["peak_memory_bytes"].as_u64())
        .map(|t| t.div_ceil(MIB) * MIB)
        .filter(|&t| t > budget && !args.skip_equal_total);
    if let Some(total) = best_total {
        for _ in 0..args.rounds {
            equal.push(ours_at(total, " (the kernel's total)")?);
        }
    }
    let configs: Vec<Value> = kernel
        .into_iter()
        .filter(|r| !r.is_empty())
        .map(combine)
        .collect();
    let best = fastest(&configs);
    let ours = combine(ours);
    let mut out = json!({
        "jobs": jobs,
        "label": label,
        "budget_bytes": budget,
        "unconstrained": combine(free_runs),
        "uzswap": ours,
    });
    let limit = budget as f64 * MEMORY_TARGET;
    let memory_ok = ours["over_target_samples"].as_u64() == Some(0)
        && (ours["peak_memory_bytes"].as_u64().unwrap_or(0) as f64) <= limit;
    let mut identical = ours["outputs_identical"].as_bool().unwrap_or(false);
    let mut targets = json!({ "memory_within_1_05_budget": memory_ok });
    if !configs.is_empty() {
        out["kernel_configs"] = json!(configs);
        out["swap"] = combine(swap);
        match best {
            Some(b) => {
                let k = &configs[b];
                out["kernel"] = k.clone();
                out["kernel_best_config"] = k["config"].clone();
                let wall = f(&ours, "wall_seconds").unwrap_or(f64::INFINITY)
                    / f(k, "wall_seconds").unwrap_or(f64::NAN);
                out["wall_ratio_vs_kernel"] = json!(wall);
                out["memory_ratio_vs_kernel"] = json!(
                    ours["peak_memory_bytes"].as_u64().unwrap_or(0) as f64
                        / k["peak_memory_bytes"].as_u64().unwrap_or(1).max(1) as f64
                );
                targets["wall_at_most_kernel"] = json!(wall <= 1.0);
                if !equal.is_empty() {
                    let e = combine(equal);
                    out["wall_ratio_vs_kernel_equal_total"] = json!(
                        f(&e, "wall_seconds").unwrap_or(f64::INFINITY)
                            / f(k, "wall_seconds").unwrap_or(f64::NAN)
                    );
                    out["uzswap_equal_total"] = e;
                }
                if !inside.is_empty() {
                    let i = combine(inside);
                    // None where the kernel has no time (OOM, killed at the
                    // deadline); infinite, written as JSON null, where
                    // uzswap has none.
                    let wall = f(&i, "wall_seconds")
                        .map(|t| f(&ours, "wall_seconds").unwrap_or(f64::INFINITY) / t);
                    out["wall_ratio_vs_kernel_pool_inside"] = json!(wall);
                    targets["wall_at_most_kernel_pool_inside"] = json!(wall.map(|r| r <= 1.0));
                    out["kernel_pool_inside"] = i;
                }
                // The CPU each side spent beyond the unconstrained run's
                // per page moved, at B and at the kernel's total.
                let free = out["unconstrained"].clone();
                out["swap_cpu"] = swap_cpu(&ours, k, &free);
                if let Some(e) = out.get("uzswap_equal_total").cloned() {
                    out["swap_cpu_equal_total"] = swap_cpu(&e, k, &free);
                }
                // Where the time goes: faults against the kernel's (pages
                // swapped in, from zswap or the disk).
                if let Some(ours_in) = ours["tree_faults"].as_u64() {
                    out["faults_ratio_vs_kernel"] =
                        json!(ours_in as f64 / kernel_in(k).max(1) as f64);
                }
                identical &= k["outputs_identical"].as_bool().unwrap_or(false);
            }
            None => {
                out["kernel"] = Value::Null;
                targets["wall_at_most_kernel"] = json!(null);
                note(&format!("{label}: no kernel zswap configuration completed"));
            }
        }
    }
    if let (Some(u), Some(p)) = (
        ours["uzswap_cpu_seconds"].as_f64(),
        ours["program_cpu_seconds"].as_f64(),
    ) {
        targets["uzswap_cpu_at_most_program"] = json!(u <= p);
    }
    targets["outputs_identical"] = json!(identical);
    out["outputs_identical"] = json!(identical);
    out["targets"] = targets;
    Ok(out)
}

/// The sum of the counters `keys` of a side (a missing one counts 0).
fn sum_of(v: &Value, keys: &[&str]) -> u64 {
    keys.iter().map(|k| v[*k].as_u64().unwrap_or(0)).sum()
}

/// Pages a kernel side swapped out: into zswap, to the disk, and the
/// zero-filled ones that go to neither (uzswap's evictions count its
/// same-filled pages too).
fn kernel_out(k: &Value) -> u64 {
    sum_of(k, &["zswpout", "pswpout", "swpout_zero"])
}

/// Pages a kernel side swapped in, zero-filled ones included.
fn kernel_in(k: &Value) -> u64 {
    sum_of(k, &["zswpin", "pswpin", "swpin_zero"])
}

/// The CPU that moving pages out and in cost beyond the unconstrained
/// run's, per page moved, for a uzswap side and the kernel's (the target
/// "uzswap's CPU per fault and per eviction at most the kernel's"). Pages
/// moved: uzswap's evictions and faults over the tree (its faults include
/// each page's first touch, which the kernel serves as an ordinary fault:
/// their extra cost is uzswap's, their count makes its per-page figure
/// smaller); the kernel's pages stored into zswap, written to swap or
/// noted zero-filled, and read back from any of them (the zero-filled
/// ones count on both sides, as uzswap's count includes its own). A side
/// killed at the deadline has no CPU time,
/// and a side that moved no page no figure.
fn swap_cpu(side: &Value, kernel: &Value, free: &Value) -> Value {
    let extra = |v: &Value| Some((f(v, "cpu_seconds")? - f(free, "cpu_seconds")?).max(0.0));
    let ours = sum_of(side, &["tree_evictions", "tree_faults"]);
    let theirs = kernel_out(kernel) + kernel_in(kernel);
    let per =
        |cpu: Option<f64>, pages: u64| cpu.filter(|_| pages > 0).map(|c| c * 1e6 / pages as f64);
    let (eu, ek) = (extra(side), extra(kernel));
    let (u, k) = (per(eu, ours), per(ek, theirs));
    json!({
        "uzswap_extra_cpu_seconds": eu,
        "uzswap_pages_moved": ours,
        "uzswap_us_per_page": u,
        "kernel_extra_cpu_seconds": ek,
        "kernel_pages_moved": theirs,
        "kernel_us_per_page": k,
        "ratio": u.zip(k).filter(|&(_, k)| k > 0.0).map(|(u, k)| u / k),
    })
}

/// The index of the fastest configuration that completed with identical
/// outputs in every round.
fn fastest(configs: &[Value]) -> Option<usize> {
    configs
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            !c["oom_killed"].as_bool().unwrap_or(true)
                && c["outputs_identical"].as_bool().unwrap_or(false)
        })
        .filter_map(|(i, c)| f(c, "wall_seconds").map(|t| (i, t)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(i, _)| i)
}

pub fn run(args: &Args) -> Result<Value> {
    let uzswap = prepare_run(&args.sides)?;
    let w = Workload::prepare(args.workload, 1.0)?;
    note(&format!(
        "tree: {} in {}{}",
        w.sources.join(", "),
        w.dir().display(),
        if w.kind == Kind::Build {
            format!(" ({} units, gcc {CFLAGS})", w.units)
        } else {
            String::new()
        }
    ));
    let jobs = match w.kind {
        Kind::Build => args.jobs.clone(),
        _ => vec![1],
    };
    let budget_of = |peak: u64| match (args.budget_mib, w.kind) {
        (Some(m), _) => m * MIB,
        (None, Kind::Python) => PYTHON_BUDGET_MIB * MIB,
        (None, Kind::Build) => share_of(peak, 0.5),
        (None, _) => share_of(peak, 0.25),
    };
    let mut cases = Vec::new();
    for j in jobs {
        cases.push(case(&args.sides, &w, j, budget_of, &uzswap)?);
    }
    Ok(result(
        json!({
            "benchmark": "tree",
            "workload": w.kind,
            "sources": w.sources,
            "units": w.units,
            "cflags": CFLAGS,
        }),
        &args.sides,
        cases,
    ))
}

/// `uzswap-bench programs`: each real program, one case each, at a budget
/// of `budget_share` of its unconstrained peak.
pub fn run_programs(args: &ProgramsArgs) -> Result<Value> {
    if !(args.scale > 0.0 && args.scale <= 100.0) {
        bail!(
            "--scale {}: give a factor above 0 and at most 100",
            args.scale
        );
    }
    if !(args.budget_share > 0.0 && args.budget_share <= 1.0) {
        bail!(
            "--budget-share {}: give a share above 0 and at most 1 (0.25: a quarter of the footprint)",
            args.budget_share
        );
    }
    let uzswap = prepare_run(&args.sides)?;
    let mut cases = Vec::new();
    let mut left_out = Vec::new();
    for &kind in &args.programs {
        if !kind.available() {
            note(&format!("{}: not on this machine, left out", kind.label(1)));
            left_out.push(kind);
            continue;
        }
        let w = Workload::prepare(kind, args.scale)?;
        note(&format!(
            "{}: {} in {}",
            kind.label(1),
            w.sources.join(", "),
            w.dir().display()
        ));
        let mut c = case(
            &args.sides,
            &w,
            1,
            |peak| share_of(peak, args.budget_share),
            &uzswap,
        )?;
        c["argv"] = json!(w.argv(1));
        c["sources"] = json!(w.sources);
        cases.push(c);
    }
    Ok(result(
        json!({
            "benchmark": "programs",
            "scale": args.scale,
            "budget_share": args.budget_share,
            "left_out": left_out,
        }),
        &args.sides,
        cases,
    ))
}

/// A benchmark's JSON object: `head`, then what every run records.
fn result(mut head: Value, sides: &Sides, cases: Vec<Value>) -> Value {
    head["rounds"] = json!(sides.rounds);
    head["kernel_configs"] = if sides.skip_kernel {
        Value::Null
    } else {
        json!(sides.kernel_configs)
    };
    head["memory_target"] = json!(MEMORY_TARGET);
    head["machine"] = machine();
    head["targets_met"] = json!(targets_met(&cases, sides));
    head["cases"] = json!(cases);
    head
}

/// A budget of `share` of an unconstrained peak: whole MiB, 16 at least.
fn share_of(peak: u64, share: f64) -> u64 {
    ((peak as f64 * share) as u64).div_ceil(MIB).max(16) * MIB
}

/// The `uzswap` binary, as an absolute path (the programs run in their own
/// directory), with Ctrl-C caught from here on.
fn prepare_run(sides: &Sides) -> Result<PathBuf> {
    let uzswap = crate::bench_run::find_uzswap(sides.uzswap.as_deref())?;
    let uzswap =
        std::fs::canonicalize(&uzswap).with_context(|| format!("locating {}", uzswap.display()))?;
    catch_interrupts();
    Ok(uzswap)
}

/// Whether every case met every target it has.
fn targets_met(cases: &[Value], sides: &Sides) -> bool {
    let all = |k: &str| {
        cases
            .iter()
            .all(|c| c["targets"][k].as_bool().unwrap_or(false))
    };
    all("memory_within_1_05_budget")
        && all("outputs_identical")
        && cases.iter().all(|c| {
            c["targets"]["uzswap_cpu_at_most_program"]
                .as_bool()
                .unwrap_or(true)
        })
        && (sides.skip_kernel || all("wall_at_most_kernel"))
}

/// What the figures were measured on.
fn machine() -> Value {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:").map(|v| v.trim().to_string()))
        .unwrap_or_default();
    let gcc = Command::new("gcc")
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default();
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "kernel": kernel.trim(),
        "mem_total": mem,
        "gcc": gcc,
    })
}

/// A table of the result, for stderr.
pub fn table(v: &Value) -> String {
    let mib = |x: &Value| {
        x.as_u64()
            .map(|b| format!("{:.0}", b as f64 / MIB as f64))
            .unwrap_or_else(|| "-".into())
    };
    let secs = |x: &Value| {
        x.as_f64()
            .map(|t| format!("{t:.1}"))
            .unwrap_or_else(|| "-".into())
    };
    let mut s = format!(
        "{:<10} {:<26} {:>8} {:>9} {:>10} {:>10} {:>9} {:>4}\n",
        "case", "side", "wall s", "peak MiB", "out pages", "in pages", "identical", "OOM"
    );
    for c in v["cases"].as_array().into_iter().flatten() {
        let label = c["label"].as_str().unwrap_or("");
        let mut row = |name: &str, x: &Value, out: &Value, inn: &Value| {
            s += &format!(
                "{label:<10} {name:<26} {:>8} {:>9} {:>10} {:>10} {:>9} {:>4}\n",
                secs(&x["wall_seconds"]),
                mib(&x["peak_memory_bytes"]),
                out.as_u64()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "-".into()),
                inn.as_u64()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "-".into()),
                x["outputs_identical"],
                if x["oom_killed"].as_bool().unwrap_or(false) {
                    "yes"
                } else {
                    "no"
                }
            );
        };
        row(
            "unconstrained",
            &c["unconstrained"],
            &Value::Null,
            &Value::Null,
        );
        let u = &c["uzswap"];
        row(
            &format!(
                "uzswap ({} MiB)",
                c["budget_bytes"].as_u64().unwrap_or(0) / MIB
            ),
            u,
            &u["tree_evictions"],
            &u["tree_faults"],
        );
        for k in c["kernel_configs"].as_array().into_iter().flatten() {
            row(
                k["config"].as_str().unwrap_or(""),
                k,
                &json!(kernel_out(k)),
                &json!(kernel_in(k)),
            );
        }
        if c.get("swap").is_some() {
            let k = &c["swap"];
            row("plain swap", k, &json!(kernel_out(k)), &json!(kernel_in(k)));
        }
        if c.get("kernel_pool_inside").is_some() {
            let k = &c["kernel_pool_inside"];
            row(
                "zswap, pool inside B",
                k,
                &json!(kernel_out(k)),
                &json!(kernel_in(k)),
            );
        }
        if c.get("uzswap_equal_total").is_some() {
            let e = &c["uzswap_equal_total"];
            row(
                &format!(
                    "uzswap ({} MiB, = kernel)",
                    e["budget_bytes"].as_u64().unwrap_or(0) / MIB
                ),
                e,
                &e["tree_evictions"],
                &e["tree_faults"],
            );
        }
        if let (Some(p), Some(z)) = (
            u["program_cpu_seconds"].as_f64(),
            u["uzswap_cpu_seconds"].as_f64(),
        ) {
            s += &format!("{label:<10} uzswap CPU: the program {p:.1} s, uzswap {z:.1} s\n");
        }
        for (key, at) in [
            ("swap_cpu", "B"),
            ("swap_cpu_equal_total", "the kernel's total"),
        ] {
            let sc = &c[key];
            if let (Some(u), Some(k)) = (
                sc["uzswap_us_per_page"].as_f64(),
                sc["kernel_us_per_page"].as_f64(),
            ) {
                s += &format!(
                    "{label:<10} CPU beyond the unconstrained run per page moved, uzswap at {at}: {u:.1} µs ({} pages), the kernel {k:.1} µs ({} pages)\n",
                    sc["uzswap_pages_moved"], sc["kernel_pages_moved"]
                );
            }
        }
        if let Some(r) = c["wall_ratio_vs_kernel"].as_f64() {
            s += &format!(
                "{label:<10} uzswap/kernel ({}): wall {r:.2}x, memory {:.2}x{}\n",
                c["kernel_best_config"].as_str().unwrap_or(""),
                c["memory_ratio_vs_kernel"].as_f64().unwrap_or(0.0),
                c["wall_ratio_vs_kernel_equal_total"]
                    .as_f64()
                    .map(|e| format!("; at the kernel's total memory, wall {e:.2}x"))
                    .unwrap_or_default()
            );
            match c.get("wall_ratio_vs_kernel_pool_inside") {
                Some(Value::Null) => {
                    s += &format!(
                        "{label:<10} uzswap/kernel with its pool inside B: no ratio (a side failed or timed out)\n"
                    );
                }
                Some(r) => {
                    s += &format!(
                        "{label:<10} uzswap/kernel with its pool inside B: wall {:.2}x\n",
                        r.as_f64().unwrap_or(f64::NAN)
                    );
                }
                None => {}
            }
        }
    }
    s += "(out/in pages: uzswap, evictions/faults over the tree; kernel, swap + zswap out/in)\n";
    s += &format!("targets met: {}\n", v["targets_met"]);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_combine_to_the_median_time_and_the_largest_peak() {
        let r = |t: f64, peak: u64, same: bool| json!({ "wall_seconds": t, "peak_memory_bytes": peak, "outputs_identical": same, "oom_killed": false });
        let c = combine(vec![r(3.0, 10, true), r(1.0, 30, true), r(2.0, 20, false)]);
        assert_eq!(c["wall_seconds"], json!(2.0));
        assert_eq!(c["peak_memory_bytes"], json!(30));
        assert_eq!(c["outputs_identical"], json!(false));
        assert_eq!(c["wall_seconds_each_round"], json!([3.0, 1.0, 2.0]));
    }

    #[test]
    fn the_cpu_per_page_moved_is_taken_beyond_the_unconstrained_run() {
        let free = json!({"cpu_seconds": 10.0});
        let kernel = json!({"cpu_seconds": 13.0, "zswpout": 200_000, "zswpin": 50_000,
                            "pswpout": 40_000, "pswpin": 10_000});
        let ours = json!({"cpu_seconds": 16.0, "tree_evictions": 400_000, "tree_faults": 200_000});
        let v = swap_cpu(&ours, &kernel, &free);
        // 6 s over 600 k pages against 3 s over 300 k pages.
        assert_eq!(v["uzswap_us_per_page"].as_f64(), Some(10.0));
        assert_eq!(v["kernel_us_per_page"].as_f64(), Some(10.0));
        assert_eq!(v["kernel_pages_moved"].as_u64(), Some(300_000));
        assert_eq!(v["ratio"].as_f64(), Some(1.0));
        // Killed at the deadline (no CPU time), or nothing moved: no figure.
        let killed = json!({"cpu_seconds": null, "tree_evictions": 5, "tree_faults": 5});
        assert!(swap_cpu(&killed, &kernel, &free)["ratio"].is_null());
        let idle = json!({"cpu_seconds": 12.0, "tree_evictions": 0, "tree_faults": 0});
        assert!(swap_cpu(&idle, &kernel, &free)["uzswap_us_per_page"].is_null());
        // Faster than unconstrained counts as no extra CPU, not negative.
        let lucky = json!({"cpu_seconds": 9.0, "tree_evictions": 1, "tree_faults": 1});
        assert_eq!(
            swap_cpu(&lucky, &kernel, &free)["uzswap_us_per_page"].as_f64(),
            Some(0.0)
        );
    }

    #[test]
    fn a_run_killed_at_the_deadline_has_no_cpu_time() {
        use std::os::unix::process::ExitStatusExt;
        let ran = |timed_out: bool, raw: i32| Ran {
            wall_seconds: 120.0,
            cpu_seconds: 1.9,
            load_average: 1.0,
            status: std::process::ExitStatus::from_raw(raw),
            timed_out,
            samples: Vec::new(),
            log: String::new(),
        };
        assert_eq!(ran(true, libc::SIGKILL).cpu(), None);
        // Ended on its own, even with a failure: all of it was counted.
        assert_eq!(ran(false, 1 << 8).cpu(), Some(1.9));
        assert_eq!(ran(false, 0).cpu(), Some(1.9));
    }

    #[test]
    fn a_failed_round_has_no_time_and_is_never_the_fastest() {
        let ok = json!({ "wall_seconds": 5.0, "outputs_identical": true, "oom_killed": false });
        let oom = json!({ "wall_seconds": null, "outputs_identical": false, "oom_killed": true });
        let c = combine(vec![ok.clone(), oom.clone()]);
        assert!(c["wall_seconds"].is_null());
        assert_eq!(c["oom_killed"], json!(true));
        let fast_oom =
            json!({ "wall_seconds": 1.0, "outputs_identical": true, "oom_killed": true });
        assert_eq!(fastest(&[fast_oom, c, ok]), Some(2));
    }

    #[test]
    fn the_steered_limit_is_the_budget_less_the_pool_above_a_floor() {
        let dir = std::env::temp_dir().join(format!("uzswap-steer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("memory.limit_in_bytes");
        let read = || std::fs::read_to_string(&file).unwrap();
        let b = 100 * MIB;
        // The usage already below the target: straight there.
        assert_eq!(steer(&dir, b, 10 * MIB, 50 * MIB, b), 90 * MIB);
        assert_eq!(read(), (90 * MIB).to_string());
        // Less than a MiB of change: nothing written.
        std::fs::write(&file, "untouched").unwrap();
        assert_eq!(
            steer(&dir, b, 10 * MIB + 4096, 50 * MIB, 90 * MIB),
            90 * MIB
        );
        assert_eq!(read(), "untouched");
        // The usage at the limit: one step below it a call.
        assert_eq!(
            steer(&dir, b, 40 * MIB, 90 * MIB, 90 * MIB),
            90 * MIB - STEER_STEP
        );
        assert_eq!(read(), (90 * MIB - STEER_STEP).to_string());
        // ... never below the target.
        assert_eq!(steer(&dir, b, 40 * MIB, 62 * MIB, 70 * MIB), 60 * MIB);
        // The pool shrank: the limit rises again at once.
        assert_eq!(steer(&dir, b, 0, 60 * MIB, 60 * MIB), b);
        // A pool past three quarters of B: the floor.
        assert_eq!(steer(&dir, b, 90 * MIB, 0, b), b / STEER_FLOOR_SHARE);
        // A refused write (EBUSY on a real cgroup) keeps the last limit.
        let gone = dir.join("no-such-cgroup");
        assert_eq!(steer(&gone, b, 10 * MIB, 0, b), b);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
