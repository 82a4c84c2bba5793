//! uzswap-ledger: one budget for a whole process tree.
//!
//! `uzswap run --memory-max B` promises that the program, every process it
//! starts included, holds at most B: resident managed pages, compressed
//! pools and uzswap's own bookkeeping of all of them together. Each process
//! keeps its own pager and pool (no lock is shared between processes, so a
//! process killed at any instruction leaves nobody stuck); they meet in a
//! small shared table, the [`Ledger`]: one slot per process, in which the
//! process reports what it holds and the arbiter (`uzswap run`) writes what
//! it may hold. The [`Arbiter`] decides every few milliseconds with
//! [`policy::share`], and reaps the slots of processes that died.
//!
//! # Glossary
//! - **slot**: a process's line of the ledger.
//! - **usage**: what a process holds and the budget pays for (resident +
//!   pool + runtime).
//! - **allotment**: what the arbiter lets a process hold; the sum over the
//!   tree never exceeds the budget.
//! - **floor**: what a process cannot give back; never allotted less.

mod arbiter;
pub mod find;
pub mod policy;
pub mod proc_sample;
mod sys;
mod table;

pub use arbiter::{Arbiter, Tick};
pub use find::{find, FindError, Found, Role};
pub use sys::{proc_identity, self_start_time};
pub use table::{Error, Ledger, Member, SlotView, Usage, MAX_SLOTS};
