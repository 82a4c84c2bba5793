//! CPU time from /proc: the whole process's, and its helper threads'
//! (the threads [`crate::spawn_helper`] started: uzswap's own work inside
//! a program), so that what uzswap costs can be told from what the
//! program does.

/// User plus system time, in seconds, of a `/proc/.../stat` line.
fn stat_cpu_seconds(stat: &str) -> Option<f64> {
    // The fields after the command (in parentheses, which may hold spaces
    // or parentheses itself) start with the state, field 3; utime and
    // stime are fields 14 and 15, in clock ticks.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut f = rest.split_whitespace().skip(11);
    let utime: u64 = f.next()?.parse().ok()?;
    let stime: u64 = f.next()?.parse().ok()?;
    Some((utime + stime) as f64 / clock_ticks())
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// CPU time of the calling process so far, every thread's (those that
/// ended included), in seconds; 0 if /proc cannot tell.
pub fn process_cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| stat_cpu_seconds(&s))
        .unwrap_or(0.0)
}

/// CPU time of this process's live helper threads so far, in seconds.
pub fn helpers_cpu_seconds() -> f64 {
    crate::fork::helper_tids()
        .filter_map(|tid| {
            let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
            stat_cpu_seconds(&s)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_with_parentheses_and_spaces_is_skipped() {
        let line = "42 (a) b (c) S 1 42 42 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 1 0 5 0 0";
        let want = 300.0 / clock_ticks();
        assert_eq!(stat_cpu_seconds(line), Some(want));
        assert_eq!(stat_cpu_seconds("garbage"), None);
    }

    #[test]
    fn a_helper_thread_that_spins_is_counted() {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let before = helpers_cpu_seconds();
        let t = crate::spawn_helper("cpu-test", None, move || {
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
        .unwrap();
        let t0 = std::time::Instant::now();
        // Until the kernel's count shows it (a clock tick is 10 ms).
        while helpers_cpu_seconds() < before + 0.05 && t0.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let during = helpers_cpu_seconds();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        t.join().unwrap();
        assert!(during >= before + 0.05, "{before} -> {during}");
        assert!(process_cpu_seconds() >= during);
    }
}
