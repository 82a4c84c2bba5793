//! `uzswap stats PID`: the live statistics of a program under `uzswap run`,
//! the whole process tree of it.
//!
//! One look at the tree (`view.rs`): its ledger's rows, and the detail of
//! the process asked about, or of the program (the root) when given the
//! `uzswap run` pid; `--prometheus` asks every process of the tree for its
//! own. Shown as text (a table, the totals against the budget, then the
//! detail), one JSON object, or Prometheus text exposition format (a pid
//! label on every per-process sample).

use crate::view::{ask_all, tree, Detail, TreeView};
use anyhow::Result;
use serde_json::Value;
use std::fmt::Write as _;
use uzswap_contract::Snapshot;

/// What `uzswap stats` prints.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// One JSON object.
    pub json: bool,
    /// Prometheus text exposition format.
    pub prometheus: bool,
    /// The tree only: no process is asked for its detail.
    pub brief: bool,
}

/// Renders `pid`'s tree as `o` asks.
pub fn show(pid: u32, o: Options) -> Result<String> {
    let brief = o.brief;
    let v = tree(pid, brief)?;
    if let Detail::Missing(why) = &v.detail {
        if o.json || o.prometheus {
            crate::note(&format!("uzswap: note: {why}"));
        }
    }
    if o.json {
        return Ok(json(&v)? + "\n");
    }
    if o.prometheus {
        let details = if brief { Vec::new() } else { ask_all(&v)? };
        return Ok(crate::metrics::tree_prometheus(&v, &details));
    }
    Ok(tree_text(&v))
}

/// The table of the tree, its totals against the budget, then the detail.
pub fn tree_text(v: &TreeView) -> String {
    use crate::human;
    let t = &v.totals;
    let mut s = format!(
        "uzswap run {}: {} processes hold {} of a budget of {} ({:.0}%), {} unallotted\n",
        v.run_pid,
        t.processes,
        human(t.memory_bytes()),
        human(v.budget_bytes),
        t.memory_bytes() as f64 * 100.0 / v.budget_bytes.max(1) as f64,
        human(v.unallotted_bytes),
    );
    // pid, command, resident, pool, unmanaged (the program's memory
    // uzswap does not manage), uzswap (its own heap), backing, allotment,
    // faults, evictions.
    let line = |c: [String; 10]| {
        format!(
            "{:>8} {:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9]
        )
    };
    s += &line(
        [
            "pid",
            "command",
            "resident",
            "pool",
            "unmanaged",
            "uzswap",
            "backing",
            "allotment",
            "faults",
            "evictions",
        ]
        .map(String::from),
    );
    for r in &v.rows {
        let mark = if Some(r.pid) == v.shown { "*" } else { "" };
        s += &line([
            format!("{mark}{}", r.pid),
            r.comm.clone(),
            human(r.resident_bytes),
            human(r.pool_bytes),
            human(r.runtime_bytes.saturating_sub(r.own_bytes)),
            human(r.own_bytes),
            human(r.backing_bytes),
            r.allot_bytes.map_or("-".into(), human),
            r.faults.to_string(),
            r.evictions.to_string(),
        ]);
    }
    s += &line([
        "total".into(),
        String::new(),
        human(t.resident_bytes),
        human(t.pool_bytes),
        human(t.runtime_bytes.saturating_sub(t.own_bytes)),
        human(t.own_bytes),
        human(t.backing_bytes),
        human(t.allot_bytes),
        t.faults.to_string(),
        t.evictions.to_string(),
    ]);
    let mut held: Vec<(u32, usize)> = Vec::new();
    for r in &v.rows {
        match held.last_mut() {
            Some((pid, n)) if *pid == r.pid => *n += 1,
            _ => held.push((r.pid, 1)),
        }
    }
    for (pid, n) in held.into_iter().filter(|&(_, n)| n > 1) {
        let _ = writeln!(
            s,
            "pid {pid} holds {n} rows: one per program it executed (an image that called exec \
             left its row to be reaped when the process exits)"
        );
    }
    match &v.detail {
        Detail::NotAsked => {}
        Detail::Shown(d) => {
            let _ = write!(s, "\n* pid {} in detail:\n{}", d.pid, text(d));
        }
        Detail::Missing(why) => {
            let _ = writeln!(s, "\n{why}");
        }
    }
    s
}

/// One JSON object: the tree, its totals, and the detail of the process
/// asked about (the snapshot's own shape; null, with `detail_note` saying
/// why, when it did not answer).
pub fn json(v: &TreeView) -> Result<String> {
    let mut o = serde_json::json!({
        "run_pid": v.run_pid,
        "pid": v.asked,
        "detail_pid": v.shown,
        "budget_bytes": v.budget_bytes,
        "total_bytes": v.totals.memory_bytes(),
        "unallotted_bytes": v.unallotted_bytes,
        "processes": v.rows,
        "totals": v.totals,
        "detail": Value::Null,
    });
    match &v.detail {
        Detail::NotAsked => {}
        Detail::Shown(d) => o["detail"] = serde_json::from_str(&d.to_json()?)?,
        Detail::Missing(why) => o["detail_note"] = Value::from(why.as_str()),
    }
    Ok(o.to_string())
}

/// Faults by source and their latency, one line.
pub fn faults_line(s: &Snapshot) -> String {
    let p = &s.pager;
    format!(
        "faults: {} from pool, {} from {}, {} same-filled, {} zero; latency p50 {:.1} us p99 {:.1} us",
        p.faults_pool,
        p.faults_backing,
        s.config.backing.as_ref().map_or("no backing tier", |t| t.noun()),
        p.faults_same_filled,
        p.faults_zero,
        p.fault_latency.p50_us,
        p.fault_latency.p99_us,
    )
}

/// What a remote tier cost and holds, one line.
pub fn remote_line(cache: &uzswap_cache::CacheStats) -> String {
    use crate::human;
    format!(
        "{} round trips ({} loads read ahead), {} sent, {} received, {} errors ({} keys missing), \
         {} connections; it holds {} for {} of pages",
        cache.tier_round_trips,
        cache.tier_read_ahead_hits,
        human(cache.tier_bytes_sent),
        human(cache.tier_bytes_received),
        cache.tier_errors,
        cache.tier_missing,
        cache.tier_connects,
        human(cache.tier_held_bytes),
        human(cache.backing_pages * 4096),
    )
}

/// A readable page: the headline figures and the pool's class table.
pub fn text(v: &Snapshot) -> String {
    use crate::human;
    let (pager, cache) = (&v.pager, &v.cache);
    // Without --pool-max the limit is what the process's share gives the
    // pool now (`preload::share`; 20 % of RAM outside a run).
    let pool = match v.config.pool_max {
        Some(max) => format!("pool max {}", human(max)),
        None => format!("pool limit {} now", human(v.cache.pool_limit_bytes)),
    };
    let mut s = format!(
        "pid {} up {:.1} s: memory max {}, {pool}, compressor {}\n",
        v.pid,
        v.uptime_s,
        human(v.config.memory_max),
        v.config.compressor,
    );
    s += &format!(
        "resident {} pages (peak {}, budget {}); managed mappings {} (peak {})\n",
        pager.resident_pages,
        pager.peak_resident_pages,
        pager.budget_pages,
        human(v.space.mapped_bytes),
        human(v.space.peak_mapped_bytes),
    );
    s += &format!(
        "{}; evictions {} ({} moved out, the rest in {} discard calls; {} faults waited for one)\n",
        faults_line(v),
        pager.evictions,
        pager.evict_moved_pages,
        pager.discard_calls,
        pager.faults_again
    );
    s += &access_line(pager);
    s += &format!(
        "cache: stored {} pages, pool {}, written back {}, load errors {}\n",
        cache.stored_pages,
        human(cache.pool_total_size),
        cache.written_back_pages,
        pager.load_errors,
    );
    s += &format!(
        "pages now: {} in the pool ({} same-filled), {} in {}\n",
        cache.stored_pages,
        cache.same_filled_pages,
        cache.backing_pages,
        v.config
            .backing
            .as_ref()
            .map_or("no backing tier", |t| t.noun()),
    );
    if let Some(uzswap_contract::BackingTier::Redis(url)) = &v.config.backing {
        s += &format!("remote tier {url}: {}\n", remote_line(cache));
    }
    s += &format!(
        "runtime heap: {} in use ({} index, {} allocator metadata), {} held\n",
        human(v.runtime_heap.in_use_bytes),
        human(cache.index_bytes),
        human(v.pool.metadata_bytes),
        human(v.runtime_heap.held_bytes),
    );
    s += &cosched_line(&v.cosched);
    s += &v.pool_table;
    if !v.pool_table.ends_with('\n') {
        s.push('\n');
    }
    s
}

/// What chooses victims beside the lists, in a line.
fn access_line(p: &uzswap_region::PagerStats) -> String {
    if p.access_signal != "chunks" {
        return format!("victims by use: {}\n", p.access_signal);
    }
    format!(
        "victims by use: {} chunk mappings ({} regions left whole), {} samples in {:.0} ms, \
         {} second chances, {} victims from untouched chunks\n",
        p.access_chunks,
        p.access_unsplit_regions,
        p.access_samples,
        p.access_sample_s * 1e3,
        p.access_second_chances,
        p.access_cold_victims,
    )
}

/// What co-scheduling is doing, in a line.
fn cosched_line(c: &uzswap_contract::CoschedStats) -> String {
    if !c.active {
        return "co-scheduling: off\n".into();
    }
    let now = match c.pinned_cpu {
        Some(cpu) => format!("pinned to CPU {cpu} with uzswap's threads"),
        None => "not pinned".into(),
    };
    format!(
        "co-scheduling: {now}; pinned {} times, let go {} ({} for a crowded CPU)\n",
        c.pins, c.releases, c.crowded
    )
}
