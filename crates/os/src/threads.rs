//! What each thread of a process is doing, from /proc: for the report a
//! test prints when something hangs where no debugger runs.

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
}
