//! Shared receive queues in the deterministic world (`man ibv_create_srq`,
//! `ibv_post_srq_recv`, `ibv_modify_srq`): two clients SEND to two server QPs that take
//! their receives from one SRQ, over a network that loses, duplicates and reorders
//! frames. Each message lands once, in the receive the SRQ hands out first in first out
//! whichever QP it arrived on, and the armed limit raises `IBV_EVENT_SRQ_LIMIT_REACHED`
//! once, when fewer receives than the limit are left (IBA 10.2.9, 11.5.2.4).

mod common;

use std::time::Duration;

use backend_sim_det::harness::check_seeds;
use backend_sim_det::Det;
use verbs_api::{
    connect_rc, local_endpoint, AsyncElement, AsyncEventType, Backend, Context, MemoryRegion,
    ProtectionDomain, QpCap, QpInitAttr, QpType, QueuePair, RcParams, RecvWr, SendWr, SharedReceiveQueue,
    SrqAttr, SrqAttrMask, WcOpcode,
};

/// Receives the server posts to its SRQ, and messages the clients send (each half).
const RECVS: u64 = 8;
/// The SRQ's limit: the event comes once fewer than this are left, after the
/// `RECVS - LIMIT + 1`-th message took its receive.
const LIMIT: u32 = 3;
/// Bytes per message: one packet, so that the server's CQ lists the receives in the
/// order they were taken.
const LEN: usize = 64;

fn payload(i: u64) -> Vec<u8> {
    (0..LEN).map(|k| (k as u64 * 3 + i * 29 + 7) as u8).collect()
}

/// The clients' SENDs alternate between them; the server's receives complete in the
/// SRQ's order, each holding the message it took, and the limit event comes once.
fn two_qps_on_one_srq<B: Backend>(b: &B) -> Result<(), String> {
    let e = |x: verbs_api::Error| x.to_string();
    let server = common::side(b, "server").map_err(e)?;
    let srq = server.pd.create_srq(&SrqAttr::new(16, 1)).map_err(e)?;
    let params = RcParams {
        timeout: 10,
        ..RcParams::default()
    };
    let mut clients = Vec::new();
    let mut on_srq = Vec::new();
    for (n, name) in ["c0", "c1"].into_iter().enumerate() {
        let client = common::side(b, name).map_err(e)?;
        // The server's QP for this client takes its receives from the SRQ.
        let attr = QpInitAttr::new(QpType::Rc, &server.cq, &server.cq, QpCap::default()).with_srq(&srq);
        let qp = server.pd.create_qp(&attr).map_err(e)?;
        let ec = local_endpoint(&client.ctx, &client.qp, &params, 100 + n as u32).map_err(e)?;
        let es = local_endpoint(&server.ctx, &qp, &params, 9000 + n as u32).map_err(e)?;
        connect_rc(&qp, &params, es.psn, &ec).map_err(e)?;
        connect_rc(&client.qp, &params, ec.psn, &es).map_err(e)?;
        clients.push(client);
        on_srq.push(qp);
    }
    for i in 0..RECVS {
        let sge = [server.mr.sge(i as usize * LEN, LEN).map_err(e)?];
        srq.post_recv(&[RecvWr::new(i, &sge)])
            .map_err(|x| x.to_string())?;
    }
    srq.modify(&SrqAttr::default().with_limit(LIMIT), SrqAttrMask::LIMIT)
        .map_err(e)?;
    for i in 0..RECVS {
        let c = &clients[(i % 2) as usize];
        c.mr.write(0, &payload(i)).map_err(e)?;
        let sge = [c.mr.sge(0, LEN).map_err(e)?];
        c.qp.post_send(&[SendWr::send(i, &sge).signaled()])
            .map_err(|x| x.to_string())?;
        // One message at a time: the next is posted once this one is acknowledged, so
        // they reach the SRQ in the order sent.
        common::wait_ok(c, 1)?;
    }
    let recvs = common::wait_ok(&server, RECVS as usize)?;
    for (k, w) in recvs.iter().enumerate() {
        let k = k as u64;
        let qp = &on_srq[(k % 2) as usize];
        if w.wr_id != k || w.opcode != WcOpcode::Recv || w.qp_num != qp.qp_num() || w.byte_len as usize != LEN
        {
            return Err(format!(
                "message {k}, on QP {:#x}: completed as {w:?}, not in receive {k}",
                qp.qp_num()
            ));
        }
        let mut got = vec![0u8; LEN];
        server.mr.read(k as usize * LEN, &mut got).map_err(e)?;
        if got != payload(k) {
            return Err(format!("receive {k} holds {got:?}, not message {k}"));
        }
    }
    let wait = Some(Duration::from_millis(10));
    let ev = server
        .ctx
        .get_async_event(wait)
        .map_err(e)?
        .ok_or("no SRQ_LIMIT_REACHED")?;
    let got = (ev.event_type, ev.element);
    server.ctx.ack_async_event(ev);
    if got != (AsyncEventType::SrqLimitReached, AsyncElement::Srq(srq.handle())) {
        return Err(format!("the event: {got:?}"));
    }
    if let Some(again) = server.ctx.get_async_event(wait).map_err(e)? {
        return Err(format!("a second event: {again}"));
    }
    if srq.query().map_err(e)?.srq_limit != 0 {
        return Err("the limit is still armed after its event".into());
    }
    Ok(())
}

#[test]
fn each_message_takes_the_srqs_oldest_receive_once_and_the_limit_fires_once() {
    let world = Det::builder()
        .hosts(["server", "c0", "c1"])
        .loss(5)
        .dup(5)
        .jitter(Duration::from_micros(20));
    check_seeds(&world, 0..50, two_qps_on_one_srq).unwrap_or_else(|f| panic!("{f}"));
}
