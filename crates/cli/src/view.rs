//! One look at a process tree under `uzswap run` ([`TreeView`]), read
//! once from two sources:
//! - the tree's **ledger** (`uzswap_ledger`): one row per managed process
//!   (what it holds, what the arbiter allotted it) and the budget. Which
//!   ledger is found from `/proc` (`uzswap_ledger::find`): the pid may be
//!   the `uzswap run` itself or any process of its program;
//! - the **detail** of a process: the `uzswap_contract::Snapshot` its
//!   runtime serves on the abstract unix socket
//!   `uzswap_contract::socket_name(pid)`: one process ([`tree`]), or every
//!   process of the tree ([`ask_all`]).
//!
//! `uzswap stats` renders it as text and JSON (`stats.rs`) and as
//! Prometheus text (`metrics.rs`), and so does the metrics endpoint
//! (`serve.rs`).

use anyhow::{bail, Context, Result};
use serde::Serialize;
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
    /// What it holds besides managed pages and pool: the program's
    /// unmanaged memory and uzswap's own.
    pub runtime_bytes: u64,
    /// Of that, uzswap's own heap.
    pub own_bytes: u64,
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
            own_bytes: u.own,
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
    pub own_bytes: u64,
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
            t.own_bytes += r.own_bytes;
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
