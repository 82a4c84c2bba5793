//! The usemem workload as an unmodified C program: `workloads/usemem.c`,
//! compiled on the machine that runs it, with its corpus pages written to a
//! file it maps. One build serves `uzswap demo` and `uzswap-bench run`
//! (which runs the same binary under `uzswap run` and under a memory
//! cgroup with the kernel's zswap).
//!
//! Everything lives in a private directory (mode 0700) in `$TMPDIR` that is
//! removed when the [`Program`] is dropped.

use crate::corpus::DataKind;
use crate::usemem::Pattern;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workload's source, compiled on the machine that runs it.
const USEMEM_C: &str = include_str!("../workloads/usemem.c");

/// The C workload, built, and its corpus file.
pub struct Program {
    dir: tempfile::TempDir,
    /// The compiled program.
    pub bin: PathBuf,
    /// Its page contents, a file of whole pages.
    pub corpus: PathBuf,
    /// Where the pages came from, for reports.
    pub source: String,
}

/// Writes the corpus pages for `mib` of workload to a file and compiles
/// the workload with `cc`.
pub fn build(data: DataKind, mib: usize) -> Result<Program> {
    let dir = temp_dir()?;
    let pages = crate::corpus::load_for_workload(data, mib)?;
    let corpus = dir.path().join("corpus.pages");
    std::fs::write(&corpus, &pages.bytes)
        .with_context(|| format!("writing {} (is $TMPDIR full?)", corpus.display()))?;
    let src = dir.path().join("usemem.c");
    std::fs::write(&src, USEMEM_C)?;
    let bin = dir.path().join("usemem");
    let out = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .context("the workload is C: a C compiler (cc) is needed; install gcc or clang")?;
    if !out.status.success() {
        bail!(
            "cc could not build the usemem workload:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(Program {
        dir,
        bin,
        corpus,
        source: pages.source,
    })
}

impl Program {
    /// The program's arguments for `mib` MiB, `passes` passes over `pattern`
    /// (a caller may append the cgroup's `tasks` file).
    pub fn args(&self, mib: usize, passes: u32, pattern: Pattern) -> Vec<String> {
        vec![
            self.corpus.to_string_lossy().into_owned(),
            mib.to_string(),
            passes.to_string(),
            format!("{pattern:?}").to_lowercase(),
        ]
    }

    /// The private directory the program lives in, for files that go with
    /// a run (removed with the program).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A private directory (0700) in `$TMPDIR` for the workload, removed when dropped.
fn temp_dir() -> Result<tempfile::TempDir> {
    let base = std::env::temp_dir();
    tempfile::Builder::new()
        .prefix("uzswap-usemem.")
        .tempdir_in(&base)
        .with_context(|| format!("cannot make a directory in {} (set TMPDIR)", base.display()))
}
