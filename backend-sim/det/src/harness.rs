//! Running a test under many seeds, shrinking the one that failed and replaying it: the
//! user harness. A failure prints its seed, its trace, the command that replays it
//! ([`SEED_SETTING`] picks one seed; the test's name is the name libtest gives the
//! test's thread), the schedule of the failing run reduced by the [shrinker](crate::shrink)
//! (one line per fault) and the command that replays that schedule alone
//! ([`SCHEDULE_SETTING`]).

use std::fmt;
use std::ops::Range;

use backend_sim_proto::fabric::Schedule;

use crate::det::{Det, DetBuilder};
use crate::run::run_test;
use crate::shrink::{self, Shrunk};

/// The setting that runs only the seed it names (a replay).
pub const SEED_SETTING: &str = "DET_SEED";

/// The setting that runs the seed [`SEED_SETTING`] names under the schedule it holds
/// (faults separated by `;`, as a [`Failure`] prints them) instead of the seed's faults.
pub const SCHEDULE_SETTING: &str = "DET_SCHEDULE";

/// A seed whose run failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The seed.
    pub seed: u64,
    /// What the test said.
    pub what: String,
    /// The run's trace up to the failure.
    pub trace: u64,
    /// The command that runs this seed alone.
    pub replay: String,
    /// Every fault the network applied in the run, up to the failure.
    pub schedule: Schedule,
    /// The schedule reduced while the test still fails; `None` when the failure did not
    /// repeat from the schedule (the test reads something the seed does not decide) or
    /// no shrink was asked for ([`check_seeds_with`]).
    pub shrunk: Option<Box<Shrunk>>,
}

impl Failure {
    /// The command that runs this seed under the reduced schedule alone.
    pub fn replay_shrunk(&self) -> Option<String> {
        self.shrunk
            .as_ref()
            .map(|s| replay_schedule_command(self.seed, &s.schedule))
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "seed {}: {} (trace {:#018x}, {} faults)",
            self.seed,
            self.what,
            self.trace,
            self.schedule.len()
        )?;
        write!(f, "replay: {}", self.replay)?;
        if let (Some(s), Some(cmd)) = (&self.shrunk, self.replay_shrunk()) {
            write!(f, "\n{s}replay the shrunk schedule: {cmd}")?;
        }
        Ok(())
    }
}

/// The seeds to run: the one [`SEED_SETTING`] names, or `seeds`.
pub fn seeds(seeds: Range<u64>) -> Range<u64> {
    match std::env::var(SEED_SETTING).ok().and_then(|s| s.parse().ok()) {
        Some(s) => s..s + 1,
        None => seeds,
    }
}

/// The name of the test running in this thread, as libtest names it.
fn test_name() -> String {
    std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .map_or_else(|| "<test>".to_string(), str::to_string)
}

fn package() -> String {
    std::env::var("CARGO_PKG_NAME").unwrap_or_else(|_| "<package>".into())
}

/// The command that replays `seed` of the test running in this thread.
pub fn replay_command(seed: u64) -> String {
    format!(
        "{SEED_SETTING}={seed} cargo test -p {} -- --exact {}",
        package(),
        test_name()
    )
}

/// The command that runs `seed` of the test running in this thread under `schedule`
/// alone.
pub fn replay_schedule_command(seed: u64, schedule: &Schedule) -> String {
    format!(
        "{SEED_SETTING}={seed} {SCHEDULE_SETTING}='{}' cargo test -p {} -- --exact {}",
        schedule.to_line(),
        package(),
        test_name()
    )
}

/// Runs `test` in a world made by `builder` with each seed of [`seeds`]`(range)`;
/// stops at the first failure, whose schedule it shrinks ([`shrink::shrink`], within
/// [`shrink::MAX_RUNS`] runs). `Ok`: the traces of the runs, in seed order. A test
/// fails by returning `Err` or by panicking (an `assert!`): either way the failure says
/// what, with its seed and schedule.
///
/// With [`SCHEDULE_SETTING`] set, runs only the seed [`SEED_SETTING`] names, under that
/// schedule instead of the seed's faults (a replay of a printed one).
pub fn check_seeds<E: fmt::Display>(
    builder: &DetBuilder,
    range: Range<u64>,
    test: impl FnMut(&Det) -> Result<(), E>,
) -> Result<Vec<u64>, Failure> {
    check_seeds_with(builder, range, shrink::MAX_RUNS, test)
}

/// [`check_seeds`], shrinking a failure within `shrink_runs` runs (0: not at all, for a
/// search that expects failures and wants them fast).
pub fn check_seeds_with<E: fmt::Display>(
    builder: &DetBuilder,
    range: Range<u64>,
    shrink_runs: u32,
    test: impl FnMut(&Det) -> Result<(), E>,
) -> Result<Vec<u64>, Failure> {
    let setting = |name| std::env::var(name).ok().filter(|s| !s.trim().is_empty());
    let replay = Replay {
        seed: setting(SEED_SETTING),
        schedule: setting(SCHEDULE_SETTING),
    };
    run_seeds(builder, range, shrink_runs, &replay, test)
}

/// What the settings ask to replay: [`SEED_SETTING`] and [`SCHEDULE_SETTING`].
struct Replay {
    seed: Option<String>,
    schedule: Option<String>,
}

/// [`check_seeds_with`] under the settings `replay`.
fn run_seeds<E: fmt::Display>(
    builder: &DetBuilder,
    range: Range<u64>,
    shrink_runs: u32,
    replay: &Replay,
    mut test: impl FnMut(&Det) -> Result<(), E>,
) -> Result<Vec<u64>, Failure> {
    let seed = replay.seed.as_deref().and_then(|s| s.trim().parse().ok());
    let (range, forced) = match &replay.schedule {
        Some(text) => {
            let (seed, schedule) = schedule_setting(text, seed)?;
            (seed..seed + 1, Some(schedule))
        }
        None => (seed.map_or(range, |s| s..s + 1), None),
    };
    let mut traces = Vec::new();
    for seed in range {
        let mut b = builder.clone().seed(seed);
        if let Some(s) = &forced {
            b = b.schedule(s.clone());
        }
        let det = b.build();
        if let Err(e) = run_test(&mut test, &det) {
            let schedule = det.schedule();
            let shrunk = (shrink_runs > 0)
                .then(|| shrink::shrink(builder, seed, &schedule, shrink_runs, &mut test))
                .flatten()
                .map(Box::new);
            return Err(Failure {
                seed,
                what: e,
                trace: det.trace(),
                replay: match &forced {
                    Some(_) => replay_schedule_command(seed, &schedule),
                    None => replay_command(seed),
                },
                schedule,
                shrunk,
            });
        }
        traces.push(det.trace());
    }
    Ok(traces)
}

/// The seed and the schedule [`SCHEDULE_SETTING`] asks for; a setting that cannot be
/// run is a failure saying why.
fn schedule_setting(text: &str, seed: Option<u64>) -> Result<(u64, Schedule), Failure> {
    let refused = |what: String| Failure {
        seed: 0,
        what,
        trace: 0,
        replay: String::new(),
        schedule: Schedule::default(),
        shrunk: None,
    };
    let schedule: Schedule = text
        .parse()
        .map_err(|e| refused(format!("{SCHEDULE_SETTING} does not read as a schedule: {e}")))?;
    match seed {
        Some(seed) => Ok((seed, schedule)),
        None => Err(refused(format!(
            "{SCHEDULE_SETTING} needs {SEED_SETTING}: the seed chooses the QPNs its links name"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use backend_sim_proto::fabric::{Fault, FrameKey, What};
    use verbs_api::Backend;

    /// A test that passes: it opens a device (the plumbing of the settings is what is
    /// tested here; tests/ replay schedules of real runs).
    fn opens(det: &Det) -> Result<(), String> {
        det.open("det0").map(drop).map_err(|e| e.to_string())
    }

    fn replay(seed: Option<&str>, schedule: Option<&str>) -> Replay {
        Replay {
            seed: seed.map(str::to_string),
            schedule: schedule.map(str::to_string),
        }
    }

    #[test]
    fn the_seed_setting_runs_that_seed_alone() {
        let b = Det::builder();
        let all = run_seeds(&b, 0..3, 0, &replay(None, None), opens).unwrap();
        let one = run_seeds(&b, 0..3, 0, &replay(Some("2"), None), opens).unwrap();
        assert_eq!((all.len(), one), (3, vec![all[2]]));
    }

    #[test]
    fn the_schedule_setting_runs_its_seed_under_it_and_refuses_what_it_cannot_run() {
        let fault = Fault {
            at: std::time::Duration::ZERO,
            key: FrameKey {
                link: 5 << 32 | 6,
                opcode: 0x10,
                psn: 1,
                attempt: 0,
            },
            kind: "Send".into(),
            what: What::Drop,
        };
        let text = Schedule::from(vec![fault]).to_line();
        let b = Det::builder();
        let ok = run_seeds(&b, 0..100, 0, &replay(Some("4"), Some(&text)), opens);
        assert_eq!(ok.map(|t| t.len()), Ok(1));
        let always = |_: &Det| Err::<(), _>("fails");
        let f = run_seeds(&b, 0..100, 0, &replay(Some("4"), Some(&text)), always).unwrap_err();
        assert_eq!(f.seed, 4);
        assert!(f.replay.starts_with("DET_SEED=4 DET_SCHEDULE=''"), "{f}");
        let f = run_seeds(&b, 0..100, 0, &replay(None, Some(&text)), opens).unwrap_err();
        assert!(f.what.contains("DET_SCHEDULE needs DET_SEED"), "{f}");
        let f = run_seeds(&b, 0..100, 0, &replay(Some("4"), Some("at 1us")), opens).unwrap_err();
        assert!(f.what.contains("does not read as a schedule"), "{f}");
    }
}
