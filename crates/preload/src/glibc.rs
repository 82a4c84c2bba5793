//! What the C library's `fork()` reads after the `pthread_atfork` hooks.
//!
//! glibc's `fork()`, in a process with more than one thread, runs every
//! prepare hook (the pager's takes its locks there and holds them through
//! the fork) and only then copies its name-service state: a block that
//! glibc allocates with `malloc` on first use of the name service
//! (`getpwuid`, `getaddrinfo`, ...), and reads at every fork after. Had the
//! program's `malloc` made it, it would sit in a region: once evicted, the
//! forking thread would fault on it while holding the pager's locks, and
//! no handler could serve it (the fork would hang for ever). So the
//! runtime makes that block itself, at start-up, while `malloc` still goes
//! to glibc's own heap (see the crate docs): glibc allocates it once and
//! keeps it for the life of the process, outside every region.
//!
//! The state is glibc's own (`__nss_database_get`, exported for glibc's
//! other libraries under the `GLIBC_PRIVATE` version); where the symbol is
//! absent (another C library, or a glibc before 2.33 that has no such
//! state) nothing is done.

use crate::sys;

/// Makes glibc's name-service state now, in glibc's heap. Call at start-up
/// before the program's `malloc` is switched to the regions.
pub fn make_fork_state() {
    sys::nss_database_get_any();
}
