//! Co-scheduling (crates/preload/src/cosched.rs) on a real program: a
//! single-threaded Python process that evicts is pinned to one CPU with
//! uzswap's threads, is told its own affinity all the same, and its
//! children (by `fork`, and by `subprocess`'s vfork + exec) start with the
//! tree's CPUs; once it starts a thread of its own it is let go. The same
//! with a second thread that waits all the while (as a runtime's JIT, GC
//! and I/O threads do): the busy thread is pinned, the waiting one is not.
//! With `--no-cosched` it is never pinned. Once it is pinned, a busy loop
//! on every CPU makes the pin be let go for crowding, and the program ends
//! as it would unpinned (with the helpers at idle priority on a crowded
//! CPU, they would get no CPU at all, and the program would never end).
//! Every record is checked.
//!
//! Skipped (`common::skip`) where the machine cannot run it (no
//! userfaultfd, no python3, one CPU). Where the runtime may not leave idle
//! priority (not root, no CAP_SYS_NICE or RLIMIT_NICE) co-scheduling is
//! off: the first three tests check that nothing is pinned, and the one of
//! the crowded CPU, which needs a pin, is skipped.

use crate::common::*;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The program's report: its `name value` lines.
fn report(r: &Ran) -> HashMap<String, String> {
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("cosched: ok\n"), "{}", r.stdout);
    r.stdout
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Threads that spin, one per CPU, until dropped: something else keeps
/// every CPU busy.
struct BusyCpus(Arc<AtomicBool>, Vec<std::thread::JoinHandle<()>>);

impl BusyCpus {
    fn start() -> BusyCpus {
        let stop = Arc::new(AtomicBool::new(false));
        let n = uzswap_os::sched::affinity(0).unwrap().count();
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        BusyCpus(stop, threads)
    }
}

impl Drop for BusyCpus {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        for t in self.1.drain(..) {
            let _ = t.join();
        }
    }
}

/// Whether the main thread of `pid` runs on one CPU alone.
fn pinned(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("Cpus_allowed_list:"))?;
            Some(one_cpu(l.split_once(':')?.1.trim()))
        })
        .unwrap_or(false)
}

/// What the test saw of a pin while every CPU was kept busy.
#[derive(Default)]
struct Crowding {
    /// The program was seen pinned (and every CPU was then made busy).
    pinned: bool,
    /// Then seen let go, the CPUs still busy.
    let_go: bool,
}

/// Waits (60 s at most) until the program of the `uzswap run` `run` (its
/// child) is pinned, then keeps every CPU busy and waits (30 s at most)
/// until it is let go; then makes `done`, which ends the program's reads,
/// and returns with every CPU still busy until the returned loops are
/// dropped.
fn crowd_a_pin(run: u32, done: &Path) -> (Crowding, Option<BusyCpus>) {
    let program_pinned = || descendants(run).first().is_some_and(|&p| pinned(p));
    let wait = |limit: Duration, until: &dyn Fn() -> bool| {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if until() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    };
    let mut seen = Crowding::default();
    let mut busy = None;
    if wait(Duration::from_secs(60), &program_pinned) {
        seen.pinned = true;
        busy = Some(BusyCpus::start());
        seen.let_go = wait(Duration::from_secs(30), &|| !program_pinned());
    }
    std::fs::write(done, "").unwrap();
    (seen, busy)
}

/// The program's report and its final statistics (`--stats-json`); with
/// `crowd`, a busy loop on every CPU from the moment it is pinned.
fn run_program(
    name: &str,
    extra: &[&str],
    mode: Option<&str>,
) -> Option<(HashMap<String, String>, serde_json::Value)> {
    run_program_crowded(name, extra, mode, false)
}

fn run_program_crowded(
    name: &str,
    extra: &[&str],
    mode: Option<&str>,
    crowd: bool,
) -> Option<(HashMap<String, String>, serde_json::Value)> {
    if missing("python3", &["python3", "-c", "pass"]) {
        return None;
    }
    if uzswap_os::sched::affinity(0).unwrap().count() < 2 {
        skip("two CPUs or more: one CPU leaves nothing to pin to");
        return None;
    }
    let script = programs().join("cosched.py");
    let dir = scratch(name);
    let stats = dir.join("stats.json");
    let mut args = vec![
        "--memory-max",
        "48M",
        "--stats-json",
        stats.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "python3", script.to_str().unwrap(), "96", "3"]);
    args.extend(mode);
    // Where a pin is expected, the program reads on (30 s at most) until
    // it comes: on a loaded machine it may come late, or after a back-off.
    if !crowd && !extra.contains(&"--no-cosched") && uzswap_os::sched::may_leave_idle() {
        args.push("wait-pin=30");
    }
    // Crowded, it reads on until the test has seen the pin let go.
    let done = dir.join("crowded");
    let until = format!("until={}", done.display());
    if crowd {
        args.push(&until);
    }
    // The busy loops start once the program is pinned, inside the run
    // (which runs alone: `run_with`), and end after it.
    let (mut seen, mut busy) = (Crowding::default(), None);
    let ran = run_with(&dir, &args, |pid, _| {
        if crowd {
            (seen, busy) = crowd_a_pin(pid, &done);
        }
    });
    drop(busy);
    let mut r = report(&ran);
    if crowd {
        r.insert("test-saw-pinned".into(), seen.pinned.to_string());
        r.insert("test-saw-let-go".into(), seen.let_go.to_string());
    }
    Some((r, final_stats(&stats)))
}

fn number(v: &serde_json::Value, p: &str) -> u64 {
    v.pointer(p).and_then(|x| x.as_u64()).unwrap_or(0)
}

fn one_cpu(list: &str) -> bool {
    list.parse::<usize>().is_ok()
}

#[test]
fn a_single_threaded_program_that_evicts_runs_on_one_cpu_and_its_children_do_not() {
    require_uffd!();
    let Some((r, v)) = run_program("cosched-on", &[], None) else {
        return;
    };
    let before = &r["real-before"];
    assert!(!one_cpu(before), "started on one CPU: {r:?}");
    // What the program and its children are told, pinned or not.
    assert_eq!(r["seen"], r["seen-before"], "{r:?}");
    let n = r["seen-before"].split(',').count();
    assert_eq!(r["nproc"], n.to_string(), "{r:?}");
    assert_eq!(&r["child"], before, "{r:?}");
    // Let go once it has a second thread.
    assert_eq!(&r["real-after"], before, "{r:?}");
    assert!(
        number(&v, "/pager/evictions") > 0,
        "nothing was evicted: {v}"
    );
    let cosched = &v["cosched"];
    if uzswap_os::sched::may_leave_idle() {
        assert!(one_cpu(&r["real-pinned"]), "not pinned: {r:?}");
        // Counted: pinned, then let go for the thread (at exit, not pinned).
        assert_eq!(cosched["active"], true, "{cosched}");
        assert!(number(&v, "/cosched/pins") >= 1, "{cosched}");
        assert!(number(&v, "/cosched/releases") >= 1, "{cosched}");
        assert!(cosched["pinned_cpu"].is_null(), "{cosched}");
    } else {
        eprintln!("co-scheduling is off here (may not leave idle priority)");
        assert_eq!(&r["real-pinned"], before, "{r:?}");
        assert_eq!(cosched["active"], false, "{cosched}");
    }
}

#[test]
fn the_busy_thread_is_pinned_beside_a_waiting_one_and_let_go_when_it_ends() {
    require_uffd!();
    let Some((r, v)) = run_program("cosched-idle-thread", &[], Some("idle-thread")) else {
        return;
    };
    let before = &r["real-before"];
    assert!(!one_cpu(before), "started on one CPU: {r:?}");
    assert_eq!(r["seen"], r["seen-before"], "{r:?}");
    // The waiting thread keeps its CPUs, pinned or not.
    assert_eq!(&r["idle-real"], before, "{r:?}");
    // Let go when the waiting thread ended (and after the next thread).
    assert_eq!(&r["real-after"], before, "{r:?}");
    assert_eq!(&r["child"], before, "{r:?}");
    if uzswap_os::sched::may_leave_idle() {
        assert!(one_cpu(&r["real-pinned"]), "not pinned: {r:?}");
        assert!(number(&v, "/cosched/pins") >= 1, "{}", v["cosched"]);
        assert!(number(&v, "/cosched/releases") >= 1, "{}", v["cosched"]);
    } else {
        assert_eq!(&r["real-pinned"], before, "{r:?}");
    }
}

#[test]
fn with_no_cosched_nothing_is_pinned() {
    require_uffd!();
    let Some((r, v)) = run_program("cosched-off", &["--no-cosched"], None) else {
        return;
    };
    assert_eq!(r["real-pinned"], r["real-before"], "{r:?}");
    assert_eq!(r["seen"], r["seen-before"], "{r:?}");
    assert_eq!(v["cosched"]["active"], false, "{v}");
    assert_eq!(number(&v, "/cosched/pins"), 0, "{v}");
    assert_eq!(v["config"]["cosched"], false, "{v}");
}

#[test]
fn a_pin_on_a_cpu_something_else_keeps_busy_is_let_go() {
    require_uffd!();
    if !uzswap_os::sched::may_leave_idle() {
        skip("the right to leave idle priority (root, CAP_SYS_NICE or RLIMIT_NICE): no pin here");
        return;
    }
    let Some((r, v)) = run_program_crowded("cosched-crowded", &[], None, true) else {
        return;
    };
    // The program ended, every record right (`report`), with its CPUs.
    assert_eq!(r["seen"], r["seen-before"], "{r:?}");
    assert_eq!(&r["real-after"], &r["real-before"], "{r:?}");
    assert!(
        number(&v, "/pager/evictions") > 0,
        "nothing was evicted: {v}"
    );
    // Pinned (and then every CPU made busy), then let go.
    assert_eq!(r["test-saw-pinned"], "true", "never pinned: {r:?}");
    assert_eq!(r["test-saw-let-go"], "true", "not let go: {r:?}");
    let cosched = &v["cosched"];
    let pins = number(&v, "/cosched/pins");
    assert!(pins >= 1, "{cosched}");
    // Every pin was let go, at least once for crowding.
    assert_eq!(number(&v, "/cosched/releases"), pins, "{cosched}");
    assert!(number(&v, "/cosched/crowded") >= 1, "{cosched}");
    assert!(cosched["pinned_cpu"].is_null(), "{cosched}");
}
