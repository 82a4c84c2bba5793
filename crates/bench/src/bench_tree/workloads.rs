//! The programs `uzswap-bench tree` runs, each in a private directory that
//! every side builds or runs in, one after the other (so paths inside the
//! outputs are the same on every side):
//! - `build`: the C libraries this project's dependencies vendor, found in
//!   the cargo registry (zstd, lz4, libdeflate, mimalloc), copied in and
//!   compiled by a generated Makefile, each `.c` to an `.o` with
//!   `gcc -O2 -g0`; the outputs are the sha256 of every `.o`;
//! - `python`: a multiprocessing program (a parent holding a dataset,
//!   three workers started by spawn, each building and checking its own);
//!   the output is its verdict line;
//! - the real programs of `uzswap-bench programs`, each checking or
//!   hashing its own result: a Python dict of records made from real text
//!   (`pydict`), a node Map (`node`), a JVM HashMap (`jvm`), a Go map in a
//!   cgo build (`go`), the same map in pure Go linked by the system's
//!   linker (`go-ext`, the build uzswap's refusal of a static Go binary
//!   asks for), `xz -9` and `sort` of real text (`xz`, `sort`). Their
//!   text is the machine's C headers (/usr/include), concatenated.

use anyhow::{bail, ensure, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Limits the build to its first N translation units (tests, quick looks).
pub const SOURCES_ENV: &str = "UZSWAP_BENCH_TREE_SOURCES";

/// The date gcc gives `__DATE__` and `__TIME__` (1 January 2026, 00:00
/// UTC): fixed, so every build compiles the same text.
const SOURCE_DATE_EPOCH: u64 = 1_767_225_600;

/// The compiler's flags for every unit.
pub const CFLAGS: &str = "-O2 -g0";

/// Which program the benchmark runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A parallel build of real C sources (`make -jN`).
    Build,
    /// A Python multiprocessing program (spawn).
    Python,
    /// A Python dict of records of real text, read back at random.
    Pydict,
    /// A node (V8) Map of records, read back twice.
    Node,
    /// A JVM HashMap of records (serial collector), read back twice.
    Jvm,
    /// A Go map of records in a cgo build, read back twice.
    Go,
    /// The same Go map in pure Go, linked by the system's linker
    /// (`CGO_ENABLED=1 go build -tags purego -ldflags=-linkmode=external`).
    #[serde(rename = "go-ext")]
    GoExt,
    /// `xz -9` of real text.
    Xz,
    /// `sort` of the lines of real text, in memory.
    Sort,
}

impl Kind {
    /// Its name in tables and the record.
    pub fn label(self, jobs: u32) -> String {
        match self {
            Kind::Build => format!("make -j{jobs}"),
            Kind::Python => "python".into(),
            Kind::Pydict => "pydict".into(),
            Kind::Node => "node".into(),
            Kind::Jvm => "jvm".into(),
            Kind::Go => "go".into(),
            Kind::GoExt => "go-ext".into(),
            Kind::Xz => "xz".into(),
            Kind::Sort => "sort".into(),
        }
    }

    /// The tool it needs on the machine, and how to ask for its version.
    fn tool(self) -> (&'static str, &'static str) {
        match self {
            Kind::Build => ("make", "--version"),
            Kind::Python | Kind::Pydict => ("python3", "--version"),
            Kind::Node => ("node", "--version"),
            Kind::Jvm => ("javac", "-version"),
            Kind::Go | Kind::GoExt => ("go", "version"),
            Kind::Xz => ("xz", "--version"),
            Kind::Sort => ("sort", "--version"),
        }
    }

    /// Whether the machine has what it needs (else the benchmark leaves it
    /// out and says so).
    pub fn available(self) -> bool {
        let (cmd, arg) = self.tool();
        Command::new(cmd)
            .arg(arg)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

/// Sizes of the real programs at `--scale 1`: footprints of 170-400 MB
/// unconstrained on the machine of docs/BENCHMARKS.md.
mod size {
    /// pydict: records and random lookups (~240 MB).
    pub const PYDICT_RECORDS: f64 = 600_000.0;
    /// node: Map entries (~340 MB).
    pub const NODE_ENTRIES: f64 = 500_000.0;
    /// jvm: HashMap entries (~310 MB with -Xmx400m).
    pub const JVM_ENTRIES: f64 = 1_000_000.0;
    /// go: map entries (~175 MB).
    pub const GO_ENTRIES: f64 = 1_000_000.0;
    /// xz: bytes of text (~230 MB at -9).
    pub const XZ_BYTES: f64 = 16e6;
    /// sort: bytes of text (~190 MB).
    pub const SORT_BYTES: f64 = 90e6;
    /// pydict's corpus: bytes of text its records cycle through.
    pub const PYDICT_CORPUS_BYTES: f64 = 24e6;
}

/// The programs' text: every C header of the machine, concatenated.
const CORPUS_ROOT: &str = "/usr/include";

/// A library vendored by a crate of the registry: where its sources are
/// in the crate, what is copied in, and what is compiled.
struct Library {
    /// Its name, and the name of its directory in the build.
    name: &'static str,
    /// The crate directory's name starts with this.
    crate_prefix: &'static str,
    /// The library's root inside the crate.
    root: &'static str,
    /// What is copied from the root (files or directories).
    copy: &'static [&'static str],
    /// Directories (under the copy) whose `.c` files are compiled, or
    /// single `.c` files.
    units: &'static [&'static str],
    /// Flags beyond [`CFLAGS`]; `@` stands for the library's directory.
    flags: &'static str,
}

/// Lightest first: a build limited by [`SOURCES_ENV`] stays quick.
const LIBRARIES: &[Library] = &[
    Library {
        name: "lz4",
        crate_prefix: "lz4-sys-",
        root: "liblz4/lib",
        copy: &["."],
        units: &["."],
        flags: "-I@",
    },
    Library {
        name: "libdeflate",
        crate_prefix: "libdeflate-sys-",
        root: "libdeflate",
        copy: &["lib", "libdeflate.h", "common_defs.h"],
        units: &["lib", "lib/x86"],
        flags: "-I@",
    },
    Library {
        name: "zstd",
        crate_prefix: "zstd-sys-",
        root: "zstd/lib",
        copy: &[
            "zstd.h",
            "zdict.h",
            "zstd_errors.h",
            "common",
            "compress",
            "decompress",
            "dictBuilder",
        ],
        units: &["common", "compress", "decompress", "dictBuilder"],
        flags: "-DZSTD_DISABLE_ASM -I@ -I@/common",
    },
    // mimalloc builds as one unit (static.c includes every source).
    Library {
        name: "mimalloc2",
        crate_prefix: "libmimalloc-sys-",
        root: "c_src/mimalloc/v2",
        copy: &["include", "src"],
        units: &["src/static.c"],
        flags: "-I@/include",
    },
    Library {
        name: "mimalloc3",
        crate_prefix: "libmimalloc-sys-",
        root: "c_src/mimalloc/v3",
        copy: &["include", "src"],
        units: &["src/static.c"],
        flags: "-I@/include",
    },
];

/// A program ready to run in its directory.
pub struct Workload {
    pub kind: Kind,
    dir: tempfile::TempDir,
    /// What was found and used (library and crate directory), for the record.
    pub sources: Vec<String>,
    /// Translation units of the build (0 for python).
    pub units: usize,
    /// Size factor of the real programs.
    scale: f64,
}

/// What one run left behind, compared with the unconstrained run's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outputs(BTreeMap<String, String>);

impl Outputs {
    pub fn count(&self) -> usize {
        self.0.len()
    }

    /// The outputs that differ from `reference`'s or are missing from
    /// either, by name.
    pub fn differing(&self, reference: &Outputs) -> Vec<String> {
        let mut names: Vec<&String> = self.0.keys().chain(reference.0.keys()).collect();
        names.sort();
        names.dedup();
        names
            .into_iter()
            .filter(|n| self.0.get(*n) != reference.0.get(*n))
            .cloned()
            .collect()
    }
}

impl Workload {
    /// Writes the program (and its data) into a private directory in
    /// $TMPDIR; the real programs are sized by `scale`.
    pub fn prepare(kind: Kind, scale: f64) -> Result<Workload> {
        let dir = tempfile::Builder::new()
            .prefix("uzswap-bench-tree-")
            .tempdir()
            .context("making a private directory in $TMPDIR")?;
        let mut w = Workload {
            kind,
            dir,
            sources: Vec::new(),
            units: 0,
            scale,
        };
        match kind {
            Kind::Build => w.write_build()?,
            Kind::Python => {
                std::fs::write(w.dir().join("tree.py"), PYTHON)?;
                w.sources.push("tree.py (written by uzswap-bench)".into());
            }
            Kind::Pydict => {
                std::fs::write(w.dir().join("pydict.py"), PYDICT)?;
                w.write_corpus(size::PYDICT_CORPUS_BYTES)?;
            }
            Kind::Node => {
                std::fs::write(w.dir().join("mapcheck.js"), NODE)?;
                w.sources
                    .push("mapcheck.js (crates/cli/tests/programs)".into());
            }
            Kind::Jvm => {
                let src = w.dir().join("HashMapCheck.java");
                std::fs::write(&src, JAVA)?;
                w.build_with(Command::new("javac").arg("-d").arg(w.dir()).arg(&src))?;
                w.sources
                    .push("HashMapCheck.java (crates/cli/tests/programs)".into());
            }
            Kind::Go | Kind::GoExt => {
                let src = w.dir().join("gomap");
                std::fs::create_dir(&src)?;
                for (name, text) in GO_FILES {
                    std::fs::write(src.join(name), text)?;
                }
                let (how, flags): (&str, &[&str]) = if kind == Kind::Go {
                    ("a cgo build", &[])
                } else {
                    (
                        "pure Go linked by the system's linker",
                        &["-tags", "purego", "-ldflags=-linkmode=external"],
                    )
                };
                w.build_with(
                    Command::new("go")
                        .arg("build")
                        .args(flags)
                        .args(["-o", "../gomap-bin", "."])
                        .current_dir(&src)
                        .env("CGO_ENABLED", "1"),
                )?;
                w.sources
                    .push(format!("gomap, {how} (crates/cli/tests/programs/gomap)"));
            }
            Kind::Xz => w.write_corpus(size::XZ_BYTES * scale)?,
            Kind::Sort => w.write_corpus(size::SORT_BYTES * scale)?,
        }
        Ok(w)
    }

    /// Runs a compiler of the workload's program; its output on failure.
    fn build_with(&self, cmd: &mut Command) -> Result<()> {
        let o = cmd
            .output()
            .with_context(|| format!("running {:?}", cmd.get_program()))?;
        ensure!(
            o.status.success(),
            "{:?} failed ({}): {}",
            cmd.get_program(),
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        Ok(())
    }

    /// `data.txt`: the first `bytes` of the machine's C headers (sorted
    /// paths, concatenated), whole lines.
    fn write_corpus(&mut self, bytes: f64) -> Result<()> {
        let want = bytes.max(4096.0) as usize;
        let mut files = Vec::new();
        collect_files(Path::new(CORPUS_ROOT), &mut files);
        files.sort();
        let mut data = Vec::with_capacity(want);
        for f in &files {
            if data.len() >= want {
                break;
            }
            if let Ok(b) = std::fs::read(f) {
                data.extend_from_slice(&b);
            }
        }
        data.truncate(want);
        if let Some(nl) = data.iter().rposition(|&b| b == b'\n') {
            data.truncate(nl + 1);
        }
        ensure!(
            data.len() >= want / 2,
            "{CORPUS_ROOT} has only {} bytes of headers; the benchmark needs {want} \
             (install a compiler's headers, or lower --scale)",
            data.len()
        );
        std::fs::write(self.dir().join("data.txt"), &data)?;
        self.sources.push(format!(
            "data.txt: {} MB of {CORPUS_ROOT}'s headers",
            data.len() / 1_000_000
        ));
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The command line of one run at `jobs` (the build's only).
    pub fn argv(&self, jobs: u32) -> Vec<String> {
        let n = |base: f64| ((base * self.scale) as u64).max(1000).to_string();
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        match self.kind {
            Kind::Build => vec!["make".into(), "-s".into(), format!("-j{jobs}")],
            Kind::Python => v(&["python3", "tree.py"]),
            Kind::Pydict => {
                let records = n(size::PYDICT_RECORDS);
                v(&["python3", "pydict.py", "data.txt", &records, &records])
            }
            Kind::Node => v(&["node", "mapcheck.js", &n(size::NODE_ENTRIES)]),
            Kind::Jvm => v(&[
                "java",
                "-Xmx400m",
                "-XX:+UseSerialGC",
                "-cp",
                ".",
                "HashMapCheck",
                &n(size::JVM_ENTRIES),
            ]),
            Kind::Go | Kind::GoExt => v(&["./gomap-bin", &n(size::GO_ENTRIES)]),
            Kind::Xz => v(&["xz", "-9", "-T1", "-k", "-f", "data.txt"]),
            Kind::Sort => v(&[
                "sort",
                "-S",
                "1G",
                "--parallel=1",
                "-o",
                "sorted.txt",
                "data.txt",
            ]),
        }
    }

    /// The file a program writes its result to, if it writes one.
    fn output_file(&self) -> Option<PathBuf> {
        match self.kind {
            Kind::Xz => Some(self.dir().join("data.txt.xz")),
            Kind::Sort => Some(self.dir().join("sorted.txt")),
            _ => None,
        }
    }

    /// The first words of the verdict line of a program that checks its
    /// own data.
    fn verdict_prefix(&self) -> Option<&'static str> {
        match self.kind {
            Kind::Python => Some("tree.py: "),
            Kind::Pydict => Some("pydict: "),
            Kind::Node | Kind::Jvm | Kind::Go | Kind::GoExt => Some("ok "),
            _ => None,
        }
    }

    /// Clears what a previous run left (the objects), so that every run
    /// starts from the same state.
    pub fn reset(&self) -> Result<()> {
        if let Some(f) = self.output_file() {
            if f.exists() {
                std::fs::remove_file(&f)?;
            }
        }
        if self.kind == Kind::Build {
            let obj = self.dir().join("obj");
            if obj.exists() {
                std::fs::remove_dir_all(&obj)?;
            }
            std::fs::create_dir(&obj)?;
        }
        Ok(())
    }

    /// What the run produced: the sha256 of every object (build), or the
    /// program's verdict line (python), from `log`, its captured output.
    pub fn outputs(&self, log: &str) -> Result<Outputs> {
        let mut out = BTreeMap::new();
        match self.kind {
            Kind::Build => {
                let mut objs: Vec<PathBuf> = std::fs::read_dir(self.dir().join("obj"))?
                    .flatten()
                    .map(|e| e.path())
                    .collect();
                objs.sort();
                out = sha256_by_name(&objs)?;
            }
            Kind::Xz | Kind::Sort => {
                let f = self.output_file().expect("a program that writes a file");
                if f.exists() {
                    out = sha256_by_name(&[f])?;
                }
            }
            _ => {
                let prefix = self.verdict_prefix().expect("a program with a verdict");
                let verdict = log
                    .lines()
                    .rfind(|l| l.starts_with(prefix))
                    .unwrap_or("no verdict");
                out.insert("verdict".into(), verdict.to_string());
            }
        }
        Ok(Outputs(out))
    }

    /// Whether `o` is a complete, correct result on its own (all objects
    /// built; the python program's data checked out).
    pub fn complete(&self, o: &Outputs) -> bool {
        match self.kind {
            Kind::Build => o.count() == self.units,
            Kind::Python => o.0.get("verdict").is_some_and(|v| v == PYTHON_OK),
            Kind::Xz | Kind::Sort => o.count() == 1,
            _ => o.0.get("verdict").is_some_and(|v| {
                v.starts_with(self.verdict_prefix().unwrap_or("?"))
                    && v.contains("ok ")
                    && !v.contains("wrong")
            }),
        }
    }

    /// Copies the libraries in and writes the Makefile.
    fn write_build(&mut self) -> Result<()> {
        let registry = registry_src()?;
        let limit: Option<usize> = match std::env::var(SOURCES_ENV) {
            Ok(v) => Some(v.parse().ok().filter(|&n| n > 0).with_context(|| {
                format!("{SOURCES_ENV}={v:?}: give a count of units, 1 or more")
            })?),
            Err(_) => None,
        };
        let mut rules = String::new();
        let mut objs = Vec::new();
        let mut missing = Vec::new();
        for lib in LIBRARIES {
            let Some(krate) = newest_crate(&registry, lib.crate_prefix) else {
                missing.push(lib.crate_prefix.trim_end_matches('-'));
                continue;
            };
            let root = krate.join(lib.root);
            if !root.is_dir() {
                missing.push(lib.crate_prefix.trim_end_matches('-'));
                continue;
            }
            let dest = self.dir().join("src").join(lib.name);
            for c in lib.copy {
                let (from, to) = match *c {
                    "." => (root.clone(), dest.clone()),
                    c => (root.join(c), dest.join(c)),
                };
                copy_tree(&from, &to)?;
            }
            self.sources.push(format!(
                "{} ({})",
                lib.name,
                krate.file_name().unwrap_or_default().to_string_lossy()
            ));
            let flags = lib.flags.replace('@', &format!("src/{}", lib.name));
            for unit in units_of(&dest, lib.units)? {
                if limit.is_some_and(|n| objs.len() >= n) {
                    break;
                }
                let rel = unit
                    .strip_prefix(self.dir())
                    .expect("under the build directory");
                let rel = rel.to_string_lossy().into_owned();
                let obj = format!(
                    "obj/{}.o",
                    rel.trim_start_matches("src/")
                        .trim_end_matches(".c")
                        .replace(['/', '.'], "_")
                );
                rules += &format!("{obj}: {rel}\n\t$(CC) $(CFLAGS) {flags} -c {rel} -o {obj}\n");
                objs.push(obj);
            }
        }
        if objs.is_empty() {
            bail!(
                "no C sources of zstd-sys, lz4-sys, libdeflate-sys or libmimalloc-sys under {}: \
                 run `cargo fetch` in this repository first",
                registry.display()
            );
        }
        if !missing.is_empty() {
            crate::note(&format!(
                "tree: not in the cargo registry, left out: {} (`cargo fetch` brings them)",
                missing.join(", ")
            ));
        }
        self.units = objs.len();
        let makefile = format!(
            "# Written by uzswap-bench tree: every unit to an object, nothing linked.\n\
             CC = gcc\nCFLAGS = {CFLAGS}\n\
             # mimalloc's options.c has __DATE__ and __TIME__: fixed, so that\n\
             # every build of the same tree gives the same bytes.\n\
             export SOURCE_DATE_EPOCH = {SOURCE_DATE_EPOCH}\n\
             .SUFFIXES:\nall: {}\n{rules}",
            objs.join(" ")
        );
        std::fs::write(self.dir().join("Makefile"), makefile)?;
        Ok(())
    }
}

/// `$CARGO_HOME/registry/src` (or `~/.cargo/...`): the directories of its
/// registries.
fn registry_src() -> Result<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .context("neither CARGO_HOME nor HOME is set: cannot find the cargo registry")?;
    let src = home.join("registry").join("src");
    ensure!(
        src.is_dir(),
        "no cargo registry at {}: run `cargo fetch` in this repository first",
        src.display()
    );
    Ok(src)
}

/// The newest crate directory starting with `prefix` in any registry.
fn newest_crate(src: &Path, prefix: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(src)
        .ok()?
        .flatten()
        .flat_map(|reg| {
            std::fs::read_dir(reg.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect();
    found.sort();
    found.pop()
}

/// The `.c` files named by `units` (directories or files) under `dir`,
/// sorted.
fn units_of(dir: &Path, units: &[&str]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for u in units {
        let p = dir.join(u);
        if p.is_file() {
            out.push(p);
            continue;
        }
        let mut cs: Vec<PathBuf> = std::fs::read_dir(&p)
            .with_context(|| format!("reading {}", p.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "c"))
            .collect();
        cs.sort();
        out.extend(cs);
    }
    Ok(out)
}

/// The sha256 of each file, by file name (coreutils' `sha256sum`).
fn sha256_by_name(files: &[PathBuf]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    if files.is_empty() {
        return Ok(out);
    }
    let o = Command::new("sha256sum")
        .args(files)
        .output()
        .context("running sha256sum (coreutils)")?;
    ensure!(o.status.success(), "sha256sum failed: {}", o.status);
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        if let Some((hash, file)) = line.split_once("  ") {
            let name = Path::new(file).file_name().unwrap_or_default();
            out.insert(name.to_string_lossy().into_owned(), hash.to_string());
        }
    }
    Ok(out)
}

/// Every regular file under `dir`, recursively (symbolic links not
/// followed).
fn collect_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => collect_files(&e.path(), out),
            Ok(t) if t.is_file() => out.push(e.path()),
            _ => {}
        }
    }
}

/// Copies a file or a directory tree.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    if from.is_dir() {
        std::fs::create_dir_all(to).with_context(|| format!("making {}", to.display()))?;
        for e in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
            let e = e?;
            copy_tree(&e.path(), &to.join(e.file_name()))?;
        }
    } else {
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("making {}", parent.display()))?;
        }
        std::fs::copy(from, to)
            .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    }
    Ok(())
}

// The real programs: the cli tests' own (one copy of each), and the
// pydict program of this benchmark.
const PYDICT: &str = include_str!("../../programs/pydict.py");
const NODE: &str = include_str!("../../../cli/tests/programs/mapcheck.js");
const JAVA: &str = include_str!("../../../cli/tests/programs/HashMapCheck.java");
/// gomap's files (crates/cli/tests/programs/gomap), by name.
const GO_FILES: [(&str, &str); 4] = [
    (
        "main.go",
        include_str!("../../../cli/tests/programs/gomap/main.go"),
    ),
    (
        "cgo.go",
        include_str!("../../../cli/tests/programs/gomap/cgo.go"),
    ),
    (
        "purego.go",
        include_str!("../../../cli/tests/programs/gomap/purego.go"),
    ),
    (
        "go.mod",
        include_str!("../../../cli/tests/programs/gomap/go.mod"),
    ),
];

/// The python program's last line when every check passed.
const PYTHON_OK: &str = "tree.py: ok";

/// A parent holding ~100 MB of distinct objects and three workers started
/// by spawn, each building ~75 MB of its own and checking it twice; the
/// parent recomputes every worker's digest as a stream (holding nothing)
/// and checks its own dataset before and after.
const PYTHON: &str = r#"import hashlib, multiprocessing as mp, sys

PARENT_ROWS = 550_000
WORKER_ROWS = 400_000
SEEDS = (2, 3, 5)

def rows(seed, n):
    for i in range(n):
        yield (i * seed, "item-%d-%d" % (seed, i * 2654435761 % 1000003), i / (seed + 1))

def digest(it):
    h = hashlib.sha256()
    for a, s, f in it:
        h.update(("%d %s %r;" % (a, s, f)).encode())
    return h.hexdigest()

def work(seed, q):
    data = list(rows(seed, WORKER_ROWS))
    first = digest(data)
    second = digest(data)
    q.put((seed, first if first == second else "unstable"))

if __name__ == "__main__":
    data = list(rows(1, PARENT_ROWS))
    before = digest(data)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=work, args=(s, q)) for s in SEEDS]
    for p in ps:
        p.start()
    got = dict(q.get() for _ in SEEDS)
    for p in ps:
        p.join()
    bad = [s for s in SEEDS if got.get(s) != digest(rows(s, WORKER_ROWS))]
    if digest(data) != before or before != digest(rows(1, PARENT_ROWS)):
        bad.append(1)
    if any(p.exitcode != 0 for p in ps):
        bad.append("exit")
    print("tree.py: ok" if not bad else "tree.py: WRONG %r" % bad, flush=True)
    sys.exit(1 if bad else 0)
"#;

#[cfg(test)]
mod tests {
    use super::*;

    /// A program's verdict decides: its "ok" line is complete, its report
    /// of a wrong record or no verdict at all is not, and a run whose
    /// verdict differs from the reference's shows as differing.
    #[test]
    fn verdicts_are_read_from_the_programs_output() {
        let w = Workload::prepare(Kind::Node, 0.01).unwrap();
        let ok = w.outputs("starting\nok 5000 640000\n").unwrap();
        assert!(w.complete(&ok));
        let wrong = w.outputs("record 17 is wrong\n").unwrap();
        assert!(!w.complete(&wrong));
        let other = w.outputs("ok 5000 640001\n").unwrap();
        assert_eq!(other.differing(&ok), vec!["verdict".to_string()]);
        let py = Workload::prepare(Kind::Pydict, 0.01).unwrap();
        assert!(py.complete(&py.outputs("pydict: ok 6000 6000 123\n").unwrap()));
        assert!(!py.complete(&py.outputs("pydict: record 3 is wrong\n").unwrap()));
    }

    /// The text programs hash the file they write; a missing file is no
    /// result, and the run before is cleared by `reset`.
    #[test]
    fn file_results_are_hashed_and_reset() {
        let w = Workload::prepare(Kind::Sort, 0.01).unwrap();
        let data = std::fs::read(w.dir().join("data.txt")).unwrap();
        assert!(data.len() > 100_000 && data.ends_with(b"\n"));
        assert!(!w.complete(&w.outputs("").unwrap()));
        std::fs::write(w.dir().join("sorted.txt"), b"a\nb\n").unwrap();
        let one = w.outputs("").unwrap();
        assert!(w.complete(&one));
        std::fs::write(w.dir().join("sorted.txt"), b"b\na\n").unwrap();
        assert_eq!(
            w.outputs("").unwrap().differing(&one),
            vec!["sorted.txt".to_string()]
        );
        w.reset().unwrap();
        assert!(!w.dir().join("sorted.txt").exists());
    }
}
