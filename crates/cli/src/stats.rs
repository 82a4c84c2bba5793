//! `uzswap stats PID`: the live statistics of a program under `uzswap run`,
//! read from the abstract unix socket its runtime serves
//! (`crates/preload/src/stats.rs` names it), as text, JSON or Prometheus
//! exposition format.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::io::Read;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};

/// Must match `uzswap_preload::stats::socket_name`.
fn socket_name(pid: u32) -> String {
    format!("uzswap-stats.{pid}")
}

fn fetch(pid: u32) -> std::io::Result<Value> {
    let addr = SocketAddr::from_abstract_name(socket_name(pid))?;
    let mut s = UnixStream::connect_addr(&addr)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    serde_json::from_str(&body).map_err(std::io::Error::other)
}

/// The children of `pid` (to find the program when given the pid of the
/// `uzswap run` supervisor).
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(c.split_whitespace().filter_map(|w| w.parse::<u32>().ok()));
            }
        }
    }
    out
}

/// The statistics of `pid`, or of its child if `pid` is `uzswap run`.
pub fn get(pid: u32) -> Result<Value> {
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        bail!("no process {pid}");
    }
    let first = match fetch(pid) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    for c in children(pid) {
        if let Ok(v) = fetch(c) {
            return Ok(v);
        }
    }
    Err(first).with_context(|| {
        format!(
            "process {pid} serves no uzswap statistics: it is not running under `uzswap run` \
             (nor is a child of it), or it runs as another user"
        )
    })
}

/// Prometheus text exposition: every number in the snapshot as a gauge
/// `uzswap_<path>` labelled with the pid; the per-class pool table as
/// `uzswap_pool_class_<column>{class="N"}`.
pub fn prometheus(v: &Value) -> String {
    let pid = v.get("pid").and_then(Value::as_u64).unwrap_or(0);
    let mut out = String::new();
    fn walk(prefix: &str, v: &Value, pid: u64, out: &mut String) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    if prefix == "uzswap_pool" && k == "classes" {
                        continue;
                    }
                    let name: String = format!("{prefix}_{k}")
                        .chars()
                        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                        .collect();
                    walk(&name, x, pid, out);
                }
            }
            Value::Number(n) => {
                out.push_str(&format!(
                    "# TYPE {prefix} gauge\n{prefix}{{pid=\"{pid}\"}} {n}\n"
                ));
            }
            Value::Bool(b) => {
                out.push_str(&format!(
                    "# TYPE {prefix} gauge\n{prefix}{{pid=\"{pid}\"}} {}\n",
                    *b as u8
                ));
            }
            _ => {}
        }
    }
    let mut top = v.clone();
    if let Some(o) = top.as_object_mut() {
        o.remove("pid");
        o.remove("version");
        o.remove("pool_table");
    }
    walk("uzswap", &top, pid, &mut out);
    if let Some(classes) = v.pointer("/pool/classes").and_then(Value::as_array) {
        let mut cols: Vec<&String> = Vec::new();
        if let Some(Value::Object(first)) = classes.first() {
            cols = first.keys().filter(|k| *k != "class").collect();
        }
        for col in cols {
            let name = format!("uzswap_pool_class_{col}");
            out.push_str(&format!("# TYPE {name} gauge\n"));
            for c in classes {
                if let (Some(class), Some(x)) = (c.get("class"), c.get(col.as_str())) {
                    if x.is_number() {
                        out.push_str(&format!("{name}{{pid=\"{pid}\",class=\"{class}\"}} {x}\n"));
                    }
                }
            }
        }
    }
    out
}

/// Faults by source and their latency, one line.
pub fn faults_line(v: &Value) -> String {
    let n = |p: &str| v.pointer(p).and_then(Value::as_f64).unwrap_or(0.0);
    format!(
        "faults: {} from pool, {} from backing file, {} same-filled, {} zero; latency p50 {:.1} us p99 {:.1} us",
        n("/pager/faults_pool"),
        n("/pager/faults_backing"),
        n("/pager/faults_same_filled"),
        n("/pager/faults_zero"),
        n("/pager/fault_latency/p50_us"),
        n("/pager/fault_latency/p99_us"),
    )
}

/// A readable page: the headline figures and the pool's class table.
pub fn text(v: &Value) -> String {
    let n = |p: &str| v.pointer(p).and_then(Value::as_f64).unwrap_or(0.0);
    let h = |p: &str| crate::run::human(n(p) as u64);
    let mut s = format!(
        "pid {} up {:.1} s: memory max {}, pool max {}, compressor {}\n",
        n("/pid"),
        n("/uptime_s"),
        h("/config/memory_max"),
        v.pointer("/config/pool_max")
            .and_then(Value::as_u64)
            .map_or("20% of RAM".into(), crate::run::human),
        v.pointer("/config/compressor")
            .and_then(Value::as_str)
            .unwrap_or("?"),
    );
    s += &format!(
        "resident {} pages (peak {}, budget {}); managed mappings {} (peak {})\n",
        n("/pager/resident_pages"),
        n("/pager/peak_resident_pages"),
        n("/pager/budget_pages"),
        h("/space/mapped_bytes"),
        h("/space/peak_mapped_bytes"),
    );
    s += &format!(
        "{}; evictions {} ({} moved out, the rest in {} discard calls; {} faults waited for one)\n",
        faults_line(v),
        n("/pager/evictions"),
        n("/pager/evict_moved_pages"),
        n("/pager/discard_calls"),
        n("/pager/faults_again")
    );
    s += &format!(
        "cache: stored {} pages, pool {}, written back {}, load errors {}\n",
        n("/cache/stored_pages"),
        h("/cache/pool_total_size"),
        n("/cache/written_back_pages"),
        n("/pager/load_errors"),
    );
    s += &format!(
        "runtime heap: {} in use ({} index, {} allocator metadata), {} held\n",
        h("/runtime_heap/in_use_bytes"),
        h("/cache/index_bytes"),
        h("/pool/metadata_bytes"),
        h("/runtime_heap/held_bytes"),
    );
    if let Some(t) = v.get("pool_table").and_then(Value::as_str) {
        s += t;
        if !t.ends_with('\n') {
            s.push('\n');
        }
    }
    s
}
