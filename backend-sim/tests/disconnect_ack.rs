//! A responder that executed a request acknowledges it even when its application moves
//! the QP to ERR right after (what `rdma_disconnect` does): the requester's SEND
//! completes successfully, as on an HCA, whose ACK left when the packet arrived. The sim
//! may hold an ACK back to leave with the application's answer; moving to ERR must send
//! it, not forget it (`fi_pingpong -e msg` met `IBV_WC_RETRY_EXC_ERR` on its last SEND
//! when the peer disconnected at once).

mod common;

use std::time::Duration;

use verbs_api::*;

#[test]
fn a_send_the_peer_received_completes_when_the_peer_disconnects_at_once() {
    for round in 0..40 {
        let p = RcParams {
            // A forgotten ACK is never sent, so any timeout shows it as RETRY_EXC_ERR;
            // 268 ms and two retries keep a loaded machine's scheduling (threads off the
            // CPU for tens of milliseconds beside a CPU hog) from looking like one.
            timeout: 16,
            retry_cnt: 2,
            ..RcParams::default()
        };
        let t = common::Pair::new(&p, QpCap::new(4, 4));
        let src = t.pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        let dst = t.pd1.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
        t.b.post_recv(&[RecvWr::new(1, &[dst.sge(0, 64).unwrap()])])
            .unwrap();
        t.a.post_send(&[SendWr::send(2, &[src.sge(0, 8).unwrap()]).signaled()])
            .unwrap();
        let r = poll_n(&t.cq1, 1, Duration::from_secs(5)).expect("the SEND arrives");
        assert!(r[0].is_ok(), "round {round}: {r:?}");
        // The receiver's application disconnects as soon as it has the message.
        let err = QpAttr {
            qp_state: QpState::Err,
            ..Default::default()
        };
        t.b.modify(&err, QpAttrMask::STATE).unwrap();
        let s = poll_n(&t.cq0, 1, Duration::from_secs(5)).expect("the SEND completes");
        assert_eq!(
            (s[0].wr_id, s[0].status),
            (2, WcStatus::Success),
            "round {round}: the peer received the SEND, yet it completed {s:?}"
        );
    }
}
