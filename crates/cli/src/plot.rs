//! `uzswap plot FILE -o run.svg`: a recording (`record.rs`) as one SVG
//! picture, meant to be understood at a glance:
//!
//! - title: the command, the budget, the measured peak;
//! - top panel, memory (MiB) over time (s): resident, pool and uzswap's
//!   runtime stacked (the processes added up), the measured total
//!   (`Pss_Anon`, what the budget is checked against) as a line, the
//!   budget as a dashed line; with several processes, the largest few as
//!   thin lines;
//! - a small panel under it: what was written back to the backing file,
//!   apart, because it is disk and not memory;
//! - bottom panel: faults and evictions per second (`record::rates`).
//!
//! Drawn with plotters' SVG backend into a string, then written, so that a
//! write error names the file.

use crate::record::{self, Recording, Sample};
use anyhow::{bail, Context, Result};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::PathBuf;

/// What `uzswap plot` was asked to do.
#[derive(clap::Args)]
pub struct Args {
    /// The recording `uzswap run --record FILE` wrote.
    pub file: PathBuf,
    /// The SVG file to write (default: FILE with the extension .svg).
    #[arg(short, long, value_name = "SVG")]
    pub output: Option<PathBuf>,
}

/// The legend's names, which the tests look for.
pub const RESIDENT: &str = "resident (program memory in RAM)";
pub const POOL: &str = "compressed pool";
pub const RUNTIME: &str = "uzswap runtime";
pub const MEASURED: &str = "measured total (Pss_Anon, held to the budget)";
pub const BUDGET: &str = "budget";
pub const BACKING: &str = "written to the backing file (on disk, not memory)";
pub const FAULTS: &str = "faults/s";
pub const EVICTIONS: &str = "evictions/s";
/// Processes drawn as lines of their own when there are several.
const TOP_PROCESSES: usize = 3;

const MIB: f64 = (1u64 << 20) as f64;
const FONT: &str = "sans-serif";
const SIZE: (u32, u32) = (1200, 900);

// The stacked areas are opaque: a translucent layer over the one under
// it would mix into a colour the legend does not show.
const C_RESIDENT: RGBColor = RGBColor(140, 180, 225);
const C_POOL: RGBColor = RGBColor(250, 200, 120);
const C_RUNTIME: RGBColor = RGBColor(200, 175, 220);
const C_MEASURED: RGBColor = RGBColor(20, 20, 20);
const C_BUDGET: RGBColor = RGBColor(210, 40, 40);
const C_BACKING: RGBColor = RGBColor(120, 120, 120);
const C_FAULTS: RGBColor = RGBColor(0, 110, 170);
const C_EVICTIONS: RGBColor = RGBColor(210, 90, 0);
const C_PROCESSES: [RGBColor; TOP_PROCESSES] = [
    RGBColor(30, 140, 60),
    RGBColor(0, 160, 160),
    RGBColor(170, 50, 120),
];

pub fn plot(a: &Args) -> Result<()> {
    let out = match &a.output {
        Some(o) => o.clone(),
        None => a.file.with_extension("svg"),
    };
    if out
        .extension()
        .is_none_or(|e| !e.eq_ignore_ascii_case("svg"))
    {
        bail!(
            "-o {}: uzswap draws SVG only: name a .svg file (for a PNG, convert it, e.g. \
             `rsvg-convert run.svg -o run.png`)",
            out.display()
        );
    }
    if out == a.file {
        bail!(
            "{}: the recording itself would be overwritten: name the picture with -o",
            out.display()
        );
    }
    let rec = record::read(&a.file)?;
    let svg = draw(&rec).context("cannot draw the recording")?;
    std::fs::write(&out, svg)
        .with_context(|| format!("cannot write {}: check the path", out.display()))?;
    crate::note(&format!("uzswap: drew {}", out.display()));
    Ok(())
}

/// The picture of `rec`, as SVG text.
pub fn draw(rec: &Recording) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        panels(&root, rec).map_err(|e| anyhow::anyhow!("{e}"))?;
        root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(svg)
}

type DrawResult = std::result::Result<(), Box<dyn std::error::Error>>;

fn panels(root: &DrawingArea<SVGBackend, Shift>, rec: &Recording) -> DrawResult {
    root.fill(&WHITE)?;
    let s = &rec.samples;
    let budget = rec.header.budget_bytes;
    let (peak_t, peak) = peak(s);
    let seconds = s.last().map_or(0.0, |l| l.t);
    let title = format!(
        "{} — budget {}, measured peak {} ({:.2}x) at {:.1} s, {:.1} s run",
        command_line(&rec.header.command),
        crate::human(budget),
        crate::human(peak),
        peak as f64 / budget.max(1) as f64,
        peak_t,
        seconds,
    );
    let area = root.titled(&title, (FONT, 20))?;
    let (top, rest) = area.split_vertically(500);
    let (middle, bottom) = rest.split_vertically(150);
    let x = 0.0..seconds.max(0.1);
    memory(&top, rec, x.clone(), (peak_t, peak))?;
    backing(&middle, s, x.clone())?;
    rates(&bottom, s, x)
}

/// A stacked layer: its name, its colour, the top of its area.
type Layer = (&'static str, RGBColor, fn(&record::Usage) -> u64);

/// The top panel: memory stacked, the measured total, the budget.
fn memory(
    area: &DrawingArea<SVGBackend, Shift>,
    rec: &Recording,
    x: std::ops::Range<f64>,
    (peak_t, peak): (f64, u64),
) -> DrawResult {
    let s = &rec.samples;
    let highest = s
        .iter()
        .map(|p| p.measured_bytes.max(p.total.charged()).max(p.budget_bytes))
        .max()
        .unwrap_or(0) as f64
        / MIB;
    // Headroom above the data for the legend (up to 8 entries).
    let mut chart = panel(
        area,
        Axes {
            caption: Some("memory of the whole program"),
            x,
            top: highest * 1.7,
            x_desc: Some("seconds"),
            y_desc: "MiB",
            y_labels: 10,
            y_label: &|v| format!("{v:.0}"),
        },
    )?;
    let mib = |b: u64| b as f64 / MIB;
    // Stacked: each area is drawn from 0 to the sum of its layer and
    // those under it, the highest first so that the lower ones cover it.
    let layers: [Layer; 3] = [
        (RUNTIME, C_RUNTIME, |u| u.charged()),
        (POOL, C_POOL, |u| u.resident_bytes + u.pool_bytes),
        (RESIDENT, C_RESIDENT, |u| u.resident_bytes),
    ];
    for (name, color, top) in layers {
        chart
            .draw_series(
                AreaSeries::new(
                    s.iter().map(|p| (p.t, mib(top(&p.total)))),
                    0.0,
                    color.filled(),
                )
                .border_style(color),
            )?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 18, y + 6)], color.filled()));
    }
    for (i, (label, points)) in top_processes(s).into_iter().enumerate() {
        let color = C_PROCESSES[i];
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(1)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(1)));
    }
    chart
        .draw_series(LineSeries::new(
            s.iter().map(|p| (p.t, mib(p.measured_bytes))),
            C_MEASURED.stroke_width(2),
        ))?
        .label(MEASURED)
        .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], C_MEASURED.stroke_width(2)));
    chart
        .draw_series(DashedLineSeries::new(
            s.iter().map(|p| (p.t, mib(p.budget_bytes))),
            8,
            5,
            C_BUDGET.stroke_width(2),
        ))?
        .label(format!(
            "{BUDGET} {}",
            crate::human(rec.header.budget_bytes)
        ))
        .legend(|(x, y)| dashes(x, y, C_BUDGET));
    chart.draw_series(std::iter::once(Circle::new(
        (peak_t, mib(peak)),
        4,
        C_MEASURED.filled(),
    )))?;
    legend(&mut chart)
}

/// The small panel: bytes in the backing files.
fn backing(
    area: &DrawingArea<SVGBackend, Shift>,
    s: &[Sample],
    x: std::ops::Range<f64>,
) -> DrawResult {
    let most = s.iter().map(|p| p.total.backing_bytes).max().unwrap_or(0) as f64 / MIB;
    let mut chart = panel(
        area,
        Axes {
            caption: None,
            x,
            top: most * 1.6,
            x_desc: None,
            y_desc: "MiB on disk",
            y_labels: 4,
            y_label: &|v| format!("{v:.0}"),
        },
    )?;
    chart
        .draw_series(DashedLineSeries::new(
            s.iter().map(|p| (p.t, p.total.backing_bytes as f64 / MIB)),
            6,
            4,
            C_BACKING.stroke_width(2),
        ))?
        .label(BACKING)
        .legend(|(x, y)| dashes(x, y, C_BACKING));
    legend(&mut chart)
}

/// The bottom panel: faults and evictions per second.
fn rates(
    area: &DrawingArea<SVGBackend, Shift>,
    s: &[Sample],
    x: std::ops::Range<f64>,
) -> DrawResult {
    let r = record::rates(s);
    let most = r
        .iter()
        .map(|r| r.faults.max(r.evictions))
        .fold(0.0, f64::max);
    let mut chart = panel(
        area,
        Axes {
            caption: None,
            x,
            top: most * 1.4,
            x_desc: Some("seconds"),
            y_desc: "per second",
            y_labels: 5,
            y_label: &|v| per_second(*v),
        },
    )?;
    for (name, color, value) in [
        (
            FAULTS,
            C_FAULTS,
            (|r: &record::Rate| r.faults) as fn(&record::Rate) -> f64,
        ),
        (EVICTIONS, C_EVICTIONS, |r| r.evictions),
    ] {
        chart
            .draw_series(LineSeries::new(
                r.iter().map(|r| (r.t, value(r))),
                color.stroke_width(2),
            ))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    legend(&mut chart)
}

/// A panel's chart: time across, one quantity up.
type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// What differs between the panels' axes.
struct Axes<'f> {
    caption: Option<&'f str>,
    x: std::ops::Range<f64>,
    /// The top of the vertical axis (1 at least, so that an empty panel
    /// still has a scale).
    top: f64,
    x_desc: Option<&'f str>,
    y_desc: &'f str,
    y_labels: usize,
    y_label: &'f dyn Fn(&f64) -> String,
}

/// A panel on `area`, its grid and axes drawn.
fn panel<'a, 'b>(
    area: &'a DrawingArea<SVGBackend<'b>, Shift>,
    a: Axes,
) -> Result<Chart<'a, 'b>, Box<dyn std::error::Error>> {
    let mut b = ChartBuilder::on(area);
    if let Some(c) = a.caption {
        b.caption(c, (FONT, 16));
    }
    let mut chart = b
        .margin(10)
        .x_label_area_size(if a.x_desc.is_some() { 35 } else { 25 })
        .y_label_area_size(60)
        .build_cartesian_2d(a.x, 0.0..a.top.max(1.0))?;
    let mut mesh = chart.configure_mesh();
    mesh.max_light_lines(2)
        .y_desc(a.y_desc)
        .y_labels(a.y_labels)
        .y_label_formatter(a.y_label);
    if let Some(d) = a.x_desc {
        mesh.x_desc(d);
    }
    mesh.draw()?;
    Ok(chart)
}

/// The legend of a panel, top left, over its grid.
fn legend<'a, 'b: 'a>(chart: &mut Chart<'a, 'b>) -> DrawResult {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FONT, 13))
        .draw()?;
    Ok(())
}

/// A legend mark for a dashed line: two short dashes.
fn dashes<'a, DB: DrawingBackend + 'a>(
    x: i32,
    y: i32,
    color: RGBColor,
) -> impl plotters::element::IntoDynElement<'a, DB, (i32, i32)> {
    EmptyElement::at((x, y))
        + PathElement::new([(0, 0), (7, 0)], color.stroke_width(2))
        + PathElement::new([(11, 0), (18, 0)], color.stroke_width(2))
}

/// The measured peak after start-up, as the run's summary counts it (the
/// first samples are the dynamic loader and the runtimes starting), and
/// when it was reached.
fn peak(s: &[Sample]) -> (f64, u64) {
    let startup = crate::arbiter::SAMPLE.as_secs_f64() * f64::from(crate::arbiter::STARTUP_SAMPLES);
    let after: Vec<&Sample> = s.iter().filter(|p| p.t > startup).collect();
    let pool: Vec<&Sample> = if after.is_empty() {
        s.iter().collect()
    } else {
        after
    };
    pool.into_iter()
        .max_by_key(|p| p.measured_bytes)
        .map_or((0.0, 0), |p| (p.t, p.measured_bytes))
}

/// The largest few processes (by their peak of resident + pool + runtime)
/// as lines with their names, when there are several.
fn top_processes(s: &[Sample]) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut peaks: std::collections::BTreeMap<u32, (u64, String)> = Default::default();
    for p in s.iter().flat_map(|p| &p.processes) {
        // Its latest name: a process that execs keeps its pid and slot.
        let e = peaks.entry(p.pid).or_default();
        e.0 = e.0.max(p.usage.charged());
        e.1.clone_from(&p.comm);
    }
    if peaks.len() < 2 {
        return Vec::new();
    }
    let mut by_peak: Vec<(u32, u64, String)> =
        peaks.into_iter().map(|(pid, (b, c))| (pid, b, c)).collect();
    by_peak.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let total = by_peak.len();
    by_peak
        .into_iter()
        .take(TOP_PROCESSES)
        .enumerate()
        .map(|(i, (pid, _, comm))| {
            let points = s
                .iter()
                .filter_map(|p| {
                    let u = &p.processes.iter().find(|q| q.pid == pid)?.usage;
                    Some((p.t, u.charged() as f64 / MIB))
                })
                .collect();
            let of = if i == 0 {
                format!(", largest of {total} processes seen")
            } else {
                String::new()
            };
            (
                format!("{comm} ({pid}): its resident + pool + runtime{of}"),
                points,
            )
        })
        .collect()
}

/// The command for the title: printable, and if long, paths shortened to
/// their file names, then cut.
fn command_line(command: &[String]) -> String {
    const MOST: usize = 60;
    let printable = |w: &str| -> String {
        w.chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect()
    };
    let mut line = printable(&command.join(" "));
    if line.chars().count() > MOST {
        let short: Vec<&str> = command
            .iter()
            .map(|w| w.rsplit('/').find(|s| !s.is_empty()).unwrap_or(w))
            .collect();
        line = printable(&short.join(" "));
    }
    if line.chars().count() > MOST {
        line = line.chars().take(MOST - 1).chain(['…']).collect();
    }
    line
}

/// An axis label of a rate: 1500 as 1.5k.
fn per_second(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_commands_are_shortened_for_the_title() {
        let c = |w: &[&str]| command_line(&w.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(c(&["python3", "/a/b.py", "x"]), "python3 /a/b.py x");
        let long = format!("/{}/workers.py", "d".repeat(70));
        assert_eq!(c(&["python3", &long, "spawn"]), "python3 workers.py spawn");
        assert_eq!(c(&["a\nb"]), "a b");
        let cut = c(&[&"x".repeat(100)]);
        assert_eq!(cut.chars().count(), 60);
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn the_peak_leaves_out_the_start_up() {
        let at = |t: f64, m: u64| Sample {
            t,
            measured_bytes: m,
            ..Sample::default()
        };
        assert_eq!(peak(&[at(0.1, 90), at(0.5, 40), at(0.6, 50)]), (0.6, 50));
        assert_eq!(
            peak(&[at(0.1, 90), at(0.2, 10)]),
            (0.1, 90),
            "nothing after it"
        );
    }
}
