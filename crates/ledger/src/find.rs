//! Which ledger a process belongs to, from the outside (`uzswap stats`):
//! looks at `/proc`, and at the header of a ledger a process holds; nothing
//! is written.
//!
//! A process is of a tree in one of two ways:
//! - it is the tree's `uzswap run` (the arbiter): it holds the ledger's
//!   memory file open (`/proc/PID/fd/N` links to `/memfd:uzswap-ledger`)
//!   and the ledger's header names it (every member holds the file open
//!   too, and a `uzswap run` started inside another tree's program holds
//!   both), or, where its descriptors cannot be listed, a child of it names that
//!   file in its `UZSWAP_LEDGER`;
//! - it is one of the program's processes: its environment (as it was at
//!   its `exec`, `/proc/PID/environ`) holds `UZSWAP_LEDGER=/proc/RUN/fd/N`,
//!   which names the `uzswap run` by its pid.
//!
//! The first way is tried first: a `uzswap run` started inside another
//! tree's program inherited that tree's variable, but its own tree is the
//! one it arbitrates.

use crate::Ledger;
use std::io;
use std::path::{Path, PathBuf};

/// The name of the ledger's memory file, as its links in `/proc/PID/fd`
/// show it (`/memfd:NAME (deleted)`); `sys::memfd` gives it.
const MEMFD_LINK: &str = "/memfd:uzswap-ledger";
/// The variable that names the ledger in a member's environment (the
/// contract crate's `names::LEDGER`; this crate does not depend on it).
const LEDGER_VAR: &[u8] = b"UZSWAP_LEDGER=";

/// How a process belongs to a tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// It is the tree's `uzswap run`.
    Arbiter,
    /// It is one of the program's processes.
    Member,
}

/// The ledger of the tree a process belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Where to open it ([`crate::Ledger::open`]).
    pub path: PathBuf,
    /// The pid of the tree's `uzswap run`, as the path names it.
    pub run_pid: u32,
    /// How the process asked about belongs to the tree.
    pub role: Role,
}

/// Why no ledger was found for a process.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    /// No process has that pid.
    #[error("no process {0} exists: give the pid `uzswap run` printed, or one of its program's processes")]
    NoSuchProcess(u32),
    /// The process is neither a `uzswap run` nor one of its program's.
    #[error("pid {0} is not under `uzswap run`: give the pid `uzswap run` printed, or one of its program's processes")]
    NotUnderUzswap(u32),
    /// `/proc` would not say (most often: the process is another user's).
    #[error("cannot read {path}: {error} (if the process is another user's, ask as that user)")]
    Unreadable {
        /// What could not be read.
        path: PathBuf,
        /// Why (in the message: not a source of its own).
        error: io::Error,
    },
}

/// Finds the ledger of the tree process `pid` belongs to.
pub fn find(pid: u32) -> Result<Found, FindError> {
    if !Path::new(&format!("/proc/{pid}")).exists() {
        return Err(FindError::NoSuchProcess(pid));
    }
    // Kept to be told if nothing else says where the process belongs.
    let mut unreadable = None;
    match held_ledger(pid) {
        Ok(Some(path)) => {
            return Ok(Found {
                path,
                run_pid: pid,
                role: Role::Arbiter,
            })
        }
        Ok(None) => {}
        Err(e) => unreadable = Some(e),
    }
    match environ_ledger(pid) {
        Ok(Some(path)) => {
            return match run_pid_of(&path) {
                Some(run_pid) => Ok(Found {
                    path,
                    run_pid,
                    role: Role::Member,
                }),
                // Not a path `uzswap run` makes: set by hand.
                None => Err(FindError::NotUnderUzswap(pid)),
            };
        }
        Ok(None) => {}
        Err(e) => unreadable = unreadable.or(Some(e)),
    }
    // A `uzswap run` whose descriptors could not be listed: its program
    // names it.
    for child in crate::proc_sample::children(pid) {
        if let Ok(Some(path)) = environ_ledger(child) {
            if run_pid_of(&path) == Some(pid) {
                return Ok(Found {
                    path,
                    run_pid: pid,
                    role: Role::Arbiter,
                });
            }
        }
    }
    if !Path::new(&format!("/proc/{pid}")).exists() {
        // It exited while it was looked at.
        return Err(FindError::NoSuchProcess(pid));
    }
    Err(unreadable.unwrap_or(FindError::NotUnderUzswap(pid)))
}

/// The path of the ledger `pid` holds open as its arbiter, if it is one.
fn held_ledger(pid: u32) -> Result<Option<PathBuf>, FindError> {
    let dir = PathBuf::from(format!("/proc/{pid}/fd"));
    let entries = std::fs::read_dir(&dir).map_err(|error| FindError::Unreadable {
        path: dir.clone(),
        error,
    })?;
    for e in entries.flatten() {
        // A descriptor closed meanwhile has no link: skipped.
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        if !target
            .as_os_str()
            .as_encoded_bytes()
            .starts_with(MEMFD_LINK.as_bytes())
        {
            continue;
        }
        // Every member holds its tree's ledger open too: the arbiter's is
        // the one whose header names it.
        if Ledger::open(&e.path()).is_ok_and(|l| l.arbiter_pid() == pid) {
            return Ok(Some(e.path()));
        }
    }
    Ok(None)
}

/// The ledger named in `pid`'s environment, if one is (an empty value
/// names none).
fn environ_ledger(pid: u32) -> Result<Option<PathBuf>, FindError> {
    let path = PathBuf::from(format!("/proc/{pid}/environ"));
    let env = std::fs::read(&path).map_err(|error| FindError::Unreadable { path, error })?;
    Ok(env
        .split(|&b| b == 0)
        .find_map(|kv| kv.strip_prefix(LEDGER_VAR))
        .filter(|v| !v.is_empty())
        .map(|v| PathBuf::from(String::from_utf8_lossy(v).into_owned())))
}

/// The pid in a ledger path `/proc/PID/fd/N`.
pub fn run_pid_of(path: &Path) -> Option<u32> {
    let s = path.to_str()?;
    let rest = s.strip_prefix("/proc/")?;
    let (pid, fd) = rest.split_once("/fd/")?;
    fd.parse::<u32>().ok()?;
    pid.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_maker_of_a_ledger_is_found_as_its_arbiter() {
        let l = Ledger::create(2, 1 << 20).unwrap();
        let me = crate::sys::getpid();
        let f = find(me).unwrap();
        assert_eq!(f.role, Role::Arbiter);
        assert_eq!(f.run_pid, me);
        // Other tests of this process may hold ledgers too: any one of
        // them is this process's.
        assert!(f.path.starts_with(format!("/proc/{me}/fd/")), "{f:?}");
        assert_eq!(run_pid_of(l.path()), Some(me));
    }

    fn wait_for_exec(pid: u32, comm: &str) {
        for _ in 0..1000 {
            let now = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if now.trim_end() == comm {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        panic!("process {pid} did not run {comm} within 5 s");
    }

    #[test]
    fn a_child_naming_the_ledger_is_found_as_a_member() {
        let l = Ledger::create(2, 1 << 20).unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("UZSWAP_LEDGER", l.path())
            .spawn()
            .unwrap();
        // Until it has run `exec`, the child's environment is this
        // process's, which names no ledger; and the new program's name
        // may show before the kernel has placed the new environment (the
        // loader sets where it lies after the name is changed): look
        // until it is there.
        wait_for_exec(child.id(), "sleep");
        let t0 = std::time::Instant::now();
        let f = loop {
            let f = find(child.id());
            if f.is_ok() || t0.elapsed() > std::time::Duration::from_secs(5) {
                break f;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        let _ = child.kill();
        let _ = child.wait();
        let f = f.unwrap();
        assert_eq!(f.role, Role::Member);
        assert_eq!(f.run_pid, crate::sys::getpid());
        assert_eq!(f.path, l.path());
    }

    #[test]
    fn other_processes_are_told_apart() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env_remove("UZSWAP_LEDGER")
            .spawn()
            .unwrap();
        let r = find(child.id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(matches!(r, Err(FindError::NotUnderUzswap(_))), "{r:?}");
        assert!(matches!(
            find(u32::MAX),
            Err(FindError::NoSuchProcess(u32::MAX))
        ));
        assert_eq!(run_pid_of(Path::new("/proc/12/fd/3")), Some(12));
        assert_eq!(run_pid_of(Path::new("/tmp/ledger")), None);
    }
}
