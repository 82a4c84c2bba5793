//! Statistics of a managed program: a [`Snapshot`] (the schema is
//! `uzswap-contract`'s) served as JSON on an abstract unix socket (`uzswap
//! stats PID` reads it) and written to a file at exit (`uzswap run` prints
//! its summary from it).

use crate::Runtime;
use std::io::Write;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use uzswap_contract::{final_stats_path, socket_name, PoolSection, RuntimeHeap, Snapshot};

/// The runtime's own heap (glibc's, which serves the cache index, the
/// pager's tables and every other allocation of the runtime). What glibc
/// holds is what the budget pays for (`PagerConfig::charge`): the pool's
/// pages are mapped apart and capped by `--pool-max` instead.
pub fn runtime_heap() -> RuntimeHeap {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let m = unsafe { libc::mallinfo2() };
    RuntimeHeap {
        in_use_bytes: (m.uordblks + m.hblkhd) as u64,
        held_bytes: (m.arena + m.hblkhd) as u64,
    }
}

/// Everything the runtime can report (the schema is the contract's).
pub fn snapshot(rt: &Runtime) -> Snapshot {
    let pool = rt.cache.pool_stats();
    Snapshot {
        version: uzswap_contract::SCHEMA_VERSION,
        pid: std::process::id(),
        uptime_s: rt.started.elapsed().as_secs_f64(),
        config: rt.config.clone(),
        pager: rt.space.pager().stats(),
        cache: rt.cache.stats(),
        space: rt.space.stats(),
        runtime_heap: runtime_heap(),
        cosched: crate::cosched::stats(),
        pool: PoolSection::from(&pool),
        pool_table: pool.table(),
    }
}

/// Starts the thread that answers `uzswap stats`.
pub fn serve(thread_start: fn()) -> std::io::Result<()> {
    let addr = SocketAddr::from_abstract_name(socket_name(std::process::id()))?;
    let listener = UnixListener::bind_addr(&addr)?;
    // Guarded (`uzswap_os::fdguard`): a program that closes descriptors it
    // did not open leaves it. The thread never ends, nor does the mark.
    let (mark, listener) = uzswap_os::fdguard::guard(listener);
    // Non-blocking: the thread waits in `wait_readable`, never in `accept`
    // (see there), and a wake with no connection left goes back to wait.
    listener.set_nonblocking(true)?;
    uzswap_os::spawn_helper("uzswap-stats", Some(thread_start), move || {
        let _mark = mark;
        loop {
            if !crate::sys::wait_readable(listener.as_raw_fd()) {
                return;
            }
            let mut conn = match listener.accept() {
                Ok((c, _)) => c,
                // Gone after all (closed by a raw system call): no
                // statistics from here on, rather than a busy loop.
                Err(e) if e.raw_os_error() == Some(libc::EBADF) => return,
                Err(_) => continue,
            };
            // The answer is written whole or not at all, as before the
            // listener was non-blocking (an accepted socket inherits no
            // O_NONBLOCK on Linux, but say so).
            if conn.set_nonblocking(false).is_err() {
                continue;
            }
            if !same_user(&conn) {
                continue;
            }
            if let Some(rt) = crate::RUNTIME.get() {
                let Ok(mut body) = snapshot(rt).to_json() else {
                    continue;
                };
                body.push('\n');
                let _ = conn.write_all(body.as_bytes());
            }
        }
    })?;
    Ok(())
}

/// Only our own user (or root) may read the statistics: abstract sockets
/// have no file permissions.
fn same_user(conn: &UnixStream) -> bool {
    crate::sys::peer_is_same_user(conn.as_raw_fd())
}

/// Writes the final snapshot where `uzswap run` expects it (atomically:
/// a temporary file renamed into place).
pub fn write_final(rt: &Runtime) {
    let Some(base) = &rt.config.final_stats else {
        return;
    };
    // In a tree, `uzswap run` reads its program's file and the ledger for
    // the rest; a descendant's file would have no reader, and one that
    // outlives the program would find the directory gone.
    if rt.share.as_ref().is_some_and(|s| !s.is_root()) {
        return;
    }
    let path = &final_stats_path(base, std::process::id());
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let written = snapshot(rt)
        .to_json()
        .map_err(std::io::Error::other)
        .and_then(|body| std::fs::write(&tmp, body))
        .and_then(|_| std::fs::rename(&tmp, path));
    if written.is_err() {
        crate::sys::warn(&format!(
            "cannot write the statistics to {}",
            path.display()
        ));
    }
}
