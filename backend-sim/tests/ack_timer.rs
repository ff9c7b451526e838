//! The local ACK timer under load: WRITEs both ways on two QP pairs cost no retry (no
//! local ACK timeout, `SimContext::counters`), as on an HCA, whose ACKs do not wait
//! behind the other direction's data and whose timer restarts on every ACK that
//! advances. `ib_write_bw -b -q 2 -s 1048576` spent up to 6 of its 7 retries on local ACK
//! timeouts while data moved all along.

use std::time::Duration;

use backend_sim::{SimBackend, SimMr};
use verbs_api::*;

const T: Duration = Duration::from_secs(60);
/// The side that streams: WRITEs of 8 MiB, a send queue's worth.
const BIG: usize = 8 << 20;
const BIG_WRS: u64 = 64;
/// The other side: a few WRITEs of 1 MiB, posted once the stream is queued.
const SMALL: usize = 1 << 20;
const SMALL_WRS: u64 = 8;

/// Each pair's B queues 512 MiB of WRITEs to its A, then A sends 8 MiB the other way
/// and waits for the ACKs, which B owes while its whole send queue is still going out
/// (they used to leave after it: a quarter second and more, against perftest's default
/// timeout of 67 ms). Every WRITE completes, and neither device counts a timeout.
#[test]
fn writes_both_ways_on_two_qps_cost_no_retries() {
    let sim = SimBackend::default();
    let (c0, c1) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
    let (pd0, pd1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
    let (cq0, cq1) = (c0.create_cq(256, None).unwrap(), c1.create_cq(256, None).unwrap());
    let p = RcParams::default();
    assert_eq!(p.timeout, 14, "perftest's timeout: 67 ms");
    let cap = QpCap::new(BIG_WRS as u32, 1);
    let remote = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mut pairs = Vec::new();
    for i in 0..2u32 {
        let a = pd0.create_qp(&QpInitAttr::rc(&cq0, &cq0, cap)).unwrap();
        let b = pd1.create_qp(&QpInitAttr::rc(&cq1, &cq1, cap)).unwrap();
        let ea = local_endpoint(&c0, &a, &p, 100 * i + 1).unwrap();
        let eb = local_endpoint(&c1, &b, &p, 100 * i + 2).unwrap();
        connect_rc(&a, &p, ea.psn, &eb).unwrap();
        connect_rc(&b, &p, eb.psn, &ea).unwrap();
        let mrs: [SimMr; 4] = [
            pd0.reg_mr(SMALL, AccessFlags::LOCAL_WRITE).unwrap(),
            pd0.reg_mr(BIG, remote).unwrap(),
            pd1.reg_mr(BIG, AccessFlags::LOCAL_WRITE).unwrap(),
            pd1.reg_mr(SMALL, remote).unwrap(),
        ];
        pairs.push((a, b, mrs));
    }
    for (_, b, [_, a_dst, b_src, _]) in &pairs {
        let sge = [b_src.sge_all()];
        let wrs: Vec<_> = (0..BIG_WRS)
            .map(|id| SendWr::write(id, &sge, a_dst.remote().at(0)).signaled())
            .collect();
        b.post_send(&wrs).unwrap();
    }
    for (a, _, [a_src, _, _, b_dst]) in &pairs {
        let sge = [a_src.sge_all()];
        let wrs: Vec<_> = (0..SMALL_WRS)
            .map(|id| SendWr::write(id, &sge, b_dst.remote().at(0)).signaled())
            .collect();
        a.post_send(&wrs).unwrap();
    }
    let small = poll_n(&cq0, 2 * SMALL_WRS as usize, T).unwrap();
    let big = poll_n(&cq1, 2 * BIG_WRS as usize, T).unwrap();
    let failed: Vec<_> = small
        .iter()
        .chain(&big)
        .filter(|w| !w.is_ok())
        .map(|w| (w.qp_num, w.wr_id, w.status))
        .collect();
    assert!(
        failed.is_empty(),
        "{} WRITEs failed, first {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    for (dev, ctx) in [("sim0", &c0), ("sim1", &c1)] {
        assert_eq!(
            ctx.counters().local_ack_timeout_err,
            0,
            "{dev} counted local ACK timeouts"
        );
    }
}
