//! One application thread that alternates between the CQs of two devices (the shape of
//! most tests with both ends in one process). While it polls one device's CQ in a tight
//! loop it drives that device, whose progress thread sleeps; when it moves to the other
//! device's CQ, the first must be handed back to its progress thread at once, not when
//! that thread next looks (the driving window plus `RDMA_SIM_GRACE_US`, here 30 s): an
//! ACK it deferred, a READ or a SEND addressed to it would wait that long.
//!
//! Its own test binary: it sets `RDMA_SIM_GRACE_US` for the whole process.

mod common;

use common::{read_back, read_mrs, Pair, WAIT};
use verbs_api::*;

#[test]
fn a_thread_that_moves_to_another_device_hands_the_first_back() {
    // The only test of this binary, run before any device exists: no other thread reads
    // the environment meanwhile.
    std::env::set_var("RDMA_SIM_GRACE_US", "30000000");
    let p = Pair::new(&RcParams::default(), QpCap::new(16, 16));
    let (cq0, cq1, a, b) = (&p.cq0, &p.cq1, &p.a, &p.b);
    let (mra, mrb) = read_mrs(&p.pd0, &p.pd1);

    for i in 0..200u64 {
        // The receive completes while this thread drives sim1, which then leaves its
        // ACK for this thread's next poll there (delayed ACK); the next poll is on sim0.
        b.post_recv(&[RecvWr::new(i, &[mrb.sge(0, 8).unwrap()])]).unwrap();
        a.post_send(&[SendWr::send(i, &[mra.sge(8, 8).unwrap()]).signaled()])
            .unwrap();
        let w = poll_n(cq1, 1, WAIT).unwrap_or_else(|e| panic!("round {i}: receive lost: {e}"));
        assert!(w[0].is_ok() && w[0].opcode == WcOpcode::Recv, "{w:?}");
        let w = poll_n(cq0, 1, WAIT).unwrap_or_else(|e| panic!("round {i}: SEND not acknowledged: {e}"));
        assert!(w[0].is_ok() && w[0].opcode == WcOpcode::Send, "{w:?}");
        // Drive sim1 again (a poll that finds nothing), then READ from it: its progress
        // thread must serve the READ while this thread polls sim0.
        for _ in 0..4 {
            assert_eq!(cq1.poll(&mut [WorkCompletion::default(); 1]).unwrap(), 0);
        }
        read_back(a, cq0, &mra, &mrb, 64, i, &format!("round {i}: READ"));
    }
}
