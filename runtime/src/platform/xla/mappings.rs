//! The process's memory mappings, a resource XLA CPU's programs use up.
//!
//! Each program the XLA CPU plugin compiles or loads maps its JIT code and
//! data: about three regions for a one-op program, sixty or more for a
//! fused graph with many kernels. Linux allows a process
//! `vm.max_map_count` mappings (65,530 by default). A long run that kept
//! ~20,000 programs loaded reached it; XLA, failing to map its next
//! program, left unwind tables registered over unmapped memory, and the
//! next C++ exception anywhere in the process walked into them (SIGSEGV).
//! The compile cache's entry count cannot see this, so the platform counts
//! the mappings itself and reports pressure past a budget (half the
//! limit, leaving the rest to everything else in the process).
//!
//! Counting reads `/proc/self/maps` (a few milliseconds at tens of
//! thousands of lines), so it is done only as often as the headroom
//! requires: after a count of `n` mappings against a budget `b`, not again
//! until `(b - n) / MOST_PER_PROGRAM` more programs have loaded.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

/// More mappings than one program has been seen to take.
const MOST_PER_PROGRAM: usize = 128;

/// Where the limit lives (Linux).
const LIMIT_FILE: &str = "/proc/sys/vm/max_map_count";

pub(super) struct MapWatch {
    /// Mappings the process may hold before programs are let go; 0 when
    /// they cannot be counted here (no `/proc`): never pressed.
    budget: AtomicUsize,
    /// Programs to load before the next count.
    until_count: AtomicI64,
}

/// The system's limit on a process's mappings, if it says.
fn system_limit() -> Option<usize> {
    std::fs::read_to_string(LIMIT_FILE)
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// The process's mappings now, if the system says.
pub(super) fn count() -> Option<usize> {
    let maps = std::fs::read("/proc/self/maps").ok()?;
    Some(maps.iter().filter(|&&b| b == b'\n').count())
}

impl MapWatch {
    /// Half of this system's limit, or never pressed where there is none
    /// to read (nor where the mappings cannot be counted: the first count
    /// turns the watch off).
    pub fn from_system() -> Self {
        MapWatch::with_budget(system_limit().unwrap_or(0) / 2)
    }

    pub fn with_budget(budget: usize) -> Self {
        MapWatch {
            budget: AtomicUsize::new(budget),
            until_count: AtomicI64::new(0),
        }
    }

    /// Changes the budget (tests); counts again at the next program.
    pub fn set_budget(&self, budget: usize) {
        self.budget.store(budget, Ordering::Relaxed);
        self.until_count.store(0, Ordering::Relaxed);
    }

    /// Called once per program loaded: whether the process now holds more
    /// mappings than the budget.
    pub fn pressed(&self) -> bool {
        let budget = self.budget.load(Ordering::Relaxed);
        if budget == 0 || self.until_count.fetch_sub(1, Ordering::Relaxed) > 1 {
            return false;
        }
        let Some(n) = count() else {
            self.budget.store(0, Ordering::Relaxed);
            return false;
        };
        let wait = (budget.saturating_sub(n) / MOST_PER_PROGRAM).max(1);
        self.until_count
            .store(i64::try_from(wait).unwrap_or(i64::MAX), Ordering::Relaxed);
        n > budget
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_as_often_as_the_headroom_requires() {
        let Some(now) = count() else {
            return; // no /proc here
        };
        assert!(now > 0);
        // Far below the budget: pressed never, counted once in a while.
        let w = MapWatch::with_budget(now + 100 * MOST_PER_PROGRAM);
        assert!(!w.pressed());
        let wait = w.until_count.load(Ordering::Relaxed);
        assert!((90..=100).contains(&wait), "{wait}");
        for _ in 0..wait - 1 {
            assert!(!w.pressed());
        }
        // Over it: pressed at every program until it is not.
        w.set_budget(now / 2);
        assert!(w.pressed());
        assert!(w.pressed());
        assert_eq!(w.until_count.load(Ordering::Relaxed), 1);
        // No budget: never.
        assert!(!MapWatch::with_budget(0).pressed());
    }

    #[test]
    fn the_budget_is_half_the_system_limit() {
        let w = MapWatch::from_system();
        match system_limit() {
            Some(l) => assert_eq!(w.budget.load(Ordering::Relaxed), l / 2),
            None => assert_eq!(w.budget.load(Ordering::Relaxed), 0),
        }
    }
}
