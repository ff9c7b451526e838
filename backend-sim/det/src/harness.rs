//! Running a test under many seeds, and replaying the one that failed: the first piece
//! of the user harness. A failure prints its seed, its trace and the command that
//! replays it ([`SEED_SETTING`] picks one seed; the test's name is the name libtest
//! gives the test's thread).

use std::fmt;
use std::ops::Range;

use crate::{Det, DetBuilder};

/// The setting that runs only the seed it names (a replay).
pub const SEED_SETTING: &str = "DET_SEED";

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
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {}: {} (trace {:#018x})\nreplay: {}",
            self.seed, self.what, self.trace, self.replay
        )
    }
}

/// The seeds to run: the one [`SEED_SETTING`] names, or `seeds`.
pub fn seeds(seeds: Range<u64>) -> Range<u64> {
    match std::env::var(SEED_SETTING).ok().and_then(|s| s.parse().ok()) {
        Some(s) => s..s + 1,
        None => seeds,
    }
}

/// The command that replays `seed` of the test running in this thread.
pub fn replay_command(seed: u64) -> String {
    let package = std::env::var("CARGO_PKG_NAME").unwrap_or_else(|_| "<package>".into());
    let test = std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .map_or_else(|| "<test>".to_string(), str::to_string);
    format!("{SEED_SETTING}={seed} cargo test -p {package} -- --exact {test}")
}

/// Runs `test` in a world made by `builder` with each seed of [`seeds`]`(range)`;
/// stops at the first failure. `Ok`: the traces of the runs, in seed order.
pub fn check_seeds<E: fmt::Display>(
    builder: &DetBuilder,
    range: Range<u64>,
    mut test: impl FnMut(&Det) -> Result<(), E>,
) -> Result<Vec<u64>, Failure> {
    let mut traces = Vec::new();
    for seed in seeds(range) {
        let det = builder.clone().seed(seed).build();
        if let Err(e) = test(&det) {
            return Err(Failure {
                seed,
                what: e.to_string(),
                trace: det.trace(),
                replay: replay_command(seed),
            });
        }
        traces.push(det.trace());
    }
    Ok(traces)
}
