//! `uzswap stats` on a whole process tree: a `uzswap run`
//! whose program (`sh`) starts two managed children that each hold 40 MiB
//! (`tests/programs/hold.c`) in a budget of 64 MiB for the three of them,
//! asked about by the run's pid and by a child's, as text, JSON and
//! Prometheus; two trees told apart; and the pids that are refused.
//!
//! Skipped (`common::skip`) where the machine cannot run them: no
//! userfaultfd for this user, no C compiler. Every process a test starts
//! is killed when it ends, passed or failed.

use crate::common::{end_run, uzswap, MIB};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Why the trees cannot run here, if they cannot: no userfaultfd, or no
/// C compiler to build the children. Otherwise the built `hold`.
fn hold() -> Result<&'static Path, String> {
    static HOLD: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    HOLD.get_or_init(|| {
        uzswap_region::sys::Uffd::open(0, None)
            .map_err(|e| format!("userfaultfd unavailable: {e}"))?;
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/hold.c");
        // Named `hold`: the command name the ledger rows show.
        let dir = std::env::temp_dir().join(format!("uzswap-stats-tree-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
        let out = dir.join("hold");
        let o = Command::new("cc")
            .args(["-O2", "-o"])
            .arg(&out)
            .arg(&src)
            .output()
            .map_err(|e| format!("no C compiler (cc): {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "cc hold.c failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        Ok(out)
    })
    .as_deref()
    .map_err(Clone::clone)
}

/// `let $hold` = the built `hold`, with the test's place beside other
/// trees (`common::beside_others`) held to its end; or returns from the
/// test through `common::skip`.
macro_rules! require_hold {
    ($hold:ident) => {
        let _beside = $crate::common::beside_others();
        let $hold = match hold() {
            Ok(h) => h,
            Err(why) => {
                $crate::common::skip(&why);
                return;
            }
        };
    };
}

/// A `uzswap run` of `sh` starting two `hold` children; killed, with all
/// its descendants, when dropped.
struct Tree {
    run: Child,
    /// The two children, once both are in the ledger.
    children: Vec<u32>,
}

impl Tree {
    /// Starts the tree and waits until both children have joined its
    /// ledger and answer on their sockets.
    fn start(hold: &Path) -> Tree {
        let h = hold.display();
        let run = uzswap()
            .args(["run", "-q", "--memory-max", "64M", "--", "sh", "-c"])
            .arg(format!("{h} 40 120 & {h} 40 120 & wait"))
            .stdout(Stdio::null())
            .spawn()
            .expect("start uzswap run");
        let mut t = Tree {
            run,
            children: Vec::new(),
        };
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(60) {
            let o = stats(&[&t.pid().to_string(), "--json"]);
            if let Ok(v) = serde_json::from_slice::<Value>(&o.stdout) {
                let holders: Vec<u32> = rows(&v)
                    .iter()
                    .filter(|r| r["comm"] == "hold" && r["faults"].as_u64() > Some(0))
                    .filter_map(|r| r["pid"].as_u64().map(|p| p as u32))
                    .collect();
                if holders.len() >= 2 && holders.iter().all(|&p| answers(p)) {
                    t.children = holders;
                    return t;
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "the two children never showed in `uzswap stats {}`",
            t.pid()
        );
    }

    /// The pid of `uzswap run`.
    fn pid(&self) -> u32 {
        self.run.id()
    }
}

impl Drop for Tree {
    fn drop(&mut self) {
        end_run(&mut self.run);
    }
}

/// Whether `pid` serves its statistics.
fn answers(pid: u32) -> bool {
    let o = stats(&[&pid.to_string(), "--json"]);
    o.status.success()
        && serde_json::from_slice::<Value>(&o.stdout).is_ok_and(|v| v["detail"].is_object())
}

fn stats(args: &[&str]) -> Output {
    uzswap().arg("stats").args(args).output().unwrap()
}

/// `uzswap stats ARGS`, which must succeed; its stdout.
fn ok(args: &[&str]) -> String {
    let o = stats(args);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "uzswap stats {args:?}: {out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

fn rows(v: &Value) -> Vec<Value> {
    v["processes"].as_array().cloned().unwrap_or_default()
}

#[test]
fn a_tree_is_shown_from_its_run_pid_and_from_a_child() {
    require_hold!(hold);
    let t = Tree::start(hold);
    let run = t.pid().to_string();
    let child = t.children[0].to_string();

    // Text, from the run's pid: every process, the totals, the program's
    // detail.
    let text = ok(&[&run]);
    assert!(text.contains(&format!("uzswap run {run}:")), "{text}");
    assert!(text.contains("of a budget of 64.0 MiB"), "{text}");
    for c in &t.children {
        assert!(text.contains(&format!(" {c} hold ")), "{text}");
    }
    assert!(text.contains("   total "), "{text}");
    let program = uzswap_ledger::proc_sample::children(t.pid())[0];
    assert!(
        text.contains(&format!("* pid {program} in detail:")),
        "{text}"
    );
    assert!(text.contains("faults:"), "{text}");
    // From a child: the same tree, that child in detail; --brief without.
    let text = ok(&[&child]);
    assert!(text.contains(&format!("uzswap run {run}:")), "{text}");
    assert!(
        text.contains(&format!("* pid {child} in detail:")),
        "{text}"
    );
    assert!(text.contains("memory max 64.0 MiB"), "{text}");
    let brief = ok(&[&child, "--brief"]);
    assert!(brief.contains(&format!("uzswap run {run}:")), "{brief}");
    assert!(!brief.contains("in detail"), "{brief}");

    // JSON: the totals are the sums of the rows, the detail the child's.
    let v: Value = serde_json::from_str(&ok(&[&child, "--json"])).unwrap();
    assert_eq!(v["run_pid"].as_u64(), Some(t.pid().into()), "{v}");
    assert_eq!(v["budget_bytes"].as_u64(), Some(64 * MIB), "{v}");
    let rs = rows(&v);
    assert!(rs.len() >= 3, "sh and two children: {v}");
    let totals = &v["totals"];
    assert_eq!(totals["processes"].as_u64(), Some(rs.len() as u64));
    for field in [
        "resident_bytes",
        "pool_bytes",
        "runtime_bytes",
        "own_bytes",
        "backing_bytes",
        "faults",
        "evictions",
        "stored_pages",
    ] {
        let sum: u64 = rs.iter().map(|r| r[field].as_u64().unwrap()).sum();
        assert_eq!(totals[field].as_u64(), Some(sum), "{field}: {v}");
    }
    // uzswap's own heap is part of what a process holds beside its managed
    // pages and pool, and every runtime that has reported has one.
    for r in &rs {
        let (own, runtime) = (
            r["own_bytes"].as_u64().unwrap(),
            r["runtime_bytes"].as_u64().unwrap(),
        );
        assert!(own <= runtime && (runtime == 0 || own > 0), "{r}");
    }
    let allot: u64 = rs.iter().filter_map(|r| r["allot_bytes"].as_u64()).sum();
    assert_eq!(totals["allot_bytes"].as_u64(), Some(allot), "{v}");
    let memory = ["resident_bytes", "pool_bytes", "runtime_bytes"]
        .iter()
        .map(|f| totals[*f].as_u64().unwrap())
        .sum::<u64>();
    assert_eq!(v["total_bytes"].as_u64(), Some(memory), "{v}");
    assert_eq!(
        v["detail"]["pid"].as_u64(),
        Some(t.children[0].into()),
        "{v}"
    );
    assert_eq!(
        v.pointer("/detail/config/memory_max")
            .and_then(Value::as_u64),
        Some(64 * MIB)
    );
    // The children hold 80 MiB between them in a budget of 64: pages
    // were evicted.
    assert!(totals["evictions"].as_u64() > Some(0), "{v}");

    check_exposition(&ok(&[&run, "--prometheus"]), &t);
}

/// Checks a Prometheus exposition of tree `t`: a HELP and a TYPE line
/// before every family's samples, names as the conventions have them
/// (base units, counters and only they ending in `_total`, summaries'
/// `_sum` and `_count` in their family), a pid label on every process's
/// sample, every child's rows and detail.
fn check_exposition(prom: &str, t: &Tree) {
    let run = t.pid().to_string();
    let mut typed: Vec<String> = Vec::new();
    let mut kinds: Vec<&str> = Vec::new();
    let mut helped: Vec<String> = Vec::new();
    let mut samples = 0;
    for l in prom.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(["gauge", "counter", "summary"].contains(&kind), "{l}");
            assert!(!typed.contains(&name.to_owned()), "two TYPE lines: {l}");
            assert!(
                helped.last().map(String::as_str) == Some(name),
                "no HELP before {l}"
            );
            typed.push(name.to_owned());
            kinds.push(kind);
            continue;
        }
        if let Some(rest) = l.strip_prefix("# HELP ") {
            helped.push(rest.split(' ').next().unwrap().to_owned());
            continue;
        }
        let (series, value) = l.rsplit_once(' ').unwrap();
        let (name, labels) = series.split_once('{').unwrap();
        assert!(value.parse::<f64>().is_ok(), "{l}");
        // A summary's samples: NAME{quantile}, NAME_sum, NAME_count.
        let name = match kinds.last() {
            Some(&"summary") => {
                let family = typed.last().unwrap().as_str();
                assert!(
                    labels.contains("quantile=\"") && name == family
                        || [format!("{family}_sum"), format!("{family}_count")]
                            .contains(&name.to_owned()),
                    "{l}"
                );
                assert!(family.ends_with("_seconds"), "{l}");
                family
            }
            _ => name,
        };
        assert_eq!(
            typed.last().map(String::as_str),
            Some(name),
            "sample out of its family: {l}"
        );
        check_name(l, name, labels, kinds.last().copied());
        samples += 1;
    }
    assert!(samples > 50, "{prom}");
    assert!(
        prom.contains(&format!(
            "uzswap_tree_budget_bytes{{run_pid=\"{run}\"}} {}",
            64 * MIB
        )),
        "{prom}"
    );
    assert!(prom.contains("\nuzswap_tree_memory_bytes{"), "{prom}");
    for c in &t.children {
        assert!(
            prom.contains(&format!(
                "uzswap_process_resident_bytes{{pid=\"{c}\",comm=\"hold\""
            )),
            "{prom}"
        );
        assert!(
            prom.contains(&format!("uzswap_process_faults_total{{pid=\"{c}\",")),
            "{prom}"
        );
        // Each child's own detail, labelled with its pid; its fault
        // latency a summary.
        assert!(
            prom.contains(&format!("uzswap_pager_resident_pages{{pid=\"{c}\"}}")),
            "{prom}"
        );
        assert!(
            prom.contains(&format!(
                "uzswap_pager_fault_latency_seconds{{pid=\"{c}\",quantile=\"0.5\"}}"
            )),
            "{prom}"
        );
    }
}

/// The name and labels of one sample `l` of a family of type `kind`: as
/// the conventions have them, a process's sample labelled with its pid.
fn check_name(l: &str, name: &str, labels: &str, kind: Option<&str>) {
    assert!(name.starts_with("uzswap_"), "{l}");
    assert!(
        name.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
        "{l}"
    );
    if name.starts_with("uzswap_process_") {
        // ^uzswap_[a-z_]+(_bytes|_total)?$, and the process named.
        assert!(
            name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
            "{l}"
        );
        assert!(labels.starts_with("pid=\""), "{l}");
        assert!(labels.contains("comm=\""), "{l}");
    } else if !name.starts_with("uzswap_tree_") {
        assert!(labels.starts_with("pid=\""), "{l}");
    }
    // Counters, and only they, end in _total.
    assert_eq!(name.ends_with("_total"), kind == Some("counter"), "{l}");
}

/// The URL a `--serve` or `--metrics` process says it serves, from its
/// stderr, and the rest of that stderr.
fn served_url(p: &mut Child) -> (String, std::io::BufReader<std::process::ChildStderr>) {
    use std::io::BufRead;
    let mut err = std::io::BufReader::new(p.stderr.take().expect("stderr piped"));
    let mut said = String::new();
    loop {
        let mut line = String::new();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "ended without saying where it serves: {said}"
        );
        said += &line;
        if let Some(i) = line.find("http://") {
            let url = line[i..].split([';', ' ', '\n']).next().unwrap();
            return (url.to_owned(), err);
        }
    }
}

/// An HTTP GET: the status, the content type, the body.
fn get(url: &str) -> (u16, String, String) {
    let mut r = ureq::get(url)
        .config()
        .http_status_as_error(false)
        .build()
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let kind = r
        .headers()
        .get("content-type")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = r.body_mut().read_to_string().unwrap();
    (r.status().as_u16(), kind, body)
}

#[test]
fn the_metrics_are_served_over_http_until_the_run_exits() {
    require_hold!(hold);
    let t = Tree::start(hold);
    let mut serve = uzswap()
        .args([
            "stats",
            &t.children[0].to_string(),
            "--serve",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (url, mut err) = served_url(&mut serve);
    assert!(url.ends_with("/metrics"), "{url}");
    // Scraped twice: each scrape reads the tree afresh.
    for _ in 0..2 {
        let (code, kind, body) = get(&url);
        assert_eq!(code, 200, "{body}");
        assert!(kind.starts_with("text/plain; version=0.0.4"), "{kind}");
        check_exposition(&body, &t);
    }
    let (code, _, body) = get(&url.replace("/metrics", "/nothing"));
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("/metrics"), "{body}");

    // The run ends: the endpoint closes and says why.
    drop(t);
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = serve.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "--serve outlived its run"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert!(rest.contains("has exited"), "{rest}");
}

#[test]
fn uzswap_run_serves_its_own_metrics() {
    require_hold!(hold);
    let mut run = uzswap()
        .args([
            "run",
            "--memory-max",
            "32M",
            "--metrics",
            "127.0.0.1:0",
            "--",
        ])
        .arg(hold)
        .args(["40", "120"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (url, _err) = served_url(&mut run);
    // Until the program has stored pages, as a scraper would poll.
    let t0 = Instant::now();
    let body = loop {
        let (code, _, body) = get(&url);
        assert_eq!(code, 200, "{body}");
        if body
            .lines()
            .any(|l| l.starts_with("uzswap_process_evictions_total{") && !l.ends_with(" 0"))
        {
            break body;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{body}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        body.contains(&format!(
            "uzswap_tree_budget_bytes{{run_pid=\"{}\"}} {}",
            run.id(),
            32 * MIB
        )),
        "{body}"
    );
    end_run(&mut run);
}

#[test]
fn a_bad_serve_address_is_refused_with_the_form_to_give() {
    require_hold!(hold);
    let t = Tree::start(hold);
    let o = stats(&[&t.pid().to_string(), "--serve", "no-port-here"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("HOST:PORT"), "{err}");
    // A port another endpoint holds.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    let o = stats(&[&t.pid().to_string(), "--serve", &addr]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("cannot listen on"), "{err}");
    assert!(err.contains("pick a free port"), "{err}");
}

#[test]
fn a_child_of_one_tree_is_shown_in_its_tree_and_not_another() {
    require_hold!(hold);
    let a = Tree::start(hold);
    let b = Tree::start(hold);
    for (t, other) in [(&a, &b), (&b, &a)] {
        for c in &t.children {
            let v: Value =
                serde_json::from_str(&ok(&[&c.to_string(), "--json", "--brief"])).unwrap();
            assert_eq!(v["run_pid"].as_u64(), Some(t.pid().into()), "{v}");
            let pids: Vec<u64> = rows(&v).iter().filter_map(|r| r["pid"].as_u64()).collect();
            assert!(pids.contains(&u64::from(*c)), "{v}");
            for o in &other.children {
                assert!(
                    !pids.contains(&u64::from(*o)),
                    "tree {} shows {o} of the other: {v}",
                    t.pid()
                );
            }
        }
        let text = ok(&[&t.pid().to_string(), "--brief"]);
        assert!(text.contains(&format!("uzswap run {}:", t.pid())), "{text}");
        assert!(
            !text.contains(&format!("uzswap run {}:", other.pid())),
            "{text}"
        );
    }
}

/// A refusal: fails, and the message says what to give instead.
fn refused(pid: &str, says: &str) {
    let o = stats(&[pid]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "uzswap stats {pid} succeeded");
    assert!(err.contains(says), "uzswap stats {pid}: {err}");
    assert!(err.contains("give the pid `uzswap run` printed"), "{err}");
}

#[test]
fn pids_outside_any_tree_are_refused_with_what_to_give_instead() {
    // init, and this test itself: not under uzswap.
    refused("1", "pid 1 is not under `uzswap run`");
    let me = std::process::id().to_string();
    refused(&me, &format!("pid {me} is not under `uzswap run`"));
    // Above the largest pid the kernel gives: no such process.
    let max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 22);
    let none = (max + 1).to_string();
    refused(&none, &format!("no process {none} exists"));
}
