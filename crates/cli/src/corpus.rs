//! Page contents for the demo and the benchmarks, drawn from real files of
//! this machine (never from one repeated pattern).
//!
//! - `text`: source and documentation text: C headers under /usr/include and
//!   plain-text files under /usr/share, Python and JavaScript sources under
//!   /usr/lib/python3*, /usr/lib/node_modules (files with no NUL byte).
//! - `bin`: machine code: ELF executables and shared libraries under
//!   /usr/bin and /usr/lib/x86_64-linux-gnu.
//! - `mixed`: the project's standard mix, with the shares the seeds report:
//!   10 % zero pages, 5 % pages of one repeated non-zero word, 45 % text,
//!   25 % machine code, 5 % random bytes, 10 % copies of a few text pages.
//!
//! Files are walked in sorted order and at most 128 pages are taken from any
//! one file, so a large file cannot dominate; pages are then shuffled with a
//! fixed seed, so runs are repeatable on one machine.

use anyhow::{bail, Context, Result};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};

pub const PAGE: usize = 4096;
const PAGES_PER_FILE: usize = 128;

/// Which pages to draw.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DataKind {
    Text,
    Bin,
    Mixed,
}

/// A set of pages, stored back to back.
pub struct Pages {
    pub bytes: Vec<u8>,
    /// Where the pages came from, for reports.
    pub source: String,
}

impl Pages {
    pub fn count(&self) -> usize {
        self.bytes.len() / PAGE
    }
    pub fn page(&self, i: usize) -> &[u8] {
        &self.bytes[i * PAGE..(i + 1) * PAGE]
    }
}

fn walk(root: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(root) else {
        return;
    };
    let mut entries: Vec<_> = rd.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let Ok(ft) = e.file_type() else { continue };
        if ft.is_dir() {
            walk(&e.path(), out);
        } else if ft.is_file() {
            out.push(e.path());
        }
    }
}

fn is_text(file: &[u8]) -> bool {
    !file.contains(&0)
}

fn is_elf(file: &[u8]) -> bool {
    file.starts_with(b"\x7fELF")
}

/// Reads up to `count` pages from files under `roots` accepted by `accept`.
fn gather(roots: &[&str], accept: fn(&[u8]) -> bool, count: usize) -> Result<(Vec<u8>, usize)> {
    let mut files = Vec::new();
    for r in roots {
        walk(Path::new(r), &mut files);
    }
    files.dedup();
    let mut out = Vec::with_capacity(count * PAGE);
    let mut used = 0;
    for f in files {
        if out.len() >= count * PAGE {
            break;
        }
        let Ok(data) = std::fs::read(&f) else {
            continue;
        };
        if data.len() < PAGE || !accept(&data) {
            continue;
        }
        used += 1;
        for chunk in data.chunks_exact(PAGE).take(PAGES_PER_FILE) {
            if out.len() >= count * PAGE {
                break;
            }
            out.extend_from_slice(chunk);
        }
    }
    Ok((out, used))
}

fn text_pages(count: usize) -> Result<(Vec<u8>, String)> {
    let roots = [
        "/usr/include",
        "/usr/share",
        "/usr/lib/python3",
        "/usr/lib/python3.11",
        "/usr/lib/node_modules",
    ];
    let (b, files) = gather(&roots, is_text, count)?;
    if b.len() < count * PAGE {
        bail!(
            "found only {} text pages under {roots:?}, {count} wanted: ask for fewer MiB",
            b.len() / PAGE
        );
    }
    Ok((
        b,
        format!("text from {files} files under {}", roots.join(", ")),
    ))
}

fn bin_pages(count: usize) -> Result<(Vec<u8>, String)> {
    let roots = ["/usr/bin", "/usr/lib/x86_64-linux-gnu"];
    let (b, files) = gather(&roots, is_elf, count)?;
    if b.len() < count * PAGE {
        bail!(
            "found only {} ELF pages under {roots:?}, {count} wanted: ask for fewer MiB",
            b.len() / PAGE
        );
    }
    Ok((
        b,
        format!(
            "machine code from {files} ELF files under {}",
            roots.join(", ")
        ),
    ))
}

/// Shuffles whole pages in place with a fixed seed.
fn shuffle_pages(bytes: &mut [u8], seed: u64) {
    let n = bytes.len() / PAGE;
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rand::rngs::SmallRng::seed_from_u64(seed));
    let old = bytes.to_vec();
    for (dst, &src) in order.iter().enumerate() {
        bytes[dst * PAGE..(dst + 1) * PAGE].copy_from_slice(&old[src * PAGE..(src + 1) * PAGE]);
    }
}

/// Builds `count` pages of the given kind.
pub fn load(kind: DataKind, count: usize) -> Result<Pages> {
    if count == 0 {
        bail!("no pages asked for: give a size of at least 1 MiB");
    }
    let (mut bytes, source) = match kind {
        DataKind::Text => text_pages(count)?,
        DataKind::Bin => bin_pages(count)?,
        DataKind::Mixed => mixed_pages(count)?,
    };
    shuffle_pages(&mut bytes, 0x757a_7377_6170);
    Ok(Pages { bytes, source })
}

fn mixed_pages(count: usize) -> Result<(Vec<u8>, String)> {
    let share = |pct: usize| count * pct / 100;
    let (zero, word, random, copies) = (share(10), share(5), share(5), share(10));
    let bin = share(25);
    let text = count - zero - word - random - copies - bin;
    let (t, tsrc) = text_pages(text).context("text share of the mix")?;
    let (b, bsrc) = bin_pages(bin).context("machine-code share of the mix")?;
    let mut r = rand::rngs::SmallRng::seed_from_u64(7);
    let mut out = Vec::with_capacity(count * PAGE);
    out.extend_from_slice(&t);
    out.extend_from_slice(&b);
    out.resize(out.len() + zero * PAGE, 0);
    for _ in 0..word {
        let w: u64 = r.gen_range(1..u64::MAX);
        for _ in 0..PAGE / 8 {
            out.extend_from_slice(&w.to_ne_bytes());
        }
    }
    for _ in 0..random * PAGE {
        out.push(r.gen());
    }
    // Copies of a few (eight) text pages.
    for i in 0..copies {
        let src = (i % 8.min(text.max(1))) * PAGE;
        let page = t[src..src + PAGE].to_vec();
        out.extend_from_slice(&page);
    }
    Ok((
        out,
        format!(
            "mixed: 10% zero, 5% one repeated word, 45% {tsrc}, 25% {bsrc}, 5% random, 10% copies of 8 text pages"
        ),
    ))
}
