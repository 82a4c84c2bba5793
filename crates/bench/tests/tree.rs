//! `uzswap-bench tree` on a tiny build (its first 2 translation units, at
//! -j1, only the unconstrained and uzswap sides): one JSON object with its
//! keys, and objects byte-identical to the unconstrained build's.
//!
//! Skipped ([`skip`]) where it cannot run: no userfaultfd, no gcc or
//! make, no C sources in the cargo registry, or no built `uzswap` (`cargo
//! build`, or `cargo build --release`; it carries its preload runtime).

use std::path::PathBuf;
use std::process::Command;

/// A `uzswap` binary: next to this test's `uzswap-bench`, else in the
/// release directory.
fn uzswap() -> Option<PathBuf> {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_uzswap-bench"));
    let dir = bench.parent()?;
    [dir.to_path_buf(), dir.parent()?.join("release")]
        .into_iter()
        .map(|d| d.join("uzswap"))
        .find(|u| u.is_file())
}

/// A test that cannot run here, for `why`: says so on stderr (the caller
/// then returns), or, where `UZSWAP_TEST_STRICT=1` is set (as CI does),
/// fails it.
fn skip(why: &str) {
    assert!(
        std::env::var_os("UZSWAP_TEST_STRICT").is_none_or(|v| v != "1"),
        "required for this test: {why} (UZSWAP_TEST_STRICT=1)"
    );
    eprintln!("skipped: {why}");
}

fn why_not() -> Option<String> {
    if let Err(e) = uzswap_region::sys::Uffd::open(0, None) {
        return Some(format!("userfaultfd unavailable: {e}"));
    }
    for tool in ["gcc", "make", "sha256sum"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Some(format!("no {tool}"));
        }
    }
    None
}

#[test]
fn a_tiny_build_under_uzswap_gives_identical_objects() {
    if let Some(why) = why_not() {
        skip(&why);
        return;
    }
    let Some(uzswap) = uzswap() else {
        skip("a built uzswap beside uzswap-bench: run `cargo build`");
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_uzswap-bench"))
        .args(["tree", "--workload", "build", "--jobs", "1"])
        .args(["--skip-kernel", "--budget-mib", "96", "--json"])
        .arg("--uzswap")
        .arg(&uzswap)
        .env("UZSWAP_BENCH_TREE_SOURCES", "2")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && err.contains("cargo fetch") {
        skip(&err);
        return;
    }
    assert!(out.status.success(), "{}\n{err}", out.status);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one JSON line: {stdout}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["benchmark"], "tree");
    assert_eq!(v["units"], 2);
    for key in ["sources", "machine", "targets_met", "memory_target"] {
        assert!(v.get(key).is_some(), "no {key}: {v}");
    }
    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 1);
    let c = &cases[0];
    assert_eq!(c["jobs"], 1);
    assert_eq!(c["budget_bytes"], 96 << 20);
    assert_eq!(c["outputs_identical"], true, "{c}");
    assert_eq!(c["targets"]["outputs_identical"], true);
    for side in ["unconstrained", "uzswap"] {
        for key in [
            "wall_seconds",
            "peak_memory_bytes",
            "outputs_identical",
            "oom_killed",
        ] {
            assert!(!c[side][key].is_null(), "{side} has no {key}: {c}");
        }
        assert_eq!(c[side]["outputs_identical"], true, "{side}: {c}");
    }
    for key in [
        "stats_peak_bytes",
        "over_target_samples",
        "tree_evictions",
        "tree_faults",
        "backing_out_pages",
        "backing_in_pages",
    ] {
        assert!(!c["uzswap"][key].is_null(), "uzswap has no {key}: {c}");
    }
    // Without the kernel sides there is no kernel to compare with.
    assert!(c.get("kernel").is_none() && c.get("wall_ratio_vs_kernel").is_none());
    assert!(err.contains("targets met"), "the table on stderr: {err}");
}
