//! The program checks before it starts: the program found as `execvp`
//! would, executable, not setuid, and (through `#!` interpreters) an ELF
//! file the dynamic loader runs, so that `LD_PRELOAD` reaches it; a
//! statically linked Go program is told apart for its remedy.

use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Finds `prog` as `execvp` would: a name with a slash as is, else in PATH.
pub fn resolve(prog: &OsString) -> Result<PathBuf> {
    let p = Path::new(prog);
    if prog.to_string_lossy().contains('/') {
        if !p.exists() {
            bail!("{}: no such file: check the path", p.display());
        }
        return Ok(p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    for dir in std::env::split_paths(&path) {
        let c = dir.join(p);
        if c.is_file() && is_executable(&c) {
            return Ok(c);
        }
    }
    bail!(
        "{}: command not found in PATH; give its path (./{0} for one in this directory)",
        p.display()
    )
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

/// Why a program cannot be run under the preload library, if it cannot.
/// Follows `#!` interpreters (and `/usr/bin/env NAME`) to the ELF file the
/// kernel will really run.
pub fn check_program(path: &Path) -> Result<()> {
    check_program_depth(path, 0)
}

fn check_program_depth(path: &Path, depth: u32) -> Result<()> {
    if depth > 4 {
        bail!("{}: too many levels of #! interpreters", path.display());
    }
    let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
    if !meta.is_file() {
        bail!("{}: not a regular file", path.display());
    }
    let mode = meta.permissions().mode();
    if mode & 0o111 == 0 {
        bail!("{}: not executable (chmod +x it)", path.display());
    }
    if mode & 0o6000 != 0 {
        bail!(
            "{}: setuid/setgid program: the loader ignores LD_PRELOAD for it, so its memory \
             could not be managed; run an ordinary copy (cp it, which drops the bits) or use \
             the uzswap library API",
            path.display()
        );
    }
    let mut head = Vec::with_capacity(4096);
    std::fs::File::open(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .take(4096)
        .read_to_end(&mut head)?;
    if let Some(rest) = head.strip_prefix(b"#!") {
        let line = rest.split(|&b| b == b'\n').next().unwrap_or_default();
        let line = String::from_utf8_lossy(line);
        let mut words = line.split_whitespace();
        let Some(interp) = words.next() else {
            bail!("{}: empty #! line", path.display());
        };
        let mut interp = PathBuf::from(interp);
        if interp.file_name().is_some_and(|n| n == "env") {
            // `#!/usr/bin/env NAME`: env is dynamic and execs NAME from PATH.
            check_program_depth(&interp, depth + 1)?;
            match words.find(|w| !w.starts_with('-')) {
                Some(name) => interp = resolve(&name.into())?,
                None => return Ok(()),
            }
        }
        return check_program_depth(&interp, depth + 1)
            .with_context(|| format!("{}: its interpreter cannot be run", path.display()));
    }
    let elf = inspect_elf(&head).with_context(|| format!("{}", path.display()))?;
    if elf.dynamic {
        return Ok(());
    }
    if elf.go {
        // Go's own linker makes static binaries unless the program uses
        // cgo. Linked by the system's linker against the C library, the Go
        // runtime maps its heap through the C library's `mmap`, which the
        // preload library serves (docs: README, "Go programs").
        bail!(
            "{}: a Go program linked statically (Go's default without cgo): a static program \
             never loads LD_PRELOAD libraries, so its heap cannot be managed; rebuild it \
             linked to the C library with `CGO_ENABLED=1 go build -ldflags=-linkmode=external` \
             (gcc must be installed): its heap is then managed",
            path.display()
        );
    }
    Err(anyhow::anyhow!(
        "{}: statically linked: a static program never loads LD_PRELOAD libraries, so its \
                 malloc cannot be replaced; run a dynamically linked build (without -static), or \
                 link the uzswap library and use its API",
        path.display()
    ))
}

/// What the first 4 KiB of an ELF executable say about running it under
/// the preload library.
#[derive(Debug, PartialEq)]
struct ElfFacts {
    /// It has a `PT_INTERP` entry: a dynamic loader, which preloads.
    dynamic: bool,
    /// A note owned by "Go" (Go's build id): Go's linker made it.
    go: bool,
}

/// Reads a 64-bit little-endian ELF header's program headers (and the
/// notes they point at, where those lie in `head`) by hand rather than
/// pulling in an ELF crate.
fn inspect_elf(head: &[u8]) -> Result<ElfFacts> {
    if head.len() < 64 || &head[..4] != b"\x7fELF" {
        bail!("not an ELF executable nor a #! script");
    }
    if head[4] != 2 || head[5] != 1 {
        bail!("not a 64-bit little-endian ELF file: it cannot run with this uzswap");
    }
    let u16_at = |o: usize| u16::from_le_bytes([head[o], head[o + 1]]) as usize;
    let machine = u16_at(0x12);
    let ours = if cfg!(target_arch = "x86_64") {
        62
    } else {
        183
    };
    if machine != ours {
        bail!("built for another architecture (ELF machine {machine})");
    }
    const PT_INTERP: u32 = 3;
    const PT_NOTE: u32 = 4;
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    let phoff = u64_at(head, 0x20) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    let mut facts = ElfFacts {
        dynamic: false,
        go: false,
    };
    for i in 0..phnum {
        let o = phoff.saturating_add(i * phentsize);
        let Some(ph) = head.get(o..o.saturating_add(56)) else {
            bail!("program headers lie past the first 4 KiB: cannot inspect it");
        };
        match u32::from_le_bytes(ph[..4].try_into().expect("4 bytes")) {
            PT_INTERP => facts.dynamic = true,
            PT_NOTE => {
                let (at, len) = (u64_at(ph, 8) as usize, u64_at(ph, 32) as usize);
                // Notes past the first 4 KiB are not read: such a binary
                // is only not known as Go's.
                if let Some(notes) = head.get(at..at.saturating_add(len)) {
                    facts.go |= has_note_of(notes, b"Go");
                }
            }
            _ => {}
        }
    }
    Ok(facts)
}

/// Whether a segment of ELF notes holds one whose owner is `name`. Each
/// note: name size, descriptor size, type (4 bytes each), then the name
/// and the descriptor, each padded to 4 bytes. The name size counts its
/// NUL, and Go's linker counts its padding too ("Go" has size 4).
fn has_note_of(mut notes: &[u8], name: &[u8]) -> bool {
    let pad = |n: usize| n.div_ceil(4) * 4;
    while notes.len() >= 12 {
        let word = |o: usize| u32::from_le_bytes(notes[o..o + 4].try_into().expect("4")) as usize;
        let (namesz, descsz) = (word(0), word(4));
        let owner = notes.get(12..12usize.saturating_add(namesz));
        if owner.is_some_and(|o| o.split(|&b| b == 0).next() == Some(name)) {
            return true;
        }
        let next = 12usize
            .saturating_add(pad(namesz))
            .saturating_add(pad(descsz));
        match notes.get(next..) {
            Some(rest) => notes = rest,
            None => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elf_headers_tell_dynamic_from_static() {
        // This test binary is dynamically linked (cargo's default on Linux).
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let facts = inspect_elf(&me[..4096]).unwrap();
        assert_eq!(
            facts,
            ElfFacts {
                dynamic: true,
                go: false
            }
        );
        // The same header with PT_INTERP entries renamed to PT_NULL.
        let mut stat = me[..4096].to_vec();
        let phoff = u64::from_le_bytes(stat[0x20..0x28].try_into().unwrap()) as usize;
        let (size, num) = (
            u16::from_le_bytes([stat[0x36], stat[0x37]]) as usize,
            u16::from_le_bytes([stat[0x38], stat[0x39]]) as usize,
        );
        for i in 0..num {
            let o = phoff + i * size;
            if stat[o..o + 4] == 3u32.to_le_bytes() {
                stat[o..o + 4].copy_from_slice(&0u32.to_le_bytes());
            }
        }
        assert!(!inspect_elf(&stat).unwrap().dynamic);
        assert!(inspect_elf(b"#!/bin/sh\n").is_err());
        assert!(inspect_elf(&[0u8; 64]).is_err());
    }

    /// A note segment: the GNU build id first, then Go's, as Go's linker
    /// writes them; a truncated or foreign segment finds none.
    #[test]
    fn go_is_told_by_its_note() {
        fn note(name: &[u8], desc: &[u8]) -> Vec<u8> {
            let mut v = Vec::new();
            v.extend((name.len() as u32).to_le_bytes());
            v.extend((desc.len() as u32).to_le_bytes());
            v.extend(4u32.to_le_bytes());
            v.extend(name);
            v.resize(v.len().div_ceil(4) * 4, 0);
            v.extend(desc);
            v.resize(v.len().div_ceil(4) * 4, 0);
            v
        }
        let gnu = note(b"GNU\0", &[7; 20]);
        // Go's linker gives the name's size as 4.
        let go = note(b"Go\0\0", b"abc/def");
        let both = [gnu.clone(), go.clone()].concat();
        assert!(has_note_of(&both, b"Go"));
        assert!(has_note_of(&go, b"Go"));
        assert!(has_note_of(&note(b"Go\0", b"x"), b"Go"));
        assert!(!has_note_of(&note(b"Gopher\0", b"x"), b"Go"));
        assert!(!has_note_of(&gnu, b"Go"));
        assert!(!has_note_of(&both[..gnu.len() + 13], b"Go"));
        assert!(!has_note_of(&[0xff; 12], b"Go"));
        assert!(!has_note_of(&[], b"Go"));
    }
}
