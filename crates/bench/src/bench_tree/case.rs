//! One case of the benchmark (one program, one -jN): every side over the
//! rounds, combined into the case's JSON object with its ratios against
//! the kernel and its targets.

use super::sides::{kernel_side, unconstrained, uzswap_side, PLAIN_SWAP, ZSWAP_CONFIGS};
use super::workloads::{Outputs, Workload};
use super::{f, KernelConfigs, Sides, MEMORY_TARGET, MIB};
use crate::kernel::KernelSwap;
use crate::note;
use crate::stats::median;
use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

// Rounds and results.

/// A side over the rounds: the round of the median wall time in full, the
/// wall time the median, the peak the largest, outputs identical and
/// completion only if in every round, OOM if in any.
pub(super) fn combine(runs: Vec<Value>) -> Value {
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

/// One program (one -jN of the build): every side, `rounds` times, at the
/// budget `budget_of` gives for the unconstrained peak.
pub(super) fn case(
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
    let c = Case {
        args,
        w,
        jobs,
        label,
        budget,
        deadline,
        uzswap,
        reference,
    };
    // The kernel's swap: set up once for the case, put back at its end.
    let mut ks = if args.skip_kernel {
        None
    } else {
        let mut ks = KernelSwap::setup((unconstrained_peak * 3 / 2).max(256 * MIB), Some("lzo"))?;
        ks.latency_hold = args.kernel_latency_hold;
        Some(ks)
    };
    let mut runs = c.rounds(first, ks.as_mut())?;
    // The fastest configuration again, its pool held inside B.
    if let (Some(ks), Some(b), false) = (ks.as_mut(), runs.best, args.skip_pool_inside) {
        let cfg = ZSWAP_CONFIGS[b];
        for _ in 0..args.rounds {
            runs.inside.push(kernel_side(
                ks,
                cfg,
                w,
                jobs,
                budget,
                deadline,
                &c.reference,
                true,
            )?);
        }
    }
    drop(ks); // swap off, zswap and page-cluster back, cgroups removed
              // uzswap at the fastest kernel configuration's total memory.
    let best_total = runs
        .best
        .and_then(|b| combine(runs.kernel[b].clone())["peak_memory_bytes"].as_u64())
        .map(|t| t.div_ceil(MIB) * MIB)
        .filter(|&t| t > budget && !args.skip_equal_total);
    if let Some(total) = best_total {
        for _ in 0..args.rounds {
            runs.equal.push(c.ours_at(total, " (the kernel's total)")?);
        }
    }
    Ok(figures(jobs, &c.label, budget, runs))
}

/// What every run of a case shares.
struct Case<'a> {
    args: &'a Sides,
    w: &'a Workload,
    jobs: u32,
    label: String,
    budget: u64,
    /// A run still going after this is killed.
    deadline: Duration,
    uzswap: &'a Path,
    /// The unconstrained run's outputs, which every side must reproduce.
    reference: Outputs,
}

/// The runs of a case's sides, each side's rounds in order.
struct Runs {
    /// The unconstrained side's (the reference run first).
    free: Vec<Value>,
    /// uzswap's at B.
    ours: Vec<Value>,
    /// Each zswap configuration's, in [`ZSWAP_CONFIGS`]' order (with
    /// `--kernel-configs best`, after the first round only the fastest's).
    kernel: Vec<Vec<Value>>,
    /// Plain swap's.
    swap: Vec<Value>,
    /// The fastest zswap configuration of the first round.
    best: Option<usize>,
    /// The fastest configuration with its pool inside B.
    inside: Vec<Value>,
    /// uzswap's at the fastest configuration's total memory.
    equal: Vec<Value>,
}

impl Case<'_> {
    /// One run of uzswap at budget `b`, said on stderr.
    fn ours_at(&self, b: u64, what: &str) -> Result<Value> {
        let label = &self.label;
        note(&format!(
            "{label}: uzswap run --memory-max {} MiB{what} ...",
            b / MIB
        ));
        let v = uzswap_side(
            self.w,
            self.jobs,
            b,
            self.deadline,
            (self.uzswap, &self.args.uzswap_flags),
            &self.reference,
        )?;
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
    }

    /// Every side `rounds` times at B, the order of the sides reversed in
    /// odd rounds; `first`: the reference run, round 0's unconstrained.
    fn rounds(&self, first: Value, mut ks: Option<&mut KernelSwap>) -> Result<Runs> {
        let (w, jobs, budget, deadline) = (self.w, self.jobs, self.budget, self.deadline);
        let reference = &self.reference;
        let mut r = Runs {
            free: vec![first],
            ours: Vec::new(),
            kernel: vec![Vec::new(); ZSWAP_CONFIGS.len()],
            swap: Vec::new(),
            best: None,
            inside: Vec::new(),
            equal: Vec::new(),
        };
        for round in 0..self.args.rounds {
            // Order of this round's sides; reversed in odd rounds.
            let mut order: Vec<usize> = (0..3 + ZSWAP_CONFIGS.len()).collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for side in order {
                match side {
                    0 if round > 0 => {
                        note(&format!("{}: unconstrained ...", self.label));
                        r.free.push(unconstrained(w, jobs, Some(reference))?.0);
                    }
                    0 => {}
                    1 => r.ours.push(self.ours_at(budget, "")?),
                    2 => {
                        let Some(ks) = ks.as_deref_mut() else {
                            continue;
                        };
                        r.swap.push(kernel_side(
                            ks, PLAIN_SWAP, w, jobs, budget, deadline, reference, false,
                        )?);
                    }
                    k => {
                        let Some(ks) = ks.as_deref_mut() else {
                            continue;
                        };
                        let i = k - 3;
                        if self.args.kernel_configs == KernelConfigs::Best
                            && round > 0
                            && r.best != Some(i)
                        {
                            continue;
                        }
                        let cfg = ZSWAP_CONFIGS[i];
                        let v = kernel_side(ks, cfg, w, jobs, budget, deadline, reference, false)?;
                        r.kernel[i].push(v);
                    }
                }
            }
            if round == 0 && ks.is_some() {
                r.best = fastest(
                    &r.kernel
                        .iter()
                        .map(|k| combine(k.clone()))
                        .collect::<Vec<_>>(),
                );
            }
        }
        Ok(r)
    }
}

/// The case's JSON object: every side combined over its rounds, the
/// ratios against the fastest kernel configuration, and the targets.
fn figures(jobs: u32, label: &str, budget: u64, runs: Runs) -> Value {
    let configs: Vec<Value> = runs
        .kernel
        .into_iter()
        .filter(|r| !r.is_empty())
        .map(combine)
        .collect();
    let best = fastest(&configs);
    let ours = combine(runs.ours);
    let mut out = json!({
        "jobs": jobs,
        "label": label,
        "budget_bytes": budget,
        "unconstrained": combine(runs.free),
        "uzswap": ours,
    });
    let limit = budget as f64 * MEMORY_TARGET;
    let memory_ok = ours["over_target_samples"].as_u64() == Some(0)
        && (ours["peak_memory_bytes"].as_u64().unwrap_or(0) as f64) <= limit;
    let mut identical = ours["outputs_identical"].as_bool().unwrap_or(false);
    let mut targets = json!({ "memory_within_1_05_budget": memory_ok });
    if !configs.is_empty() {
        out["kernel_configs"] = json!(configs);
        out["swap"] = combine(runs.swap);
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
                if !runs.equal.is_empty() {
                    let e = combine(runs.equal);
                    out["wall_ratio_vs_kernel_equal_total"] = json!(
                        f(&e, "wall_seconds").unwrap_or(f64::INFINITY)
                            / f(k, "wall_seconds").unwrap_or(f64::NAN)
                    );
                    out["uzswap_equal_total"] = e;
                }
                if !runs.inside.is_empty() {
                    let i = combine(runs.inside);
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
                // swapped in, from zswap or the disk), all of them and
                // those that brought a stored page back (the first touches
                // left out, which the kernel takes as ordinary faults).
                out["faults_vs_kernel"] = faults_vs_kernel(&ours, k);
                if let Some(e) = out.get("uzswap_equal_total").cloned() {
                    out["faults_vs_kernel_equal_total"] = faults_vs_kernel(&e, k);
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
    out
}

/// The sum of the counters `keys` of a side (a missing one counts 0).
pub(super) fn sum_of(v: &Value, keys: &[&str]) -> u64 {
    keys.iter().map(|k| v[*k].as_u64().unwrap_or(0)).sum()
}

/// Pages a kernel side swapped out: into zswap, to the disk, and the
/// zero-filled ones that go to neither (uzswap's evictions count its
/// same-filled pages too).
pub(super) fn kernel_out(k: &Value) -> u64 {
    sum_of(k, &["zswpout", "pswpout", "swpout_zero"])
}

/// Pages a kernel side swapped in, zero-filled ones included.
pub(super) fn kernel_in(k: &Value) -> u64 {
    sum_of(k, &["zswpin", "pswpin", "swpin_zero"])
}

/// A uzswap side's faults beside the kernel's swap-ins: all of them, the
/// first touches among them, and the rest (pages brought back from the
/// pool or the backing file), each as a ratio to the kernel's swap-ins.
pub(super) fn faults_vs_kernel(side: &Value, kernel: &Value) -> Value {
    let all = side["tree_faults"].as_u64();
    let first = side["tree_first_touches"].as_u64();
    let swapins = kernel_in(kernel);
    let ratio = |n: Option<u64>| n.map(|n| n as f64 / swapins.max(1) as f64);
    let back = all.zip(first).map(|(a, f)| a.saturating_sub(f));
    json!({
        "uzswap_faults": all,
        "uzswap_first_touches": first,
        "uzswap_faults_back": back,
        "kernel_swapins": swapins,
        "ratio": ratio(all),
        "ratio_back": ratio(back),
    })
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
pub(super) fn swap_cpu(side: &Value, kernel: &Value, free: &Value) -> Value {
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
pub(super) fn fastest(configs: &[Value]) -> Option<usize> {
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
    fn faults_are_set_beside_the_kernel_s_swap_ins_with_and_without_first_touches() {
        let kernel = json!({"zswpin": 30_000, "pswpin": 8_000, "swpin_zero": 2_000});
        let ours = json!({"tree_faults": 100_000, "tree_first_touches": 60_000});
        let v = faults_vs_kernel(&ours, &kernel);
        assert_eq!(v["kernel_swapins"].as_u64(), Some(40_000));
        assert_eq!(v["uzswap_faults_back"].as_u64(), Some(40_000));
        assert_eq!(v["ratio"].as_f64(), Some(2.5));
        assert_eq!(v["ratio_back"].as_f64(), Some(1.0));
        // A side with no counts (killed before its reports): no ratios.
        let none = faults_vs_kernel(&json!({}), &kernel);
        assert!(none["ratio"].is_null() && none["ratio_back"].is_null());
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
}
