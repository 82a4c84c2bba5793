//! The runtime's own memory inside a managed program: its
//! threads allocate from one glibc arena, not one each. Read from
//! `/proc/PID/smaps` of a live program whose runtime has evicted, while it
//! holds its data.
//!
//! Skipped (`common::skip`) where the machine cannot run it (no userfaultfd,
//! no python3).

use crate::common::*;
use std::time::Duration;

/// glibc's `HEAP_MAX_SIZE` on 64-bit: every arena but the main one lives
/// in mappings of this size, aligned to it (`MAP_NORESERVE`, the part not
/// in use `PROT_NONE`).
const GLIBC_HEAP: u64 = 64 * MIB;

/// One mapping of `/proc/PID/smaps`.
struct Vma {
    start: u64,
    end: u64,
    perms: String,
    path: String,
    flags: Vec<String>,
}

fn vmas(pid: u32) -> Vec<Vma> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps is readable");
    let mut out: Vec<Vma> = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if first == "VmFlags:" {
            if let Some(v) = out.last_mut() {
                v.flags = words.map(str::to_owned).collect();
            }
            continue;
        }
        let Some((a, b)) = first.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let perms = words.next().unwrap_or_default().to_owned();
        let path = words.nth(3).unwrap_or_default().to_owned();
        out.push(Vma {
            start,
            end,
            perms,
            path,
            flags: Vec::new(),
        });
    }
    out
}

/// The heaps of glibc's arenas other than the main one: an anonymous
/// read-write `MAP_NORESERVE` mapping at a multiple of 64 MiB, not
/// registered with userfaultfd (the managed space's chunks are), that
/// alone or with the `PROT_NONE` rest after it spans exactly 64 MiB.
fn thread_heaps(pid: u32) -> Vec<(u64, u64)> {
    let v = vmas(pid);
    let mut heaps = Vec::new();
    for (i, m) in v.iter().enumerate() {
        let candidate = m.path.is_empty()
            && m.perms.starts_with("rw")
            && m.start % GLIBC_HEAP == 0
            && m.flags.iter().any(|f| f == "nr")
            && !m.flags.iter().any(|f| f == "um");
        if !candidate {
            continue;
        }
        let span = match v.get(i + 1) {
            Some(n) if n.start == m.end && n.perms.starts_with("---") => n.end - m.start,
            _ => m.end - m.start,
        };
        if span == GLIBC_HEAP {
            heaps.push((m.start, m.end));
        }
    }
    heaps
}

fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .map(|c| c.trim_end().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_runtime_threads_share_one_malloc_arena() {
    require_uffd!();
    if missing("python3", &["python3", "-c", "pass"]) {
        return;
    }
    let dir = scratch("runtime-heap");
    // 40 MiB of distinct pages in 24 MiB: the evictor stores, the writer
    // writes back, so every runtime thread has allocated by `ready`.
    let hold = "import hashlib, os, time\nb = [hashlib.sha256(b'%d' % i).digest() * 128 for i in range(10240)]\nprint('ready', os.getpid(), flush=True)\ntime.sleep(2)\nassert all(b[i] == hashlib.sha256(b'%d' % i).digest() * 128 for i in range(len(b)))\nprint('checked', flush=True)";
    let mut seen = None;
    let r = run_with(
        &dir,
        &["--memory-max", "24M", "--", "python3", "-c", hold],
        |_, out| {
            let mut line = String::new();
            while out.read_line(&mut line).unwrap() > 0 {
                if let Some(p) = line.trim().strip_prefix("ready ") {
                    let pid = p.parse::<u32>().unwrap();
                    std::thread::sleep(Duration::from_millis(300));
                    seen = Some((thread_names(pid), thread_heaps(pid)));
                    break;
                }
                line.clear();
            }
        },
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("checked"), "{}", r.stdout);
    let (threads, heaps) = seen.expect("the program said it was ready");
    for t in ["uzswap-uffd", "uzswap-evict", "uzswap-writer", "zs-compact"] {
        assert!(
            threads.iter().any(|n| n == t),
            "no runtime thread {t} among {threads:?}"
        );
    }
    assert!(
        heaps.is_empty(),
        "glibc arenas besides the main one at {heaps:x?} (threads {threads:?})"
    );
    std::fs::remove_dir_all(dir).unwrap();
}
