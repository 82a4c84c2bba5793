//! `uzswap`: thin glue over the library crates: `run`, `stats`, `plot`
//! and the demo. Arguments are parsed and validated first (clap), then turned into
//! the real configuration; `main` only maps errors to exit codes. The
//! benchmarks are a separate binary, `uzswap-bench` (crates/bench).

mod arbiter;
mod demo;
mod metrics;
mod plot;
mod preload;
mod record;
mod remote;
mod run;
mod serve;
mod stats;
mod view;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::io::Write;

#[derive(Parser)]
#[command(
    name = "uzswap",
    version,
    about = "zswap, the Linux compressed swap cache, in userspace"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// See uzswap at work: a program that fills memory with real pages and
    /// checks them, run on its own and then under `uzswap run` in a quarter
    /// of the memory it used, with a live view, and the two side by side.
    Demo {
        /// MiB the workload uses.
        #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(8..=8192))]
        mib: u32,
    },
    /// Run an unmodified program in less memory than it needs: cold pages
    /// are compressed into a pool (and the coldest written to an encrypted
    /// backing file); a fault brings them back. The budget holds the whole
    /// program, every process it starts together. Exits with the program's
    /// status (128+N if it died of signal N; 125 if it could not be started
    /// under uzswap).
    #[command(arg_required_else_help = true)]
    Run(run::Args),
    /// Live statistics of a program under `uzswap run`, its whole process
    /// tree: each process (pid, command, resident, pool, runtime, backing,
    /// allotment, faults, evictions), the totals against the budget, then
    /// the detail of the process asked about.
    Stats {
        /// The pid `uzswap run` printed, or any process of its program.
        pid: u32,
        /// One JSON object.
        #[arg(long, conflicts_with = "prometheus")]
        json: bool,
        /// Prometheus text exposition format (every process's samples
        /// labelled with its pid).
        #[arg(long)]
        prometheus: bool,
        /// The tree only, without any process's detail.
        #[arg(long)]
        brief: bool,
        /// Serve the Prometheus metrics over HTTP at HOST:PORT/metrics
        /// (each scrape reads the tree afresh) until the run exits.
        #[arg(long, value_name = "HOST:PORT", conflicts_with_all = ["json", "prometheus", "brief"])]
        serve: Option<String>,
    },
    /// Draw a recording (`uzswap run --record FILE`) as an SVG picture:
    /// the program's memory over time against its budget (resident, pool
    /// and uzswap's runtime stacked, the measured total as a line), what
    /// was written to the backing file, and faults and evictions per
    /// second.
    Plot(plot::Args),
}

/// Writes a progress line to stderr (stdout is kept for what a command
/// prints: `stats --json`, the workload's report).
fn note(msg: &str) {
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// A byte count for people: `512 B`, `1.5 MiB`.
pub fn human(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Demo { mib } => demo::demo(mib),
        Cmd::Run(args) => {
            let outcome = match run::run(&args) {
                Ok(o) => o,
                Err(e) => {
                    // 125, as env(1) and timeout(1): uzswap itself failed
                    // and the program did not run.
                    eprintln!("uzswap: error: {e:#}");
                    std::process::exit(125);
                }
            };
            if !args.quiet {
                eprint!("{}", run::summary(&args, &outcome));
            }
            std::process::exit(outcome.code);
        }
        Cmd::Plot(args) => plot::plot(&args),
        Cmd::Stats {
            pid,
            json,
            prometheus,
            brief,
            serve,
        } => {
            if let Some(addr) = serve {
                return serve::serve_tree(pid, &addr);
            }
            let out = stats::show(
                pid,
                stats::Options {
                    json,
                    prometheus,
                    brief,
                },
            )?;
            std::io::stdout().lock().write_all(out.as_bytes())?;
            Ok(())
        }
    }
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        // A closed pipe (uzswap ... | head) is not an error.
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        {
            std::process::exit(0);
        }
        eprintln!("uzswap: error: {e:#}");
        std::process::exit(1);
    }
}
