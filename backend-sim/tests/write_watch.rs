//! An RDMA WRITE ping-pong whose sides watch memory instead of a CQ, as `ib_write_lat`
//! does: each side waits for the peer's WRITE to change the last word of its buffer,
//! then WRITEs back and polls its CQ in a tight loop for its own completion. That poll
//! drives the device; then the thread spins on memory and polls no more, so whatever
//! its last poll left unread (the rest of a message larger than a loopback segment, a
//! WRITE that came after the ACK) waits for the progress thread. That thread must look
//! soon after the last poll (`Progress::nap`), not after the grace period
//! (`RDMA_SIM_GRACE_US`, here half a second): it used to, and every round took the
//! grace period or the requester's ACK timeout (67 ms here).
//!
//! Its own test binary: it sets `RDMA_SIM_GRACE_US` for the whole process.

mod common;

use std::time::{Duration, Instant};

use common::{Pair, WAIT};
use verbs_api::*;

const SIZE: usize = 256 << 10;
const ROUNDS: u64 = 21;
const GRACE: Duration = Duration::from_millis(500);

/// One side's rounds; the times from its post to the peer's answer in memory.
fn side<Q: QueuePair, C: CompletionQueue, M: MemoryRegion>(
    qp: &Q,
    cq: &C,
    mr: &M,
    peer: RemoteMr,
    starts: bool,
) -> Vec<Duration> {
    // The region's first half is sent from, the second half is written by the peer.
    let mine = SIZE - 8;
    let theirs = 2 * SIZE - 8;
    let mut times = Vec::new();
    let mut posted = None;
    for r in 1..=ROUNDS {
        if r > 1 || !starts {
            let t = Instant::now();
            while mr.read_u64(theirs).unwrap() != r - u64::from(starts) {
                assert!(t.elapsed() < WAIT, "round {r}: the peer's WRITE never arrived");
                std::hint::spin_loop();
            }
            if let Some(p) = posted.take() {
                times.push(Instant::now().duration_since(p));
            }
        }
        mr.write_u64(mine, r).unwrap();
        posted = Some(Instant::now());
        qp.post_send(&[SendWr::write(r, &[mr.sge(0, SIZE).unwrap()], peer.at(SIZE as u64)).signaled()])
            .unwrap();
        let w = poll_n(cq, 1, WAIT).unwrap_or_else(|e| panic!("round {r}: WRITE lost: {e}"));
        assert!(w[0].is_ok(), "round {r}: {w:?}");
    }
    times
}

#[test]
fn a_large_write_reaches_a_side_that_watches_memory_without_waiting_for_the_grace_period() {
    // The only test of this binary, run before any device exists: no other thread reads
    // the environment meanwhile.
    std::env::set_var("RDMA_SIM_GRACE_US", GRACE.as_micros().to_string());
    let p = Pair::new(&RcParams::default(), QpCap::new(4, 4));
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let (m0, m1) = (
        p.pd0.reg_mr(2 * SIZE, access).unwrap(),
        p.pd1.reg_mr(2 * SIZE, access).unwrap(),
    );
    let (r0, r1) = (m0.remote(), m1.remote());
    // As perftest: the server sends its first WRITE without waiting; the client waits
    // for it before its own first.
    let (client, server) = std::thread::scope(|s| {
        let server = s.spawn(|| side(&p.b, &p.cq1, &m1, r0, true));
        let client = side(&p.a, &p.cq0, &m0, r1, false);
        (client, server.join().unwrap())
    });
    for (who, mut t) in [("client", client), ("server", server)] {
        t.sort();
        let median = t[t.len() / 2];
        assert!(
            median < GRACE / 10,
            "{who}: the median round took {median:?} (grace period {GRACE:?}): {t:?}"
        );
    }
}
