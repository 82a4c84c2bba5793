//! Page contents for the demo and the benchmarks, drawn from real files of
//! this machine (never from one repeated pattern).
//!
//! - `text`: source and documentation text: C headers under /usr/include and
//!   plain-text files under /usr/share, Python and JavaScript sources under
//!   /usr/lib/python3*, /usr/lib/node_modules (files with no NUL byte).
//! - `bin`: machine code: ELF executables and shared libraries under
//!   /usr/bin and /usr/lib/x86_64-linux-gnu.
//! - `mixed`: the project's standard mix, with the shares the zswap mails report:
//!   10 % zero pages, 5 % pages of one repeated non-zero word, 45 % text,
//!   25 % machine code, 5 % random bytes, 10 % copies of a few text pages.
//! - `text75`: the text pages whose lz4-compressed size is 70–80 % of a
//!   page, the "text (75 %)" data of the zcache xcfmalloc measurements
//!   (real pages selected by their compressibility, not a made-up pattern).
//! - `zero`: zero-filled pages (those measurements' other data set).
//!
//! Files are walked in sorted order and at most 128 pages are taken from any
//! one file, so a large file cannot dominate; a page equal to one already
//! taken is skipped (text and machine code are distinct pages, so `mixed`
//! holds exactly its declared tenth of copies); pages are then shuffled with
//! a fixed seed, so runs are repeatable on one machine.

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
    /// Anonymous memory of real Python and Node.js processes.
    Heap,
    /// Text pages that lz4 compresses to 70–80 % of their size.
    Text75,
    /// Zero-filled pages.
    Zero,
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

    /// These pages repeated in order until there are `count` of them, for
    /// consumers that see only sizes (the allocator benchmark), so a pool can
    /// be larger than the machine's distinct pages. The source says so.
    pub fn cycled(mut self, count: usize) -> Pages {
        let distinct = self.count();
        if distinct == 0 || count <= distinct {
            return self;
        }
        let orig = std::mem::take(&mut self.bytes);
        self.bytes.reserve_exact(count * PAGE);
        while self.bytes.len() < count * PAGE {
            let n = (count * PAGE - self.bytes.len()).min(orig.len());
            self.bytes.extend_from_slice(&orig[..n]);
        }
        self.source = format!(
            "{} ({distinct} distinct pages repeated in order to {count}, each about {:.1} times)",
            self.source,
            count as f64 / distinct as f64
        );
        self
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

/// Reads up to `count` distinct pages from files under `roots` accepted by
/// `accept`. A file reached twice (a hard link) is read once and a page
/// equal to one already taken is skipped: a machine holds many identical
/// files (licences, documentation, vendored packages), and the mixed data's
/// share of duplicate pages must be the one it declares, not whatever the
/// machine's file tree happens to repeat (21 % more on this project's
/// build machine).
fn gather(roots: &[&str], accept: fn(&[u8]) -> bool, count: usize) -> Result<(Vec<u8>, usize)> {
    use std::os::unix::fs::MetadataExt;
    let mut files = Vec::new();
    for r in roots {
        walk(Path::new(r), &mut files);
    }
    files.dedup();
    let mut out = Vec::with_capacity(count.min(1 << 16) * PAGE);
    let mut used = 0;
    let mut inodes = std::collections::HashSet::new();
    let mut pages = std::collections::HashSet::new();
    for f in files {
        if out.len() >= count * PAGE {
            break;
        }
        if let Ok(m) = std::fs::metadata(&f) {
            if !inodes.insert((m.dev(), m.ino())) {
                continue;
            }
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
            if pages.insert(xxhash_rust::xxh3::xxh3_128(chunk)) {
                out.extend_from_slice(chunk);
            }
        }
    }
    Ok((out, used))
}

const TEXT_ROOTS: [&str; 5] = [
    "/usr/include",
    "/usr/share",
    "/usr/lib/python3",
    "/usr/lib/python3.11",
    "/usr/lib/node_modules",
];

fn text_pages(count: usize) -> Result<(Vec<u8>, String)> {
    let roots = TEXT_ROOTS;
    let (b, files) = gather(&roots, is_text, count)?;
    if b.len() < count * PAGE {
        bail!(
            "found only {} text pages under {roots:?}, {count} wanted: ask for fewer MiB",
            b.len() / PAGE
        );
    }
    Ok((
        b,
        format!(
            "distinct text pages from {files} files under {}",
            roots.join(", ")
        ),
    ))
}

/// Real pages whose lz4 size is 70–80 % of a page: text first; the machine
/// holds too few such text pages for most sizes, so machine-code pages in
/// the same band fill up the rest (the source line says how many of each).
/// Every page of both kinds is compressed (the 128-pages-per-file cap still
/// holds) and the first `count` in the band are kept.
fn text75_pages(count: usize) -> Result<(Vec<u8>, String)> {
    let (lo, hi) = (PAGE * 70 / 100, PAGE * 80 / 100);
    let mut out = Vec::with_capacity(count * PAGE);
    let mut buf = vec![0u8; lz4_flex::block::get_maximum_output_size(PAGE)];
    let mut sum = 0usize;
    let mut parts = Vec::new();
    for (roots, accept, what) in [
        (&TEXT_ROOTS[..], is_text as fn(&[u8]) -> bool, "text"),
        (&BIN_ROOTS[..], is_elf, "machine code"),
    ] {
        if out.len() >= count * PAGE {
            break;
        }
        let (all, files) = gather(roots, accept, usize::MAX / PAGE)?;
        let before = out.len();
        for page in all.chunks_exact(PAGE) {
            if out.len() >= count * PAGE {
                break;
            }
            let n = lz4_flex::block::compress_into(page, &mut buf).expect("buffer is large enough");
            if (lo..=hi).contains(&n) {
                out.extend_from_slice(page);
                sum += n;
            }
        }
        parts.push(format!(
            "{} {what} pages (of {} from {files} files under {})",
            (out.len() - before) / PAGE,
            all.len() / PAGE,
            roots.join(", ")
        ));
    }
    let got = out.len() / PAGE;
    if got < count {
        bail!(
            "only {got} pages compress to 70-80 % with lz4 ({}), {count} wanted: ask for at most {} MiB",
            parts.join("; "),
            got / 256
        );
    }
    Ok((
        out,
        format!(
            "pages with lz4 size 70-80 % of 4096 (mean {:.1} %): {}",
            sum as f64 / (got * PAGE) as f64 * 100.0,
            parts.join("; ")
        ),
    ))
}

const BIN_ROOTS: [&str; 2] = ["/usr/bin", "/usr/lib/x86_64-linux-gnu"];

fn bin_pages(count: usize) -> Result<(Vec<u8>, String)> {
    let roots = BIN_ROOTS;
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
            "distinct machine-code pages from {files} ELF files under {}",
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
        DataKind::Heap => heap_pages(count)?,
        DataKind::Text75 => text75_pages(count)?,
        DataKind::Zero => (vec![0; count * PAGE], "zero-filled pages".to_string()),
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

/// Anonymous memory of real programs: a Python interpreter and a Node.js
/// process, each started here to build sizeable data structures out of the
/// machine's text (dicts, lists, strings, numbers; objects, arrays, maps),
/// then read through /proc/PID/mem, taking only the pages that are present
/// (per /proc/PID/pagemap) in private anonymous mappings. Needs root (or
/// ptrace rights over the children) and python3/node on the PATH.
pub fn heap_pages(count: usize) -> Result<(Vec<u8>, String)> {
    let mib_each = (count * PAGE / 2).div_ceil(1 << 20).max(4);
    let py = format!(
        r#"
import sys, os
words = []
for root in ("/usr/include",):
    for d, _, fs in os.walk(root):
        for f in sorted(fs):
            try: words += open(os.path.join(d, f), errors="ignore").read().split()
            except OSError: pass
        if len(words) > 2_000_000: break
target = {mib_each} << 20
data, size, i = {{}}, 0, 0
while size < target:
    w = words[i % len(words)]
    data.setdefault(w[:8], []).append((i, w, float(i) / 7, w.upper()))
    size += 160; i += 1
print("ready", flush=True)
sys.stdin.readline()
"#
    );
    let js = format!(
        r#"
const fs = require("fs"), path = require("path");
let words = [];
(function walk(d) {{ for (const f of fs.readdirSync(d).sort()) {{ if (words.length > 2e6) return;
  const p = path.join(d, f); let st; try {{ st = fs.statSync(p); }} catch (e) {{ continue; }}
  if (st.isDirectory()) walk(p); else {{ try {{ words.push(...fs.readFileSync(p, "latin1").split(/\s+/)); }} catch (e) {{}} }} }} }})("/usr/include");
const target = {mib_each} * 1048576; const m = new Map(); const arr = []; let size = 0, i = 0;
while (size < target) {{ const w = words[i % words.length];
  const o = {{ id: i, w: w, n: i / 7, u: w.toUpperCase() }}; arr.push(o);
  if (!m.has(w)) m.set(w, []); m.get(w).push(i); size += 120; i++; }}
console.log("ready");
process.stdin.once("data", () => process.exit(0));
"#
    );
    let mut out = Vec::with_capacity(count * PAGE);
    let mut sources = Vec::new();
    for (prog, args) in [("python3", vec!["-c", &py]), ("node", vec!["-e", &js])] {
        let half = if out.is_empty() {
            count / 2
        } else {
            count - out.len() / PAGE
        };
        let pages = dump_process(prog, &args, half)
            .with_context(|| format!("reading the heap of a {prog} process"))?;
        sources.push(format!("{} pages of {prog}", pages.len() / PAGE));
        out.extend_from_slice(&pages);
    }
    if out.len() < count * PAGE {
        bail!(
            "the programs' heaps gave only {} pages of {count}: ask for fewer MiB",
            out.len() / PAGE
        );
    }
    out.truncate(count * PAGE);
    Ok((
        out,
        format!(
            "heap: present anonymous pages of real processes ({}) built from /usr/include words",
            sources.join(", ")
        ),
    ))
}

/// Starts `prog`, waits for it to print "ready", and reads up to `want`
/// present pages of its private anonymous mappings.
fn dump_process(prog: &str, args: &[&str], want: usize) -> Result<Vec<u8>> {
    use std::io::{BufRead, Read, Seek, SeekFrom};
    let mut child = std::process::Command::new(prog)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {prog}: is it installed?"))?;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
    if line.trim() != "ready" {
        let _ = child.kill();
        bail!("{prog} did not get ready");
    }
    let pid = child.id();
    let result = (|| -> Result<Vec<u8>> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))?;
        let mut mem = std::fs::File::open(format!("/proc/{pid}/mem"))?;
        let mut pagemap = std::fs::File::open(format!("/proc/{pid}/pagemap"))?;
        let mut out = Vec::new();
        let mut page = vec![0u8; PAGE];
        for l in maps.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            // start-end perms offset dev inode [name]: private, writable,
            // not file-backed (inode 0), not the stack or vsyscall areas.
            if f.len() < 5 || !f[1].starts_with("rw") || !f[1].ends_with('p') || f[4] != "0" {
                continue;
            }
            if f.get(5)
                .is_some_and(|n| n.starts_with("[s") || n.starts_with("[v"))
            {
                continue;
            }
            let (a, b) = f[0].split_once('-').expect("maps range");
            let (a, b) = (u64::from_str_radix(a, 16)?, u64::from_str_radix(b, 16)?);
            let mut entries = vec![0u8; ((b - a) / PAGE as u64 * 8) as usize];
            pagemap.seek(SeekFrom::Start(a / PAGE as u64 * 8))?;
            pagemap.read_exact(&mut entries)?;
            for (k, e) in entries.chunks_exact(8).enumerate() {
                if out.len() >= want * PAGE {
                    return Ok(out);
                }
                let e = u64::from_ne_bytes(e.try_into().expect("8 bytes"));
                if e >> 63 == 0 {
                    continue; // not present: never touched
                }
                mem.seek(SeekFrom::Start(a + (k * PAGE) as u64))?;
                if mem.read_exact(&mut page).is_ok() {
                    out.extend_from_slice(&page);
                }
            }
        }
        Ok(out)
    })();
    let _ = child.kill();
    let _ = child.wait();
    result
}

/// What a set of pages is made of: pages of one repeated 8-byte word (zero
/// pages among them) and pages identical to an earlier page.
#[derive(Debug, Default, Clone, Copy, serde::Serialize)]
pub struct Composition {
    pub pages: u64,
    pub zero: u64,
    pub same_filled_nonzero: u64,
    /// Pages equal, byte for byte, to an earlier page that is not
    /// same-filled.
    pub duplicate: u64,
}

impl Pages {
    pub fn composition(&self) -> Composition {
        use std::collections::HashMap;
        use std::hash::{Hash, Hasher};
        let mut c = Composition {
            pages: self.count() as u64,
            ..Composition::default()
        };
        let mut seen: HashMap<u64, Vec<usize>> = HashMap::new();
        for i in 0..self.count() {
            let p = self.page(i);
            let w = &p[..8];
            if p.chunks_exact(8).all(|c| c == w) {
                if w == [0u8; 8] {
                    c.zero += 1;
                } else {
                    c.same_filled_nonzero += 1;
                }
                continue;
            }
            let mut h = std::collections::hash_map::DefaultHasher::new();
            p.hash(&mut h);
            let list = seen.entry(h.finish()).or_default();
            if list.iter().any(|&j| self.page(j) == p) {
                c.duplicate += 1;
            } else {
                list.push(i);
            }
        }
        c
    }
}

/// Distinct pages a workload draws (it cycles through them beyond that):
/// the machine holds only ~220 MiB of text files.
pub const WORKLOAD_DISTINCT_MIB: usize = 256;

/// The pages for a workload of `mib` MiB: at most
/// [`WORKLOAD_DISTINCT_MIB`] distinct ones, cycled by the workload.
pub fn load_for_workload(kind: DataKind, mib: usize) -> Result<Pages> {
    load(kind, mib.min(WORKLOAD_DISTINCT_MIB) * 256)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Identical files, a hard link and a page repeated inside a file all
    /// give their pages once.
    #[test]
    fn gather_takes_each_distinct_page_once() {
        let dir = std::env::temp_dir().join(format!("uzswap-gather-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let page = |c: u8| vec![c; PAGE];
        let file: Vec<u8> = [page(b'a'), page(b'b'), page(b'a')].concat();
        std::fs::write(dir.join("one"), &file).unwrap();
        std::fs::write(dir.join("two"), &file).unwrap();
        std::fs::hard_link(dir.join("one"), dir.join("three")).unwrap();
        std::fs::write(dir.join("four"), [page(b'c'), page(b'b')].concat()).unwrap();
        let (bytes, files) = gather(&[dir.to_str().unwrap()], is_text, 100).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let mut got: Vec<u8> = bytes.chunks_exact(PAGE).map(|p| p[0]).collect();
        got.sort_unstable();
        assert_eq!(got, b"abc");
        assert_eq!(files, 3, "the hard link is not read again");
    }

    #[test]
    fn cycled_repeats_pages_in_order_and_says_so() {
        let mut bytes = vec![0u8; 3 * PAGE];
        for (i, page) in bytes.chunks_exact_mut(PAGE).enumerate() {
            page.fill(i as u8 + 1);
        }
        let pages = Pages {
            bytes,
            source: "three".into(),
        }
        .cycled(7);
        assert_eq!(pages.count(), 7);
        let firsts: Vec<u8> = (0..7).map(|i| pages.page(i)[0]).collect();
        assert_eq!(firsts, [1, 2, 3, 1, 2, 3, 1]);
        assert!(pages.source.starts_with("three (3 distinct pages"));
        // Asking for no more than there is changes nothing.
        let same = Pages {
            bytes: vec![9; 2 * PAGE],
            source: "two".into(),
        }
        .cycled(2);
        assert_eq!((same.count(), same.source.as_str()), (2, "two"));
    }
}
