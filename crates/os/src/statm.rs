//! A process's resident anonymous memory from `/proc/PID/statm`, read often
//! (the runtime's charge every 10 ms, the arbiter's sample of every process
//! of a tree every 100 ms) and so read cheaply.
//!
//! Why `statm` and not `RssAnon` of `status`: the kernel makes both from
//! the same per-mm counters (`statm`'s `resident` is file + anonymous +
//! shmem pages, its `shared` file + shmem), but `status` also renders the
//! signal masks, the capabilities and the rest of the task under the
//! task's lock, several times the work for one figure. In a `make -j8`
//! under `uzswap run` the evictors' reads of `/proc/self/status` (open,
//! statx, read, close every 10 ms in each process) would be about 2 % of
//! all the CPU the build uses (`uzswap-bench tree`, docs/BENCHMARKS.md).
//!
//! [`own`] keeps the file open on each thread that reads it and reads it
//! again from offset 0 (the kernel renders a `statm` anew at each read from
//! the start), so a reading costs one `pread`.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Resident anonymous bytes in the text of a `statm` file: `resident`
/// less `shared`, in pages. None if the text is not a `statm`.
pub fn parse_anon(text: &str) -> Option<u64> {
    let mut f = text.split_ascii_whitespace().skip(1);
    let resident: u64 = f.next()?.parse().ok()?;
    let shared: u64 = f.next()?.parse().ok()?;
    Some(resident.saturating_sub(shared) * crate::PAGE_SIZE as u64)
}

/// Reads a whole `statm` from `file` at offset 0 into a buffer on the stack
/// (the file is some 40 bytes; no allocation, no `statx` for its size).
fn read_anon(file: &File) -> io::Result<u64> {
    let mut buf = [0u8; 256];
    let n = file.read_at(&mut buf, 0)?;
    std::str::from_utf8(&buf[..n])
        .ok()
        .and_then(parse_anon)
        .ok_or_else(|| io::Error::other("unexpected /proc/PID/statm format"))
}

fn open(pid: u32) -> io::Result<File> {
    File::open(format!("/proc/{pid}/statm"))
}

/// [`open`] for a file kept open in a program's process: high in the table
/// and guarded (`crate::fdguard`), so that the program neither meets its
/// number among its own nor closes it and hands the number to a file of its
/// own, which the next read would parse.
fn open_kept(pid: u32) -> io::Result<(crate::fdguard::Mark, File)> {
    Ok(crate::fdguard::guard(open(pid)?))
}

/// The resident anonymous memory of process `pid`, in bytes.
pub fn of(pid: u32) -> io::Result<u64> {
    read_anon(&open(pid)?)
}

thread_local! {
    /// This thread's open `/proc/PID/statm` and the pid it was opened for.
    /// A thread that forks goes on in the child with its parent's file
    /// (`/proc/self` named the parent when it was opened): the pid tells.
    /// The mark comes before the file: it is unmarked before it closes.
    static OWN: RefCell<Option<(u32, crate::fdguard::Mark, File)>> = const { RefCell::new(None) };
}

/// The calling process's resident anonymous memory, in bytes, as
/// `RssAnon` of `/proc/self/status` counts it. A thread whose
/// thread-locals are gone (its exit, the process's exit handlers) or
/// already inside this call (a signal handler) opens the file anew.
pub fn own() -> io::Result<u64> {
    let pid = std::process::id();
    OWN.try_with(|cell| {
        let Ok(mut slot) = cell.try_borrow_mut() else {
            return of(pid);
        };
        if !matches!(&*slot, Some((p, _, _)) if *p == pid) {
            // The old file (a parent's, inherited by a fork) goes first.
            *slot = None;
            let (mark, file) = open_kept(pid)?;
            *slot = Some((pid, mark, file));
        }
        let (_, _, file) = slot.as_ref().expect("opened above");
        read_anon(file)
    })
    .unwrap_or_else(|_| of(pid))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `RssAnon` of `/proc/self/status`, bytes.
    fn status_rss_anon() -> u64 {
        let s = std::fs::read_to_string("/proc/self/status").unwrap();
        let kb: u64 = s
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap();
        kb * 1024
    }

    #[test]
    fn a_statm_line_gives_resident_less_shared() {
        assert_eq!(
            parse_anon("5000 1200 200 30 0 900 0\n"),
            Some(1000 * crate::PAGE_SIZE as u64)
        );
        assert_eq!(parse_anon("5000"), None);
        assert_eq!(parse_anon("a b c"), None);
    }

    #[test]
    fn the_kept_file_is_read_anew_and_agrees_with_status() {
        let _m = crate::MEMORY_TESTS
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let before = own().unwrap();
        let v = std::hint::black_box(vec![1u8; 32 << 20]);
        // The same open file, read again, sees the growth.
        let after = own().unwrap();
        assert!(after >= before + (31 << 20), "{before} -> {after}");
        // And it is the figure status gives (the test's other threads may
        // allocate meanwhile: within 4 MiB).
        let status = status_rss_anon();
        assert!(
            status.abs_diff(own().unwrap()) < 4 << 20,
            "{status} {after}"
        );
        assert!(of(std::process::id()).unwrap().abs_diff(status) < 4 << 20);
        drop(v);
    }

    #[test]
    fn a_thread_local_destructor_may_read_it() {
        struct AtExit(std::sync::mpsc::Sender<u64>);
        impl Drop for AtExit {
            fn drop(&mut self) {
                let _ = self.0.send(own().unwrap());
            }
        }
        thread_local! {
            static AT_EXIT: RefCell<Option<AtExit>> = const { RefCell::new(None) };
        }
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Registered first: destroyed after `OWN` (destruction runs in
            // reverse order), which this thread has used.
            AT_EXIT.with(|a| *a.borrow_mut() = Some(AtExit(tx)));
            own().unwrap();
        })
        .join()
        .unwrap();
        assert!(rx.recv().unwrap() > 0);
    }

    #[test]
    fn a_forked_child_reads_its_own_memory_not_its_parents() {
        let _m = crate::MEMORY_TESTS
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // The parent's file is open on this thread before the fork.
        let parent = own().unwrap();
        let mut fds = [0i32; 2];
        // SAFETY: a pipe of two fresh descriptors.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: the child only touches memory, reads its statm and writes
        // to the pipe before _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // 64 MiB of the child's own: a child reading its parent's
            // file would not see them.
            let v = std::hint::black_box(vec![1u8; 64 << 20]);
            let seen = own().unwrap_or(0);
            let out = seen.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live buffer, then exits.
            unsafe {
                libc::write(fds[1], out.as_ptr().cast(), out.len());
                drop(v);
                libc::_exit(0);
            }
        }
        let mut got = [0u8; 8];
        // SAFETY: reads 8 bytes into a live buffer; waits for the child.
        unsafe {
            libc::read(fds[0], got.as_mut_ptr().cast(), got.len());
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        let child = u64::from_ne_bytes(got);
        // The child holds the parent's pages (copy-on-write) and its own
        // 64 MiB; its parent's file would show only the first.
        assert!(
            child >= parent + (60 << 20),
            "child {child}, parent {parent}"
        );
    }
}
