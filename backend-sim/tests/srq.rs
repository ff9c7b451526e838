//! Shared receive queues on the sim, through the verbs-api traits only
//! (`man ibv_create_srq`, `ibv_modify_srq`, `ibv_post_srq_recv`; IBA 10.2.9, 11.6.3.3):
//! FIFO across two QPs, an empty SRQ as an RNR NAK and then delivery, the limit event
//! exactly once, LAST_WQE_REACHED when a QP on the SRQ goes to ERR, size and limit
//! checks, and post_recv refused on a QP with an SRQ.

use std::time::Duration;

use backend_sim::{SimBackend, SimContext, SimCq, SimMr, SimPd, SimQp, SimSrq};
use verbs_api::*;

const WAIT: Duration = Duration::from_secs(5);

/// Two senders on sim0, each connected to its receiver on sim1; both receivers take
/// their receives from one SRQ (on one receive CQ).
struct Rig {
    _sim: SimBackend,
    _c0: SimContext,
    c1: SimContext,
    _pd0: SimPd,
    _pd1: SimPd,
    scq: SimCq,
    rcq: SimCq,
    srq: SimSrq,
    s: [SimQp; 2],
    r: [SimQp; 2],
    smr: SimMr,
    rmr: SimMr,
}

fn rig(srq_attr: SrqAttr, p: &RcParams) -> Rig {
    let sim = SimBackend::default();
    let (c0, c1) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
    let (pd0, pd1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
    let scq = c0.create_cq(64, None).unwrap();
    let rcq = c1.create_cq(64, None).unwrap();
    let srq = pd1.create_srq(&srq_attr).unwrap();
    let cap = QpCap::new(16, 16);
    let s = [(); 2].map(|_| pd0.create_qp(&QpInitAttr::rc(&scq, &scq, cap)).unwrap());
    let r = [(); 2].map(|_| {
        pd1.create_qp(&QpInitAttr::rc(&rcq, &rcq, cap).with_srq(&srq))
            .unwrap()
    });
    for i in 0..2 {
        let es = local_endpoint(&c0, &s[i], p, 10 + i as u32).unwrap();
        let er = local_endpoint(&c1, &r[i], p, 20 + i as u32).unwrap();
        connect_rc(&s[i], p, es.psn, &er).unwrap();
        connect_rc(&r[i], p, er.psn, &es).unwrap();
    }
    let smr = pd0.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let rmr = pd1
        .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    Rig {
        _sim: sim,
        _c0: c0,
        c1,
        _pd0: pd0,
        _pd1: pd1,
        scq,
        rcq,
        srq,
        s,
        r,
        smr,
        rmr,
    }
}

impl Rig {
    /// Posts receives `ids` to the SRQ, 64 bytes each at offset 64 * id.
    fn post(&self, ids: std::ops::Range<u64>) {
        let sges: Vec<[Sge; 1]> = ids
            .clone()
            .map(|i| [self.rmr.sge(64 * i as usize, 64).unwrap()])
            .collect();
        let wrs: Vec<RecvWr<'_>> = ids.zip(&sges).map(|(i, s)| RecvWr::new(i, s)).collect();
        self.srq.post_recv(&wrs).unwrap();
    }

    /// A signaled 8-byte SEND of `byte` from sender `i`.
    fn send(&self, i: usize, id: u64, byte: u8) {
        self.smr.write(id as usize * 8, &[byte; 8]).unwrap();
        let sge = [self.smr.sge(id as usize * 8, 8).unwrap()];
        self.s[i].post_send(&[SendWr::send(id, &sge).signaled()]).unwrap();
    }

    /// `n` receive completions as (wr_id, qp_num, status, first byte received).
    fn received(&self, n: usize) -> Vec<(u64, u32, WcStatus, u8)> {
        poll_n(&self.rcq, n, WAIT)
            .unwrap()
            .into_iter()
            .map(|w| {
                let mut b = [0u8; 1];
                self.rmr.read(64 * w.wr_id as usize, &mut b).unwrap();
                (w.wr_id, w.qp_num, w.status, b[0])
            })
            .collect()
    }

    fn event(&self) -> Option<AsyncEvent> {
        self.c1.get_async_event(Some(Duration::from_millis(300))).unwrap()
    }
}

/// Receives go first in first out whatever QP the message arrived on, each completion
/// naming the QP that received it (the SENDs are waited for one by one, so the order of
/// arrival is known).
#[test]
fn receives_are_taken_in_order_across_qps() {
    let r = rig(SrqAttr::new(16, 1), &RcParams::default());
    r.post(0..4);
    let order = [(1, 0xa1), (0, 0xb2), (0, 0xc3), (1, 0xd4)];
    let mut got = Vec::new();
    for (k, (i, byte)) in order.into_iter().enumerate() {
        r.send(i, k as u64, byte);
        assert!(poll_n(&r.scq, 1, WAIT).unwrap()[0].is_ok());
        got.extend(r.received(1));
    }
    let want: Vec<_> = order
        .iter()
        .enumerate()
        .map(|(k, &(i, byte))| (k as u64, r.r[i].qp_num(), WcStatus::Success, byte))
        .collect();
    assert_eq!(got, want);
    assert_eq!(r.event(), None, "no limit armed, no event");
}

/// An empty SRQ answers RNR (the SEND waits, `rnr_retry` 7), and a receive posted
/// later takes the resend; with `rnr_retry` 0 the SEND fails with RNR_RETRY_EXC_ERR and
/// the sender goes to ERR.
#[test]
fn an_empty_srq_is_an_rnr_nak() {
    let p = RcParams {
        min_rnr_timer: 1,
        ..RcParams::default()
    };
    let r = rig(SrqAttr::new(16, 1), &p);
    r.send(0, 0, 0x11);
    std::thread::sleep(Duration::from_millis(50));
    let mut wc = [WorkCompletion::default(); 1];
    assert_eq!(r.scq.poll(&mut wc).unwrap(), 0, "the SEND waits for a receive");
    assert_eq!(r.rcq.poll(&mut wc).unwrap(), 0);
    r.post(0..1);
    assert!(poll_n(&r.scq, 1, WAIT).unwrap()[0].is_ok());
    assert_eq!(r.received(1), [(0, r.r[0].qp_num(), WcStatus::Success, 0x11)]);

    let p = RcParams {
        rnr_retry: 0,
        min_rnr_timer: 1,
        ..RcParams::default()
    };
    let r = rig(SrqAttr::new(16, 1), &p);
    r.send(1, 0, 0x22);
    let w = poll_n(&r.scq, 1, WAIT).unwrap();
    assert_eq!(w[0].status, WcStatus::RnrRetryExcErr);
    assert_eq!(r.s[1].state().unwrap(), QpState::Err);
    assert_eq!(
        r.r[1].state().unwrap(),
        QpState::Rts,
        "RNR is no error at the responder"
    );
}

/// Post 10, arm the limit at 7: the event comes once, with the receive that leaves 6,
/// names the SRQ, and the limit reads 0 afterwards; re-armed below the count, nothing
/// comes until the next receive is taken.
#[test]
fn the_limit_event_comes_exactly_once() {
    let r = rig(SrqAttr::new(16, 1), &RcParams::default());
    r.post(0..10);
    r.srq
        .modify(&SrqAttr::default().with_limit(7), SrqAttrMask::LIMIT)
        .unwrap();
    assert_eq!(r.srq.query().unwrap().srq_limit, 7);
    for k in 0..3 {
        r.send(k % 2, k as u64, 1);
        r.received(1);
    }
    assert_eq!(r.event(), None, "7 left: not below the limit");
    r.send(1, 3, 1);
    r.received(1);
    let ev = r.event().expect("the limit event");
    assert_eq!(ev.event_type, AsyncEventType::SrqLimitReached);
    assert_eq!(ev.element, AsyncElement::Srq(r.srq.handle()));
    r.c1.ack_async_event(ev);
    assert_eq!(r.srq.query().unwrap().srq_limit, 0, "disarmed");
    r.send(0, 4, 1);
    r.received(1);
    assert_eq!(r.event(), None, "exactly once");
    // 5 left; armed at 8: nothing until a receive is taken.
    r.srq
        .modify(&SrqAttr::default().with_limit(8), SrqAttrMask::LIMIT)
        .unwrap();
    assert_eq!(r.event(), None);
    r.send(0, 5, 1);
    r.received(1);
    let ev = r.event().expect("the re-armed limit");
    assert_eq!(ev.event_type, AsyncEventType::SrqLimitReached);
    r.c1.ack_async_event(ev);
}

/// A limit given at create time is ignored, as `man ibv_create_srq` says and mlx5 does
/// (rxe arms it: `tests/profiles.rs`): nothing comes when the count drops below it.
#[test]
fn a_limit_given_at_create_is_ignored() {
    let r = rig(SrqAttr::new(16, 1).with_limit(2), &RcParams::default());
    assert_eq!(r.srq.query().unwrap(), SrqAttr::new(16, 1));
    r.post(0..2);
    r.send(0, 0, 1);
    r.received(1);
    assert_eq!(r.event(), None);
}

/// A QP on an SRQ that goes to ERR raises LAST_WQE_REACHED (naming it) and flushes
/// nothing of the SRQ's: the other QP still receives from it.
#[test]
fn err_raises_last_wqe_reached_and_leaves_the_srq_to_the_others() {
    let r = rig(SrqAttr::new(16, 1), &RcParams::default());
    r.post(0..2);
    r.r[0]
        .modify(
            &QpAttr {
                qp_state: QpState::Err,
                ..Default::default()
            },
            QpAttrMask::STATE,
        )
        .unwrap();
    let ev = r.event().expect("LAST_WQE_REACHED");
    assert_eq!(ev.event_type, AsyncEventType::QpLastWqeReached);
    assert_eq!(ev.element, AsyncElement::Qp(r.r[0].qp_num()));
    r.c1.ack_async_event(ev);
    let mut wc = [WorkCompletion::default(); 1];
    assert_eq!(r.rcq.poll(&mut wc).unwrap(), 0, "nothing flushed from the SRQ");
    r.send(1, 0, 0x33);
    r.send(1, 1, 0x44);
    assert_eq!(
        r.received(2),
        [
            (0, r.r[1].qp_num(), WcStatus::Success, 0x33),
            (1, r.r[1].qp_num(), WcStatus::Success, 0x44)
        ]
    );
}

/// Size and limit: what the device allows, EINVAL outside it with nothing changed,
/// ENOMEM past the size, resizing up and down to what is queued.
#[test]
fn sizes_limits_and_posting() {
    let r = rig(SrqAttr::new(4, 1), &RcParams::default());
    let caps = r.c1.capabilities().unwrap();
    assert!(caps.srq && caps.srq_resize);
    let dev = r.c1.query_device().unwrap();
    assert!(dev.max_srq_wr > 4 && dev.max_srq_sge >= 1, "{dev:?}");
    let pd = r.c1.alloc_pd().unwrap();
    for bad in [
        SrqAttr::new(0, 1),
        SrqAttr::new(dev.max_srq_wr + 1, 1),
        SrqAttr::new(4, dev.max_srq_sge + 1),
    ] {
        assert_eq!(
            pd.create_srq(&bad).err().map(|e| e.errno()),
            Some(libc::EINVAL),
            "{bad:?}"
        );
    }
    assert_eq!(
        pd.create_srq(&SrqAttr::new(4, 0))
            .unwrap()
            .query()
            .unwrap()
            .max_sge,
        1
    );

    r.post(0..4);
    let sge = [r.rmr.sge(0, 8).unwrap()];
    let e = r.srq.post_recv(&[RecvWr::new(9, &sge)]).unwrap_err();
    assert_eq!((e.index, e.error.errno()), (0, libc::ENOMEM));
    let two = [r.rmr.sge(0, 8).unwrap(), r.rmr.sge(8, 8).unwrap()];
    r.srq.modify(&SrqAttr::new(8, 1), SrqAttrMask::MAX_WR).unwrap();
    let e = r
        .srq
        .post_recv(&[RecvWr::new(8, &sge), RecvWr::new(9, &two)])
        .unwrap_err();
    assert_eq!((e.index, e.wr_id, e.error.errno()), (1, 9, libc::EINVAL));
    // 5 queued now: not below that, not below an armed limit, no limit above the size.
    let before = r.srq.query().unwrap();
    for (a, m) in [
        (SrqAttr::new(4, 1), SrqAttrMask::MAX_WR),
        (SrqAttr::default().with_limit(9), SrqAttrMask::LIMIT),
    ] {
        assert_eq!(r.srq.modify(&a, m).unwrap_err().errno(), libc::EINVAL);
        assert_eq!(r.srq.query().unwrap(), before, "nothing changed");
    }
    r.srq
        .modify(&SrqAttr::default().with_limit(6), SrqAttrMask::LIMIT)
        .unwrap();
    assert_eq!(
        r.srq
            .modify(&SrqAttr::new(5, 1), SrqAttrMask::MAX_WR)
            .unwrap_err()
            .errno(),
        libc::EINVAL,
        "below the armed limit"
    );
    r.srq.modify(&SrqAttr::new(6, 1), SrqAttrMask::MAX_WR).unwrap();
    assert_eq!(r.srq.query().unwrap(), SrqAttr::new(6, 1).with_limit(6));
}

/// `post_recv` on a QP created with an SRQ is EINVAL, and its receive capacities read 0.
#[test]
fn a_qp_with_an_srq_has_no_receive_queue() {
    let r = rig(SrqAttr::new(4, 1), &RcParams::default());
    let sge = [r.rmr.sge(0, 8).unwrap()];
    let e = r.r[0].post_recv(&[RecvWr::new(1, &sge)]).unwrap_err();
    assert_eq!(e.error.errno(), libc::EINVAL);
    assert!(e.error.to_string().contains("ibv_post_srq_recv"), "{}", e.error);
    let cap = r.r[0].query().unwrap().cap;
    assert_eq!((cap.max_recv_wr, cap.max_recv_sge), (0, 0));
}

/// The SRQ lives as long as a QP that uses it: dropping its handle first leaves the QP
/// receiving from it.
#[test]
fn a_qp_keeps_its_srq() {
    let r = rig(SrqAttr::new(4, 1), &RcParams::default());
    r.post(0..1);
    let Rig {
        _sim,
        _c0,
        c1,
        _pd0,
        _pd1,
        scq,
        rcq,
        srq,
        s,
        r: recv,
        smr,
        rmr,
    } = r;
    drop(srq);
    smr.write(0, &[0x55; 8]).unwrap();
    s[0].post_send(&[SendWr::send(0, &[smr.sge(0, 8).unwrap()]).signaled()])
        .unwrap();
    assert!(poll_n(&scq, 1, WAIT).unwrap()[0].is_ok());
    let w = poll_n(&rcq, 1, WAIT).unwrap();
    assert_eq!((w[0].qp_num, w[0].status), (recv[0].qp_num(), WcStatus::Success));
    let mut b = [0u8; 8];
    rmr.read(0, &mut b).unwrap();
    assert_eq!(b, [0x55; 8]);
    drop(c1);
}

/// Destroying an SRQ waits until the event taken for it is acknowledged (bounded: the
/// drop runs on its own thread, so a drop that never returns fails instead of hanging).
#[test]
fn destroying_the_srq_waits_for_the_acknowledgement() {
    const HOLD: Duration = Duration::from_millis(300);
    let r = rig(SrqAttr::new(16, 1), &RcParams::default());
    r.post(0..2);
    r.srq
        .modify(&SrqAttr::default().with_limit(2), SrqAttrMask::LIMIT)
        .unwrap();
    r.send(0, 0, 1);
    r.received(1);
    let ev = r.event().expect("the limit event");
    assert_eq!(ev.element, AsyncElement::Srq(r.srq.handle()));
    let Rig {
        c1, srq, s, r: recv, ..
    } = r;
    drop((s, recv));
    let c1 = std::sync::Arc::new(c1);
    let acker = {
        let c1 = c1.clone();
        std::thread::spawn(move || {
            std::thread::sleep(HOLD);
            c1.ack_async_event(ev);
        })
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        drop(srq);
        let _ = tx.send(t0.elapsed());
    });
    let took = rx
        .recv_timeout(HOLD + WAIT)
        .expect("the SRQ's drop did not return");
    acker.join().unwrap();
    assert!(
        took >= HOLD - Duration::from_millis(10),
        "the SRQ went after {took:?}"
    );
}
