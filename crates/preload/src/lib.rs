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
//!   (`__libc_malloc`, the global allocator of `alloc`), and the runtime's
//!   threads are marked [`internal`]: their `malloc` (from C code such as
//!   zstd) goes to glibc and their `mmap` to the kernel. glibc serves them
//!   all from one arena (`alloc::setup_runtime_heap`).
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
//!
//! # Where things are
//! - `state`: whether the runtime runs, and which threads are its own;
//! - `alloc`: the runtime's own heap (glibc's), the global allocator;
//! - `malloc`, `mmap`, `fds`, `affinity`: the C functions this
//!   library replaces for the program;
//! - `start`: the constructor and the exit hook; `fork`: the fork hooks;
//! - `glibc`: the C library's own state that its `fork()` reads after the
//!   hooks, made at start-up outside the regions; `loader`: the dynamic
//!   loader's allocations, which stay in glibc's heap;
//! - `space` (over `ranges`): the reservation the managed mappings are
//!   carved from; `share`: this process's slot in the tree's ledger;
//!   `cosched`: co-scheduling; `stats`: the statistics socket;
//! - `sys`: the system calls.

mod affinity;
mod alloc;
mod cosched;
mod fds;
mod fork;
mod glibc;
mod loader;
mod malloc;
mod mmap;
mod ranges;
mod share;
mod space;
mod start;
mod state;
mod stats;
mod sys;

pub use state::internal;
pub(crate) use state::{InternalGuard, Runtime, RUNTIME};
