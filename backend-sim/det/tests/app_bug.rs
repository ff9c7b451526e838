//! A bug of the application, not of the HCA: a client that refills its buffer for the
//! next RDMA WRITE before the previous WRITE from it completed. On a network that
//! delivers every frame the first time it looks right, because the HCA reads the buffer
//! as it sends; when a frame is lost the requester resends it from the buffer as it is
//! then, and the server gets the next message's bytes. The seeded network finds a seed
//! where that happens, and the printed seed replays it: the same failure, the same trace.

mod common;

use std::time::Duration;

use backend_sim_det::harness::{check_seeds, Failure};
use backend_sim_det::Det;
use backend_sim_proto::fabric::FaultMix;
use verbs_api::{Backend, MemoryRegion, QueuePair, SendWr};

const ROUNDS: usize = 8;
const LEN: usize = 4096;

/// Two WRITEs a round from one buffer; `buggy`: the buffer is refilled for the second
/// before the first completed (`man ibv_post_send`: the buffer is read when the WR
/// executes, after the call returns, and must not change until it completes).
fn two_writes_a_round<B: Backend>(b: &B, buggy: bool) -> Result<(), String> {
    let e = |x: verbs_api::Error| x.to_string();
    let client = common::side(b, "client").map_err(e)?;
    let server = common::side(b, "server").map_err(e)?;
    common::connect(&client, &server).map_err(e)?;
    let (c, s) = (&client.mr, &server.mr);
    for round in 0..ROUNDS {
        let (first, second) = ([2 * round as u8 + 1; LEN], [2 * round as u8 + 2; LEN]);
        let at = (round * 2 * LEN) as u64;
        let sge = [c.sge(0, LEN).map_err(e)?];
        c.write(0, &first).map_err(e)?;
        let wr = SendWr::write(2 * round as u64, &sge, s.remote().at(at)).signaled();
        client.qp.post_send(&[wr]).map_err(|x| x.to_string())?;
        if !buggy {
            common::wait_ok(&client, 1)?;
        }
        c.write(0, &second).map_err(e)?;
        let wr = SendWr::write(2 * round as u64 + 1, &sge, s.remote().at(at + LEN as u64)).signaled();
        client.qp.post_send(&[wr]).map_err(|x| x.to_string())?;
        common::wait_ok(&client, if buggy { 2 } else { 1 })?;
        for (k, want) in [first, second].iter().enumerate() {
            let mut got = vec![0u8; LEN];
            s.read(at as usize + k * LEN, &mut got).map_err(e)?;
            if got != *want {
                return Err(format!(
                    "round {round}: WRITE {k} left {:#04x} at the server, not {:#04x}",
                    got[0], want[0]
                ));
            }
        }
    }
    Ok(())
}

fn lossy() -> backend_sim_det::DetBuilder {
    Det::builder()
        .hosts(["client", "server"])
        .mix(FaultMix::lossy(10, 0))
}

#[test]
fn a_clean_network_hides_the_bug() {
    let clean = Det::builder()
        .hosts(["client", "server"])
        .mix(FaultMix::clean(Duration::from_micros(2)));
    check_seeds(&clean, 0..20, |d| two_writes_a_round(d, true)).unwrap_or_else(|f| panic!("{f}"));
}

#[test]
fn a_seed_finds_the_buffer_reused_too_early_and_replays_it() {
    // The correct client passes every seed the search runs.
    check_seeds(&lossy(), 0..200, |d| two_writes_a_round(d, false)).unwrap_or_else(|f| panic!("{f}"));
    let found: Failure = check_seeds(&lossy(), 0..200, |d| two_writes_a_round(d, true))
        .expect_err("a lossy network exposes a buffer refilled before its WRITE completed");
    eprintln!("{found}");
    assert!(found.what.contains("WRITE 0 left"), "{found}");
    assert!(
        found.replay.contains(&format!("DET_SEED={}", found.seed)),
        "{found}"
    );
    // The printed seed replays the run: the same failure, the same trace.
    let again = check_seeds(&lossy(), found.seed..found.seed + 1, |d| {
        two_writes_a_round(d, true)
    })
    .expect_err("the seed fails again");
    assert_eq!(
        (again.seed, &again.what, again.trace),
        (found.seed, &found.what, found.trace)
    );
}
