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
/// including a helper that has not listed itself yet.
pub fn program_ended() -> bool {
    // The leader is never a helper: while it runs, the program does.
    if !ended(&format!("/proc/self/task/{}/stat", std::process::id())) {
        return false;
    }
    let helpers: Vec<i32> = crate::fork::helper_tids().collect();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return false;
    };
    tasks.flatten().all(|t| {
        let name = t.file_name();
        let tid = name.to_str().and_then(|n| n.parse::<i32>().ok());
        tid.is_some_and(|t| helpers.contains(&t))
            || ended(&format!("/proc/self/task/{}/stat", name.to_string_lossy()))
    })
}

/// A thread whose `stat` says zombie or dead, or is gone.
fn ended(stat_path: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(stat_path) else {
        return true;
    };
    // The state follows the command, in parentheses (see `describe`).
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
    fn a_gone_or_zombie_thread_has_ended() {
        assert!(super::ended("/proc/self/task/0/stat"));
        assert!(!super::ended(&format!(
            "/proc/self/task/{}/stat",
            std::process::id()
        )));
    }
}
