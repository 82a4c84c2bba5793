//! Managed runtimes under `uzswap run`: programs whose runtime reserves its
//! heap with a `PROT_NONE` mapping and commits it with `mmap(MAP_FIXED)`
//! (HotSpot), or grows it in mappings of its own (V8), each checking its
//! own data, under a budget well below its footprint. The heap must be
//! managed (pages stored, memory near the budget), not left to the kernel
//! with nothing said.
//!
//! Skipped (`common::skip`) where the machine lacks userfaultfd or the
//! toolchain.

use crate::common::*;

/// A JVM's heap of 300 k records (135 MiB resident unmanaged, with the
/// JVM's own memory) in 80 MiB: HotSpot reserves the heap, commits it with
/// `MAP_FIXED` and uncommits it the same way; every record is checked
/// twice. A heap whose commits were not served in place would run
/// unmanaged: 282 MiB in a budget of 96 MiB with nothing managed.
#[test]
fn a_jvm_heap_is_managed() {
    require_uffd!();
    if missing("java", &["java", "-version"]) || missing("javac", &["javac", "-version"]) {
        return;
    }
    let dir = scratch("jvm");
    let src = programs().join("HashMapCheck.java");
    let built = std::process::Command::new("javac")
        .arg("-d")
        .arg(&dir)
        .arg(&src)
        .status()
        .unwrap();
    assert!(built.success(), "javac failed on {}", src.display());
    let stats = dir.join("stats.json");
    let r = run(
        &dir,
        &[
            "--memory-max",
            "80M",
            "--stats-json",
            stats.to_str().unwrap(),
            "--",
            "java",
            "-Xmx200m",
            "-XX:+UseSerialGC",
            "-cp",
            dir.to_str().unwrap(),
            "HashMapCheck",
            "300000",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.starts_with("ok 300000 "), "{}", r.stdout);
    let snap = final_stats(&stats);
    let space = &snap["space"];
    assert!(
        space["fixed_in_place"].as_u64().unwrap_or(0) > 0,
        "the heap's commits were not served in place: {space}"
    );
    let pager = &snap["pager"];
    assert!(
        pager["evictions"].as_u64().unwrap_or(0) > 10_000,
        "the heap was not evicted from: {pager}"
    );
    // The JVM's code cache (executable) and thread stacks stay the
    // kernel's: counted, never managed. The tree still holds near B.
    assert!(
        r.peak <= 80 * MIB * 3 / 2,
        "the JVM held {:.1} MiB in a budget of 80 MiB",
        r.peak as f64 / MIB as f64
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// node's V8 heap, 200 k records in a Map (156 MiB resident unmanaged) in
/// 112 MiB: managed, evicted from, every record checked twice, the tree
/// within the budget.
#[test]
fn a_node_heap_is_managed() {
    require_uffd!();
    if missing("node", &["node", "--version"]) {
        return;
    }
    let dir = scratch("node");
    let script = programs().join("mapcheck.js");
    let stats = dir.join("stats.json");
    let r = run(
        &dir,
        &[
            "--memory-max",
            "112M",
            "--stats-json",
            stats.to_str().unwrap(),
            "--",
            "node",
            script.to_str().unwrap(),
            "200000",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.starts_with("ok 200000 "), "{}", r.stdout);
    let snap = final_stats(&stats);
    let pager = &snap["pager"];
    assert!(
        pager["evictions"].as_u64().unwrap_or(0) > 1000,
        "the heap was not evicted from: {pager}"
    );
    assert_within(&r, 112 * MIB);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Builds tests/programs/gomap into `dir` with `go build FLAGS`, cgo on
/// or off; None (with a note) where the machine lacks Go or gcc.
fn build_gomap(dir: &std::path::Path, cgo: bool, flags: &[&str]) -> Option<std::path::PathBuf> {
    if missing("go", &["go", "version"]) || missing("gcc", &["gcc", "--version"]) {
        return None;
    }
    let bin = dir.join("gomap");
    let built = std::process::Command::new("go")
        .arg("build")
        .args(flags)
        .arg("-o")
        .arg(&bin)
        .arg(".")
        .current_dir(programs().join("gomap"))
        .env("CGO_ENABLED", if cgo { "1" } else { "0" })
        .env("GOFLAGS", "-mod=mod")
        .status()
        .unwrap();
    assert!(
        built.success(),
        "go build {flags:?} of tests/programs/gomap failed"
    );
    Some(bin)
}

/// Go's heap (a map of 400 k records, 55 MB resident unmanaged) in
/// 48 MiB: Go reserves its arenas `PROT_NONE` and commits them with
/// `mmap(MAP_FIXED)` through the C library; managed, evicted from, every
/// record checked twice, the tree near the budget. Go's runtime exits
/// without the C library's exit handlers, so the figures come from the
/// process's last report (`--stats-json` says why the final statistics
/// are missing).
fn go_heap_is_managed(dir: &std::path::Path, bin: &std::path::Path) {
    let stats = dir.join("stats.json");
    let r = run(
        dir,
        &[
            "--memory-max",
            "48M",
            "--stats-json",
            stats.to_str().unwrap(),
            "--",
            bin.to_str().unwrap(),
            "400000",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.starts_with("ok 400000 "), "{}", r.stdout);
    assert!(
        r.stderr.contains("uzswap: 1 process (1 at once at most): "),
        "the summary lacks the last report's figures: {}",
        r.stderr
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert!(
        v["final_statistics_missing"].is_string(),
        "a Go program ran its exit handlers? {v}"
    );
    let procs = v["tree"]["processes"]
        .as_object()
        .expect("the tree's processes");
    let evictions: u64 = procs.values().filter_map(|p| p["evictions"].as_u64()).sum();
    assert!(
        evictions > 10_000,
        "Go's heap was not evicted from: {}",
        v["tree"]
    );
    assert_within(&r, 48 * MIB);
}

/// A cgo build (the program calls into C).
#[test]
fn a_cgo_go_heap_is_managed() {
    require_uffd!();
    let dir = scratch("go");
    let Some(bin) = build_gomap(&dir, true, &[]) else {
        return;
    };
    go_heap_is_managed(&dir, &bin);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Pure Go, as most Go programs are: built as Go builds it by default it
/// is static, and refused with the build that works; built that way
/// (linked by the system's linker, `-ldflags=-linkmode=external`) it is
/// dynamic, and its heap is managed.
#[test]
fn a_pure_go_program_is_refused_static_and_managed_linked_externally() {
    require_uffd!();
    let dir = scratch("go-pure");
    let Some(stat) = build_gomap(&dir, false, &[]) else {
        return;
    };
    let r = run(
        &dir,
        &["--memory-max", "48M", "--", stat.to_str().unwrap(), "1000"],
    );
    assert_eq!(r.code, Some(125), "{}", r.stderr);
    assert!(
        r.stderr.contains("a Go program linked statically")
            && r.stderr
                .contains("CGO_ENABLED=1 go build -ldflags=-linkmode=external"),
        "the refusal does not give Go's remedy: {}",
        r.stderr
    );
    let bin = build_gomap(
        &dir,
        true,
        &["-tags", "purego", "-ldflags=-linkmode=external"],
    )
    .expect("built once already");
    go_heap_is_managed(&dir, &bin);
    std::fs::remove_dir_all(dir).unwrap();
}
