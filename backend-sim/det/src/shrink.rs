//! The shrinker: from the schedule of a failing run (every fault the network applied,
//! [`Det::schedule`]), a much smaller schedule under which the test still fails, so that
//! a failure found among hundreds of lost, late and duplicated frames is told by the few
//! that matter (often one lost frame).
//!
//! Each candidate is run from the schedule alone ([`DetBuilder::schedule`]): the faults
//! it keeps, every other frame delivered clean, the seed still choosing QPNs and keys.
//! Faults are keyed by frame (link, opcode, PSN, attempt), not by their place in the run,
//! so a fault removed leaves the others where they were. The steps, within a bound of
//! runs ([`MAX_RUNS`] by default):
//!
//! 1. **cut after the failure**: the recorded schedule ends where the test failed; of
//!    it, the shortest beginning that still fails (bisected);
//! 2. **drop faults**: halves, then quarters and so on down to one fault at a time
//!    (delta debugging's complements), keeping every removal after which it still fails;
//!    then each fault on a resent frame is moved to the frame's first sending (which
//!    needs none of the faults that caused the resends) and step 2 runs again;
//! 3. **shorten delays**: each remaining delay and duplicate gap halved while it still
//!    fails.
//!
//! "Still fails" means the test returns an error or panics, whichever: a smaller schedule may show
//! the bug by another of its symptoms, and the reduced run's own message is reported.

use std::fmt;
use std::time::Duration;

use backend_sim_proto::fabric::{Fault, Schedule, What};

use crate::det::{Det, DetBuilder};
use crate::run::run_test;

/// Runs a shrink makes at most, unless told otherwise.
pub const MAX_RUNS: u32 = 400;

/// A failing run's schedule, reduced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shrunk {
    /// The reduced schedule: the test fails under it.
    pub schedule: Schedule,
    /// Faults in the schedule the shrink started from.
    pub from: usize,
    /// What the test said under the reduced schedule.
    pub what: String,
    /// The trace of the run under the reduced schedule.
    pub trace: u64,
    /// Runs the shrink made.
    pub runs: u32,
}

impl fmt::Display for Shrunk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.schedule.len();
        writeln!(
            f,
            "shrunk to {n} fault{} of {} in {} runs: {} (trace {:#018x})",
            if n == 1 { "" } else { "s" },
            self.from,
            self.runs,
            self.what,
            self.trace
        )?;
        for fault in &self.schedule.faults {
            writeln!(f, "  {fault}")?;
        }
        Ok(())
    }
}

/// Runs the test under candidate schedules, counting runs, keeping the smallest that
/// fails.
struct Runner<'a, T> {
    builder: &'a DetBuilder,
    seed: u64,
    test: T,
    runs: u32,
    max_runs: u32,
    /// The schedule that fails, as reduced so far; what the test said under it and the
    /// run's trace.
    best: Vec<Fault>,
    what: String,
    trace: u64,
}

impl<T, E> Runner<'_, T>
where
    T: FnMut(&Det) -> Result<(), E>,
    E: fmt::Display,
{
    /// What the test says under `faults` alone, the run's trace and the faults it
    /// applied (those of `faults` whose frames were sent, at the times they were), if it
    /// fails; `None` if it passes or the budget is spent.
    fn fails(&mut self, faults: &[Fault]) -> Option<(String, u64, Vec<Fault>)> {
        if self.spent() {
            return None;
        }
        self.runs += 1;
        let det = self
            .builder
            .clone()
            .seed(self.seed)
            .schedule(Schedule::from(faults.to_vec()))
            .build();
        let r = run_test(&mut self.test, &det);
        r.err().map(|e| (e, det.trace(), det.schedule().faults))
    }

    fn spent(&self) -> bool {
        self.runs >= self.max_runs
    }

    /// Whether the test fails under `cand`, whose faults applied then become the best.
    fn keep(&mut self, cand: Vec<Fault>) -> bool {
        match self.fails(&cand) {
            Some((what, trace, applied)) => {
                (self.best, self.what, self.trace) = (applied, what, trace);
                true
            }
            None => false,
        }
    }

    /// The shortest beginning of the schedule that still fails (bisected).
    fn cut(&mut self) {
        let (mut lo, mut hi) = (0, self.best.len());
        while lo < hi && !self.spent() {
            let mid = (lo + hi) / 2;
            if self.keep(self.best[..mid].to_vec()) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
    }

    /// Removes chunks of faults, halves first, then ever smaller chunks down to one
    /// fault at a time, while the test still fails (delta debugging's complements).
    fn drop_faults(&mut self) {
        let mut chunks = 2usize;
        while !self.best.is_empty() && !self.spent() {
            let len = self.best.len();
            let size = len.div_ceil(chunks.min(len));
            let removed = (0..len).step_by(size).any(|start| {
                let cand = [&self.best[..start], &self.best[(start + size).min(len)..]].concat();
                self.keep(cand)
            });
            if removed {
                chunks = (chunks - 1).max(2);
            } else if size == 1 {
                return;
            } else {
                chunks = chunks.saturating_mul(2);
            }
        }
    }

    /// Moves each fault on a resent frame to its first sending, where it still fails:
    /// a fault keyed to the third sending needs the faults that caused the first two
    /// resends, which the first sending does not. Whether any moved.
    fn first_sendings(&mut self) -> bool {
        let mut moved = false;
        for i in 0..self.best.len() {
            if self.best[i].key.attempt == 0 || self.spent() {
                continue;
            }
            let mut cand = self.best.clone();
            cand[i].key.attempt = 0;
            moved |= self.keep(cand);
        }
        moved
    }

    /// Halves each delay and duplicate gap while the test still fails.
    fn shorten(&mut self) {
        for i in 0..self.best.len() {
            while let What::Delay(d) | What::Duplicate(d) = self.best[i].what {
                if d < Duration::from_micros(1) || self.spent() {
                    break;
                }
                let mut cand = self.best.clone();
                cand[i].what = match cand[i].what {
                    What::Delay(_) => What::Delay(d / 2),
                    _ => What::Duplicate(d / 2),
                };
                if !self.keep(cand) {
                    break;
                }
            }
        }
    }
}

/// Reduces `schedule` (the faults of `test`'s failing run at `seed` in worlds made by
/// `builder`) while `test` still fails, within `max_runs` runs. `None` if `test` does
/// not fail when the whole schedule is replayed (it reads something the seed does not
/// decide: a wall clock, another thread).
pub fn shrink<E: fmt::Display>(
    builder: &DetBuilder,
    seed: u64,
    schedule: &Schedule,
    max_runs: u32,
    test: impl FnMut(&Det) -> Result<(), E>,
) -> Option<Shrunk> {
    let mut r = Runner {
        builder,
        seed,
        test,
        runs: 0,
        max_runs,
        best: Vec::new(),
        what: String::new(),
        trace: 0,
    };
    if !r.keep(schedule.faults.clone()) {
        return None;
    }
    r.cut();
    r.drop_faults();
    if r.first_sendings() {
        r.drop_faults();
    }
    r.shorten();
    Some(Shrunk {
        schedule: Schedule::from(r.best),
        from: schedule.len(),
        what: r.what,
        trace: r.trace,
        runs: r.runs,
    })
}
