//! The only module of this crate that calls `libc`: system calls made
//! directly (not through libc's `mmap` family and `close`, which this
//! library itself replaces for the program), the C library's process
//! hooks (`pthread_atfork`, `atexit`, `dlsym`), identities (pids, tids,
//! a socket peer's user) and, for the tests, forks.

use libc::{c_int, c_long, c_uint, c_void};
use std::os::fd::RawFd;

/// `mmap` without passing through our own `mmap`.
///
/// # Safety
/// As `mmap(2)`: a `MAP_FIXED` call replaces what was there.
pub unsafe fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: forwarded as is; the caller has the duties of mmap(2).
    unsafe {
        libc::syscall(
            libc::SYS_mmap,
            addr,
            len,
            prot as c_long,
            flags as c_long,
            fd as c_long,
            off,
        ) as *mut c_void
    }
}

/// # Safety
/// As `munmap(2)`.
pub unsafe fn munmap(addr: *mut c_void, len: usize) -> c_int {
    // SAFETY: forwarded as is.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) as c_int }
}

/// # Safety
/// As `mremap(2)`.
pub unsafe fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new: *mut c_void,
) -> *mut c_void {
    // SAFETY: forwarded as is.
    unsafe {
        libc::syscall(
            libc::SYS_mremap,
            old,
            old_len,
            new_len,
            flags as c_long,
            new,
        ) as *mut c_void
    }
}

/// # Safety
/// As `madvise(2)`.
pub unsafe fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    // SAFETY: forwarded as is.
    unsafe { libc::syscall(libc::SYS_madvise, addr, len, advice as c_long) as c_int }
}

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Sets the calling thread's `errno`.
pub fn set_errno(e: i32) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

const RESERVE_FLAGS: c_int = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;

/// A `PROT_NONE` reservation of `len` bytes anywhere.
pub fn reserve(len: usize) -> std::io::Result<usize> {
    // SAFETY: a new mapping at an address of the kernel's choice.
    let p = unsafe {
        mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            RESERVE_FLAGS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    Ok(p as usize)
}

/// Puts a `PROT_NONE` reservation back over `addr..addr + len`.
pub fn reserve_at(addr: usize, len: usize) -> Result<(), i32> {
    // SAFETY: only called on retired ranges of our own reservation, which
    // the program is unmapping.
    let p = unsafe {
        mmap(
            addr as *mut c_void,
            len,
            libc::PROT_NONE,
            RESERVE_FLAGS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(errno());
    }
    Ok(())
}

/// `MADV_DONTNEED`: the pages read as zeros afterwards.
pub fn discard(addr: usize, len: usize) -> Result<(), i32> {
    // SAFETY: the range is the program's own mapping which it unmaps.
    if unsafe { madvise(addr as *mut c_void, len, libc::MADV_DONTNEED) } != 0 {
        return Err(errno());
    }
    Ok(())
}

/// `mprotect`.
pub fn protect(addr: usize, len: usize, prot: c_int) -> Result<(), i32> {
    // SAFETY: changes access rights of a range we hand out; nothing of
    // ours lives there.
    if unsafe { libc::mprotect(addr as *mut c_void, len, prot) } != 0 {
        return Err(errno());
    }
    Ok(())
}

/// One line to the program's stderr, prefixed `uzswap:`.
pub fn warn(msg: &str) {
    uzswap_os::say(&format!("uzswap: {msg}"));
}

/// Makes glibc's malloc serve every thread from one arena (its main one,
/// `M_ARENA_MAX` 1) from now on. A thread that already has an arena keeps
/// it. Returns whether glibc took the setting.
pub fn one_malloc_arena() -> bool {
    // SAFETY: mallopt only changes the allocator's parameters.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) == 1 }
}

/// `close(2)` without passing through our own `close`.
///
/// # Safety
/// As `close(2)`: nothing may use `fd` afterwards.
pub unsafe fn close(fd: c_int) -> c_int {
    // SAFETY: forwarded as is.
    unsafe { libc::syscall(libc::SYS_close, fd as c_long) as c_int }
}

/// `close_range(2)` without passing through our own `close_range`.
///
/// # Safety
/// As `close_range(2)`: nothing may use the descriptors closed.
pub unsafe fn close_range(first: c_uint, last: c_uint, flags: c_uint) -> c_int {
    // SAFETY: forwarded as is.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            first as c_long,
            last as c_long,
            flags as c_long,
        ) as c_int
    }
}

/// The size of the descriptor table (`getdtablesize`).
pub fn descriptor_table_size() -> c_int {
    // SAFETY: getdtablesize takes nothing.
    unsafe { libc::getdtablesize() }
}

/// The calling thread's id.
pub fn gettid() -> libc::pid_t {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() }
}

/// The calling process's parent.
pub fn getppid() -> libc::pid_t {
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() }
}

/// Waits until `fd` is readable (a listening socket: a connection waits);
/// false if `fd` is no longer open, true on any other wake (a signal, an
/// error the next call will report).
///
/// A thread waits here rather than in `accept`: the kernel takes the new
/// descriptor's number when `accept` begins, so a thread blocked in it
/// holds the lowest free number, and the program's next `open` would get
/// another one than it does unmanaged.
pub fn wait_readable(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd of our own.
    let r = unsafe { libc::poll(&mut p, 1, -1) };
    !(r == 1 && p.revents & libc::POLLNVAL != 0)
}

/// Whether the peer of the Unix socket `fd` runs as root or as this
/// process's effective user (`SO_PEERCRED`); no if it cannot be told.
pub fn peer_is_same_user(fd: RawFd) -> bool {
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of the length given.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    // SAFETY: geteuid cannot fail.
    r == 0 && (cred.uid == 0 || cred.uid == unsafe { libc::geteuid() })
}

/// The address of the next definition of `name` after this library
/// (`dlsym(RTLD_NEXT)`), if there is one.
pub fn next_symbol(name: &std::ffi::CStr) -> Option<usize> {
    // SAFETY: dlsym with a NUL-terminated name.
    let found = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    (!found.is_null()).then_some(found as usize)
}

/// Registers the fork hooks (`pthread_atfork`); the error number if the
/// C library refuses.
pub fn at_fork(
    prepare: extern "C" fn(),
    parent: extern "C" fn(),
    child: extern "C" fn(),
) -> Result<(), i32> {
    // SAFETY: three extern "C" functions without arguments, for the whole
    // life of the program.
    let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    if r != 0 {
        return Err(r);
    }
    Ok(())
}

/// Registers `hook` to run at the process's exit (`atexit`).
pub fn at_exit(hook: extern "C" fn()) {
    // SAFETY: registers an extern "C" function that lives for the program.
    unsafe { libc::atexit(hook) };
}

/// Ends the process at once with `status` (`_exit`: no exit hooks, no
/// flushing).
pub fn exit_now(status: c_int) -> ! {
    // SAFETY: ends the process; nothing runs after.
    unsafe { libc::_exit(status) }
}

/// `fork(2)`: the child's pid in the parent, 0 in the child, -1 if it
/// failed.
///
/// # Safety
/// The child of a multithreaded process may only do what is safe after a
/// fork until it execs or exits.
#[cfg(test)]
pub unsafe fn fork() -> libc::pid_t {
    // SAFETY: the caller's duty.
    unsafe { libc::fork() }
}

/// Whether the child `pid` has ended: its wait status if so (`waitpid`
/// with `WNOHANG`).
#[cfg(test)]
pub fn try_wait(pid: libc::pid_t) -> Option<c_int> {
    let mut status = 0;
    // SAFETY: polls a child of ours; the status is written to a local.
    (unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid).then_some(status)
}

/// Kills the child `pid` and reaps it.
#[cfg(test)]
pub fn kill_and_reap(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: signals and reaps a child of ours.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, &mut status, 0);
    }
}

/// glibc's `bool __nss_database_get (enum nss_database, nss_action_list *)`.
type NssDatabaseGet = unsafe extern "C" fn(c_int, *mut *mut c_void) -> bool;

/// Calls glibc's `__nss_database_get` for its first database (the
/// aliases), which makes glibc's name-service state if it does not exist
/// yet (reading `/etc/nsswitch.conf`) and otherwise only checks that the
/// file has not changed. Nothing is looked up. Does nothing where glibc
/// does not export the function (`GLIBC_PRIVATE`).
pub fn nss_database_get_any() {
    // SAFETY: dlvsym with NUL-terminated name and version.
    let f = unsafe {
        libc::dlvsym(
            libc::RTLD_DEFAULT,
            c"__nss_database_get".as_ptr(),
            c"GLIBC_PRIVATE".as_ptr(),
        )
    };
    if f.is_null() {
        return;
    }
    // SAFETY: glibc's symbol of that name has this signature (nss/nss_database.h
    // since glibc 2.33); the out-parameter is a pointer of our own, and the
    // database index 0 exists in every version.
    let get: NssDatabaseGet = unsafe { std::mem::transmute::<*mut c_void, NssDatabaseGet>(f) };
    let mut actions: *mut c_void = std::ptr::null_mut();
    // SAFETY: as above.
    unsafe { get(0, &mut actions) };
}

/// The executable part of the program interpreter (`ld.so`, found by
/// `AT_BASE`): `[lo, hi)` over its executable segments, or `None` without
/// one (a static program).
pub fn interpreter_text() -> Option<(usize, usize)> {
    // SAFETY: getauxval has no preconditions.
    let base = unsafe { libc::getauxval(libc::AT_BASE) } as usize;
    if base == 0 {
        return None;
    }
    struct Found {
        base: usize,
        text: Option<(usize, usize)>,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: dl_iterate_phdr passes a valid info for the call, and
        // `data` is the `Found` below, borrowed for the iteration alone.
        let (info, found) = unsafe { (&*info, &mut *data.cast::<Found>()) };
        if info.dlpi_addr as usize != found.base {
            return 0;
        }
        // SAFETY: dlpi_phdr points to dlpi_phnum program headers.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum.into()) };
        for ph in phdrs {
            if ph.p_type == libc::PT_LOAD && ph.p_flags & libc::PF_X != 0 {
                let lo = found.base + ph.p_vaddr as usize;
                let hi = lo + ph.p_memsz as usize;
                let (l, h) = found.text.unwrap_or((lo, hi));
                found.text = Some((l.min(lo), h.max(hi)));
            }
        }
        1
    }
    let mut found = Found { base, text: None };
    // SAFETY: `each` matches the callback type and only reads what it is
    // given; `found` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut found as *mut Found).cast()) };
    found.text
}
