//! The Prometheus text exposition of a tree (`uzswap stats --prometheus`,
//! and the `/metrics` that `--serve` and `uzswap run --metrics` answer).
//!
//! Names follow Prometheus's conventions: `uzswap_` first, base units in
//! the name (`_bytes`, `_seconds`, `_ratio`), counters end in `_total`,
//! latencies are summaries (`quantile` labels, `_sum`, `_count`), every
//! per-process sample carries a `pid` label. Each number of a process's
//! statistics is placed by [`LEAVES`]: a field added to the snapshot and
//! not placed there fails a test, so none is exposed with a wrong type.

use crate::view::TreeView;
use serde_json::Value;
use std::collections::HashMap;
use std::fmt::Write as _;
use uzswap_contract::snapshot::pager_section;
use uzswap_contract::{PoolSection, Snapshot};

/// Prometheus text exposition, grouped by metric family: each family's
/// HELP and TYPE lines once, then all its samples.
#[derive(Default)]
struct Exposition {
    families: Vec<Family>,
    by_name: HashMap<String, usize>,
}

struct Family {
    name: String,
    help: String,
    kind: &'static str,
    samples: String,
}

impl Exposition {
    /// Adds the sample `name{labels} value` to its family.
    fn sample(
        &mut self,
        name: &str,
        help: &str,
        kind: &'static str,
        labels: &str,
        value: &dyn std::fmt::Display,
    ) {
        self.sample_of(name, "", help, kind, labels, value);
    }

    /// Adds `family+suffix{labels} value` to `family` (a summary's `_sum`
    /// and `_count` samples are its family's).
    fn sample_of(
        &mut self,
        family: &str,
        suffix: &str,
        help: &str,
        kind: &'static str,
        labels: &str,
        value: &dyn std::fmt::Display,
    ) {
        let i = *self.by_name.entry(family.to_owned()).or_insert_with(|| {
            self.families.push(Family {
                name: family.to_owned(),
                help: help.to_owned(),
                kind,
                samples: String::new(),
            });
            self.families.len() - 1
        });
        let _ = writeln!(
            self.families[i].samples,
            "{family}{suffix}{{{labels}}} {value}"
        );
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.families {
            let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
            out += &f.samples;
        }
        out
    }
}

/// A label value as the exposition format quotes it.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The tree's metrics (`uzswap_tree_*`, `uzswap_process_*{pid,comm,slot}`)
/// and the detail metrics of each process in `details`.
pub fn tree_prometheus(v: &TreeView, details: &[Snapshot]) -> String {
    let mut e = Exposition::default();
    let run = format!("run_pid=\"{}\"", v.run_pid);
    let t = &v.totals;
    let tree: [(&str, &str, u64); 4] = [
        (
            "budget_bytes",
            "The budget of the whole process tree (uzswap run --memory-max).",
            v.budget_bytes,
        ),
        (
            "memory_bytes",
            "What the tree's processes report holding: resident + pool + runtime, summed.",
            t.memory_bytes(),
        ),
        (
            "unallotted_bytes",
            "What the arbiter has allotted to no process.",
            v.unallotted_bytes,
        ),
        (
            "processes",
            "Processes of the tree in its ledger.",
            t.processes as u64,
        ),
    ];
    for (name, help, x) in tree {
        e.sample(&format!("uzswap_tree_{name}"), help, "gauge", &run, &x);
    }
    for r in &v.rows {
        // The slot tells apart the rows of one pid (one per image it
        // executed).
        let l = format!(
            "pid=\"{}\",comm=\"{}\",slot=\"{}\"",
            r.pid,
            label(&r.comm),
            r.slot
        );
        let gauges: [(&str, &str, u64); 5] = [
            (
                "resident_bytes",
                "Managed pages the process holds resident.",
                r.resident_bytes,
            ),
            (
                "pool_bytes",
                "Memory of the process's compressed pool.",
                r.pool_bytes,
            ),
            (
                "runtime_bytes",
                "The process's uzswap runtime's own memory.",
                r.runtime_bytes,
            ),
            (
                "backing_bytes",
                "What the process keeps in its backing tier (file or remote).",
                r.backing_bytes,
            ),
            (
                "stored_pages",
                "Pages the process has stored (pool and backing tier).",
                r.stored_pages,
            ),
        ];
        for (name, help, x) in gauges {
            e.sample(&format!("uzswap_process_{name}"), help, "gauge", &l, &x);
        }
        if let Some(a) = r.allot_bytes {
            e.sample(
                "uzswap_process_allotment_bytes",
                "What the arbiter allotted the process.",
                "gauge",
                &l,
                &a,
            );
        }
        e.sample(
            "uzswap_process_faults_total",
            "Faults the process's runtime resolved.",
            "counter",
            &l,
            &r.faults,
        );
        e.sample(
            "uzswap_process_evictions_total",
            "Pages the process's runtime evicted.",
            "counter",
            &l,
            &r.evictions,
        );
    }
    for d in details {
        detail_metrics(d, &mut e);
    }
    e.render()
}

/// How a number of a process's statistics is exposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A count since the process started: `_total` appended.
    Counter,
    /// A level, named as it is (its unit already in the name: `_bytes`,
    /// `_pages`, or a count of things).
    Gauge,
    /// A level in bytes whose name lacks the unit: `_bytes` appended.
    Bytes,
    /// A ratio: `_ratio` appended.
    Ratio,
    /// Seconds, named with `_s`: named `_seconds` instead.
    Seconds,
}

use Kind::{Bytes, Counter, Gauge, Ratio, Seconds};

/// Every number of a snapshot, by its path in `uzswap stats --json`'s
/// `detail`, and how it is exposed. Latency summaries (objects with
/// `p50_us`) and the pool's class table are exposed by their shape and
/// are not listed.
const LEAVES: &[(&str, Kind)] = &[
    ("uptime_s", Seconds),
    ("config.memory_max", Bytes),
    ("config.pool_max", Bytes),
    ("config.keep_clean", Gauge),
    ("config.cpu_handlers", Gauge),
    ("config.cosched", Gauge),
    ("config.latency_hold", Gauge),
    ("config.access_signal", Gauge),
    ("config.dedup", Gauge),
    ("pager.faults_zero", Counter),
    ("pager.faults_pool", Counter),
    ("pager.faults_backing", Counter),
    ("pager.faults_same_filled", Counter),
    ("pager.faults_wp", Counter),
    ("pager.faults_parked", Counter),
    ("pager.cpu_handlers", Gauge),
    ("pager.faults_local", Counter),
    ("pager.faults_remote", Counter),
    ("pager.faults_throttled", Counter),
    ("pager.faults_again", Counter),
    ("pager.faults_waited", Counter),
    ("pager.waits_timed_out", Counter),
    ("pager.latency_holds", Counter),
    ("pager.latency_held_s", Seconds),
    ("pager.latency_read_held", Counter),
    ("pager.access_chunks", Gauge),
    ("pager.access_unsplit_regions", Gauge),
    ("pager.access_samples", Counter),
    ("pager.access_sample_s", Seconds),
    ("pager.access_second_chances", Counter),
    ("pager.access_cold_pages", Gauge),
    ("pager.access_cold_victims", Counter),
    ("pager.faults_rezeroed", Counter),
    ("pager.faults_foreign", Counter),
    ("pager.readahead_pages", Counter),
    ("pager.zero_readahead_pages", Counter),
    ("pager.refaults", Counter),
    ("pager.refaults_activated", Counter),
    ("pager.refaults_near", Counter),
    ("pager.evictions", Counter),
    ("pager.clean_drops", Counter),
    ("pager.evictions_aborted", Counter),
    ("pager.list_entries", Gauge),
    ("pager.lists_bytes", Gauge),
    ("pager.discard_calls", Counter),
    ("pager.evict_moved_pages", Counter),
    ("pager.evict_moved_first", Counter),
    ("pager.evict_moved_back", Counter),
    ("pager.evict_zero_mapped", Counter),
    ("pager.zero_mapped_pages", Gauge),
    ("pager.store_rejected", Counter),
    ("pager.load_errors", Counter),
    ("pager.load_retries", Counter),
    ("pager.discarded_pages", Counter),
    ("pager.remaps", Counter),
    ("pager.fork_prefaults", Counter),
    ("pager.fork_prefault_pages", Counter),
    ("pager.resident_pages", Gauge),
    ("pager.peak_resident_pages", Gauge),
    ("pager.store_full_episodes", Counter),
    ("pager.over_budget", Gauge),
    ("pager.stored_pages", Gauge),
    ("pager.budget_pages", Gauge),
    ("pager.charged_bytes", Gauge),
    ("pager.limit_pages", Gauge),
    ("cache.pool_limit_hit", Counter),
    ("cache.reject_reclaim_fail", Counter),
    ("cache.reject_alloc_fail", Counter),
    ("cache.reject_kmemcache_fail", Counter),
    ("cache.reject_compress_fail", Counter),
    ("cache.reject_compress_poor", Counter),
    ("cache.decompress_fail", Counter),
    ("cache.written_back_pages", Counter),
    ("cache.stored_pages", Gauge),
    ("cache.stored_incompressible_pages", Gauge),
    ("cache.same_filled_pages", Gauge),
    ("cache.stored_payload_bytes", Gauge),
    ("cache.cold_stores", Counter),
    ("cache.backing_pages", Gauge),
    ("cache.stores_to_backing", Counter),
    ("cache.reject_io", Counter),
    ("cache.duplicate_pages", Counter),
    ("cache.dedup_saved_bytes", Gauge),
    ("cache.loads_pool", Counter),
    ("cache.loads_backing", Counter),
    ("cache.load_pool_ns", Counter),
    ("cache.load_backing_ns", Counter),
    ("cache.loads_same_filled", Counter),
    ("cache.load_misses", Counter),
    ("cache.invalidated_pages", Counter),
    ("cache.writeback_batches", Counter),
    ("cache.backing_writes", Counter),
    ("cache.writeback_fail", Counter),
    ("cache.writeback_second_chance", Counter),
    ("cache.proactive_written_back_pages", Counter),
    ("cache.backing_read_fail", Counter),
    ("cache.backing_corrupt", Counter),
    ("cache.writer_compactions", Counter),
    ("cache.pool_total_size", Bytes),
    ("cache.index_bytes", Gauge),
    ("cache.backing_slots_used", Gauge),
    ("cache.backing_shared_files", Gauge),
    ("cache.backing_shared_slots", Gauge),
    ("cache.pool_limit_bytes", Gauge),
    ("cache.pool_full", Gauge),
    ("cache.tier_round_trips", Counter),
    ("cache.tier_bytes_sent", Counter),
    ("cache.tier_bytes_received", Counter),
    ("cache.tier_errors", Counter),
    ("cache.tier_missing", Counter),
    ("cache.tier_connects", Counter),
    ("cache.tier_read_ahead_hits", Counter),
    ("cache.tier_held_bytes", Gauge),
    ("space.reserved_bytes", Gauge),
    ("space.mapped_bytes", Gauge),
    ("space.peak_mapped_bytes", Gauge),
    ("space.active_chunks", Gauge),
    ("space.mmaps", Counter),
    ("space.munmaps", Counter),
    ("space.mremaps", Counter),
    ("space.mremap_copies", Counter),
    ("space.fixed_in_place", Counter),
    ("space.retired_bytes", Gauge),
    ("runtime_heap.in_use_bytes", Gauge),
    ("runtime_heap.held_bytes", Gauge),
    ("cosched.active", Gauge),
    ("cosched.pinned_cpu", Gauge),
    ("cosched.pins", Counter),
    ("cosched.releases", Counter),
    ("cosched.crowded", Counter),
    ("pool.pages_held", Gauge),
    ("pool.pool_bytes", Gauge),
    ("pool.objects", Gauge),
    ("pool.payload_bytes", Gauge),
    ("pool.metadata_bytes", Gauge),
    ("pool.limit_bytes", Gauge),
    ("pool.compactions", Counter),
    ("pool.objects_moved", Counter),
    ("pool.pages_compacted", Counter),
    ("pool.overhead", Ratio),
];

/// The exposed name and type of the number at `path` (None: not placed in
/// [`LEAVES`]).
fn placed(path: &str) -> Option<(String, &'static str)> {
    let kind = LEAVES.iter().find(|(p, _)| *p == path)?.1;
    let base = format!("uzswap_{}", path.replace('.', "_"));
    Some(match kind {
        Counter => (base + "_total", "counter"),
        Gauge => (base, "gauge"),
        Bytes => (base + "_bytes", "gauge"),
        Ratio => (base + "_ratio", "gauge"),
        Seconds => (
            base.strip_suffix("_s").unwrap_or(&base).to_owned() + "_seconds",
            "gauge",
        ),
    })
}

/// The numbers of a process's statistics as paths (`pager.faults_pool`)
/// and values, latency summaries as one object each. The class table and
/// lists are left out (exposed apart, or not numbers).
fn leaves(s: &Snapshot) -> Vec<(String, Value)> {
    fn walk(path: &str, v: &Value, out: &mut Vec<(String, Value)>) {
        match v {
            Value::Object(m) if m.contains_key("p50_us") => out.push((path.to_owned(), v.clone())),
            Value::Object(m) => {
                for (k, x) in m {
                    let sub = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(&sub, x, out);
                }
            }
            Value::Number(_) | Value::Bool(_) => out.push((path.to_owned(), v.clone())),
            _ => {}
        }
    }
    // Plain structs of numbers, strings and lists: they always serialize.
    let value = |v: Result<Value, serde_json::Error>| v.unwrap_or(Value::Null);
    let pool_totals = PoolSection {
        classes: Vec::new(),
        ..s.pool.clone()
    };
    let tree = serde_json::json!({
        "uptime_s": s.uptime_s,
        "config": value(serde_json::to_value(&s.config)),
        "pager": value(pager_section::to_value(&s.pager)),
        "cache": value(serde_json::to_value(&s.cache)),
        "space": value(serde_json::to_value(s.space)),
        "runtime_heap": value(serde_json::to_value(s.runtime_heap)),
        "cosched": value(serde_json::to_value(s.cosched)),
        "pool": value(serde_json::to_value(pool_totals)),
    });
    let mut out = Vec::new();
    walk("", &tree, &mut out);
    out
}

/// A process's statistics as metrics labelled with its pid; the per-class
/// pool table as `uzswap_pool_class_<column>{pid,class}`.
fn detail_metrics(s: &Snapshot, e: &mut Exposition) {
    let pid = format!("pid=\"{}\"", s.pid);
    let help = |path: &str| {
        format!("{path} of the process's statistics (uzswap stats --json: detail.{path}).")
    };
    for (path, v) in leaves(s) {
        if let Value::Object(m) = &v {
            summary(&path, m, &pid, e);
            continue;
        }
        let x = match &v {
            Value::Bool(b) => Value::from(u8::from(*b)),
            n => n.clone(),
        };
        // A number not placed is left out rather than typed wrongly (the
        // test of LEAVES keeps this from happening).
        if let Some((name, kind)) = placed(&path) {
            e.sample(&name, &help(&path), kind, &pid, &x);
        }
    }
    // Columns as the first row has them, in its keys' order; the class
    // index is the label. All are levels; the size is in bytes.
    let rows: Vec<(u32, Value)> = s
        .pool
        .classes
        .iter()
        .map(|c| (c.class, serde_json::to_value(c).unwrap_or(Value::Null)))
        .collect();
    let mut cols: Vec<&String> = Vec::new();
    if let Some((_, Value::Object(first))) = rows.first() {
        cols = first.keys().filter(|k| *k != "class").collect();
    }
    for col in cols {
        let unit = if col == "size" { "_bytes" } else { "" };
        let name = format!("uzswap_pool_class_{col}{unit}");
        let help = format!("Column {col} of the pool's class table, by size class.");
        for (class, row) in &rows {
            if let Some(x) = row.get(col.as_str()).filter(|x| x.is_number()) {
                e.sample(
                    &name,
                    &help,
                    "gauge",
                    &format!("{pid},class=\"{class}\""),
                    x,
                );
            }
        }
    }
}

/// A latency summary (`count`, `mean_us`, `p50_us`, `p99_us`, `max_us`)
/// as a Prometheus summary in seconds, and its maximum as a gauge.
fn summary(path: &str, m: &serde_json::Map<String, Value>, pid: &str, e: &mut Exposition) {
    let us = |k: &str| m.get(k).and_then(Value::as_f64).unwrap_or(0.0);
    let count = m.get("count").and_then(Value::as_u64).unwrap_or(0);
    let name = format!("uzswap_{}_seconds", path.replace('.', "_"));
    let help = format!("{path} of the process's statistics, in seconds.");
    for (q, k) in [("0.5", "p50_us"), ("0.99", "p99_us")] {
        let l = format!("{pid},quantile=\"{q}\"");
        e.sample_of(&name, "", &help, "summary", &l, &(us(k) / 1e6));
    }
    let sum = us("mean_us") * count as f64 / 1e6;
    e.sample_of(&name, "_sum", &help, "summary", pid, &sum);
    e.sample_of(&name, "_count", &help, "summary", pid, &count);
    let max = format!("uzswap_{}_max_seconds", path.replace('.', "_"));
    let help = format!("The largest sample of {path}, in seconds.");
    e.sample(&max, &help, "gauge", pid, &(us("max_us") / 1e6));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot with every optional number present.
    fn full() -> Snapshot {
        let mut s = Snapshot::default();
        s.config.pool_max = Some(1 << 20);
        s.pool.limit_bytes = Some(1 << 20);
        s.cosched.pinned_cpu = Some(0);
        s
    }

    #[test]
    fn every_number_of_the_statistics_is_placed() {
        let unplaced: Vec<String> = leaves(&full())
            .into_iter()
            .filter(|(p, v)| !v.is_object() && placed(p).is_none())
            .map(|(p, _)| p)
            .collect();
        assert!(
            unplaced.is_empty(),
            "numbers of the snapshot with no place in metrics::LEAVES: {unplaced:?}"
        );
        // And nothing placed that the snapshot no longer has.
        let paths: Vec<String> = leaves(&full()).into_iter().map(|(p, _)| p).collect();
        for (p, _) in LEAVES {
            assert!(paths.iter().any(|q| q == p), "{p} is in LEAVES only");
        }
    }

    #[test]
    fn names_carry_their_units_and_counters_end_in_total() {
        assert_eq!(
            placed("pager.faults_pool"),
            Some(("uzswap_pager_faults_pool_total".into(), "counter"))
        );
        assert_eq!(
            placed("uptime_s"),
            Some(("uzswap_uptime_seconds".into(), "gauge"))
        );
        assert_eq!(
            placed("config.memory_max"),
            Some(("uzswap_config_memory_max_bytes".into(), "gauge"))
        );
        assert_eq!(placed("pager.no_such_thing"), None);
    }

    #[test]
    fn a_latency_is_a_summary_in_seconds() {
        let mut s = full();
        s.pid = 42;
        s.pager.fault_latency.count = 4;
        s.pager.fault_latency.mean_us = 10.0;
        s.pager.fault_latency.p50_us = 8.0;
        s.pager.fault_latency.p99_us = 30.0;
        s.pager.fault_latency.max_us = 31.0;
        let mut e = Exposition::default();
        detail_metrics(&s, &mut e);
        let text = e.render();
        let f = "uzswap_pager_fault_latency_seconds";
        assert!(text.contains(&format!("# TYPE {f} summary\n")), "{text}");
        assert!(
            text.contains(&format!("{f}{{pid=\"42\",quantile=\"0.5\"}} 0.000008\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("{f}_count{{pid=\"42\"}} 4\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("{f}_sum{{pid=\"42\"}} 0.00004\n")),
            "{text}"
        );
        assert!(text.contains("uzswap_pager_fault_latency_max_seconds{pid=\"42\"} 0.000031\n"));
        // One TYPE line per family, summaries' samples included.
        let types = text.lines().filter(|l| l.starts_with("# TYPE")).count();
        let families: std::collections::HashSet<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let n = l.split('{').next().unwrap();
                n.strip_suffix("_sum")
                    .or_else(|| n.strip_suffix("_count"))
                    .filter(|b| text.contains(&format!("# TYPE {b} summary")))
                    .unwrap_or(n)
            })
            .collect();
        assert_eq!(types, families.len(), "{text}");
    }
}
