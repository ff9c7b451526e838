//! `cargo test` runs every conformance case against the simulated HCA, one test each.
//! A skip counts as a failure here: the sim must run every case.

use conformance::{cases, run_case, Config};
use libtest_mimic::{Arguments, Failed, Trial};

fn main() {
    let args = Arguments::from_args();
    let backend = backend_sim::SimBackend::default();
    let trials = cases::<backend_sim::SimBackend>()
        .into_iter()
        .map(|case| {
            let backend = backend.clone();
            let group = case.group;
            Trial::test(case.id, move || {
                let cfg = Config::new("sim0");
                let r = run_case(&backend, &cfg, &case);
                match r.status {
                    "pass" if r.detail.is_empty() => Ok(()),
                    "pass" => Err(Failed::from(format!("the sim must not deviate: {}", r.detail))),
                    other => Err(Failed::from(format!("{other}: {}", r.detail))),
                }
            })
            .with_kind(group)
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
