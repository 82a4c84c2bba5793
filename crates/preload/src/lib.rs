//! uzswap-preload: the library `uzswap run` loads into a program
//! (`LD_PRELOAD`) to keep its memory under a resident budget.
//!
//! # How the program's memory becomes managed
//! - **Heap**: `malloc` and its family are answered by mimalloc (compiled
//!   into this library), whose memory comes from `mmap`.
//! - **Anonymous private mappings** (the program's own and mimalloc's):
//!   `mmap`, `munmap`, `mremap` and `madvise` are replaced; read-write or
//!   `PROT_NONE` anonymous private mappings are carved out of one
//!   reserved address range ([`space::Space`]) whose chunks are regions of
//!   one [`uzswap_region::Pager`] over one [`uzswap_cache::Cache`]. Other
//!   mappings (files, shared, executable, stacks, huge pages) go to the
//!   kernel unchanged. A `MAP_FIXED` mapping of the managed kind over a
//!   range the program holds of the reservation (the JVM and Go commit
//!   their reserved heaps so) is served in place and stays managed.
//! - **The runtime's own memory** (the cache's pool and index, the pager's
//!   tables) must never be managed: a handler thread touching an evicted
//!   page would wait for itself. Rust code here allocates from glibc
//!   (`__libc_malloc`, the global allocator below), and the runtime's
//!   threads are marked [`internal`]: their `malloc` (from C code such as
//!   zstd) goes to glibc and their `mmap` to the kernel. glibc serves them
//!   all from one arena (`setup_runtime_heap`).
//! - `free` tells the two heaps apart by address: the reservation is one
//!   range, so a pointer inside it is mimalloc's.
//!
//! # Life cycle
//! The constructor runs before `main` and does nothing unless
//! `UZSWAP_MEMORY_MAX` is set; it reads every setting with
//! `uzswap_contract::RunConfig::from_env` (the variables and their
//! defaults are listed there, `UZSWAP_RESERVE` among them). It starts the cache and the pager, reserves
//! the address space and the statistics socket, and only then switches
//! `malloc` over. Calls made before that are served by glibc, and freed
//! there too. If anything fails it prints why and exits with status 125
//! before the program runs.
//!
//! The environment is left as it is, so every program image the process
//! tree executes (`execve`: a launcher such as `env` or a shell's `exec`,
//! or the children a build system starts) runs its own runtime with the
//! same budget: the budget is per process.
//!
//! `fork()` without `exec`: nothing is brought back. The pager's own
//! `pthread_atfork` hooks hand the child its copy of the pager (see
//! `uzswap_region`'s docs, "Fork"): its regions are registered again with
//! a userfaultfd of its own, its evicted pages are served from its
//! copy-on-write copy of the pool and the backing file's slots it shares
//! with its parent (each writes on to a file of its own),
//! and it runs its own handler and evictor. This library's child hook then
//! gives it a slot of its own in the ledger and its own statistics socket:
//! the child is managed like any process of the tree, its `malloc` still
//! mimalloc's. `vfork` and `posix_spawn` share the parent's memory, whose
//! faults the parent's handler keeps serving.

mod cosched;
mod fds;
mod ranges;
mod share;
mod space;
mod stats;
mod sys;

use libc::{c_int, c_void, size_t};
use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use uzswap_cache::{Backing, Cache, CacheConfig, PoolLimit};
use uzswap_contract::{BackingTier, RunConfig};
use uzswap_region::{Pager, PagerConfig, PAGE_SIZE};
use uzswap_remote::RedisBacking;

// ---- the runtime's own heap: glibc ----------------------------------------

extern "C" {
    fn __libc_malloc(size: size_t) -> *mut c_void;
    fn __libc_calloc(n: size_t, size: size_t) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, size: size_t) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
    fn __libc_memalign(align: size_t, size: size_t) -> *mut c_void;
}

/// glibc's malloc guarantees this alignment.
const LIBC_ALIGN: usize = 16;

/// Rust allocations of this library (cache, pager, pool bookkeeping) go to
/// glibc's heap, which is never managed.
struct LibcHeap;

// SAFETY: glibc's allocator returns blocks of at least the requested size
// and alignment (memalign for alignments above 16), or null.
unsafe impl GlobalAlloc for LibcHeap {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: plain calls into glibc's allocator.
        unsafe {
            if l.align() <= LIBC_ALIGN {
                __libc_malloc(l.size()).cast()
            } else {
                __libc_memalign(l.align(), l.size()).cast()
            }
        }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.align() <= LIBC_ALIGN {
            // SAFETY: plain call into glibc's allocator.
            return unsafe { __libc_calloc(1, l.size()).cast() };
        }
        // SAFETY: alloc returns `size` writable bytes or null.
        unsafe {
            let p = self.alloc(l);
            if !p.is_null() {
                std::ptr::write_bytes(p, 0, l.size());
            }
            p
        }
    }

    unsafe fn dealloc(&self, p: *mut u8, _l: Layout) {
        // SAFETY: p came from glibc's allocator (alloc above).
        unsafe { __libc_free(p.cast()) }
    }

    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        if l.align() <= LIBC_ALIGN {
            // SAFETY: p came from glibc's allocator.
            return unsafe { __libc_realloc(p.cast(), new_size).cast() };
        }
        // SAFETY: a new block of the same alignment, the old contents
        // copied, the old block freed; `new_size` is non-zero by contract.
        unsafe {
            let n = self.alloc(Layout::from_size_align_unchecked(new_size, l.align()));
            if !n.is_null() {
                std::ptr::copy_nonoverlapping(p, n, l.size().min(new_size));
                self.dealloc(p, l);
            }
            n
        }
    }
}

#[global_allocator]
static GLOBAL: LibcHeap = LibcHeap;

/// Sets glibc's heap up for the runtime, before any runtime thread runs.
///
/// Once the runtime is started glibc's heap serves the runtime alone (the
/// program's `malloc` is mimalloc's; glibc keeps only what was allocated
/// before, freed there, and the calls of a fork's window). By default
/// glibc gives each new thread that allocates an arena of its own, up to
/// eight per CPU, and every arena keeps its own free space and its own
/// partly used top: with five runtime threads (handler, evictor, writer,
/// compactor, statistics) each process held several arenas whose free
/// space no other thread could reuse (3.3 MiB of a tree of five Python
/// processes, 0.7-0.9 MiB in each: "runtime memory" in
/// docs/BENCHMARKS.md). One arena pools that space.
/// Its lock is taken only inside glibc's malloc and free, never across
/// anything of ours; the runtime's threads allocate
/// little on their hot paths (buffers are per thread and reused), and
/// glibc's per-thread cache serves most small blocks without the lock.
///
/// glibc fixes its arena limit when it makes its first arena past the
/// main one, so the setting cannot be taken back: a forked child that runs
/// unmanaged (`FORKED`, whose `malloc` is glibc's again) keeps one arena
/// for its own threads too.
fn setup_runtime_heap() {
    if !sys::one_malloc_arena() {
        // Not fatal: the runtime works with glibc's arenas, only larger.
        sys::warn("glibc refused M_ARENA_MAX: the runtime's heap keeps an arena per thread");
    }
}

// ---- state ----------------------------------------------------------------

/// Set once everything is running: from then on the program's `malloc` and
/// anonymous mappings are managed.
static READY: AtomicBool = AtomicBool::new(false);
/// A fork is between this library's prepare hook and its parent or child
/// hook: `malloc` and new mappings go to glibc and the kernel meanwhile.
/// The space's lock is held across the fork, and in the child the pager
/// starts its threads before this library's child hook releases it; a new
/// thread's start-up allocations come before it is marked internal.
static FORKING: AtomicBool = AtomicBool::new(false);
/// Set in a forked child that did not take over the pager (its parent
/// held few evicted pages and brought them back for the fork): nothing new
/// is managed there, its mappings are the kernel's.
static FORKED: AtomicBool = AtomicBool::new(false);
/// The process that set things up (a forked child is not it).
static OWNER_PID: AtomicI32 = AtomicI32::new(0);

struct Runtime {
    space: space::Space,
    cache: Arc<Cache>,
    /// This process's slot in the tree's ledger, if `uzswap run` made one.
    share: Option<Arc<share::Share>>,
    config: RunConfig,
    started: std::time::Instant,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

thread_local! {
    /// Depth of "this thread is the runtime's own" (helper threads set it
    /// for good, the constructor and fork hook for their duration).
    static INTERNAL: Cell<u32> = const { Cell::new(0) };
}

/// Whether the calling thread is one of the runtime's own (its memory must
/// not be managed).
#[inline]
pub fn internal() -> bool {
    INTERNAL.with(|c| c.get() > 0)
}

fn enter_internal() {
    INTERNAL.with(|c| c.set(c.get() + 1));
}

fn leave_internal() {
    INTERNAL.with(|c| c.set(c.get().saturating_sub(1)));
}

/// Marks the calling thread internal while it lives.
pub(crate) struct InternalGuard(());

impl InternalGuard {
    pub(crate) fn enter() -> InternalGuard {
        enter_internal();
        InternalGuard(())
    }
}

impl Drop for InternalGuard {
    fn drop(&mut self) {
        leave_internal();
    }
}

/// Marks a helper thread of the pager or the cache for its whole life.
fn mark_thread_internal() {
    enter_internal();
}

/// The runtime, if the calling thread's memory is to be managed.
#[inline]
fn managed() -> Option<&'static Runtime> {
    if !READY.load(Ordering::Acquire)
        || internal()
        || FORKING.load(Ordering::Acquire)
        || FORKED.load(Ordering::Relaxed)
    {
        return None;
    }
    RUNTIME.get()
}

/// The runtime, if it is running in this process (whatever the calling
/// thread).
#[inline]
fn runtime() -> Option<&'static Runtime> {
    if !READY.load(Ordering::Acquire) || FORKED.load(Ordering::Relaxed) {
        return None;
    }
    RUNTIME.get()
}

/// Whether `p` came from the managed heap (also in a forked child, whose
/// inherited blocks still belong to mimalloc).
#[inline]
fn is_managed_ptr(p: *mut c_void) -> bool {
    READY.load(Ordering::Acquire) && RUNTIME.get().is_some_and(|rt| rt.space.owns(p as usize))
}

// ---- malloc family ----------------------------------------------------------

use libmimalloc_sys as mi;

/// # Safety
/// The C `malloc` contract.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    // SAFETY: plain allocator calls.
    unsafe {
        if managed().is_some() {
            mi::mi_malloc(size)
        } else {
            __libc_malloc(size)
        }
    }
}

/// Blocks of `calloc` from this size on are zeroed by discarding their
/// whole pages (see [`calloc`]); smaller ones by `mi_calloc`.
const CALLOC_DISCARD_MIN: usize = 64 << 10;

/// # Safety
/// The C `calloc` contract.
///
/// mimalloc writes zeros over a block whose memory it has used before,
/// and a program that uses only part of a large zeroed block (a hash
/// table, a bitmap) then holds every page of it. glibc gives such blocks
/// fresh mappings, whose untouched pages take no memory: `cc1` holds 27 MB
/// (a third) more under mimalloc's `calloc` on one unit of the build of
/// `uzswap-bench tree` (docs/BENCHMARKS.md). So
/// a large block's whole pages are discarded instead (`MADV_DONTNEED`: the
/// pager sees a remove event and maps zeros where the program touches
/// them), and only its partial first and last pages are written.
#[no_mangle]
pub unsafe extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    // SAFETY: plain allocator calls (both check n * size for overflow);
    // the block `mi_malloc` returned is ours to write and discard.
    unsafe {
        if managed().is_none() {
            return __libc_calloc(n, size);
        }
        match n.checked_mul(size) {
            Some(len) if len >= CALLOC_DISCARD_MIN => {
                let p = mi::mi_malloc(len);
                if !p.is_null() {
                    zero_by_discard(p.cast(), len, managed().map(|rt| rt.space.pager()));
                }
                p
            }
            _ => mi::mi_calloc(n, size),
        }
    }
}

/// Zeros `len` bytes at `p`: the whole pages by discarding them, the rest
/// by writing (everything by writing if the discard fails). Whole pages
/// the pager holds as never touched (fresh memory) already read as zeros:
/// then nothing is discarded, which spares a remove event's round trip
/// through the pager's handler.
///
/// # Safety
/// `p..p + len` is a block of the managed heap that the caller owns.
unsafe fn zero_by_discard(p: *mut u8, len: usize, pager: Option<&Pager>) {
    let start = p as usize;
    let lo = start.next_multiple_of(PAGE_SIZE);
    let hi = (start + len) / PAGE_SIZE * PAGE_SIZE;
    let fresh = hi > lo && pager.is_some_and(|pg| pg.untouched(lo, hi - lo));
    // SAFETY: every range written lies in the caller's block.
    unsafe {
        if hi > lo && (fresh || sys::discard(lo, hi - lo).is_ok()) {
            std::ptr::write_bytes(p, 0, lo - start);
            std::ptr::write_bytes(hi as *mut u8, 0, start + len - hi);
        } else {
            std::ptr::write_bytes(p, 0, len);
        }
    }
}

/// # Safety
/// The C `free` contract.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    // SAFETY: a pointer inside the reservation can only be mimalloc's; any
    // other came from glibc (before start-up, or from a runtime thread).
    unsafe {
        if is_managed_ptr(p) {
            mi::mi_free(p)
        } else {
            __libc_free(p)
        }
    }
}

/// # Safety
/// The C `cfree` contract (an old alias of free).
#[no_mangle]
pub unsafe extern "C" fn cfree(p: *mut c_void) {
    // SAFETY: as free.
    unsafe { free(p) }
}

/// glibc's `malloc_usable_size` (found past this library).
fn libc_usable_size(p: *mut c_void) -> usize {
    type F = unsafe extern "C" fn(*mut c_void) -> size_t;
    /// The symbol's address; 0 before the first look, `usize::MAX` if
    /// there is none. An atomic, not a `OnceLock`: a fork while another
    /// thread ran the look would leave a once taken in the child, and the
    /// child's first `realloc` of a glibc block would wait on it for ever.
    /// Two threads may both look; they find the same address.
    static REAL: AtomicUsize = AtomicUsize::new(0);
    let mut f = REAL.load(Ordering::Relaxed);
    if f == 0 {
        // SAFETY: dlsym with a NUL-terminated name.
        let found = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) };
        f = if found.is_null() {
            usize::MAX
        } else {
            found as usize
        };
        REAL.store(f, Ordering::Relaxed);
    }
    if f == usize::MAX {
        return 0;
    }
    // SAFETY: the symbol is glibc's malloc_usable_size, of this type.
    unsafe { std::mem::transmute::<usize, F>(f)(p) }
}

/// # Safety
/// The C `realloc` contract.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: size_t) -> *mut c_void {
    // SAFETY: the pointer's owner is told apart by address as in free; a
    // glibc block reallocated by a managed thread moves into the managed
    // heap (copying the bytes glibc says it holds).
    unsafe {
        if p.is_null() {
            return malloc(size);
        }
        if is_managed_ptr(p) {
            return mi::mi_realloc(p, size);
        }
        if managed().is_none() {
            return __libc_realloc(p, size);
        }
        if size == 0 {
            __libc_free(p);
            return std::ptr::null_mut();
        }
        let n = mi::mi_malloc(size);
        if !n.is_null() {
            std::ptr::copy_nonoverlapping(
                p as *const u8,
                n as *mut u8,
                libc_usable_size(p).min(size),
            );
            __libc_free(p);
        }
        n
    }
}

/// # Safety
/// The C `reallocarray` contract.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: as realloc.
        Some(total) => unsafe { realloc(p, total) },
        None => {
            sys::set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// Aligned allocation for the managed or the glibc heap.
unsafe fn aligned(align: usize, size: usize) -> *mut c_void {
    // SAFETY: plain allocator calls; align is a power of two (checked by
    // the callers).
    unsafe {
        if managed().is_some() {
            mi::mi_malloc_aligned(size, align)
        } else {
            __libc_memalign(align, size)
        }
    }
}

/// # Safety
/// The C `posix_memalign` contract.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    align: size_t,
    size: size_t,
) -> c_int {
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<*mut c_void>()) {
        return libc::EINVAL;
    }
    // SAFETY: as aligned; `out` is the caller's result slot.
    unsafe {
        let p = aligned(align, size);
        if p.is_null() {
            return libc::ENOMEM;
        }
        *out = p;
    }
    0
}

/// # Safety
/// The C `aligned_alloc` contract.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        sys::set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: as aligned.
    unsafe { aligned(align, size) }
}

/// # Safety
/// The C `memalign` contract.
#[no_mangle]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    // SAFETY: as aligned_alloc.
    unsafe { aligned_alloc(align, size) }
}

/// # Safety
/// The C `valloc` contract.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    // SAFETY: as aligned.
    unsafe { aligned(PAGE_SIZE, size) }
}

/// # Safety
/// The C `pvalloc` contract.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    let Some(size) = size
        .checked_add(PAGE_SIZE - 1)
        .map(|s| s & !(PAGE_SIZE - 1))
    else {
        sys::set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    // SAFETY: as aligned.
    unsafe { aligned(PAGE_SIZE, size.max(PAGE_SIZE)) }
}

/// # Safety
/// The C `malloc_usable_size` contract.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> size_t {
    if p.is_null() {
        return 0;
    }
    if is_managed_ptr(p) {
        // SAFETY: a live mimalloc block.
        unsafe { mi::mi_usable_size(p) }
    } else {
        libc_usable_size(p)
    }
}

// ---- anonymous mappings -----------------------------------------------------

/// Whether a mapping request is one the space serves.
fn is_managed_mapping(prot: c_int, flags: c_int) -> bool {
    let private_anon =
        flags & libc::MAP_TYPE == libc::MAP_PRIVATE && flags & libc::MAP_ANONYMOUS != 0;
    let unusual = libc::MAP_HUGETLB | libc::MAP_GROWSDOWN | libc::MAP_STACK | libc::MAP_32BIT;
    private_anon && flags & unusual == 0 && prot & !(libc::PROT_READ | libc::PROT_WRITE) == 0
}

/// # Safety
/// The C `mmap` contract.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    // SAFETY: forwarded to the kernel, or served from our reservation.
    unsafe {
        let Some(rt) = managed() else {
            return sys::mmap(addr, len, prot, flags, fd, off);
        };
        if flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0 {
            if !rt.space.overlaps(addr as usize, len) {
                return sys::mmap(addr, len, prot, flags, fd, off);
            }
            if flags & libc::MAP_FIXED == 0 {
                // NOREPLACE over our reservation: it is occupied.
                sys::set_errno(libc::EEXIST);
                return libc::MAP_FAILED;
            }
            if is_managed_mapping(prot, flags) {
                // A heap committed or uncommitted inside its own
                // reservation (the JVM, Go): kept managed.
                match rt.space.replace(addr as usize, len, prot) {
                    Ok(true) => return addr,
                    Ok(false) => {}
                    Err(e) => {
                        sys::set_errno(e);
                        return libc::MAP_FAILED;
                    }
                }
            }
            let p = sys::mmap(addr, len, prot, flags, fd, off);
            if p != libc::MAP_FAILED {
                rt.space.retire(addr as usize, len);
            }
            return p;
        }
        if !is_managed_mapping(prot, flags) {
            return sys::mmap(addr, len, prot, flags, fd, off);
        }
        match rt.space.map(len, prot) {
            Ok(p) => p as *mut c_void,
            Err(e) => {
                sys::set_errno(e);
                libc::MAP_FAILED
            }
        }
    }
}

/// # Safety
/// The C `mmap64` contract (the same call on 64-bit systems).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: libc::off_t,
) -> *mut c_void {
    // SAFETY: as mmap.
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// # Safety
/// The C `munmap` contract.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    // SAFETY: forwarded to the kernel, or a range of our reservation.
    unsafe {
        let Some(rt) = runtime() else {
            return sys::munmap(addr, len);
        };
        if !rt.space.overlaps(addr as usize, len) {
            return sys::munmap(addr, len);
        }
        match rt.space.unmap(addr as usize, len) {
            Ok(()) => 0,
            Err(e) => {
                sys::set_errno(e);
                -1
            }
        }
    }
}

/// # Safety
/// The C `mremap` contract. C declares it variadic (the fifth argument is
/// read only with `MREMAP_FIXED`); on x86-64 and AArch64 Linux a variadic
/// caller passes it in the same register this definition reads.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    // SAFETY: forwarded to the kernel, or a range of our reservation.
    unsafe {
        let Some(rt) = runtime() else {
            return sys::mremap(old, old_len, new_len, flags, new_addr);
        };
        let moves_to = flags & libc::MREMAP_FIXED != 0;
        let touches_new = moves_to && rt.space.overlaps(new_addr as usize, new_len);
        if !rt.space.overlaps(old as usize, old_len.max(1)) && !touches_new {
            return sys::mremap(old, old_len, new_len, flags, new_addr);
        }
        if moves_to || flags & libc::MREMAP_DONTUNMAP != 0 {
            // Not supported on managed memory: refuse rather than move
            // pages the pager tracks behind its back.
            sys::set_errno(libc::EINVAL);
            return libc::MAP_FAILED;
        }
        match rt.space.remap(
            old as usize,
            old_len,
            new_len,
            flags & libc::MREMAP_MAYMOVE != 0,
        ) {
            Ok(p) => p as *mut c_void,
            Err(e) => {
                sys::set_errno(e);
                libc::MAP_FAILED
            }
        }
    }
}

/// # Safety
/// The C `madvise` contract.
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: size_t, advice: c_int) -> c_int {
    // MADV_FREE lets the kernel drop pages later, without an event the
    // pager could see; on managed memory it becomes MADV_DONTNEED, which
    // the program cannot tell apart (freed pages may read as zeros).
    let advice = match runtime() {
        Some(rt) if advice == libc::MADV_FREE && rt.space.overlaps(addr as usize, len) => {
            libc::MADV_DONTNEED
        }
        _ => advice,
    };
    // SAFETY: forwarded to the kernel.
    unsafe { sys::madvise(addr, len, advice) }
}

/// # Safety
/// The C `sched_getaffinity` contract. While co-scheduling pins the main
/// thread, it answers that thread's affinity from before the pin
/// (cosched.rs); otherwise the kernel's, as libc's does.
#[no_mangle]
pub unsafe extern "C" fn sched_getaffinity(
    pid: libc::pid_t,
    size: size_t,
    mask: *mut libc::cpu_set_t,
) -> c_int {
    if mask.is_null() {
        sys::set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller gave `size` writable bytes at `mask`.
    let buf = unsafe { std::slice::from_raw_parts_mut(mask.cast::<u8>(), size) };
    let copied = match cosched::answer_for(pid) {
        Some(set) => {
            let bytes = set.as_bytes();
            let n = size.min(bytes.len());
            if bytes[n..].iter().any(|&b| b != 0) {
                // The kernel's answer to a mask too small for its CPUs.
                sys::set_errno(libc::EINVAL);
                return -1;
            }
            buf[..n].copy_from_slice(&bytes[..n]);
            n
        }
        None => match uzswap_os::sched::affinity_into(pid, buf) {
            Ok(n) => n,
            Err(e) => {
                sys::set_errno(e.raw_os_error().unwrap_or(libc::EINVAL));
                return -1;
            }
        },
    };
    // As libc's: the bytes past what was written are cleared.
    buf[copied..].fill(0);
    0
}

// ---- start-up -----------------------------------------------------------------

fn start() -> Result<(), String> {
    // Parsed and checked by the contract `uzswap run` wrote it with.
    let Some(config) = RunConfig::from_env().map_err(|e| e.to_string())? else {
        return Ok(()); // not asked to manage anything
    };
    if config.cosched {
        // Started with `vfork`/`posix_spawn` by a thread co-scheduling
        // pinned: the tree's affinity back (cosched.rs).
        if let Some(run) = config.ledger.as_deref().and_then(share::run_pid) {
            cosched::release_inherited(run);
        }
    }
    // With a ledger the budget is the whole tree's and this process holds
    // its allotment of it (share.rs). Joined first: nothing of the runtime
    // is set up yet if the run has ended and the program runs unmanaged.
    let share = match &config.ledger {
        Some(path) => match share::Share::join(
            path,
            config.memory_max,
            config.pool_max,
            config.backing.is_some(),
        )? {
            Some(sh) => Some(Arc::new(sh)),
            None => {
                sys::warn(&format!(
                    "the `uzswap run` that started this program has ended (its ledger {} \
                     is gone): this process runs unmanaged",
                    path.display()
                ));
                return Ok(());
            }
        },
        None => None,
    };
    // Before the cache and the pager start their threads.
    setup_runtime_heap();
    let budget_pages = (config.memory_max / PAGE_SIZE as u64) as usize;

    // An unreachable server stops the program before it starts (as a
    // backing directory that cannot take a file does).
    let remote = match &config.backing {
        Some(BackingTier::Redis(url)) => {
            let mut rc = uzswap_remote::RemoteConfig::default();
            if let Some(p) = &config.remote_prefix {
                rc.prefix = p.clone();
            }
            Some(Arc::new(
                RedisBacking::connect_with(url, rc).map_err(|e| e.to_string())?,
            ))
        }
        _ => None,
    };
    let cache_cfg = CacheConfig {
        compressor: config.compressor,
        cold_compressor: config.cold_compressor,
        pool_limit: match &share {
            Some(sh) => PoolLimit::Bytes(sh.initial_pool_limit()),
            None => config
                .pool_max
                .map_or(PoolLimit::Percent(20), PoolLimit::Bytes),
        },
        backing: match (&config.backing, &remote) {
            (Some(BackingTier::File(p)), _) => Backing::File(p.clone()),
            (Some(BackingTier::Redis(_)), Some(r)) => Backing::Store(Box::new(Arc::clone(r))),
            _ => Backing::None,
        },
        thread_start: Some(mark_thread_internal),
        // Stores come from the evictor alone: one shard, one set of size
        // classes, one partly filled zspage per class (a shard per CPU
        // kept two on two CPUs, and every process of a tree pays them).
        pool_shards: Some(1),
        dedup: config.dedup,
        // Every area belongs to this one program: a page may share with
        // any other it holds.
        dedup_scope: uzswap_cache::DedupScope::Global,
        ..CacheConfig::default()
    };
    // The helpers below (the pool's compactor, the cache's writer, the
    // pager's handler and evictor, the statistics server, co-scheduling's
    // watcher) start together: each runs `mark_thread_internal` before
    // anything is switched on (`READY`), but this thread waits once for
    // them all instead of once for each, a scheduler's time slice apiece on
    // a busy machine, in every process of a tree.
    let started = uzswap_os::StartBatch::open();
    let cache = Arc::new(Cache::new(cache_cfg).map_err(|e| e.to_string())?);
    let mut pcfg = PagerConfig::new(budget_pages);
    pcfg.thread_start = Some(mark_thread_internal);
    // The budget pays for the runtime's own heap (the cache index, the
    // pager's tables), as a memory cgroup pays for the kernel's
    // allocations on a task's behalf; the pool is capped apart.
    pcfg.charge = Some(uzswap_region::Charge(match &share {
        None => Arc::new(|| stats::runtime_heap().held_bytes),
        Some(sh) => {
            let sh = Arc::clone(sh);
            // The pager and cache exist once RUNTIME is set; until then the
            // share reports the heap alone.
            Arc::new(move || {
                let rt = RUNTIME.get();
                sh.charge(rt.map(|r| r.space.pager()), rt.map(|r| &*r.cache))
            })
        }
    }));
    if share.is_some() {
        pcfg.floor_pages = Some(share::FLOOR_PAGES.min(budget_pages));
        // A forked child's writes soon make its copy of this memory its
        // own: the parent makes that much room before each fork.
        pcfg.fork_room = Some(uzswap_region::Charge(Arc::new(|| {
            RUNTIME.get().map_or(0, |r| {
                share::unmanaged(&r.space.pager().usage(), &r.cache.usage())
            })
        })));
    }
    pcfg.keep_clean = config.keep_clean;
    // The budget is the program's memory: pages that map the zero page
    // hold none.
    pcfg.uncharged_zero_pages = true;
    pcfg.cpu_handlers = config.cpu_handlers;
    let pager = Pager::new(cache.clone(), pcfg).map_err(|e| e.to_string())?;
    let reserve = config.reserve;
    let space =
        space::Space::new(pager, usize::try_from(reserve).unwrap_or(usize::MAX)).map_err(|e| {
            format!(
                "cannot reserve {reserve} bytes of address space ({e}): set {} lower",
                uzswap_contract::names::RESERVE
            )
        })?;
    let rt = Runtime {
        space,
        cache,
        share,
        config,
        started: std::time::Instant::now(),
    };
    if RUNTIME.set(rt).is_err() {
        return Err("started twice".into());
    }
    OWNER_PID.store(std::process::id() as i32, Ordering::Relaxed);
    // Ours run before the pager's prepare hook (registered earlier), so the
    // pager's fork-time loads run marked internal.
    // SAFETY: three extern "C" functions without arguments, for the whole
    // life of the program.
    let r =
        unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child)) };
    if r != 0 {
        return Err(format!(
            "pthread_atfork failed: {}",
            std::io::Error::from_raw_os_error(r)
        ));
    }
    stats::serve(mark_thread_internal)
        .map_err(|e| format!("cannot open the statistics socket: {e}"))?;
    start_cosched();
    started
        .wait()
        .map_err(|e| format!("a runtime thread did not start: {e}"))?;
    // SAFETY: registers an extern "C" function that lives for the program.
    unsafe { libc::atexit(at_exit) };
    READY.store(true, Ordering::Release);
    Ok(())
}

/// Co-scheduling's watcher, where it is asked for and can work
/// (cosched.rs): not with CPU handlers, which are bound per CPU.
fn start_cosched() {
    let Some(rt) = RUNTIME.get() else {
        return;
    };
    if !rt.config.cosched || rt.config.cpu_handlers || !cosched::possible() {
        return;
    }
    if let Err(e) = cosched::start(mark_thread_internal) {
        sys::warn(&format!(
            "co-scheduling is off: cannot start its thread: {e}"
        ));
    }
}

extern "C" fn init() {
    enter_internal();
    let r = start();
    leave_internal();
    if let Err(e) = r {
        sys::warn(&format!("cannot start: {e}"));
        // SAFETY: ends the process before the program runs.
        unsafe { libc::_exit(125) };
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

extern "C" fn at_exit() {
    if OWNER_PID.load(Ordering::Relaxed) != std::process::id() as i32 {
        return; // a forked child: the statistics are the parent's
    }
    enter_internal();
    if let Some(rt) = RUNTIME.get() {
        stats::write_final(rt);
        if let Some(sh) = &rt.share {
            // The last report, with the CPU time of the whole run.
            sh.measure_cpu();
            sh.charge(Some(rt.space.pager()), Some(&*rt.cache));
            sh.leave();
        }
        // The remote tier's keys stay until `uzswap run` sweeps the run's
        // prefix, once no process of the tree is left: another thread of
        // this program may still touch an evicted page while it exits,
        // and deleting them here would turn that load into a SIGBUS. A
        // killed run's keys expire with their time-to-live.
    }
    leave_internal();
}

extern "C" fn fork_prepare() {
    enter_internal();
    FORKING.store(true, Ordering::Release);
    cosched::before_fork();
    if let Some(rt) = runtime() {
        // Before any lock: the evictor makes the room, and its charge takes
        // the ledger slot's lock.
        rt.space.pager().make_room_for_fork();
        rt.space.lock_for_fork();
        if let Some(sh) = &rt.share {
            sh.hold_for_fork();
        }
    }
}

extern "C" fn fork_parent() {
    if let Some(rt) = runtime() {
        if let Some(sh) = &rt.share {
            // SAFETY: fork_prepare took it on this thread.
            unsafe { sh.release_after_fork() };
        }
        rt.space.unlock_after_fork();
    }
    cosched::after_fork_parent();
    FORKING.store(false, Ordering::Release);
    leave_internal();
}

/// The child of a `fork()` without exec: the pager's own hook, which ran
/// first, has taken over the child's copy of the memory (its evicted pages
/// stay evicted, in the child's copy of the pool and of the backing file),
/// so the child is managed like any process of the tree: it takes a slot
/// of its own in the ledger and answers `uzswap stats` on its own socket.
extern "C" fn fork_child() {
    cosched::after_fork_child();
    if let Some(rt) = runtime() {
        if let Some(sh) = &rt.share {
            // SAFETY: fork_prepare took it on this thread (the parent's,
            // of which this is the copy).
            unsafe { sh.release_after_fork() };
        }
        rt.space.unlock_after_fork();
        if !uzswap_region::fork_child_managed() {
            // The pager brought the parent's pages back for this fork: the
            // child runs unmanaged, as a small launcher or subshell should.
            FORKED.store(true, Ordering::Relaxed);
            FORKING.store(false, Ordering::Release);
            leave_internal();
            return;
        }
        OWNER_PID.store(std::process::id() as i32, Ordering::Relaxed);
        if let Some(sh) = &rt.share {
            if let Err(e) = sh.rejoin() {
                sys::warn(&format!(
                    "a forked child ({}) has no slot of its own in the budget's ledger: {e}; its memory counts as unreported",
                    std::process::id()
                ));
            }
        }
        if let Err(e) = stats::serve(mark_thread_internal) {
            sys::warn(&format!(
                "a forked child ({}) cannot answer uzswap stats: {e}",
                std::process::id()
            ));
        }
        start_cosched();
    }
    FORKING.store(false, Ordering::Release);
    leave_internal();
}
