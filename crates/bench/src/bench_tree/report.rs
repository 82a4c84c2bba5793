//! The benchmark's JSON object around its cases (the machine, the targets
//! met) and its table for stderr.

use super::case::{kernel_in, kernel_out};
use super::{Sides, MEMORY_TARGET, MIB};
use serde_json::{json, Value};
use std::process::Command;

/// A benchmark's JSON object: `head`, then what every run records.
pub(super) fn result(mut head: Value, sides: &Sides, cases: Vec<Value>) -> Value {
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

/// Whether every case met every target it has.
pub(super) fn targets_met(cases: &[Value], sides: &Sides) -> bool {
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
pub(super) fn machine() -> Value {
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
    let mut s = format!(
        "{:<10} {:<26} {:>8} {:>9} {:>10} {:>10} {:>9} {:>4}\n",
        "case", "side", "wall s", "peak MiB", "out pages", "in pages", "identical", "OOM"
    );
    for c in v["cases"].as_array().into_iter().flatten() {
        side_rows(&mut s, c);
        ratio_lines(&mut s, c);
    }
    s += "(out/in pages: uzswap, evictions/faults over the tree; kernel, swap + zswap out/in)\n";
    s += &format!("targets met: {}\n", v["targets_met"]);
    s
}

/// One row of the table per side of case `c`.
fn side_rows(s: &mut String, c: &Value) {
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
    let label = c["label"].as_str().unwrap_or("");
    let mut row = |name: &str, x: &Value, out: &Value, inn: &Value| {
        *s += &format!(
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
}

/// The lines under case `c`'s rows: CPU times, CPU per page moved, and
/// the ratios against the kernel.
fn ratio_lines(s: &mut String, c: &Value) {
    let label = c["label"].as_str().unwrap_or("");
    let u = &c["uzswap"];
    if let (Some(p), Some(z)) = (
        u["program_cpu_seconds"].as_f64(),
        u["uzswap_cpu_seconds"].as_f64(),
    ) {
        *s += &format!("{label:<10} uzswap CPU: the program {p:.1} s, uzswap {z:.1} s\n");
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
            *s += &format!(
                "{label:<10} CPU beyond the unconstrained run per page moved, uzswap at {at}: {u:.1} µs ({} pages), the kernel {k:.1} µs ({} pages)\n",
                sc["uzswap_pages_moved"], sc["kernel_pages_moved"]
            );
        }
    }
    for (key, at) in [
        ("faults_vs_kernel", "B"),
        ("faults_vs_kernel_equal_total", "the kernel's total"),
    ] {
        let fk = &c[key];
        if let (Some(all), Some(first), Some(r)) = (
            fk["uzswap_faults"].as_u64(),
            fk["uzswap_first_touches"].as_u64(),
            fk["ratio_back"].as_f64(),
        ) {
            *s += &format!(
                "{label:<10} faults, uzswap at {at}: {all} ({first} first touches, {} pages back, {r:.2}x) against the kernel's {} swap-ins\n",
                all.saturating_sub(first),
                fk["kernel_swapins"]
            );
        }
    }
    if let Some(r) = c["wall_ratio_vs_kernel"].as_f64() {
        *s += &format!(
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
                *s += &format!(
                    "{label:<10} uzswap/kernel with its pool inside B: no ratio (a side failed or timed out)\n"
                );
            }
            Some(r) => {
                *s += &format!(
                    "{label:<10} uzswap/kernel with its pool inside B: wall {:.2}x\n",
                    r.as_f64().unwrap_or(f64::NAN)
                );
            }
            None => {}
        }
    }
}
