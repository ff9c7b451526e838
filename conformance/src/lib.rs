//! # conformance: one suite, every backend
//!
//! A case is a plain function generic over [`verbs_api::Backend`] (the `rdmacm` group's
//! over [`verbs_api::rdmacm::CmBackend`], which every backend implements), with an id, a group,
//! a one-line name and the man page, rdma-core test or spec section whose behaviour it
//! checks. [`cases`] lists them all. The same table runs
//!
//! - under `cargo test` against the simulated HCA (`tests/sim.rs`, one test per case), and
//! - from the `conformance` binary against any backend and device, printing a table or
//!   JSON, so the suite can be run on a user's own hardware.
//!
//! A case asserts what a real HCA does. Where a particular device is known to deviate
//! (Soft-RoCE reports some errors differently), the case accepts the device's behaviour
//! only through [`Env::deviation`], which names the source, and the report shows "pass
//! (deviation: ...)". A case that cannot run on a device says why ([`Outcome::Skip`]);
//! nothing passes by skipping.

#![warn(missing_docs)]

pub mod capture;
pub mod cases;
pub mod cli;
pub mod env;
pub mod peer;
pub mod report;
pub mod soak;

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

pub use env::{Config, Env, Pair, PairOpts, Profile};
use verbs_api::Backend;

/// How a case ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The device behaved as a real HCA must.
    Pass,
    /// The device behaved as this device is documented to deviate (reasons attached).
    Deviation(Vec<String>),
    /// The case could not run here: the capability the device lacks, and the reason in
    /// words. The report records the device's capabilities, so `--compare` can check
    /// that they explain the skip.
    Skip(report::Lack, String),
}

/// A failed check: what was expected and what happened.
#[derive(Debug)]
pub struct Failure(pub String);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<verbs_api::Error> for Failure {
    fn from(e: verbs_api::Error) -> Self {
        Failure(format!("unexpected error: {e}"))
    }
}

impl From<verbs_api::PostError> for Failure {
    fn from(e: verbs_api::PostError) -> Self {
        Failure(format!("unexpected post error: {e}"))
    }
}

/// What a case function returns.
pub type CaseResult = Result<Outcome, Failure>;

/// Fails the case with a message unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::Failure(format!($($fmt)+)));
        }
    };
}

/// Fails the case unless `left == right`, showing both.
#[macro_export]
macro_rules! ensure_eq {
    ($left:expr, $right:expr, $($fmt:tt)+) => {
        match (&$left, &$right) {
            (l, r) => {
                if l != r {
                    return Err($crate::Failure(format!("{}: expected {:?}, got {:?}", format!($($fmt)+), r, l)));
                }
            }
        }
    };
}

/// One conformance case.
pub struct Case<B: Backend> {
    /// Stable identifier, e.g. `rnr.exhausted`.
    pub id: &'static str,
    /// Group, e.g. `rnr`.
    pub group: &'static str,
    /// What it checks, in one line.
    pub name: &'static str,
    /// Where the behaviour is specified.
    pub source: &'static str,
    /// Capabilities the case needs: on a device without one it is skipped, naming it,
    /// before it runs.
    pub requires: &'static [report::Lack],
    /// The check.
    pub run: fn(&Env<B>) -> CaseResult,
}

/// The result of running one case.
#[derive(Clone, Debug)]
pub struct CaseReport {
    /// Case id.
    pub id: &'static str,
    /// Case group.
    pub group: &'static str,
    /// Case name.
    pub name: &'static str,
    /// Where the behaviour is specified.
    pub source: &'static str,
    /// "pass", "fail" or "skip".
    pub status: &'static str,
    /// Why it failed or was skipped, or the deviations it passed with.
    pub detail: String,
    /// For a skip: the capability the device lacks.
    pub lacks: Option<report::Lack>,
    /// What the device did where the case observed it ([`Env::observe`]): statuses,
    /// errnos, events, in the order first observed.
    pub observed: Vec<(String, String)>,
    /// Wall time.
    pub time: Duration,
}

/// Runs one case on a fresh context of `cfg.device`, catching panics.
pub fn run_case<B: Backend>(backend: &B, cfg: &Config, case: &Case<B>) -> CaseReport {
    let start = Instant::now();
    let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
        // Declared before the context: flushed after the context is gone, with every
        // packet its device sent.
        let _capture;
        let env = Env::new(backend, cfg)?;
        _capture = match &cfg.capture {
            Some(dir) => capture::start(&env.ctx, &cfg.device, dir, case.id)?,
            None => None,
        };
        if !case.requires.is_empty() {
            let caps = verbs_api::Context::capabilities(&env.ctx)?;
            if let Some((lack, why)) = case
                .requires
                .iter()
                .find_map(|l| l.missing_in(&caps).map(|why| (*l, why)))
            {
                return Ok((Outcome::Skip(lack, why), Vec::new(), Vec::new()));
            }
        }
        let r = (case.run)(&env)?;
        Ok::<_, Failure>((r, env.take_deviations(), env.take_observed()))
    }));
    let mut lacks = None;
    let mut observed = Vec::new();
    let (status, detail) = match result {
        Ok(Ok((Outcome::Pass, devs, obs))) | Ok(Ok((Outcome::Deviation(devs), _, obs)))
            if !devs.is_empty() =>
        {
            observed = obs;
            ("pass", format!("deviation: {}", devs.join("; ")))
        }
        Ok(Ok((Outcome::Pass, _, obs))) | Ok(Ok((Outcome::Deviation(_), _, obs))) => {
            observed = obs;
            ("pass", String::new())
        }
        Ok(Ok((Outcome::Skip(lack, why), _, _))) => {
            lacks = Some(lack);
            ("skip", why)
        }
        Ok(Err(f)) => ("fail", f.0),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            ("fail", format!("panicked: {msg}"))
        }
    };
    CaseReport {
        id: case.id,
        group: case.group,
        name: case.name,
        source: case.source,
        status,
        detail,
        lacks,
        observed,
        time: start.elapsed(),
    }
}

pub use cases::{cases, verbs_cases};
