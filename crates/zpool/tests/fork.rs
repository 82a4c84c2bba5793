//! Fork safety of both pools (`Zpool::fork_prepare`, `fork_parent`,
//! `fork_child`): threads allocate, write, verify, free and compact while the
//! main thread forks again and again; each child checks every object the
//! threads had published before the fork, uses the pool, checks its
//! invariants and (zsmalloc) that a background compactor runs in it, then
//! reports to the parent through a pipe and its exit status. Also: a thread
//! parked on a pool lock at the fork, and prepare/parent without a fork.
//!
//! A child never returns into the test harness: it leaves with `_exit`, and
//! an alarm ends it if it ever blocks. Its failures are written to stderr
//! directly (the harness's output capture does not reach the parent).
//!
//! Not under the `shuttle` feature, where the fork methods panic.
#![cfg(not(feature = "shuttle"))]

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use uzswap_zpool::xcf::{XcfConfig, XcfPool};
use uzswap_zpool::{Handle, Zpool, ZsConfig, ZsPool};

/// Seconds after which a child that has not finished is killed (SIGALRM):
/// a child blocked on a lock fails the test instead of hanging it.
const CHILD_ALARM_S: u32 = 60;

/// Forks are made one test at a time: the other tests' threads are not
/// what these tests are about.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// An object a worker allocated: its handle and what it must read as.
#[derive(Copy, Clone, Debug)]
struct Obj {
    h: Handle,
    seed: u64,
    len: usize,
}

/// Deterministic contents for (seed, len).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = SmallRng::seed_from_u64(seed);
    (0..len)
        .map(|i| {
            if i % 5 == 0 {
                r.gen()
            } else {
                (seed as u8) ^ (i as u8) ^ ((i >> 8) as u8)
            }
        })
        .collect()
}

/// Sizes weighted like compressed pages, and a few fixed ones that crowd a
/// few classes (so that frees leave them sparse and compaction has work).
fn size(r: &mut SmallRng) -> usize {
    match r.gen_range(0..10) {
        0..=3 => r.gen_range(1..=4096),
        4..=6 => r.gen_range(64..=1500),
        7 => 200,
        8 => 1000,
        _ => 3000,
    }
}

/// Checks `o` through `read` and `map_read`.
fn verify(pool: &dyn Zpool, o: Obj) -> Result<(), String> {
    let want = pattern(o.seed, o.len);
    let mut buf = vec![0u8; 4096];
    match pool.read(o.h, &mut buf) {
        Ok(n) if n == o.len && buf[..n] == want[..] => {}
        Ok(n) => {
            return Err(format!(
                "{:?}: read {n} bytes, not the {} written",
                o.h, o.len
            ))
        }
        Err(e) => return Err(format!("{:?}: read failed: {e}", o.h)),
    }
    let mut same = false;
    pool.map_read(o.h, &mut |b| same = b == &want[..])
        .map_err(|e| format!("{:?}: map_read failed: {e}", o.h))?;
    if !same {
        return Err(format!("{:?}: map_read shows other bytes", o.h));
    }
    Ok(())
}

/// One worker: random mallocs, reads, rewrites, frees and compactions until
/// `stop`. Its live objects are `live`, which only this worker changes; it
/// never calls the pool while holding `live`'s lock (the forking thread
/// takes that lock before `fork_prepare`). An object leaves `live` before
/// it is freed or rewritten and comes back after, so `live` only ever lists
/// objects that hold what it says. Returns the operations done.
fn worker(pool: &dyn Zpool, seed: u64, live: &Mutex<Vec<Obj>>, stop: &AtomicBool) -> u64 {
    let mut r = SmallRng::seed_from_u64(seed);
    let mut ops = 0;
    while !stop.load(Ordering::Relaxed) {
        ops += 1;
        let n = live.lock().unwrap().len();
        let dice = r.gen_range(0..100);
        if n < 100 || (dice < 40 && n < 2000) {
            let (seed, len) = (r.gen(), size(&mut r));
            let h = pool.malloc_write(&pattern(seed, len)).expect("malloc");
            live.lock().unwrap().push(Obj { h, seed, len });
        } else if dice < 70 {
            let o = live.lock().unwrap()[r.gen_range(0..n)];
            verify(pool, o).unwrap();
        } else if dice < 94 {
            let o = live.lock().unwrap().swap_remove(r.gen_range(0..n));
            assert_eq!(pool.free(o.h).expect("free"), o.len);
        } else if dice < 99 {
            let mut o = live.lock().unwrap().swap_remove(r.gen_range(0..n));
            o.seed = r.gen();
            pool.write(o.h, &pattern(o.seed, o.len)).expect("write");
            live.lock().unwrap().push(o);
        } else {
            pool.compact();
        }
    }
    ops
}

/// Writes `msg` to stderr without std's locks or output capture (a child's
/// report).
fn say(msg: &str) {
    let msg = format!("fork test child: {msg}\n");
    // SAFETY: writes the bytes of a live buffer to fd 2.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
}

/// `fork_prepare`, then [`fork_prepared`].
fn fork_and_check(pool: &dyn Zpool, child: impl FnOnce() -> Result<u64, String>) -> u64 {
    pool.fork_prepare();
    fork_prepared(pool, child)
}

/// After `fork_prepare` on this thread: forks, then `fork_parent` here and
/// `fork_child` plus `child` in the child, which reports the number `child`
/// returns (or its error) through a pipe and its exit status. Returns that
/// number; panics if the child failed.
fn fork_prepared(pool: &dyn Zpool, child: impl FnOnce() -> Result<u64, String>) -> u64 {
    let mut fds = [0i32; 2];
    // SAFETY: fds has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: the child runs only the pool's fork_child and `child` (which
    // use the pool, the heap and std's thread spawning, as a child of a
    // threaded program may with glibc), and leaves through _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: plain system calls on our own descriptor and alarm.
        unsafe {
            libc::alarm(CHILD_ALARM_S);
            libc::close(fds[0]);
        }
        // SAFETY: fork_prepare ran on this thread, the only one here.
        unsafe { pool.fork_child() };
        pool.fork_child_start();
        let code = match catch_unwind(AssertUnwindSafe(child)) {
            Ok(Ok(n)) => {
                let b = n.to_le_bytes();
                // SAFETY: writes 8 bytes of a live buffer to our pipe.
                let w = unsafe { libc::write(fds[1], b.as_ptr().cast(), b.len()) };
                if w == 8 {
                    0
                } else {
                    say("cannot write to the pipe");
                    3
                }
            }
            Ok(Err(msg)) => {
                say(&msg);
                1
            }
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                say(&format!("panicked: {msg}"));
                2
            }
        };
        // SAFETY: ends the child without unwinding into the harness or
        // running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    // SAFETY: fork_prepare ran on this thread; this is the parent.
    unsafe { pool.fork_parent() };
    assert!(pid > 0, "fork failed");
    // SAFETY: our descriptor; the child has its own copy.
    unsafe { libc::close(fds[1]) };
    let mut b = [0u8; 8];
    let mut got = 0;
    while got < 8 {
        // SAFETY: reads into the rest of a live buffer from our pipe.
        let r = unsafe { libc::read(fds[0], b[got..].as_mut_ptr().cast(), 8 - got) };
        if r <= 0 {
            break;
        }
        got += r as usize;
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(fds[0]) };
    let mut status = 0;
    // SAFETY: pid is our child; status is a valid out-pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child failed (status {status:#x}{}; its stderr says why)",
        if libc::WIFSIGNALED(status) {
            format!(", killed by signal {}", libc::WTERMSIG(status))
        } else {
            String::new()
        }
    );
    assert_eq!(got, 8, "the child exited 0 without reporting");
    u64::from_le_bytes(b)
}

/// Threads named `name` in this process (from /proc/self/task/*/comm),
/// once there are `want` of them or 5 s passed: a new thread names itself
/// as it starts, after its creator went on.
fn threads_named(name: &str, want: usize) -> usize {
    let t0 = Instant::now();
    loop {
        let n = std::fs::read_dir("/proc/self/task")
            .expect("/proc/self/task")
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|c| c.trim_end() == name)
            .count();
        if n == want || t0.elapsed() > Duration::from_secs(5) {
            return n;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Frees most objects of one class, without calling `compact()`, and waits
/// for the pool's compaction counter to move: only the background compactor
/// can move it.
fn background_compaction_runs(pool: &dyn Zpool) -> Result<(), String> {
    let before = pool.stats().compactions;
    let data = pattern(7, 300);
    let hs: Vec<Handle> = (0..6000)
        .map(|_| pool.malloc_write(&data))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("malloc: {e}"))?;
    for (i, &h) in hs.iter().enumerate() {
        if i % 8 != 0 {
            pool.free(h).map_err(|e| format!("free: {e}"))?;
        }
    }
    let t0 = Instant::now();
    while pool.stats().compactions == before {
        if t0.elapsed() > Duration::from_secs(20) {
            return Err(format!(
                "no background compaction within 20 s of freeing 7/8 of a class (stats: {:?})",
                pool.stats().extra
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    for (i, &h) in hs.iter().enumerate() {
        if i % 8 == 0 {
            let mut same = false;
            pool.map_read(h, &mut |b| same = b == &data[..])
                .map_err(|e| format!("map_read: {e}"))?;
            if !same {
                return Err("an object moved by the compactor changed".into());
            }
            pool.free(h).map_err(|e| format!("free: {e}"))?;
        }
    }
    Ok(())
}

/// What a child does with the pool: verifies the objects published before
/// the fork, churns, checks the compactor (if `compactor`), compacts,
/// verifies again and checks the invariants. Returns the objects of the
/// snapshot it verified.
fn child_work(pool: &dyn Zpool, snapshot: &[Obj], compactor: bool) -> Result<u64, String> {
    for &o in snapshot {
        verify(pool, o)?;
    }
    pool.check_invariants()
        .map_err(|e| format!("after the fork: {e}"))?;
    let mut r = SmallRng::seed_from_u64(snapshot.len() as u64);
    let mut mine: Vec<Obj> = Vec::new();
    for _ in 0..3000 {
        if mine.is_empty() || r.gen_range(0..3) > 0 {
            let (seed, len) = (r.gen(), size(&mut r));
            let h = pool
                .malloc_write(&pattern(seed, len))
                .map_err(|e| format!("malloc: {e}"))?;
            mine.push(Obj { h, seed, len });
        } else {
            let o = mine.swap_remove(r.gen_range(0..mine.len()));
            verify(pool, o)?;
            pool.free(o.h).map_err(|e| format!("free: {e}"))?;
        }
    }
    if compactor {
        let n = threads_named("zs-compact", 1);
        if n != 1 {
            return Err(format!("{n} compactor threads in the child, not 1"));
        }
        background_compaction_runs(pool)?;
    }
    pool.compact();
    for &o in snapshot.iter().chain(&mine) {
        verify(pool, o)?;
    }
    for o in mine {
        pool.free(o.h).map_err(|e| format!("free: {e}"))?;
    }
    pool.check_invariants()
        .map_err(|e| format!("at the end: {e}"))?;
    Ok(snapshot.len() as u64)
}

/// How many times `thread_start` ran in this process.
static HOOK_RUNS: AtomicUsize = AtomicUsize::new(0);

fn hook() {
    HOOK_RUNS.fetch_add(1, Ordering::SeqCst);
}

/// Three workers run while the main thread forks 20 times; then the
/// workers' objects are verified and the invariants checked.
fn forks_while_threads_work(pool: &dyn Zpool, compactor: bool) {
    const WORKERS: usize = 3;
    const FORKS: usize = 20;
    let lives: Vec<Mutex<Vec<Obj>>> = (0..WORKERS).map(|_| Mutex::new(Vec::new())).collect();
    let stop = AtomicBool::new(false);
    let t0 = Instant::now();
    let (ops, verified) = std::thread::scope(|s| {
        let ts: Vec<_> = lives
            .iter()
            .enumerate()
            .map(|(i, live)| {
                let stop = &stop;
                s.spawn(move || worker(pool, 1000 + i as u64, live, stop))
            })
            .collect();
        let mut verified = 0;
        for _ in 0..FORKS {
            std::thread::sleep(Duration::from_millis(30));
            // The workers' lists, locked before the pool (a worker never
            // calls the pool holding its list): consistent in the child.
            let guards: Vec<_> = lives.iter().map(|l| l.lock().unwrap()).collect();
            let snapshot: Vec<Obj> = guards.iter().flat_map(|g| g.iter().copied()).collect();
            let hooks = HOOK_RUNS.load(Ordering::SeqCst);
            let n = fork_and_check(pool, || {
                if compactor && HOOK_RUNS.load(Ordering::SeqCst) != hooks + 1 {
                    return Err("thread_start did not run on the child's compactor".into());
                }
                child_work(pool, &snapshot, compactor)
            });
            drop(guards);
            assert!(n > 0, "the child verified no object");
            assert_eq!(
                n,
                snapshot.len() as u64,
                "the child verified part of the snapshot"
            );
            verified += n;
        }
        stop.store(true, Ordering::Relaxed);
        let ops: u64 = ts.into_iter().map(|t| t.join().expect("worker")).sum();
        (ops, verified)
    });
    let all: Vec<Obj> = lives
        .into_iter()
        .flat_map(|l| l.into_inner().unwrap())
        .collect();
    for &o in &all {
        verify(pool, o).unwrap();
    }
    pool.check_invariants().unwrap();
    if compactor {
        background_compaction_runs(pool).unwrap();
    }
    for o in all {
        pool.free(o.h).unwrap();
    }
    pool.check_invariants().unwrap();
    eprintln!(
        "{}: {FORKS} forks, {verified} objects verified in children, {ops} worker operations, {:?}",
        pool.name(),
        t0.elapsed()
    );
}

#[test]
fn zsmalloc_forks_while_threads_work_and_the_child_pool_works() {
    let _s = serial();
    let pool = ZsPool::new(ZsConfig {
        compact_watermark_percent: Some(10),
        shards: Some(2),
        thread_start: Some(hook),
        ..ZsConfig::default()
    })
    .unwrap();
    assert_eq!(HOOK_RUNS.load(Ordering::SeqCst), 1);
    forks_while_threads_work(&pool, true);
}

#[test]
fn xcf_forks_while_threads_work_and_the_child_pool_works() {
    let _s = serial();
    let pool = XcfPool::new(XcfConfig::default()).unwrap();
    forks_while_threads_work(&pool, false);
}

/// A thread waiting for a pool lock at the fork is counted in that lock's
/// word in the child's copy; releasing the lock there must leave it free
/// for the child (not handed to, nor waiting for, a thread that does not
/// exist there). One shard, so the child takes the very lock the thread
/// waits for; the thread sleeps on it well before the fork.
fn parked_waiter_at_the_fork(pool: &dyn Zpool, compactor: bool) {
    let h = pool.malloc_write(&pattern(1, 100)).unwrap();
    pool.fork_prepare();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            let h = pool.malloc_write(&pattern(2, 100)).unwrap();
            done.store(true, Ordering::SeqCst);
            h
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !done.load(Ordering::SeqCst),
            "a malloc went through while fork_prepare held the locks"
        );
        let n = fork_prepared(pool, || {
            let h2 = pool
                .malloc_write(&pattern(3, 100))
                .map_err(|e| e.to_string())?;
            verify(
                pool,
                Obj {
                    h,
                    seed: 1,
                    len: 100,
                },
            )?;
            verify(
                pool,
                Obj {
                    h: h2,
                    seed: 3,
                    len: 100,
                },
            )?;
            pool.free(h2).map_err(|e| e.to_string())?;
            if compactor && threads_named("zs-compact", 1) != 1 {
                return Err("no compactor thread in the child".into());
            }
            pool.check_invariants()?;
            Ok(2)
        });
        assert_eq!(n, 2);
        let h2 = t.join().unwrap();
        verify(
            pool,
            Obj {
                h: h2,
                seed: 2,
                len: 100,
            },
        )
        .unwrap();
        pool.free(h2).unwrap();
    });
    verify(
        pool,
        Obj {
            h,
            seed: 1,
            len: 100,
        },
    )
    .unwrap();
    pool.free(h).unwrap();
    pool.check_invariants().unwrap();
}

#[test]
fn a_thread_parked_on_a_pool_lock_at_the_fork_does_not_block_the_child() {
    let _s = serial();
    let zs = ZsPool::new(ZsConfig {
        shards: Some(1),
        ..ZsConfig::default()
    })
    .unwrap();
    parked_waiter_at_the_fork(&zs, true);
    let xcf = XcfPool::new(XcfConfig {
        shards: 1,
        ..XcfConfig::default()
    })
    .unwrap();
    parked_waiter_at_the_fork(&xcf, false);
}

/// `fork_prepare` holds the locks (a malloc waits) and `fork_parent`
/// releases them all: the pool works afterwards, zsmalloc's compactor too.
#[test]
fn prepare_then_parent_without_a_fork_leaves_the_pool_working() {
    let _s = serial();
    let zs = ZsPool::new(ZsConfig::default()).unwrap();
    let xcf = XcfPool::new(XcfConfig::default()).unwrap();
    for (pool, compactor) in [(&zs as &dyn Zpool, true), (&xcf, false)] {
        let mut r = SmallRng::seed_from_u64(5);
        let mut objs: Vec<Obj> = (0..2000)
            .map(|_| {
                let (seed, len) = (r.gen(), size(&mut r));
                let h = pool.malloc_write(&pattern(seed, len)).unwrap();
                Obj { h, seed, len }
            })
            .collect();
        for o in objs.drain(1000..) {
            pool.free(o.h).unwrap();
        }
        for round in 0..3 {
            pool.fork_prepare();
            let done = AtomicBool::new(false);
            std::thread::scope(|s| {
                let t = s.spawn(|| {
                    let h = pool.malloc_write(&pattern(9, 500)).unwrap();
                    done.store(true, Ordering::SeqCst);
                    h
                });
                std::thread::sleep(Duration::from_millis(50));
                assert!(
                    !done.load(Ordering::SeqCst),
                    "{}: a malloc went through while fork_prepare held the locks",
                    pool.name()
                );
                // SAFETY: fork_prepare ran on this thread, and there was no
                // fork: this is the parent.
                unsafe { pool.fork_parent() };
                let h = t.join().unwrap();
                objs.push(Obj {
                    h,
                    seed: 9,
                    len: 500,
                });
            });
            // Several threads at once, each in its own objects.
            std::thread::scope(|s| {
                for i in 0..3u64 {
                    s.spawn(move || {
                        let mut r = SmallRng::seed_from_u64(round * 10 + i);
                        let mut mine = Vec::new();
                        for _ in 0..2000 {
                            let (seed, len) = (r.gen(), size(&mut r));
                            let h = pool.malloc_write(&pattern(seed, len)).unwrap();
                            mine.push(Obj { h, seed, len });
                            if r.gen_range(0..3) == 0 {
                                let o = mine.swap_remove(r.gen_range(0..mine.len()));
                                verify(pool, o).unwrap();
                                pool.free(o.h).unwrap();
                            }
                        }
                        pool.compact();
                        for o in mine {
                            verify(pool, o).unwrap();
                            pool.free(o.h).unwrap();
                        }
                    });
                }
            });
            pool.check_invariants().unwrap();
        }
        if compactor {
            background_compaction_runs(pool).unwrap();
        }
        for o in objs {
            verify(pool, o).unwrap();
            pool.free(o.h).unwrap();
        }
        pool.check_invariants().unwrap();
    }
}

/// A child may drop its pool: that stops and joins the child's compactor,
/// never the parent's (whose handle names a thread the child lacks).
#[test]
fn a_child_drops_its_pool() {
    let _s = serial();
    let pool = ZsPool::new(ZsConfig::default()).unwrap();
    let o = Obj {
        h: pool.malloc_write(&pattern(4, 700)).unwrap(),
        seed: 4,
        len: 700,
    };
    pool.fork_prepare();
    // SAFETY: the child uses the pool and leaves through _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: alarm has no preconditions.
        unsafe { libc::alarm(CHILD_ALARM_S) };
        // SAFETY: fork_prepare ran on this thread, alone here.
        unsafe { pool.fork_child() };
        pool.fork_child_start();
        let ok = verify(&pool, o).is_ok() && threads_named("zs-compact", 1) == 1;
        drop(pool);
        let code = if ok && threads_named("zs-compact", 0) == 0 {
            0
        } else {
            say("the object, or the compactor thread before and after the drop, was wrong");
            1
        };
        // SAFETY: ends the child without returning into the harness.
        unsafe { libc::_exit(code) };
    }
    // SAFETY: fork_prepare ran on this thread; this is the parent.
    unsafe { pool.fork_parent() };
    assert!(pid > 0, "fork failed");
    let mut status = 0;
    // SAFETY: pid is our child; status is a valid out-pointer.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child failed or blocked (status {status:#x})"
    );
    verify(&pool, o).unwrap();
    pool.free(o.h).unwrap();
}
