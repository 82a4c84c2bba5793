//! The threads of a process, from /proc: what each is doing (for the
//! report a test prints when something hangs where no debugger runs), and
//! whether any of the program's own is left.

/// For process `pid` (or this one, with `None`): its command line, then,
/// for each of its threads, the name, the state, the kernel function it
/// sleeps in (`wchan`) and its kernel stack (readable as root only).
pub fn describe(pid: Option<u32>) -> String {
    let proc = pid.map_or_else(|| "/proc/self".to_string(), |p| format!("/proc/{p}"));
    let cmdline = std::fs::read(format!("{proc}/cmdline")).unwrap_or_default();
    let mut out = format!(
        "process {}: {}\n",
        pid.map_or_else(|| std::process::id().to_string(), |p| p.to_string()),
        String::from_utf8_lossy(&cmdline).replace('\0', " ")
    );
    let Ok(tasks) = std::fs::read_dir(format!("{proc}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let dir = t.path();
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        let stat = read("stat");
        // The state follows the command, which is in parentheses and may
        // hold spaces or parentheses itself.
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .unwrap_or("?")
            .to_string();
        out.push_str(&format!(
            "  thread {} {:?}: state {state}, wchan {}\n{}",
            t.file_name().to_string_lossy(),
            read("comm").trim(),
            read("wchan"),
            read("stack")
        ));
    }
    out
}

/// Whether every thread of this process but the helpers
/// ([`crate::spawn_helper`]) has ended. The C library ends a process when
/// its last thread exits (`pthread_exit` from the last one is `exit(0)`),
/// but it counts helper threads too: a host whose helpers run on must end
/// the process itself once this is true, or it stays for ever, a zombie
/// leader with live helpers. False while any other thread is alive,
/// including a helper that has not listed itself yet, and whenever /proc
/// cannot be read: an error never reads as "ended".
///
/// The program may close descriptors it did not open at any moment
/// (`close_range` before an `exec`): the leader's `stat` is read through
/// one descriptor kept open and guarded ([`crate::fdguard`]), so the
/// look that runs every few hundred milliseconds opens nothing. Only once
/// the leader has exited are the other threads listed and read.
pub fn program_ended() -> bool {
    // The leader is never a helper: while it runs, the program does.
    if !leader_ended() {
        return false;
    }
    let helpers: Vec<i32> = crate::fork::helper_tids().collect();
    let Some(tids) = task_ids() else {
        return false;
    };
    tids.iter().all(|&t| {
        helpers.contains(&t)
            || match std::fs::read(format!("/proc/self/task/{t}/stat")) {
                Ok(st) => ended_state(&st),
                // Gone since it was listed; any other error is no answer.
                Err(e) => matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)),
            }
    })
}

/// The leader's `stat` of this process: (pid, descriptor), reopened in a
/// forked child (whose inherited copy names its parent's leader).
static LEADER: crate::lock::Mutex<(u32, i32)> = crate::lock::Mutex::new((0, -1));

/// Whether the thread-group leader has exited (a zombie whose other
/// threads live on). False on any error.
fn leader_ended() -> bool {
    let pid = std::process::id();
    // The lock is held across the one open of a process (never across the
    // reads): two pagers' evictors may look at once.
    let fd = {
        let mut l = LEADER.lock();
        if l.0 != pid {
            if l.1 >= 0 {
                crate::fdguard::unmark(l.1);
                // SAFETY: the copy of our own descriptor this process
                // inherited; nothing else refers to it.
                unsafe { libc::close(l.1) };
            }
            let path = std::ffi::CString::new(format!("/proc/{pid}/task/{pid}/stat"))
                .expect("no NUL in a path of digits");
            // SAFETY: a NUL-terminated path; the descriptor is ours.
            let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
            let fd = if fd >= 0 {
                crate::fdguard::lift_raw(fd)
            } else {
                fd
            };
            if fd >= 0 {
                crate::fdguard::mark(fd);
            }
            *l = (pid, fd);
        }
        l.1
    };
    if fd < 0 {
        return false;
    }
    let mut buf = [0u8; 512];
    // SAFETY: reads into a buffer of our own from our own descriptor; a
    // /proc file read at offset 0 gives its content of now.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    n > 0 && ended_state(&buf[..n as usize])
}

/// The thread ids of this process, from /proc (with libc's directory
/// calls: the standard library's panics if the program closed the
/// directory's descriptor meanwhile). None if it cannot be read.
fn task_ids() -> Option<Vec<i32>> {
    // SAFETY: a NUL-terminated path; the stream is ours and closed below.
    let dir = unsafe { libc::opendir(c"/proc/self/task".as_ptr()) };
    if dir.is_null() {
        return None;
    }
    let mut tids = Vec::new();
    loop {
        // SAFETY: `dir` is an open stream; the entry lives until the next
        // readdir on it.
        let e = unsafe { libc::readdir(dir) };
        if e.is_null() {
            break;
        }
        // SAFETY: d_name is NUL-terminated within the entry.
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) };
        if let Some(t) = name.to_str().ok().and_then(|n| n.parse::<i32>().ok()) {
            tids.push(t);
        }
    }
    // SAFETY: closes the stream opened above (an error is of no use here).
    unsafe { libc::closedir(dir) };
    Some(tids)
}

/// Whether a `stat` line says zombie or dead. The state follows the
/// command, in parentheses (see `describe`).
fn ended_state(stat: &[u8]) -> bool {
    let stat = String::from_utf8_lossy(stat);
    matches!(
        stat.rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next()),
        Some("Z" | "X")
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_thread_is_described_running() {
        let d = super::describe(None);
        assert!(
            d.starts_with(&format!("process {}:", std::process::id())),
            "{d}"
        );
        // The describing thread reads its own state while it runs.
        assert!(d.contains("state R"), "{d}");
    }

    #[test]
    fn a_live_program_thread_keeps_the_program_running() {
        // The test's own thread is no helper, and runs.
        assert!(!super::program_ended());
        // A helper listed alone does not make it end either.
        let h = crate::spawn_helper("test-helper", None, || {
            assert!(!super::program_ended());
        })
        .unwrap();
        h.join().unwrap();
    }

    #[test]
    fn a_zombie_or_dead_state_has_ended_and_a_running_one_not() {
        assert!(super::ended_state(b"12 (a (b) c) Z 1 2"));
        assert!(super::ended_state(b"12 (x) X 1 2"));
        assert!(!super::ended_state(b"12 (x Z) S 1 2"));
        assert!(!super::ended_state(b""));
        assert!(!super::leader_ended());
        let tids = super::task_ids().expect("/proc/self/task");
        assert!(tids.contains(&(std::process::id() as i32)), "{tids:?}");
    }
}
