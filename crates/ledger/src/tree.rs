//! The tree's memory as the kernel counts it: the processes below a root
//! (through `/proc/PID/task/TID/children`) and their proportional anonymous
//! memory (`Pss_Anon` of `/proc/PID/smaps_rollup`). Pss counts a page that
//! a fork left shared between two processes half to each, so the sum over
//! the tree counts it once; it includes every process's pool and the
//! runtime's heap, both anonymous. This is the figure `--memory-max` is
//! held against in tests and in the summary, apart from the reports in the
//! ledger.

/// The pids of `root` and all its descendants (those alive now), root first.
pub fn tree_pids(root: u32) -> Vec<u32> {
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let pid = out[i];
        i += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let Ok(c) = std::fs::read_to_string(t.path().join("children")) else {
                continue;
            };
            for child in c.split_whitespace().filter_map(|s| s.parse().ok()) {
                if !out.contains(&child) {
                    out.push(child);
                }
            }
        }
    }
    out
}

/// The children of `pid` (of all its threads), those alive now.
pub fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
            out.extend(c.split_whitespace().filter_map(|w| w.parse::<u32>().ok()));
        }
    }
    out
}

/// `Pss_Anon` of one process, in bytes (None if it is gone or unreadable).
pub fn pss_anon(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let line = s.lines().find(|l| l.starts_with("Pss_Anon:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// One look at a tree.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TreeSample {
    /// `(pid, Pss_Anon bytes)` of each process seen.
    pub processes: Vec<(u32, u64)>,
    /// Their sum.
    pub pss_anon: u64,
}

/// Samples the tree below `root`, leaving out the pids in `skip` (the
/// caller itself, when it is the root and is not to be counted).
pub fn sample(root: u32, skip: &[u32]) -> TreeSample {
    let processes: Vec<(u32, u64)> = tree_pids(root)
        .into_iter()
        .filter(|p| !skip.contains(p))
        .filter_map(|p| pss_anon(p).map(|b| (p, b)))
        .collect();
    TreeSample {
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
}
