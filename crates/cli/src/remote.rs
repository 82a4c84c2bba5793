//! `uzswap run --backing redis://...` after the program: the keys its
//! processes left on the server. Each process deletes its own at exit, but
//! one that exec'd (its runtime gone without an exit) or was killed could
//! not; every key of the run starts with the run's prefix
//! (`RunConfig::remote_prefix`), so one sweep finds them.

use uzswap_contract::{names, BackingTier, RunConfig};

/// Deletes the keys under the run's prefix, unless a process still runs
/// with it (a daemon the program left behind still loads its pages).
pub fn sweep(config: &RunConfig) {
    let (Some(BackingTier::Redis(url)), Some(prefix)) = (&config.backing, &config.remote_prefix)
    else {
        return;
    };
    if prefix_in_use(prefix) {
        crate::note(&format!(
            "processes of the program still run: their pages stay on {url} (keys {prefix}:*, deleted as they exit, or expiring within 24 hours)"
        ));
        return;
    }
    match uzswap_remote::sweep(url, prefix, std::time::Duration::from_secs(5)) {
        Ok(0) => {}
        Ok(n) => crate::note(&format!(
            "deleted {n} keys the program's processes left on {url} (processes that exec'd or were killed)"
        )),
        Err(e) => crate::note(&format!(
            "cannot delete the keys left under {prefix}:* on {url}: {e}; they expire within 24 hours"
        )),
    }
}

/// Whether a live process was started with this run's prefix in its
/// environment (`/proc/PID/environ`, as it was at its last exec).
fn prefix_in_use(prefix: &str) -> bool {
    let needle = format!("{}={prefix}", names::REMOTE_PREFIX);
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return false;
    };
    dir.flatten().any(|e| {
        std::fs::read(e.path().join("environ"))
            .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == needle.as_bytes()))
    })
}
