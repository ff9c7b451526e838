use proptest::prelude::*;
use verbs_api::timers::local_ack_timeout;
use verbs_api::{
    AccessFlags, AhAttr, AsyncEventType, Mtu, QpAttr, QpAttrMask as M, QpCap, QpState, QpType, RecvWr,
    SendWr, WcStatus,
};

use super::*;
use crate::memory::MrTable;

/// An address check that takes every address vector (the driver's checks its GID table).
struct AnyAv;

impl AvCheck for AnyAv {
    fn check_av(&self, _: &AhAttr) -> std::result::Result<(), (&'static str, String)> {
        Ok(())
    }
}

const LIMITS: QpLimits = QpLimits {
    max_qp_init_rd_atom: 16,
    max_qp_rd_atom: 16,
};

struct Rig {
    qp: Qp,
}

impl Rig {
    fn new(qp_type: QpType, sw: Switches) -> Rig {
        let cap = QpCap::new(8, 8);
        Rig {
            qp: Qp::new(
                qp_type,
                cap,
                sw,
                Requester::new(1, 1, &cap, true).with_profile(sw, 1 << 30, 4096),
                Responder::new(1, 1, cap.max_recv_wr, cap.max_recv_sge).with_switches(sw),
            ),
        }
    }

    fn modify(&mut self, attr: &QpAttr, mask: M) -> verbs_api::Result<Transition> {
        self.qp.handle_modify(attr, mask, &LIMITS, &AnyAv)
    }

    fn to(&mut self, state: QpState) -> Transition {
        let (attr, mask) = full(self.qp.qp_type(), self.qp.state(), state);
        self.modify(&attr, mask).unwrap()
    }
}

/// Attribute values every check accepts.
fn good_attr(state: QpState) -> QpAttr {
    QpAttr {
        qp_state: state,
        port_num: 1,
        qp_access_flags: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        path_mtu: Mtu::Mtu1024,
        dest_qp_num: 2,
        rq_psn: 100,
        sq_psn: 200,
        timeout: 14,
        retry_cnt: 3,
        rnr_retry: 3,
        min_rnr_timer: 12,
        max_rd_atomic: 3,
        max_dest_rd_atomic: 3,
        qkey: 0x11,
        ..Default::default()
    }
}

/// The transition `cur -> next` with exactly its required attributes.
fn full(qp_type: QpType, cur: QpState, next: QpState) -> (QpAttr, M) {
    let (required, _) = verbs_api::transitions::transition_masks(cur, next, qp_type).expect("a transition");
    (good_attr(next), M::STATE | required)
}

#[test]
fn rc_bring_up_connects_and_arms_the_halves() {
    let mut r = Rig::new(QpType::Rc, Switches::default());
    assert_eq!(r.to(QpState::Init).effect, Effect::None);
    let t = r.to(QpState::Rtr);
    assert_eq!(
        (t.from, t.to, t.effect),
        (QpState::Init, QpState::Rtr, Effect::Connect)
    );
    assert_eq!(r.qp.resp.expected_psn(), 100);
    assert_eq!(r.qp.req.dest_qpn, 2);
    assert_eq!(r.qp.req.link_error, libc::ENOTCONN as u32);
    assert_eq!(r.to(QpState::Rts).effect, Effect::None);
    assert_eq!(r.qp.req.next_psn(), 200);
    assert_eq!(r.qp.req.attrs().retry_cnt, 3);
    let q = r.qp.query();
    assert_eq!((q.qp_state, q.sq_psn, q.rq_psn), (QpState::Rts, 200, 100));
}

#[test]
fn ud_rtr_connects_nothing() {
    let mut r = Rig::new(QpType::Ud, Switches::default());
    r.to(QpState::Init);
    assert_eq!(r.to(QpState::Rtr).effect, Effect::None);
    assert_eq!(r.qp.state(), QpState::Rtr);
}

#[test]
fn values_out_of_range_are_refused_by_name() {
    let mut r = Rig::new(QpType::Rc, Switches::default());
    r.to(QpState::Init);
    let (mut attr, mask) = full(QpType::Rc, QpState::Init, QpState::Rtr);
    attr.max_dest_rd_atomic = 17;
    match r.modify(&attr, mask) {
        Err(verbs_api::Error::InvalidAttr { name, .. }) => assert_eq!(name, "max_dest_rd_atomic"),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.qp.state(), QpState::Init);
}

#[test]
fn rd_atomic_rounds_up_where_the_device_does() {
    let sw = Switches {
        rd_atomic_pow2: true,
        ..Switches::default()
    };
    let mut r = Rig::new(QpType::Rc, sw);
    r.to(QpState::Init);
    r.to(QpState::Rtr);
    assert_eq!(r.qp.attr().max_dest_rd_atomic, 4);
    assert_eq!(r.qp.resp.max_dest_rd_atomic, 4);
}

#[test]
fn sqd_owes_the_drained_event_only_when_asked() {
    for (asked, due) in [(false, false), (true, true)] {
        let mut r = Rig::new(QpType::Rc, Switches::default());
        for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
            r.to(s);
        }
        let attr = QpAttr {
            qp_state: QpState::Sqd,
            en_sqd_async_notify: asked,
            ..Default::default()
        };
        r.modify(&attr, M::STATE | M::EN_SQD_ASYNC_NOTIFY).unwrap();
        assert!(r.qp.req.draining);
        assert_eq!(r.qp.sqd_event_due(), due);
        // Nothing in flight: drained at once, and the event comes once.
        assert_eq!(r.qp.check_drained(), due);
        assert!(!r.qp.check_drained());
        let events: Vec<_> = r.qp.poll_events().map(|e| e.event_type).collect();
        assert_eq!(
            events,
            if due {
                vec![AsyncEventType::SqDrained]
            } else {
                vec![]
            }
        );
        let t = r.to(QpState::Rts);
        assert_eq!(t.effect, Effect::Resume { start: false });
        assert!(!r.qp.req.draining);
    }
}

/// SQD -> SQD changes the requester's budget (`timeout`, `retry_cnt`, `rnr_retry`,
/// `max_rd_atomic`), which the WQEs sent after it count against; the PSNs stay.
#[test]
fn sqd_to_sqd_changes_the_requesters_budget() {
    let mut r = Rig::new(QpType::Rc, Switches::default());
    for s in [QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd] {
        r.to(s);
    }
    let psn = r.qp.req.next_psn();
    let attr = QpAttr {
        qp_state: QpState::Sqd,
        timeout: 10,
        retry_cnt: 1,
        rnr_retry: 2,
        max_rd_atomic: 8,
        ..Default::default()
    };
    let mask = M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
    r.modify(&attr, mask).unwrap();
    let a = r.qp.req.attrs();
    assert_eq!(
        (a.timeout, a.retry_cnt, a.rnr_retry, a.max_rd_atomic),
        (local_ack_timeout(10), 1, 2, 8)
    );
    r.to(QpState::Rts);
    assert_eq!(r.qp.req.next_psn(), psn, "the PSNs go on where they were");
    assert_eq!(r.qp.req.attrs().rnr_retry, 2, "kept across SQD -> RTS");
}

/// IBA 10.3.1 / `man ibv_modify_qp`: ERR flushes both queues, in order, with
/// `IBV_WC_WR_FLUSH_ERR`; a modify to ERR leaves that to `enter_error`.
#[test]
fn error_flushes_both_queues_in_order() {
    let mut r = Rig::new(QpType::Rc, Switches::default());
    for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
        r.to(s);
    }
    let mrs = MrTable::default();
    for id in 1..=3 {
        r.qp.req.post(&SendWr::send(id, &[]).signaled(), &mrs).unwrap();
        r.qp.resp.post(&RecvWr::new(10 + id, &[])).unwrap();
    }
    let t = r
        .modify(
            &QpAttr {
                qp_state: QpState::Err,
                ..Default::default()
            },
            M::STATE,
        )
        .unwrap();
    assert_eq!((t.to, t.effect), (QpState::Err, Effect::Error));
    assert_eq!(r.qp.state(), QpState::Rts, "ERR is entered through enter_error");
    let from = r.qp.enter_error();
    assert_eq!(from, Some(QpState::Rts));
    let (s, rv) = (r.qp.send_wc.clone(), r.qp.recv_wc.clone());
    assert_eq!(r.qp.state(), QpState::Err);
    assert_eq!(s.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(rv.iter().map(|(w, _)| w.wr_id).collect::<Vec<_>>(), [11, 12, 13]);
    assert!(s
        .iter()
        .chain(rv.iter().map(|(w, _)| w))
        .all(|w| w.status == WcStatus::WrFlushErr));
    // Once in ERR, entering it again flushes nothing more.
    assert_eq!(r.qp.enter_error(), None);
    assert_eq!(r.qp.send_wc.len() + r.qp.recv_wc.len(), 6);
}

/// A send error moves UC and UD to SQE where the device does so (the send queue flushed,
/// the receive queue kept), and RC never.
#[test]
fn send_error_moves_unreliable_qps_to_sqe() {
    let sw = Switches {
        send_error_sqe: true,
        ..Switches::default()
    };
    for (qp_type, sqe) in [(QpType::Rc, false), (QpType::Uc, true), (QpType::Ud, true)] {
        let mut r = Rig::new(qp_type, sw);
        for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
            r.to(s);
        }
        r.qp.resp.post(&RecvWr::new(9, &[])).unwrap();
        let got = r.qp.enter_sqe();
        assert_eq!(got.is_some(), sqe, "{qp_type:?}");
        if sqe {
            assert_eq!(r.qp.state(), QpState::Sqe);
            assert_eq!(r.qp.resp.posted(), 1, "the receive queue works on in SQE");
            assert_eq!(r.to(QpState::Rts).effect, Effect::Resume { start: false });
        }
    }
}

#[test]
fn reset_forgets_attributes_and_queues() {
    let mut r = Rig::new(QpType::Rc, Switches::default());
    for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
        r.to(s);
    }
    r.qp.resp.post(&RecvWr::new(9, &[])).unwrap();
    let t = r
        .modify(
            &QpAttr {
                qp_state: QpState::Reset,
                ..Default::default()
            },
            M::STATE,
        )
        .unwrap();
    assert_eq!(t.effect, Effect::Reset);
    assert_eq!(r.qp.state(), QpState::Reset);
    assert_eq!(r.qp.attr().dest_qp_num, 0);
    assert_eq!(r.qp.resp.posted(), 0);
}

/// One modify of a random sequence: a target state, and either its exact required mask or
/// a random one, with values in or out of range.
#[derive(Debug, Clone)]
struct Step {
    next: u32,
    exact: bool,
    bits: u32,
    bad_value: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (0u32..7, any::<bool>(), 0u32..(1 << 21), prop::bool::weighted(0.2)).prop_map(
        |(next, exact, bits, bad_value)| Step {
            next,
            exact,
            bits,
            bad_value,
        },
    )
}

proptest! {
    /// Random modify sequences: a legal call succeeds and reaches the state it names (ERR
    /// through `enter_error`), an illegal one fails with EINVAL and changes nothing (state,
    /// attributes, the halves' PSNs).
    #[test]
    fn random_modify_sequences(qp_type in prop::sample::select(vec![QpType::Rc, QpType::Uc, QpType::Ud]),
                               steps in prop::collection::vec(step(), 1..40)) {
        let mut r = Rig::new(qp_type, Switches::default());
        for s in steps {
            let cur = r.qp.state();
            let next = QpState::from_raw(s.next).expect("a state");
            let (mut attr, mask) = if s.exact && verbs_api::transitions::transition_masks(cur, next, qp_type).is_some() {
                full(qp_type, cur, next)
            } else {
                (good_attr(next), (M::from_bits_truncate(s.bits) - M::CUR_STATE) | M::STATE)
            };
            if s.bad_value {
                attr.retry_cnt = 8;
            }
            let legal = verbs_api::transitions::check_modify(cur, qp_type, &attr, mask).is_ok()
                && !(s.bad_value && mask.contains(M::RETRY_CNT))
                && !mask.contains(M::CAP);
            let before = (r.qp.attr, r.qp.sqd_event_due, r.qp.req.next_psn(), r.qp.resp.expected_psn());
            match r.modify(&attr, mask) {
                Ok(t) => {
                    prop_assert!(legal, "{cur:?} -> {next:?} with {mask:?} was accepted");
                    prop_assert_eq!(t.to, next);
                    if next == QpState::Err {
                        prop_assert_eq!(t.effect, Effect::Error);
                        r.qp.enter_error();
                    }
                    prop_assert_eq!(r.qp.state(), next);
                }
                Err(e) => {
                    prop_assert!(!legal, "{cur:?} -> {next:?} with {mask:?} was refused: {e}");
                    prop_assert_eq!(e.errno(), libc::EINVAL);
                    prop_assert_eq!(r.qp.state(), cur);
                    let after = (r.qp.attr, r.qp.sqd_event_due, r.qp.req.next_psn(), r.qp.resp.expected_psn());
                    prop_assert_eq!(before, after);
                }
            }
        }
    }
}

/// IBA 10.3.1: send WRs posted in ERR or SQE complete flushed; receives posted in ERR
/// complete flushed only where the device does so (`recv_in_err_flushed`).
#[test]
fn posts_in_error_complete_flushed() {
    for recv_flushed in [false, true] {
        let sw = Switches {
            recv_in_err_flushed: recv_flushed,
            ..Switches::default()
        };
        let mut r = Rig::new(QpType::Rc, sw);
        let mrs = MrTable::default();
        r.qp.req.post(&SendWr::send(1, &[]).signaled(), &mrs).unwrap();
        r.qp.resp.post(&RecvWr::new(2, &[])).unwrap();
        assert!(!r.qp.flush_posted_sends(), "RESET: nothing flushed");
        assert!(!r.qp.flush_posted_recvs());
        r.qp.enter_error();
        r.qp.send_wc.clear();
        r.qp.recv_wc.clear();
        r.qp.req.post(&SendWr::send(3, &[]).signaled(), &mrs).unwrap();
        r.qp.resp.post(&RecvWr::new(4, &[])).unwrap();
        assert!(r.qp.flush_posted_sends());
        let s = &r.qp.send_wc;
        assert_eq!((s[0].wr_id, s[0].status), (3, WcStatus::WrFlushErr));
        assert_eq!(r.qp.flush_posted_recvs(), recv_flushed);
        assert_eq!(r.qp.recv_wc.len(), usize::from(recv_flushed));
        assert_eq!(r.qp.resp.posted(), usize::from(!recv_flushed));
    }
}

/// A lost connection: RC resends what was in flight, UC's WRs sent on it complete (UC
/// has no resends), and a transport error names the missing link until one is up again.
#[test]
fn a_lost_connection_resends_rc_and_completes_uc() {
    for qp_type in [QpType::Rc, QpType::Uc] {
        let mut r = Rig::new(qp_type, Switches::default());
        for s in [QpState::Init, QpState::Rtr, QpState::Rts] {
            r.to(s);
        }
        r.qp.handle_connection_up();
        assert_eq!(r.qp.req.link_error, 0);
        let mrs = MrTable::default();
        r.qp.req.post(&SendWr::send(1, &[]).signaled(), &mrs).unwrap();
        let mut conn = crate::connection::Connection::default();
        r.qp.poll_transmit(&mut conn, &mrs, std::time::Instant::now())
            .unwrap();
        assert!(!r.qp.req.has_unsent(), "{qp_type:?}: the SEND left");
        r.qp.send_wc.clear();
        r.qp.handle_connection_lost();
        let s = &r.qp.send_wc;
        assert_eq!(r.qp.req.link_error, libc::ENOTCONN as u32);
        match qp_type {
            QpType::Rc => {
                assert!(s.is_empty() && r.qp.req.has_unsent(), "RC resends: {s:?}");
            }
            _ => assert_eq!(s.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1], "UC completes"),
        }
        r.qp.handle_connection_up();
        assert_eq!(r.qp.req.link_error, 0);
    }
}
