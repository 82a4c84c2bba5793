//! Statistics of a managed program: a JSON snapshot served on an abstract
//! unix socket (`uzswap stats PID` reads it) and written to a file at exit
//! (`uzswap run` prints its summary from it).

use crate::Runtime;
use serde_json::{json, Value};
use std::io::Write;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::PathBuf;

/// What the program was started with.
pub struct RunConfig {
    pub memory_max: usize,
    pub pool_max: Option<usize>,
    pub compressor: String,
    pub cold_compressor: Option<String>,
    pub backing: Option<String>,
    pub keep_clean: bool,
    pub cpu_handlers: bool,
    pub dedup: bool,
    pub final_stats: Option<PathBuf>,
}

/// The abstract socket of process `pid`. `uzswap stats` (crates/cli,
/// `stats.rs`) connects to the same name.
pub fn socket_name(pid: u32) -> String {
    format!("uzswap-stats.{pid}")
}

/// The runtime's own heap (glibc's, which serves the cache index, the
/// pager's tables and every other allocation of the runtime): bytes in use
/// and bytes glibc holds from the OS for it.
fn runtime_heap() -> Value {
    let (in_use, held) = runtime_heap_bytes();
    json!({
        "in_use_bytes": in_use,
        "held_bytes": held,
    })
}

/// `(in use, held)` bytes of the runtime's heap. What glibc holds is what
/// the budget pays for (`PagerConfig::charge`): the pool's pages are mapped
/// apart and capped by `--pool-max` instead.
pub fn runtime_heap_bytes() -> (u64, u64) {
    // SAFETY: mallinfo2 only reads the allocator's counters.
    let m = unsafe { libc::mallinfo2() };
    ((m.uordblks + m.hblkhd) as u64, (m.arena + m.hblkhd) as u64)
}

/// Everything the runtime can report, as one JSON object.
pub fn snapshot(rt: &Runtime) -> Value {
    let pager = rt.space.pager().stats();
    let mut pager_v = serde_json::to_value(&pager).unwrap_or(Value::Null);
    if let Some(o) = pager_v.as_object_mut() {
        o.remove("store"); // the cache's counters follow in full
    }
    let cache = rt.cache.stats();
    let cache_v: serde_json::Map<String, Value> = cache
        .pairs()
        .into_iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let pool = rt.cache.pool_stats();
    json!({
        "version": 1,
        "pid": std::process::id(),
        "uptime_s": rt.started.elapsed().as_secs_f64(),
        "config": {
            "memory_max": rt.config.memory_max,
            "pool_max": rt.config.pool_max,
            "compressor": rt.config.compressor,
            "cold_compressor": rt.config.cold_compressor,
            "backing": rt.config.backing,
            "keep_clean": rt.config.keep_clean,
            "cpu_handlers": rt.config.cpu_handlers,
            "dedup": rt.config.dedup,
        },
        "pager": pager_v,
        "cache": cache_v,
        "space": rt.space.stats(),
        "runtime_heap": runtime_heap(),
        "pool": pool.to_json(),
        "pool_table": pool.table(),
    })
}

/// Starts the thread that answers `uzswap stats`.
pub fn serve(thread_start: fn()) -> std::io::Result<()> {
    let addr = SocketAddr::from_abstract_name(socket_name(std::process::id()))?;
    let listener = UnixListener::bind_addr(&addr)?;
    uzswap_cache::spawn_helper("uzswap-stats", Some(thread_start), move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            if !same_user(&conn) {
                continue;
            }
            if let Some(rt) = crate::RUNTIME.get() {
                let mut body = snapshot(rt).to_string();
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
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of the length given.
    let r = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    // SAFETY: geteuid cannot fail.
    r == 0 && (cred.uid == 0 || cred.uid == unsafe { libc::geteuid() })
}

/// The file the final snapshot of process `pid` goes to, given
/// `UZSWAP_FINAL_STATS` (every managed process of a tree writes its own;
/// `uzswap run` reads its child's).
pub fn final_stats_path(base: &std::path::Path, pid: u32) -> PathBuf {
    let mut p = base.as_os_str().to_owned();
    p.push(format!(".{pid}"));
    PathBuf::from(p)
}

/// Writes the final snapshot where `uzswap run` expects it (atomically:
/// a temporary file renamed into place).
pub fn write_final(rt: &Runtime) {
    let Some(base) = &rt.config.final_stats else {
        return;
    };
    let path = &final_stats_path(base, std::process::id());
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let body = snapshot(rt).to_string();
    if std::fs::write(&tmp, body)
        .and_then(|_| std::fs::rename(&tmp, path))
        .is_err()
    {
        crate::sys::warn(&format!(
            "cannot write the statistics to {}",
            path.display()
        ));
    }
}
