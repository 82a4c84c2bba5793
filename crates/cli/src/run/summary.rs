//! The end-of-run summary `uzswap run` prints on stderr: the whole
//! program's memory against its budget, how it ended, the tree's figures,
//! and the program's own final statistics with their warnings.

use super::args::{backing_of, tier_noun};
use super::{Args, FinalStats, Outcome, MISSING_WHY};
use crate::arbiter::TreeReport;
use crate::human;
use uzswap_contract::Snapshot;

/// The end-of-run summary (stderr).
pub fn summary(a: &Args, o: &Outcome) -> String {
    let mut s = headline(a, o);
    let missing = matches!(o.stats, FinalStats::Missing);
    tree_lines(&mut s, a, &o.tree, missing);
    let v = match &o.stats {
        FinalStats::Read(v) => v,
        FinalStats::Missing => {
            s += &format!(
                "uzswap: no final statistics: {MISSING_WHY}; the figures above are \
                 the processes' last reports\n"
            );
            return s;
        }
        FinalStats::Unreadable(why) => {
            s += &format!("uzswap: error: {why}\n");
            return s;
        }
    };
    program_lines(&mut s, a, &o.tree, v);
    s
}

/// The whole program's memory against its budget, and how it ended.
fn headline(a: &Args, o: &Outcome) -> String {
    let mut s = String::new();
    let prog = a.prog[0].to_string_lossy();
    let t = &o.tree;
    // The headline: the whole program's memory against its budget.
    s += &format!(
        "uzswap: {prog}'s memory peaked at {} of its {} budget ({:.2}x): resident, pools, \
         unmanaged memory and uzswap's own of its {} {} (Pss_Anon sampled every {} ms)\n",
        human(t.peak_bytes),
        human(a.memory_max),
        t.peak_bytes as f64 / a.memory_max as f64,
        t.processes.len().max(1),
        if t.processes.len() > 1 {
            "processes"
        } else {
            "process"
        },
        crate::arbiter::SAMPLE.as_millis(),
    );
    s += &match o.signal {
        Some(sig) => format!(
            "uzswap: {prog} killed by signal {sig} after {:.1} s\n",
            o.seconds
        ),
        None => format!(
            "uzswap: {prog} exited with status {} after {:.1} s\n",
            o.code, o.seconds
        ),
    };
    s
}

/// The tree's figures: its processes, their starts that waited, the CPU
/// time, and why it went over its budget. `missing`: the program wrote no
/// final statistics of its own.
fn tree_lines(s: &mut String, a: &Args, t: &TreeReport, missing: bool) {
    // Several processes, or one without final statistics of its own: the
    // tree's figures, from each process's last report.
    if t.processes.len() > 1 || (missing && !t.processes.is_empty()) {
        let sum = |f: fn(&crate::arbiter::Process) -> u64| t.processes.values().map(f).sum::<u64>();
        *s += &format!(
            "uzswap: {} {} ({} at once at most): {} faults ({} first touches), {} pages evicted, {} in {} at the end\n",
            t.processes.len(),
            if t.processes.len() > 1 { "processes" } else { "process" },
            t.max_processes,
            sum(|p| p.faults),
            sum(|p| p.first_touches),
            sum(|p| p.evictions),
            human(sum(|p| p.backing_bytes)),
            tier_noun(a),
        );
        if t.start_waits > 0 {
            *s += &format!(
                "uzswap: {} program {} waited for the others to give memory back, {:.2} s in all\n",
                t.start_waits,
                if t.start_waits > 1 { "starts" } else { "start" },
                t.start_wait_seconds,
            );
        }
    }
    if !t.processes.is_empty() {
        // By each process's reports: what it held besides managed pages
        // and pool, split into uzswap's own heap and the rest, at the
        // most.
        let largest =
            |f: fn(&crate::arbiter::Process) -> u64| t.processes.values().map(f).max().unwrap_or(0);
        *s += &format!(
            "uzswap: beside managed pages and pools, a process held at most {} of uzswap's own heap (glibc's count, an upper bound) and {} of the program's unmanaged memory\n",
            human(largest(|p| p.peak_own_bytes)),
            human(largest(|p| p.peak_unmanaged_bytes)),
        );
    }
    if t.cpu_seconds > 0.0 {
        *s += &format!(
            "uzswap: CPU time: the program {:.1} s, uzswap's threads in its processes {:.1} s \
             ({:.0} % of the program's), `uzswap run` {:.1} s\n",
            t.cpu_seconds - t.runtime_cpu_seconds,
            t.runtime_cpu_seconds,
            100.0 * t.runtime_cpu_seconds / (t.cpu_seconds - t.runtime_cpu_seconds).max(1e-3),
            t.run_cpu_seconds,
        );
    }
    for why in &t.over_budget_reasons {
        *s += &format!("uzswap: WARNING: over budget: {why}\n");
    }
}

/// The lines of the program's own final statistics `v`: its faults and
/// evictions, the remote tier, and the warnings of a pool that refused
/// pages and of loads that failed.
fn program_lines(s: &mut String, a: &Args, t: &TreeReport, v: &Snapshot) {
    let prog = a.prog[0].to_string_lossy();
    let (pager, cache) = (&v.pager, &v.cache);
    // In a tree the lines below are the program's own process's (its
    // runtime wrote them; the tree's totals are the line above): they say
    // so, lest `make`'s "evicted 0 pages" read as the build's.
    let whose = if t.processes.len() > 1 {
        format!("{prog} itself (pid {}): ", v.pid)
    } else {
        String::new()
    };
    *s += &format!("uzswap: {whose}{}\n", crate::stats::faults_line(v));
    *s += &format!(
        "uzswap: {whose}evicted {} pages into the pool, {} of them written back to {}\n",
        pager.evictions,
        cache.written_back_pages,
        tier_noun(a),
    );
    if cache.tier_round_trips > 0 {
        *s += &format!(
            "uzswap: {whose}the remote tier: {}\n",
            crate::stats::remote_line(cache)
        );
    }
    let over = pager.peak_resident_pages.saturating_sub(pager.budget_pages);
    if pager.store_full_episodes > 0 && over > 0 {
        let remedy = match backing_of(a) {
            Some(t) => format!(
                "{} could not take them either: {}",
                t.noun(),
                t.failing_remedy()
            ),
            None => "drop --no-backing-file or raise --memory-max".into(),
        };
        *s += &format!(
            "uzswap: WARNING: {whose}the pool ({}) refused pages, so the program went over its budget \
             by up to {over} pages rather than stop; {remedy}\n",
            human(cache.pool_limit_bytes),
        );
    }
    // Pages the program could not get back (it got SIGBUS); failed reads
    // that a retry fixed are reported apart: they point at the device.
    let errors = pager.load_errors;
    if errors > 0 {
        *s += &format!(
            "uzswap: WARNING: {whose}{errors} pages could not be loaded back (see the statistics)\n"
        );
    }
    let retried = pager.load_retries;
    if retried > 0 {
        *s += &format!(
            "uzswap: WARNING: {whose}{retried} loads failed ({} unreadable, {} corrupt, {} undecodable) and were \
             tried again; {}\n",
            cache.backing_read_fail,
            cache.backing_corrupt,
            cache.decompress_fail,
            backing_of(a).map_or("check the machine's memory".into(), |t| t.failing_remedy()),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::{read_final, temp_dir};
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: Args,
    }

    fn summary_of(stats: FinalStats) -> String {
        let a = Cli::parse_from(["x", "--memory-max", "1M", "--", "prog"]).run;
        let o = Outcome {
            code: 0,
            signal: None,
            seconds: 1.0,
            tree: Default::default(),
            stats,
        };
        summary(&a, &o)
    }

    /// A snapshot with the given load retries and errors, and failed reads
    /// (unreadable, corrupt).
    fn loads(retries: u64, errors: u64, unreadable: u64, corrupt: u64) -> FinalStats {
        let mut s = Snapshot::default();
        s.pager.load_retries = retries;
        s.pager.load_errors = errors;
        s.cache.backing_read_fail = unreadable;
        s.cache.backing_corrupt = corrupt;
        FinalStats::Read(Box::new(s))
    }

    /// In a tree, the lines that come from the program's own process's
    /// statistics name it, beside the tree's totals; a lone process's
    /// summary has no such label.
    #[test]
    fn summary_of_a_tree_names_the_root_process_lines() {
        let a = Cli::parse_from(["x", "--memory-max", "1M", "--", "make"]).run;
        let mut tree = crate::arbiter::TreeReport::default();
        for (pid, evictions, first, own) in [(10, 0, 3, 1 << 20), (11, 500, 4, 3 << 20)] {
            tree.processes.insert(
                pid,
                crate::arbiter::Process {
                    pid,
                    evictions,
                    faults: 10,
                    first_touches: first,
                    runtime_bytes: 8 << 20,
                    own_bytes: own,
                    peak_own_bytes: own,
                    peak_unmanaged_bytes: (8 << 20) - own,
                    ..Default::default()
                },
            );
        }
        let mut snap = Snapshot {
            pid: 10,
            ..Default::default()
        };
        snap.pager.load_errors = 1;
        let o = Outcome {
            code: 0,
            signal: None,
            seconds: 1.0,
            tree,
            stats: FinalStats::Read(Box::new(snap)),
        };
        let s = summary(&a, &o);
        assert!(s.contains("2 processes"), "{s}");
        assert!(s.contains("500 pages evicted"), "{s}");
        assert!(s.contains("20 faults (7 first touches)"), "{s}");
        // 8 MiB beside managed pages and pool in each, 1 and 3 MiB of it
        // uzswap's own heap.
        assert!(
            s.contains("a process held at most 3.0 MiB of uzswap's own heap (glibc's count, an upper bound) and 7.0 MiB of the program's unmanaged memory"),
            "{s}"
        );
        assert!(
            s.contains("uzswap: make itself (pid 10): evicted 0 pages into the pool"),
            "{s}"
        );
        assert!(s.contains("uzswap: make itself (pid 10): faults:"), "{s}");
        assert!(
            s.contains("WARNING: make itself (pid 10): 1 pages could not"),
            "{s}"
        );
        let lone = summary_of(loads(0, 0, 0, 0));
        assert!(!lone.contains("itself"), "{lone}");
        assert!(
            lone.contains("uzswap: evicted 0 pages into the pool"),
            "{lone}"
        );
    }

    #[test]
    fn summary_tells_lost_pages_from_retried_reads() {
        let clean = summary_of(loads(0, 0, 0, 0));
        assert!(!clean.contains("WARNING"), "{clean}");
        let retried = summary_of(loads(3, 0, 2, 1));
        assert!(
            retried.contains("3 loads failed (2 unreadable, 1 corrupt"),
            "{retried}"
        );
        assert!(!retried.contains("could not be loaded back"), "{retried}");
        let lost = summary_of(loads(2, 1, 3, 0));
        assert!(lost.contains("1 pages could not be loaded back"), "{lost}");
    }

    /// A final statistics file of another schema is an error in the
    /// summary, not a summary of zeros.
    #[test]
    fn unreadable_final_statistics_are_an_error() {
        let dir = temp_dir().unwrap();
        let path = dir.path().join("stats.json.1");
        assert!(matches!(read_final(&path), FinalStats::Missing));
        let mut v = serde_json::to_value(Snapshot::default()).unwrap();
        let pager = v["pager"].as_object_mut().unwrap();
        let evictions = pager.remove("evictions").unwrap();
        pager.insert("evicted".into(), evictions);
        std::fs::write(&path, v.to_string()).unwrap();
        let stats = read_final(&path);
        let FinalStats::Unreadable(why) = &stats else {
            panic!("a renamed field was read");
        };
        assert!(why.contains("evict"), "{why}");
        let s = summary_of(stats);
        assert!(
            s.contains("uzswap: error: cannot read the final statistics"),
            "{s}"
        );
        assert!(!s.contains("evicted 0 pages"), "{s}");
        std::fs::write(&path, Snapshot::default().to_json().unwrap()).unwrap();
        assert!(matches!(read_final(&path), FinalStats::Read(_)));
    }
}
