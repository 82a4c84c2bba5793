//! CPU time: the whole process's, and its helper threads' (the threads
//! [`crate::spawn_helper`] started: uzswap's own work inside a program),
//! so that what uzswap costs can be told from what the program does.
//!
//! Read from the kernel's CPU clocks, not from `/proc/self/task/TID/stat`:
//! a thread's `/proc` files, once opened, make the reaping of the process
//! dearer (see `uzswap_ledger::proc_sample`'s `parents` for the figures).

/// CPU time of the calling process so far, every thread's (those that
/// ended included), in seconds; 0 if the clock cannot be read.
pub fn process_cpu_seconds() -> f64 {
    clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID).map_or(0.0, |ns| ns as f64 * 1e-9)
}

/// CPU time of thread `tid` of this process so far, in nanoseconds (None
/// if it has ended). The clock of a thread is named by its tid (the
/// kernel's `MAKE_THREAD_CPUCLOCK`: the tid's complement shifted by 3, with
/// the per-thread bit and the scheduler clock), as glibc's
/// `pthread_getcpuclockid` names it.
pub fn thread_cpu_ns(tid: i32) -> Option<u64> {
    clock_ns((!tid << 3) | 6)
}

fn clock_ns(id: libc::clockid_t) -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live timespec for the kernel to fill.
    let r = unsafe { libc::clock_gettime(id, &mut ts) };
    (r == 0).then_some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// CPU time of this process's live helper threads so far, in seconds.
pub fn helpers_cpu_seconds() -> f64 {
    crate::fork::helper_tids()
        .filter_map(thread_cpu_ns)
        .map(|ns| ns as f64 * 1e-9)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_clock_is_read_by_tid_and_an_ended_thread_has_none() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // 30 ms of its own CPU time, however busy the machine (a
            // spin of 30 ms by the wall clock may get less than 5 ms of it).
            let own = || clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).expect("own thread clock");
            let t0 = own();
            while own() - t0 < 30_000_000 {
                std::hint::spin_loop();
            }
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = wait.recv();
        });
        let tid = rx.recv().unwrap();
        // Its 30 ms of spinning, read by its tid.
        let spun = thread_cpu_ns(tid).expect("a live thread of this process");
        assert!(spun >= 30_000_000, "{spun} ns");
        go.send(()).unwrap();
        t.join().unwrap();
        // A joined thread may still be leaving the kernel for a moment.
        let t0 = std::time::Instant::now();
        while thread_cpu_ns(tid).is_some() {
            assert!(
                t0.elapsed().as_secs() < 10,
                "the ended thread's clock stays"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
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
