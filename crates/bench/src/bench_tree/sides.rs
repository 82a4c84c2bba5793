//! The sides of a case, each run once: the unconstrained reference,
//! `uzswap run`, and the kernel's swap in one of its configurations (with
//! its pool held inside B by a steered limit, [`steer`]).

use super::sampling::{oom_kills, read_u64, run_sampled, tail, tree_probe, Ran, Sample};
use super::workloads::{Outputs, Workload};
use super::{f, MEMORY_TARGET, MIB, PAGE_CLUSTER, ZSWAP_PARAMS};
use crate::kernel::{KernelSwap, ZswapSample};
use crate::note;
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use uzswap_ledger::proc_sample;

/// One configuration of the kernel side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct KernelConfig {
    /// zswap on (lzo), or plain swap.
    pub(super) zswap: bool,
    pub(super) shrinker: bool,
    pub(super) page_cluster: u32,
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

pub(super) const ZSWAP_CONFIGS: [KernelConfig; 4] = [
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
pub(super) const PLAIN_SWAP: KernelConfig = KernelConfig {
    zswap: false,
    shrinker: false,
    page_cluster: 3,
};

/// Fields every side reports.
pub(super) fn common(
    ran: &Ran,
    w: &Workload,
    reference: Option<&Outputs>,
) -> Result<(Value, Outputs)> {
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

pub(super) fn unconstrained(
    w: &Workload,
    jobs: u32,
    reference: Option<&Outputs>,
) -> Result<(Value, Outputs)> {
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

pub(super) fn uzswap_side(
    w: &Workload,
    jobs: u32,
    budget: u64,
    deadline: Duration,
    (uzswap, flags): (&Path, &[String]),
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
        .args(flags)
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
    v["uzswap_flags"] = json!(flags);
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
    // Of those, first touches (resolved with zeros): faults the kernel
    // serves in its own fault path, never as a swap-in.
    v["tree_first_touches"] = json!(sum("first_touches"));
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
pub(super) const STEER_FLOOR_SHARE: u64 = 4;

/// The most a lowered limit lies below the cgroup's usage: the write makes
/// the kernel reclaim that much in the steering thread before it returns.
pub(super) const STEER_STEP: u64 = 4 * MIB;

/// Holds a v1 cgroup's usage plus the zswap pool within `budget`, as a v2
/// cgroup charges the pool: moves the limit towards `budget` less `pool`
/// when that differs from the limit set last (`last`) by a MiB or more.
/// Raised at once; lowered at most [`STEER_STEP`] below `usage` a call (a
/// write of a limit far below the usage reclaims all the difference before
/// it returns, while the program goes on growing against the old limit;
/// or fails with EBUSY). Returns the limit now.
pub(super) fn steer(cg: &Path, budget: u64, pool: u64, usage: u64, last: u64) -> u64 {
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
pub(super) const STEER_EVERY: Duration = Duration::from_millis(10);

/// A thread that [`steer`]s a cgroup's limit every [`STEER_EVERY`] until
/// stopped or dropped (an error on the way out stops it too).
pub(super) struct Steering {
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
pub(super) fn kernel_side(
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
    // Held from here to the end of the run (released by the guard's drop,
    // on every path out, and by the kernel if this process dies).
    let held = ks.latency_hold.then(LatencyHeld::hold);
    let start = ZswapSample::read()?;
    let probe_cg = cg.clone();
    let steering = pool_inside.then(|| Steering::start(cg.clone(), budget));
    let ran = run_sampled(cmd, w.dir(), deadline, move |root| {
        let tree_pss_anon = proc_sample::sample(root, &[]).pss_anon;
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
    let hold_state = held.map(|h| h.release());
    let ooms = oom_kills(&cg);
    let (mut v, _) = common(&ran, w, Some(reference))?;
    let oom = ooms > 0 || ran.status.code() == Some(137);
    v["config"] = json!(name);
    v["pool_inside"] = json!(pool_inside);
    v["latency_hold"] = json!(hold_state);
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
/// The CPU latency request held by this process for one kernel run.
struct LatencyHeld;

impl LatencyHeld {
    fn hold() -> LatencyHeld {
        uzswap_os::latency::hold();
        LatencyHeld
    }

    /// Releases it and says what it was while held ("held", or
    /// "unavailable" without root).
    fn release(self) -> &'static str {
        let state = uzswap_os::latency::stats().state;
        drop(self);
        state
    }
}

impl Drop for LatencyHeld {
    fn drop(&mut self) {
        uzswap_os::latency::release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
