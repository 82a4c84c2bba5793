//! `uzswap run` on real programs: C programs built here from
//! `tests/programs/`, and a Python script, each under a resident budget a
//! quarter of its footprint or less. Each program checks its own data; the
//! test checks the exit status that comes through, and samples the
//! program's resident memory from /proc while it runs.
//!
//! Skipped (`common::skip`) where the machine cannot run them: no userfaultfd
//! for this user, no C compiler, no python3.

use crate::common;
use crate::common::{descendants, final_stats, run_sampling, uzswap, vm_rss, MIB};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// Resident memory beyond budget + pool that a managed process may use:
/// the program's own text and libraries, the runtime's heap (cache index,
/// pager tables), its threads' stacks and page buffers.
const RUNTIME_SLACK: u64 = 40 * MIB;

/// A scratch directory for this test binary.
fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("uzswap-run-tests-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    })
}

/// Builds `tests/programs/NAME.c` with `cc` once per test binary (tests
/// that run at once share the build: one compiling while another ran the
/// half-written file failed with "not executable"); None (and a note) if
/// there is no C compiler.
pub(crate) fn build(name: &str, extra: &[&str]) -> Option<PathBuf> {
    static BUILT: Mutex<Option<HashMap<String, Option<PathBuf>>>> = Mutex::new(None);
    let suffix = extra.join("").replace('-', "");
    let key = format!("{name}{suffix}");
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let built = built.get_or_insert_with(HashMap::new);
    if let Some(done) = built.get(&key) {
        return done.clone();
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(format!("{name}.c"));
    let out = scratch().join(&key);
    let r = Command::new("cc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .args(extra)
        .output();
    let result = match r {
        Ok(o) if o.status.success() => Some(out),
        Ok(o) => {
            common::skip(&format!(
                "cc {name}.c {extra:?} failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
            None
        }
        Err(e) => {
            common::skip(&format!("no C compiler (cc): {e}"));
            None
        }
    };
    built.insert(key, result.clone());
    result
}

/// What one `uzswap run` did.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    /// Largest VmRSS of any single process of the program, sampled.
    peak_rss: u64,
    /// Processes seen (the program and its descendants).
    processes: usize,
}

/// Runs `uzswap run ARGS`, sampling the resident memory of the program's
/// processes every 10 ms.
fn run(args: &[&str]) -> Ran {
    let peak = Arc::new(AtomicU64::new(0));
    let all = Arc::new(Mutex::new(HashSet::new()));
    let sample = {
        let (peak, all) = (peak.clone(), all.clone());
        move |pid: u32| {
            for p in descendants(pid) {
                all.lock().unwrap().insert(p);
                if let Some(r) = vm_rss(p) {
                    peak.fetch_max(r, Ordering::Relaxed);
                }
            }
        }
    };
    let mut cmd = uzswap();
    cmd.arg("run").args(args);
    let f = run_sampling(cmd, Duration::from_millis(10), sample, |_, _| {});
    eprintln!(
        "uzswap run {args:?}\n--- stdout\n{}--- stderr\n{}---",
        f.stdout, f.stderr
    );
    let processes = all.lock().unwrap().len();
    Ran {
        code: f.code,
        stdout: f.stdout,
        stderr: f.stderr,
        peak_rss: peak.load(Ordering::Relaxed),
        processes,
    }
}

fn backing_dir() -> String {
    scratch().to_string_lossy().into_owned()
}

/// Asserts the sampled resident memory stayed near the budget.
fn assert_near_budget(r: &Ran, budget: u64, pool: u64) {
    assert!(r.peak_rss > 0, "no resident memory was sampled");
    assert!(
        r.peak_rss <= budget + pool + RUNTIME_SLACK,
        "resident {} MiB, over budget {} MiB + pool {} MiB + {} MiB",
        r.peak_rss / MIB,
        budget / MIB,
        pool / MIB,
        RUNTIME_SLACK / MIB
    );
}

#[test]
fn threads_fill_and_verify_the_heap_in_a_quarter_of_its_size() {
    threads_fill_and_verify(&[], "fill-stats.json");
}

/// The same with a fault handler on each CPU (`--cpu-handlers`).
#[test]
fn threads_fill_and_verify_with_cpu_handlers() {
    threads_fill_and_verify(&["--cpu-handlers"], "fill-cpu-stats.json");
}

/// The same with dedup on and lz4's HC encoder (`--dedup --compressor
/// lz4hc:2`): every byte still reads back as written.
#[test]
fn threads_fill_and_verify_with_dedup_and_lz4hc() {
    threads_fill_and_verify(
        &["--dedup", "--compressor", "lz4hc:2"],
        "fill-dedup-stats.json",
    );
}

/// The same with victims that never joined the working set compressed by
/// zstd (`--cold-compressor zstd:-1`) and the rest by lz4.
#[test]
fn threads_fill_and_verify_with_a_cold_compressor() {
    threads_fill_and_verify(&["--cold-compressor", "zstd:-1"], "fill-cold-stats.json");
}

/// The same with pages written back to a Redis server (`--backing
/// redis://...`): every byte reads back, and no key stays on the server.
#[test]
fn threads_fill_and_verify_with_a_redis_backing_tier() {
    require_uffd!();
    let Some(srv) = uzswap_remote::testing::Server::start() else {
        return;
    };
    let url = srv.url();
    threads_fill_and_verify(&["--backing", &url], "fill-redis-stats.json");
    let v = final_stats(&scratch().join("fill-redis-stats.json"));
    assert_eq!(v.pointer("/config/backing"), Some(&serde_json::json!(url)));
    assert_eq!(srv.dbsize(), 0, "keys were left on the server");
}

/// A malformed address is refused before anything runs, an unreachable
/// server before the program starts: both with the remedy.
#[test]
fn a_bad_or_unreachable_redis_backing_is_refused() {
    refused(
        &[
            "--memory-max",
            "8M",
            "--backing",
            "redis://nohost",
            "--",
            "true",
        ],
        "redis://HOST:PORT[,HOST:PORT...]",
    );
    require_uffd!();
    // Nothing listens on port 1.
    refused(
        &[
            "--memory-max",
            "8M",
            "--backing",
            "redis://127.0.0.1:1",
            "--",
            "true",
        ],
        "cannot reach the Redis server at redis://127.0.0.1:1",
    );
}

fn threads_fill_and_verify(extra: &[&str], stats_name: &str) {
    require_uffd!();
    let Some(fill) = build("fill", &[]) else {
        return;
    };
    let stats = scratch().join(stats_name);
    let backing = backing_dir();
    // 96 MiB of heap from four threads, in 24 MiB resident, 8 MiB of pool.
    let mut args = vec![
        "--memory-max",
        "24M",
        "--pool-max",
        "8M",
        "--stats-json",
        stats.to_str().unwrap(),
    ];
    if !extra.contains(&"--backing") {
        args.extend_from_slice(&["--backing-file", &backing]);
    }
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", fill.to_str().unwrap(), "96", "4", "2"]);
    let r = run(&args);
    assert_eq!(r.code, Some(0), "fill reported bad data or failed");
    assert!(r.stdout.contains(" 0 bad chunks"), "{}", r.stdout);
    assert_near_budget(&r, 24 * MIB, 8 * MIB);
    let v = final_stats(&stats);
    let n = |p: &str| v.pointer(p).and_then(|x| x.as_u64()).unwrap_or(0);
    assert!(n("/pager/evictions") > 0, "nothing was evicted: {v}");
    assert!(
        n("/cache/written_back_pages") > 0,
        "nothing reached the file"
    );
    assert_eq!(n("/pager/load_errors"), 0);
    assert!(n("/pager/peak_resident_pages") <= 24 * MIB / 4096);
    if extra.contains(&"--cpu-handlers") {
        assert!(n("/pager/cpu_handlers") > 0, "no CPU handler ran: {v}");
    }
    if extra.contains(&"--dedup") {
        assert_eq!(
            v.pointer("/config/dedup"),
            Some(&serde_json::json!(true)),
            "{v}"
        );
    }
    if let Some(i) = extra.iter().position(|a| *a == "--compressor") {
        let c = v.pointer("/config/compressor").and_then(|c| c.as_str());
        assert_eq!(c, Some(extra[i + 1]), "{v}");
    }
    if let Some(i) = extra.iter().position(|a| *a == "--cold-compressor") {
        let c = v
            .pointer("/config/cold_compressor")
            .and_then(|c| c.as_str());
        assert_eq!(c, Some(extra[i + 1]), "{v}");
        assert!(n("/cache/cold_stores") > 0, "no page was stored cold: {v}");
    } else {
        assert_eq!(n("/cache/cold_stores"), 0, "{v}");
    }
    // The run's CPU time: the program's, and within it uzswap's threads'
    // (which compressed 96 MiB at the least), measured apart.
    let f = |p: &str| v.pointer(p).and_then(|x| x.as_f64()).unwrap_or(0.0);
    let (cpu, ours) = (f("/tree/cpu_seconds"), f("/tree/runtime_cpu_seconds"));
    assert!(
        ours > 0.0 && ours < cpu,
        "CPU {cpu} s, uzswap's {ours} s: {v}"
    );
    assert!(
        r.stderr.contains("uzswap: CPU time: the program "),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("exited with status 0"), "{}", r.stderr);
    // Where pages went, by the tier's own name, and what a remote tier
    // cost (a file's traffic is the cache's own counters).
    let written = n("/cache/written_back_pages");
    if extra.contains(&"--backing") {
        assert!(
            r.stderr.contains("written back to the remote tier")
                && r.stderr.contains("uzswap: the remote tier: "),
            "{}",
            r.stderr
        );
        assert!(n("/cache/tier_round_trips") > 0, "{v}");
        assert!(n("/cache/tier_bytes_sent") >= written * 4096, "{v}");
        assert!(n("/cache/tier_connects") > 0, "{v}");
        assert_eq!(n("/cache/tier_missing"), 0, "{v}");
    } else {
        assert!(
            r.stderr.contains("written back to the backing file"),
            "{}",
            r.stderr
        );
        assert_eq!(n("/cache/tier_round_trips"), 0, "{v}");
    }
}

#[test]
fn mappings_the_program_discards_read_as_zeros() {
    require_uffd!();
    let Some(maps) = build("maps", &[]) else {
        return;
    };
    // Two 32 MiB mappings per round (then grown to 64 MiB), in 8 MiB.
    let r = run(&[
        "--memory-max",
        "8M",
        "--pool-max",
        "8M",
        "--backing-file",
        &backing_dir(),
        "--",
        maps.to_str().unwrap(),
        "32",
        "2",
    ]);
    assert_eq!(r.code, Some(0));
    assert!(r.stdout.contains(" 0 bad pages"), "{}", r.stdout);
    assert_near_budget(&r, 8 * MIB, 8 * MIB);
}

/// The same with the access signal (`--access-signal`): the managed
/// memory is cut into chunk mappings, the program's `mmap`, `munmap`,
/// `mremap` (grown in place or moved, across chunk edges) and
/// `MADV_DONTNEED` keep every page, and the statistics say the signal was
/// in force and looked.
#[test]
fn mappings_keep_their_pages_with_the_access_signal() {
    require_uffd!();
    let Some(maps) = build("maps", &[]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.json");
    let r = run(&[
        "--memory-max",
        "8M",
        "--pool-max",
        "8M",
        "--backing-file",
        &backing_dir(),
        "--access-signal",
        "--stats-json",
        stats.to_str().unwrap(),
        "--",
        maps.to_str().unwrap(),
        "32",
        "4",
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains(" 0 bad pages"), "{}", r.stdout);
    assert_near_budget(&r, 8 * MIB, 8 * MIB);
    let v = final_stats(&stats);
    assert_eq!(v["pager"]["access_signal"], "chunks", "{v}");
    assert!(v["pager"]["access_chunks"].as_u64() > Some(100), "{v}");
    assert!(v["pager"]["access_samples"].as_u64() > Some(0), "{v}");
    assert_eq!(v["config"]["access_signal"], true, "{v}");
}

/// `calloc` under a tight budget: blocks of 4 KiB to 2 MiB, most reusing
/// memory the program wrote and uzswap evicted, each checked all zeros,
/// filled and checked again; then 64 blocks of 1 MiB that reuse written
/// memory, one byte written in each, hold only the pages written (zeros
/// written over all of them would make 15 MiB resident).
#[test]
fn calloc_reads_zeros_and_holds_only_what_is_touched() {
    require_uffd!();
    let Some(callocs) = build("callocs", &[]) else {
        return;
    };
    let r = run(&[
        "--memory-max",
        "16M",
        "--",
        callocs.to_str().unwrap(),
        "600",
        "24",
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let rss_kib: u64 = r
        .stdout
        .strip_prefix("ok 600 rss_anon_kib=")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no verdict: {}", r.stdout));
    assert!(
        rss_kib < 8 << 10,
        "64 MiB of calloc'd blocks, 64 pages written, hold {rss_kib} KiB"
    );
}

#[test]
fn forked_and_execed_children_see_their_data_and_the_status_passes_through() {
    forked_and_execed(&[]);
}

/// The same with a fault handler on each CPU: the fork hook brings pages
/// back while they run, and the child (which has none of the parent's
/// threads) never needs them.
#[test]
fn forked_and_execed_children_with_cpu_handlers() {
    forked_and_execed(&["--cpu-handlers"]);
}

/// The same with a Redis server as the backing tier: each managed child
/// copies the parent's keys into a namespace of its own
/// (`fork_private`); every process deletes its own at exit.
#[test]
fn forked_and_execed_with_a_redis_backing_tier() {
    require_uffd!();
    let Some(srv) = uzswap_remote::testing::Server::start() else {
        return;
    };
    forked_and_execed(&["--backing", &srv.url()]);
    assert_eq!(srv.dbsize(), 0, "keys were left on the server");
}

fn forked_and_execed(extra: &[&str]) {
    require_uffd!();
    let Some(prog) = build("forkexec", &[]) else {
        return;
    };
    // The parent's 32 MiB is mostly evicted when it forks; each child
    // checks the copy it inherited, writes it, then execs a fresh image
    // (managed again, with its own budget) that fills 32 MiB more.
    let mut args = vec!["--memory-max", "8M", "--pool-max", "16M"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", prog.to_str().unwrap(), "32", "3", "7"]);
    let r = run(&args);
    assert_eq!(r.code, Some(7), "the program's status must come through");
    assert!(r.stdout.contains(" 0 bad"), "{}", r.stdout);
    assert!(r.processes >= 2, "no child process was seen");
    assert!(r.stderr.contains("exited with status 7"), "{}", r.stderr);
}

#[test]
fn a_python_script_checks_what_it_built() {
    require_uffd!();
    if common::missing("python3", &["python3", "-c", "pass"]) {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/build.py");
    // About 90 MiB resident unmanaged (measured: 32 "MiB" of records);
    // 20 MiB is under a quarter.
    let r = run(&[
        "--memory-max",
        "20M",
        "--pool-max",
        "16M",
        "--backing-file",
        &backing_dir(),
        "--",
        "python3",
        script.to_str().unwrap(),
        "32",
        "2",
    ]);
    assert_eq!(r.code, Some(0));
    assert!(r.stdout.contains(" 0 bad"), "{}", r.stdout);
    assert_near_budget(&r, 20 * MIB, 16 * MIB);
}

/// A managed child that closes every descriptor but its own before it
/// execs (Python's `subprocess` with a `preexec_fn`: `fork`, then
/// `close_range(3, ~0)`) keeps the runtime's: before, its handler thread
/// died on EBADF (a panic on stderr in every child) and, when the child
/// reached the runtime before its exec, took the child with it (SIGSEGV).
/// The parent's records, evicted under the budget, check out afterwards.
#[test]
fn a_child_that_closes_every_descriptor_before_exec_runs() {
    require_uffd!();
    if common::missing("python3", &["python3", "-c", "pass"]) {
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/closefds.py");
    // 40 MiB of records: the parent holds far more than the 8 MiB below
    // which its children would run unmanaged.
    let r = run(&[
        "--memory-max",
        "32M",
        "--",
        "python3",
        script.to_str().unwrap(),
        "40",
        "10",
    ]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("closefds: ok 10"), "{}", r.stdout);
    // Each child's handler used to die before the child's exec.
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
}

#[test]
fn death_by_signal_is_reported_as_128_plus_the_signal() {
    require_uffd!();
    let r = run(&["--memory-max", "8M", "--", "sh", "-c", "kill -TERM $$"]);
    assert_eq!(r.code, Some(128 + 15));
    assert!(r.stderr.contains("killed by signal 15"), "{}", r.stderr);
}

/// Runs `uzswap run` expecting a refusal before the program starts: exit
/// status 125 and a message containing `says`.
fn refused(args: &[&str], says: &str) {
    let out = uzswap().arg("run").args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains(says), "expected {says:?} in: {err}");
}

/// A codec the cache does not have is refused as a usage error that names
/// the flag and the choices, before anything runs.
#[test]
fn a_bad_cold_compressor_is_a_usage_error() {
    let out = uzswap()
        .args(["run", "--memory-max", "8M", "--cold-compressor", "zstd:99"])
        .args(["--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--cold-compressor"), "{err}");
    assert!(err.contains("zstd level out of range"), "{err}");
}

/// A `--preload-lib` (or `UZSWAP_PRELOAD_LIB`) naming no file is
/// refused before anything runs, naming the file and the remedy.
#[test]
fn a_missing_preload_library_is_refused_with_the_remedy() {
    let missing = scratch().join("no-such-libuzswap_preload.so");
    let missing = missing.to_str().unwrap();
    for (flag, var) in [(Some(missing), None), (None, Some(missing))] {
        let mut cmd = uzswap();
        cmd.args(["run", "--memory-max", "8M"]);
        cmd.env_remove(uzswap_contract::names::PRELOAD_LIB);
        if let Some(f) = flag {
            cmd.args(["--preload-lib", f]);
        }
        if let Some(v) = var {
            cmd.env(uzswap_contract::names::PRELOAD_LIB, v);
        }
        let out = cmd.args(["--", "true"]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{err}");
        assert!(
            err.contains(&format!("preload library {missing} not found")),
            "{err}"
        );
        assert!(err.contains("leave both out"), "{err}");
    }
}

/// One binary: the `uzswap` file alone in an empty directory (no
/// library beside it, none named) runs a program managed, the runtime it
/// carries preloaded from `uzswap run`'s memory file. The program checks
/// its 96 MiB of distinct pages in a 32 MiB budget; the statistics show
/// they were evicted and stored.
#[test]
fn the_one_binary_alone_in_an_empty_directory_manages_a_program() {
    require_uffd!();
    if common::missing("python3", &["python3", "-c", "pass"]) {
        return;
    }
    let dir = scratch().join("one-binary");
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("uzswap");
    std::fs::copy(env!("CARGO_BIN_EXE_uzswap"), &exe).unwrap();
    let stats = dir.join("stats.json");
    // 96 buffers of 1 MiB, every page of its own content; each checked
    // after all were made.
    let script = r#"
import hashlib, os
def page(i, p):
    return hashlib.sha256(b"%d.%d" % (i, p)).digest() * 128
bufs = [bytearray(b"".join(page(i, p) for p in range(256))) for i in range(96)]
bad = sum(bufs[i][p * 4096:(p + 1) * 4096] != page(i, p) for i in range(96) for p in range(256))
print("LD_PRELOAD=" + os.environ.get("LD_PRELOAD", ""))
print("%d bad" % bad)
"#;
    let mut cmd = Command::new(&exe);
    cmd.current_dir(&dir)
        .env_remove(uzswap_contract::names::PRELOAD_LIB)
        .args(["run", "--memory-max", "32M", "--backing-file"])
        .arg(&dir)
        .arg("--stats-json")
        .arg(&stats)
        .args(["--", "python3", "-c", script]);
    let f = run_sampling(cmd, Duration::from_millis(100), |_| {}, |_, _| {});
    eprintln!("--- stdout\n{}--- stderr\n{}---", f.stdout, f.stderr);
    assert_eq!(f.code, Some(0));
    assert!(f.stdout.contains("\n0 bad"), "{}", f.stdout);
    // The carried copy, by `uzswap run`'s descriptor, not a file.
    assert!(f.stdout.contains("LD_PRELOAD=/proc/"), "{}", f.stdout);
    assert!(!f.stderr.contains("cannot be preloaded"), "{}", f.stderr);
    let v = final_stats(&stats);
    let evictions = v["pager"]["evictions"].as_u64().unwrap();
    // At least the 64 MiB over the budget left memory, less a margin.
    assert!(evictions >= 12288, "{evictions} evictions: {v}");
    let stored = v["cache"]["stored_pages"].as_u64().unwrap();
    assert!(stored > 0, "nothing stored at exit: {v}");
    // The copy is the size of the binary (about 100 MiB with its debug
    // information): not left in $TMPDIR after every run of the suite.
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Waits until `uzswap run` (the parent of the `sh -c` that started it)
/// is gone, then execs `echo`: a fixed sleep was not always long enough
/// on a loaded machine.
const AFTER_THE_RUN: &str =
    "while kill -0 $PPID 2>/dev/null; do sleep 0.1; done; exec /bin/echo left behind";

/// Runs `sh -c '(LATER) >OUT 2>&1 &'` under `uzswap run` with `extra`
/// arguments: `LATER` runs on after the run ended. Returns what it printed
/// once it printed "left behind" (or after 20 s).
fn left_behind(name: &str, extra: &[&str], later: &str) -> String {
    let dir = scratch().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("out");
    let script = format!("({later}) >{} 2>&1 </dev/null &", out.display());
    let ran = uzswap()
        .env_remove(uzswap_contract::names::PRELOAD_LIB)
        .args(["run", "-q", "--memory-max", "16M"])
        .args(extra)
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_eq!(ran.status.code(), Some(0), "{ran:?}");
    let mut text = String::new();
    for _ in 0..200 {
        text = std::fs::read_to_string(&out).unwrap_or_default();
        if text.contains("left behind") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    text
}

/// A process the program leaves behind that execs after `uzswap run`
/// ended cannot open the carried runtime (it was `uzswap run`'s
/// descriptor): the loader says so and the program runs unmanaged, and
/// nothing worse happens. (`sleep` may exec as the run ends, load the
/// runtime and find the ledger gone: it runs unmanaged too.)
#[test]
fn a_process_left_behind_runs_unmanaged_after_uzswap_run_ended() {
    require_uffd!();
    let text = left_behind("left-behind", &[], AFTER_THE_RUN);
    assert!(text.contains("left behind\n"), "{text:?}");
    assert!(text.contains("cannot be preloaded"), "{text:?}");
    assert!(!text.contains("uzswap: cannot start"), "{text:?}");
}

/// A left-behind process that execs after `uzswap run` ended with the
/// runtime still loadable (a `--preload-lib` file outlives the run; the
/// carried copy can be opened just before the run ends) cannot join the
/// gone ledger: it says so and runs unmanaged, and is not stopped (it
/// ended with status 125 and never ran before).
#[test]
fn a_left_behind_exec_with_a_library_file_runs_unmanaged() {
    require_uffd!();
    // The file the binary carries (build.rs), named as a user would.
    let lib = env!("UZSWAP_PRELOAD_EMBED");
    let text = left_behind("left-behind-file", &["--preload-lib", lib], AFTER_THE_RUN);
    assert!(text.contains("left behind\n"), "{text:?}");
    assert!(text.contains("has ended"), "{text:?}");
    assert!(text.contains("runs unmanaged"), "{text:?}");
    assert!(!text.contains("cannot start"), "{text:?}");
}

#[test]
fn programs_that_cannot_be_managed_are_refused_before_they_start() {
    // These checks come before userfaultfd is needed.
    refused(
        &["--memory-max", "8M", "--", "/no/such/program"],
        "no such file",
    );
    refused(
        &["--memory-max", "8M", "--", "no-such-program-anywhere"],
        "not found in PATH",
    );
    let text = scratch().join("not-executable");
    std::fs::write(&text, "hello").unwrap();
    refused(
        &["--memory-max", "8M", "--", text.to_str().unwrap()],
        "not executable",
    );
    refused(&["--memory-max", "1K", "--", "true"], "at least 64K");
    refused(
        &[
            "--memory-max",
            "8M",
            "--backing-file",
            "/no/such/dir/file",
            "--",
            "true",
        ],
        "does not exist",
    );
    let Some(prog) = build("fill", &[]) else {
        return;
    };
    // A set-uid copy: the dynamic loader would ignore LD_PRELOAD.
    let suid = scratch().join("fill-suid");
    std::fs::copy(&prog, &suid).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    refused(
        &[
            "--memory-max",
            "8M",
            "--",
            suid.to_str().unwrap(),
            "1",
            "1",
            "1",
        ],
        "setuid",
    );
    // A static binary has no dynamic loader to preload into.
    if let Some(stat) = build("fill", &["-static"]) {
        refused(
            &[
                "--memory-max",
                "8M",
                "--",
                stat.to_str().unwrap(),
                "1",
                "1",
                "1",
            ],
            "statically linked",
        );
    }
}

#[test]
fn live_statistics_of_a_running_program() {
    require_uffd!();
    let Some(fill) = build("fill", &[]) else {
        return;
    };
    // A long enough run to be asked while it works.
    let mut child = uzswap()
        .args([
            "run",
            "-q",
            "--memory-max",
            "16M",
            "--pool-max",
            "64M",
            "--",
        ])
        .arg(&fill)
        .args(["64", "2", "40"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let ask = |extra: &[&str]| uzswap().args(["stats", &pid]).args(extra).output().unwrap();
    // The runtime needs a moment to open its socket, and the program to
    // fill its budget so that the pool holds something.
    let mut json = None;
    for _ in 0..800 {
        let o = ask(&["--json"]);
        let stored = serde_json::from_slice::<serde_json::Value>(&o.stdout)
            .ok()
            .and_then(|v| {
                v.pointer("/detail/cache/stored_pages")
                    .and_then(|x| x.as_u64())
            });
        if o.status.success() && stored > Some(0) {
            json = Some(o.stdout);
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let json = json.expect("uzswap stats never showed a stored page");
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(
        v.pointer("/detail/config/memory_max")
            .and_then(|x| x.as_u64()),
        Some(16 * MIB)
    );
    assert!(v.pointer("/detail/pager/resident_pages").is_some(), "{v}");
    assert!(v.pointer("/detail/pool").is_some(), "{v}");

    let text = ask(&[]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("memory max 16.0 MiB"), "{text}");
    assert!(text.contains("faults:"), "{text}");

    let prom = ask(&["--prometheus"]);
    assert!(prom.status.success());
    let prom = String::from_utf8_lossy(&prom.stdout);
    // Every sample line is `name{labels} value` with a numeric value.
    let samples: Vec<&str> = prom
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    assert!(samples.len() > 20, "{prom}");
    for l in &samples {
        let (name, value) = l.rsplit_once(' ').unwrap();
        assert!(name.starts_with("uzswap_"), "{l}");
        assert!(value.parse::<f64>().is_ok(), "{l}");
    }
    assert!(prom.contains("uzswap_pager_resident_pages{"), "{prom}");
    assert!(prom.contains("uzswap_pool_class_"), "{prom}");

    // uzswap run passes SIGTERM on to the program.
    // SAFETY: a signal to our own child process.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    // Nothing answers for a pid that is not under uzswap.
    let o = uzswap().args(["stats", "1"]).output().unwrap();
    assert!(!o.status.success());
}

#[test]
fn the_demo_runs_a_program_in_a_quarter_of_its_memory() {
    require_uffd!();
    if build("fill", &[]).is_none() {
        return; // no C compiler: the demo's workload cannot be built
    }
    let out = uzswap().args(["demo", "--mib", "48"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // The two runs side by side, every page checked right in both.
    assert!(
        stdout.contains("on its own") && stdout.contains("under uzswap run --memory-max 12M"),
        "{stdout}"
    );
    let checked = stdout
        .lines()
        .find(|l| l.starts_with("pages checked, wrong"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(checked.matches(", 0").count(), 2, "{checked}");
    let peak = stdout
        .lines()
        .find(|l| l.starts_with("the program's memory (peak)"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(peak.contains("its budget of 12.0 MiB"), "{peak}");
    // stderr is not a terminal here: the live view is whole lines, no
    // carriage returns or escapes.
    assert!(stderr.contains("--memory-max 12M"), "{stderr}");
    let live: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(" of 12 MiB ["))
        .collect();
    assert!(!live.is_empty(), "{stderr}");
    assert!(
        !stderr.contains('\r') && !stderr.contains('\x1b'),
        "{stderr:?}"
    );
}

/// The product binary carries no benchmarks: they are `uzswap-bench`.
#[test]
fn help_lists_run_stats_plot_and_demo_and_no_benchmarks() {
    let out = uzswap().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for cmd in ["demo", "run", "stats", "plot"] {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{cmd} "))),
            "{cmd} missing from:\n{help}"
        );
    }
    assert!(!help.contains("bench"), "{help}");
    assert!(!help.to_lowercase().contains("seed"), "{help}");
    let out = uzswap().args(["bench", "pool"]).output().unwrap();
    assert!(!out.status.success(), "`uzswap bench` is not a command");
}

/// A backing file that cannot be made where it is asked for (`/proc`) is
/// refused before the program starts, with its own remedy.
#[test]
fn a_backing_file_that_cannot_be_made_is_refused_before_the_program_starts() {
    require_uffd!();
    let out = uzswap()
        .args(["run", "--memory-max", "32M", "--backing-file", "/proc"])
        .args(["--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("--backing-file /proc: cannot make and write a backing file there"),
        "{err}"
    );
    assert!(err.contains("--no-backing-file"), "{err}");
    assert!(!err.contains("running"), "the program started: {err}");
}
