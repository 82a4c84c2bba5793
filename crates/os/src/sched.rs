//! Where and how threads run: CPU affinity and the `SCHED_IDLE` policy, of
//! the calling thread (tid 0) or of another thread of this process (its
//! tid), and whether a thread may leave `SCHED_IDLE` again.

use std::io;

/// A set of CPUs (`cpu_set_t`: up to 1024 CPUs).
#[derive(Clone, Copy)]
pub struct CpuSet(libc::cpu_set_t);

impl CpuSet {
    /// The set holding `cpu` alone.
    pub fn one(cpu: usize) -> CpuSet {
        // SAFETY: an all-zero cpu_set_t is a valid empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a valid cpu_set_t; CPU_SET ignores CPUs past its
        // size.
        unsafe { libc::CPU_SET(cpu, &mut set) };
        CpuSet(set)
    }

    /// The set whose bytes (as [`CpuSet::as_bytes`] gives them) start with
    /// `bytes`; the rest are empty.
    pub fn from_bytes(bytes: &[u8]) -> CpuSet {
        // SAFETY: an all-zero cpu_set_t is a valid empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let n = bytes.len().min(std::mem::size_of::<libc::cpu_set_t>());
        // SAFETY: cpu_set_t is plain bytes; `n` is within both.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                (&mut set as *mut libc::cpu_set_t).cast::<u8>(),
                n,
            );
        }
        CpuSet(set)
    }

    /// How many CPUs the set holds.
    pub fn count(&self) -> usize {
        // SAFETY: `self.0` is a valid cpu_set_t.
        unsafe { libc::CPU_COUNT(&self.0) as usize }
    }

    /// The CPUs of the set, in order.
    pub fn cpus(&self) -> Vec<usize> {
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| self.has(c))
            .collect()
    }

    /// Whether the set holds `cpu`.
    pub fn has(&self, cpu: usize) -> bool {
        // SAFETY: `self.0` is a valid cpu_set_t; CPU_ISSET answers false
        // past its size.
        cpu < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(cpu, &self.0) }
    }

    /// The set's bytes, as `sched_getaffinity(2)` hands them out.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: cpu_set_t is plain bytes; the slice borrows `self`.
        unsafe {
            std::slice::from_raw_parts(
                (&self.0 as *const libc::cpu_set_t).cast::<u8>(),
                std::mem::size_of::<libc::cpu_set_t>(),
            )
        }
    }
}

impl PartialEq for CpuSet {
    fn eq(&self, other: &CpuSet) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl std::fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CpuSet{:?}", self.cpus())
    }
}

/// The CPUs thread (or process) `tid` may run on; 0 is the calling thread.
/// By the system call itself, not libc's wrapper: a preloaded runtime may
/// answer the wrapper for the program (uzswap's co-scheduling does).
pub fn affinity(tid: i32) -> io::Result<CpuSet> {
    let mut bytes = [0u8; std::mem::size_of::<libc::cpu_set_t>()];
    affinity_into(tid, &mut bytes)?;
    Ok(CpuSet::from_bytes(&bytes))
}

/// The kernel's `sched_getaffinity(2)` of `tid` into `mask` (its length is
/// the size passed): how many bytes it wrote; the rest are left as they
/// were.
pub fn affinity_into(tid: i32, mask: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `mask` is writable for the length passed (capped as libc
    // caps it); the kernel writes at most that many bytes.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getaffinity,
            libc::c_long::from(tid),
            mask.len().min(i32::MAX as usize),
            mask.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as usize)
}

/// Lets thread `tid` (0: the calling thread) run only on `set`.
pub fn set_affinity(tid: i32, set: &CpuSet) -> io::Result<()> {
    // SAFETY: `set.0` is a valid cpu_set_t of the size passed.
    if unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&set.0), &set.0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Switches thread `tid` (0: the calling thread) between `SCHED_IDLE`
/// (`idle`: it runs only when its CPU has nothing else to run, and any
/// other thread woken there preempts it at once) and the normal policy
/// (leaving `SCHED_IDLE` needs [`may_leave_idle`]).
pub fn set_idle(tid: i32, idle: bool) -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    let policy = if idle {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    // SAFETY: `param` is a valid sched_param; both policies take priority 0.
    if unsafe { libc::sched_setscheduler(tid, policy, &param) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether a thread of this process that took `SCHED_IDLE` may go back to
/// the normal policy: the kernel allows it only with `CAP_SYS_NICE` or an
/// `RLIMIT_NICE` that permits the thread's nice value (the default limit,
/// 0, does not), so an unprivileged thread that tried would stay idle.
pub fn may_leave_idle() -> bool {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid rlimit to write into.
    let have_rlimit = unsafe { libc::getrlimit(libc::RLIMIT_NICE, &mut lim) } == 0;
    // SAFETY: getpriority has no memory arguments; 0 is this thread.
    let nice = i64::from(unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) });
    if have_rlimit && lim.rlim_cur as i64 >= 20 - nice {
        return true;
    }
    // CAP_SYS_NICE is bit 23 of the effective set, which `capget` gives
    // (version 3: two 32-bit words per set) without a `/proc` file of
    // this thread (see `crate::cpu` for why those are avoided).
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget reads the header and writes two `Data` (version 3)
    // into `data`, both live.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    r == 0 && data[0].effective & (1 << 23) != 0
}

/// The `/proc` file `name` of thread `tid` of this process: the process's
/// own for its first thread (`/proc/self/NAME` describes that thread),
/// else the thread's. Opening a file of another thread makes the reaping
/// of the process dearer (see `crate::cpu`): the busy thread of most
/// programs is the first.
fn thread_file(tid: i32, name: &str) -> Option<String> {
    if u32::try_from(tid).ok() == Some(std::process::id()) {
        std::fs::read_to_string(format!("/proc/self/{name}")).ok()
    } else {
        std::fs::read_to_string(format!("/proc/self/task/{tid}/{name}")).ok()
    }
}

/// The CPU thread `tid` of this process last ran on (field 39 of its
/// `stat`).
pub fn last_cpu(tid: i32) -> Option<usize> {
    stat_cpu(&thread_file(tid, "stat")?)
}

/// The `processor` field of a `stat` line. The command name (field 2) may
/// hold spaces and parentheses: fields are counted after its last `)`.
fn stat_cpu(stat: &str) -> Option<usize> {
    let (_, rest) = stat.rsplit_once(')')?;
    // `rest` starts with field 3 (the state).
    rest.split_whitespace().nth(39 - 3)?.parse().ok()
}

/// Whether thread `tid` of this process is running or waiting for a CPU
/// (state `R` of its `stat`), not asleep.
pub fn runnable(tid: i32) -> Option<bool> {
    let stat = thread_file(tid, "stat")?;
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().next()? == "R")
}

/// Whether thread `tid` of this process sleeps in a userfaultfd fault (its
/// `wchan`): it waits for a page.
pub fn waits_for_page(tid: i32) -> Option<bool> {
    Some(thread_file(tid, "wchan")?.trim() == "handle_userfault")
}

/// How long thread `tid` of this process has waited, runnable, for a CPU
/// (the second field of its `schedstat`), in nanoseconds.
pub fn run_delay_ns(tid: i32) -> Option<u64> {
    let s = thread_file(tid, "schedstat")?;
    s.split_whitespace().nth(1)?.parse().ok()
}

/// The threads of this process but those in `except`, and the CPU time
/// each has used so far (its CPU clock, [`crate::cpu::thread_cpu_ns`]), in
/// nanoseconds, sorted by tid. A thread that ends while it is read is left
/// out. Listing `/proc/self/task` opens no file of a thread.
pub fn threads_cpu_ns(except: &[i32]) -> Vec<(i32, u64)> {
    let mut out: Vec<(i32, u64)> = std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| {
            let tid: i32 = t.file_name().to_str()?.parse().ok()?;
            if except.contains(&tid) {
                return None;
            }
            Some((tid, crate::cpu::thread_cpu_ns(tid)?))
        })
        .collect();
    out.sort_unstable();
    out
}

/// The affinity of every thread of process `pid` (any process; those that
/// end while they are read are left out).
pub fn thread_affinities(pid: i32) -> Vec<CpuSet> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| affinity(t.file_name().to_str()?.parse().ok()?).ok())
        .collect()
}

/// The number of threads of this process (`Threads:` of
/// `/proc/self/status`).
pub fn thread_count() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_thread_shows_its_cpu_time_and_every_thread_its_affinity() {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = std::sync::Arc::clone(&stop);
        let (tx, rx) = std::sync::mpsc::channel();
        let busy = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            let mut x = 0u64;
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        });
        let tid = rx.recv().unwrap();
        // SAFETY: gettid has no preconditions.
        let me = unsafe { libc::gettid() };
        assert!(threads_cpu_ns(&[me]).iter().all(|&(t, _)| t != me));
        let cpu = |tid| {
            threads_cpu_ns(&[])
                .into_iter()
                .find(|&(t, _)| t == tid)
                .map(|(_, c)| c)
        };
        let before = cpu(tid).expect("the thread is listed");
        std::thread::sleep(std::time::Duration::from_millis(50));
        let after = cpu(tid).expect("the thread is listed");
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        busy.join().unwrap();
        assert!(after >= before + 1_000_000, "{before} -> {after}");
        // `join` returns once the thread cleared its id, a moment before
        // the kernel takes it off the list.
        let gone = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while cpu(tid).is_some() && std::time::Instant::now() < gone {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(cpu(tid).is_none(), "an ended thread is not listed");
        // SAFETY: gettid has no preconditions.
        assert_eq!(runnable(unsafe { libc::gettid() }), Some(true));
        assert_eq!(runnable(-1), None);
        let mine = thread_affinities(std::process::id() as i32);
        assert!(!mine.is_empty());
        assert!(mine.contains(&affinity(0).unwrap()));
        assert!(thread_affinities(-1).is_empty());
    }

    #[test]
    fn the_processor_field_is_counted_after_the_command_name() {
        let mut fields: Vec<String> = (3..=52).map(|f| f.to_string()).collect();
        fields[39 - 3] = "7".into();
        let line = format!("1234 (a (b) c) {}", fields.join(" "));
        assert_eq!(stat_cpu(&line), Some(7));
        assert_eq!(stat_cpu("1234 (cut short) S 1 2"), None);
    }

    #[test]
    fn this_thread_has_a_cpu_an_affinity_and_a_thread_count() {
        let me = affinity(0).unwrap();
        assert!(me.count() >= 1);
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        let cpu = last_cpu(tid).unwrap();
        assert!(me.has(cpu), "{me:?} lacks {cpu}");
        assert!(thread_count().unwrap() >= 1);
        assert!(run_delay_ns(tid).is_some());
        // Running, it waits for no page; a thread of another process is
        // not read.
        assert_eq!(waits_for_page(tid), Some(false));
        assert_eq!(waits_for_page(1), None);
    }

    /// `may_leave_idle` says what the kernel then does: a thread that took
    /// `SCHED_IDLE` can go back to the normal policy exactly when it is true.
    #[test]
    fn may_leave_idle_predicts_the_kernel() {
        let predicted = may_leave_idle();
        let left = std::thread::spawn(|| {
            set_idle(0, true).expect("any thread may take SCHED_IDLE");
            set_idle(0, false).is_ok()
        })
        .join()
        .unwrap();
        assert_eq!(predicted, left);
    }

    #[test]
    fn a_thread_pinned_to_one_cpu_runs_there_and_can_be_let_go() {
        std::thread::spawn(|| {
            let all = affinity(0).unwrap();
            let cpu = (0..1024).find(|&c| all.has(c)).unwrap();
            set_affinity(0, &CpuSet::one(cpu)).unwrap();
            assert_eq!(affinity(0).unwrap(), CpuSet::one(cpu));
            assert_eq!(
                CpuSet::from_bytes(CpuSet::one(cpu).as_bytes()),
                CpuSet::one(cpu)
            );
            assert_eq!(affinity(0).unwrap().count(), 1);
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            std::thread::yield_now();
            assert_eq!(last_cpu(tid), Some(cpu));
            set_affinity(0, &all).unwrap();
            assert_eq!(affinity(0).unwrap(), all);
        })
        .join()
        .unwrap();
    }
}
