//! The preload runtime `uzswap run` gives the program: the copy this
//! binary carries (built by `build.rs`), or a file named with
//! `--preload-lib` or `UZSWAP_PRELOAD_LIB`, which wins.
//!
//! The carried copy goes into a sealed memory file (memfd) of this
//! process, and `LD_PRELOAD` names it `/proc/RUN/fd/N` (RUN: this
//! process's pid), as the ledger is named. Why a memfd and not a file
//! written to `$TMPDIR`: nothing is left behind by a run that is killed,
//! a `noexec` `$TMPDIR` cannot refuse it, and, sealed, no one can change
//! the code the tree loads. Why this process's descriptor: `uzswap run`
//! lives as long as the program (it is the arbiter), the descriptor is
//! close-on-exec so the program inherits no descriptor it did not ask for,
//! and every process of the tree, however deep and whatever descriptors
//! it closed, opens the path anew at its exec.
//!
//! Where the path cannot be opened, the loader prints that it cannot
//! preload the library, ignores it and runs the program unmanaged (its
//! memory still counts in the tree's sampled figure, as unreported); the
//! runtime never starts half set up. That happens to:
//! - a process that execs after `uzswap run` ended (a daemon the program
//!   left behind). One that execs as the run ends can open the library
//!   and then find the ledger gone, and one run with a `--preload-lib`
//!   file always can: the runtime then says the run has ended and leaves
//!   the process unmanaged before it sets anything up (`share::run_ended`
//!   in the runtime);
//! - a process that changed its user ids (a server started as root that
//!   drops to another user, then execs): opening another process's
//!   descriptor needs the right to ptrace-read it;
//! - a process in another pid namespace or without /proc (a container, a
//!   chroot started by the program).
//!
//! In those cases the ledger, named the same way, could not be joined
//! either. The one case worse than unmanaged: after `uzswap run` ended, its
//! pid reused by another `uzswap run` of the same user with the library and
//! the ledger at the same descriptor numbers, an exec of a left-behind
//! process would join that other tree.

use anyhow::{bail, Context, Result};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use uzswap_contract::names;

/// The runtime this binary carries (`build.rs`).
static EMBEDDED: &[u8] = include_bytes!(env!("UZSWAP_PRELOAD_EMBED"));

/// The preload library for one run, open as long as this value lives
/// (keep it until the program ends).
pub struct Library {
    path: PathBuf,
    /// The carried copy's memory file; None for a file.
    _memfd: Option<OwnedFd>,
}

impl Library {
    /// What `LD_PRELOAD` names.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `--preload-lib`, else `UZSWAP_PRELOAD_LIB`, else the carried copy.
pub fn find(explicit: Option<&Path>) -> Result<Library> {
    if let Some(p) = explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(names::PRELOAD_LIB).map(PathBuf::from))
    {
        if !p.is_file() {
            bail!(
                "preload library {} not found: check the path given with --preload-lib or \
                 {}, or leave both out to use the one built into uzswap",
                p.display(),
                names::PRELOAD_LIB
            );
        }
        let path = std::fs::canonicalize(&p)
            .with_context(|| format!("preload library {}", p.display()))?;
        return Ok(Library { path, _memfd: None });
    }
    let fd = sealed_memfd(EMBEDDED).context(
        "cannot put the preload runtime built into uzswap in a memory file; name a file with \
         --preload-lib (`cargo build --release -p uzswap-preload` builds \
         target/release/libuzswap_preload.so)",
    )?;
    let path = PathBuf::from(format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        fd.as_raw_fd()
    ));
    Ok(Library {
        path,
        _memfd: Some(fd),
    })
}

/// A memory file holding `bytes`, sealed against any change.
fn sealed_memfd(bytes: &[u8]) -> Result<OwnedFd> {
    // The name shows in /proc/PID/maps as `/memfd:libuzswap_preload.so`.
    let name = c"libuzswap_preload.so";
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // MFD_EXEC (Linux 6.3): executable whatever vm.memfd_noexec defaults
    // to; older kernels refuse the flag (EINVAL) and need none.
    // SAFETY: a NUL-terminated name and valid flags.
    let mut fd = unsafe { libc::memfd_create(name.as_ptr(), flags | libc::MFD_EXEC) };
    if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // SAFETY: as above.
        fd = unsafe { libc::memfd_create(name.as_ptr(), flags) };
    }
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EACCES) {
            return Err(e).context(
                "memfd_create refused an executable memory file (sysctl vm.memfd_noexec is 2)",
            );
        }
        return Err(e).context("memfd_create");
    }
    // SAFETY: fd is a new descriptor we own from here on.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes).context("writing the memory file")?;
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fcntl on a descriptor we own; no mapping of it exists (a
    // writable shared one would make F_SEAL_WRITE fail).
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(std::io::Error::last_os_error()).context("sealing the memory file");
    }
    Ok(OwnedFd::from(file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_carried_runtime_is_a_shared_object() {
        assert_eq!(&EMBEDDED[..4], b"\x7fELF");
        let e_type = u16::from_le_bytes([EMBEDDED[16], EMBEDDED[17]]);
        assert_eq!(e_type, 3, "ET_DYN");
    }

    /// The memory file holds the bytes, and nothing can change them.
    #[test]
    fn the_memory_file_is_sealed() {
        let fd = sealed_memfd(b"\x7fELF and so on").unwrap();
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        assert_eq!(std::fs::read(&path).unwrap(), b"\x7fELF and so on");
        let mut f = std::fs::File::from(fd);
        assert!(f.write_all(b"x").is_err(), "written after sealing");
        assert!(f.set_len(1).is_err(), "shrunk after sealing");
        assert!(f.set_len(1 << 20).is_err(), "grown after sealing");
        // SAFETY: fcntl on a descriptor we own.
        let more = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) };
        let e = std::io::Error::last_os_error();
        assert_eq!(
            (more, e.raw_os_error()),
            (-1, Some(libc::EPERM)),
            "seals changed: {e}"
        );
    }
}
