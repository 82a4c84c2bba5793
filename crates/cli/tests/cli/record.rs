//! A picture of the run: `uzswap run --record FILE` on a real program
//! (Python building three times its budget of distinct bytearrays and
//! checking them), the recording read back as JSON, and `uzswap plot`'s
//! SVG parsed as XML and searched for its legend and budget. Also what is
//! refused and why: plotting what is not a recording, recording into a
//! directory that does not exist; and a recording that cannot be written
//! (/dev/full) stops, said once, while the program runs on.
//!
//! The runs are skipped (`common::skip`) without userfaultfd or python3.

use crate::common::*;
use std::path::Path;
use std::process::Command;

/// Every line of a recording as JSON.
fn lines(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).expect("the recording was written");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Every text node of an SVG, which must be well-formed XML.
fn svg_texts(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).expect("the SVG was written");
    let doc = roxmltree::Document::parse(&text).unwrap_or_else(|e| panic!("not XML: {e}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .map(|t| t.trim().to_owned())
        .collect()
}

#[test]
fn a_recorded_run_reads_back_and_plots() {
    require_uffd!();
    if missing("python3", &["python3", "-c", "pass"]) {
        return;
    }
    let dir = scratch("record");
    let rec = dir.join("run.jsonl");
    let script = programs().join("bytearrays.py");
    let r = run(
        &dir,
        &[
            "--memory-max",
            "32M",
            "--record",
            rec.to_str().unwrap(),
            "--",
            "python3",
            script.to_str().unwrap(),
            "96",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("ok 96"), "{}", r.stdout);

    check_recording(&rec);
    check_plot(&rec, &dir.join("run.svg"));
    std::fs::remove_dir_all(dir).unwrap();
}

/// The recording of `bytearrays.py 96` in 32 MiB: its header, then samples
/// whose totals add up, counters that never go back, the tree measured.
fn check_recording(rec: &Path) {
    let v = lines(rec);
    let (header, samples) = v.split_first().expect("a header");
    assert_eq!(header["kind"], "uzswap-recording", "{header}");
    assert_eq!(header["format"], 1);
    assert_eq!(header["budget_bytes"], 32 * MIB);
    assert_eq!(header["interval_ms"], 100);
    assert_eq!(header["command"][0], "python3");
    assert_eq!(header["command"][2], "96");
    assert!(samples.len() >= 5, "{} samples", samples.len());
    let t: Vec<f64> = samples.iter().map(|s| s["t"].as_f64().unwrap()).collect();
    assert!(
        t.windows(2).all(|w| w[1] > w[0]),
        "times not increasing: {t:?}"
    );
    for s in samples {
        assert_eq!(s["budget_bytes"], 32 * MIB, "{s}");
        // The totals add the live processes up.
        let ps = s["processes"].as_array().unwrap();
        let sum = |k: &str| ps.iter().map(|p| p[k].as_u64().unwrap()).sum::<u64>();
        for k in [
            "resident_bytes",
            "pool_bytes",
            "runtime_bytes",
            "backing_bytes",
        ] {
            assert_eq!(s["total"][k], sum(k), "{k}: {s}");
        }
    }
    let pooled = samples
        .iter()
        .filter(|s| s["total"]["pool_bytes"].as_u64() > Some(0))
        .count();
    assert!(pooled > 0, "no sample with a pool");
    assert!(
        samples
            .iter()
            .any(|s| s["measured_bytes"].as_u64() > Some(16 * MIB)),
        "the tree's memory was not measured"
    );
    assert!(
        samples
            .iter()
            .flat_map(|s| s["processes"].as_array().unwrap())
            .any(|p| p["comm"] == "python3" && p["pid"].as_u64() > Some(0)),
        "the python3 process is not named"
    );
    // Cumulative counters never go back.
    let evictions: Vec<u64> = samples
        .iter()
        .map(|s| s["total"]["evictions"].as_u64().unwrap())
        .collect();
    assert!(evictions.windows(2).all(|w| w[1] >= w[0]), "{evictions:?}");
    assert!(evictions.last() > Some(&0));
}

/// `uzswap plot` of the recording `rec` into `svg`: its legend, axes and
/// title.
fn check_plot(rec: &Path, svg: &Path) {
    let out = uzswap()
        .args(["plot", rec.to_str().unwrap(), "-o", svg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let texts = svg_texts(svg);
    for name in [
        "resident (program memory in RAM)",
        "compressed pool",
        "uzswap runtime",
        "measured total (Pss_Anon, held to the budget)",
        "budget 32.0 MiB",
        "written to the backing file (on disk, not memory)",
        "faults/s",
        "evictions/s",
        "seconds",
        "MiB",
    ] {
        assert!(texts.iter().any(|t| t == name), "no {name:?} in {texts:?}");
    }
    let title = texts
        .iter()
        .find(|t| t.starts_with("python3 "))
        .expect("a title");
    assert!(title.contains("budget 32.0 MiB, measured peak"), "{title}");
}

/// `uzswap plot ARGS` failed with status 1 and said `says`.
fn plot_refused(args: &[&str], says: &str) {
    let out = uzswap().arg("plot").args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(
        err.contains(says),
        "{args:?}: {err:?} does not say {says:?}"
    );
}

#[test]
fn plot_refuses_what_is_not_a_recording() {
    let dir = scratch("plot-bad");
    let path = |name: &str, body: &str| {
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let missing = dir.join("none.jsonl");
    plot_refused(&[missing.to_str().unwrap()], "cannot read the recording");
    plot_refused(&[missing.to_str().unwrap()], "No such file");
    plot_refused(&[&path("empty.jsonl", "")], "the file is empty");
    plot_refused(
        &[&path("notes.jsonl", "these are notes\n")],
        "not a uzswap recording",
    );
    plot_refused(
        &[&path("stats.json", "{\"pager\": {}}\n")],
        "not a recording's header",
    );
    let header = |format: u32| {
        format!(
            "{{\"kind\":\"uzswap-recording\",\"format\":{format},\"uzswap_version\":\"9.0.0\",\
             \"command\":[\"x\"],\"budget_bytes\":1,\"started_unix_ms\":0,\"interval_ms\":100}}\n"
        )
    };
    plot_refused(
        &[&path("newer.jsonl", &(header(99) + "{}\n"))],
        "a recording of format 99, newer than this uzswap reads (1): plot it with the uzswap \
         that recorded it (version 9.0.0)",
    );
    plot_refused(&[&path("header.jsonl", &header(1))], "has no samples");
    let ok = path("ok.jsonl", &header(1));
    plot_refused(&[&ok, "-o", "run.png"], "uzswap draws SVG only");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn recording_into_a_missing_directory_is_refused_before_the_program_starts() {
    require_uffd!();
    let dir = scratch("record-nodir");
    let marker = dir.join("started");
    let rec = dir.join("no/such/dir/run.jsonl");
    let out = uzswap()
        .args(["run", "--memory-max", "32M", "--record"])
        .arg(&rec)
        .args(["--", "sh", "-c"])
        .arg(format!("touch {}", marker.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("does not exist: make it first"), "{err}");
    assert!(!marker.exists(), "the program ran");
    let out = uzswap()
        .args(["run", "--memory-max", "32M", "--record"])
        .arg(&dir)
        .args(["--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("is a directory: name a file in it"), "{err}");
    let out = uzswap()
        .args([
            "run",
            "--memory-max",
            "32M",
            "--record-interval",
            "1s",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "--record-interval needs --record"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// A write error (/dev/full: ENOSPC on every write) is said once, with the
/// remedy, and the program runs to its end.
#[test]
fn a_recording_that_cannot_be_written_stops_and_the_program_runs_on() {
    require_uffd!();
    if !Path::new("/dev/full").exists() {
        skip("no /dev/full");
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_uzswap"))
        .args(["run", "--memory-max", "32M", "--record", "/dev/full", "--"])
        .args(["sh", "-c", "sleep 0.5; echo done"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "done\n");
    assert_eq!(
        err.matches("cannot write the recording /dev/full").count(),
        1,
        "{err}"
    );
    assert!(
        err.contains("recording stopped (the program keeps running"),
        "{err}"
    );
    assert!(err.contains("free space there"), "{err}");
}
