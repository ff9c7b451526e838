//! A port taken down on one device, seen from a QP on another (IBA 9.7.6.1.3: requests
//! without an answer are resent `retry_cnt` times; a port back in time loses nothing):
//! the requester on the healthy device retries through the dead link and ends in
//! RETRY_EXC_ERR, or completes once the port is back; its datagrams to the device are
//! lost and complete SUCCESS.

use std::time::Duration;

use backend_sim::{SimBackend, SimContext, SimCq, SimPd, SimQp};
use verbs_api::*;

mod common;

use common::PairSpec;

const T: Duration = Duration::from_secs(10);

struct Pair {
    a_ctx: SimContext,
    b_ctx: SimContext,
    pd_a: SimPd,
    pd_b: SimPd,
    cq_a: SimCq,
    cq_b: SimCq,
    a: SimQp,
    b: SimQp,
}

/// A on sim0, B on sim1, connected, A's `timeout` and `retry_cnt` as given.
fn pair(timeout: u8, retry_cnt: u8) -> Pair {
    let spec = PairSpec {
        a: RcParams {
            timeout,
            retry_cnt,
            ..RcParams::default()
        },
        psns: (10, 20),
        ..PairSpec::new(&RcParams::default(), QpCap::new(16, 16))
    };
    let common::Pair {
        c0: a_ctx,
        c1: b_ctx,
        pd0: pd_a,
        pd1: pd_b,
        cq0: cq_a,
        cq1: cq_b,
        a,
        b,
        ..
    } = common::Pair::build(spec, |_, _| {});
    Pair {
        a_ctx,
        b_ctx,
        pd_a,
        pd_b,
        cq_a,
        cq_b,
        a,
        b,
    }
}

fn port_event(ctx: &SimContext, want: AsyncEventType) {
    let ev = ctx.get_async_event(Some(T)).unwrap().expect("an event");
    assert_eq!((ev.event_type, ev.element), (want, AsyncElement::Port(1)));
    ctx.ack_async_event(ev);
}

#[test]
fn a_peer_whose_port_stays_down_ends_in_retry_exceeded() {
    let p = pair(12, 2);
    let src = p.pd_a.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = p
        .pd_b
        .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    p.a.post_send(&[SendWr::write(1, &[src.sge_all()], dst.remote().at(0)).signaled()])
        .unwrap();
    assert!(poll_n(&p.cq_a, 1, T).unwrap()[0].is_ok());
    p.b_ctx.faults().port_down().unwrap();
    port_event(&p.b_ctx, AsyncEventType::PortErr);
    assert_eq!(p.b_ctx.query_port(1).unwrap().state, PortState::Down);
    assert_eq!(p.a_ctx.query_port(1).unwrap().state, PortState::Active);
    p.a.post_send(&[SendWr::write(2, &[src.sge_all()], dst.remote().at(0)).signaled()])
        .unwrap();
    let wc = poll_n(&p.cq_a, 1, T).unwrap();
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::RetryExcErr), "{wc:?}");
    assert_eq!(p.a.state().unwrap(), QpState::Err);
    p.b_ctx.faults().port_up().unwrap();
    port_event(&p.b_ctx, AsyncEventType::PortActive);
}

#[test]
fn a_peer_whose_port_returns_in_time_loses_nothing() {
    let p = pair(14, 7);
    let src = p.pd_a.reg_mr(8192, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = p.pd_b.reg_mr(8192, AccessFlags::LOCAL_WRITE).unwrap();
    let data: Vec<u8> = (0..8192u32).map(|i| (i % 253) as u8).collect();
    src.write(0, &data).unwrap();
    for i in 0..2 {
        p.b.post_recv(&[RecvWr::new(i, &[dst.sge(i as usize * 4096, 4096).unwrap()])])
            .unwrap();
    }
    p.b_ctx.faults().port_down().unwrap();
    for i in 0..2 {
        p.a.post_send(&[SendWr::send(i, &[src.sge(i as usize * 4096, 4096).unwrap()]).signaled()])
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(150));
    assert!(
        poll_quiet(&p.cq_a, Duration::ZERO).unwrap().is_empty(),
        "nothing completes while the port is down"
    );
    p.b_ctx.faults().port_up().unwrap();
    let s = poll_n(&p.cq_a, 2, T).unwrap();
    let r = poll_n(&p.cq_b, 2, T).unwrap();
    for (i, (s, r)) in s.iter().zip(&r).enumerate() {
        assert_eq!((s.wr_id, s.status), (i as u64, WcStatus::Success), "{s:?}");
        assert_eq!(
            (r.wr_id, r.status, r.byte_len),
            (i as u64, WcStatus::Success, 4096),
            "{r:?}"
        );
    }
    assert!(dst.to_vec() == data, "the payload differs");
    assert!(
        poll_quiet(&p.cq_b, Duration::from_millis(100))
            .unwrap()
            .is_empty(),
        "a SEND delivered twice"
    );
}

#[test]
fn datagrams_to_a_device_whose_port_is_down_are_lost() {
    let sim = SimBackend::default();
    let a_ctx = sim.open("sim0").unwrap();
    let b_ctx = sim.open("sim1").unwrap();
    let (pd_a, pd_b) = (a_ctx.alloc_pd().unwrap(), b_ctx.alloc_pd().unwrap());
    let (cq_a, cq_b) = (
        a_ctx.create_cq(64, None).unwrap(),
        b_ctx.create_cq(64, None).unwrap(),
    );
    let a = common::ud_qp(&pd_a, &cq_a, 7);
    let b = common::ud_qp(&pd_b, &cq_b, 7);
    let eb = local_endpoint(&b_ctx, &b, &RcParams::default(), 0).unwrap();
    let ah = pd_a.create_ah(&ah_attr_for(&eb, &RcParams::default())).unwrap();
    let src = pd_a.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = pd_b.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let send = |id| {
        a.post_send(&[SendWr::send(id, &[src.sge_all()])
            .signaled()
            .ud(&ah, b.qp_num(), 7)])
            .unwrap();
        let wc = poll_n(&cq_a, 1, T).unwrap();
        assert_eq!((wc[0].wr_id, wc[0].status), (id, WcStatus::Success), "{wc:?}");
    };
    b.post_recv(&[RecvWr::new(1, &[dst.sge(0, 1024).unwrap()])])
        .unwrap();
    send(1);
    assert_eq!(poll_n(&cq_b, 1, T).unwrap()[0].status, WcStatus::Success);
    b.post_recv(&[RecvWr::new(2, &[dst.sge(1024, 1024).unwrap()])])
        .unwrap();
    b_ctx.faults().port_down().unwrap();
    send(2);
    assert!(
        poll_quiet(&cq_b, Duration::from_millis(200)).unwrap().is_empty(),
        "a datagram arrived at a port that is down"
    );
    b_ctx.faults().port_up().unwrap();
    send(3);
    let r = poll_n(&cq_b, 1, T).unwrap();
    assert_eq!((r[0].wr_id, r[0].status), (2, WcStatus::Success), "{r:?}");
}
