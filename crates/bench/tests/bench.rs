//! `uzswap-bench` as a user runs it: every benchmark that needs no root,
//! on 1 MiB of real pages, prints exactly one JSON object on stdout with
//! `--json`; `run` says how to get a `uzswap` binary when it has none; the
//! help lists the benchmarks and none of the internal children.
//!
//! A smoke test, not a measurement: the sizes are too small for figures.

use std::process::Command;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_uzswap-bench"))
}

/// Runs `uzswap-bench ARGS --json` and returns the one JSON object it
/// printed on stdout.
fn json(args: &[&str]) -> serde_json::Value {
    let out = bench().args(args).arg("--json").output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{args:?}: one line: {stdout}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert!(v.is_object(), "{args:?}: {v}");
    v
}

#[test]
fn benchmarks_without_root_print_one_json_object() {
    json(&[
        "pool",
        "--data",
        "text",
        "--mib",
        "1",
        "--pair-seconds",
        "0.05",
    ]);
    json(&[
        "pool",
        "--data",
        "zero",
        "--mib",
        "1",
        "--pair-seconds",
        "0.05",
        "--allocator",
        "both",
    ]);
    json(&["cache", "--data", "text", "--mib", "1"]);
    json(&[
        "cache",
        "--data",
        "zero",
        "--mib",
        "1",
        "--allocator",
        "both",
        "--dedup",
        "on",
    ]);
    json(&[
        "dedup-cost",
        "--data",
        "text",
        "--mib",
        "1",
        "--rounds",
        "1",
    ]);
    json(&[
        "admission",
        "--mib",
        "1",
        "--threads",
        "2",
        "--slow-us",
        "10",
    ]);
    json(&[
        "proactive",
        "--mib",
        "1",
        "--limit-mib",
        "1",
        "--burst",
        "32",
        "--pause-ms",
        "1",
    ]);
    json(&["seal", "--mib", "1", "--rounds", "1"]);
    // The file row always; the Redis rows where redis-server is installed.
    let v = json(&["remote", "--mib", "1", "--rounds", "1"]);
    assert!(v["tiers"][0]["load_p50_us"].as_f64().unwrap() > 0.0, "{v}");
}

#[test]
fn bench_run_without_a_uzswap_binary_says_how_to_get_one() {
    let out = bench()
        .args(["run", "--mib", "8", "--budget-mib", "4", "--skip-kernel"])
        .args(["--uzswap", "/nonexistent/uzswap"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--uzswap /nonexistent/uzswap"), "{err}");

    // A copy of the binary alone in a directory: no `uzswap` beside it.
    let dir = std::env::temp_dir().join(format!("uzswap-bench-alone-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lone = dir.join("uzswap-bench");
    std::fs::copy(env!("CARGO_BIN_EXE_uzswap-bench"), &lone).unwrap();
    let out = Command::new(&lone)
        .args(["run", "--mib", "8", "--budget-mib", "4", "--skip-kernel"])
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no uzswap binary beside this one") && err.contains("cargo build --release"),
        "{err}"
    );
}

#[test]
fn help_lists_the_benchmarks_and_hides_the_children() {
    let out = bench().arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for cmd in [
        "pool",
        "cache",
        "dedup-cost",
        "admission",
        "proactive",
        "seal",
        "remote",
        "usemem",
        "run",
    ] {
        assert!(
            help.lines()
                .any(|l| l.trim_start().starts_with(&format!("{cmd} "))),
            "{cmd} missing from:\n{help}"
        );
    }
    assert!(!help.contains("internal"), "{help}");
    assert!(!help.to_lowercase().contains("seed"), "{help}");
}
