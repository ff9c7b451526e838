//! The three seed scenarios of the examples (kv-rpc, param-pool, dist-lock) on the
//! deterministic backend (`backend-sim-det`): each scenario's verbs logic, generic over
//! `verbs_api::Backend` and built on the example's own parts (`examples::kv`,
//! `examples::pool`), runs its clients and server by turns in one thread, under
//! [`SEEDS`] seeds (or as many as [`SEEDS_SETTING`] says) in each of three fault mixes
//! (loss, duplication and reordering; the same with messages cut into packets; broken
//! connections), and checks the example's invariant. Every seed runs twice and must
//! give the same trace. A bug planted in each scenario (a switch of the scenario's
//! `Bugs` or `Setup`) passes on a perfect network and is found by a seed of a faulty
//! one, which replays to the same failure.
//!
//! The scenarios are here and not in `examples/src`: the binaries run their sides in
//! threads and processes over a side channel, these take turns in one thread and know
//! of planted bugs.
//!
//! Replay one seed: `DET_SEED=<seed> cargo test -p examples --test det_scenarios -- --exact <test>`.

mod fabric;
mod kv;
mod lock;
#[cfg(feature = "planted-bugs")]
mod mutation;
mod pool;

use backend_sim_det::harness::{check_seeds, Failure};
use backend_sim_det::{Det, DetBuilder};

/// Seeds per fault mix, unless [`SEEDS_SETTING`] says otherwise.
const SEEDS: u64 = 30;
/// The setting that runs more (or fewer) seeds per fault mix: a longer sweep
/// (`DET_SCENARIO_SEEDS=1000 cargo test --release -p examples --test det_scenarios`).
const SEEDS_SETTING: &str = "DET_SCENARIO_SEEDS";

fn seeds() -> u64 {
    std::env::var(SEEDS_SETTING)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEEDS)
}
/// Seeds a planted bug is searched for in.
const SEARCH: u64 = 200;

/// Runs `run` under every mix, [`SEEDS`] seeds each, twice; panics with the failing
/// seed and its replay command.
fn every_mix(hosts: &[&str], mut run: impl FnMut(&Det) -> Result<(), String>) {
    let clean = fabric::world(hosts, fabric::clean());
    fabric::twice(&clean, 0..4, &mut run).unwrap_or_else(|f| panic!("clean network: {f}"));
    for (name, mix) in fabric::mixes() {
        let b = fabric::world(hosts, mix);
        let traces = fabric::twice(&b, 0..seeds(), &mut run).unwrap_or_else(|f| panic!("{name}: {f}"));
        let mut distinct = traces.clone();
        distinct.sort_unstable();
        distinct.dedup();
        // (One seed when DET_SEED replays one.)
        assert!(
            distinct.len() > 1 || traces.len() == 1,
            "{name}: every seed gave the same run"
        );
    }
}

/// A planted bug: `buggy` passes on a perfect network, fails on some seed of `faulty`
/// within [`SEARCH`] seeds saying one of `what`, and that seed replays to the same
/// failure and trace.
fn found(
    hosts: &[&str],
    faulty: DetBuilder,
    mut buggy: impl FnMut(&Det) -> Result<(), String>,
    what: &[&str],
) {
    let clean = fabric::world(hosts, fabric::clean());
    check_seeds(&clean, 0..4, &mut buggy).unwrap_or_else(|f| panic!("a perfect network shows the bug: {f}"));
    let f: Failure = check_seeds(&faulty, 0..SEARCH, &mut buggy)
        .expect_err("a seed of the faulty network finds the planted bug");
    eprintln!("found: {f}");
    assert!(what.iter().any(|w| f.what.contains(w)), "{f}");
    let again = check_seeds(&faulty, f.seed..f.seed + 1, &mut buggy).expect_err("the seed fails again");
    assert_eq!((again.seed, &again.what, again.trace), (f.seed, &f.what, f.trace));
}

#[test]
fn kv_rpc_every_request_gets_exactly_its_reply() {
    let mut dry = 0;
    every_mix(&kv::HOSTS, |d| {
        dry += kv::run(d, kv::Setup::default())?.dry;
        Ok(())
    });
    // The receive queues ran dry between refills (a SEND that arrives then is NAKed
    // RNR and resent: the next test).
    assert!(dry > 0);
}

/// kv-rpc's SRQ variant: the server's QPs share one SRQ, refilled when its limit event
/// comes; the same invariant, and the SRQ ran dry (SENDs meet RNR NAKs there too) and
/// its limit event fired.
#[test]
fn kv_rpc_on_an_srq_refilled_on_its_limit_event_answers_every_request_once() {
    let setup = kv::Setup {
        srq: true,
        ..kv::Setup::default()
    };
    let (mut dry, mut events) = (0, 0);
    every_mix(&kv::HOSTS, |d| {
        let o = kv::run(d, setup)?;
        dry += o.dry;
        events += o.srq_events;
        Ok(())
    });
    assert!(dry > 0, "the SRQ never ran dry");
    assert!(events > 0, "the SRQ's limit event never came");
}

/// The receive queues run dry between refills: with no RNR retry the first SEND that
/// meets an empty one fails with IBV_WC_RNR_RETRY_EXC_ERR (as the example's
/// `demo --no-refill --rnr-retry 0`), on a perfect network already; with retries (the
/// runs above) the SEND is NAKed, resent, and gets its reply.
#[test]
fn kv_rpc_without_rnr_retries_a_send_meets_an_empty_receive_queue() {
    let setup = kv::Setup {
        rnr_retry: 0,
        ..kv::Setup::default()
    };
    let clean = fabric::world(&kv::HOSTS, fabric::clean());
    let f = check_seeds(&clean, 0..1, |d| kv::run(d, setup).map(drop))
        .expect_err("a SEND meets an empty receive queue");
    assert!(f.what.contains("RnrRetryExcErr"), "{f}");
}

#[test]
fn kv_rpc_a_response_slot_reused_before_its_send_completed_is_found() {
    let bugs = kv::Setup {
        resp_slot_freed_at_post: true,
        ..kv::Setup::default()
    };
    let faulty = fabric::world(&kv::HOSTS, fabric::mixes()[0].1);
    // The answer that arrives is another request's, or the bytes of one half-rewritten.
    let what = ["bad response", "in flight", "wrong answers"];
    found(&kv::HOSTS, faulty, |d| kv::run(d, bugs).map(drop), &what);
}

#[test]
fn param_pool_reads_return_exactly_what_the_owner_wrote() {
    let mut rejected = 0;
    every_mix(&pool::HOSTS, |d| {
        rejected += pool::run(d, pool::Bugs::default())?.rejected;
        Ok(())
    });
    // Some READs copied a slot across an update (their response resent in part after
    // the owner rewrote it) and were turned away.
    assert!(rejected > 0);
}

#[test]
fn param_pool_a_reader_trusting_the_head_version_alone_is_found() {
    let bugs = pool::Bugs { head_only: true };
    let faulty = fabric::world(&pool::HOSTS, fabric::mixes()[1].1);
    found(
        &pool::HOSTS,
        faulty,
        |d| pool::run(d, bugs).map(drop),
        &["is not that vector"],
    );
}

#[test]
fn dist_lock_excludes_and_every_atomic_runs_once() {
    let mut contended = 0;
    every_mix(&lock::HOSTS, |d| {
        contended += lock::run(d, lock::Bugs::default())?.contended;
        Ok(())
    });
    assert!(contended > 0, "the clients never competed for the lock");
}

#[test]
fn dist_lock_a_release_before_the_increment_is_found() {
    let bugs = lock::Bugs {
        release_before_write: true,
    };
    let faulty = fabric::world(&lock::HOSTS, fabric::mixes()[0].1);
    found(
        &lock::HOSTS,
        faulty,
        |d| lock::run(d, bugs).map(drop),
        &["the counter read"],
    );
}
