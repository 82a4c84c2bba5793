//! `uzswap demo`: the main job on the embedded default, in one command.
//!
//! One unmodified C program (the usemem workload, built here, on real
//! mixed pages of the machine's files) run twice: on its own, then under
//! `uzswap run` in a quarter of the memory it used; a live view while the
//! second run goes on (in place on a terminal, a line a second
//! otherwise), then the two side by side: memory (as the kernel counts
//! it, `Pss_Anon` sampled from /proc), where uzswap kept the rest, time,
//! and whether every page came back right; and the managed run as a
//! picture (`uzswap run --record`, drawn as `uzswap plot` draws it).

use crate::human;
use anyhow::{Context, Result};
use std::io::{BufRead, IsTerminal, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use uzswap_workload::corpus::DataKind;
use uzswap_workload::usemem::{Pattern, Report};
use uzswap_workload::usemem_c;

/// Passes over the memory after the fill.
const PASSES: u32 = 2;
/// How often the runs are looked at.
const LOOK: Duration = Duration::from_millis(100);
/// How often the live view is redrawn on a terminal.
const DRAW_TTY: Duration = Duration::from_millis(200);
/// How often it prints a line when stderr is not a terminal.
const DRAW_LINES: Duration = Duration::from_secs(1);

/// What one run of the workload showed.
struct Ran {
    report: Report,
    seconds: f64,
    /// The program's peak memory, `Pss_Anon` of its processes.
    peak_bytes: u64,
}

/// What the live view saw of the managed run, from its ledger.
#[derive(Default)]
struct Seen {
    /// The sample with the most memory (resident + pool + runtime).
    at_peak: crate::view::Totals,
    /// The most written to the backing file at once.
    backing_peak: u64,
    faults: u64,
    evictions: u64,
}

pub fn demo(mib: u32) -> Result<()> {
    let mib = mib as usize;
    let w = usemem_c::build(DataKind::Mixed, mib)?;
    let (budget, pool) = (mib / 4, mib / 8);
    let args = w.args(mib, PASSES, Pattern::Skewed);
    crate::note(&format!(
        "uzswap demo: a program that fills {mib} MiB with real pages ({}), then reads and checks \
         them {PASSES} times, mostly the same quarter",
        w.source
    ));

    crate::note("\n1/2  on its own:");
    let mut plain = Command::new(&w.bin);
    plain.args(&args);
    let alone = run(plain, |_| {})?;
    crate::note(&format!(
        "     done in {:.1} s, its memory peaked at {}",
        alone.seconds,
        human(alone.peak_bytes)
    ));

    let tmp = tempfile::Builder::new()
        .prefix("uzswap-demo.")
        .tempdir()
        .context("cannot make a directory for the run's statistics")?;
    let stats = tmp.path().join("stats.json");
    let recording = tmp.path().join("run.jsonl");
    let picture = std::env::temp_dir().join("uzswap-demo.svg");
    crate::note(&format!(
        "\n2/2  under uzswap, in a quarter of that:\n     uzswap run --memory-max {budget}M \
         --pool-max {pool}M -- usemem ...   (cold pages compressed into a pool of at most \
         {pool} MiB; the coldest written to an encrypted, unlinked file in {})",
        std::env::temp_dir().display()
    ));
    let mut managed = Command::new(std::env::current_exe()?);
    managed
        .args(["run", "--quiet"])
        .args(["--memory-max", &format!("{budget}M")])
        .args(["--pool-max", &format!("{pool}M")])
        .arg("--stats-json")
        .arg(&stats)
        .arg("--record")
        .arg(&recording)
        .arg("--")
        .arg(&w.bin)
        .args(&args);
    let mut live = Live::new(budget as u64 * (1 << 20));
    let under = run(managed, |pid| live.look(pid))?;
    live.end();
    let under = Ran {
        peak_bytes: read_peak(&stats)?,
        ..under
    };

    let mut out = std::io::stdout().lock();
    write!(out, "{}", side_by_side(&alone, &under, &live.seen, budget))?;
    let svg = crate::plot::draw(&crate::record::read(&recording)?)?;
    std::fs::write(&picture, svg)
        .with_context(|| format!("cannot write the picture {}", picture.display()))?;
    writeln!(
        out,
        "\nthe run as a picture (memory against the budget over time, what went to disk, \
         faults and evictions per second): {}",
        picture.display()
    )?;
    anyhow::ensure!(
        under.report.corrupt_pages == 0 && alone.report.corrupt_pages == 0,
        "pages came back wrong: {} under uzswap, {} on its own",
        under.report.corrupt_pages,
        alone.report.corrupt_pages
    );
    Ok(())
}

/// Runs `cmd` (its stdout the workload's report), calling `look` with its
/// pid every [`LOOK`] and sampling its tree's memory, until it exits.
fn run(mut cmd: Command, mut look: impl FnMut(u32)) -> Result<Ran> {
    let started = Instant::now();
    let mut child: Child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the workload")?;
    let pid = child.id();
    let mut peak = 0u64;
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        let me = std::process::id();
        peak = peak.max(uzswap_ledger::proc_sample::sample(pid, &[me]).pss_anon);
        look(pid);
        std::thread::sleep(LOOK);
    };
    let seconds = started.elapsed().as_secs_f64();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    let report: Report = serde_json::from_str(line.trim()).with_context(|| {
        format!("the workload printed no report ({status}); the messages above say why")
    })?;
    anyhow::ensure!(status.success(), "the workload failed: {status}");
    Ok(Ran {
        report,
        seconds,
        peak_bytes: peak,
    })
}

/// The tree's peak memory in `uzswap run --stats-json` (`Pss_Anon` of
/// its processes and of `uzswap run`, after start-up).
fn read_peak(path: &Path) -> Result<u64> {
    let v: serde_json::Value = serde_json::from_slice(
        &std::fs::read(path).with_context(|| format!("uzswap run wrote no {}", path.display()))?,
    )?;
    v.pointer("/tree/peak_bytes")
        .and_then(serde_json::Value::as_u64)
        .with_context(|| format!("{} has no tree.peak_bytes", path.display()))
}

/// The live view of the managed run: the tree's memory against the
/// budget, where the rest is, and the fault and eviction rates.
struct Live {
    budget: u64,
    tty: bool,
    started: Instant,
    last_draw: Option<Instant>,
    last: Option<(Instant, u64, u64)>,
    seen: Seen,
}

impl Live {
    fn new(budget: u64) -> Live {
        Live {
            budget,
            tty: std::io::stderr().is_terminal(),
            started: Instant::now(),
            last_draw: None,
            last: None,
            seen: Seen::default(),
        }
    }

    /// Looks at the run `pid` and redraws when it is time.
    fn look(&mut self, pid: u32) {
        // Not there yet (the program is starting) or gone: nothing to show.
        let Ok(v) = crate::view::tree(pid, true) else {
            return;
        };
        let t = v.totals;
        if t.memory_bytes() == 0 && t.faults == 0 {
            return; // its processes have not reported yet
        }
        if t.memory_bytes() >= self.seen.at_peak.memory_bytes() {
            self.seen.at_peak = t.clone();
        }
        self.seen.backing_peak = self.seen.backing_peak.max(t.backing_bytes);
        self.seen.faults = self.seen.faults.max(t.faults);
        self.seen.evictions = self.seen.evictions.max(t.evictions);
        let now = Instant::now();
        let every = if self.tty { DRAW_TTY } else { DRAW_LINES };
        if self.last_draw.is_some_and(|d| now - d < every) {
            return;
        }
        let rates = self.last.map(|(at, f, e)| {
            let s = (now - at).as_secs_f64().max(1e-3);
            (
                t.faults.saturating_sub(f) as f64 / s,
                t.evictions.saturating_sub(e) as f64 / s,
            )
        });
        self.last = Some((now, t.faults, t.evictions));
        self.last_draw = Some(now);
        let line = live_line(self.started.elapsed().as_secs_f64(), &t, self.budget, rates);
        let mut err = std::io::stderr().lock();
        let _ = if self.tty {
            // Over the previous line: carriage return, clear to its end.
            write!(err, "\r\x1b[K{line}")
        } else {
            writeln!(err, "{line}")
        };
        let _ = err.flush();
    }

    /// Ends the in-place line.
    fn end(&self) {
        if self.tty && self.last_draw.is_some() {
            crate::note("");
        }
    }
}

/// One line of the live view.
fn live_line(secs: f64, t: &crate::view::Totals, budget: u64, rates: Option<(f64, f64)>) -> String {
    const WIDTH: usize = 20;
    let mem = t.memory_bytes();
    let filled = ((mem as f64 / budget.max(1) as f64) * WIDTH as f64).round() as usize;
    let bar: String = (0..WIDTH)
        .map(|i| if i < filled.min(WIDTH) { '#' } else { '.' })
        .collect();
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    let mut s = format!(
        "     {secs:5.1} s  memory {:6.1} of {:.0} MiB [{bar}]  resident {:.1}, pool {:.1}, uzswap {:.1}  on disk {:.1} MiB",
        mib(mem),
        mib(budget),
        mib(t.resident_bytes),
        mib(t.pool_bytes),
        mib(t.runtime_bytes),
        mib(t.backing_bytes),
    );
    if let Some((f, e)) = rates {
        s += &format!("  {} faults/s, {} evictions/s", per_s(f), per_s(e));
    }
    s
}

/// A rate, short: `950`, `12.3k`.
fn per_s(x: f64) -> String {
    if x >= 1000.0 {
        format!("{:.1}k", x / 1000.0)
    } else {
        format!("{x:.0}")
    }
}

/// The two runs side by side.
fn side_by_side(alone: &Ran, under: &Ran, seen: &Seen, budget_mib: usize) -> String {
    let budget = budget_mib as u64 * (1 << 20);
    let p = &seen.at_peak;
    let rows: Vec<(&str, String, String)> = vec![
        (
            "the program's memory (peak)",
            human(alone.peak_bytes),
            format!(
                "{}, {:.2}x its budget of {}",
                human(under.peak_bytes),
                under.peak_bytes as f64 / budget as f64,
                human(budget)
            ),
        ),
        (
            "  of it, at its peak",
            "all resident".into(),
            format!(
                "resident {}, pool {}, uzswap {}",
                human(p.resident_bytes),
                human(p.pool_bytes),
                human(p.runtime_bytes)
            ),
        ),
        (
            "on disk (backing file, peak)",
            "-".into(),
            human(seen.backing_peak),
        ),
        (
            "pages evicted / faults",
            "-".into(),
            format!("{} / {}", seen.evictions, seen.faults),
        ),
        (
            "time",
            format!("{:.1} s", alone.seconds),
            format!(
                "{:.1} s ({:.1}x)",
                under.seconds,
                under.seconds / alone.seconds.max(1e-3)
            ),
        ),
        (
            "pages checked, wrong",
            format!(
                "{}, {}",
                alone.report.pages * u64::from(PASSES),
                alone.report.corrupt_pages
            ),
            format!(
                "{}, {}",
                under.report.pages * u64::from(PASSES),
                under.report.corrupt_pages
            ),
        ),
    ];
    let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let w1 = rows
        .iter()
        .map(|r| r.1.len())
        .chain([14])
        .max()
        .unwrap_or(0);
    let mut s = format!(
        "\n{:w0$}  {:w1$}  {}\n",
        "",
        "on its own",
        format_args!("under uzswap run --memory-max {budget_mib}M")
    );
    for (a, b, c) in rows {
        s += &format!("{a:w0$}  {b:w1$}  {c}\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_line_fills_its_bar_by_the_budget() {
        let t = crate::view::Totals {
            resident_bytes: 30 << 20,
            pool_bytes: 2 << 20,
            ..Default::default()
        };
        let l = live_line(1.0, &t, 64 << 20, Some((12_345.0, 10.0)));
        assert!(
            l.contains("memory   32.0 of 64 MiB [##########..........]"),
            "{l}"
        );
        assert!(l.contains("12.3k faults/s, 10 evictions/s"), "{l}");
        // Over the budget: the bar is full, not longer.
        let t = crate::view::Totals {
            resident_bytes: 100 << 20,
            ..Default::default()
        };
        let l = live_line(1.0, &t, 64 << 20, None);
        assert!(l.contains(&format!("[{}]", "#".repeat(20))), "{l}");
    }
}
