//! One budget for the whole program, from `uzswap run`'s side: it makes
//! the ledger every process of the program joins, and a thread (the
//! *arbiter*) that every [`TICK`], and at once when a process that starts
//! waits for room rings it (`Ledger::wait_for_ring`), shares the budget
//! among them (`uzswap_ledger::Arbiter`) and every [`SAMPLE`] measures
//! what the whole tree holds as the kernel counts it (`Pss_Anon` of every
//! process, and of this one), so that:
//! - memory no process reports (a child forked without exec runs
//!   unmanaged; thread stacks, `brk`) is reserved out of the budget before
//!   it is shared;
//! - going over the budget is said at once on stderr, with the reason and
//!   the remedy, and kept for the summary and the statistics;
//! - the summary's headline is the tree's peak against the budget;
//! - with `--record`, every few samples the tree and each process are
//!   handed to the recording's writer (`record.rs`).

use crate::record::{self, Recorder};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use uzswap_contract::BackingTier;
use uzswap_ledger::{proc_sample, Arbiter, Ledger, Usage};

/// How often the budget is shared.
pub const TICK: Duration = Duration::from_millis(10);
/// How often the tree's memory is sampled from /proc.
pub const SAMPLE: Duration = Duration::from_millis(100);
/// Slots of the ledger: processes of the program alive at once.
pub const SLOTS: usize = 4096;
/// Pages a process may always hold beyond its runtime (the arbiter's floor;
/// the runtime's pager keeps at least this many resident).
const MIN_RESIDENT: u64 = 1 << 20;
/// Samples in a row over the budget before it counts (a process that
/// starts holds its first pages before its first allotment).
const OVER_SAMPLES: u32 = 3;
/// An overshoot is said on stderr when it matters: at least this share of
/// the budget (the tests and benchmarks hold a tree to 1.05 x B), or for
/// [`LONG_OVER_SAMPLES`] samples in a row. Every episode is in the
/// statistics (`over_budget`, `over_budget_reasons`) all the same.
const OVER_SHARE_SAID: u64 = 20;
/// Samples in a row (5 s) after which any overshoot is said.
const LONG_OVER_SAMPLES: u32 = 50;
/// Samples after the program started that do not count for the peak: the
/// dynamic loader and the runtimes' start-up.
pub const STARTUP_SAMPLES: u32 = 3;

/// The largest overshoot said so far. A later episode over the budget is
/// said only if it goes further, by 1/64 of the budget and at least 1 MiB,
/// so that a program hovering at its budget does not repeat the warning
/// every few samples (every episode is in the statistics all the same).
#[derive(Default)]
struct SaidExcess(Option<u64>);

impl SaidExcess {
    fn worth_saying(&mut self, excess: u64, budget: u64) -> bool {
        let step = (budget / 64).max(1 << 20);
        let news = self.0.is_none_or(|said| excess > said + step);
        if news {
            self.0 = Some(excess);
        }
        news
    }
}

/// One process of the tree, as the arbiter saw it.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Process {
    /// Its pid.
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// Its last report.
    pub resident_bytes: u64,
    pub pool_bytes: u64,
    pub runtime_bytes: u64,
    pub backing_bytes: u64,
    /// Of `runtime_bytes`, uzswap's own heap (the rest is the program's
    /// unmanaged memory).
    pub own_bytes: u64,
    /// The most of each by its own reports (a process's last report, at
    /// its exit, holds no memory).
    pub peak_own_bytes: u64,
    pub peak_unmanaged_bytes: u64,
    pub faults: u64,
    /// Of its faults, first touches (resolved with zeros).
    pub first_touches: u64,
    pub evictions: u64,
    /// The most it held (resident + pool + runtime) by its own reports.
    pub peak_bytes: u64,
    /// Its last allotment.
    pub allot_bytes: u64,
    /// CPU time of the process, by its last report (its exit handler
    /// reports the whole of it).
    pub cpu_seconds: f64,
    /// Of that, uzswap's threads in it (handler, evictor, writer,
    /// compactor).
    pub runtime_cpu_seconds: f64,
}

/// What the arbiter saw over the run.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TreeReport {
    /// The budget of the whole tree.
    pub budget_bytes: u64,
    /// The tree's largest sampled memory after start-up: `Pss_Anon` of
    /// every process of the program, plus this one's.
    pub peak_bytes: u64,
    /// Seconds after the start at which it was reached.
    pub peak_at_seconds: f64,
    /// Samples taken.
    pub samples: u64,
    /// Whether the tree was over its budget for [`OVER_SAMPLES`] samples in
    /// a row at some point.
    pub over_budget: bool,
    /// Why, each reason once, in the order they were seen.
    pub over_budget_reasons: Vec<String>,
    /// Most processes managed at once.
    pub max_processes: usize,
    /// Every process that joined, by pid.
    pub processes: BTreeMap<u32, Process>,
    /// CPU time of the program's processes together, uzswap's threads in
    /// them included.
    pub cpu_seconds: f64,
    /// Of that, uzswap's threads'.
    pub runtime_cpu_seconds: f64,
    /// CPU time of `uzswap run` itself (the arbiter, the sampling).
    pub run_cpu_seconds: f64,
    /// Program starts (a process, or a new image it executed) that waited
    /// for the others to give memory back
    /// (`uzswap_ledger::Member::wait_for_room`), and how long in all.
    pub start_waits: u64,
    pub start_wait_seconds: f64,
}

/// Where the arbiter sends its samples for `--record`.
pub struct Recording {
    pub recorder: Recorder,
    /// A sample is recorded every this many [`SAMPLE`]s.
    pub every: u64,
}

/// The ledger and the arbiter thread.
pub struct Watch {
    ledger: Arc<Ledger>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<TreeReport>>,
}

impl Watch {
    /// Makes the ledger for a budget of `budget` bytes; the program's
    /// processes open it at [`Watch::path`].
    pub fn create(budget: u64) -> anyhow::Result<Watch> {
        let ledger = Arc::new(Ledger::create(SLOTS, budget)?);
        Ok(Watch {
            ledger,
            stop: Arc::new(AtomicBool::new(false)),
            thread: None,
        })
    }

    /// Where the program's processes find the ledger.
    pub fn path(&self) -> &std::path::Path {
        self.ledger.path()
    }

    /// Starts the arbiter for the tree under `root` (the program's pid),
    /// recording to `recording` if given; `tier` is where the tree writes
    /// back (for the remedies it gives).
    pub fn start(
        &mut self,
        root: u32,
        quiet: bool,
        recording: Option<Recording>,
        tier: Option<BackingTier>,
    ) -> anyhow::Result<()> {
        let ledger = Arc::clone(&self.ledger);
        let stop = Arc::clone(&self.stop);
        let t = std::thread::Builder::new()
            .name("uzswap-arbiter".into())
            .spawn(move || arbitrate(ledger, root, quiet, recording, tier, &stop))?;
        self.thread = Some(t);
        Ok(())
    }

    /// Stops the arbiter and returns what it saw (the recording, if any,
    /// written to its end).
    pub fn finish(mut self) -> TreeReport {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

/// Keeps a process's report (`allot`: what this tick allotted it, if it is
/// still a member).
fn note_report(rep: &mut TreeReport, v: &uzswap_ledger::SlotView, allot: Option<u64>) {
    let u = &v.usage;
    let p = rep.processes.entry(v.pid).or_default();
    p.pid = v.pid;
    p.comm.clone_from(&v.comm);
    p.resident_bytes = u.resident;
    p.pool_bytes = u.pool;
    p.runtime_bytes = u.runtime;
    p.backing_bytes = u.backing;
    p.own_bytes = u.own;
    p.peak_own_bytes = p.peak_own_bytes.max(u.own);
    p.peak_unmanaged_bytes = p.peak_unmanaged_bytes.max(u.runtime.saturating_sub(u.own));
    p.faults = u.faults;
    p.first_touches = u.first_touches;
    p.evictions = u.evictions;
    p.peak_bytes = p.peak_bytes.max(u.charged());
    if let Some(a) = allot {
        p.allot_bytes = a;
    }
    p.cpu_seconds = p.cpu_seconds.max(u.cpu_ms as f64 / 1000.0);
    p.runtime_cpu_seconds = p.runtime_cpu_seconds.max(u.runtime_cpu_ms as f64 / 1000.0);
}

/// The arbiter thread's loop: every [`TICK`] (or at a ring) the budget
/// shared, every [`SAMPLE`] the tree measured, until `stop`.
fn arbitrate(
    ledger: Arc<Ledger>,
    root: u32,
    quiet: bool,
    mut recording: Option<Recording>,
    tier: Option<BackingTier>,
    stop: &AtomicBool,
) -> TreeReport {
    let budget = ledger.budget();
    let me = std::process::id();
    let mut arb = Arbiter::new(Arc::clone(&ledger), 0, MIN_RESIDENT);
    let mut rep = TreeReport {
        budget_bytes: budget,
        ..TreeReport::default()
    };
    let started = Instant::now();
    let mut next_sample = started;
    let mut over = OverWatch::default();
    let mut last_flags: BTreeMap<u32, (String, u64)> = BTreeMap::new();
    let mut sampler = proc_sample::Sampler::new();
    loop {
        // Read before the decision: a start that rings after this read
        // wakes the wait below at once, and is decided for next.
        let rings = ledger.rings();
        let now = Instant::now();
        let tick = arb.tick(now);
        let reported = note_tick(&mut rep, &tick, &mut last_flags);
        if now >= next_sample {
            next_sample = now + SAMPLE;
            let members: Vec<u32> = tick.members.iter().map(|m| m.slot.pid).collect();
            let s = sampler.sample_members(root, &[me], &members);
            let own = proc_sample::pss_anon(me).unwrap_or(0);
            let total = s.pss_anon + own;
            // What the tree holds that no process reported: reserved out
            // of the budget before it is shared.
            let unmanaged = s.pss_anon.saturating_sub(reported);
            arb.set_reserve(own + unmanaged);
            rep.samples += 1;
            if let Some(r) = recording.as_mut() {
                if r.recorder.active() && (rep.samples - 1).is_multiple_of(r.every) {
                    let t = started.elapsed().as_secs_f64();
                    r.recorder
                        .record(sample_of(t, budget, total, &tick, &rep.processes));
                }
            }
            if rep.samples > u64::from(STARTUP_SAMPLES) && total > rep.peak_bytes {
                rep.peak_bytes = total;
                rep.peak_at_seconds = started.elapsed().as_secs_f64();
            }
            let said = over.judge(&mut rep, total, quiet, || {
                reasons(
                    budget,
                    total,
                    tick.floors_over,
                    unmanaged,
                    &last_flags,
                    tick.members.len(),
                    tier.as_ref(),
                )
            });
            if let Some(warning) = said {
                crate::note(&warning);
            }
        }
        if stop.load(Ordering::Relaxed) {
            return finish(rep, &ledger, recording);
        }
        ledger.wait_for_ring(rings, TICK);
    }
}

/// Notes one tick's reports in `rep` (the live processes', and the last of
/// those reaped, also of one that started and ended between two ticks) and
/// their flags in `last_flags`; returns what the live ones charge.
fn note_tick(
    rep: &mut TreeReport,
    tick: &uzswap_ledger::Tick,
    last_flags: &mut BTreeMap<u32, (String, u64)>,
) -> u64 {
    rep.max_processes = rep.max_processes.max(tick.members.len());
    let mut reported = 0u64;
    for m in &tick.members {
        let u = &m.slot.usage;
        reported += u.charged();
        note_report(rep, &m.slot, Some(m.allot));
        last_flags.insert(m.slot.pid, (m.slot.comm.clone(), u.flags));
    }
    for v in &tick.reaped {
        note_report(rep, v, None);
        last_flags.remove(&v.pid);
    }
    reported
}

/// Whether the tree is over its budget, and what of it was said.
#[derive(Default)]
struct OverWatch {
    /// Samples in a row over the budget.
    run: u32,
    /// This episode is in the report.
    noted: bool,
    /// This episode was judged worth saying (said or like one said).
    said: bool,
    excess: SaidExcess,
}

impl OverWatch {
    /// Counts a sample of `total` (past start-up) against the budget. At
    /// [`OVER_SAMPLES`] in a row over it, notes the episode and its reasons
    /// (`why`) in `rep`; once the overshoot matters (a twentieth of the
    /// budget, or [`LONG_OVER_SAMPLES`] in a row), returns the warning to
    /// say, once an episode and unless like one said before or `quiet`.
    fn judge(
        &mut self,
        rep: &mut TreeReport,
        total: u64,
        quiet: bool,
        why: impl FnOnce() -> Vec<String>,
    ) -> Option<String> {
        let budget = rep.budget_bytes;
        if total > budget && rep.samples > u64::from(STARTUP_SAMPLES) {
            self.run += 1;
        } else {
            self.run = 0;
            self.noted = false;
            self.said = false;
        }
        if self.run < OVER_SAMPLES || self.said {
            return None;
        }
        let excess = total - budget;
        let matters = excess >= budget / OVER_SHARE_SAID || self.run >= LONG_OVER_SAMPLES;
        if self.noted && !matters {
            return None;
        }
        let why = why();
        if !self.noted {
            self.noted = true;
            rep.over_budget = true;
            for r in &why {
                if !rep.over_budget_reasons.contains(r) {
                    rep.over_budget_reasons.push(r.clone());
                }
            }
        }
        if !matters {
            return None;
        }
        self.said = true;
        (!quiet && self.excess.worth_saying(excess, budget)).then(|| {
            format!(
                "uzswap: WARNING: the program holds {}, {} over its budget of {}, for {:.1} s: {}",
                crate::human(total),
                crate::human(excess),
                crate::human(budget),
                f64::from(self.run) * SAMPLE.as_secs_f64(),
                why.join("; ")
            )
        })
    }
}

/// The report at the end of the run: the CPU times and the starts that
/// waited added, the recording finished.
fn finish(mut rep: TreeReport, ledger: &Ledger, recording: Option<Recording>) -> TreeReport {
    rep.cpu_seconds = rep.processes.values().map(|p| p.cpu_seconds).sum();
    rep.runtime_cpu_seconds = rep.processes.values().map(|p| p.runtime_cpu_seconds).sum();
    rep.run_cpu_seconds = uzswap_os::cpu::process_cpu_seconds();
    let (waits, waited) = ledger.start_waits();
    rep.start_waits = waits;
    rep.start_wait_seconds = waited.as_secs_f64();
    if let Some(r) = recording {
        r.recorder.finish();
    }
    rep
}

/// The recording's sample of this instant: the live processes' reports
/// (`tick`), and the counters of every process seen (`seen`, ended ones
/// included).
fn sample_of(
    t: f64,
    budget: u64,
    measured: u64,
    tick: &uzswap_ledger::Tick,
    seen: &BTreeMap<u32, Process>,
) -> record::Sample {
    let processes: Vec<record::ProcessSample> = tick
        .members
        .iter()
        .map(|m| {
            let u = &m.slot.usage;
            record::ProcessSample {
                pid: m.slot.pid,
                comm: m.slot.comm.clone(),
                usage: record::Usage {
                    resident_bytes: u.resident,
                    pool_bytes: u.pool,
                    runtime_bytes: u.runtime,
                    backing_bytes: u.backing,
                    allot_bytes: m.allot,
                    faults: u.faults,
                    evictions: u.evictions,
                },
            }
        })
        .collect();
    let sum = |f: fn(&record::Usage) -> u64| processes.iter().map(|p| f(&p.usage)).sum::<u64>();
    let total = record::Usage {
        resident_bytes: sum(|u| u.resident_bytes),
        pool_bytes: sum(|u| u.pool_bytes),
        runtime_bytes: sum(|u| u.runtime_bytes),
        backing_bytes: sum(|u| u.backing_bytes),
        allot_bytes: sum(|u| u.allot_bytes),
        faults: seen.values().map(|p| p.faults).sum(),
        evictions: seen.values().map(|p| p.evictions).sum(),
    };
    record::Sample {
        t,
        budget_bytes: budget,
        measured_bytes: measured,
        total,
        processes,
    }
}

/// Why the tree is over its budget, each with its remedy.
fn reasons(
    budget: u64,
    total: u64,
    floors_over: Option<u64>,
    unmanaged: u64,
    flags: &BTreeMap<u32, (String, u64)>,
    processes: usize,
    tier: Option<&BackingTier>,
) -> Vec<String> {
    let h = crate::human;
    let mut why = Vec::new();
    if let Some(need) = floors_over {
        why.push(format!(
            "the runtimes of its {processes} processes alone need {}: raise --memory-max",
            h(need)
        ));
    }
    let refusing: Vec<String> = flags
        .iter()
        .filter(|(_, (_, f))| f & Usage::STORE_REFUSING != 0)
        .map(|(pid, (comm, _))| format!("{comm} ({pid})"))
        .collect();
    if !refusing.is_empty() {
        why.push(match tier {
            None => format!(
                "the pool of {} is full and nothing can be written back: \
                 drop --no-backing-file (or give --backing-file DIR) or raise --memory-max",
                refusing.join(", ")
            ),
            Some(t) => format!(
                "the pool of {} is full and {} takes no more: {}; or raise --memory-max",
                refusing.join(", "),
                t.noun(),
                t.failing_remedy()
            ),
        });
    }
    if flags.values().any(|(_, f)| f & Usage::BACKING_FAILING != 0) {
        if let Some(t) = tier {
            why.push(format!(
                "writing back to {} fails: {}",
                t.noun(),
                t.failing_remedy()
            ));
        }
    }
    if unmanaged > budget / 4 {
        why.push(format!(
            "{} is memory uzswap does not manage (children forked without exec, \
             thread stacks, brk heaps): see `uzswap stats`",
            h(unmanaged)
        ));
    }
    if why.is_empty() {
        why.push(format!(
            "eviction is not keeping up ({} over): the program allocates faster than \
             pages can be compressed",
            h(total.saturating_sub(budget))
        ));
    }
    why
}

#[cfg(test)]
mod tests {
    use super::{
        OverWatch, SaidExcess, TreeReport, LONG_OVER_SAMPLES, OVER_SAMPLES, STARTUP_SAMPLES,
    };

    /// A judge of `n` samples of `total` against `budget`, past start-up:
    /// the warnings it returned.
    fn judge_run(w: &mut OverWatch, rep: &mut TreeReport, total: u64, n: u32) -> Vec<String> {
        (0..n)
            .filter_map(|_| {
                rep.samples += 1;
                w.judge(rep, total, false, || vec!["a reason".into()])
            })
            .collect()
    }

    /// A small overshoot for a moment is in the report, not on stderr; one
    /// that lasts is said once, with its length and cause; a large one is
    /// said at once.
    #[test]
    fn an_overshoot_is_said_when_it_matters_and_once() {
        const MIB: u64 = 1 << 20;
        let budget = 631 * MIB;
        let mut rep = TreeReport {
            budget_bytes: budget,
            samples: u64::from(STARTUP_SAMPLES),
            ..TreeReport::default()
        };
        let mut w = OverWatch::default();
        // 184 KiB over (0.03 %) for a second: noted, not said.
        assert!(judge_run(&mut w, &mut rep, budget + (184 << 10), 10).is_empty());
        assert!(rep.over_budget);
        assert_eq!(rep.over_budget_reasons, ["a reason"]);
        // Back under, then five such episodes of a second: still not said.
        for _ in 0..5 {
            assert!(judge_run(&mut w, &mut rep, budget, 1).is_empty());
            assert!(judge_run(&mut w, &mut rep, budget + (184 << 10), 10).is_empty());
        }
        // The same overshoot held for 5 s: said once.
        assert!(judge_run(&mut w, &mut rep, budget, 1).is_empty());
        let said = judge_run(
            &mut w,
            &mut rep,
            budget + (184 << 10),
            LONG_OVER_SAMPLES + 20,
        );
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].contains("184.0 KiB over its budget"), "{}", said[0]);
        assert!(said[0].contains("for 5.0 s: a reason"), "{}", said[0]);
        // A large overshoot (6 %) is said as soon as it counts.
        assert!(judge_run(&mut w, &mut rep, budget, 1).is_empty());
        let said = judge_run(&mut w, &mut rep, budget + budget * 6 / 100, OVER_SAMPLES);
        assert_eq!(said.len(), 1, "{said:?}");
    }

    /// The first episode over the budget is always said; a later one only
    /// when it goes further than any said by 1/64 of the budget (1 MiB at
    /// least).
    #[test]
    fn repeated_small_overshoots_are_said_once() {
        const MIB: u64 = 1 << 20;
        let budget = 256 * MIB; // step: 4 MiB
        let mut said = SaidExcess::default();
        assert!(said.worth_saying(120 << 10, budget));
        assert!(!said.worth_saying(244 << 10, budget));
        assert!(!said.worth_saying(680 << 10, budget));
        assert!(!said.worth_saying(4 * MIB, budget));
        assert!(said.worth_saying(5 * MIB, budget));
        assert!(!said.worth_saying(MIB, budget));
        let mut small = SaidExcess::default();
        assert!(small.worth_saying(1, 16 * MIB));
        assert!(
            !small.worth_saying(MIB, 16 * MIB),
            "the step is 1 MiB at least"
        );
        assert!(small.worth_saying(MIB + 2, 16 * MIB));
    }
}
