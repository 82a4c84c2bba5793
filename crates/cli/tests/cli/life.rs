//! A process's life under `uzswap run` as the C library and the kernel
//! define it for the program, with its memory evicted: a fork whose C
//! library reads its own data after the fork hooks, threads that end with
//! `pthread_exit`, a signal sent to the process while the program blocks
//! it, and CPython's own regression tests of all of these.
//!
//! Each program checks its own data. A hang is a failure with every
//! thread's state and kernel stack printed (`common::run_sampling`).

use crate::common::{self, final_stats, programs, run, scratch, Ran};

/// Python 3 with its regression-test package (`python3 -m test`).
fn python_tests_missing() -> bool {
    common::missing(
        "python3 with its test package",
        &["python3", "-c", "import test.libregrtest"],
    )
}

/// Runs `tests/programs/SCRIPT` with python3 under `--memory-max BUDGET`
/// with `args`, in a scratch directory of the test's `name`: None (and a
/// skip) where there is no python3.
fn python_program(name: &str, budget: &str, script: &str, args: &[&str]) -> Option<Ran> {
    if common::missing("python3", &["python3", "-c", "pass"]) {
        return None;
    }
    let script = programs().join(script);
    let mut all = vec![
        "--memory-max",
        budget,
        "--",
        "python3",
        script.to_str().unwrap(),
    ];
    all.extend_from_slice(args);
    Some(run(&scratch(name), &all))
}

/// Runs the C program `lastthread` in `mode` under `--memory-max 32M`.
fn lastthread(mode: &str) -> Option<Ran> {
    let prog = crate::run::build("lastthread", &[])?;
    let dir = scratch(&format!("lastthread-{mode}"));
    Some(run(
        &dir,
        &[
            "--memory-max",
            "32M",
            "--",
            prog.to_str().unwrap(),
            mode,
            "64",
        ],
    ))
}

/// glibc's `fork()` reads its name-service state, a heap block of its own,
/// after every prepare hook has run (in a process with threads), when the
/// pager's locks are held by the forking thread; evicted, it hung the fork
/// for ever. Forty forks with the parent's data touched between them.
#[test]
fn a_fork_finds_the_c_library_s_own_data_resident() {
    require_uffd!();
    let Some(r) = python_program("forknss", "32M", "forknss.py", &["64", "40"]) else {
        return;
    };
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("ok: 40 forks, 64 MiB checked"),
        "{}",
        r.stdout
    );
}

/// The descriptor numbers a program finds open below 256 (as CPython's
/// `fd_status.py` looks) are its own, as unmanaged: after its memory was
/// evicted, in a forked child that evicts too, and in an exec'd child at
/// its start. The runtime's own (userfaultfds, eventfds, the backing file,
/// the ledger, the statistics socket, `/proc` files kept open) sit high in
/// the table.
#[test]
fn a_program_meets_none_of_the_runtime_s_descriptors_among_its_own() {
    require_uffd!();
    let Some(r) = python_program("fdnumbers", "24M", "fdnumbers.py", &["64"]) else {
        return;
    };
    assert_eq!(r.code, Some(0), "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("fdnumbers: ok"), "{}", r.stdout);
    let script = programs().join("fdnumbers.py");
    let plain = std::process::Command::new("python3")
        .arg(&script)
        .arg("8")
        .current_dir(scratch("fdnumbers-unmanaged"))
        .output()
        .expect("python3 runs");
    assert!(plain.status.success(), "{plain:?}");
    let lines = |out: &str| -> Vec<String> {
        out.lines()
            .filter(|l| {
                ["parent:", "forked:", "exec:"]
                    .iter()
                    .any(|p| l.starts_with(p))
            })
            .map(str::to_owned)
            .collect()
    };
    let want = lines(&String::from_utf8_lossy(&plain.stdout));
    assert_eq!(want.len(), 3, "{plain:?}");
    assert_eq!(
        lines(&r.stdout),
        want,
        "managed (left) and unmanaged (right)"
    );
}

/// `main` calls `pthread_exit`; the process ends (status 0) when its other
/// thread returns, as the C library ends it, though the runtime's helper
/// threads still run.
#[test]
fn a_process_ends_when_its_last_program_thread_exits() {
    require_uffd!();
    let Some(r) = lastthread("main-exits") else {
        return;
    };
    assert_eq!(r.code, Some(0), "{}", r.stderr);
}

/// A thread forks; in the child it is the only program thread, and the
/// process's leader, and it ends with `pthread_exit`: the child ends, and
/// its parent (which waits at most 60 s) says so.
#[test]
fn a_forked_child_ends_when_its_only_thread_exits() {
    require_uffd!();
    let Some(r) = lastthread("fork-thread") else {
        return;
    };
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("ok: the child ended"), "{}", r.stdout);
}

/// A signal sent to the process while both program threads block it stays
/// pending for the program (`sigpending`, then `sigwait`): a helper thread
/// that did not block it would take it (SIGUSR1's default action then ends
/// the process).
#[test]
fn a_signal_the_program_blocks_stays_pending_for_it() {
    require_uffd!();
    let Some(r) = python_program("sigpending", "16M", "sigpending.py", &["32", "20"]) else {
        return;
    };
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("sigpending: ok 20"), "{}", r.stdout);
}

/// CPython's own tests of `fork`, `exec`, `subprocess`, signals and threads,
/// two at a time, in a budget that makes the whole tree evict. One test is
/// left out: `test_import_from_another_thread` fails unmanaged too here
/// (this Python's site imports `threading` before the test's check).
/// `test_pass_fds` and `test_pass_fds_redirected` list the descriptors open
/// in a child below 256, which the runtime's own are not
/// (`uzswap_os::fdguard::lift`).
#[test]
fn cpython_s_own_tests_of_fork_exec_signals_and_threads_pass() {
    require_uffd!();
    if python_tests_missing() {
        return;
    }
    let dir = scratch("cpython");
    let stats = dir.join("stats.json");
    let r = run(
        &dir,
        &[
            "--memory-max",
            "64M",
            "--stats-json",
            stats.to_str().unwrap(),
            "--",
            "python3",
            "-m",
            "test",
            "-j2",
            "test_os",
            "test_fork1",
            "test_signal",
            "test_subprocess",
            "test_threading",
            "test_threadsignals",
            "test_wait4",
            "-i",
            "test_import_from_another_thread",
        ],
    );
    assert_eq!(r.code, Some(0), "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("Result: SUCCESS"), "{}", r.stdout);
    // The budget made the tree evict: not a run that fit in memory.
    let snap = final_stats(&stats);
    let evicted: u64 = snap["tree"]["processes"]
        .as_object()
        .expect("tree.processes, by pid")
        .values()
        .map(|p| p["evictions"].as_u64().unwrap_or(0))
        .sum();
    assert!(evicted > 10_000, "only {evicted} pages evicted");
}
