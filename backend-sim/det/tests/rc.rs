//! An RC client and server written over `verbs_api::Backend` alone (tests/common) run
//! unchanged on the deterministic backend: over a clean network, and over one that loses,
//! duplicates and reorders frames (or the packets it cuts them into), under many seeds:
//! the data arrives intact, every atomic runs exactly once, and the same seed gives the
//! same trace.

mod common;

use std::time::Duration;

use backend_sim_det::harness::check_seeds;
use backend_sim_det::Det;
use backend_sim_proto::fabric::FaultMix;

/// Seeds per mix (each seed a whole client/server run).
const SEEDS: u64 = 40;

fn hosts() -> backend_sim_det::DetBuilder {
    Det::builder().hosts(["client", "server"])
}

#[test]
fn a_clean_network_runs_the_client_and_server() {
    let b = hosts().mix(FaultMix::clean(Duration::from_micros(2)));
    check_seeds(&b, 0..4, common::client_server).unwrap_or_else(|f| panic!("{f}"));
    let det = b.clone().seed(0).build();
    common::client_server(&det).unwrap();
    let s = det.stats();
    assert!(
        s.delivered > 0 && s.lost == 0 && s.duplicated == 0 && s.timeouts == 0,
        "{s:?}"
    );
}

#[test]
fn loss_duplication_and_reordering_keep_data_and_atomics_exact() {
    let mut mix = FaultMix::lossy(5, 5);
    mix.jitter = Duration::from_micros(50);
    let b = hosts().mix(mix);
    let mut total = backend_sim_proto::fabric::Stats::default();
    check_seeds(&b, 0..SEEDS, |det| {
        common::client_server(det)?;
        let s = det.stats();
        total.lost += s.lost;
        total.duplicated += s.duplicated;
        total.timeouts += s.timeouts;
        Ok::<_, String>(())
    })
    .unwrap_or_else(|f| panic!("{f}"));
    // The recovery paths ran: frames were lost and duplicated, requesters timed out.
    assert!(
        total.lost > 0 && total.duplicated > 0 && total.timeouts > 0,
        "{total:?}"
    );
}

/// The network cuts every frame of several packets into its packets, each lost,
/// duplicated and reordered on its own: a packet lost inside a SEND, a WRITE or a READ
/// response is recovered from that packet and the data still arrives intact.
#[test]
fn packets_lost_inside_messages_keep_data_exact() {
    let mut mix = FaultMix::lossy(5, 5);
    mix.split_ppm = 1_000_000;
    let b = hosts().mix(mix);
    let mut total = backend_sim_proto::fabric::Stats::default();
    check_seeds(&b, 0..SEEDS, |det| {
        common::client_server(det)?;
        let s = det.stats();
        total.split += s.split;
        total.lost += s.lost;
        Ok::<_, String>(())
    })
    .unwrap_or_else(|f| panic!("{f}"));
    assert!(total.split > 0 && total.lost > 0, "{total:?}");
}

#[test]
fn broken_connections_keep_data_and_atomics_exact() {
    let mut mix = FaultMix::lossy(2, 2);
    mix.reset_ppm = 5_000;
    let b = hosts().mix(mix);
    let mut resets = 0;
    check_seeds(&b, 0..SEEDS, |det| {
        common::client_server(det)?;
        resets += det.stats().resets;
        Ok::<_, String>(())
    })
    .unwrap_or_else(|f| panic!("{f}"));
    assert!(resets > 0);
}

#[test]
fn the_same_seed_gives_the_same_trace() {
    let b = hosts().mix(FaultMix::lossy(10, 10));
    let first = check_seeds(&b, 0..8, common::client_server).unwrap_or_else(|f| panic!("{f}"));
    let again = check_seeds(&b, 0..8, common::client_server).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(first, again);
    let mut distinct = first.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        first.len(),
        "different seeds, different runs: {first:x?}"
    );
}

/// What generic code does to let time pass with no completion to wait for.
fn let_pass<B: verbs_api::Backend>(b: &B, d: Duration) -> verbs_api::Result<()> {
    b.settle(d)
}

#[test]
fn letting_time_pass_through_the_backend_runs_the_world_instead_of_sleeping() {
    use verbs_api::{MemoryRegion, QueuePair, RecvWr, SendWr};
    let det = hosts().seed(1).build();
    assert!(verbs_api::Backend::clock_is_virtual(&det));
    let client = common::side(&det, "client").unwrap();
    let server = common::side(&det, "server").unwrap();
    common::connect(&client, &server).unwrap();
    let sge = [server.mr.sge(0, 64).unwrap()];
    server.qp.post_recv(&[RecvWr::new(1, &sge)]).unwrap();
    let sge = [client.mr.sge(0, 64).unwrap()];
    client.qp.post_send(&[SendWr::send(2, &sge).signaled()]).unwrap();
    let (before, start) = (det.stats().delivered, det.now());
    // No CQ is polled: only the settle can move the world.
    let_pass(&det, Duration::from_millis(1)).unwrap();
    let moved = det.now() - start;
    assert!(det.stats().delivered > before, "nothing delivered in {moved:?}");
    assert!(
        moved > Duration::ZERO && moved <= Duration::from_millis(1),
        "{moved:?}"
    );
}
