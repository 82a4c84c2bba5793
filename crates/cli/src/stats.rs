//! `uzswap stats PID`: the live statistics of a program under `uzswap run`,
//! the whole process tree of it.
//!
//! Two sources, read once each:
//! - the tree's **ledger** (`uzswap_ledger`): one row per managed process
//!   (what it holds, what the arbiter allotted it) and the budget. Which
//!   ledger is found from `/proc` (`uzswap_ledger::find`): PID may be the
//!   `uzswap run` itself or any process of its program;
//! - the **detail** of one process: the `uzswap_contract::Snapshot` its
//!   runtime serves on the abstract unix socket
//!   `uzswap_contract::socket_name(pid)`: the process asked about, or the
//!   program (the root) when given the `uzswap run` pid. `--prometheus`
//!   asks every process of the tree for its own.
//!
//! Shown as text (a table, the totals against the budget, then the
//! detail), one JSON object, or Prometheus text exposition format (a pid
//! label on every per-process sample).

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::Value;
use std::fmt::Write as _;
use std::io::Read;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixStream};
use uzswap_contract::{socket_name, Snapshot};
use uzswap_ledger::{FindError, Ledger, Role, SlotView};

/// How long a process's runtime may take to answer.
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// Processes asked at once for their detail (`--prometheus`).
const ASK_AT_ONCE: usize = 32;

/// What the runtime of `pid` answers on its socket.
fn fetch(pid: u32) -> std::io::Result<String> {
    let addr = SocketAddr::from_abstract_name(socket_name(pid))?;
    let mut s = UnixStream::connect_addr(&addr)?;
    s.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    let mut body = String::new();
    s.read_to_string(&mut body)?;
    Ok(body)
}

/// The snapshot in the answer of `pid`'s runtime.
fn parse(pid: u32, body: &str) -> Result<Snapshot> {
    Snapshot::from_json(body.as_bytes())
        .with_context(|| format!("process {pid} answered with statistics this uzswap cannot read"))
}

/// What `uzswap stats` prints.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// One JSON object.
    pub json: bool,
    /// Prometheus text exposition format.
    pub prometheus: bool,
    /// The tree only: no process is asked for its detail.
    pub brief: bool,
}

/// One process of the tree, as its ledger row has it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Row {
    /// Its pid.
    pub pid: u32,
    /// Its slot in the ledger (a process holds one per image it executed
    /// until it exits).
    pub slot: usize,
    /// Its command name (up to 16 bytes).
    pub comm: String,
    /// Managed pages resident now, in bytes.
    pub resident_bytes: u64,
    /// Its compressed pool.
    pub pool_bytes: u64,
    /// Its runtime's own memory.
    pub runtime_bytes: u64,
    /// What it keeps in its backing file.
    pub backing_bytes: u64,
    /// What the arbiter allotted it (None: not decided yet).
    pub allot_bytes: Option<u64>,
    /// Faults resolved so far.
    pub faults: u64,
    /// Pages evicted so far.
    pub evictions: u64,
    /// Pages stored (pool and backing file) now.
    pub stored_pages: u64,
}

impl From<&SlotView> for Row {
    fn from(v: &SlotView) -> Row {
        let u = &v.usage;
        Row {
            pid: v.pid,
            slot: v.index,
            comm: v.comm.clone(),
            resident_bytes: u.resident,
            pool_bytes: u.pool,
            runtime_bytes: u.runtime,
            backing_bytes: u.backing,
            allot_bytes: v.allot,
            faults: u.faults,
            evictions: u.evictions,
            stored_pages: u.stored,
        }
    }
}

/// The sums over the rows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    /// Rows summed.
    pub processes: usize,
    pub resident_bytes: u64,
    pub pool_bytes: u64,
    pub runtime_bytes: u64,
    pub backing_bytes: u64,
    /// Of the allotments decided.
    pub allot_bytes: u64,
    pub faults: u64,
    pub evictions: u64,
    pub stored_pages: u64,
}

impl Totals {
    fn of(rows: &[Row]) -> Totals {
        let mut t = Totals {
            processes: rows.len(),
            ..Totals::default()
        };
        for r in rows {
            t.resident_bytes += r.resident_bytes;
            t.pool_bytes += r.pool_bytes;
            t.runtime_bytes += r.runtime_bytes;
            t.backing_bytes += r.backing_bytes;
            t.allot_bytes += r.allot_bytes.unwrap_or(0);
            t.faults += r.faults;
            t.evictions += r.evictions;
            t.stored_pages += r.stored_pages;
        }
        t
    }

    /// What the budget pays for: resident + pool + runtime.
    pub fn memory_bytes(&self) -> u64 {
        self.resident_bytes + self.pool_bytes + self.runtime_bytes
    }
}

/// The detail of one process, or why there is none.
#[derive(Debug)]
pub enum Detail {
    /// Not asked for (`--brief`).
    NotAsked,
    /// What its runtime answered.
    Shown(Box<Snapshot>),
    /// Why it is missing: said beside the ledger rows.
    Missing(String),
}

/// One look at a tree.
#[derive(Debug)]
pub struct TreeView {
    /// The tree's `uzswap run`.
    pub run_pid: u32,
    /// The pid asked about.
    pub asked: u32,
    /// The process whose detail is shown: the one asked about, or the
    /// program when the `uzswap run` pid was given (None: it has exited).
    pub shown: Option<u32>,
    /// The budget of the whole tree.
    pub budget_bytes: u64,
    /// What the arbiter has allotted to nobody.
    pub unallotted_bytes: u64,
    /// The managed processes, by pid.
    pub rows: Vec<Row>,
    /// Their sums.
    pub totals: Totals,
    /// The detail of `shown`.
    pub detail: Detail,
}

/// Reads the tree `pid` belongs to and, unless `brief`, the detail of the
/// process asked about.
pub fn tree(pid: u32, brief: bool) -> Result<TreeView> {
    let found = match uzswap_ledger::find(pid) {
        // A process this user may not look into and that serves no
        // statistics is not under uzswap (a `uzswap run` would have been
        // found through its program's environment; its other children,
        // orphans re-parented to it included, say nothing of it).
        Err(FindError::Unreadable { .. }) if !serves_statistics(pid) => {
            return Err(FindError::NotUnderUzswap(pid).into());
        }
        r => r?,
    };
    // The ledger's error says its cause in its message: not chained again.
    let ledger = Ledger::open(&found.path).map_err(|e| {
        anyhow::anyhow!(
            "cannot read the ledger of `uzswap run` {} (the tree of pid {pid}): {e}",
            found.run_pid
        )
    })?;
    if ledger.arbiter_pid() != found.run_pid {
        bail!(
            "pid {pid} names the ledger of `uzswap run` {}, but that ledger is `uzswap run` {}'s: \
             the first has exited and its pid was reused; give the pid `uzswap run` printed",
            found.run_pid,
            ledger.arbiter_pid()
        );
    }
    // A process that has left is exiting: its slot waits for the arbiter.
    let mut rows: Vec<Row> = ledger
        .read()
        .iter()
        .filter(|v| !v.left)
        .map(Row::from)
        .collect();
    rows.sort_by_key(|r| (r.pid, r.slot));
    let shown = match found.role {
        Role::Member => Some(pid),
        // `uzswap run` starts one process, the program.
        Role::Arbiter => uzswap_ledger::proc_sample::children(pid).first().copied(),
    };
    let detail = match (brief, shown) {
        (true, _) => Detail::NotAsked,
        (false, None) => Detail::Missing(format!(
            "the program of `uzswap run` {pid} has exited: no process to show in detail"
        )),
        (false, Some(p)) => match fetch(p) {
            Ok(body) => Detail::Shown(Box::new(parse(p, &body)?)),
            Err(e) => Detail::Missing(silent(p, &rows, &e)),
        },
    };
    Ok(TreeView {
        run_pid: found.run_pid,
        asked: pid,
        shown,
        budget_bytes: ledger.budget(),
        unallotted_bytes: ledger.unallotted(),
        totals: Totals::of(&rows),
        rows,
        detail,
    })
}

/// Whether `pid` serves statistics: its socket is in `/proc/net/unix`,
/// which anyone may read (as `@NAME`, abstract).
fn serves_statistics(pid: u32) -> bool {
    let name = format!("@{}", socket_name(pid));
    std::fs::read_to_string("/proc/net/unix").is_ok_and(|t| {
        t.lines()
            .any(|l| l.split_whitespace().last() == Some(&name))
    })
}

/// Why process `pid` gave no detail (its socket: `e`).
fn silent(pid: u32, rows: &[Row], e: &std::io::Error) -> String {
    if rows.iter().any(|r| r.pid == pid) {
        format!(
            "process {pid} does not answer on its statistics socket ({e}): it may be starting \
             or exiting; its ledger row is shown"
        )
    } else {
        format!(
            "process {pid} does not answer on its statistics socket ({e}) and has no ledger row: \
             it runs unmanaged (a child forked without exec, or a program uzswap cannot manage), \
             or it is starting or exiting"
        )
    }
}

/// Renders `pid`'s tree as `o` asks.
pub fn show(pid: u32, o: Options) -> Result<String> {
    let brief = o.brief;
    let v = tree(pid, brief)?;
    if let Detail::Missing(why) = &v.detail {
        if o.json || o.prometheus {
            crate::note(&format!("uzswap: note: {why}"));
        }
    }
    if o.json {
        return Ok(json(&v)? + "\n");
    }
    if o.prometheus {
        let details = if brief { Vec::new() } else { ask_all(&v)? };
        return Ok(crate::metrics::tree_prometheus(&v, &details));
    }
    Ok(tree_text(&v))
}

/// The table of the tree, its totals against the budget, then the detail.
pub fn tree_text(v: &TreeView) -> String {
    use crate::human;
    let t = &v.totals;
    let mut s = format!(
        "uzswap run {}: {} processes hold {} of a budget of {} ({:.0}%), {} unallotted\n",
        v.run_pid,
        t.processes,
        human(t.memory_bytes()),
        human(v.budget_bytes),
        t.memory_bytes() as f64 * 100.0 / v.budget_bytes.max(1) as f64,
        human(v.unallotted_bytes),
    );
    // pid, command, resident, pool, runtime, backing, allotment, faults,
    // evictions.
    let line = |c: [String; 9]| {
        format!(
            "{:>8} {:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]
        )
    };
    s += &line(
        [
            "pid",
            "command",
            "resident",
            "pool",
            "runtime",
            "backing",
            "allotment",
            "faults",
            "evictions",
        ]
        .map(String::from),
    );
    for r in &v.rows {
        let mark = if Some(r.pid) == v.shown { "*" } else { "" };
        s += &line([
            format!("{mark}{}", r.pid),
            r.comm.clone(),
            human(r.resident_bytes),
            human(r.pool_bytes),
            human(r.runtime_bytes),
            human(r.backing_bytes),
            r.allot_bytes.map_or("-".into(), human),
            r.faults.to_string(),
            r.evictions.to_string(),
        ]);
    }
    s += &line([
        "total".into(),
        String::new(),
        human(t.resident_bytes),
        human(t.pool_bytes),
        human(t.runtime_bytes),
        human(t.backing_bytes),
        human(t.allot_bytes),
        t.faults.to_string(),
        t.evictions.to_string(),
    ]);
    let mut held: Vec<(u32, usize)> = Vec::new();
    for r in &v.rows {
        match held.last_mut() {
            Some((pid, n)) if *pid == r.pid => *n += 1,
            _ => held.push((r.pid, 1)),
        }
    }
    for (pid, n) in held.into_iter().filter(|&(_, n)| n > 1) {
        let _ = writeln!(
            s,
            "pid {pid} holds {n} rows: one per program it executed (an image that called exec \
             left its row to be reaped when the process exits)"
        );
    }
    match &v.detail {
        Detail::NotAsked => {}
        Detail::Shown(d) => {
            let _ = write!(s, "\n* pid {} in detail:\n{}", d.pid, text(d));
        }
        Detail::Missing(why) => {
            let _ = writeln!(s, "\n{why}");
        }
    }
    s
}

/// One JSON object: the tree, its totals, and the detail of the process
/// asked about (the snapshot's own shape; null, with `detail_note` saying
/// why, when it did not answer).
pub fn json(v: &TreeView) -> Result<String> {
    let mut o = serde_json::json!({
        "run_pid": v.run_pid,
        "pid": v.asked,
        "detail_pid": v.shown,
        "budget_bytes": v.budget_bytes,
        "total_bytes": v.totals.memory_bytes(),
        "unallotted_bytes": v.unallotted_bytes,
        "processes": v.rows,
        "totals": v.totals,
        "detail": Value::Null,
    });
    match &v.detail {
        Detail::NotAsked => {}
        Detail::Shown(d) => o["detail"] = serde_json::from_str(&d.to_json()?)?,
        Detail::Missing(why) => o["detail_note"] = Value::from(why.as_str()),
    }
    Ok(o.to_string())
}

/// The detail of every process of the tree that answers, asked
/// [`ASK_AT_ONCE`] at a time (one that does not answer is left out).
pub fn ask_all(v: &TreeView) -> Result<Vec<Snapshot>> {
    let mut pids: Vec<u32> = v.rows.iter().map(|r| r.pid).collect();
    pids.dedup(); // sorted
    let mut out = Vec::new();
    for chunk in pids.chunks(ASK_AT_ONCE) {
        let answers: Vec<(u32, std::io::Result<String>)> = std::thread::scope(|s| {
            let asks: Vec<_> = chunk
                .iter()
                .map(|&pid| (pid, s.spawn(move || fetch(pid))))
                .collect();
            asks.into_iter()
                .map(|(pid, h)| {
                    let a = h.join().unwrap_or_else(|_| {
                        Err(std::io::Error::other("the thread asking it panicked"))
                    });
                    (pid, a)
                })
                .collect()
        });
        for (pid, a) in answers {
            if let Ok(body) = a {
                out.push(parse(pid, &body)?);
            }
        }
    }
    Ok(out)
}

/// Faults by source and their latency, one line.
pub fn faults_line(s: &Snapshot) -> String {
    let p = &s.pager;
    format!(
        "faults: {} from pool, {} from {}, {} same-filled, {} zero; latency p50 {:.1} us p99 {:.1} us",
        p.faults_pool,
        p.faults_backing,
        s.config.backing.as_ref().map_or("no backing tier", |t| t.noun()),
        p.faults_same_filled,
        p.faults_zero,
        p.fault_latency.p50_us,
        p.fault_latency.p99_us,
    )
}

/// What a remote tier cost and holds, one line.
pub fn remote_line(cache: &uzswap_cache::CacheStats) -> String {
    use crate::human;
    format!(
        "{} round trips ({} loads read ahead), {} sent, {} received, {} errors ({} keys missing), \
         {} connections; it holds {} for {} of pages",
        cache.tier_round_trips,
        cache.tier_read_ahead_hits,
        human(cache.tier_bytes_sent),
        human(cache.tier_bytes_received),
        cache.tier_errors,
        cache.tier_missing,
        cache.tier_connects,
        human(cache.tier_held_bytes),
        human(cache.backing_pages * 4096),
    )
}

/// A readable page: the headline figures and the pool's class table.
pub fn text(v: &Snapshot) -> String {
    use crate::human;
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
        "pages now: {} in the pool ({} same-filled), {} in {}\n",
        cache.stored_pages,
        cache.same_filled_pages,
        cache.backing_pages,
        v.config
            .backing
            .as_ref()
            .map_or("no backing tier", |t| t.noun()),
    );
    if let Some(uzswap_contract::BackingTier::Redis(url)) = &v.config.backing {
        s += &format!("remote tier {url}: {}\n", remote_line(cache));
    }
    s += &format!(
        "runtime heap: {} in use ({} index, {} allocator metadata), {} held\n",
        human(v.runtime_heap.in_use_bytes),
        human(cache.index_bytes),
        human(v.pool.metadata_bytes),
        human(v.runtime_heap.held_bytes),
    );
    s += &cosched_line(&v.cosched);
    s += &v.pool_table;
    if !v.pool_table.ends_with('\n') {
        s.push('\n');
    }
    s
}

/// What co-scheduling is doing, in a line.
fn cosched_line(c: &uzswap_contract::CoschedStats) -> String {
    if !c.active {
        return "co-scheduling: off\n".into();
    }
    let now = match c.pinned_cpu {
        Some(cpu) => format!("pinned to CPU {cpu} with uzswap's threads"),
        None => "not pinned".into(),
    };
    format!(
        "co-scheduling: {now}; pinned {} times, let go {} ({} for a crowded CPU)\n",
        c.pins, c.releases, c.crowded
    )
}
