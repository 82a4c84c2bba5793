//! The arbiter: the `uzswap run` side of the ledger. Each [`Arbiter::tick`]
//! reaps the slots of dead processes, measures how hard each live one is
//! faulting, shares the budget ([`crate::policy::share`]) and writes the
//! allotments.

use crate::policy::{self, Demand};
use crate::sys::{self, proc_identity};
use crate::table::{Ledger, SlotView, Usage};
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the fault rate remembers (the time constant of its average).
const RATE_MEMORY: Duration = Duration::from_millis(250);

/// One process as the last tick saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    /// Its slot and report.
    pub slot: SlotView,
    /// What it was allotted by this tick.
    pub allot: u64,
    /// Its smoothed fault rate (faults per second).
    pub fault_rate: f64,
}

/// What one tick saw and decided.
#[derive(Clone, Debug, Default)]
pub struct Tick {
    /// The live processes.
    pub members: Vec<Seen>,
    /// The slots reaped, with their last reports: the process had left
    /// (its exit code ran) or died.
    pub reaped: Vec<SlotView>,
    /// What the tree holds by its own reports, plus the reserve.
    pub charged: u64,
    /// Set when the floors alone need more than the budget.
    pub floors_over: Option<u64>,
    /// What the members held above their new allotments (that they can
    /// give back).
    pub excess: u64,
}

/// Shares a ledger's budget among its members.
#[derive(Debug)]
pub struct Arbiter {
    ledger: Arc<Ledger>,
    /// Bytes of the budget kept for what is not in any slot (the arbiter
    /// process itself).
    reserve: u64,
    /// Pages a process is always allowed beyond its runtime.
    min_resident: u64,
    /// (slot, pid) → (faults at the last tick, when, smoothed rate).
    rates: HashMap<(usize, u32), (u64, Instant, f64)>,
    /// (slot, pid, start time) → a pidfd of that process, checked to be it
    /// (its start time read after the pidfd was opened). A member with one
    /// is known alive by one `poll` for all: reading every member's
    /// `/proc/PID/stat` at every tick (100 a second) would be a large part
    /// of the arbiter's CPU in a `make -j8` (`uzswap-bench tree`,
    /// docs/BENCHMARKS.md). A member without
    /// one (no descriptor left) is checked by its `stat`.
    watched: HashMap<(usize, u32, u64), OwnedFd>,
}

impl Arbiter {
    /// An arbiter for `ledger`, keeping `reserve` bytes of the budget for
    /// memory outside the slots and at least `min_resident` bytes for each
    /// process beyond its runtime.
    pub fn new(ledger: Arc<Ledger>, reserve: u64, min_resident: u64) -> Arbiter {
        Arbiter {
            ledger,
            reserve,
            min_resident,
            rates: HashMap::new(),
            watched: HashMap::new(),
        }
    }

    /// The ledger it arbitrates.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// Changes the reserve (what the arbiter process itself holds).
    pub fn set_reserve(&mut self, bytes: u64) {
        self.reserve = bytes;
    }

    /// Reaps, measures, decides and publishes once.
    pub fn tick(&mut self, now: Instant) -> Tick {
        let mut tick = Tick::default();
        let live = self.reap(&mut tick);
        let demands = self.demands(&live, now);
        let budget = self.ledger.budget().saturating_sub(self.reserve);
        let d = policy::share(budget, &demands);
        self.publish(&live, &d, budget, &mut tick);
        tick.floors_over = d.floors_over;
        tick.charged = self.reserve + live.iter().map(|v| v.usage.charged()).sum::<u64>();
        tick.members = live
            .into_iter()
            .zip(d.allot)
            .zip(demands)
            .map(|((slot, allot), dm)| Seen {
                slot,
                allot,
                fault_rate: dm.fault_rate,
            })
            .collect();
        tick
    }

    /// The members alive and not left; the others' slots reaped (into
    /// `tick.reaped`).
    fn reap(&mut self, tick: &mut Tick) -> Vec<SlotView> {
        let mut live = Vec::new();
        let entries = self.ledger.read();
        let key = |v: &SlotView| (v.index, v.pid, v.start);
        // Pidfds for the members new since the last tick; forget those
        // gone from the ledger.
        let current: std::collections::HashSet<_> = entries.iter().map(key).collect();
        self.watched.retain(|k, _| current.contains(k));
        for v in &entries {
            if let std::collections::hash_map::Entry::Vacant(slot) = self.watched.entry(key(v)) {
                if let Some(fd) = sys::pidfd_open(v.pid) {
                    // Opened before the start time is read: if it matches,
                    // the pidfd is of this very process, not of a later
                    // one with the same pid.
                    if proc_identity(v.pid) == Some((true, v.start)) {
                        slot.insert(fd);
                    }
                }
            }
        }
        let fds: Vec<&OwnedFd> = entries
            .iter()
            .filter_map(|v| self.watched.get(&key(v)))
            .collect();
        let mut ended = sys::ended(&fds).into_iter();
        for v in entries {
            let alive = if self.watched.contains_key(&key(&v)) {
                !ended.next().unwrap_or(false)
            } else {
                matches!(proc_identity(v.pid), Some((true, start)) if start == v.start)
            };
            if alive && !v.left {
                live.push(v);
            } else {
                // Left, dead, a zombie, or the pid now names another
                // process.
                self.watched.remove(&key(&v));
                if self.ledger.reap(v.index, v.pid) {
                    tick.reaped.push(v);
                }
            }
        }
        live
    }

    /// What each live member wants, its fault rate smoothed over the
    /// ticks (the rates of members gone are forgotten).
    fn demands(&mut self, live: &[SlotView], now: Instant) -> Vec<Demand> {
        let mut rates = HashMap::with_capacity(live.len());
        let demands: Vec<Demand> = live
            .iter()
            .map(|v| {
                let key = (v.index, v.pid);
                let rate = match self.rates.get(&key) {
                    Some(&(faults, at, rate)) => {
                        let dt = now.saturating_duration_since(at).as_secs_f64();
                        if dt > 0.0 {
                            let inst = v.usage.faults.saturating_sub(faults) as f64 / dt;
                            let a = dt / (dt + RATE_MEMORY.as_secs_f64());
                            rate + a * (inst - rate)
                        } else {
                            rate
                        }
                    }
                    None => 0.0,
                };
                rates.insert(key, (v.usage.faults, now, rate));
                Demand {
                    usage: v.usage.charged(),
                    floor: v.usage.runtime + self.min_resident,
                    fault_rate: rate,
                }
            })
            .collect();
        self.rates = rates;
        demands
    }

    /// Writes the decision to the ledger: each member's allotment, the
    /// excess starts wait for, what is left unallotted of `budget`.
    fn publish(&self, live: &[SlotView], d: &policy::Decision, budget: u64, tick: &mut Tick) {
        // What the members hold above their new allotments, of what they
        // can give back (a store that refuses, a backing file that fails,
        // keeps it): starts wait for it (`Member::wait_for_room`).
        let can_shed = Usage::STORE_REFUSING | Usage::BACKING_FAILING;
        let excess: u64 = live
            .iter()
            .zip(&d.allot)
            .filter(|(v, _)| v.usage.flags & can_shed == 0)
            .map(|(v, &a)| v.usage.charged().saturating_sub(a))
            .sum();
        self.ledger.set_excess(excess);
        tick.excess = excess;
        for (v, &a) in live.iter().zip(&d.allot) {
            self.ledger.set_allot(v.index, v.pid, a);
        }
        let allotted: u64 = d.allot.iter().sum();
        self.ledger.set_unallotted(budget.saturating_sub(allotted));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_dead_member_is_reaped_and_its_share_returns() {
        let l = Arc::new(Ledger::create(8, 256 * MIB).unwrap());
        let mut arb = Arbiter::new(Arc::clone(&l), 0, MIB);
        let me = crate::sys::getpid();
        let start = crate::self_start_time();
        let a = l.claim(me, start, "alive").unwrap();
        a.publish(&Usage {
            resident: 100 * MIB,
            runtime: 2 * MIB,
            ..Usage::default()
        });
        // A child that exits at once: its slot outlives it.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let cpid = child.id();
        let cstart = proc_identity(cpid).map_or(0, |(_, s)| s);
        child.wait().unwrap();
        let b = l.claim(cpid, cstart, "gone").unwrap();
        b.publish(&Usage {
            resident: 100 * MIB,
            runtime: 2 * MIB,
            ..Usage::default()
        });
        std::mem::forget(b); // it died: no exit code gave its slot back
        let t = arb.tick(Instant::now());
        let reaped: Vec<u32> = t.reaped.iter().map(|v| v.pid).collect();
        assert_eq!(reaped, vec![cpid]);
        assert_eq!(t.reaped[0].usage.resident, 100 * MIB, "its last report");
        assert_eq!(t.members.len(), 1);
        // The whole budget but the room kept for processes that start.
        let room = 256 * MIB / policy::HEADROOM;
        assert_eq!(t.members[0].allot, 256 * MIB - room);
        assert_eq!(a.limit(), 256 * MIB - room);
        assert_eq!(l.unallotted(), room);
    }

    /// A live process that has left (its exit code ran) is reaped at the
    /// next tick with its last report, as a dead one: a process that
    /// starts and leaves between two ticks is counted all the same.
    #[test]
    fn a_member_that_left_is_reaped_with_its_last_report() {
        let l = Arc::new(Ledger::create(8, 256 * MIB).unwrap());
        let mut arb = Arbiter::new(Arc::clone(&l), 0, MIB);
        let me = crate::sys::getpid();
        let m = l.claim(me, crate::self_start_time(), "brief").unwrap();
        m.publish(&Usage {
            resident: 3 * MIB,
            faults: 77,
            evictions: 5,
            ..Usage::default()
        });
        m.leave();
        let t = arb.tick(Instant::now());
        assert!(t.members.is_empty(), "{:?}", t.members);
        assert_eq!(t.reaped.len(), 1);
        assert_eq!(t.reaped[0].pid, me);
        assert_eq!(
            (t.reaped[0].usage.faults, t.reaped[0].usage.evictions),
            (77, 5)
        );
        assert!(l.read().is_empty(), "the slot is free again");
        // Another process takes the slot; a late report of the one that
        // left (its evictor runs until it is gone) is not written there.
        // (Another pid: the one that left is alive while it exits.)
        let next = l.claim(me + 1, 1, "next").unwrap();
        assert_eq!(next.index(), t.reaped[0].index);
        m.publish(&Usage {
            faults: 1 << 40,
            ..Usage::default()
        });
        assert_eq!(l.read()[0].usage, Usage::default(), "written over");
        // Its drop leaves again: the new holder is not marked left.
        drop(m);
        assert!(!l.read()[0].left);
        drop(next);
    }

    /// The excess is what members hold above their new allotments, less
    /// what a member whose store refuses cannot give back.
    #[test]
    fn the_excess_counts_what_members_can_give_back() {
        let l = Arc::new(Ledger::create(8, 64 * MIB).unwrap());
        let mut arb = Arbiter::new(Arc::clone(&l), 0, MIB);
        let me = crate::sys::getpid();
        let start = crate::self_start_time();
        let a = l.claim(me, start, "me").unwrap();
        a.publish(&Usage {
            resident: 40 * MIB,
            runtime: MIB,
            ..Usage::default()
        });
        arb.tick(Instant::now());
        assert_eq!(l.excess(), 0, "alone, it is allotted what it holds");
        // A second member (a live process) that holds as much: together
        // over the budget.
        let mut kid = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let b = l
            .claim(kid.id(), proc_identity(kid.id()).unwrap().1, "twin")
            .unwrap();
        let twin = Usage {
            resident: 40 * MIB,
            runtime: MIB,
            ..Usage::default()
        };
        b.publish(&twin);
        let t = arb.tick(Instant::now());
        let over: u64 = t
            .members
            .iter()
            .map(|m| m.slot.usage.charged().saturating_sub(m.allot))
            .sum();
        assert!(over >= 18 * MIB, "over {over}");
        assert_eq!(t.excess, over);
        assert_eq!(l.excess(), over);
        // A store that refuses keeps what it holds: not counted.
        b.publish(&Usage {
            flags: Usage::STORE_REFUSING,
            ..twin
        });
        let t = arb.tick(Instant::now());
        let _ = kid.kill();
        let _ = kid.wait();
        let a_over = t.members[0]
            .slot
            .usage
            .charged()
            .saturating_sub(t.members[0].allot);
        assert_eq!(t.excess, a_over);
        assert!(t.excess < over);
    }

    #[test]
    fn a_faulting_member_gets_memory_from_an_idle_one() {
        let l = Arc::new(Ledger::create(8, 256 * MIB).unwrap());
        let mut arb = Arbiter::new(Arc::clone(&l), 0, MIB);
        // Two live processes to stand for the members.
        let mut kids: Vec<_> = (0..2)
            .map(|_| {
                std::process::Command::new("sleep")
                    .arg("30")
                    .spawn()
                    .unwrap()
            })
            .collect();
        let id = |c: &std::process::Child| (c.id(), proc_identity(c.id()).unwrap().1);
        let ((b, bs), (i, is)) = (id(&kids[0]), id(&kids[1]));
        let busy = l.claim(b, bs, "busy").unwrap();
        let idle = l.claim(i, is, "idle").unwrap();
        let u = |resident, faults| Usage {
            resident,
            runtime: MIB,
            faults,
            ..Usage::default()
        };
        let t0 = Instant::now();
        busy.publish(&u(150 * MIB, 0));
        idle.publish(&u(150 * MIB, 0));
        arb.tick(t0);
        for k in 1..=20u64 {
            busy.publish(&u(150 * MIB, k * 1000));
            // The idle one evicts down to what it is allotted.
            let held = idle.allotment().unwrap().min(151 * MIB);
            idle.publish(&u(held - MIB, 0));
            arb.tick(t0 + Duration::from_millis(10 * k));
        }
        let (b, i) = (busy.allotment().unwrap(), idle.allotment().unwrap());
        for k in &mut kids {
            let _ = k.kill();
            let _ = k.wait();
        }
        assert!(b > 151 * MIB && i < 106 * MIB, "busy {b} idle {i}");
        assert!(b + i <= 256 * MIB, "busy {b} idle {i}");
    }
}
