//! The tree's memory as the kernel counts it: the processes below a root
//! (through `/proc/PID/task/TID/children`) and their proportional anonymous
//! memory (`Pss_Anon` of `/proc/PID/smaps_rollup`). Pss counts a page that
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

/// `(pid, its parent in the walk)` of `root` and its descendants.
fn tree_with_parents(root: u32) -> Vec<(u32, u32)> {
    let mut out = vec![(root, 0)];
    let mut i = 0;
    while i < out.len() {
        let pid = out[i].0;
        i += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let Ok(c) = std::fs::read_to_string(t.path().join("children")) else {
                continue;
            };
            for child in c.split_whitespace().filter_map(|s| s.parse().ok()) {
                if !out.iter().any(|&(p, _)| p == child) {
                    out.push((child, pid));
                }
            }
        }
    }
    out
}

/// Whether `a` and `b` share one address space (`kcmp(2)`, `KCMP_VM`); no
/// if the kernel cannot say (either is gone, or not ours to inspect).
pub fn same_address_space(a: u32, b: u32) -> bool {
    const KCMP_VM: libc::c_long = 1;
    // SAFETY: kcmp only compares kernel objects of the two processes; no
    // memory of ours is passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            libc::c_long::from(a as i32),
            libc::c_long::from(b as i32),
            KCMP_VM,
            0 as libc::c_long,
            0 as libc::c_long,
        )
    };
    r == 0
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
/// A process that shares its parent's address space counts 0 (see the
/// module's docs).
pub fn sample(root: u32, skip: &[u32]) -> TreeSample {
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

    /// A child in this process's address space (as a vfork child is until
    /// it execs) is counted as 0, not as a second copy of this process.
    #[test]
    fn a_child_sharing_the_address_space_counts_once() {
        extern "C" fn wait_forever(_: *mut libc::c_void) -> libc::c_int {
            loop {
                // SAFETY: pause takes nothing; the child only sleeps here
                // until it is killed.
                unsafe { libc::pause() };
            }
        }
        // 32 MiB of this process's own, so that a double count shows.
        let mut b = vec![0u8; 32 << 20];
        for i in (0..b.len()).step_by(4096) {
            b[i] = 1;
        }
        let mut stack = vec![0u8; 64 << 10];
        // SAFETY: the child runs `wait_forever` on `stack`, which outlives
        // it (it is killed and reaped below), and touches nothing else.
        let child = unsafe {
            libc::clone(
                wait_forever,
                stack.as_mut_ptr().add(stack.len()).cast(),
                libc::CLONE_VM | libc::SIGCHLD,
                std::ptr::null_mut(),
            )
        };
        assert!(
            child > 0,
            "clone failed: {}",
            std::io::Error::last_os_error()
        );
        let child = child as u32;
        let me = std::process::id();
        let s = sample(me, &[]);
        let own = pss_anon(me).unwrap();
        // SAFETY: the child is ours; kill and reap it.
        unsafe {
            libc::kill(child as i32, libc::SIGKILL);
            libc::waitpid(child as i32, std::ptr::null_mut(), 0);
        }
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
