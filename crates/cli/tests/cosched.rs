//! Co-scheduling (crates/preload/src/cosched.rs) on a real program: a
//! single-threaded Python process that evicts is pinned to one CPU with
//! uzswap's threads, is told its own affinity all the same, and its
//! children (by `fork`, and by `subprocess`'s vfork + exec) start with the
//! tree's CPUs; once it starts a thread of its own it is let go. The same
//! with a second thread that waits all the while (as a runtime's JIT, GC
//! and I/O threads do): the busy thread is pinned, the waiting one is not.
//! With `--no-cosched` it is never pinned. With a busy loop on every CPU
//! the pin is let go for crowding, and the program ends as it would
//! unpinned (the helpers at idle priority once got no CPU at all there,
//! and the program never ended). Every record is checked.
//!
//! Skipped, with a note, where the machine cannot run it (no userfaultfd,
//! no python3, one CPU). Where the runtime may not leave idle priority
//! (not root, no CAP_SYS_NICE or RLIMIT_NICE) co-scheduling is off, and
//! the test checks that nothing is pinned.

mod common;

use common::*;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// One run at a time: two programs on two CPUs would crowd each other's,
/// and a crowded thread is let go (as it should be).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

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

/// The program's report and its final statistics (`--stats-json`); with
/// `busy`, run beside a busy loop on every CPU.
fn run_program(
    name: &str,
    extra: &[&str],
    mode: Option<&str>,
) -> Option<(HashMap<String, String>, serde_json::Value)> {
    run_program_beside(name, extra, mode, false)
}

fn run_program_beside(
    name: &str,
    extra: &[&str],
    mode: Option<&str>,
    busy: bool,
) -> Option<(HashMap<String, String>, serde_json::Value)> {
    if missing("python3", &["python3", "-c", "pass"]) {
        return None;
    }
    if uzswap_os::sched::affinity(0).unwrap().count() < 2 {
        eprintln!("SKIP: one CPU: nothing to pin to");
        return None;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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
    if !busy && !extra.contains(&"--no-cosched") && uzswap_os::sched::may_leave_idle() {
        args.push("wait-pin=30");
    }
    let busy = busy.then(BusyCpus::start);
    let ran = run(&dir, &args);
    drop(busy);
    let r = report(&ran);
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
    let Some((r, v)) = run_program_beside("cosched-crowded", &[], None, true) else {
        return;
    };
    // The program ended, every record right (`report`), with its CPUs.
    assert_eq!(r["seen"], r["seen-before"], "{r:?}");
    assert_eq!(&r["real-after"], &r["real-before"], "{r:?}");
    assert!(
        number(&v, "/pager/evictions") > 0,
        "nothing was evicted: {v}"
    );
    let pins = number(&v, "/cosched/pins");
    if pins > 0 {
        // Every pin was let go, for crowding.
        assert_eq!(number(&v, "/cosched/releases"), pins, "{}", v["cosched"]);
        assert!(number(&v, "/cosched/crowded") >= 1, "{}", v["cosched"]);
    }
    eprintln!(
        "pinned {pins} times beside the busy loops: {}",
        v["cosched"]
    );
}
