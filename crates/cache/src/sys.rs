//! The OS boundary of the cache crate: every system call and every `libc`
//! item of the crate lives here, each function with its contract.
//!
//! Descriptors are passed as raw numbers of files the caller keeps open for
//! the length of the call; offsets and lengths are in bytes. A call that
//! moves bytes returns how many it moved (0: nothing, which at a read is the
//! end of the file), or the `errno` of its failure as an [`io::Error`]; an
//! interrupted call (EINTR, [`io::ErrorKind::Interrupted`]) is the caller's
//! to repeat. Hints (`fadvise`) cannot fail as far as the caller is
//! concerned: a refused hint changes only what stays in the page cache.
//!
//! The users: the backing file (`backing/file.rs`: its reads, writes, hole
//! punches, page-cache hints and the copy and switch of files at a fork),
//! the fork hooks (`cache/fork.rs`: the pipe a forked child says "copied"
//! through), the sealer's key (`seal.rs`), IO admission's device
//! (`admission.rs`) and percent limits (`config.rs`).

use std::fs::File;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

/// The error numbers the fault injector reports (`backing/faults.rs`): an
/// I/O error, and a full device.
#[cfg(feature = "testing")]
pub(crate) const EIO: i32 = libc::EIO;
#[cfg(feature = "testing")]
pub(crate) const ENOSPC: i32 = libc::ENOSPC;

/// Most buffers one vectored write takes (`IOV_MAX`).
const IOV_MAX: usize = 1024;

/// What [`fadvise`] tells the kernel of a range of a file.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Advice {
    /// Reads come in no order: read nothing ahead (`POSIX_FADV_RANDOM`).
    Random,
    /// The range will be read soon: start reading it into the page cache
    /// now, without waiting (`POSIX_FADV_WILLNEED`).
    WillNeed,
    /// The range will not be read soon: drop its clean pages from the page
    /// cache (`POSIX_FADV_DONTNEED`).
    DontNeed,
}

/// `posix_fadvise` of `len` bytes at `at` of `fd`'s file (`len` 0: to the
/// end of the file). A hint: its failure is ignored.
pub(crate) fn fadvise(fd: RawFd, at: u64, len: u64, advice: Advice) {
    let advice = match advice {
        Advice::Random => libc::POSIX_FADV_RANDOM,
        Advice::WillNeed => libc::POSIX_FADV_WILLNEED,
        Advice::DontNeed => libc::POSIX_FADV_DONTNEED,
    };
    // SAFETY: a hint about a descriptor's file; it reads and writes no
    // memory of ours, and a bad descriptor is an error return.
    unsafe { libc::posix_fadvise(fd, at as libc::off_t, len as libc::off_t, advice) };
}

/// Opens an unnamed file in the directory `dir` (`O_TMPFILE`), for reading
/// and writing, mode 0600. An error where the filesystem has no unnamed
/// files: the caller makes a named one and unlinks it.
pub(crate) fn open_unnamed(dir: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
}

/// The flags of a read or write: `RWF_DONTCACHE` (the file's pages leave
/// the page cache once the I/O is done) if `dontcache`.
fn rwf(dontcache: bool) -> libc::c_int {
    if dontcache {
        libc::RWF_DONTCACHE
    } else {
        0
    }
}

/// Whether `e`, the error of a read or write asked with `dontcache`, is a
/// refusal of `RWF_DONTCACHE` (an older kernel: EINVAL; a filesystem
/// without it: EOPNOTSUPP): the same call without it may succeed.
pub(crate) fn refuses_dontcache(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL))
}

/// `preadv2`: reads up to `buf.len()` bytes of `fd`'s file at `at` into
/// `buf`, with `RWF_DONTCACHE` if `dontcache`. Returns the bytes read (0 at
/// the end of the file).
pub(crate) fn pread(fd: RawFd, buf: &mut [u8], at: u64, dontcache: bool) -> io::Result<usize> {
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: the iovec points into `buf`, live and exclusively ours for
    // the call; a bad descriptor is an error return.
    let n = unsafe { libc::preadv2(fd, &iov, 1, at as libc::off_t, rwf(dontcache)) };
    moved(n)
}

/// `pwritev2`: writes the bytes of `slices` (at most the first [`IOV_MAX`]
/// of them) to `fd`'s file at `at`, with `RWF_DONTCACHE` if `dontcache`.
/// Returns the bytes written, which may be fewer than given (the caller
/// advances its slices and writes the rest).
pub(crate) fn pwritev(
    fd: RawFd,
    slices: &[io::IoSlice<'_>],
    at: u64,
    dontcache: bool,
) -> io::Result<usize> {
    // SAFETY: `IoSlice` is ABI-compatible with `iovec`; the iovecs point
    // into slices live for the call; a bad descriptor is an error return.
    let n = unsafe {
        libc::pwritev2(
            fd,
            slices.as_ptr().cast(),
            slices.len().min(IOV_MAX) as libc::c_int,
            at as libc::off_t,
            rwf(dontcache),
        )
    };
    moved(n)
}

/// `sync_file_range` with `WAIT_BEFORE | WRITE | WAIT_AFTER`: writes the
/// dirty pages of `len` bytes at `at` of `fd`'s file to the device and
/// waits until they are there. An error is the write's: the data may not
/// be on the device.
pub(crate) fn write_out(fd: RawFd, at: u64, len: u64) -> io::Result<()> {
    // SAFETY: a plain system call on a descriptor; it touches no memory of
    // ours.
    let r = unsafe {
        libc::sync_file_range(
            fd,
            at as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER,
        )
    };
    ok(r)
}

/// `fallocate(PUNCH_HOLE | KEEP_SIZE)`: frees the blocks of `len` bytes at
/// `at` of `fd`'s file, which read as zeros from then on; the file's size
/// stays. An error leaves the blocks in use.
pub(crate) fn punch_hole(fd: RawFd, at: u64, len: u64) -> io::Result<()> {
    // SAFETY: a plain system call on a descriptor; it touches no memory of
    // ours.
    let r = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            at as libc::off_t,
            len as libc::off_t,
        )
    };
    ok(r)
}

/// `lseek(SEEK_DATA)`: the first byte of data of `fd`'s file at or after
/// `at`; an error (ENXIO) where only a hole (or nothing) follows.
pub(crate) fn seek_data(fd: RawFd, at: u64) -> io::Result<u64> {
    seek(fd, at, libc::SEEK_DATA)
}

/// `lseek(SEEK_HOLE)`: the first byte of a hole of `fd`'s file at or after
/// `at` (the end of the file counts as one).
pub(crate) fn seek_hole(fd: RawFd, at: u64) -> io::Result<u64> {
    seek(fd, at, libc::SEEK_HOLE)
}

fn seek(fd: RawFd, at: u64, whence: libc::c_int) -> io::Result<u64> {
    // SAFETY: lseek on a descriptor; it touches no memory of ours.
    let r = unsafe { libc::lseek(fd, at as libc::off_t, whence) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as u64)
}

/// `copy_file_range`: copies up to `len` bytes of `src`'s file at `*from`
/// to `dst`'s file at `*to`, in the kernel, and moves both offsets on by
/// the bytes copied, which it returns (0: `src` ends at `*from`).
pub(crate) fn copy_range(
    src: RawFd,
    from: &mut u64,
    dst: RawFd,
    to: &mut u64,
    len: usize,
) -> io::Result<usize> {
    let (mut f, mut t) = (*from as libc::off64_t, *to as libc::off64_t);
    // SAFETY: the offsets are locals, live for the call; bad descriptors
    // are an error return.
    let n = unsafe { libc::copy_file_range(src, &mut f, dst, &mut t, len, 0) };
    (*from, *to) = (f as u64, t as u64);
    moved(n)
}

/// `pipe2(O_CLOEXEC)`: a new pipe, its (read, write) ends.
#[cfg_attr(feature = "shuttle", allow(dead_code))] // for cache/fork.rs, not built in the model
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills the two descriptors of the array on success.
    ok(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: fresh descriptors, owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// `poll` for `POLLIN`: waits until `fd` can be read (data, or the end of
/// a pipe whose writers are gone), `timeout` passes (at most about 24
/// days), or a signal comes, whichever is first; says nothing of which.
#[cfg_attr(feature = "shuttle", allow(dead_code))] // for cache/fork.rs, not built in the model
pub(crate) fn wait_readable(fd: RawFd, timeout: Duration) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.as_millis().min(libc::c_int::MAX as u128) as libc::c_int;
    // SAFETY: one pollfd of our own, live for the call.
    unsafe { libc::poll(&mut pfd, 1, ms) };
}

/// `write` of the one byte `b` to `fd`; returns the bytes written (1, or 0
/// where `fd` takes nothing now).
#[cfg_attr(feature = "shuttle", allow(dead_code))] // for cache/fork.rs, not built in the model
pub(crate) fn write_byte(fd: RawFd, b: u8) -> io::Result<usize> {
    // SAFETY: one byte from a local, live for the call.
    let n = unsafe { libc::write(fd, [b].as_ptr().cast(), 1) };
    moved(n)
}

/// `getrandom(2)`: fills `buf` with random bytes from the kernel (waiting
/// until its generator is seeded; interruptions repeated).
pub(crate) fn getrandom(buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: the pointer and length describe the unfilled tail of `buf`.
        let n = unsafe { libc::getrandom(buf[done..].as_mut_ptr().cast(), buf.len() - done, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    Ok(())
}

/// `sysinfo`: the machine's RAM in bytes; `None` if it cannot be read.
pub(crate) fn total_ram() -> Option<u64> {
    // SAFETY: sysinfo fills the struct we pass (all-zero is a valid value
    // of it).
    unsafe {
        let mut si: libc::sysinfo = std::mem::zeroed();
        (libc::sysinfo(&mut si) == 0).then(|| si.totalram as u64 * u64::from(si.mem_unit))
    }
}

/// The major and minor numbers of a device number (`st_dev`).
pub(crate) fn major_minor(dev: u64) -> (u32, u32) {
    (libc::major(dev), libc::minor(dev))
}

/// How many of the first `pages` pages of `fd`'s file are in the page cache
/// (`mincore` of a shared mapping of it), for the file's tests. Panics if
/// the file cannot be mapped.
#[cfg(test)]
pub(crate) fn cached_pages(fd: RawFd, pages: usize) -> usize {
    let len = pages * crate::PAGE_SIZE;
    // SAFETY: maps our own descriptor read-only for this function; the
    // mapping is unmapped before it returns, and `vec` has a byte per
    // page.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "{}", io::Error::last_os_error());
        let mut vec = vec![0u8; pages];
        assert_eq!(libc::mincore(p, len, vec.as_mut_ptr()), 0);
        libc::munmap(p, len);
        vec.iter().filter(|&&v| v & 1 == 1).count()
    }
}

/// What a call that returns 0 or -1 (`errno`) returned.
fn ok(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What a call that moves bytes returned: the bytes, or -1 (`errno`).
fn moved(n: isize) -> io::Result<usize> {
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}
