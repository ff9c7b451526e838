//! ACKs under traffic both ways: on an HCA an ACK does not wait behind the other
//! direction's data, so WRITEs both ways on two QP pairs cost no retry. In the sim an
//! ACK used to leave after everything its side had queued before it, and
//! `ib_write_bw -b -q 2 -s 1048576` spent up to 6 of its 7 retries on local ACK timeouts
//! while data moved all along.

use std::time::Duration;

use backend_sim::{SimBackend, SimChannel, SimCq, SimMr};
use verbs_api::*;

const T: Duration = Duration::from_secs(60);
/// The side that streams: WRITEs of 8 MiB, a send queue's worth.
const BIG: usize = 8 << 20;
const BIG_WRS: u64 = 64;
/// The other side: a few WRITEs of 1 MiB, posted once the stream is queued.
const SMALL: usize = 1 << 20;
const SMALL_WRS: u64 = 8;

/// Polls `cq` for `n` completions, sleeping on `ch` when it has none: the test thread
/// leaves the CPUs to the devices' threads, which do all the work.
fn wait(cq: &SimCq, ch: &SimChannel, n: usize) -> Vec<WorkCompletion> {
    let mut got = Vec::new();
    let mut buf = [WorkCompletion::default(); 64];
    while got.len() < n {
        cq.req_notify(false).unwrap();
        let k = cq.poll(&mut buf[..(n - got.len()).min(64)]).unwrap();
        got.extend_from_slice(&buf[..k]);
        if k == 0 {
            assert!(
                ch.get_cq_event(Some(T)).unwrap().is_some(),
                "no completion within {T:?}"
            );
            cq.ack_events(1);
        }
    }
    got
}

/// Each pair's B queues 512 MiB of WRITEs to its A, then A sends 8 MiB the other way
/// and waits for B's ACKs, which B owes while its send queue is still going out. Every
/// WRITE completes, and A's all complete while B's stream has most of its way to go
/// (the ACKs used to leave after B's whole queue: a quarter of a second and more, and
/// A's WRITEs ended in `IBV_WC_RETRY_EXC_ERR` at perftest's default timeout of 67 ms).
/// The order of completions says it, whatever the machine's speed or load.
#[test]
fn acks_pass_the_other_directions_queue_on_two_qps() {
    // B's stream must travel over the connection for its ACKs to have a queue to pass:
    // placed directly (the same-host fast path), its WRITEs would complete at once.
    std::env::set_var(backend_sim::onesided::owner::SETTING, "off");
    let sim = SimBackend::default();
    let (c0, c1) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
    let (pd0, pd1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
    let (ch0, ch1) = (
        c0.create_comp_channel().unwrap(),
        c1.create_comp_channel().unwrap(),
    );
    let cq0 = c0.create_cq(256, Some(&ch0)).unwrap();
    let cq1 = c1.create_cq(256, Some(&ch1)).unwrap();
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
    let small = wait(&cq0, &ch0, 2 * SMALL_WRS as usize);
    // B's completions so far: its stream is still on its way.
    let mut buf = [WorkCompletion::default(); 256];
    let early = cq1.poll(&mut buf).unwrap();
    let mut big = buf[..early].to_vec();
    big.extend(wait(&cq1, &ch1, 2 * BIG_WRS as usize - early));
    let failed: Vec<_> = small
        .iter()
        .chain(&big)
        .filter(|w| !w.is_ok())
        .map(|w| (w.qp_num, w.wr_id, w.status))
        .collect();
    assert!(
        failed.is_empty(),
        "{} WRITEs failed, the first {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    // ACKs queued behind B's stream complete A's WRITEs after 127-128 of B's 128; passing
    // it, after a few (2-6 on a quiet machine, up to about 66 when other test binaries
    // share the two CPUs and B's threads run ahead of A's): three quarters tells the two
    // apart without depending on the scheduler.
    assert!(
        early < 3 * BIG_WRS as usize / 2,
        "A's WRITEs completed after {early} of B's {} (ACKs waited behind B's queue)",
        2 * BIG_WRS
    );
}
