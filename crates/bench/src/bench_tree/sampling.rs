//! Running one program of a side while sampling its memory: its own
//! process group, a log file, a deadline, and an interruption (Ctrl-C,
//! SIGTERM) that kills the program instead of leaving the machine changed.

use super::{SAMPLE, STARTUP_SAMPLES};
use crate::note;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uzswap_ledger::proc_sample;

// Interruption: a flag the signal handler sets and every wait checks.

pub(super) static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Catches SIGINT and SIGTERM for the rest of the process: they set
/// [`INTERRUPTED`] instead of killing it with the machine changed.
pub(super) fn catch_interrupts() {
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

pub(super) fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted: the program was killed and the machine's settings put back");
    }
    Ok(())
}

// Running one program while sampling it.

/// One look at a side's memory.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Sample {
    /// What is held against B: the tree's Pss_Anon, or cgroup + pool.
    pub(super) memory: u64,
    /// Kernel sides: the cgroup's usage and the zswap pool, same instant.
    pub(super) cgroup: u64,
    pub(super) zswap_pool: u64,
    /// Kernel sides: the tree's `Pss_Anon`, read as on the other sides (so
    /// that every side pays the same sampling, and for the anonymous part
    /// of the cgroup's usage).
    pub(super) tree_pss_anon: u64,
}

/// What one run of a program gave.
pub(super) struct Ran {
    pub(super) wall_seconds: f64,
    /// CPU time (user + system) of the program and every descendant.
    pub(super) cpu_seconds: f64,
    /// The machine's 1-minute load average when it ended (others' work
    /// on a shared machine shows here).
    pub(super) load_average: f64,
    pub(super) status: std::process::ExitStatus,
    /// Killed at the deadline.
    pub(super) timed_out: bool,
    pub(super) samples: Vec<Sample>,
    /// Its stdout and stderr.
    pub(super) log: String,
}

impl Ran {
    /// The CPU time, if it was all counted: of a run killed at the
    /// deadline it was not (the processes orphaned by the kill are reaped
    /// by init, not by this benchmark, and the runtimes' reports stopped
    /// at the kill).
    pub(super) fn cpu(&self) -> Option<f64> {
        (!self.timed_out).then_some(self.cpu_seconds)
    }

    pub(super) fn counted(&self) -> impl Iterator<Item = &Sample> {
        self.samples.iter().skip(STARTUP_SAMPLES)
    }

    pub(super) fn peak(&self) -> u64 {
        self.counted().map(|s| s.memory).max().unwrap_or(0)
    }

    pub(super) fn over(&self, limit: u64) -> usize {
        self.counted().filter(|s| s.memory > limit).count()
    }
}

/// Kills the process group of a program still running when dropped (an
/// error or an interruption in the middle of a run).
pub(super) struct Group(Option<std::process::Child>);

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
pub(super) fn run_sampled(
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
pub(super) fn children_cpu_seconds() -> f64 {
    // SAFETY: a zeroed rusage is a valid out-parameter for getrusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// The tree under `root` as the kernel counts it.
pub(super) fn tree_probe(root: u32) -> Sample {
    Sample {
        memory: proc_sample::sample(root, &[]).pss_anon,
        ..Sample::default()
    }
}

pub(super) fn read_u64(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// A counter of a cgroup's `memory.oom_control` (`oom_kill`).
pub(super) fn oom_kills(cg: &Path) -> u64 {
    std::fs::read_to_string(cg.join("memory.oom_control"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The last lines of a run's log, for an error message.
pub(super) fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(6)..].join("\n")
}
#[cfg(test)]
mod tests {
    use super::*;

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
}
