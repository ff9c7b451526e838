//! The mutation check from the applications' side: each bug planted in the protocol core
//! (`backend_sim_proto::plant`, built with the `planted-bugs` feature) breaks the
//! invariant of a scenario that uses the path it breaks, on some seed of a faulty
//! network. A duplicate executed again shows in all three; an atomic repeated instead
//! of answered from the replay state in the lock; an ACK that completes one WQE too many
//! and a resend from the start of a message in kv-rpc, whose requests and answers are
//! two packets each.

use backend_sim_det::harness::{check_seeds, Failure};
use backend_sim_det::Det;
use backend_sim_proto::fabric::FaultMix;
use backend_sim_proto::plant::{self, Plant};

use crate::{fabric, kv, lock, pool, SEARCH};

/// Runs `run` with `bug` planted under the seeds of [`SEARCH`]: the failing seed.
fn found(
    bug: Plant,
    hosts: &[&str],
    mix: FaultMix,
    mut run: impl FnMut(&Det) -> Result<(), String>,
) -> Failure {
    let b = fabric::world(hosts, mix);
    let f = plant::with(bug, || check_seeds(&b, 0..SEARCH, &mut run))
        .expect_err("a seed finds the planted protocol bug");
    eprintln!("{bug:?}: {f}");
    f
}

fn kv(d: &Det) -> Result<(), String> {
    kv::run(d, kv::Setup::default()).map(drop)
}

fn pool(d: &Det) -> Result<(), String> {
    pool::run(d, pool::Bugs::default()).map(drop)
}

fn lock(d: &Det) -> Result<(), String> {
    lock::run(d, lock::Bugs::default()).map(drop)
}

#[test]
fn a_duplicate_executed_again_breaks_every_scenario() {
    let lossy = fabric::mixes()[0].1;
    found(Plant::NoDuplicateCheck, &kv::HOSTS, lossy, kv);
    found(Plant::NoDuplicateCheck, &pool::HOSTS, lossy, pool);
    found(Plant::NoDuplicateCheck, &lock::HOSTS, lossy, lock);
}

#[test]
fn an_atomic_repeated_breaks_the_lock() {
    found(Plant::NoAtomicReplay, &lock::HOSTS, fabric::mixes()[0].1, lock);
}

#[test]
fn an_ack_completing_one_wqe_too_many_breaks_kv_rpc() {
    found(Plant::AckOffByOne, &kv::HOSTS, fabric::mixes()[0].1, kv);
}

#[test]
fn a_resend_from_the_start_of_a_message_breaks_kv_rpc() {
    found(
        Plant::ResendFromMessageStart,
        &kv::HOSTS,
        fabric::mixes()[1].1,
        kv,
    );
}
