//! Samples a process tree's memory from /proc, as the kernel counts it:
//! the processes below a root (by the parent each process's
//! `/proc/PID/stat` names) and their proportional anonymous memory
//! (`Pss_Anon` of `/proc/PID/smaps_rollup`). Pss counts a page that
//! a fork left shared between two processes half to each, so the sum over
//! the tree counts it once; it includes every process's pool and the
//! runtime's heap, both anonymous. This is the figure `--memory-max` is
//! held against in tests and in the summary, apart from the reports in the
//! ledger.
//!
//! A child that shares its parent's address space (one started with
//! `vfork`, as CPython's `subprocess` and `posix_spawn` do, until it execs;
//! or any `clone(CLONE_VM)` process) shows the parent's memory in its own
//! `smaps_rollup`: it is counted as 0 (`kcmp(KCMP_VM)` tells).

/// The pids of `root` and all its descendants (those alive now), root first.
pub fn tree_pids(root: u32) -> Vec<u32> {
    tree_with_parents(root)
        .into_iter()
        .map(|(p, _)| p)
        .collect()
}

/// `(pid, its parent)` of every process, from each one's `/proc/PID/stat`.
///
/// Why not the `children` files of `/proc/PID/task/TID/`: opening a file
/// of a thread other than a process's first makes the kernel's cleanup of
/// that process's `/proc` entries, when it is reaped, far dearer while
/// other processes keep the CPUs busy: 96 short `python3` processes with
/// six idle threads each, eight at a time, cost their reapers 0.5-0.7 % of
/// all the CPU in `d_walk` once each thread's `stat` has been read once,
/// nothing without the reads; in a `make -j8` under `uzswap run`, whose
/// every process has six runtime threads, the reaping `gcc` and `make`
/// spend 4 % of the build's CPU there (`uzswap-bench tree`,
/// docs/BENCHMARKS.md).
fn parents() -> Vec<(u32, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            Some((pid, crate::sys::proc_stat(pid)?.parent))
        })
        .collect()
}

/// `(pid, its parent in the walk)` of `root` and its descendants.
fn tree_with_parents(root: u32) -> Vec<(u32, u32)> {
    let mut by_parent: std::collections::HashMap<u32, Vec<u32>> = std::collections::HashMap::new();
    for (pid, parent) in parents() {
        by_parent.entry(parent).or_default().push(pid);
    }
    let mut out = vec![(root, 0)];
    let mut i = 0;
    while i < out.len() {
        let pid = out[i].0;
        i += 1;
        // Every pid has one parent in the snapshot: each is pushed once.
        out.extend(by_parent.get(&pid).into_iter().flatten().map(|&c| (c, pid)));
    }
    out
}

pub use crate::sys::same_address_space;

/// The children of `pid` (of all its threads), those alive now.
pub fn children(pid: u32) -> Vec<u32> {
    parents()
        .into_iter()
        .filter(|&(_, parent)| parent == pid)
        .map(|(child, _)| child)
        .collect()
}

/// `Pss_Anon` of one process, in bytes (None if it is gone or unreadable).
pub fn pss_anon(pid: u32) -> Option<u64> {
    smaps_anon(pid).map(|a| a.pss)
}

/// A process's anonymous memory from its `smaps_rollup`, bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Anon {
    rss: u64,
    pss: u64,
}

/// The anonymous pages mapped (`Anonymous`) and `Pss_Anon` of one process. Reading `smaps_rollup` walks
/// the process's page tables: its cost grows with what it maps.
fn smaps_anon(pid: u32) -> Option<Anon> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    Some(Anon {
        rss: kib_field(&s, "Anonymous:")?,
        pss: kib_field(&s, "Pss_Anon:")?,
    })
}

/// Resident anonymous bytes of one process (`RssAnon`) from its `statm`:
/// the kernel's counters, read without a walk (see [`uzswap_os::statm`]).
fn counted_rss_anon(pid: u32) -> Option<u64> {
    uzswap_os::statm::of(pid).ok()
}

/// The parent of `pid`, from its `/proc/PID/stat` (None if it is gone).
fn parent_of(pid: u32) -> Option<u32> {
    crate::sys::proc_stat(pid).map(|s| s.parent)
}

/// The value of a `Name:   N kB` line, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    let kb: u64 = line[name.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kb * 1024)
}

/// How long a process's `RssAnon` stands in for its `Pss_Anon` before
/// `smaps_rollup` is read again. `RssAnon` is never under `Pss_Anon`, and
/// a private process starts to share only when a child of its own joins
/// (which walks it at once), so this bounds only the over-count of a
/// sharing missed (a double fork). At one second a `make -j8` has each
/// compiler walked every second, 23 walks a second in all, and the walks
/// are a third of `uzswap run`'s CPU (`uzswap-bench tree`,
/// docs/BENCHMARKS.md).
pub const EXACT_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// How often [`Sampler::sample_members`] finds the tree anew from /proc
/// (the `stat` of every process of the machine). Between findings the
/// processes of the last sample are read again, and processes that joined
/// the ledger are placed under their parent. In a `make -j8` under
/// `uzswap run`, finding the tree at every sample (100 ms) would be most
/// of the arbiter's CPU (`uzswap-bench tree`, docs/BENCHMARKS.md).
pub const FIND_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Samples one tree over and over, as [`sample`] does, with less work:
/// a process that shares no anonymous page with another (its `Pss_Anon`
/// equal to its `Rss_Anon`, within 1/64) has `Pss_Anon` = `RssAnon`, which
/// `/proc/PID/statm` gives without walking its page tables. With a Python
/// heap of 1 GB under eviction, reading `smaps_rollup` every 100 ms would
/// take about a tenth of all the CPU the run uses besides the program's
/// (`uzswap-bench programs`, docs/BENCHMARKS.md).
///
/// Such a process begins to share only by forking, so it is read from
/// `smaps_rollup` again when a child of its own joins the tree, and at
/// least every [`EXACT_EVERY`]; the others keep their `statm` figure (a
/// build starts a process every few hundred milliseconds, and walking
/// every compiler's tables for each would be most of `uzswap run`'s CPU). A
/// process found sharing (a child forked without exec, its parent) is read
/// from `smaps_rollup` at every sample. A child that outlived the process
/// that forked it (the double fork of a daemon) joins under another parent
/// and may share pages with a process counted by `RssAnon` until its next
/// walk: that counts the shared pages whole, over `Pss_Anon`. Within the
/// tolerance the figure can only be over, never under, `Pss_Anon`.
#[derive(Debug, Default)]
pub struct Sampler {
    /// Processes seen at the last sample: when they were read from
    /// `smaps_rollup`, and whether they shared nothing then.
    known: std::collections::HashMap<u32, (std::time::Instant, bool)>,
    /// The tree at the last sample, `(pid, parent)`, root first: the
    /// processes that were read then.
    tree: Vec<(u32, u32)>,
    /// When the tree was last found from /proc ([`FIND_EVERY`]).
    found_at: Option<std::time::Instant>,
    /// Members that the last finding did not see below the root (a double
    /// fork took them out of it): not looked for again until the next.
    outside: std::collections::HashSet<u32>,
    /// Reads of `smaps_rollup` and of `statm` so far; findings of the tree.
    walks: u64,
    counts: u64,
    finds: u64,
}

impl Sampler {
    /// A sampler that has seen nothing yet.
    pub fn new() -> Sampler {
        Sampler::default()
    }

    /// The tree below `root` now, leaving out the pids in `skip`; the tree
    /// is found from /proc at every call.
    pub fn sample(&mut self, root: u32, skip: &[u32]) -> ProcSample {
        self.look(root, skip, None)
    }

    /// As [`Sampler::sample`], for a caller that knows the processes that
    /// joined its ledger (`members`): the tree is found from /proc at most
    /// every [`FIND_EVERY`], or when a member cannot be placed under a
    /// process of the last sample (its parent is not one). Between
    /// findings, a process of the tree that joined no ledger (a static
    /// binary, a program started without the runtime) and started since the
    /// last finding is not counted yet; a process that ended drops out at
    /// once (its read fails).
    pub fn sample_members(&mut self, root: u32, skip: &[u32], members: &[u32]) -> ProcSample {
        self.look(root, skip, Some(members))
    }

    /// The tree to read now: found anew, or the last one with the members
    /// that joined since placed under their parents.
    fn current_tree(
        &mut self,
        root: u32,
        now: std::time::Instant,
        members: Option<&[u32]>,
    ) -> Vec<(u32, u32)> {
        let due = self
            .found_at
            .is_none_or(|t| now.duration_since(t) >= FIND_EVERY);
        if let (false, Some(members)) = (due, members) {
            let mut tree = self.tree.clone();
            let mut seen: std::collections::HashSet<u32> = tree.iter().map(|&(p, _)| p).collect();
            let placed = members.iter().all(|&m| {
                if seen.contains(&m) || self.outside.contains(&m) {
                    return true;
                }
                match parent_of(m) {
                    Some(parent) if seen.contains(&parent) => {
                        seen.insert(m);
                        tree.push((m, parent));
                        true
                    }
                    _ => false,
                }
            });
            if placed {
                return tree;
            }
        }
        self.finds += 1;
        self.found_at = Some(now);
        let tree = tree_with_parents(root);
        self.outside.clear();
        if let Some(members) = members {
            let seen: std::collections::HashSet<u32> = tree.iter().map(|&(p, _)| p).collect();
            self.outside
                .extend(members.iter().filter(|m| !seen.contains(m)));
        }
        tree
    }

    fn look(&mut self, root: u32, skip: &[u32], members: Option<&[u32]>) -> ProcSample {
        let now = std::time::Instant::now();
        let tree: Vec<(u32, u32)> = self
            .current_tree(root, now, members)
            .into_iter()
            .filter(|(p, _)| !skip.contains(p))
            .collect();
        // The parents of the processes that joined since the last sample:
        // they forked, and may share pages now.
        let forked: Vec<u32> = tree
            .iter()
            .filter(|(p, _)| !self.known.contains_key(p))
            .map(|&(_, parent)| parent)
            .collect();
        let mut known = std::collections::HashMap::with_capacity(tree.len());
        let mut processes = Vec::with_capacity(tree.len());
        let mut kept = Vec::with_capacity(tree.len());
        for &(p, parent) in &tree {
            let bytes = if parent != 0 && same_address_space(p, parent) {
                Some(0)
            } else {
                let cheap = match self.known.get(&p) {
                    Some(&(at, true))
                        if !forked.contains(&p) && now.duration_since(at) < EXACT_EVERY =>
                    {
                        self.counts += 1;
                        counted_rss_anon(p).map(|rss| (rss, at))
                    }
                    _ => None,
                };
                match cheap {
                    Some((rss, at)) => {
                        known.insert(p, (at, true));
                        Some(rss)
                    }
                    None => {
                        self.walks += 1;
                        smaps_anon(p).map(|a| {
                            known.insert(p, (now, a.pss * 64 >= a.rss * 63));
                            a.pss
                        })
                    }
                }
            };
            // Left out: it ended (or its files cannot be read).
            if let Some(b) = bytes {
                processes.push((p, b));
                kept.push((p, parent));
            }
        }
        self.known = known;
        self.tree = kept;
        ProcSample {
            pss_anon: processes.iter().map(|&(_, b)| b).sum(),
            processes,
        }
    }

    /// When `pid` was last read from `smaps_rollup`, if it was seen at the
    /// last sample.
    pub fn walked_at(&self, pid: u32) -> Option<std::time::Instant> {
        self.known.get(&pid).map(|&(at, _)| at)
    }

    /// `(smaps_rollup reads, statm reads)` so far.
    pub fn reads(&self) -> (u64, u64) {
        (self.walks, self.counts)
    }

    /// How many times the tree was found from /proc so far.
    pub fn finds(&self) -> u64 {
        self.finds
    }
}

/// One look at a tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcSample {
    /// `(pid, Pss_Anon bytes)` of each process seen.
    pub processes: Vec<(u32, u64)>,
    /// Their sum.
    pub pss_anon: u64,
}

/// Samples the tree below `root`, leaving out the pids in `skip` (the
/// caller itself, when it is the root and is not to be counted).
/// A process that shares its parent's address space counts 0 (see the
/// module's docs).
pub fn sample(root: u32, skip: &[u32]) -> ProcSample {
    let processes: Vec<(u32, u64)> = tree_with_parents(root)
        .into_iter()
        .filter(|(p, _)| !skip.contains(p))
        .filter_map(|(p, parent)| {
            if parent != 0 && same_address_space(p, parent) {
                return Some((p, 0));
            }
            pss_anon(p).map(|b| (p, b))
        })
        .collect();
    ProcSample {
        pss_anon: processes.iter().map(|&(_, b)| b).sum(),
        processes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_and_its_memory_are_seen() {
        // A python3 child that dirties 32 MiB of its own heap and waits.
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import sys,time; b=bytearray(32<<20)\nfor i in range(0,len(b),4096): b[i]=1\nprint('ok',flush=True); time.sleep(30)",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 is on the machine");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        let me = std::process::id();
        let s = sample(me, &[me]);
        let _ = child.kill();
        let _ = child.wait();
        assert!(s.processes.iter().any(|&(p, _)| p == child.id()), "{s:?}");
        assert!(s.pss_anon >= 32 << 20, "{s:?}");
        assert!(tree_pids(me)[0] == me);
        assert_eq!(pss_anon(u32::MAX), None);
    }

    /// A private process is read from `statm` between walks, and the
    /// figure matches the walk's; a process joining the tree makes every
    /// process walked again.
    #[test]
    fn the_sampler_walks_only_when_sharing_may_have_changed() {
        let mut b = vec![0u8; 16 << 20];
        for i in (0..b.len()).step_by(4096) {
            b[i] = 1;
        }
        std::hint::black_box(&mut b);
        let me = std::process::id();
        let mut s = Sampler::new();
        let first = s.sample(me, &[]);
        let walks = s.reads().0;
        assert!(walks >= 1, "{:?}", s.reads());
        let second = s.sample(me, &[]);
        let mine = |t: &ProcSample| t.processes.iter().find(|&&(p, _)| p == me).unwrap().1;
        if s.reads().0 == walks {
            // Read from statm: the same memory within the kernel's
            // per-CPU counter slack and what the test itself allocated.
            assert!(s.reads().1 >= 1);
            let (a, b2) = (mine(&first), mine(&second));
            assert!(a.abs_diff(b2) < 4 << 20, "{first:?} {second:?}");
        }
        // A child joins: this process, its parent, is walked again.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep is on the machine");
        let before = s.reads().0;
        let with_child = s.sample(me, &[]);
        let _ = child.kill();
        let _ = child.wait();
        assert!(s.reads().0 >= before + 2, "{:?} {with_child:?}", s.reads());
        assert!(mine(&with_child) >= 16 << 20, "{with_child:?}");
        std::hint::black_box(&b);
    }

    /// A process that joins has its parent walked again, not the
    /// processes above it: a private grandparent keeps its `statm`
    /// figure until its own time comes.
    #[test]
    fn a_join_walks_the_parent_not_the_whole_tree() {
        use std::io::Write;
        // The interpreter itself: `python3` may be a shim (pyenv's is a
        // shell script whose own short-lived children would pass for C).
        let python = std::process::Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 is on the machine");
        let python = String::from_utf8(python.stdout).unwrap();
        // R waits for C; C reads a line, then starts a `sleep` of its own.
        let mut r = std::process::Command::new(python.trim())
            .args([
                "-c",
                "import subprocess,sys\nsubprocess.run([sys.executable,'-c',\
                 'import subprocess,sys,time\\nsys.stdin.readline()\\n\
                 subprocess.Popen([\"sleep\",\"30\"])\\ntime.sleep(30)'])",
            ])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("python3 is on the machine");
        let root = r.id();
        let mut s = Sampler::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let c = loop {
            let t = s.sample(root, &[]);
            if t.processes.len() == 2 {
                break t.processes[1].0;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "C never started: {t:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        // Both are known now; C's fork comes next.
        let (r_at, c_at) = (s.walked_at(root).unwrap(), s.walked_at(c).unwrap());
        writeln!(r.stdin.as_mut().unwrap()).unwrap();
        let grandchild = loop {
            if let Some(&g) = children(c).first() {
                break g;
            }
            assert!(std::time::Instant::now() < deadline, "C never forked");
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        let t = s.sample(root, &[]);
        let in_time = r_at.elapsed() < EXACT_EVERY;
        let _ = r.kill();
        let _ = r.wait();
        // C and its child would otherwise sleep on, orphaned.
        crate::sys::kill(c);
        crate::sys::kill(grandchild);
        assert!(t.processes.iter().any(|&(p, _)| p == grandchild), "{t:?}");
        assert!(
            s.walked_at(c).unwrap() > c_at,
            "the parent was not walked: {t:?}"
        );
        if in_time {
            assert_eq!(s.walked_at(root), Some(r_at), "the grandparent was walked");
        }
    }

    /// Between findings, a member of the ledger is placed under its parent
    /// without walking /proc, a process that ended drops out, and a
    /// process that joined no ledger waits for the next finding.
    #[test]
    fn members_join_between_findings_and_others_wait_for_the_next() {
        let me = std::process::id();
        let sleep = || {
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .expect("sleep is on the machine")
        };
        let has = |t: &ProcSample, pid: u32| t.processes.iter().any(|&(p, _)| p == pid);
        let mut s = Sampler::new();
        let mut first = sleep();
        s.sample_members(me, &[], &[]);
        // The finding was made before this instant.
        let t0 = std::time::Instant::now();
        assert_eq!(s.finds(), 1);
        // A member (as if it had joined the ledger): placed, no finding.
        let mut member = sleep();
        let mut other = sleep();
        let t = s.sample_members(me, &[], &[member.id()]);
        let in_time = t0.elapsed() < FIND_EVERY;
        assert!(has(&t, member.id()), "{t:?}");
        assert!(has(&t, first.id()), "{t:?}");
        if in_time {
            assert_eq!(s.finds(), 1, "a member made the tree be found again");
            assert!(!has(&t, other.id()), "found before its time: {t:?}");
        }
        // One that ends drops out at once.
        let _ = first.kill();
        let _ = first.wait();
        let t = s.sample_members(me, &[], &[member.id()]);
        assert!(!has(&t, first.id()), "{t:?}");
        // The next finding sees the one that joined no ledger.
        std::thread::sleep(FIND_EVERY.saturating_sub(t0.elapsed()));
        let t = s.sample_members(me, &[], &[member.id()]);
        assert!(has(&t, other.id()), "{t:?}");
        assert!(s.finds() >= 2);
        for c in [&mut member, &mut other] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A child in this process's address space (as a vfork child is until
    /// it execs) is counted as 0, not as a second copy of this process.
    #[test]
    fn a_child_sharing_the_address_space_counts_once() {
        // 32 MiB of this process's own, so that a double count shows.
        let mut b = vec![0u8; 32 << 20];
        for i in (0..b.len()).step_by(4096) {
            b[i] = 1;
        }
        let mut stack = vec![0u8; 64 << 10];
        // SAFETY: `stack` outlives the child: it is killed and reaped below.
        let child = unsafe { crate::sys::clone_vm_pausing(&mut stack) }
            .unwrap_or_else(|e| panic!("clone failed: {e}"));
        let me = std::process::id();
        let s = sample(me, &[]);
        let own = pss_anon(me);
        // Killed and reaped before any assertion: a child left pausing
        // would hold the test's output open.
        crate::sys::kill_and_reap(child);
        let own = own.expect("this process's smaps_rollup is readable");
        assert!(same_address_space(me, me));
        assert!(s.processes.contains(&(child, 0)), "{s:?}");
        // Other tests' children may be in the tree too: only this process
        // and its clone count here.
        let ours: u64 = s
            .processes
            .iter()
            .filter(|&&(p, _)| p == me || p == child)
            .map(|&(_, b)| b)
            .sum();
        assert!(ours < own + (16 << 20), "counted twice: {s:?}, own {own}");
        assert!(b[4096] == 1);
        drop(stack);
    }
}
