//! Every behavioural switch of the sim's profiles has conformance cases that observe it
//! (`backend_sim::profile::switches::table()` names them): each case passes under every
//! profile and records what the device did, and wherever a profile's choice differs from
//! `portable`'s, the cases' observations under that profile differ from `portable`'s.
//! A case that passed whichever way the switch is set would fail this test.

use std::collections::{BTreeMap, HashMap};
use std::process::Command;

use backend_sim::profile::switches::table;
use backend_sim::Profile;

const BIN: &str = env!("CARGO_BIN_EXE_conformance");

/// Case id -> (status, observations) of one run of `cases` under `profile`.
fn run(profile: Profile, cases: &[&str]) -> BTreeMap<String, (String, serde_json::Value)> {
    let mut cmd = Command::new(BIN);
    cmd.args(["--backend", "sim", "--json", "--profile", profile.name()]);
    for c in cases {
        cmd.args(["--filter", c]);
    }
    let o = cmd.output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{profile}: {e}: {}", String::from_utf8_lossy(&o.stderr)));
    report["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let id = c["id"].as_str().unwrap().to_string();
            (
                id,
                (c["status"].as_str().unwrap().to_string(), c["observed"].clone()),
            )
        })
        .collect()
}

#[test]
fn every_switch_is_observed_by_its_cases_under_every_profile() {
    let mut all: Vec<&str> = table().iter().flat_map(|d| d.cases.iter().copied()).collect();
    all.sort_unstable();
    all.dedup();
    let runs: HashMap<Profile, _> = Profile::ALL.iter().map(|&p| (p, run(p, &all))).collect();
    for d in table() {
        assert!(!d.cases.is_empty(), "switch {} names no case", d.name);
        for p in Profile::ALL {
            for c in d.cases {
                // A filter matches by substring: the exact id must be there.
                let (status, observed) = runs[&p]
                    .get(*c)
                    .unwrap_or_else(|| panic!("switch {}: no case {c} under {p}", d.name));
                assert!(
                    status.starts_with("pass"),
                    "switch {}: {c} under {p}: {status}",
                    d.name
                );
                assert!(
                    observed.as_object().is_some_and(|o| !o.is_empty()),
                    "switch {}: {c} under {p} records no observation",
                    d.name
                );
            }
            if d.value(p) != d.value(Profile::Portable) {
                assert!(
                    d.cases
                        .iter()
                        .any(|c| runs[&p][*c].1 != runs[&Profile::Portable][*c].1),
                    "switch {} differs under {p} ({} vs {}), but no case of {:?} observed a difference",
                    d.name,
                    d.value(p),
                    d.value(Profile::Portable),
                    d.cases
                );
            }
        }
    }
}
