//! WRs posted before the sim's connection between two QPs is up: an HCA has nothing to
//! set up after RTS, so a program may post at once (perftest posts its whole window right
//! after its handshake), and the sim sets its connection up meanwhile. The WRs posted
//! while there is none are processed (their local checks run) and lost on the way; once
//! the connection is up they go over it, each once, in order, without waiting for the
//! local ACK timeout. Checked with an infinite timeout (`timeout` 0), so that only the
//! connection's start can send them, on both sides of a pair: the one that sets the
//! connection up and the one that accepts it.
use std::time::Duration;

use backend_sim::{SimBackend, SimCq, SimPd, SimQp};
use verbs_api::*;

const WRS: usize = 48;

/// `requester_connects`: whether the QP that posts is the one that sets the connection up
/// (the smaller (GID, LID, QPN)). Its peer reaches RTR only after the WRs are posted.
fn early_writes_arrive_once_connected(requester_connects: bool) {
    let sim = SimBackend::default();
    let (c0, c1) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
    let (pd0, pd1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
    let (cq0, cq1) = (c0.create_cq(64, None).unwrap(), c1.create_cq(64, None).unwrap());
    let cap = QpCap::new(64, 4);
    let q0 = pd0.create_qp(&QpInitAttr::rc(&cq0, &cq0, cap)).unwrap();
    let q1 = pd1.create_qp(&QpInitAttr::rc(&cq1, &cq1, cap)).unwrap();
    // Infinite local ACK timeout: no resend by the timer.
    let p = RcParams {
        timeout: 0,
        ..RcParams::default()
    };
    let e0 = local_endpoint(&c0, &q0, &p, 1).unwrap();
    let e1 = local_endpoint(&c1, &q1, &p, 2).unwrap();
    let zero_connects = (e0.gid, e0.lid, e0.qpn) < (e1.gid, e1.lid, e1.qpn);
    type Side<'a> = (&'a SimQp, &'a SimPd, &'a SimCq, Endpoint);
    let (req, resp): (Side, Side) = if zero_connects == requester_connects {
        ((&q0, &pd0, &cq0, e0), (&q1, &pd1, &cq1, e1))
    } else {
        ((&q1, &pd1, &cq1, e1), (&q0, &pd0, &cq0, e0))
    };
    let src = req.1.reg_mr(WRS * 8, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = resp
        .1
        .reg_mr(WRS * 8, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    for i in 0..WRS {
        src.write_u64(i * 8, 0x1000 + i as u64).unwrap();
    }
    connect_rc(req.0, &p, req.3.psn, &resp.3).unwrap();
    // One post per WR, as perftest posts, all before the peer can take a connection.
    for i in 0..WRS {
        let sge = [src.sge(i * 8, 8).unwrap()];
        req.0
            .post_send(&[SendWr::write(i as u64, &sge, dst.remote().at(i as u64 * 8)).signaled()])
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(20));
    assert!(
        poll_quiet(req.2, Duration::from_millis(1)).unwrap().is_empty(),
        "nothing completes before the peer is there"
    );
    connect_rc(resp.0, &p, resp.3.psn, &req.3).unwrap();
    let wcs = poll_n(req.2, WRS, Duration::from_secs(10)).unwrap();
    let ids: Vec<u64> = wcs.iter().map(|w| w.wr_id).collect();
    assert_eq!(ids, (0..WRS as u64).collect::<Vec<_>>(), "in order, once each");
    assert!(wcs.iter().all(|w| w.is_ok()), "{wcs:?}");
    for i in 0..WRS {
        assert_eq!(dst.read_u64(i * 8).unwrap(), 0x1000 + i as u64, "WRITE {i}");
    }
    assert!(
        poll_quiet(req.2, Duration::from_millis(50)).unwrap().is_empty(),
        "no completion twice"
    );
    assert!(
        poll_quiet(resp.2, Duration::from_millis(1)).unwrap().is_empty(),
        "WRITEs complete nothing at the responder"
    );
}

#[test]
fn writes_posted_before_the_connection_arrive_once_when_this_side_sets_it_up() {
    early_writes_arrive_once_connected(true);
}

#[test]
fn writes_posted_before_the_connection_arrive_once_when_the_peer_sets_it_up() {
    early_writes_arrive_once_connected(false);
}
