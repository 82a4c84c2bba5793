//! The workloads the demo, the benchmarks and the tests share (a library
//! only; nothing here changes the machine outside `$TMPDIR`).
//!
//! - [`corpus`]: page contents drawn from real files of the machine
//!   ([`corpus::DataKind`]: text, machine code, the standard mix, ...).
//! - [`usemem`]: the usemem workload in Rust, over any memory a caller
//!   hands it (a uzswap region, plain anonymous memory), and
//!   [`usemem::WorkloadArgs`], the arguments the usemem benchmarks share.
//! - [`usemem_c`]: the same workload as an unmodified C program
//!   (`workloads/usemem.c`), compiled on the machine with `cc`, with its
//!   corpus written to a file: what `uzswap demo` and `uzswap-bench run`
//!   run under `uzswap run` (and under a memory cgroup).
//!
//! Both usemems follow one rule for page contents (see [`usemem`]), so a
//! report of either means the same thing.

pub mod corpus;
pub mod usemem;
pub mod usemem_c;
