//! The arbiter's policy: how one budget is shared among the processes of a
//! tree. A pure function of what the processes report, so that it can be
//! tested without processes.
//!
//! # The rule
//! Every process is owed its *floor*: what its runtime holds and cannot give
//! back (index, tables, heap of the runtime) plus a few pages to run in.
//! What remains of the budget, the *spare*, is shared by *want*: what a
//! process uses above its floor, plus, for a process that is faulting
//! (under pressure), room to grow.
//!
//! - If the wants fit, every process gets its want and the slack left over
//!   goes to the processes under pressure (to all, by want, when none is),
//!   less an eighth of the budget kept unallotted for processes that start
//!   before the next decision. While they all fit with room to grow, the
//!   idle ones are given that room too.
//! - If they do not fit, the deficit is taken from the idle processes
//!   first, in proportion to what they use (an idle process gives pages to
//!   a busy one, as a shared LRU would), and only then from the busy ones:
//!   what is left is shared among them up to one level, the smaller wants
//!   met in full (water filling), so that a small busy process is not held
//!   to its size beside a big one. Nobody goes below its floor.
//! - Growth is paced (`pace_growth`): the processes grow only into what is
//!   free now, so that the tree stays in its budget while memory moves.
//! - A process that is gone is simply no longer in the list: its share is
//!   spare at the next decision.
//! - If the floors alone exceed the budget, every process gets its floor
//!   and the decision says the tree is over budget, and why.

/// What the arbiter knows of one process when it decides.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Demand {
    /// Bytes it holds now: resident managed pages + its pool + its runtime.
    pub usage: u64,
    /// Bytes it cannot give back (runtime bookkeeping + minimum resident).
    pub floor: u64,
    /// Faults per second, smoothed: how hard it is pressing on its share.
    pub fault_rate: f64,
}

/// Faults per second above which a process counts as under pressure.
pub const PRESSURE_RATE: f64 = 50.0;
/// The least a process under pressure is offered to grow by, per decision.
pub const GROW_MIN: u64 = 4 << 20;
/// While the wants fit, this fraction of the budget (1/8) is left
/// unallotted: the room a process that starts takes from
/// (`Ledger::take_grant`) until the next decision. With all of it
/// allotted, a new process started at its floor and evicted its first
/// pages before the arbiter saw it.
pub const HEADROOM: u64 = 8;

/// The arbiter's decision.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// Bytes each process may hold, in the order of the demands.
    pub allot: Vec<u64>,
    /// Set when the floors alone need more than the budget: what they need.
    pub floors_over: Option<u64>,
}

/// Shares `budget` bytes among `demands` (see the module docs).
pub fn share(budget: u64, demands: &[Demand]) -> Decision {
    let floor_sum: u64 = demands.iter().map(|d| d.floor).sum();
    if floor_sum >= budget {
        return Decision {
            allot: demands.iter().map(|d| d.floor).collect(),
            floors_over: (floor_sum > budget).then_some(floor_sum),
        };
    }
    let spare = budget - floor_sum;
    let pressed: Vec<bool> = demands
        .iter()
        .map(|d| d.fault_rate >= PRESSURE_RATE)
        .collect();
    let used = |d: &Demand| d.usage.saturating_sub(d.floor);
    let room = |d: &Demand| used(d) + (used(d) / 4).max(GROW_MIN);
    // While all of them fit with room to grow, the idle get that room too:
    // a process that grows through runs of zero pages faults too seldom to
    // count as pressed, and held to what it used it evicted its own pages
    // to grow. With both rules, a `make -j8` of 47 units with room to
    // spare (`--memory-max 4G`) evicts 5-6 k pages instead of 58 k
    // (`uzswap-bench tree`, docs/BENCHMARKS.md).
    let all_room = demands.iter().map(room).sum::<u64>() <= spare;
    let want: Vec<u64> = demands
        .iter()
        .zip(&pressed)
        .map(|(d, &p)| if p || all_room { room(d) } else { used(d) })
        .collect();
    let want_sum: u64 = want.iter().sum();
    let mut extra = vec![0u64; demands.len()];
    if want_sum <= spare {
        // Everyone fits: the slack goes to the pressed, else to all by want,
        // less the room kept for processes that start (`HEADROOM`).
        let slack = (spare - want_sum).saturating_sub(budget / HEADROOM);
        let any_pressed = pressed.iter().any(|&p| p);
        let weights: Vec<u64> = want
            .iter()
            .zip(&pressed)
            .map(|(&w, &p)| if any_pressed && !p { 0 } else { w + 1 })
            .collect();
        spread(slack, &weights, &mut extra);
        for (e, w) in extra.iter_mut().zip(&want) {
            *e += w;
        }
    } else {
        let deficit = want_sum - spare;
        let idle_sum: u64 = want
            .iter()
            .zip(&pressed)
            .filter(|(_, &p)| !p)
            .map(|(w, _)| w)
            .sum();
        if deficit <= idle_sum {
            // The idle give up the deficit, each in proportion to its want.
            let weights: Vec<u64> = want
                .iter()
                .zip(&pressed)
                .map(|(&w, &p)| if p { 0 } else { w })
                .collect();
            let mut cut = vec![0u64; demands.len()];
            spread(deficit, &weights, &mut cut);
            for i in 0..demands.len() {
                extra[i] = want[i] - cut[i].min(want[i]);
            }
        } else {
            // The idle keep their floor; the pressed share what is left,
            // the smaller wants met first (see `water_fill`).
            let wants: Vec<u64> = want
                .iter()
                .zip(&pressed)
                .map(|(&w, &p)| if p { w } else { 0 })
                .collect();
            water_fill(spare, &wants, &mut extra);
        }
    }
    let mut allot: Vec<u64> = demands
        .iter()
        .zip(&extra)
        .map(|(d, &e)| d.floor + e)
        .collect();
    pace_growth(budget, demands, &mut allot);
    Decision {
        allot,
        floors_over: None,
    }
}

/// Lets the processes grow only into memory that is free now: what the
/// budget holds beyond what they all use. A decision that moves memory
/// from one process to another takes effect as the giver evicts: the
/// taker's allotment rises with what was freed, tick after tick, not at
/// once (at once, the taker would fill its new share while the giver still
/// held its old one, and the tree would be over the budget until the giver
/// caught up: up to 1.26 x B for the Python tree of `uzswap-bench tree`,
/// docs/BENCHMARKS.md). The growth
/// asked for is scaled down alike for every grower; nobody goes below its
/// floor.
fn pace_growth(budget: u64, demands: &[Demand], allot: &mut [u64]) {
    let used: u64 = demands.iter().map(|d| d.usage).sum();
    let free = budget.saturating_sub(used);
    let growth: u64 = demands
        .iter()
        .zip(allot.iter())
        .map(|(d, &a)| a.saturating_sub(d.usage))
        .sum();
    if growth <= free {
        return;
    }
    for (d, a) in demands.iter().zip(allot.iter_mut()) {
        let grow = a.saturating_sub(d.usage);
        if grow > 0 {
            // Fits in u64: free / growth < 1.
            let paced = (u128::from(grow) * u128::from(free) / u128::from(growth)) as u64;
            *a = (d.usage + paced).max(d.floor);
        }
    }
}

/// Shares `total`, which is less than the wants together, among them:
/// every want up to one level, the level set so that all of `total` is
/// given. A want below the level is met in full; the others get the level.
/// Shared in proportion to what each holds, a process pressed beside a
/// bigger one would stay as small as it is and refault what it needs for
/// as long as both run, while the bigger one's share, as large as its
/// heap, holds its cold pages too; the kernel's one LRU for a cgroup would
/// have taken those first.
fn water_fill(total: u64, wants: &[u64], out: &mut [u64]) {
    let mut order: Vec<usize> = (0..wants.len()).filter(|&i| wants[i] > 0).collect();
    order.sort_by_key(|&i| wants[i]);
    let mut left = total;
    for (k, &i) in order.iter().enumerate() {
        let rest = (order.len() - k) as u64;
        let level = left / rest;
        let give = if wants[i] <= level {
            wants[i]
        } else if k + 1 == order.len() {
            left
        } else {
            level
        };
        out[i] += give;
        left -= give;
    }
}

/// Adds `total` to `out` in proportion to `weights`, exactly (the rounding
/// remainder goes to the heaviest weight); nothing if every weight is 0.
fn spread(total: u64, weights: &[u64], out: &mut [u64]) {
    let sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    if sum == 0 || total == 0 {
        return;
    }
    let mut given = 0u64;
    for (o, &w) in out.iter_mut().zip(weights) {
        // Fits in u64: w / sum <= 1.
        let part = (u128::from(total) * u128::from(w) / sum) as u64;
        *o += part;
        given += part;
    }
    let heaviest = (0..weights.len()).max_by_key(|&i| weights[i]).unwrap_or(0);
    out[heaviest] += total - given;
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn d(usage_mib: u64, floor_mib: u64, rate: f64) -> Demand {
        Demand {
            usage: usage_mib * MIB,
            floor: floor_mib * MIB,
            fault_rate: rate,
        }
    }

    fn total(x: &Decision) -> u64 {
        x.allot.iter().sum()
    }

    #[test]
    fn the_whole_budget_is_shared_and_never_more() {
        for demands in [
            vec![d(10, 2, 0.0)],
            vec![d(300, 2, 1000.0), d(10, 2, 0.0), d(0, 2, 0.0)],
            vec![d(100, 4, 0.0), d(100, 4, 0.0)],
            vec![d(500, 3, 900.0), d(500, 3, 900.0), d(500, 3, 0.0)],
        ] {
            let x = share(256 * MIB, &demands);
            // All of it, but for the room kept for starters while the
            // wants fit.
            assert!(total(&x) <= 256 * MIB, "{demands:?} -> {x:?}");
            assert!(
                total(&x) >= 256 * MIB - 256 * MIB / HEADROOM,
                "{demands:?} -> {x:?}"
            );
            for (a, dm) in x.allot.iter().zip(&demands) {
                assert!(*a >= dm.floor, "below floor: {x:?}");
            }
        }
    }

    #[test]
    fn an_idle_process_gives_pages_to_a_busy_one() {
        // Both hold 128 MiB of 256; one faults hard, the other is idle.
        let x = share(256 * MIB, &[d(128, 2, 5000.0), d(128, 2, 0.0)]);
        assert!(x.allot[1] < 128 * MIB, "{x:?}");
        // The busy one grows as the idle one gives back.
        let freed = 128 - x.allot[1] / MIB;
        let y = share(256 * MIB, &[d(128, 2, 5000.0), d(128 - freed, 2, 0.0)]);
        assert!(y.allot[0] > 128 * MIB + (freed - 1) * MIB, "{x:?} {y:?}");
        assert!(total(&y) <= 256 * MIB);
    }

    #[test]
    fn growth_waits_for_memory_to_be_freed() {
        // The tree is at its budget: the small busy process is owed more
        // (water filling), but only what the big one frees is given.
        let x = share(128 * MIB, &[d(40, 2, 5000.0), d(88, 2, 5000.0)]);
        assert_eq!(x.allot[0], 40 * MIB, "{x:?}");
        assert!(x.allot[1] < 88 * MIB, "{x:?}");
        // The big one evicted down to its allotment: now the small grows.
        let big = x.allot[1] / MIB;
        let y = share(128 * MIB, &[d(40, 2, 5000.0), d(big, 2, 5000.0)]);
        assert!(y.allot[0] >= 2 * MIB + 47 * MIB, "{y:?}");
        assert!(total(&y) <= 128 * MIB);
    }

    #[test]
    fn no_process_is_starved_below_its_floor() {
        let x = share(64 * MIB, &[d(500, 8, 9000.0), d(500, 8, 0.0), d(1, 8, 0.0)]);
        assert!(x.allot.iter().all(|&a| a >= 8 * MIB), "{x:?}");
        assert_eq!(x.allot[1], 8 * MIB);
        assert_eq!(x.floors_over, None);
    }

    #[test]
    fn a_process_that_is_gone_returns_its_share() {
        let three = share(
            256 * MIB,
            &[d(120, 2, 800.0), d(120, 2, 800.0), d(120, 2, 800.0)],
        );
        let two = share(256 * MIB, &[d(120, 2, 800.0), d(120, 2, 800.0)]);
        assert!(
            two.allot[0] > three.allot[0] + 30 * MIB,
            "{three:?} {two:?}"
        );
        assert_eq!(total(&two), 256 * MIB);
    }

    #[test]
    fn floors_over_the_budget_are_said() {
        let x = share(16 * MIB, &[d(50, 10, 0.0), d(50, 10, 0.0)]);
        assert_eq!(x.floors_over, Some(20 * MIB));
        assert_eq!(x.allot, vec![10 * MIB, 10 * MIB]);
    }

    #[test]
    fn slack_goes_to_the_pressed() {
        let x = share(256 * MIB, &[d(20, 2, 200.0), d(20, 2, 0.0)]);
        // The idle one: what it uses (18 MiB over its floor) and room to
        // grow (a quarter, at least 4 MiB).
        assert_eq!(x.allot[1], 2 * MIB + 18 * MIB + 9 * MIB / 2);
        // The pressed one the rest, less the room kept for starters.
        assert_eq!(x.allot[0], 256 * MIB - 32 * MIB - x.allot[1]);
    }

    #[test]
    fn with_room_to_spare_every_process_may_grow() {
        // A process that grows through runs of zero pages faults seldom:
        // not pressed, it is still given room to grow while all fit.
        let x = share(256 * MIB, &[d(100, 2, 5000.0), d(40, 2, 0.0)]);
        assert!(x.allot[1] >= 44 * MIB, "{x:?}");
        assert!(x.allot[0] > 100 * MIB, "{x:?}");
        assert!(total(&x) <= 256 * MIB - 256 * MIB / HEADROOM, "{x:?}");
        // Once they no longer fit with that room, the idle one grows no
        // more (the busy one's want comes first).
        let y = share(256 * MIB, &[d(200, 2, 5000.0), d(50, 2, 0.0)]);
        assert!(y.allot[1] <= 50 * MIB, "{y:?}");
    }

    #[test]
    fn a_small_pressed_process_gets_its_want_before_a_big_one_grows() {
        // Both fault; the small one holds 40 MiB, the big one 100 MiB, of
        // 160 (20 free).
        let x = share(160 * MIB, &[d(40, 2, 5000.0), d(100, 2, 5000.0)]);
        // Its want: 38 used + 9.5 to grow, over its floor of 2.
        assert!(x.allot[0] >= 2 * MIB + 47 * MIB, "{x:?}");
        assert_eq!(total(&x), 160 * MIB);
        // Shared by what they hold, it would have had about 45 MiB.
    }

    #[test]
    fn water_fill_is_exact_and_levels() {
        let mut out = vec![0; 3];
        water_fill(100, &[10, 80, 80], &mut out);
        assert_eq!(out, vec![10, 45, 45]);
        let mut out = vec![0; 3];
        water_fill(101, &[0, 80, 80], &mut out);
        assert_eq!(out, vec![0, 50, 51]);
    }

    #[test]
    fn spread_is_exact() {
        let mut out = vec![0; 3];
        spread(10, &[1, 1, 1], &mut out);
        assert_eq!(out.iter().sum::<u64>(), 10);
        let mut out = vec![0; 2];
        spread(10, &[0, 0], &mut out);
        assert_eq!(out, vec![0, 0]);
    }
}
