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
//! 3. **shorten delays**: each remaining delay and duplicate gap halved while it still
//!    fails.
//!
//! "Still fails" means the test returns an error, whichever: a smaller schedule may show
//! the bug by another of its symptoms, and the reduced run's own message is reported.

use std::fmt;
use std::time::Duration;

use crate::{Det, DetBuilder, Fault, Schedule, What};

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

/// Runs the test under candidate schedules, counting runs.
struct Runner<'a, T> {
    builder: &'a DetBuilder,
    seed: u64,
    test: T,
    runs: u32,
    max_runs: u32,
}

impl<T, E> Runner<'_, T>
where
    T: FnMut(&Det) -> Result<(), E>,
    E: fmt::Display,
{
    /// What the test says under `faults` alone and its trace, if it fails; `None` if it
    /// passes or the budget is spent.
    fn fails(&mut self, faults: &[Fault]) -> Option<(String, u64)> {
        if self.runs >= self.max_runs {
            return None;
        }
        self.runs += 1;
        let det = self
            .builder
            .clone()
            .seed(self.seed)
            .schedule(Schedule::from(faults.to_vec()))
            .build();
        let r = (self.test)(&det);
        r.err().map(|e| (e.to_string(), det.trace()))
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
    };
    let mut best = schedule.faults.clone();
    let (mut what, mut trace) = r.fails(&best)?;
    let mut keep = |r: &mut Runner<_>, cand: Vec<Fault>, best: &mut Vec<Fault>| match r.fails(&cand) {
        Some(x) => {
            *best = cand;
            (what, trace) = x;
            true
        }
        None => false,
    };

    // 1. The shortest beginning that still fails.
    let (mut lo, mut hi) = (0, best.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        if keep(&mut r, best[..mid].to_vec(), &mut best) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }

    // 2. Complements of ever smaller chunks, down to one fault at a time.
    let mut chunks = 2usize;
    while best.len() > 1 && r.runs < r.max_runs {
        let size = best.len().div_ceil(chunks);
        let mut removed = false;
        for start in (0..best.len()).step_by(size) {
            let cand: Vec<Fault> = best[..start]
                .iter()
                .chain(&best[(start + size).min(best.len())..])
                .cloned()
                .collect();
            if keep(&mut r, cand, &mut best) {
                removed = true;
                break;
            }
        }
        if removed {
            chunks = (chunks - 1).max(2);
        } else if size == 1 {
            break;
        } else {
            chunks = (chunks * 2).min(best.len());
        }
    }
    if best.len() == 1 && r.runs < r.max_runs {
        keep(&mut r, Vec::new(), &mut best);
    }

    // 3. Each delay and duplicate gap halved while it still fails.
    for i in 0..best.len() {
        while let What::Delay(d) | What::Duplicate(d) = best[i].what {
            if d < Duration::from_micros(1) || r.runs >= r.max_runs {
                break;
            }
            let mut cand = best.clone();
            cand[i].what = match best[i].what {
                What::Delay(_) => What::Delay(d / 2),
                _ => What::Duplicate(d / 2),
            };
            if !keep(&mut r, cand, &mut best) {
                break;
            }
        }
    }

    Some(Shrunk {
        schedule: Schedule::from(best),
        from: schedule.len(),
        what,
        trace,
        runs: r.runs,
    })
}
