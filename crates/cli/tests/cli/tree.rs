//! One budget for the whole program: `uzswap run --memory-max B` on real
//! multi-process programs of the machine (Python multiprocessing, a
//! parallel `make` of real C sources, a shell pipeline), each checking its
//! own results. The test samples the whole tree's memory as the kernel
//! counts it (`Pss_Anon` of `uzswap run` and every descendant, every
//! 100 ms) and holds it to the budget after start-up. Also: a worker killed
//! with SIGKILL gives its share back, a budget the runtimes alone exceed
//! and a full backing disk are said at once, with the remedy.
//!
//! Skipped (`common::skip`) where the machine cannot run them (no
//! userfaultfd, no python3, no make or cc, no sources).

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn python_workers_started_by_spawn_share_one_budget() {
    require_uffd!();
    if missing("python3", &["python3", "-c", "pass"]) {
        return;
    }
    let dir = scratch("spawn");
    let script = programs().join("workers.py");
    // Unmanaged: a parent and three workers of 40 MiB of records each,
    // about 240 MiB of Pss_Anon in all (Python's objects around them).
    let r = run(
        &dir,
        &[
            "--memory-max",
            "64M",
            "--",
            "python3",
            script.to_str().unwrap(),
            "spawn",
            "3",
            "40",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("ok 3 workers"), "{}", r.stdout);
    assert!(
        r.processes >= 4,
        "the workers were not seen: {}",
        r.processes
    );
    assert!(
        r.stderr.contains("processes ("),
        "no tree line: {}",
        r.stderr
    );
    assert_within(&r, 64 * MIB);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Python multiprocessing's default start method on Linux: workers forked
/// without exec. Nothing of the parent is brought back for the forks; each
/// worker takes over its copy of the parent's memory (evicted pages
/// included), reads the parent's records it inherited and checks them,
/// and the tree stays within the one budget.
#[test]
fn python_workers_started_by_fork_share_one_budget() {
    require_uffd!();
    if missing("python3", &["python3", "-c", "pass"]) {
        return;
    }
    // At 32 MiB the parent has most of its records evicted when it forks;
    // at 96 MiB most are resident (the workers must be managed all the
    // same: counted by its stored pages alone, the parent once brought
    // them back and left its workers unmanaged, 4.3 x the budget).
    for budget_mib in [32u64, 96] {
        workers_by_fork(budget_mib);
    }
}

fn workers_by_fork(budget_mib: u64) {
    let dir = scratch("fork");
    let script = programs().join("workers.py");
    let stats = dir.join("stats.json");
    let budget = format!("{budget_mib}M");
    let r = run(
        &dir,
        &[
            "--memory-max",
            &budget,
            "--stats-json",
            stats.to_str().unwrap(),
            "--",
            "python3",
            script.to_str().unwrap(),
            "fork",
            "3",
            "40",
        ],
    );
    assert_eq!(r.code, Some(0), "{budget}: {}", r.stderr);
    assert!(r.stdout.contains("ok 3 workers"), "{budget}: {}", r.stdout);
    assert!(
        r.processes >= 4,
        "{budget}: the workers were not seen: {}",
        r.processes
    );
    // The parent makes room for each worker before it forks (the worker's
    // copy of its runtime turns private at once, by writes no fault of
    // ours sees): the tree holds 0.99-1.03 x B at 32 MiB and 0.98-1.03 x
    // at 64 MiB (this test's runs, on two CPUs).
    // Without the room, 1.37-1.52 x at 32 MiB, the peak in the 0.4 s after
    // the forks; 2.26 x if each worker copied the pager's page records
    // (6 MiB apiece). The bound leaves room for a loaded machine, where the
    // parent's wait for the evictor is cut short; it fails without the
    // room, and if the workers ran unmanaged or the parent brought its
    // evicted pages back for the forks.
    let bound = budget_mib * MIB * 5 / 4;
    assert!(
        r.peak <= bound,
        "{budget}: the tree held {:.1} MiB, over 1.25 x the budget",
        r.peak as f64 / MIB as f64
    );
    // The parent brought nothing back for the forks, and the workers ran
    // managed (each its own slot, faults and evictions).
    let snap = final_stats(&stats);
    let pager = &snap["pager"];
    assert_eq!(pager["fork_prefault_pages"], 0, "{budget}: {pager}");
    let procs = snap["tree"]["processes"]
        .as_object()
        .expect("tree.processes, by pid");
    let root = snap["pid"].as_u64().expect("pid");
    let busy = procs
        .values()
        .filter(|p| {
            p["comm"] == "python3"
                && p["pid"].as_u64() != Some(root)
                && p["evictions"].as_u64().unwrap_or(0) > 0
        })
        .count();
    assert!(
        busy >= 3,
        "{budget}: the forked workers did not each evict: {procs:?}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// Processes that start and end between two of the arbiter's decisions
/// (a start with room does not wait for one) still reach the tree's
/// figures: each leaves its slot marked, and the arbiter reads its last
/// report before it gives the slot back.
#[test]
fn short_lived_processes_all_count_in_the_tree() {
    require_uffd!();
    if missing("python3", &["python3", "-c", "pass"]) || missing("true", &["true"]) {
        return;
    }
    let dir = scratch("brief");
    let stats = dir.join("stats.json");
    let r = run(
        &dir,
        &[
            "--memory-max",
            "1G",
            "--stats-json",
            stats.to_str().unwrap(),
            "--",
            "python3",
            "-c",
            "import subprocess\nfor _ in range(20): subprocess.run(['true'], check=True)\nprint('ran 20')",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("ran 20"), "{}", r.stdout);
    let snap = final_stats(&stats);
    let procs = snap["tree"]["processes"]
        .as_object()
        .expect("tree.processes, by pid");
    let brief = procs.values().filter(|p| p["comm"] == "true").count();
    assert_eq!(brief, 20, "{procs:?}");
    // And the summary with them (`python3` may be a shim that runs more).
    let line = format!("uzswap: {} processes (", procs.len());
    assert!(
        procs.len() > 20 && r.stderr.contains(&line),
        "the summary counts them: {}",
        r.stderr
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// The real C sources this test compiles: the zstd library that the
/// project's zstd binding builds from the cargo registry.
fn zstd_sources() -> Option<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))?;
    let reg = std::fs::read_dir(home.join("registry/src")).ok()?;
    for r in reg.flatten() {
        for e in std::fs::read_dir(r.path()).ok()?.flatten() {
            let lib = e.path().join("zstd/lib");
            if e.file_name().to_string_lossy().starts_with("zstd-sys-") && lib.is_dir() {
                return Some(lib);
            }
        }
    }
    None
}

const OBJECTS: [&str; 4] = [
    "compress/zstd_compress.c",
    "compress/zstd_opt.c",
    "decompress/zstd_decompress_block.c",
    "compress/huf_compress.c",
];

/// Writes a Makefile compiling OBJECTS into `dir`.
fn makefile(dir: &Path, lib: &Path) {
    let mut m = String::from("CFLAGS = -O2 -g0\nall:");
    let mut rules = String::new();
    for (i, src) in OBJECTS.iter().enumerate() {
        m += &format!(" o{i}.o");
        rules += &format!(
            "o{i}.o:\n\t$(CC) $(CFLAGS) -I{lib} -I{lib}/common -c {lib}/{src} -o $@\n",
            lib = lib.display()
        );
    }
    std::fs::write(dir.join("Makefile"), m + "\n" + &rules).unwrap();
}

fn objects(dir: &Path) -> Vec<Vec<u8>> {
    (0..OBJECTS.len())
        .map(|i| std::fs::read(dir.join(format!("o{i}.o"))).expect("the object was built"))
        .collect()
}

#[test]
fn a_parallel_make_builds_identical_objects_within_the_budget() {
    require_uffd!();
    if missing("make", &["make", "--version"]) || missing("cc", &["cc", "--version"]) {
        return;
    }
    let Some(lib) = zstd_sources() else {
        skip("zstd sources in the cargo registry ($CARGO_HOME/registry/src: cargo fetch)");
        return;
    };
    // The reference: the same Makefile, unmanaged.
    let plain = scratch("make-plain");
    makefile(&plain, &lib);
    let st = Command::new("make")
        .args(["-s", "-j2"])
        .current_dir(&plain)
        .status()
        .unwrap();
    assert!(st.success());
    // Two compilers at once peak at about 150 MiB unmanaged.
    let dir = scratch("make");
    makefile(&dir, &lib);
    let r = run(&dir, &["--memory-max", "64M", "--", "make", "-s", "-j2"]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        objects(&dir) == objects(&plain),
        "the objects differ from an unmanaged build"
    );
    assert!(r.processes >= 3, "make and its compilers were not seen");
    assert_within(&r, 64 * MIB);
    std::fs::remove_dir_all(dir).unwrap();
    std::fs::remove_dir_all(plain).unwrap();
}

#[test]
fn a_shell_pipeline_shares_the_budget() {
    require_uffd!();
    if missing("python3", &["python3", "-c", "pass"]) || missing("sort", &["sort", "--version"]) {
        return;
    }
    let dir = scratch("pipe");
    // 200,000 lines of 100 bytes (20 MB), sorted in memory by sort and
    // summed by python on the other end.
    let gen = "import hashlib\nfor i in range(200000): print(hashlib.sha256(str(i).encode()).hexdigest() * 2 + '0123456789abcdef' * 2 + 'xxxx')";
    let check = "import sys, hashlib\nh = hashlib.sha256()\nprev = ''\nn = 0\nfor l in sys.stdin:\n    assert l >= prev, 'not sorted'\n    prev = l; h.update(l.encode()); n += 1\nprint(n, h.hexdigest())";
    let cmd = format!("python3 -c \"{gen}\" | sort -S 200M | python3 -c \"{check}\"");
    let plain = Command::new("sh").args(["-c", &cmd]).output().unwrap();
    assert!(plain.status.success());
    let expect = String::from_utf8_lossy(&plain.stdout).into_owned();
    let r = run(&dir, &["--memory-max", "24M", "--", "sh", "-c", &cmd]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(r.stdout, expect, "the pipeline's result differs");
    assert!(r.stdout.starts_with("200000 "));
    assert_within(&r, 24 * MIB);
    std::fs::remove_dir_all(dir).unwrap();
}

/// The ledger of the tree a managed process belongs to.
fn ledger_of(pid: u32) -> Option<uzswap_ledger::Ledger> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let var = env
        .split(|&b| b == 0)
        .find_map(|v| v.strip_prefix(b"UZSWAP_LEDGER="))?;
    uzswap_ledger::Ledger::open(Path::new(std::str::from_utf8(var).ok()?)).ok()
}

#[test]
fn a_worker_killed_with_sigkill_gives_its_share_back() {
    require_uffd!();
    if missing("python3", &["python3", "-c", "pass"]) {
        return;
    }
    let dir = scratch("kill");
    // Two holders of 40 MiB each in 64 MiB: each gets about half.
    let hold = "import os, sys, time\nb = [bytes([i % 251]) * 4096 for i in range(10240)]\nprint('ready', os.getpid(), flush=True)\ntime.sleep(4)\nassert all(b[i] == bytes([i % 251]) * 4096 for i in range(len(b)))\nprint('checked', os.getpid(), flush=True)";
    let cmd = format!("python3 -c \"{hold}\" & python3 -c \"{hold}\" & wait");
    let mut seen = (0u64, 0u64);
    let r = run_with(
        &dir,
        &["--memory-max", "64M", "--", "sh", "-c", &cmd],
        |_, out| {
            let mut pids = Vec::new();
            let mut line = String::new();
            while pids.len() < 2 && out.read_line(&mut line).unwrap() > 0 {
                if let Some(p) = line.trim().strip_prefix("ready ") {
                    pids.push(p.parse::<u32>().unwrap());
                }
                line.clear();
            }
            let (victim, survivor) = (pids[0], pids[1]);
            let ledger = ledger_of(survivor).expect("the survivor is in a ledger");
            let allot = |pid: u32| {
                ledger
                    .read()
                    .iter()
                    .find(|s| s.pid == pid)
                    .and_then(|s| s.allot)
            };
            std::thread::sleep(Duration::from_millis(300));
            let before = allot(survivor).expect("the survivor has an allotment");
            // SAFETY: kill has no memory preconditions.
            unsafe { libc::kill(victim as i32, libc::SIGKILL) };
            let t0 = Instant::now();
            let mut after = before;
            while t0.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_millis(50));
                if allot(victim).is_none() {
                    after = allot(survivor).unwrap_or(0);
                    if after > 48 * MIB {
                        break;
                    }
                }
            }
            assert!(
                allot(victim).is_none(),
                "the killed worker's slot was not reaped"
            );
            seen = (before, after);
        },
    );
    let (before, after) = seen;
    // Below what it gets once alone (48 MiB and more, below): while the
    // other lived it could not have its whole want. (Not "below 40 MiB":
    // an idle neighbour gives pages to a busy one, and 40.03 MiB was seen.)
    assert!(
        before < 48 * MIB,
        "the survivor had {before} before the kill"
    );
    assert!(
        after > 48 * MIB,
        "the survivor got only {after} after the kill (from {before})"
    );
    assert!(
        r.stdout.contains("checked"),
        "the survivor did not check its data: {}",
        r.stdout
    );
    assert_within(&r, 64 * MIB);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_budget_the_runtimes_alone_exceed_is_said_with_the_remedy() {
    require_uffd!();
    if missing("python3", &["python3", "-c", "pass"]) {
        return;
    }
    let dir = scratch("tiny");
    let r = run(
        &dir,
        &[
            "--memory-max",
            "1M",
            "--",
            "python3",
            "-c",
            "b = bytes(8 << 20); import time; time.sleep(1); print(len(b))",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.contains("over its budget"), "{}", r.stderr);
    assert!(r.stderr.contains("raise --memory-max"), "{}", r.stderr);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_full_backing_disk_is_said_and_nothing_is_lost() {
    require_uffd!();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        skip("root, for a private small tmpfs");
        return;
    }
    if missing("unshare", &["unshare", "--version"]) {
        return;
    }
    if missing("python3", &["python3", "-c", "pass"]) {
        return;
    }
    let dir = scratch("full");
    let mnt = dir.join("disk");
    std::fs::create_dir(&mnt).unwrap();
    // A 2 MiB file system in a private mount namespace (nothing of the
    // machine changes), and a program whose compressed pages need more.
    let prog = "import hashlib\nb = [hashlib.sha256(str(i).encode()).digest() * 128 for i in range(20000)]\nassert all(b[i] == hashlib.sha256(str(i).encode()).digest() * 128 for i in range(len(b)))\nprint('ok', len(b))";
    let uz = env!("CARGO_BIN_EXE_uzswap");
    let inner = format!(
        "mount -t tmpfs -o size=2m none {m} && exec {uz} run --memory-max 16M --pool-max 4M --backing-file {m} -- python3 -c \"{prog}\"",
        m = mnt.display()
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &inner])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("--- stdout\n{stdout}--- stderr\n{stderr}---");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stdout.contains("ok 20000"), "the program's data: {stdout}");
    assert!(stderr.contains("over its budget"), "{stderr}");
    assert!(stderr.contains("disk full"), "{stderr}");
    std::fs::remove_dir_all(dir).unwrap();
}
