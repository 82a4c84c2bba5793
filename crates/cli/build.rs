//! Builds the preload runtime (`crates/preload`, a cdylib) for the
//! `uzswap` binary to carry inside it (`src/preload.rs` embeds it with
//! `include_bytes!` and hands it to the program at run time), so that the
//! one `uzswap` file, copied anywhere or put there by `cargo install`, is
//! a working `uzswap run`.
//!
//! A nested `cargo rustc -p uzswap-preload --lib`, because a package cannot
//! name a cdylib as something to link or embed (artifact dependencies are
//! unstable), and what it builds must be built as the workspace builds it:
//! its profiles (the runtime is optimised even in `dev`), Cargo.lock, the
//! outer build's flags, compiler and target. Its target directory is its
//! own: the outer build holds the lock of its own.
//!
//! - Profile: `PROFILE` (`release` for the release profile and those that
//!   inherit it, `debug` for the rest) picks `--release` or `dev`.
//! - Flags: the outer build's `CARGO_ENCODED_RUSTFLAGS` (target CPU,
//!   linker, coverage) reach the runtime too: it is part of the same
//!   build. A sanitizer build of the cli would embed an instrumented
//!   runtime, which programs built without the sanitizer cannot load; CI's
//!   sanitizer and fuzzing slices do not build this package.
//! - Wrappers: `cargo clippy` runs this script with clippy's driver in
//!   `RUSTC_WORKSPACE_WRAPPER`; the runtime's own crates are linted by
//!   clippy's own run, so the nested build does without it.
//! - Network: `--locked`. The versions are Cargo.lock's, never resolved
//!   anew; what the runtime needs beyond the `uzswap` package's own graph
//!   (mimalloc's crate) is downloaded here, since the outer build fetches
//!   only the crates of its own graph. An offline or vendored build
//!   reaches the nested one through cargo's own environment and
//!   configuration (`CARGO_NET_OFFLINE`, `.cargo/config.toml`), which it
//!   inherits.
//! - Size: the embedded copy has no DWARF (`strip = "debuginfo"`; symbols
//!   stay, so a panic's backtrace still names functions): 3 MiB instead
//!   of 34 (release, `debug = 1`), which every `uzswap run` holds in
//!   memory. For line numbers, build the file (`cargo build -p
//!   uzswap-preload`) and run with `--preload-lib`.
//! - Rebuilds: this script runs again when a file the runtime was built
//!   from changes (read from the nested build's dep-info, so the list
//!   cannot fall behind the runtime's dependencies), or a manifest or
//!   Cargo.lock does.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The runtime's file name, as cargo names the cdylib.
const LIB: &str = "libuzswap_preload.so";

fn main() {
    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    let ws = manifest_dir
        .parent()
        .and_then(Path::parent)
        .expect("crates/cli sits two levels under the workspace root")
        .to_path_buf();
    let out_dir = PathBuf::from(env("OUT_DIR"));
    let target = env("TARGET");
    let release = env("PROFILE") == "release";
    let target_dir = nested_target_dir(&out_dir);

    let mut cmd = nested_build(&ws, &target, release, &target_dir);
    let status = cmd.status().unwrap_or_else(|e| {
        fail(&format!(
            "cannot run cargo for the nested build of the preload runtime: {e}; \
             build with cargo (it sets CARGO for build scripts)"
        ))
    });
    if !status.success() {
        fail(&format!(
            "the nested build of the preload runtime (`cargo rustc -p uzswap-preload --lib \
             --locked`, target directory {}) failed ({status}); its output is above. If it \
             could not download a crate, check the network or run `cargo fetch --locked` \
             in {} first",
            target_dir.display(),
            ws.display()
        ));
    }

    let built = target_dir
        .join(&target)
        .join(if release { "release" } else { "debug" });
    let lib = built.join(LIB);
    if !lib.is_file() {
        fail(&format!(
            "the nested build of the preload runtime succeeded but left no {}: \
             report it (cargo's output layout may have changed)",
            lib.display()
        ));
    }
    declare_reruns(&ws, &built);
    println!("cargo:rustc-env=UZSWAP_PRELOAD_EMBED={}", lib.display());
}

/// The nested build of the runtime: `cargo rustc` of the preload crate
/// into `target_dir`, in the environment of a build of its own, both its
/// output streams to this script's stderr.
fn nested_build(ws: &Path, target: &str, release: bool, target_dir: &Path) -> Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(ws)
        .args(["rustc", "-p", "uzswap-preload", "--lib", "--locked"])
        .arg("--manifest-path")
        .arg(ws.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target_dir)
        .args(["--target", target]);
    if release {
        cmd.arg("--release");
    }
    // `cargo rustc`: these flags reach the runtime's own compilation (its
    // link) and none of its dependencies'. A profile's `strip` (given as
    // CARGO_PROFILE_*_STRIP) would be the obvious way, but cargo 1.95
    // drops it for a package with an override of its own, as this one has
    // (`[profile.dev.package.uzswap-preload]`).
    cmd.args(["--", "-C", "strip=debuginfo"]);
    // What cargo set for this script describes this package's build, not
    // the nested one's (a stale CARGO_FEATURE_* would reach its build
    // scripts); CARGO_ENCODED_RUSTFLAGS (the outer flags), CARGO_MAKEFLAGS
    // (the outer jobserver: the nested build takes its jobs from the same
    // pool) and RUSTC (the same compiler) stay.
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let cargo_set = [
            "CARGO_PKG_",
            "CARGO_CFG_",
            "CARGO_FEATURE_",
            "CARGO_MANIFEST_",
        ]
        .iter()
        .any(|p| name.starts_with(p));
        if cargo_set || name == "CARGO_PRIMARY_PACKAGE" || name == "CARGO_CRATE_NAME" {
            cmd.env_remove(name);
        }
    }
    cmd.env_remove("RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS");
    if std::env::var_os("RUSTC_WRAPPER").is_some_and(|w| {
        Path::new(&w)
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("clippy-driver"))
    }) {
        cmd.env_remove("RUSTC_WRAPPER");
    }
    // The nested cargo's stdout would be read as this script's `cargo:`
    // lines: both its streams go to stderr, which cargo shows when this
    // script fails.
    let stderr = std::io::stderr();
    let to_stderr = || {
        use std::os::fd::AsFd;
        Stdio::from(
            stderr
                .as_fd()
                .try_clone_to_owned()
                .expect("a duplicate of stderr"),
        )
    };
    cmd.stdout(to_stderr()).stderr(to_stderr());
    cmd
}

/// Tells cargo when to run this script again: a file the runtime in
/// `built` was built from changes (from its dep-info), or a manifest,
/// Cargo.lock or this script does.
fn declare_reruns(ws: &Path, built: &Path) {
    // Registry sources do not change under a version (Cargo.lock names it).
    let deps: Vec<PathBuf> = dep_info(&built.join("libuzswap_preload.d"))
        .into_iter()
        .filter(|d| d.starts_with(ws))
        .collect();
    if deps.is_empty() {
        // No dep-info to read, or one written where the workspace was
        // before it moved (a fresh build does not rewrite it): any change
        // under crates/ will do.
        println!("cargo:rerun-if-changed={}", ws.join("crates").display());
    }
    for dep in &deps {
        println!("cargo:rerun-if-changed={}", dep.display());
    }
    println!("cargo:rerun-if-changed={}", ws.join("Cargo.lock").display());
    println!("cargo:rerun-if-changed={}", ws.join("Cargo.toml").display());
    for member in std::fs::read_dir(ws.join("crates")).into_iter().flatten() {
        let manifest = member.expect("a directory entry").path().join("Cargo.toml");
        if manifest.is_file() {
            println!("cargo:rerun-if-changed={}", manifest.display());
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}

/// Where the nested build keeps its work between builds:
/// `<target dir>/preload-embed`, beside the outer build's profile
/// directories (OUT_DIR is `<target dir>[/<triple>]/<profile>/build/
/// <package>-<hash>/out`), so that `cargo build`, `cargo test` and `cargo
/// clippy`, whose OUT_DIRs differ, share one nested build. Should cargo's
/// layout change, a directory in OUT_DIR (kept between runs of this
/// script, not between those commands).
fn nested_target_dir(out_dir: &Path) -> PathBuf {
    let up = |n: usize| out_dir.ancestors().nth(n);
    match (up(2), up(4)) {
        (Some(build), Some(dir)) if build.file_name().is_some_and(|n| n == "build") => {
            dir.join("preload-embed")
        }
        _ => out_dir.join("preload-embed"),
    }
}

/// The files a Makefile-style dep-info file names (`out: a b\ c`), none if
/// it cannot be read.
fn dep_info(path: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let Some((_, deps)) = text.lines().next().and_then(|l| l.split_once(": ")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = deps.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => cur.extend(chars.next()),
            ' ' => out.extend((!cur.is_empty()).then(|| PathBuf::from(std::mem::take(&mut cur)))),
            c => cur.push(c),
        }
    }
    out.extend((!cur.is_empty()).then(|| PathBuf::from(cur)));
    out
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| fail(&format!("{name} is not set: build with cargo")))
}

/// Ends this script with `msg` (cargo shows it with the script's output).
fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    std::process::exit(1)
}
