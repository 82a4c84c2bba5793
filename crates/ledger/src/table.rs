//! The ledger itself: a small shared table, one slot per process.
//!
//! # Layout
//! A memory file (memfd) made by `uzswap run`, mapped shared by it and by
//! every process of the program's tree:
//! ```text
//! header  [magic, version, slots, budget, arbiter pid, unallotted, decisions, high,
//!          excess, start waits, start wait µs, decided, doorbell, waiting,
//!          0, 0]                                                               128 bytes
//! slot 0  owner lines  [pid, start, seq, resident, pool, runtime, backing, faults,
//!                       evictions, stored, flags, cpu, runtime cpu, comm0, comm1,
//!                       left]                                                    128 bytes
//!         arbiter line [allot_pid, allot, 0, 0, 0, 0, 0, 0]                      64 bytes
//! slot 1  ...
//! ```
//! Every word is an `AtomicU64` and has exactly one writer:
//! - `pid` is claimed by a process with a compare-and-swap from 0 and given
//!   back by the arbiter, once it has read the slot's last report: when the
//!   process has left (at exit it writes its own pid into `left`) or is
//!   dead (a SIGKILL runs no exit code). So the arbiter sees every
//!   process's final counters, also those of a process that started and
//!   ended between two of its decisions;
//! - the other owner words are written only by the process holding the
//!   slot, under a sequence counter (`seq` odd while it writes), so that a
//!   reader sees one consistent report or retries;
//! - the arbiter line and the header are written only by the arbiter,
//!   but for `unallotted`, which the arbiter sets at each decision and
//!   a joining process takes half of with a compare-and-swap
//!   (`Ledger::take_grant`: what it may hold until the arbiter has
//!   decided for it; those that join between two decisions share it and
//!   never hold more than it together), and the two start-wait counters,
//!   which every program image that waited at its start adds to
//!   (`Member::wait_for_room`), as they ring the `doorbell` and count
//!   themselves in `waiting` while they wait. `allot` is meant for the process
//!   named by `allot_pid`: a new holder of the slot ignores what the
//!   arbiter decided for the one before it.
//!
//! No lock is shared between processes, so a process that dies at any
//! instruction leaves nobody waiting: at worst its slot holds a half-written
//! report (odd `seq`), which readers skip, until the arbiter reaps it.
//! Two header words are futexes shared between the processes (their first
//! 32 bits, never read as 64): `decided`, bumped by the arbiter at the end
//! of each decision, on which a start that waits for room sleeps; and
//! `doorbell`, which such a start rings so that the arbiter decides for it
//! at once instead of at its next tick. Every sleep on either has a
//! timeout, so a process that dies before it wakes anyone costs the others
//! at most that timeout, and a stale `waiting` count (a start killed while
//! it waited) only costs the arbiter a wake-up call per decision.

use crate::sys::{self, Mapping};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MAGIC: u64 = u64::from_le_bytes(*b"uzsledg1");
const VERSION: u64 = 7;
const HEADER_WORDS: usize = 16;
const OWNER_WORDS: usize = 24;
const SLOT_WORDS: usize = OWNER_WORDS + 8;

// Header words.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_SLOTS: usize = 2;
const H_BUDGET: usize = 3;
const H_ARBITER: usize = 4;
const H_UNALLOTTED: usize = 5;
const H_DECISIONS: usize = 6;
/// One past the highest slot ever taken: the arbiter reads no further (a
/// tree rarely has more than a few dozen processes at once, and reading
/// all [`MAX_SLOTS`]-sized tables ten times a second cost a cache miss a
/// slot).
const H_HIGH: usize = 7;
/// What the members held above their allotments at the last decision
/// (those that can give it back): memory on its way out.
const H_EXCESS: usize = 8;
/// Program images that waited at their start for room (a process counts
/// once per `execve` that joined; `Member::wait_for_room`), and how long
/// in all (µs).
const H_START_WAITS: usize = 9;
const H_START_WAIT_US: usize = 10;
/// A futex (32 bits): bumped at the end of every decision.
const H_DECIDED: usize = 11;
/// A futex (32 bits): rung by a start that waits, to have the arbiter
/// decide now.
const H_DOORBELL: usize = 12;
/// Starts waiting for room now (the arbiter wakes `decided` only then).
const H_WAITING: usize = 13;
const _: () = assert!(H_WAITING < HEADER_WORDS);

// Owner words of a slot.
const S_PID: usize = 0;
const S_START: usize = 1;
const S_SEQ: usize = 2;
const S_USAGE: usize = 3; // USAGE_WORDS words of `Usage`, then comm
const USAGE_WORDS: usize = 12;
const S_COMM: usize = S_USAGE + USAGE_WORDS;
// The command's two words, then `left`, end the owner's part.
/// The pid of the holder once it has left (0 before): its report is final.
/// A pid, not a flag, so that a leave that comes after its slot was reaped
/// and taken anew marks nothing (the new holder has another pid).
const S_LEFT: usize = S_COMM + 2;
const _: () = assert!(S_LEFT < OWNER_WORDS);
// Arbiter words of a slot.
const S_ALLOT_PID: usize = OWNER_WORDS;
const S_ALLOT: usize = OWNER_WORDS + 1;

/// The most slots a ledger may have.
pub const MAX_SLOTS: usize = 1 << 16;

/// Errors of opening or joining a ledger.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The ledger could not be made or opened.
    #[error("the ledger at {path}: {source} (is the `uzswap run` that started this program still running?)")]
    Io {
        /// Where it was looked for.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The file is not a ledger of this version.
    #[error("{path} is not a uzswap ledger of version {VERSION}: run the program with the uzswap that built it")]
    NotALedger {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// Every slot is taken.
    #[error("all {0} slots of the ledger are taken: the program runs more processes at once than `uzswap run` allows (raise --max-processes)")]
    Full(usize),
    /// A slot count outside 1..=MAX_SLOTS.
    #[error("a ledger needs 1 to {MAX_SLOTS} slots, not {0}")]
    BadSlots(usize),
}

/// What a process reports of itself, in bytes and events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Managed pages resident now.
    pub resident: u64,
    /// Memory of its compressed pool.
    pub pool: u64,
    /// What it holds besides managed pages and pool: the program's
    /// unmanaged memory and uzswap's own (`own` of it).
    pub runtime: u64,
    /// Of `runtime`, uzswap's own heap (the runtime's allocator, glibc's:
    /// index, tables, buffers).
    pub own: u64,
    /// Bytes it keeps in its backing file.
    pub backing: u64,
    /// Faults resolved so far.
    pub faults: u64,
    /// Of those, first touches: faults resolved with zeros.
    pub first_touches: u64,
    /// Pages evicted so far.
    pub evictions: u64,
    /// Pages stored (pool and backing file) now.
    pub stored: u64,
    /// Why it may hold more than its allotment ([`Usage::STORE_REFUSING`],
    /// [`Usage::BACKING_FAILING`]).
    pub flags: u64,
    /// CPU time of the whole process so far, milliseconds.
    pub cpu_ms: u64,
    /// Of that, its uzswap threads' (handler, evictor, writer, compactor),
    /// milliseconds.
    pub runtime_cpu_ms: u64,
}

impl Usage {
    /// Its store refuses pages: the pool is full and there is no backing
    /// file to write back to.
    pub const STORE_REFUSING: u64 = 1;
    /// Writing back to its backing file fails (a full disk, an I/O error).
    pub const BACKING_FAILING: u64 = 2;

    /// This report of a program image with the cumulative counters of the
    /// process's earlier images (`earlier`) added: faults, first touches,
    /// evictions and the runtime's CPU time. Its other figures are this
    /// image's alone.
    fn after(&self, earlier: &Usage) -> Usage {
        Usage {
            faults: self.faults + earlier.faults,
            first_touches: self.first_touches + earlier.first_touches,
            evictions: self.evictions + earlier.evictions,
            runtime_cpu_ms: self.runtime_cpu_ms + earlier.runtime_cpu_ms,
            ..*self
        }
    }

    fn to_words(self) -> [u64; USAGE_WORDS] {
        [
            self.resident,
            self.pool,
            self.runtime,
            self.backing,
            self.faults,
            self.evictions,
            self.stored,
            self.flags,
            self.cpu_ms,
            self.runtime_cpu_ms,
            self.first_touches,
            self.own,
        ]
    }

    fn from_words(w: [u64; USAGE_WORDS]) -> Usage {
        Usage {
            resident: w[0],
            pool: w[1],
            runtime: w[2],
            backing: w[3],
            faults: w[4],
            evictions: w[5],
            stored: w[6],
            flags: w[7],
            cpu_ms: w[8],
            runtime_cpu_ms: w[9],
            first_touches: w[10],
            own: w[11],
        }
    }

    /// What the budget pays for: resident + pool + runtime.
    pub fn charged(&self) -> u64 {
        self.resident + self.pool + self.runtime
    }
}

/// One slot as the arbiter reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotView {
    /// Its index in the table.
    pub index: usize,
    /// The process holding it.
    pub pid: u32,
    /// That process's start time (clock ticks since boot).
    pub start: u64,
    /// Its command name (up to 16 bytes).
    pub comm: String,
    /// Its last complete report.
    pub usage: Usage,
    /// What the arbiter last allotted it (None: not decided yet).
    pub allot: Option<u64>,
    /// The process has left (its exit code ran): this report is final.
    pub left: bool,
}

/// A mapped ledger.
pub struct Ledger {
    map: Mapping,
    slots: usize,
    /// Kept open by its maker: children open it through `/proc`.
    fd: OwnedFd,
    path: PathBuf,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("slots", &self.slots)
            .field("path", &self.path)
            .finish()
    }
}

fn bytes_for(slots: usize) -> usize {
    (HEADER_WORDS + slots * SLOT_WORDS) * 8
}

impl Ledger {
    /// Makes a ledger of `slots` slots for a budget of `budget` bytes, with
    /// the calling process as arbiter.
    pub fn create(slots: usize, budget: u64) -> Result<Ledger, Error> {
        if slots == 0 || slots > MAX_SLOTS {
            return Err(Error::BadSlots(slots));
        }
        let len = bytes_for(slots);
        let io = |source| Error::Io {
            path: PathBuf::from("memfd:uzswap-ledger"),
            source,
        };
        let fd = sys::memfd(len).map_err(io)?;
        let map = Mapping::map(&fd, len).map_err(io)?;
        let path = PathBuf::from(format!("/proc/{}/fd/{}", sys::getpid(), fd.as_raw_fd()));
        let l = Ledger {
            map,
            slots,
            fd,
            path,
        };
        l.word(H_VERSION).store(VERSION, Ordering::Relaxed);
        l.word(H_SLOTS).store(slots as u64, Ordering::Relaxed);
        l.word(H_BUDGET).store(budget, Ordering::Relaxed);
        l.word(H_ARBITER)
            .store(u64::from(sys::getpid()), Ordering::Relaxed);
        l.word(H_UNALLOTTED).store(budget, Ordering::Relaxed);
        // Published last: a reader that sees the magic sees the rest.
        l.word(H_MAGIC).store(MAGIC, Ordering::Release);
        Ok(l)
    }

    /// Opens the ledger at `path` (what [`Ledger::path`] gave its maker).
    pub fn open(path: &Path) -> Result<Ledger, Error> {
        let io = |source| Error::Io {
            path: path.to_owned(),
            source,
        };
        let (fd, len) = sys::open(path).map_err(io)?;
        if len < bytes_for(1) {
            return Err(Error::NotALedger {
                path: path.to_owned(),
            });
        }
        let map = Mapping::map(&fd, len).map_err(io)?;
        let mut l = Ledger {
            map,
            slots: 0,
            fd,
            path: path.to_owned(),
        };
        let slots = l.word(H_SLOTS).load(Ordering::Relaxed) as usize;
        if l.word(H_MAGIC).load(Ordering::Acquire) != MAGIC
            || l.word(H_VERSION).load(Ordering::Relaxed) != VERSION
            || slots == 0
            || bytes_for(slots) > len
        {
            return Err(Error::NotALedger {
                path: path.to_owned(),
            });
        }
        l.slots = slots;
        Ok(l)
    }

    /// Where the processes of the tree open this ledger.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file descriptor behind it.
    pub fn fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// How many slots it has.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The budget of the whole tree.
    pub fn budget(&self) -> u64 {
        self.word(H_BUDGET).load(Ordering::Relaxed)
    }

    /// The pid of the arbiter (`uzswap run`).
    pub fn arbiter_pid(&self) -> u32 {
        self.word(H_ARBITER).load(Ordering::Relaxed) as u32
    }

    /// What the arbiter has not allotted to anyone: what a process may use
    /// until its first allotment.
    pub fn unallotted(&self) -> u64 {
        self.word(H_UNALLOTTED).load(Ordering::Relaxed)
    }

    /// Takes half of what is unallotted now for a process that joins: what
    /// it may hold until the arbiter's first decision about it. Taken out
    /// of the word, so that processes joining between two decisions share
    /// it (a half, a quarter, ...) and never hold more than it together.
    fn take_grant(&self) -> u64 {
        let had = self
            .word(H_UNALLOTTED)
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |had| {
                Some(had - had / 2)
            })
            .unwrap_or_else(|had| had);
        had / 2
    }

    /// What the members held above their allotments at the last decision,
    /// of what they can give back (see [`Ledger::set_excess`]).
    pub fn excess(&self) -> u64 {
        self.word(H_EXCESS).load(Ordering::Relaxed)
    }

    /// How many program images waited at their start for room (a shell
    /// that execs its program counts twice), and how long in all
    /// ([`Member::wait_for_room`]).
    pub fn start_waits(&self) -> (u64, Duration) {
        (
            self.word(H_START_WAITS).load(Ordering::Relaxed),
            Duration::from_micros(self.word(H_START_WAIT_US).load(Ordering::Relaxed)),
        )
    }

    /// How many decisions the arbiter has made.
    pub fn decisions(&self) -> u64 {
        self.word(H_DECISIONS).load(Ordering::Relaxed)
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        debug_assert!((i + 1) * 8 <= self.map.len);
        // SAFETY: the mapping is at least `bytes_for(slots)` long (checked
        // at create/open), page-aligned, and lives as long as `self`; every
        // access to it is atomic.
        unsafe { &*(self.map.ptr as *const AtomicU64).add(i) }
    }

    /// Header word `i` as the 32-bit futex it is (`H_DECIDED`,
    /// `H_DOORBELL`: words never accessed as 64 bits).
    fn futex_word(&self, i: usize) -> &AtomicU32 {
        debug_assert!(i == H_DECIDED || i == H_DOORBELL);
        // SAFETY: as `word`; the 8-byte word is 4-byte aligned, and these
        // words are only ever accessed through this 32-bit view.
        unsafe {
            &*(self.map.ptr as *const AtomicU64)
                .add(i)
                .cast::<AtomicU32>()
        }
    }

    /// How often the doorbell has been rung (arbiter side: read before a
    /// decision, then given to [`Ledger::wait_for_ring`]).
    pub fn rings(&self) -> u32 {
        self.futex_word(H_DOORBELL).load(Ordering::SeqCst)
    }

    /// Sleeps until the doorbell is rung past `seen` (a start waits for a
    /// decision), at most `max` (arbiter side, between decisions).
    pub fn wait_for_ring(&self, seen: u32, max: Duration) {
        uzswap_os::lock::futex_wait_shared(self.futex_word(H_DOORBELL), seen, Some(max));
    }

    /// Has the arbiter decide now (a start that waits for room).
    fn ring(&self) {
        let bell = self.futex_word(H_DOORBELL);
        bell.fetch_add(1, Ordering::SeqCst);
        uzswap_os::lock::futex_wake_shared(bell, 1);
    }

    fn slot_word(&self, slot: usize, i: usize) -> &AtomicU64 {
        assert!(slot < self.slots);
        self.word(HEADER_WORDS + slot * SLOT_WORDS + i)
    }

    /// Takes a slot for process `pid` (started at `start`, named `comm`):
    /// the one its previous program image held, if it had one (`execve`
    /// keeps the pid and start time and runs no exit code, so that slot is
    /// this process's and nobody else's), else a free one. The previous
    /// image's cumulative counters (faults, evictions, the runtime's CPU
    /// time) carry over: the new image's reports add to them, so that the
    /// process's counters never go back (a `python3` that is a shell
    /// script exec'ing the interpreter evicts in both images).
    pub fn claim(self: &Arc<Self>, pid: u32, start: u64, comm: &str) -> Result<Member, Error> {
        let mine = (0..self.high()).find(|&i| {
            self.slot_word(i, S_PID).load(Ordering::Acquire) == u64::from(pid)
                && self.slot_word(i, S_START).load(Ordering::Relaxed) == start
        });
        let index = match mine {
            Some(i) => i,
            None => (0..self.slots)
                .find(|&i| {
                    let w = self.slot_word(i, S_PID);
                    w.load(Ordering::Relaxed) == 0
                        && w.compare_exchange(
                            0,
                            u64::from(pid),
                            Ordering::AcqRel,
                            Ordering::Relaxed,
                        )
                        .is_ok()
                })
                .ok_or(Error::Full(self.slots))?,
        };
        // The previous image is gone (exec): nobody writes its report.
        let carried = mine.map_or(Usage::default(), |i| {
            Usage::default().after(&self.slot_usage(i))
        });
        // Raised before the slot's report is written: a reader that read
        // the bound before this misses only a slot whose report is not
        // complete yet, and reads it at its next pass.
        self.word(H_HIGH)
            .fetch_max(index as u64 + 1, Ordering::AcqRel);
        let mut c = [0u8; 16];
        let n = comm.len().min(16);
        c[..n].copy_from_slice(&comm.as_bytes()[..n]);
        let i = index;
        self.slot_word(i, S_SEQ).fetch_add(1, Ordering::Relaxed);
        fence(Ordering::Release);
        self.slot_word(i, S_START).store(start, Ordering::Relaxed);
        self.slot_word(i, S_LEFT).store(0, Ordering::Relaxed);
        self.slot_word(i, S_COMM).store(
            u64::from_le_bytes(c[..8].try_into().unwrap()),
            Ordering::Relaxed,
        );
        self.slot_word(i, S_COMM + 1).store(
            u64::from_le_bytes(c[8..].try_into().unwrap()),
            Ordering::Relaxed,
        );
        for (k, v) in carried.to_words().into_iter().enumerate() {
            self.slot_word(i, S_USAGE + k).store(v, Ordering::Relaxed);
        }
        self.slot_word(i, S_SEQ).fetch_add(1, Ordering::Release);
        Ok(Member {
            ledger: Arc::clone(self),
            index,
            pid,
            carried,
            grant: self.take_grant(),
            left: AtomicBool::new(false),
        })
    }

    /// Reads every held slot whose report is complete (arbiter side).
    pub fn read(&self) -> Vec<SlotView> {
        (0..self.high()).filter_map(|i| self.read_slot(i)).collect()
    }

    /// One past the highest slot ever taken (at most the slot count).
    fn high(&self) -> usize {
        (self.word(H_HIGH).load(Ordering::Acquire) as usize).min(self.slots)
    }

    /// The report words of slot `i`, as they are (no sequence check: the
    /// caller makes the read consistent).
    fn slot_usage(&self, i: usize) -> Usage {
        let mut w = [0u64; USAGE_WORDS];
        for (k, v) in w.iter_mut().enumerate() {
            *v = self.slot_word(i, S_USAGE + k).load(Ordering::Relaxed);
        }
        Usage::from_words(w)
    }

    fn read_slot(&self, i: usize) -> Option<SlotView> {
        for _ in 0..64 {
            let pid = self.slot_word(i, S_PID).load(Ordering::Acquire);
            if pid == 0 {
                return None;
            }
            // Before the report: seen, the report read below is the last
            // one the process published before it left, or a later one.
            let left = self.slot_word(i, S_LEFT).load(Ordering::Acquire) == pid;
            let s1 = self.slot_word(i, S_SEQ).load(Ordering::Acquire);
            if s1 % 2 == 1 {
                std::hint::spin_loop();
                continue;
            }
            let start = self.slot_word(i, S_START).load(Ordering::Relaxed);
            let usage = self.slot_usage(i);
            let c0 = self.slot_word(i, S_COMM).load(Ordering::Relaxed);
            let c1 = self.slot_word(i, S_COMM + 1).load(Ordering::Relaxed);
            fence(Ordering::Acquire);
            if self.slot_word(i, S_SEQ).load(Ordering::Relaxed) != s1
                || self.slot_word(i, S_PID).load(Ordering::Relaxed) != pid
            {
                continue;
            }
            let mut c = [0u8; 16];
            c[..8].copy_from_slice(&c0.to_le_bytes());
            c[8..].copy_from_slice(&c1.to_le_bytes());
            let n = c.iter().position(|&b| b == 0).unwrap_or(16);
            let allot = (self.slot_word(i, S_ALLOT_PID).load(Ordering::Acquire) == pid)
                .then(|| self.slot_word(i, S_ALLOT).load(Ordering::Relaxed));
            return Some(SlotView {
                index: i,
                pid: pid as u32,
                start,
                comm: String::from_utf8_lossy(&c[..n]).into_owned(),
                usage,
                allot,
                left,
            });
        }
        None
    }

    /// Allots `bytes` to the process `pid` in slot `index` (arbiter side).
    pub fn set_allot(&self, index: usize, pid: u32, bytes: u64) {
        self.slot_word(index, S_ALLOT)
            .store(bytes, Ordering::Relaxed);
        // Published after the value: a reader that sees its pid here reads
        // this value or a later one for the same pid.
        self.slot_word(index, S_ALLOT_PID)
            .store(u64::from(pid), Ordering::Release);
    }

    /// Records what the members hold above the allotments about to be set
    /// (arbiter side; before [`Ledger::set_allot`], so that a process that
    /// sees an allotment of this decision sees this excess or a later one).
    pub fn set_excess(&self, bytes: u64) {
        self.word(H_EXCESS).store(bytes, Ordering::Relaxed);
    }

    /// Records what is left unallotted and counts a decision (arbiter
    /// side; last of a decision): wakes the starts that wait for one.
    pub fn set_unallotted(&self, bytes: u64) {
        self.word(H_UNALLOTTED).store(bytes, Ordering::Relaxed);
        self.word(H_DECISIONS).fetch_add(1, Ordering::Relaxed);
        // SeqCst, as `wait_for_room`'s count and read: either it is counted
        // here and woken, or its read of `decided` comes after this bump
        // and it re-checks before it sleeps.
        let decided = self.futex_word(H_DECIDED);
        decided.fetch_add(1, Ordering::SeqCst);
        if self.word(H_WAITING).load(Ordering::SeqCst) > 0 {
            uzswap_os::lock::futex_wake_shared(decided, i32::MAX);
        }
    }

    /// Frees the slot of a process that left or died holding it (arbiter
    /// side, once it has read the slot's last report): nothing happens if
    /// the slot was meanwhile taken anew.
    pub fn reap(&self, index: usize, pid: u32) -> bool {
        self.slot_word(index, S_ALLOT_PID)
            .store(0, Ordering::Relaxed);
        // Cleared with the slot, so that its next holder has not left;
        // only its holder's pid there means anything to a reader.
        let _ = self.slot_word(index, S_LEFT).compare_exchange(
            u64::from(pid),
            0,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        self.slot_word(index, S_PID)
            .compare_exchange(u64::from(pid), 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }
}

/// A process's slot; given back when dropped.
#[derive(Debug)]
pub struct Member {
    ledger: Arc<Ledger>,
    index: usize,
    pid: u32,
    /// The cumulative counters of the process's earlier program images
    /// (`claim`), added to every report.
    carried: Usage,
    /// What it took of the unallotted memory when it joined
    /// (`Ledger::take_grant`): its limit until its first allotment.
    grant: u64,
    /// Set by [`Member::leave`]: no report is published after it. The
    /// arbiter gives a left slot back once it has read it, and another
    /// process may take it; a report of this one's evictor then (it runs
    /// until the process is gone) would be written over the new holder's.
    left: AtomicBool,
}

impl Member {
    /// The slot's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The process it was claimed for.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The ledger it belongs to.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// Publishes a new report.
    pub fn publish(&self, u: &Usage) {
        if self.left.load(Ordering::Acquire) {
            return;
        }
        let u = &u.after(&self.carried);
        let l = &self.ledger;
        l.slot_word(self.index, S_SEQ)
            .fetch_add(1, Ordering::Relaxed);
        // The odd count is visible before any word of the new report.
        fence(Ordering::Release);
        for (k, v) in u.to_words().into_iter().enumerate() {
            l.slot_word(self.index, S_USAGE + k)
                .store(v, Ordering::Relaxed);
        }
        l.slot_word(self.index, S_SEQ)
            .fetch_add(1, Ordering::Release);
    }

    /// What the arbiter allotted this process, once it has decided.
    pub fn allotment(&self) -> Option<u64> {
        let l = &self.ledger;
        (l.slot_word(self.index, S_ALLOT_PID).load(Ordering::Acquire) == u64::from(self.pid))
            .then(|| l.slot_word(self.index, S_ALLOT).load(Ordering::Relaxed))
    }

    /// What this process may hold now: its allotment, or until the first
    /// one, what it took of the unallotted memory when it joined.
    pub fn limit(&self) -> u64 {
        self.allotment().unwrap_or(self.grant)
    }

    /// Called by a process that starts, before it runs: waits until the
    /// tree has room for it, at most `max`; returns how long it waited.
    ///
    /// A process that joins a tree whose budget is all allotted takes its
    /// room from the others, and they give it up only as fast as their
    /// evictors run. Started at once, it would fill that room while they
    /// still hold it: four Python workers spawned together would take
    /// 15 MiB of a 64 MiB budget in 100 ms while their parent, cut by as
    /// much, is still evicting, and the tree would hold 1.2 x its budget on
    /// a busy machine.
    /// So, as the kernel makes a task that allocates in a full memory
    /// cgroup reclaim before it gets its page, the new process waits: until
    /// the arbiter has decided for it and what the members hold above
    /// their allotments (the memory on its way out) is within a sixteenth
    /// of the budget.
    ///
    /// A process that took at least a thirty-second of the budget when it
    /// joined does not wait: it joined while the arbiter kept room for
    /// starts (`policy::HEADROOM`, an eighth of what it shares, of which
    /// the first process to join takes half). A sixteenth would be just
    /// over what that half holds (the arbiter shares the budget less its
    /// own memory): nearly every start would wait, 49 of the 50 of a shell
    /// loop under a budget of 4 GiB that it uses 1.2 MiB of.
    ///
    /// A start that waits rings the arbiter's doorbell, so that the first
    /// decision about it comes now rather than at the arbiter's next tick,
    /// and sleeps until each decision, instead of polling every
    /// millisecond, which in a `make -j8` under 198 MiB made a waited start
    /// wait 5.6 ms on average, mostly for the arbiter's next tick (every
    /// 10 ms; "What a process start costs" under `uzswap-bench tree` in
    /// docs/BENCHMARKS.md).
    pub fn wait_for_room(&self, max: Duration) -> Duration {
        let l = &self.ledger;
        let room = l.budget() / START_ROOM_SHARE;
        if self.grant >= l.budget() / START_GRANT_SHARE {
            return Duration::ZERO;
        }
        let t0 = Instant::now();
        l.word(H_WAITING).fetch_add(1, Ordering::SeqCst);
        l.ring();
        let decided = l.futex_word(H_DECIDED);
        loop {
            // Read before the check: a decision after it changes the word,
            // and the sleep below returns at once.
            let seen = decided.load(Ordering::SeqCst);
            // The allotment is published after the decision's excess (see
            // `set_excess`): seen, that excess or a later one is read.
            if self.allotment().is_some() && l.excess() <= room {
                break;
            }
            let Some(left) = max.checked_sub(t0.elapsed()).filter(|d| !d.is_zero()) else {
                break;
            };
            // Bounded: an arbiter that has ended wakes nobody.
            uzswap_os::lock::futex_wait_shared(decided, seen, Some(left.min(START_POLL)));
        }
        l.word(H_WAITING).fetch_sub(1, Ordering::SeqCst);
        let waited = t0.elapsed();
        l.word(H_START_WAITS).fetch_add(1, Ordering::Relaxed);
        l.word(H_START_WAIT_US)
            .fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
        waited
    }
}

/// A process that starts waits while the memory on its way out exceeds
/// this share of the budget (1/16): see [`Member::wait_for_room`].
pub const START_ROOM_SHARE: u64 = 16;
/// A process that took this share of the budget (1/32) or more when it
/// joined does not wait at its start: see [`Member::wait_for_room`].
pub const START_GRANT_SHARE: u64 = 32;
/// The longest a waiting start sleeps before it looks again without a
/// decision (the arbiter decides every 10 ms and wakes it at each).
const START_POLL: Duration = Duration::from_millis(50);

impl Member {
    /// Marks the slot left: the last report published is final, and the
    /// arbiter gives the slot back once it has read it. Idempotent; marks
    /// nothing if the slot was reaped and taken by another process
    /// meanwhile (`S_LEFT`).
    pub fn leave(&self) {
        // The caller serialises leave and publish (the runtime's share
        // holds its member under a mutex): no report starts after this.
        self.left.store(true, Ordering::Release);
        // Not under the sequence count: after a reap the slot's count is
        // its new holder's. Released after the last report: a reader that
        // sees the mark reads that report or a later one.
        self.ledger
            .slot_word(self.index, S_LEFT)
            .store(u64::from(self.pid), Ordering::Release);
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_that_start_between_decisions_share_the_unallotted() {
        let l = Arc::new(Ledger::create(8, 64 << 20).unwrap());
        l.set_unallotted(16 << 20);
        let a = l.claim(4001, 1, "a").unwrap();
        let b = l.claim(4002, 1, "b").unwrap();
        let c = l.claim(4003, 1, "c").unwrap();
        assert_eq!(
            [a.limit(), b.limit(), c.limit()],
            [8 << 20, 4 << 20, 2 << 20]
        );
        // Never more than there was, together.
        assert_eq!(a.limit() + b.limit() + c.limit() + l.unallotted(), 16 << 20);
        // A decision gives each its allotment, and the next starter takes
        // from what it left unallotted.
        l.set_allot(a.index(), 4001, 20 << 20);
        assert_eq!(a.limit(), 20 << 20);
        l.set_unallotted(6 << 20);
        let d = l.claim(4004, 1, "d").unwrap();
        assert_eq!(d.limit(), 3 << 20);
    }

    /// A start into a tree whose budget is all allotted waits for the
    /// arbiter's decision about it and for the memory on its way out; one
    /// that took room enough at its join does not wait at all.
    #[test]
    fn a_start_waits_for_room_only_while_the_tree_gives_memory_back() {
        const MIB: u64 = 1 << 20;
        let l = Arc::new(Ledger::create(8, 64 * MIB).unwrap());
        // Room at the join (half of 16 MiB > 64/16 MiB): no wait.
        l.set_unallotted(16 * MIB);
        let roomy = l.claim(5001, 1, "roomy").unwrap();
        assert_eq!(roomy.wait_for_room(Duration::from_secs(5)), Duration::ZERO);
        assert_eq!(l.start_waits().0, 0);
        // All allotted: the next one waits. The arbiter decides for it
        // after 30 ms with 20 MiB still on its way out, which is given
        // back 50 ms later.
        l.set_unallotted(0);
        let new = l.claim(5002, 1, "new").unwrap();
        let idx = new.index();
        let arbiter = {
            let l = Arc::clone(&l);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                l.set_excess(20 * MIB);
                l.set_allot(idx, 5002, 2 * MIB);
                l.set_unallotted(0);
                std::thread::sleep(Duration::from_millis(50));
                l.set_excess(MIB);
                l.set_unallotted(0);
            })
        };
        let waited = new.wait_for_room(Duration::from_secs(5));
        arbiter.join().unwrap();
        assert!(
            waited >= Duration::from_millis(80) && waited < Duration::from_secs(5),
            "waited {waited:?}"
        );
        assert_eq!(new.limit(), 2 * MIB);
        let (n, total) = l.start_waits();
        assert_eq!(n, 1);
        assert!(total >= Duration::from_millis(80), "{total:?}");
        // Memory that never goes: the wait ends at its bound.
        l.set_excess(40 * MIB);
        let stuck = l.claim(5003, 1, "stuck").unwrap();
        l.set_allot(stuck.index(), 5003, 2 * MIB);
        let waited = stuck.wait_for_room(Duration::from_millis(60));
        assert!(waited >= Duration::from_millis(60), "waited {waited:?}");
        assert_eq!(l.start_waits().0, 2);
    }

    /// The room the arbiter keeps for starts is an eighth of the budget
    /// less its own memory: the first start takes half of it, a hair under
    /// a sixteenth of the budget, and does not wait; the next, with a
    /// quarter, does.
    #[test]
    fn a_start_into_the_kept_room_does_not_wait() {
        const MIB: u64 = 1 << 20;
        let l = Arc::new(Ledger::create(8, 4096 * MIB).unwrap());
        l.set_unallotted((4096 * MIB - 3 * MIB) / 8);
        let first = l.claim(5101, 1, "first").unwrap();
        assert_eq!(first.wait_for_room(Duration::from_secs(5)), Duration::ZERO);
        let second = l.claim(5102, 1, "second").unwrap();
        let waited = second.wait_for_room(Duration::from_millis(20));
        assert!(waited >= Duration::from_millis(20), "waited {waited:?}");
        assert_eq!(l.start_waits().0, 1);
    }

    /// A start that waits rings the arbiter's doorbell, and the decision
    /// the ring brought wakes it: the arbiter here sleeps for a minute
    /// unless rung.
    #[test]
    fn a_waiting_start_rings_the_arbiter_and_its_decision_wakes_it() {
        const MIB: u64 = 1 << 20;
        let l = Arc::new(Ledger::create(8, 64 * MIB).unwrap());
        l.set_unallotted(0);
        let seen = l.rings();
        let arbiter = {
            let l = Arc::clone(&l);
            std::thread::spawn(move || {
                let t0 = Instant::now();
                while l.rings() == seen && t0.elapsed() < Duration::from_secs(60) {
                    l.wait_for_ring(seen, Duration::from_secs(60));
                }
                let rung = l.rings() != seen;
                // Decide for whoever joined.
                for v in l.read() {
                    l.set_allot(v.index, v.pid, 4 * MIB);
                }
                l.set_excess(0);
                l.set_unallotted(0);
                rung
            })
        };
        let new = l.claim(5201, 1, "new").unwrap();
        let waited = new.wait_for_room(Duration::from_secs(120));
        assert!(arbiter.join().unwrap(), "the arbiter was not rung");
        assert_eq!(new.limit(), 4 * MIB);
        assert!(waited < Duration::from_secs(60), "waited {waited:?}");
        assert_eq!(l.word(H_WAITING).load(Ordering::SeqCst), 0);
    }

    #[test]
    fn a_slot_is_claimed_reported_allotted_and_given_back() {
        let l = Arc::new(Ledger::create(4, 1 << 30).unwrap());
        let m = l.claim(4242, 7, "cc1plus-with-a-long-name").unwrap();
        assert_eq!(m.limit(), 1 << 29, "before a decision: half the unallotted");
        let u = Usage {
            resident: 1,
            pool: 2,
            runtime: 3,
            backing: 4,
            faults: 5,
            evictions: 6,
            stored: 7,
            flags: Usage::BACKING_FAILING,
            cpu_ms: 8,
            runtime_cpu_ms: 9,
            first_touches: 10,
            own: 2,
        };
        m.publish(&u);
        let v = l.read();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].pid, 4242);
        assert_eq!(v[0].start, 7);
        assert_eq!(v[0].comm, "cc1plus-with-a-l");
        assert_eq!(v[0].usage, u);
        assert_eq!(v[0].allot, None);
        l.set_allot(v[0].index, 4242, 123);
        assert_eq!(m.allotment(), Some(123));
        drop(m);
        // Left: read once more (by the arbiter, who gives it back).
        let v = l.read();
        assert!(v.len() == 1 && v[0].left, "{v:?}");
        assert!(l.reap(v[0].index, 4242));
        assert!(l.read().is_empty());
        // The next holder does not see the old decision.
        let m2 = l.claim(777, 1, "x").unwrap();
        assert_eq!(m2.allotment(), None);
    }

    #[test]
    fn a_full_ledger_says_so_and_a_reaped_slot_is_free_again() {
        let l = Arc::new(Ledger::create(2, 1 << 20).unwrap());
        let a = l.claim(1, 1, "a").unwrap();
        let _b = l.claim(2, 1, "b").unwrap();
        assert!(matches!(l.claim(3, 1, "c"), Err(Error::Full(2))));
        assert!(l.reap(a.index(), 1));
        assert!(!l.reap(a.index(), 1), "reaped once");
        let c = l.claim(3, 1, "c").unwrap();
        assert_eq!(c.index(), a.index());
        drop(a); // the old holder's drop must not free c's slot
        let v = l.read();
        assert_eq!(v.len(), 2);
        assert!(v.iter().all(|v| !v.left), "nor mark it left: {v:?}");
    }

    #[test]
    fn a_new_program_image_of_a_process_takes_over_its_slot() {
        let l = Arc::new(Ledger::create(4, 1 << 20).unwrap());
        let shell = l.claim(42, 9, "sh").unwrap();
        shell.publish(&Usage {
            resident: 1 << 20,
            faults: 30,
            first_touches: 7,
            evictions: 20,
            runtime_cpu_ms: 10,
            ..Usage::default()
        });
        std::mem::forget(shell); // exec: no exit code runs
        let prog = l.claim(42, 9, "python3").unwrap();
        let v = l.read();
        assert_eq!(v.len(), 1, "one slot per process: {v:?}");
        assert_eq!(v[0].index, prog.index());
        assert_eq!(v[0].comm, "python3");
        // The memory figures start anew; the counters carry over, and the
        // new image's reports add to them.
        let carried = Usage {
            faults: 30,
            first_touches: 7,
            evictions: 20,
            runtime_cpu_ms: 10,
            ..Usage::default()
        };
        assert_eq!(v[0].usage, carried);
        prog.publish(&Usage {
            resident: 4096,
            faults: 3,
            first_touches: 1,
            evictions: 2,
            runtime_cpu_ms: 1,
            ..Usage::default()
        });
        let u = l.read()[0].usage;
        assert_eq!(
            (
                u.resident,
                u.faults,
                u.first_touches,
                u.evictions,
                u.runtime_cpu_ms
            ),
            (4096, 33, 8, 22, 11)
        );
        // Another process with the same pid (reused) but another start
        // time is another process.
        let other = l.claim(42, 10, "x").unwrap();
        assert_ne!(other.index(), prog.index());
    }

    #[test]
    fn another_mapping_sees_the_same_table() {
        let l = Arc::new(Ledger::create(8, 5 << 20).unwrap());
        let other = Arc::new(Ledger::open(l.path()).unwrap());
        assert_eq!(other.slots(), 8);
        assert_eq!(other.budget(), 5 << 20);
        let m = other.claim(99, 5, "py").unwrap();
        m.publish(&Usage {
            resident: 4096,
            ..Usage::default()
        });
        let v = l.read();
        assert_eq!(v[0].usage.resident, 4096);
        l.set_allot(v[0].index, 99, 1 << 20);
        assert_eq!(m.limit(), 1 << 20);
    }

    #[test]
    fn what_is_not_a_ledger_is_refused() {
        let dir = std::env::temp_dir().join(format!("uzswap-ledger-{}", std::process::id()));
        std::fs::write(&dir, vec![0u8; 4096]).unwrap();
        assert!(matches!(Ledger::open(&dir), Err(Error::NotALedger { .. })));
        std::fs::remove_file(&dir).unwrap();
        assert!(matches!(
            Ledger::open(Path::new("/nonexistent/ledger")),
            Err(Error::Io { .. })
        ));
        assert!(matches!(Ledger::create(0, 1), Err(Error::BadSlots(0))));
    }

    #[test]
    fn reports_are_never_torn_under_concurrent_writers() {
        let l = Arc::new(Ledger::create(4, 1 << 30).unwrap());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..3u32)
            .map(|t| {
                let l = Arc::clone(&l);
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let m = l.claim(100 + t, 1, "w").unwrap();
                    let mut k = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        k += 1;
                        // Every word of one report carries the same k.
                        m.publish(&Usage::from_words([k; USAGE_WORDS]));
                    }
                })
            })
            .collect();
        let t0 = std::time::Instant::now();
        let mut seen = 0;
        while t0.elapsed() < std::time::Duration::from_millis(300) {
            for v in l.read() {
                let w = v.usage.to_words();
                assert!(w.iter().all(|&x| x == w[0]), "torn report {w:?}");
                seen += 1;
            }
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
        assert!(seen > 0);
    }
}
