//! `cargo test` runs every conformance case against the simulated HCA, one test each.
//! A skip counts as a failure here: the sim must run every case it has the capabilities
//! for. A case that requires a capability the sim's [`Capabilities`] say it lacks
//! ([`conformance::Case::requires`]) is listed as ignored, its kind naming what the sim
//! lacks, rather than run.

use conformance::{cases, run_case, Config};
use libtest_mimic::{Arguments, Failed, Trial};
use verbs_api::{Backend, Capabilities, Context};

fn main() {
    let args = Arguments::from_args();
    let backend = backend_sim::SimBackend::default();
    let caps: Capabilities = backend
        .open("sim0")
        .and_then(|ctx| ctx.capabilities())
        .expect("the sim's capabilities");
    let trials = cases::<backend_sim::SimBackend>()
        .into_iter()
        .map(|case| {
            let backend = backend.clone();
            let group = case.group;
            let lacks: Vec<_> = case
                .requires
                .iter()
                .filter(|l| l.missing_in(&caps).is_some())
                .collect();
            let kind = if lacks.is_empty() {
                group.to_string()
            } else {
                format!("{group}; the sim lacks {lacks:?}")
            };
            Trial::test(case.id, move || {
                let cfg = Config::new("sim0");
                let r = run_case(&backend, &cfg, &case);
                match r.status {
                    "pass" if r.detail.is_empty() => Ok(()),
                    "pass" => Err(Failed::from(format!("the sim must not deviate: {}", r.detail))),
                    other => Err(Failed::from(format!("{other}: {}", r.detail))),
                }
            })
            .with_kind(kind)
            .with_ignored_flag(!lacks.is_empty())
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
