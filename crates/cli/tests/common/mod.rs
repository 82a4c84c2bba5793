//! What the `uzswap` integration tests share: the binary, whether this
//! machine can run them, a process tree's pids and memory from /proc, and
//! running `uzswap run` while a sampler watches its tree.
#![allow(dead_code)] // each test binary uses a part

use std::io::{BufRead, Read};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

pub const MIB: u64 = 1 << 20;

pub fn uzswap() -> Command {
    Command::new(env!("CARGO_BIN_EXE_uzswap"))
}

/// Why `uzswap run` cannot run here, if it cannot.
pub fn unavailable() -> Option<String> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(|| match uzswap_region::sys::Uffd::open(0, None) {
        Ok(_) => None,
        Err(e) => Some(format!("userfaultfd unavailable: {e}")),
    })
    .clone()
}

/// Returns from the test, with a note, where userfaultfd is unavailable.
#[macro_export]
macro_rules! require_uffd {
    () => {
        if let Some(why) = common::unavailable() {
            eprintln!("skipped: {why}");
            return;
        }
    };
}

/// Every descendant of `pid` (not `pid` itself), parents before children.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() {
        out.extend(uzswap_ledger::tree::children(out[i]));
        i += 1;
    }
    out.remove(0);
    out
}

/// `VmRSS` of a process, in bytes.
pub fn vm_rss(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    l.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|k| k * 1024)
}

/// What a `uzswap run` printed and how it ended.
pub struct Finished {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` (a `uzswap run ...`), calling `sample` with its pid every
/// `every` on another thread until it ends, and `during` with its pid and
/// its stdout once it started (what `during` leaves unread is kept).
pub fn run_sampling(
    mut cmd: Command,
    every: Duration,
    mut sample: impl FnMut(u32) + Send + 'static,
    during: impl FnOnce(u32, &mut dyn BufRead),
) -> Finished {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start uzswap");
    let pid = child.id();
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                sample(pid);
                std::thread::sleep(every);
            }
        })
    };
    let mut err_pipe = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        err_pipe.read_to_string(&mut s).unwrap();
        s
    });
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    during(pid, &mut out);
    let mut stdout = String::new();
    out.read_to_string(&mut stdout).unwrap();
    let stderr = err_reader.join().unwrap();
    let status = child.wait().unwrap();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    Finished {
        code: status.code(),
        stdout,
        stderr,
    }
}
