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
    dir: TempDir,
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
    let dir = TempDir::new()?;
    let pages = crate::corpus::load_for_workload(data, mib)?;
    let corpus = dir.0.join("corpus.pages");
    std::fs::write(&corpus, &pages.bytes)
        .with_context(|| format!("writing {} (is $TMPDIR full?)", corpus.display()))?;
    let src = dir.0.join("usemem.c");
    std::fs::write(&src, USEMEM_C)?;
    let bin = dir.0.join("usemem");
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
        &self.dir.0
    }
}

/// A private directory (mode 0700) in `$TMPDIR`, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        for i in 0..100u32 {
            let p = base.join(format!("uzswap-usemem.{}.{i}", std::process::id()));
            match std::fs::DirBuilder::new().mode(0o700).create(&p) {
                Ok(()) => return Ok(TempDir(p)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("cannot make a directory in {} (set TMPDIR)", base.display())
                    })
                }
            }
        }
        bail!("cannot make a private directory in {}", base.display())
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
