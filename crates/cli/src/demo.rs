//! `uzswap demo`: the main job on the embedded default, in one command.

use crate::note;
use anyhow::{Context, Result};
use std::io::{BufRead, Write};
use uzswap_workload::corpus::DataKind;
use uzswap_workload::usemem::{Pattern, Report};
use uzswap_workload::usemem_c;

/// The main job on the embedded default: an unmodified C program (the
/// usemem workload, built here) run by `uzswap run` in a quarter of the
/// memory it uses, on real mixed pages; its cold pages are compressed into
/// the pool, capped at an eighth so that the coldest are written back to
/// an encrypted, unlinked file in `$TMPDIR`. Shows the live statistics
/// once the pool is in use, and the run's summary at the end.
pub fn demo(mib: u32) -> Result<()> {
    let mib = mib as usize;
    let w = usemem_c::build(DataKind::Mixed, mib)?;
    note(&format!("data: {}", w.source));
    let (budget, pool) = (mib / 4, mib / 8);
    let tmp = std::env::temp_dir();
    note(&format!(
        "uzswap run --memory-max {budget}M --pool-max {pool}M --backing-file {} -- usemem ({mib} MiB, 2 passes, skewed)",
        tmp.display()
    ));
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .arg("run")
        .args(["--memory-max", &format!("{budget}M")])
        .args(["--pool-max", &format!("{pool}M")])
        .arg("--backing-file")
        .arg(&tmp)
        .arg("--")
        .arg(&w.bin)
        .args(w.args(mib, 2, Pattern::Skewed))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("starting uzswap run")?;
    let pid = child.id();
    // The live view, as `uzswap stats PID` shows it, once pages are coming
    // back from the pool.
    let mut out = std::io::stdout().lock();
    for _ in 0..600 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let Ok(v) = crate::stats::get(pid) else {
            continue;
        };
        if v.pager.faults_pool > 0 {
            writeln!(out, "live, from `uzswap stats {pid}`:")?;
            write!(out, "{}", crate::stats::text(&v))?;
            break;
        }
    }
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    let status = child.wait()?;
    let report: Report = serde_json::from_str(line.trim()).with_context(|| {
        format!("the workload printed no report ({status}); uzswap run's messages above say why")
    })?;
    writeln!(
        out,
        "usemem: {} pages, fill {:.0} KB/s, {} passes {:.0} KB/s, corrupt pages: {}",
        report.pages, report.fill_kbps, report.passes, report.pass_kbps, report.corrupt_pages
    )?;
    anyhow::ensure!(
        report.corrupt_pages == 0 && status.success(),
        "{} pages came back wrong ({status})",
        report.corrupt_pages
    );
    Ok(())
}
