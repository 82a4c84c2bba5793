//! `uzswap stats PID`: the live statistics of a program under `uzswap run`,
//! read from the abstract unix socket its runtime serves
//! (`uzswap_contract::socket_name`) as a `uzswap_contract::Snapshot`, and
//! shown as text, JSON or Prometheus exposition format.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::io::Read;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use uzswap_contract::snapshot::pager_section;
use uzswap_contract::{socket_name, PoolSection, Snapshot};

/// What the runtime of `pid` answers on its socket.
fn fetch(pid: u32) -> std::io::Result<String> {
    let addr = SocketAddr::from_abstract_name(socket_name(pid))?;
    let mut s = UnixStream::connect_addr(&addr)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body)
}

/// The snapshot in the answer of `pid`'s runtime.
fn parse(pid: u32, body: &str) -> Result<Snapshot> {
    Snapshot::from_json(body.as_bytes())
        .with_context(|| format!("process {pid} answered with statistics this uzswap cannot read"))
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

/// The statistics of `pid`, or of its child if `pid` is `uzswap run`. An
/// answer that does not parse is an error, not a reason to try a child.
pub fn get(pid: u32) -> Result<Snapshot> {
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        bail!("no process {pid}");
    }
    let first = match fetch(pid) {
        Ok(body) => return parse(pid, &body),
        Err(e) => e,
    };
    for c in children(pid) {
        if let Ok(body) = fetch(c) {
            return parse(c, &body);
        }
    }
    Err(first).with_context(|| {
        format!(
            "process {pid} serves no uzswap statistics: it is not running under `uzswap run` \
             (nor is a child of it), or it runs as another user"
        )
    })
}

/// Prometheus text exposition: every number of the snapshot's sections as
/// a gauge `uzswap_<section>_<field>` labelled with the pid; the per-class
/// pool table as `uzswap_pool_class_<column>{class="N"}`.
pub fn prometheus(s: &Snapshot) -> String {
    // Every field named: one added to the schema must be placed here.
    let Snapshot {
        version: _,
        pid,
        uptime_s,
        config,
        pager,
        cache,
        space,
        runtime_heap,
        pool,
        pool_table: _,
    } = s;
    fn walk(prefix: &str, v: &Value, pid: u32, out: &mut String) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
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
    // Plain structs of numbers, strings and lists: they always serialize.
    let value = |v: Result<Value, serde_json::Error>| v.unwrap_or(Value::Null);
    // The classes have a family of their own (below).
    let pool_totals = PoolSection {
        classes: Vec::new(),
        ..pool.clone()
    };
    // In the order of the JSON's keys.
    let sections = [
        ("cache", value(serde_json::to_value(cache))),
        ("config", value(serde_json::to_value(config))),
        ("pager", value(pager_section::to_value(pager))),
        ("pool", value(serde_json::to_value(pool_totals))),
        ("runtime_heap", value(serde_json::to_value(runtime_heap))),
        ("space", value(serde_json::to_value(space))),
        ("uptime_s", Value::from(*uptime_s)),
    ];
    let mut out = String::new();
    for (name, v) in &sections {
        walk(&format!("uzswap_{name}"), v, *pid, &mut out);
    }
    // Columns as the first row has them, in its keys' order; the class
    // index is the label.
    let rows: Vec<(u32, Value)> = pool
        .classes
        .iter()
        .map(|c| (c.class, value(serde_json::to_value(c))))
        .collect();
    let mut cols: Vec<&String> = Vec::new();
    if let Some((_, Value::Object(first))) = rows.first() {
        cols = first.keys().filter(|k| *k != "class").collect();
    }
    for col in cols {
        let name = format!("uzswap_pool_class_{col}");
        out.push_str(&format!("# TYPE {name} gauge\n"));
        for (class, row) in &rows {
            if let Some(x) = row.get(col.as_str()).filter(|x| x.is_number()) {
                out.push_str(&format!("{name}{{pid=\"{pid}\",class=\"{class}\"}} {x}\n"));
            }
        }
    }
    out
}

/// Faults by source and their latency, one line.
pub fn faults_line(s: &Snapshot) -> String {
    let p = &s.pager;
    format!(
        "faults: {} from pool, {} from backing file, {} same-filled, {} zero; latency p50 {:.1} us p99 {:.1} us",
        p.faults_pool,
        p.faults_backing,
        p.faults_same_filled,
        p.faults_zero,
        p.fault_latency.p50_us,
        p.fault_latency.p99_us,
    )
}

/// A readable page: the headline figures and the pool's class table.
pub fn text(v: &Snapshot) -> String {
    use crate::run::human;
    let (pager, cache) = (&v.pager, &v.cache);
    let mut s = format!(
        "pid {} up {:.1} s: memory max {}, pool max {}, compressor {}\n",
        v.pid,
        v.uptime_s,
        human(v.config.memory_max),
        v.config.pool_max.map_or("20% of RAM".into(), human),
        v.config.compressor,
    );
    s += &format!(
        "resident {} pages (peak {}, budget {}); managed mappings {} (peak {})\n",
        pager.resident_pages,
        pager.peak_resident_pages,
        pager.budget_pages,
        human(v.space.mapped_bytes),
        human(v.space.peak_mapped_bytes),
    );
    s += &format!(
        "{}; evictions {} ({} moved out, the rest in {} discard calls; {} faults waited for one)\n",
        faults_line(v),
        pager.evictions,
        pager.evict_moved_pages,
        pager.discard_calls,
        pager.faults_again
    );
    s += &format!(
        "cache: stored {} pages, pool {}, written back {}, load errors {}\n",
        cache.stored_pages,
        human(cache.pool_total_size),
        cache.written_back_pages,
        pager.load_errors,
    );
    s += &format!(
        "runtime heap: {} in use ({} index, {} allocator metadata), {} held\n",
        human(v.runtime_heap.in_use_bytes),
        human(cache.index_bytes),
        human(v.pool.metadata_bytes),
        human(v.runtime_heap.held_bytes),
    );
    s += &v.pool_table;
    if !v.pool_table.ends_with('\n') {
        s.push('\n');
    }
    s
}
