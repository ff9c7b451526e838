//! `cargo test` runs every conformance case against the simulated HCA, one test each,
//! under each device profile: `portable` (the default; named by the case id alone) must
//! not deviate from IBA; `rxe` and `mlx5` (`rxe/`, `mlx5/` before the id) may pass with
//! their profile's documented deviations (rxe's statuses, mlx5's ENOMEM for an invalid
//! send WR, ...), which their switches reproduce: a case accepts a deviation only from
//! the profile that has it. A skip counts as a failure
//! here: the sim must run every case it has the capabilities for. A case that requires a capability the sim's [`Capabilities`] say it lacks
//! ([`conformance::Case::requires`]) is listed as ignored, its kind naming what the sim
//! lacks, rather than run.

use backend_sim::SimConfig;
use conformance::{cases, run_case, Config, Profile};
use libtest_mimic::{Arguments, Failed, Trial};
use verbs_api::{Backend, Capabilities, Context};

fn main() {
    let args = Arguments::from_args();
    let trials = Profile::ALL.into_iter().flat_map(trials).collect();
    libtest_mimic::run(&args, trials).exit();
}

/// One trial per case on a sim playing `profile`.
fn trials(profile: Profile) -> Vec<Trial> {
    let backend = backend_sim::SimBackend::new(SimConfig {
        profile,
        ..SimConfig::default()
    });
    let caps: Capabilities = backend
        .open("sim0")
        .and_then(|ctx| ctx.capabilities())
        .expect("the sim's capabilities");
    cases::<backend_sim::SimBackend>()
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
            let name = match profile {
                Profile::Portable => case.id.to_string(),
                p => format!("{p}/{}", case.id),
            };
            Trial::test(name, move || {
                let cfg = Config {
                    profile,
                    ..Config::new("sim0")
                };
                let r = run_case(&backend, &cfg, &case);
                match r.status {
                    "pass" if r.detail.is_empty() => Ok(()),
                    // (The case accepts a deviation only from the profile that has it.)
                    "pass" if profile != Profile::Portable => Ok(()),
                    "pass" => Err(Failed::from(format!(
                        "the sim must not deviate under {profile}: {}",
                        r.detail
                    ))),
                    other => Err(Failed::from(format!("{other}: {}", r.detail))),
                }
            })
            .with_kind(kind)
            .with_ignored_flag(!lacks.is_empty())
        })
        .collect()
}
