//! `uzswap run -- PROG`: an unmodified program under a resident budget.
//!
//! Everything that can be checked is checked before the program starts
//! (it exists and is executable, it is dynamically linked and not setuid,
//! the preload library is there, userfaultfd is usable); then the program
//! runs with `crates/preload` in `LD_PRELOAD` (the copy this binary
//! carries, from a memory file of this process: `preload.rs`; or the file
//! `--preload-lib` names) and its settings in
//! `UZSWAP_*` variables (a `uzswap_contract::RunConfig`, validated here
//! first), and this process waits, passes its exit status on (a signal `N`
//! becomes `128 + N`, as shells do) and prints a summary of the final
//! statistics the program's runtime wrote (a `uzswap_contract::Snapshot`).

mod args;
mod elf;
mod summary;

pub use args::Args;
pub use summary::summary;

use crate::human;
use anyhow::{bail, Context, Result};
use args::run_config;
use elf::{check_program, resolve};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use uzswap_contract::{final_stats_path, names, BackingTier, RunConfig, Snapshot};

/// The child's pid, for the signal forwarder.
static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// How the program ended, as the kernel told us.
pub struct Outcome {
    /// The status to exit with (128 + N for signal N).
    pub code: i32,
    pub signal: Option<i32>,
    pub seconds: f64,
    /// What the arbiter saw of the whole tree.
    pub tree: crate::arbiter::TreeReport,
    /// The final statistics its runtime wrote.
    pub stats: FinalStats,
}

/// The final statistics of a run.
pub enum FinalStats {
    /// What the program's runtime wrote at exit.
    Read(Box<Snapshot>),
    /// Nothing was written: the program ended without running its exit
    /// handlers.
    Missing,
    /// Something was written that is not a snapshot of this build's schema
    /// (or could not be read): why.
    Unreadable(String),
}

/// Runs the program of `a` to its end: everything checked first, then the
/// program started under the preload library with the arbiter watching its
/// tree, waited for, and its final statistics read (and written to
/// `--stats-json`).
pub fn run(a: &Args) -> Result<Outcome> {
    let mut config = run_config(a)?;
    let Some(prog) = a.prog.first() else {
        bail!("no program given: uzswap run --memory-max SIZE -- PROG [ARGS...]");
    };
    let path = resolve(prog)?;
    check_program(&path)?;
    // Held until the program ends: the tree opens it by this process's
    // descriptor (preload.rs).
    let lib = crate::preload::find(a.preload_lib.as_deref())?;
    check_machine(a, &mut config)?;
    let metrics = a.metrics.as_deref().map(crate::serve::bind).transpose()?;
    let tmp = temp_dir()?;
    let final_base = tmp.path().join("stats.json");
    config.final_stats = Some(final_base.clone());
    let mut watch = crate::arbiter::Watch::create(a.memory_max)
        .context("cannot make the ledger the program's processes share their budget in")?;
    config.ledger = Some(watch.path().to_owned());

    let mut cmd = command(a, &path, &config, &lib);
    forward_signals();
    let recording = a.record.as_deref().map(|p| recording(a, p)).transpose()?;
    let started = std::time::Instant::now();
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start {}", path.display()))?;
    let pid = child.id() as i32;
    CHILD.store(pid, Ordering::Relaxed);
    watch.start(pid as u32, a.quiet, recording, config.backing.clone())?;
    let endpoint = serve_metrics(a, metrics)?;
    if !a.quiet {
        announce(a, pid, &config);
    }
    let status = wait_for(pid)?;
    CHILD.store(0, Ordering::Relaxed);
    drop(endpoint);
    // The program is gone; a process it left behind that execs now runs
    // unmanaged (preload.rs).
    drop(lib);
    let tree = watch.finish();
    crate::remote::sweep(&config);
    let seconds = started.elapsed().as_secs_f64();
    let (code, signal) = if libc::WIFSIGNALED(status) {
        let s = libc::WTERMSIG(status);
        (128 + s, Some(s))
    } else {
        (libc::WEXITSTATUS(status), None)
    };
    // The runtime appends its pid (every exec'd image writes its own), so
    // the program's own file is read.
    let stats = read_final(&final_stats_path(&final_base, pid as u32));
    report_stats(a, &tree, &stats)?;
    Ok(Outcome {
        code,
        signal,
        seconds,
        tree,
        stats,
    })
}

/// The checks of the machine before the program starts: userfaultfd is
/// usable, the Redis server answers (and the run's key prefix is made),
/// a backing file can be made and written where it is asked for (each
/// runtime makes its own there), and the recording's path exists.
fn check_machine(a: &Args, config: &mut RunConfig) -> Result<()> {
    uzswap_region::sys::Uffd::open(0, None).context("the program's pages could not be managed")?;
    if let Some(BackingTier::Redis(url)) = &config.backing {
        // The runtime connects again in the program; refused here, the
        // program never starts.
        uzswap_remote::RedisBacking::connect(url).context("--backing")?;
        config.remote_prefix = Some(uzswap_remote::run_prefix()?);
    }
    if let Some(BackingTier::File(b)) = &config.backing {
        let dir = if b.is_dir() {
            b.as_path()
        } else {
            b.parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
        };
        if !dir.is_dir() {
            bail!(
                "--backing-file {}: directory {} does not exist",
                b.display(),
                dir.display()
            );
        }
        try_backing_file(b)?;
    }
    if let Some(r) = &a.record {
        crate::record::check_path(r)?;
    }
    Ok(())
}

/// Makes a backing file at `b` as a runtime will (unlinked at once) and
/// writes one slot to it: a directory where no file can be made or
/// written (`/proc`, a read-only or full filesystem) is refused here,
/// before the program starts, rather than by every runtime of the tree.
fn try_backing_file(b: &Path) -> Result<()> {
    use uzswap_cache::backing::{BackingStore, FileBacking};
    let page = vec![0u8; uzswap_os::PAGE_SIZE];
    FileBacking::create(b)
        .and_then(|f| f.write_slots(0, &[&page]))
        .map_err(|e| {
            anyhow::anyhow!(
                "--backing-file {}: cannot make and write a backing file there ({e}): name a \
                 directory on a writable filesystem with room, or run with --no-backing-file",
                b.display()
            )
        })
}

/// The program's command: `lib` first in `LD_PRELOAD`, the runtime's
/// variables those of `config` alone, and in the child before exec the
/// default signal dispositions restored and the band of descriptor numbers
/// above the soft limit reserved for the runtime's own
/// (`uzswap_os::fdguard::reserve_band`: where the hard limit equals the
/// soft one, the program sees a soft limit `BAND` lower).
fn command(
    a: &Args,
    path: &Path,
    config: &RunConfig,
    lib: &crate::preload::Library,
) -> std::process::Command {
    let mut preload = lib.path().as_os_str().to_owned();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = std::process::Command::new(path);
    cmd.arg0(&a.prog[0])
        .args(&a.prog[1..])
        .env("LD_PRELOAD", preload);
    // Every variable the runtime reads is removed first: a value inherited
    // from our own environment must not reach it as if asked for.
    for name in names::ALL {
        cmd.env_remove(name);
    }
    cmd.envs(config.to_env());
    // SAFETY: restores default dispositions and sets a resource limit in
    // the child before exec (signal(2), getrlimit(2) and setrlimit(2) are
    // async-signal-safe; nothing allocates).
    unsafe {
        cmd.pre_exec(|| {
            for s in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(s, libc::SIG_DFL);
            }
            let _ = uzswap_os::fdguard::reserve_band();
            Ok(())
        });
    }
    cmd
}

/// The terminal's ^C and ^\ reach the program directly; this process
/// waits for it to finish. Termination requests are passed on
/// ([`forward`]).
fn forward_signals() {
    // SAFETY: installing handlers that only call kill(2), and ignoring
    // two signals in this (single-threaded) supervisor.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, forward as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, forward as *const () as libc::sighandler_t);
    }
}

/// Starts `--metrics`' endpoint on the server bound before the program
/// started, and says where it is.
fn serve_metrics(
    a: &Args,
    metrics: Option<tiny_http::Server>,
) -> Result<Option<crate::serve::Endpoint>> {
    let Some(server) = metrics else {
        return Ok(None);
    };
    if !a.quiet {
        crate::note(&format!(
            "uzswap: metrics at {}",
            crate::serve::url(&server)
        ));
    }
    Ok(Some(crate::serve::Endpoint::start(server)?))
}

/// The line that says what runs, with which settings, and how to watch it.
fn announce(a: &Args, pid: i32, config: &RunConfig) {
    crate::note(&format!(
        "uzswap: running {} as pid {pid}: memory max {} for the whole program, {}, {}{}, backing {}; `uzswap stats {pid}` shows it live",
        a.prog[0].to_string_lossy(),
        human(a.memory_max),
        a.pool_max.map_or("pools inside each process's share".into(), |m| {
            format!("pool max {} per process", human(m))
        }),
        a.compressor,
        a.cold_compressor
            .map_or(String::new(), |c| format!(" (cold pages {c})")),
        config
            .backing
            .as_ref()
            .map_or("none".into(), |b| b.to_string()),
    ));
}

/// Writes `--stats-json` (the program's final statistics and the tree's
/// beside them, or the tree's alone where the program wrote none); with
/// `--quiet`, says on stderr why the final statistics are unreadable.
fn report_stats(a: &Args, tree: &crate::arbiter::TreeReport, stats: &FinalStats) -> Result<()> {
    match (&a.stats_json, stats) {
        (Some(dest), FinalStats::Read(s)) => {
            // The program's own statistics, and the tree's beside them.
            let mut v: serde_json::Value =
                serde_json::from_str(&s.to_json().context("cannot encode the final statistics")?)?;
            v["tree"] = serde_json::to_value(tree)?;
            write_stats_json(dest, &v)?;
        }
        (Some(dest), FinalStats::Missing) => {
            // The program ended without its exit handlers (Go's runtime
            // exits so): the tree's figures, from each process's last
            // report, are all there is.
            let v = serde_json::json!({
                "final_statistics_missing": MISSING_WHY,
                "tree": serde_json::to_value(tree)?,
            });
            write_stats_json(dest, &v)?;
        }
        // Without a summary, the error must still be told.
        (_, FinalStats::Unreadable(why)) if a.quiet => eprintln!("uzswap: error: {why}"),
        _ => {}
    }
    Ok(())
}

/// The recording `--record` asks for: its file made and its writer
/// started, the header to be written first.
fn recording(a: &Args, path: &Path) -> Result<crate::arbiter::Recording> {
    let sample = crate::arbiter::SAMPLE.as_millis() as u64;
    let asked = a.record_interval.map_or(sample, |d| d.as_millis() as u64);
    let every = ((asked + sample / 2) / sample).max(1);
    let header = crate::record::Header {
        kind: crate::record::KIND.into(),
        format: crate::record::FORMAT,
        uzswap_version: env!("CARGO_PKG_VERSION").into(),
        command: a
            .prog
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect(),
        budget_bytes: a.memory_max,
        started_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        interval_ms: every * sample,
    };
    Ok(crate::arbiter::Recording {
        recorder: crate::record::Recorder::create(path, header)?,
        every,
    })
}

/// Writes `--stats-json`.
fn write_stats_json(dest: &Path, v: &serde_json::Value) -> Result<()> {
    let body = serde_json::to_string_pretty(v)?;
    std::fs::write(dest, body + "\n").with_context(|| {
        format!(
            "cannot write --stats-json {}: check the path",
            dest.display()
        )
    })
}

/// Why a run has no final statistics of the program's own.
const MISSING_WHY: &str = "the program ended without running its exit handlers (a signal, \
                           _exit, or exec; Go programs always exit so)";

/// The final statistics in `path`.
fn read_final(path: &Path) -> FinalStats {
    let what = "the final statistics the program's runtime wrote";
    match std::fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => FinalStats::Missing,
        Err(e) => FinalStats::Unreadable(format!("cannot read {what}: {e}")),
        Ok(body) => match Snapshot::from_json(&body) {
            Ok(s) => FinalStats::Read(Box::new(s)),
            Err(e) => FinalStats::Unreadable(format!("cannot read {what}: {e}")),
        },
    }
}

/// Waits for the program (our child) and returns its wait status.
fn wait_for(pid: i32) -> Result<i32> {
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child; the status pointer is valid.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Ok(status);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e).context("waiting for the program");
        }
    }
}

/// A private directory (0700) in `$TMPDIR` for the final statistics, removed when dropped.
fn temp_dir() -> Result<tempfile::TempDir> {
    let base = std::env::temp_dir();
    tempfile::Builder::new()
        .prefix("uzswap-run.")
        .tempdir_in(&base)
        .with_context(|| format!("cannot make a directory in {} (set TMPDIR)", base.display()))
}
