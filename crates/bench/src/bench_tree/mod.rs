//! `uzswap-bench tree`: a whole process tree under one memory budget B: a
//! parallel build of real C sources at each `-jN` (or a Python
//! multiprocessing program), run on four sides in one run:
//! 1. unconstrained (the reference: wall time, the tree's peak, and the
//!    outputs every other side must reproduce byte for byte);
//! 2. `uzswap run --memory-max B` (its tree sampled from /proc here, and
//!    its own `--stats-json` tree figures);
//! 3. the kernel: a memory cgroup (v1) of limit B with a swap file and
//!    zswap (lzo) in each configuration of the zswap shrinker (on/off) ×
//!    swap readahead (`vm.page-cluster` 3/0); the fastest that completed
//!    without an OOM kill is "the kernel";
//! 4. plain swap (zswap off) in the same cgroup;
//! 5. the fastest zswap configuration again with its pool inside B, as a
//!    cgroup v2 charges it (`systemd-run -p MemoryMax=B` on a v2 machine):
//!    the v1 controller leaves the pool outside its limit, so the limit is
//!    steered every 10 ms to B less the pool's size then
//!    ([`sides::steer`]). An emulation, not a v2 cgroup: one burst of
//!    reclaim can grow the pool by tens of MiB between two steps, and the
//!    tree then holds more than B until the limit has come down (its
//!    over-target samples say how long).
//!
//! Memory is each side's own account of the tree: `Pss_Anon` summed over
//! the processes for the unconstrained and uzswap sides (uzswap's includes
//! `uzswap run` itself, as its budget does), sampled every 100 ms; the
//! cgroup's usage plus the zswap pool for the kernel sides (the v1
//! controller leaves the pool outside its limit), sampled at one instant;
//! the kernel sides' tree `Pss_Anon` is read too (every side pays the same
//! sampling).
//! The first [`STARTUP_SAMPLES`] samples do not count for the peak, as in
//! `uzswap run`'s own accounting.
//!
//! Everything changed on the machine is put back by
//! [`crate::kernel::KernelSwap`]'s drop on every exit path; Ctrl-C and
//! SIGTERM are caught, the running program's process group is killed, and
//! the benchmark returns an error through those drops rather than dying
//! with the machine changed.
//!
//! The files: the sides and the kernel's configurations (`sides.rs`), a
//! sampled run of one program (`sampling.rs`), a case over its rounds
//! (`case.rs`), the JSON object and the table (`report.rs`), and the
//! programs every side runs (`workloads.rs`).

mod case;
mod report;
mod sampling;
mod sides;
pub mod workloads;

pub use report::table;

use crate::note;
use anyhow::{bail, Context, Result};
use case::case;
use report::result;
use sampling::catch_interrupts;
use serde_json::json;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;
use workloads::{Kind, Workload, CFLAGS};

/// A number of a side's JSON object.
fn f(v: &Value, k: &str) -> Option<f64> {
    v[k].as_f64()
}

const MIB: u64 = 1 << 20;
/// How often every side's memory is sampled.
const SAMPLE: Duration = Duration::from_millis(100);
/// Samples after the start that do not count for the peak (the loader,
/// the runtimes' start-up), as `uzswap run` counts its own peak.
const STARTUP_SAMPLES: usize = 3;
/// The memory target: the tree at or below this × B at every sample.
const MEMORY_TARGET: f64 = 1.05;
/// Default budget of the python workload.
const PYTHON_BUDGET_MIB: u64 = 128;
const ZSWAP_PARAMS: &str = "/sys/module/zswap/parameters";
const PAGE_CLUSTER: &str = "/proc/sys/vm/page-cluster";

/// Which kernel configurations run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelConfigs {
    /// All four in the first round of each -jN, then only the fastest.
    Best,
    /// All four in every round.
    All,
}

/// What every case runs: the sides, their rounds and limits.
#[derive(clap::Args, Clone)]
pub struct Sides {
    /// Rounds of every side, the order reversed in every other round; the
    /// wall times reported are the medians.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
    #[arg(long, value_enum, default_value = "all")]
    pub kernel_configs: KernelConfigs,
    /// Only the unconstrained and uzswap sides (no root needed).
    #[arg(long)]
    pub skip_kernel: bool,
    /// Without the run of uzswap at the kernel's total memory: by default,
    /// once the fastest kernel configuration is known, uzswap runs again
    /// with B = that configuration's peak (its cgroup plus its pool, which
    /// the v1 controller leaves outside the limit), for a comparison at
    /// equal total memory.
    #[arg(long)]
    pub skip_equal_total: bool,
    /// Without the run of the fastest kernel configuration with its pool
    /// inside B (the v1 limit steered to B less the pool every 10 ms, as a
    /// v2 cgroup's limit holds both).
    #[arg(long)]
    pub skip_pool_inside: bool,
    /// A run still going after this many seconds is killed and reported
    /// as timed out (a configuration that crawls). Default: 30 times the
    /// unconstrained run's wall time, at least 120 s.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub timeout_seconds: Option<u64>,
    /// Hold the CPU latency request (0 µs) through every kernel run, as
    /// uzswap's pager holds it while faults arrive (root only): the two
    /// designs compared with the same idle states.
    #[arg(long, default_value = "off", value_parser = crate::parse_on_off, action = clap::ArgAction::Set)]
    pub kernel_latency_hold: bool,
    /// The `uzswap` binary (default: the one beside this executable).
    #[arg(long, value_name = "PATH")]
    pub uzswap: Option<PathBuf>,
    /// A flag given to every `uzswap run` of the benchmark (repeatable;
    /// `--uzswap-flag=--access-signal`): a setting against the default.
    #[arg(long = "uzswap-flag", value_name = "FLAG", allow_hyphen_values = true)]
    pub uzswap_flags: Vec<String>,
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, value_enum, default_value = "build")]
    pub workload: Kind,
    /// The build's parallelism, comma-separated (other workloads: ignored).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8",
          value_parser = clap::value_parser!(u32).range(1..=64))]
    pub jobs: Vec<u32>,
    /// The budget B of every side, MiB. Default: half of the unconstrained
    /// peak at each -jN for the build, 128 for python, a quarter of the
    /// unconstrained peak for the real programs.
    #[arg(long, value_parser = clap::value_parser!(u64).range(8..=1 << 20))]
    pub budget_mib: Option<u64>,
    #[command(flatten)]
    pub sides: Sides,
}

#[derive(clap::Args)]
pub struct ProgramsArgs {
    /// The programs, comma-separated; one the machine lacks is left out
    /// with a note.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "pydict,node,jvm,go,xz,sort"
    )]
    pub programs: Vec<Kind>,
    /// Each program's size as a multiple of its default (footprints of
    /// 170-400 MB at 1).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// The budget B of each program as a share of its unconstrained peak.
    #[arg(long, default_value_t = 0.25)]
    pub budget_share: f64,
    #[command(flatten)]
    pub sides: Sides,
}

pub fn run(args: &Args) -> Result<Value> {
    let uzswap = prepare_run(&args.sides)?;
    let w = Workload::prepare(args.workload, 1.0)?;
    note(&format!(
        "tree: {} in {}{}",
        w.sources.join(", "),
        w.dir().display(),
        if w.kind == Kind::Build {
            format!(" ({} units, gcc {CFLAGS})", w.units)
        } else {
            String::new()
        }
    ));
    let jobs = match w.kind {
        Kind::Build => args.jobs.clone(),
        _ => vec![1],
    };
    let budget_of = |peak: u64| match (args.budget_mib, w.kind) {
        (Some(m), _) => m * MIB,
        (None, Kind::Python) => PYTHON_BUDGET_MIB * MIB,
        (None, Kind::Build) => share_of(peak, 0.5),
        (None, _) => share_of(peak, 0.25),
    };
    let mut cases = Vec::new();
    for j in jobs {
        cases.push(case(&args.sides, &w, j, budget_of, &uzswap)?);
    }
    Ok(result(
        json!({
            "benchmark": "tree",
            "workload": w.kind,
            "sources": w.sources,
            "units": w.units,
            "cflags": CFLAGS,
        }),
        &args.sides,
        cases,
    ))
}

/// `uzswap-bench programs`: each real program, one case each, at a budget
/// of `budget_share` of its unconstrained peak.
pub fn run_programs(args: &ProgramsArgs) -> Result<Value> {
    if !(args.scale > 0.0 && args.scale <= 100.0) {
        bail!(
            "--scale {}: give a factor above 0 and at most 100",
            args.scale
        );
    }
    if !(args.budget_share > 0.0 && args.budget_share <= 1.0) {
        bail!(
            "--budget-share {}: give a share above 0 and at most 1 (0.25: a quarter of the footprint)",
            args.budget_share
        );
    }
    let uzswap = prepare_run(&args.sides)?;
    let mut cases = Vec::new();
    let mut left_out = Vec::new();
    for &kind in &args.programs {
        if !kind.available() {
            note(&format!("{}: not on this machine, left out", kind.label(1)));
            left_out.push(kind);
            continue;
        }
        let w = Workload::prepare(kind, args.scale)?;
        note(&format!(
            "{}: {} in {}",
            kind.label(1),
            w.sources.join(", "),
            w.dir().display()
        ));
        let mut c = case(
            &args.sides,
            &w,
            1,
            |peak| share_of(peak, args.budget_share),
            &uzswap,
        )?;
        c["argv"] = json!(w.argv(1));
        c["sources"] = json!(w.sources);
        cases.push(c);
    }
    Ok(result(
        json!({
            "benchmark": "programs",
            "scale": args.scale,
            "budget_share": args.budget_share,
            "left_out": left_out,
        }),
        &args.sides,
        cases,
    ))
}

/// A budget of `share` of an unconstrained peak: whole MiB, 16 at least.
fn share_of(peak: u64, share: f64) -> u64 {
    ((peak as f64 * share) as u64).div_ceil(MIB).max(16) * MIB
}

/// The `uzswap` binary, as an absolute path (the programs run in their own
/// directory), with Ctrl-C caught from here on.
fn prepare_run(sides: &Sides) -> Result<PathBuf> {
    let uzswap = crate::bench_run::find_uzswap(sides.uzswap.as_deref())?;
    let uzswap =
        std::fs::canonicalize(&uzswap).with_context(|| format!("locating {}", uzswap.display()))?;
    catch_interrupts();
    Ok(uzswap)
}
