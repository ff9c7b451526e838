//! A bug of the application, not of the HCA: a client that refills its buffer for the
//! next RDMA WRITE before the previous WRITE from it completed. On a network that
//! delivers every frame the first time it looks right, because the HCA reads the buffer
//! as it sends; when a frame is lost the requester resends it from the buffer as it is
//! then, and the server gets the next message's bytes. The seeded network finds a seed
//! where that happens, and the printed seed replays it: the same failure, the same trace.
//! The shrinker reduces that run's schedule (hundreds of late, cut and lost frames) to
//! the one lost frame that shows the bug, and that schedule alone replays the failure.

mod common;

use std::time::Duration;

use backend_sim_det::harness::{check_seeds, Failure};
use backend_sim_det::{Det, Schedule};
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
            if let Some(at) = got.iter().zip(want).position(|(g, w)| g != w) {
                return Err(format!(
                    "round {round}: WRITE {k} left {:#04x} at byte {at} of the server's copy, not {:#04x}",
                    got[at], want[at]
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

#[test]
fn the_failing_schedule_shrinks_to_a_frame_or_two_that_replay_it() {
    let found = check_seeds(&lossy(), 0..200, |d| two_writes_a_round(d, true))
        .expect_err("a lossy network exposes a buffer refilled before its WRITE completed");
    let shrunk = found
        .shrunk
        .clone()
        .expect("the failure repeats from its schedule");
    eprintln!("{found}");
    assert_eq!(shrunk.from, found.schedule.len());
    assert!(
        found.schedule.len() >= 20 * shrunk.schedule.len(),
        "{} faults shrunk only to {}",
        found.schedule.len(),
        shrunk.schedule.len()
    );
    // A frame or two tell the whole story (one lost, or one packet overtaken by the next):
    // the WRITE is resent after the buffer was refilled. Each fault left is needed.
    assert!(shrunk.schedule.len() <= 2, "{shrunk}");
    assert!(shrunk.what.contains("WRITE 0 left"), "{shrunk}");
    let replay = found
        .replay_shrunk()
        .expect("a shrunk schedule has a replay command");
    assert!(replay.contains("DET_SCHEDULE='at "), "{replay}");

    // The printed schedule, read back, fails again alone: the same failure, the same
    // trace; the correct client passes under it, and so does the buggy one without it.
    let printed: Schedule = shrunk.schedule.to_string().parse().expect("reads back");
    let run = |schedule: Schedule, buggy| {
        let det = lossy().seed(found.seed).schedule(schedule).build();
        (two_writes_a_round(&det, buggy), det.trace())
    };
    assert_eq!(
        run(printed.clone(), true),
        (Err(shrunk.what.clone()), shrunk.trace)
    );
    assert_eq!(run(printed.clone(), false).0, Ok(()));
    assert_eq!(run(Schedule::default(), true).0, Ok(()));
    for i in 0..printed.len() {
        let mut less = printed.clone();
        let gone = less.faults.remove(i);
        assert_eq!(run(less, true).0, Ok(()), "the bug shows without {gone}");
    }
}
