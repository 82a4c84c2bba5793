//! `check_invariants`: re-derives from the page states what the pager's
//! counters, lists and flags claim, for tests.

use super::Shared;

impl Shared {
    /// Re-derives the counters from the page states.
    pub(super) fn check_invariants(&self) -> Result<(), String> {
        let s = self.state.lock();
        let mut resident = 0;
        let mut active = 0;
        for a in s.areas.values() {
            for m in &a.meta {
                if m.st.resident() {
                    resident += 1;
                    if m.active {
                        active += 1;
                    }
                }
            }
        }
        if resident != s.resident {
            return Err(format!("resident {} != counted {}", s.resident, resident));
        }
        if active != s.n_active {
            return Err(format!("n_active {} != counted {}", s.n_active, active));
        }
        Ok(())
    }
}
