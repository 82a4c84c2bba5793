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

use crate::human;
use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use uzswap_contract::{final_stats_path, names, BackingTier, RunConfig, Snapshot};

/// What `uzswap run` was asked to do.
#[derive(clap::Args)]
pub struct Args {
    /// The memory of the whole program, bytes or with K, M, G: every
    /// process it starts, together, holds at most this much of resident
    /// heap and anonymous memory, compressed pools and uzswap's own
    /// bookkeeping (as a memory cgroup's limit holds a tree with the
    /// kernel's zswap). Shared among the processes by where it is used.
    #[arg(long, value_parser = parse_size)]
    pub memory_max: u64,
    /// Caps each process's compressed pool (inside --memory-max, which it
    /// is part of); when the pool is full the least recently used pages go
    /// to the backing file. Default: half of what a process is allotted.
    #[arg(long, value_parser = parse_size)]
    pub pool_max: Option<u64>,
    /// lz4, lz4hc[:LEVEL], zstd[:LEVEL], deflate[:LEVEL].
    #[arg(long, default_value = "lz4")]
    pub compressor: uzswap_cache::Compressor,
    /// Compress pages that never joined the program's working set (evicted
    /// without having been on the pager's active list since they came in)
    /// with this codec instead, e.g. zstd:-1: a denser pool for pages
    /// unlikely to come back soon, --compressor's speed for the rest.
    #[arg(long)]
    pub cold_compressor: Option<uzswap_cache::Compressor>,
    /// Store identical pages once: a page whose compressed
    /// bytes match a stored one's takes a reference to it instead of pool
    /// memory. Costs a hash per store and an index entry per object.
    #[arg(long)]
    pub dedup: bool,
    /// Where pages that do not fit the pool are written back: a directory
    /// (an unnamed, encrypted file is made in it) or a new file's path.
    /// Default: an unnamed file in $TMPDIR (or /tmp).
    #[arg(long, conflicts_with = "no_backing_file")]
    pub backing_file: Option<std::path::PathBuf>,
    /// Write nothing back: pages the pool cannot take stay resident, and a
    /// program whose compressed pages outgrow the budget goes over it (said
    /// at once on stderr).
    #[arg(long)]
    pub no_backing_file: bool,
    /// Write pages back to a Redis or Valkey server instead of a file:
    /// redis://HOST:PORT, or several HOST:PORT of one cluster separated by
    /// commas. Pages are encrypted before they leave; keys expire after
    /// 24 hours and are deleted at exit.
    #[arg(long, value_name = "URL", conflicts_with_all = ["backing_file", "no_backing_file"])]
    pub backing: Option<String>,
    /// Keep the pool's copy of a page brought back (mapped write-protected),
    /// so that evicting it again unwritten needs no compression. Costs pool
    /// memory for resident pages and a fault on the first write; off, a
    /// load frees the copy as the kernel's zswap does (measured faster and
    /// smaller on usemem: docs/BENCHMARKS.md).
    #[arg(long)]
    pub keep_clean: bool,
    /// Resolve each fault on the faulting thread's CPU: a handler bound to
    /// every CPU at idle priority (it spins on idle CPUs for 2 ms after a
    /// fault). Faster fills and sequential passes on a VM, where waking a
    /// thread on another CPU is expensive (docs/BENCHMARKS.md).
    #[arg(long)]
    pub cpu_handlers: bool,
    /// Turn co-scheduling off. By default the thread that does a process's
    /// work (its only one, or one busy beside threads that wait), once the
    /// process has been evicting for a second, runs on one CPU together
    /// with uzswap's threads for it, which run there at idle priority, only
    /// while it waits for a page: no CPU is woken or interrupted for its
    /// faults and evictions (measured faster and cheaper on a VM:
    /// docs/BENCHMARKS.md). It is let go again when the process starts or
    /// ends a thread, when it waits for its CPU, or when another thread's
    /// fault waits behind it. Needs the right to leave idle priority (root,
    /// CAP_SYS_NICE or RLIMIT_NICE); without it, off.
    #[arg(long)]
    pub no_cosched: bool,
    /// Serve the whole program's metrics for Prometheus over HTTP at
    /// HOST:PORT/metrics while it runs (as `uzswap stats --serve`).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,
    /// Write the final statistics (JSON) to this file.
    #[arg(long)]
    pub stats_json: Option<std::path::PathBuf>,
    /// Record the run as a time series in FILE (JSON Lines, flushed as it
    /// goes): the whole program's measured memory against the budget, and
    /// every process's resident, pool, runtime, backing file, allotment,
    /// faults and evictions. `uzswap plot FILE` draws it.
    #[arg(long, value_name = "FILE")]
    pub record: Option<std::path::PathBuf>,
    /// How often --record takes a sample: 100ms (the default and the
    /// least: the arbiter measures the tree that often), 1s, 2.5s.
    /// Rounded to a multiple of 100 ms.
    #[arg(long, value_name = "TIME", requires = "record", value_parser = parse_interval)]
    pub record_interval: Option<std::time::Duration>,
    /// Preload this file as the runtime instead of the copy built into
    /// uzswap (e.g. one built with debugging information: `cargo build
    /// -p uzswap-preload`). Also UZSWAP_PRELOAD_LIB.
    #[arg(long, value_name = "FILE")]
    pub preload_lib: Option<std::path::PathBuf>,
    /// No start line and no summary.
    #[arg(long, short)]
    pub quiet: bool,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROG"
    )]
    pub prog: Vec<std::ffi::OsString>,
}

/// Parses a size: a number of bytes with an optional binary suffix
/// (`K`, `M`, `G`, `T`; `KiB`, `MB` and the like mean the same).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (examples: 4096, 512K, 64M, 2G)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use K, M, G or T)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Parses `--record-interval`: seconds, or with `ms` or `s`.
pub fn parse_interval(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let (num, scale) = match t.strip_suffix("ms") {
        Some(n) => (n, 1e-3),
        None => (t.strip_suffix('s').unwrap_or(t), 1.0),
    };
    let secs = num
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(|v| v * scale)
        .ok_or_else(|| format!("{s:?} is not a time (examples: 100ms, 1s, 2.5)"))?;
    let least = crate::tree::SAMPLE.as_secs_f64();
    if secs < least - 1e-9 {
        return Err(format!(
            "{s:?} is shorter than {} ms, how often the tree is measured: give 100ms or more",
            crate::tree::SAMPLE.as_millis()
        ));
    }
    if secs > 86_400.0 {
        return Err(format!("{s:?} is over a day: give a shorter interval"));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}

// ---- checks before the program starts --------------------------------------

/// Finds `prog` as `execvp` would: a name with a slash as is, else in PATH.
fn resolve(prog: &OsString) -> Result<PathBuf> {
    let p = Path::new(prog);
    if prog.to_string_lossy().contains('/') {
        if !p.exists() {
            bail!("{}: no such file: check the path", p.display());
        }
        return Ok(p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    for dir in std::env::split_paths(&path) {
        let c = dir.join(p);
        if c.is_file() && is_executable(&c) {
            return Ok(c);
        }
    }
    bail!(
        "{}: command not found in PATH; give its path (./{0} for one in this directory)",
        p.display()
    )
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

/// Why a program cannot be run under the preload library, if it cannot.
/// Follows `#!` interpreters (and `/usr/bin/env NAME`) to the ELF file the
/// kernel will really run.
pub fn check_program(path: &Path) -> Result<()> {
    check_program_depth(path, 0)
}

fn check_program_depth(path: &Path, depth: u32) -> Result<()> {
    if depth > 4 {
        bail!("{}: too many levels of #! interpreters", path.display());
    }
    let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
    if !meta.is_file() {
        bail!("{}: not a regular file", path.display());
    }
    let mode = meta.permissions().mode();
    if mode & 0o111 == 0 {
        bail!("{}: not executable (chmod +x it)", path.display());
    }
    if mode & 0o6000 != 0 {
        bail!(
            "{}: setuid/setgid program: the loader ignores LD_PRELOAD for it, so its memory \
             could not be managed; run an ordinary copy (cp it, which drops the bits) or use \
             the uzswap library API",
            path.display()
        );
    }
    let mut head = Vec::with_capacity(4096);
    std::fs::File::open(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .take(4096)
        .read_to_end(&mut head)?;
    if let Some(rest) = head.strip_prefix(b"#!") {
        let line = rest.split(|&b| b == b'\n').next().unwrap_or_default();
        let line = String::from_utf8_lossy(line);
        let mut words = line.split_whitespace();
        let Some(interp) = words.next() else {
            bail!("{}: empty #! line", path.display());
        };
        let mut interp = PathBuf::from(interp);
        if interp.file_name().is_some_and(|n| n == "env") {
            // `#!/usr/bin/env NAME`: env is dynamic and execs NAME from PATH.
            check_program_depth(&interp, depth + 1)?;
            match words.find(|w| !w.starts_with('-')) {
                Some(name) => interp = resolve(&name.into())?,
                None => return Ok(()),
            }
        }
        return check_program_depth(&interp, depth + 1)
            .with_context(|| format!("{}: its interpreter cannot be run", path.display()));
    }
    let elf = inspect_elf(&head).with_context(|| format!("{}", path.display()))?;
    if elf.dynamic {
        return Ok(());
    }
    if elf.go {
        // Go's own linker makes static binaries unless the program uses
        // cgo. Linked by the system's linker against the C library, the Go
        // runtime maps its heap through the C library's `mmap`, which the
        // preload library serves (docs: README, "Go programs").
        bail!(
            "{}: a Go program linked statically (Go's default without cgo): a static program \
             never loads LD_PRELOAD libraries, so its heap cannot be managed; rebuild it \
             linked to the C library with `CGO_ENABLED=1 go build -ldflags=-linkmode=external` \
             (gcc must be installed): its heap is then managed",
            path.display()
        );
    }
    Err(anyhow::anyhow!(
        "{}: statically linked: a static program never loads LD_PRELOAD libraries, so its \
                 malloc cannot be replaced; run a dynamically linked build (without -static), or \
                 link the uzswap library and use its API",
        path.display()
    ))
}

/// What the first 4 KiB of an ELF executable say about running it under
/// the preload library.
#[derive(Debug, PartialEq)]
struct ElfFacts {
    /// It has a `PT_INTERP` entry: a dynamic loader, which preloads.
    dynamic: bool,
    /// A note owned by "Go" (Go's build id): Go's linker made it.
    go: bool,
}

/// Reads a 64-bit little-endian ELF header's program headers (and the
/// notes they point at, where those lie in `head`) by hand rather than
/// pulling in an ELF crate.
fn inspect_elf(head: &[u8]) -> Result<ElfFacts> {
    if head.len() < 64 || &head[..4] != b"\x7fELF" {
        bail!("not an ELF executable nor a #! script");
    }
    if head[4] != 2 || head[5] != 1 {
        bail!("not a 64-bit little-endian ELF file: it cannot run with this uzswap");
    }
    let u16_at = |o: usize| u16::from_le_bytes([head[o], head[o + 1]]) as usize;
    let machine = u16_at(0x12);
    let ours = if cfg!(target_arch = "x86_64") {
        62
    } else {
        183
    };
    if machine != ours {
        bail!("built for another architecture (ELF machine {machine})");
    }
    const PT_INTERP: u32 = 3;
    const PT_NOTE: u32 = 4;
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let phoff = u64_at(head, 0x20) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    let mut facts = ElfFacts {
        dynamic: false,
        go: false,
    };
    for i in 0..phnum {
        let o = phoff.saturating_add(i * phentsize);
        let Some(ph) = head.get(o..o.saturating_add(56)) else {
            bail!("program headers lie past the first 4 KiB: cannot inspect it");
        };
        match u32::from_le_bytes(ph[..4].try_into().expect("4 bytes")) {
            PT_INTERP => facts.dynamic = true,
            PT_NOTE => {
                let (at, len) = (u64_at(ph, 8) as usize, u64_at(ph, 32) as usize);
                // Notes past the first 4 KiB are not read: such a binary
                // is only not known as Go's.
                if let Some(notes) = head.get(at..at.saturating_add(len)) {
                    facts.go |= has_note_of(notes, b"Go");
                }
            }
            _ => {}
        }
    }
    Ok(facts)
}

/// Whether a segment of ELF notes holds one whose owner is `name`. Each
/// note: name size, descriptor size, type (4 bytes each), then the name
/// and the descriptor, each padded to 4 bytes. The name size counts its
/// NUL, and Go's linker counts its padding too ("Go" has size 4).
fn has_note_of(mut notes: &[u8], name: &[u8]) -> bool {
    let pad = |n: usize| n.div_ceil(4) * 4;
    while notes.len() >= 12 {
        let word = |o: usize| u32::from_le_bytes(notes[o..o + 4].try_into().expect("4")) as usize;
        let (namesz, descsz) = (word(0), word(4));
        let owner = notes.get(12..12usize.saturating_add(namesz));
        if owner.is_some_and(|o| o.split(|&b| b == 0).next() == Some(name)) {
            return true;
        }
        let next = 12usize
            .saturating_add(pad(namesz))
            .saturating_add(pad(descsz));
        match notes.get(next..) {
            Some(rest) => notes = rest,
            None => return false,
        }
    }
    false
}

// ---- running it ------------------------------------------------------------

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
    pub tree: crate::tree::TreeReport,
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

/// The configuration the program's runtime gets: the flags, and
/// `UZSWAP_RESERVE` from this process's environment (there is no flag for
/// it). Checked here, before anything runs.
fn run_config(a: &Args) -> Result<RunConfig> {
    let config = RunConfig {
        memory_max: a.memory_max,
        pool_max: a.pool_max,
        compressor: a.compressor,
        cold_compressor: a.cold_compressor,
        backing: backing_of(a),
        keep_clean: a.keep_clean,
        cpu_handlers: a.cpu_handlers,
        cosched: !a.no_cosched,
        dedup: a.dedup,
        final_stats: None, // set once its directory exists
        reserve: RunConfig::reserve_from_lookup(|n: &str| std::env::var_os(n))?,
        ledger: None, // set once it exists
        remote_prefix: None,
    };
    config.validate()?;
    Ok(config)
}

/// For messages: where pages are written back.
fn tier_noun(a: &Args) -> &'static str {
    backing_of(a).map_or("no backing tier", |t| t.noun())
}

/// The tier pages are written back to: the server of --backing, the file
/// or directory named, none with --no-backing-file, else `$TMPDIR`.
fn backing_of(a: &Args) -> Option<BackingTier> {
    if let Some(url) = &a.backing {
        Some(BackingTier::Redis(url.clone()))
    } else if a.no_backing_file {
        None
    } else {
        Some(BackingTier::File(
            a.backing_file.clone().unwrap_or_else(std::env::temp_dir),
        ))
    }
}

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
    }
    if let Some(r) = &a.record {
        crate::record::check_path(r)?;
    }
    let metrics = a.metrics.as_deref().map(crate::serve::bind).transpose()?;
    let tmp = temp_dir()?;
    let final_base = tmp.path().join("stats.json");
    config.final_stats = Some(final_base.clone());
    let mut watch = crate::tree::Watch::create(a.memory_max)
        .context("cannot make the ledger the program's processes share their budget in")?;
    config.ledger = Some(watch.path().to_owned());

    let mut preload = lib.path().as_os_str().to_owned();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = std::process::Command::new(&path);
    cmd.arg0(prog).args(&a.prog[1..]).env("LD_PRELOAD", preload);
    // Every variable the runtime reads is removed first: a value inherited
    // from our own environment must not reach it as if asked for.
    for name in names::ALL {
        cmd.env_remove(name);
    }
    cmd.envs(config.to_env());
    // The terminal's ^C and ^\ reach the program directly; this process
    // waits for it to finish. Termination requests are passed on.
    // SAFETY: installing handlers that only call kill(2), and ignoring
    // two signals in this (single-threaded) supervisor.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        libc::signal(libc::SIGTERM, forward as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, forward as *const () as libc::sighandler_t);
    }
    // SAFETY: restores default dispositions in the child before exec
    // (signal(2) is async-signal-safe).
    unsafe {
        cmd.pre_exec(|| {
            for s in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(s, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    let recording = a.record.as_deref().map(|p| recording(a, p)).transpose()?;
    let started = std::time::Instant::now();
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start {}", path.display()))?;
    let pid = child.id() as i32;
    CHILD.store(pid, Ordering::Relaxed);
    watch.start(pid as u32, a.quiet, recording, config.backing.clone())?;
    let endpoint = match metrics {
        Some(server) => {
            if !a.quiet {
                crate::note(&format!(
                    "uzswap: metrics at {}",
                    crate::serve::url(&server)
                ));
            }
            Some(crate::serve::Endpoint::start(server)?)
        }
        None => None,
    };
    if !a.quiet {
        crate::note(&format!(
            "uzswap: running {} as pid {pid}: memory max {} for the whole program, pool max {}, {}{}, backing {}; `uzswap stats {pid}` shows it live",
            prog.to_string_lossy(),
            human(a.memory_max),
            a.pool_max.map_or("half of each process's share".into(), human),
            a.compressor,
            a.cold_compressor
                .map_or(String::new(), |c| format!(" (cold pages {c})")),
            config
                .backing
                .as_ref()
                .map_or("none".into(), |b| b.to_string()),
        ));
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
    match (&a.stats_json, &stats) {
        (Some(dest), FinalStats::Read(s)) => {
            // The program's own statistics, and the tree's beside them.
            let mut v: serde_json::Value =
                serde_json::from_str(&s.to_json().context("cannot encode the final statistics")?)?;
            v["tree"] = serde_json::to_value(&tree)?;
            write_stats_json(dest, &v)?;
        }
        (Some(dest), FinalStats::Missing) => {
            // The program ended without its exit handlers (Go's runtime
            // exits so): the tree's figures, from each process's last
            // report, are all there is.
            let v = serde_json::json!({
                "final_statistics_missing": MISSING_WHY,
                "tree": serde_json::to_value(&tree)?,
            });
            write_stats_json(dest, &v)?;
        }
        // Without a summary, the error must still be told.
        (_, FinalStats::Unreadable(why)) if a.quiet => eprintln!("uzswap: error: {why}"),
        _ => {}
    }
    Ok(Outcome {
        code,
        signal,
        seconds,
        tree,
        stats,
    })
}

/// The recording `--record` asks for: its file made and its writer
/// started, the header to be written first.
fn recording(a: &Args, path: &Path) -> Result<crate::tree::Recording> {
    let sample = crate::tree::SAMPLE.as_millis() as u64;
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
    Ok(crate::tree::Recording {
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

/// The end-of-run summary (stderr).
pub fn summary(a: &Args, o: &Outcome) -> String {
    let mut s = String::new();
    let prog = a.prog[0].to_string_lossy();
    let t = &o.tree;
    // The headline: the whole program's memory against its budget.
    s += &format!(
        "uzswap: {prog}'s memory peaked at {} of its {} budget ({:.2}x): resident, pools and \
         uzswap's own memory of its {} {} (Pss_Anon sampled every {} ms)\n",
        human(t.peak_bytes),
        human(a.memory_max),
        t.peak_bytes as f64 / a.memory_max as f64,
        t.processes.len().max(1),
        if t.processes.len() > 1 {
            "processes"
        } else {
            "process"
        },
        crate::tree::SAMPLE.as_millis(),
    );
    s += &match o.signal {
        Some(sig) => format!(
            "uzswap: {prog} killed by signal {sig} after {:.1} s\n",
            o.seconds
        ),
        None => format!(
            "uzswap: {prog} exited with status {} after {:.1} s\n",
            o.code, o.seconds
        ),
    };
    // Several processes, or one without final statistics of its own: the
    // tree's figures, from each process's last report.
    if t.processes.len() > 1 || (matches!(o.stats, FinalStats::Missing) && !t.processes.is_empty())
    {
        let sum = |f: fn(&crate::tree::Process) -> u64| t.processes.values().map(f).sum::<u64>();
        s += &format!(
            "uzswap: {} {} ({} at once at most): {} faults, {} pages evicted, {} in {} at the end\n",
            t.processes.len(),
            if t.processes.len() > 1 { "processes" } else { "process" },
            t.max_processes,
            sum(|p| p.faults),
            sum(|p| p.evictions),
            human(sum(|p| p.backing_bytes)),
            tier_noun(a),
        );
        if t.start_waits > 0 {
            s += &format!(
                "uzswap: {} program {} waited for the others to give memory back, {:.2} s in all\n",
                t.start_waits,
                if t.start_waits > 1 { "starts" } else { "start" },
                t.start_wait_seconds,
            );
        }
    }
    if t.cpu_seconds > 0.0 {
        s += &format!(
            "uzswap: CPU time: the program {:.1} s, uzswap's threads in its processes {:.1} s \
             ({:.0} % of the program's), `uzswap run` {:.1} s\n",
            t.cpu_seconds - t.runtime_cpu_seconds,
            t.runtime_cpu_seconds,
            100.0 * t.runtime_cpu_seconds / (t.cpu_seconds - t.runtime_cpu_seconds).max(1e-3),
            t.run_cpu_seconds,
        );
    }
    for why in &t.over_budget_reasons {
        s += &format!("uzswap: WARNING: over budget: {why}\n");
    }
    let v = match &o.stats {
        FinalStats::Read(v) => v,
        FinalStats::Missing => {
            s += &format!(
                "uzswap: no final statistics: {MISSING_WHY}; the figures above are \
                 the processes' last reports\n"
            );
            return s;
        }
        FinalStats::Unreadable(why) => {
            s += &format!("uzswap: error: {why}\n");
            return s;
        }
    };
    let (pager, cache) = (&v.pager, &v.cache);
    // In a tree the lines below are the program's own process's (its
    // runtime wrote them; the tree's totals are the line above): they say
    // so, lest `make`'s "evicted 0 pages" read as the build's.
    let whose = if t.processes.len() > 1 {
        format!("{prog} itself (pid {}): ", v.pid)
    } else {
        String::new()
    };
    s += &format!("uzswap: {whose}{}\n", crate::stats::faults_line(v));
    s += &format!(
        "uzswap: {whose}evicted {} pages into the pool, {} of them written back to {}\n",
        pager.evictions,
        cache.written_back_pages,
        tier_noun(a),
    );
    if cache.tier_round_trips > 0 {
        s += &format!(
            "uzswap: {whose}the remote tier: {}\n",
            crate::stats::remote_line(cache)
        );
    }
    let over = pager.peak_resident_pages.saturating_sub(pager.budget_pages);
    if pager.store_full_episodes > 0 && over > 0 {
        let remedy = match backing_of(a) {
            Some(t) => format!(
                "{} could not take them either: {}",
                t.noun(),
                t.failing_remedy()
            ),
            None => "drop --no-backing-file or raise --memory-max".into(),
        };
        s += &format!(
            "uzswap: WARNING: {whose}the pool ({}) refused pages, so the program went over its budget \
             by up to {over} pages rather than stop; {remedy}\n",
            human(cache.pool_limit_bytes),
        );
    }
    // Pages the program could not get back (it got SIGBUS); failed reads
    // that a retry fixed are reported apart: they point at the device.
    let errors = pager.load_errors;
    if errors > 0 {
        s += &format!(
            "uzswap: WARNING: {whose}{errors} pages could not be loaded back (see the statistics)\n"
        );
    }
    let retried = pager.load_retries;
    if retried > 0 {
        s += &format!(
            "uzswap: WARNING: {whose}{retried} loads failed ({} unreadable, {} corrupt, {} undecodable) and were \
             tried again; {}\n",
            cache.backing_read_fail,
            cache.backing_corrupt,
            cache.decompress_fail,
            backing_of(a).map_or("check the machine's memory".into(), |t| t.failing_remedy()),
        );
    }
    s
}

/// A private directory (0700) in `$TMPDIR` for the final statistics, removed when dropped.
fn temp_dir() -> Result<tempfile::TempDir> {
    let base = std::env::temp_dir();
    tempfile::Builder::new()
        .prefix("uzswap-run.")
        .tempdir_in(&base)
        .with_context(|| format!("cannot make a directory in {} (set TMPDIR)", base.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        run: Args,
    }

    fn summary_of(stats: FinalStats) -> String {
        let a = Cli::parse_from(["x", "--memory-max", "1M", "--", "prog"]).run;
        let o = Outcome {
            code: 0,
            signal: None,
            seconds: 1.0,
            tree: Default::default(),
            stats,
        };
        summary(&a, &o)
    }

    /// A snapshot with the given load retries and errors, and failed reads
    /// (unreadable, corrupt).
    fn loads(retries: u64, errors: u64, unreadable: u64, corrupt: u64) -> FinalStats {
        let mut s = Snapshot::default();
        s.pager.load_retries = retries;
        s.pager.load_errors = errors;
        s.cache.backing_read_fail = unreadable;
        s.cache.backing_corrupt = corrupt;
        FinalStats::Read(Box::new(s))
    }

    /// In a tree, the lines that come from the program's own process's
    /// statistics name it, beside the tree's totals; a lone process's
    /// summary has no such label.
    #[test]
    fn summary_of_a_tree_names_the_root_process_lines() {
        let a = Cli::parse_from(["x", "--memory-max", "1M", "--", "make"]).run;
        let mut tree = crate::tree::TreeReport::default();
        for (pid, evictions) in [(10, 0), (11, 500)] {
            tree.processes.insert(
                pid,
                crate::tree::Process {
                    pid,
                    evictions,
                    ..Default::default()
                },
            );
        }
        let mut snap = Snapshot {
            pid: 10,
            ..Default::default()
        };
        snap.pager.load_errors = 1;
        let o = Outcome {
            code: 0,
            signal: None,
            seconds: 1.0,
            tree,
            stats: FinalStats::Read(Box::new(snap)),
        };
        let s = summary(&a, &o);
        assert!(s.contains("2 processes"), "{s}");
        assert!(s.contains("500 pages evicted"), "{s}");
        assert!(
            s.contains("uzswap: make itself (pid 10): evicted 0 pages into the pool"),
            "{s}"
        );
        assert!(s.contains("uzswap: make itself (pid 10): faults:"), "{s}");
        assert!(
            s.contains("WARNING: make itself (pid 10): 1 pages could not"),
            "{s}"
        );
        let lone = summary_of(loads(0, 0, 0, 0));
        assert!(!lone.contains("itself"), "{lone}");
        assert!(
            lone.contains("uzswap: evicted 0 pages into the pool"),
            "{lone}"
        );
    }

    #[test]
    fn summary_tells_lost_pages_from_retried_reads() {
        let clean = summary_of(loads(0, 0, 0, 0));
        assert!(!clean.contains("WARNING"), "{clean}");
        let retried = summary_of(loads(3, 0, 2, 1));
        assert!(
            retried.contains("3 loads failed (2 unreadable, 1 corrupt"),
            "{retried}"
        );
        assert!(!retried.contains("could not be loaded back"), "{retried}");
        let lost = summary_of(loads(2, 1, 3, 0));
        assert!(lost.contains("1 pages could not be loaded back"), "{lost}");
    }

    /// A final statistics file of another schema is an error in the
    /// summary, not a summary of zeros.
    #[test]
    fn unreadable_final_statistics_are_an_error() {
        let dir = temp_dir().unwrap();
        let path = dir.path().join("stats.json.1");
        assert!(matches!(read_final(&path), FinalStats::Missing));
        let mut v = serde_json::to_value(Snapshot::default()).unwrap();
        let pager = v["pager"].as_object_mut().unwrap();
        let evictions = pager.remove("evictions").unwrap();
        pager.insert("evicted".into(), evictions);
        std::fs::write(&path, v.to_string()).unwrap();
        let stats = read_final(&path);
        let FinalStats::Unreadable(why) = &stats else {
            panic!("a renamed field was read");
        };
        assert!(why.contains("evict"), "{why}");
        let s = summary_of(stats);
        assert!(
            s.contains("uzswap: error: cannot read the final statistics"),
            "{s}"
        );
        assert!(!s.contains("evicted 0 pages"), "{s}");
        std::fs::write(&path, Snapshot::default().to_json().unwrap()).unwrap();
        assert!(matches!(read_final(&path), FinalStats::Read(_)));
    }

    #[test]
    fn record_intervals_parse_and_refuse_less_than_a_sample() {
        let ms = |s: &str| parse_interval(s).map(|d| d.as_millis());
        assert_eq!(ms("100ms"), Ok(100));
        assert_eq!(ms("1s"), Ok(1000));
        assert_eq!(ms(" 2.5 "), Ok(2500));
        assert!(ms("50ms").unwrap_err().contains("100ms or more"));
        assert!(ms("0").is_err());
        assert!(ms("soon").unwrap_err().contains("not a time"));
        assert!(ms("-1s").is_err());
        assert!(ms("2d").is_err());
    }

    #[test]
    fn sizes_parse_with_binary_units_and_refuse_nonsense() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512K"), Ok(512 << 10));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size(" 2GiB "), Ok(2 << 30));
        assert_eq!(parse_size("1t"), Ok(1 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("12X").unwrap_err().contains("unknown unit"));
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("99999999999T")
            .unwrap_err()
            .contains("too large"));
    }

    #[test]
    fn elf_headers_tell_dynamic_from_static() {
        // This test binary is dynamically linked (cargo's default on Linux).
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let facts = inspect_elf(&me[..4096]).unwrap();
        assert_eq!(
            facts,
            ElfFacts {
                dynamic: true,
                go: false
            }
        );
        // The same header with PT_INTERP entries renamed to PT_NULL.
        let mut stat = me[..4096].to_vec();
        let phoff = u64::from_le_bytes(stat[0x20..0x28].try_into().unwrap()) as usize;
        let (size, num) = (
            u16::from_le_bytes([stat[0x36], stat[0x37]]) as usize,
            u16::from_le_bytes([stat[0x38], stat[0x39]]) as usize,
        );
        for i in 0..num {
            let o = phoff + i * size;
            if stat[o..o + 4] == 3u32.to_le_bytes() {
                stat[o..o + 4].copy_from_slice(&0u32.to_le_bytes());
            }
        }
        assert!(!inspect_elf(&stat).unwrap().dynamic);
        assert!(inspect_elf(b"#!/bin/sh\n").is_err());
        assert!(inspect_elf(&[0u8; 64]).is_err());
    }

    /// A note segment: the GNU build id first, then Go's, as Go's linker
    /// writes them; a truncated or foreign segment finds none.
    #[test]
    fn go_is_told_by_its_note() {
        fn note(name: &[u8], desc: &[u8]) -> Vec<u8> {
            let mut v = Vec::new();
            v.extend((name.len() as u32).to_le_bytes());
            v.extend((desc.len() as u32).to_le_bytes());
            v.extend(4u32.to_le_bytes());
            v.extend(name);
            v.resize(v.len().div_ceil(4) * 4, 0);
            v.extend(desc);
            v.resize(v.len().div_ceil(4) * 4, 0);
            v
        }
        let gnu = note(b"GNU\0", &[7; 20]);
        // Go's linker gives the name's size as 4.
        let go = note(b"Go\0\0", b"abc/def");
        let both = [gnu.clone(), go.clone()].concat();
        assert!(has_note_of(&both, b"Go"));
        assert!(has_note_of(&go, b"Go"));
        assert!(has_note_of(&note(b"Go\0", b"x"), b"Go"));
        assert!(!has_note_of(&note(b"Gopher\0", b"x"), b"Go"));
        assert!(!has_note_of(&gnu, b"Go"));
        assert!(!has_note_of(&both[..gnu.len() + 13], b"Go"));
        assert!(!has_note_of(&[0xff; 12], b"Go"));
        assert!(!has_note_of(&[], b"Go"));
    }
}
