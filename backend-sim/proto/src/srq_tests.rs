//! Responders on a shared receive queue (`man ibv_create_srq`; IBA 10.2.9, 11.6.3.3):
//! FIFO across QPs, an empty SRQ as an empty receive queue (RNR NAK, also for
//! WRITE_WITH_IMM and fault injection's forced RNR), the limit event, the flush on ERR
//! (only the receive a QP took) and LAST_WQE_REACHED, and a receive held across a lost
//! connection or given back on reset.

use std::sync::Arc;

use verbs_api::{
    AccessFlags, AsyncElement, AsyncEvent, AsyncEventType, RecvWr, Sge, SrqAttr, SrqAttrMask, WcOpcode,
    WcStatus, WorkCompletion,
};

use crate::memory::{MrShared, MrTable};
use crate::recv_queue::{PostRecvError, SharedRecvQueue};
use crate::requester::Fatal;
use crate::responder::{Incoming, RespAttrs, Responder};
use crate::tx::TxQueue;
use crate::wire::{Frame, NakCode, NakReason};

const PD: u32 = 1;
const KEY: u32 = 0x77;
const SRQ: u32 = 5;

struct Fixture {
    mrs: MrTable,
    mr: Arc<MrShared>,
    srq: Arc<SharedRecvQueue>,
    a: Responder,
    b: Responder,
    tx: TxQueue,
    out: Vec<(WorkCompletion, bool)>,
}

fn responder(qpn: u32, srq: &Arc<SharedRecvQueue>) -> Responder {
    let mut r = Responder::with_srq(qpn, PD, srq.clone());
    r.connect(RespAttrs {
        rq_psn: 0,
        min_rnr_timer: 9,
    });
    r.access = AccessFlags::REMOTE;
    r
}

impl Fixture {
    /// QPs 0xa and 0xb on one SRQ of 16 receives, and a 4 KiB region.
    fn new() -> Fixture {
        let mrs = MrTable::default();
        let mr = Arc::new(MrShared::new_owned(PD, KEY, 4096, AccessFlags::ALL).unwrap());
        mrs.insert(mr.clone());
        let srq = Arc::new(SharedRecvQueue::new(SRQ, 16, 1, 0));
        Fixture {
            a: responder(0xa, &srq),
            b: responder(0xb, &srq),
            mrs,
            mr,
            srq,
            tx: TxQueue::new(),
            out: Vec::new(),
        }
    }

    /// Posts receives `ids`, each of 64 bytes at offset 64 * id.
    fn post(&self, ids: std::ops::Range<u64>) {
        let sges: Vec<[Sge; 1]> = ids
            .clone()
            .map(|i| [Sge::new(self.mr.addr() + 64 * i, 64, KEY)])
            .collect();
        let wrs: Vec<RecvWr<'_>> = ids.zip(&sges).map(|(i, s)| RecvWr::new(i, s)).collect();
        self.srq.post_all(&wrs).unwrap();
    }

    fn resp(&mut self, qp: char) -> &mut Responder {
        match qp {
            'a' => &mut self.a,
            _ => &mut self.b,
        }
    }

    /// `f` to QP `qp`; a payload, if asked for, is written whole.
    fn request(&mut self, qp: char, f: Frame) -> Result<Incoming, Fatal> {
        let (mrs, tx, out) = (&self.mrs, &mut self.tx, &mut self.out);
        let r = match qp {
            'a' => &mut self.a,
            _ => &mut self.b,
        };
        let i = r.on_request(&f, mrs, tx, out)?;
        if let Incoming::Sink(segs) = i {
            for s in &segs {
                assert!(s.copy_in(0, &vec![0x5a; s.len]));
            }
            r.payload_done(segs, mrs, out);
            return Ok(Incoming::Discard);
        }
        Ok(i)
    }

    /// The completions so far: (wr_id, qp_num, status).
    fn wcs(&mut self) -> Vec<(u64, u32, WcStatus)> {
        self.out
            .drain(..)
            .map(|(w, _)| (w.wr_id, w.qp_num, w.status))
            .collect()
    }

    fn frames(&mut self) -> Vec<Frame> {
        let mut b = Vec::new();
        self.tx.drain_into(&mut b);
        crate::wire::tests::decode_all(&b)
    }

    fn events(&mut self, qp: char) -> Vec<AsyncEvent> {
        self.resp(qp).take_events().collect()
    }
}

fn send(psn: u32, len: u32) -> Frame {
    Frame::Send {
        psn,
        len,
        imm: None,
        solicited: false,
        ack_req: false,
        inv: None,
    }
}

fn write_imm(psn: u32, addr: u64, rkey: u32) -> Frame {
    Frame::Write {
        psn,
        len: 8,
        addr,
        rkey,
        imm: Some(0x1234),
        solicited: false,
        ack_req: false,
    }
}

fn rnr(psn: u32) -> Frame {
    Frame::Nak {
        psn,
        code: NakCode::Rnr { timer: 9 },
        reason: None,
    }
}

/// Receives go first in first out whatever QP the message arrived on, and each
/// completion names the QP that received; an empty SRQ answers RNR with the QP's
/// `min_rnr_timer`, to SENDs and WRITE_WITH_IMM alike, and the resend after a post is
/// delivered.
#[test]
fn receives_are_shared_fifo_and_an_empty_srq_is_rnr() {
    let mut f = Fixture::new();
    f.post(0..3);
    f.request('a', send(0, 10)).unwrap();
    f.request('b', send(0, 10)).unwrap();
    f.request('a', send(1, 10)).unwrap();
    assert_eq!(
        f.wcs(),
        [
            (0, 0xa, WcStatus::Success),
            (1, 0xb, WcStatus::Success),
            (2, 0xa, WcStatus::Success)
        ]
    );
    f.frames();
    f.request('b', send(1, 10)).unwrap();
    let addr = f.mr.addr() + 2048;
    f.request('a', write_imm(2, addr, KEY)).unwrap();
    assert_eq!(f.frames(), [rnr(1), rnr(2)]);
    assert!(f.wcs().is_empty());
    let mut before = [0u8; 8];
    assert!(f.mr.copy_out(2048, &mut before));
    assert_eq!(before, [0; 8], "the WRITE_WITH_IMM was not executed");
    // A receive posted meanwhile takes the resend (B's first, as it comes first).
    f.post(3..5);
    f.request('b', send(1, 10)).unwrap();
    f.request('a', write_imm(2, addr, KEY)).unwrap();
    let wcs: Vec<_> = f.out.iter().map(|(w, _)| (w.wr_id, w.qp_num, w.opcode)).collect();
    assert_eq!(
        wcs,
        [(3, 0xb, WcOpcode::Recv), (4, 0xa, WcOpcode::RecvRdmaWithImm)]
    );
}

/// Fault injection's forced RNR applies to a QP on an SRQ as to one with its own
/// receive queue, and takes nothing from the SRQ.
#[test]
fn forced_rnr_takes_nothing_from_the_srq() {
    let mut f = Fixture::new();
    f.post(0..2);
    let mut force = crate::faults::ForcedRnr::next(1);
    let (mrs, tx, out) = (&f.mrs, &mut f.tx, &mut f.out);
    f.a.on_request_rnr(&send(0, 0), mrs, tx, out, &mut force).unwrap();
    assert_eq!(force.remaining(), 0);
    assert_eq!(f.frames(), [rnr(0)]);
    assert_eq!(f.srq.len(), 2);
    f.request('a', send(0, 0)).unwrap();
    assert_eq!(f.wcs(), [(0, 0xa, WcStatus::Success)]);
}

/// rxe's rule, through the responders: post 10, limit 7, the event comes with the 4th
/// receive (6 left), from whichever QP took it, once, and the limit reads 0 after.
#[test]
fn the_limit_event_comes_once_from_the_qp_that_took_below_it() {
    let mut f = Fixture::new();
    f.post(0..10);
    f.srq
        .modify(
            &SrqAttr::default().with_limit(7),
            SrqAttrMask::LIMIT,
            16,
            crate::queue_sizing::QueueSizing::AsAsked,
        )
        .unwrap();
    for (qp, psn) in [('a', 0), ('b', 0), ('a', 1)] {
        f.request(qp, send(psn, 4)).unwrap();
    }
    assert!(!f.a.has_news() && !f.b.has_news());
    f.request('b', send(1, 4)).unwrap();
    assert_eq!(
        f.events('b'),
        [AsyncEvent {
            event_type: AsyncEventType::SrqLimitReached,
            element: AsyncElement::Srq(SRQ),
        }]
    );
    assert_eq!(f.srq.query().srq_limit, 0);
    f.request('b', send(2, 4)).unwrap();
    assert!(!f.a.has_news() && !f.b.has_news(), "once");
    assert_eq!(f.wcs().len(), 5);
}

/// A QP on an SRQ that goes to ERR completes only the receive it had taken (here one a
/// WRITE_WITH_IMM took before its rkey check failed: `LOC_ACCESS_ERR`, IBA's status,
/// `Switches::write_imm_bad_rkey`), flushes nothing else, raises LAST_WQE_REACHED once,
/// and leaves the SRQ's receives to the other QP.
#[test]
fn err_completes_only_the_taken_receive_and_raises_last_wqe() {
    let mut f = Fixture::new();
    f.post(0..3);
    let addr = f.mr.addr();
    match f.request('a', write_imm(0, addr, KEY + 1)) {
        Err(Fatal(WcStatus::RemAccessErr)) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(
        f.frames(),
        [Frame::Nak {
            psn: 0,
            code: NakCode::RemoteAccess,
            reason: Some(NakReason::UnknownRkey)
        }]
    );
    assert_eq!(f.wcs(), [(0, 0xa, WcStatus::LocAccessErr)]);
    let mut out = Vec::new();
    f.a.flush(&mut out);
    f.a.flush(&mut out);
    assert!(out.is_empty(), "flushed {out:?}");
    let qp = AsyncElement::Qp(0xa);
    let evs: Vec<_> = f
        .events('a')
        .into_iter()
        .map(|e| (e.event_type, e.element))
        .collect();
    assert_eq!(
        evs,
        [
            (AsyncEventType::QpAccessErr, qp),
            (AsyncEventType::QpLastWqeReached, qp)
        ],
        "the refusal's affiliated error, then LAST_WQE_REACHED once"
    );
    assert_eq!(f.srq.len(), 2);
    f.request('b', send(0, 4)).unwrap();
    f.request('b', send(1, 4)).unwrap();
    assert_eq!(
        f.wcs(),
        [(1, 0xb, WcStatus::Success), (2, 0xb, WcStatus::Success)]
    );
    // After a reset the next ERR raises it again.
    f.a.reset();
    f.a.flush(&mut out);
    assert_eq!(f.events('a').len(), 1);
}

/// A receive taken for a message whose connection broke mid-payload stays with the QP
/// for the resend (another QP takes the next one); a reset gives it back to the SRQ.
#[test]
fn a_receive_taken_for_a_lost_message_is_held_then_given_back() {
    let mut f = Fixture::new();
    f.post(0..2);
    let (mrs, tx, out) = (&f.mrs, &mut f.tx, &mut f.out);
    assert!(matches!(
        f.a.on_request(&send(0, 10), mrs, tx, out),
        Ok(Incoming::Sink(_))
    ));
    f.a.connection_lost();
    f.request('b', send(0, 10)).unwrap();
    f.request('a', send(0, 10)).unwrap();
    assert_eq!(
        f.wcs(),
        [(1, 0xb, WcStatus::Success), (0, 0xa, WcStatus::Success)]
    );

    f.post(2..4);
    let (mrs, tx, out) = (&f.mrs, &mut f.tx, &mut f.out);
    assert!(matches!(
        f.a.on_request(&send(1, 10), mrs, tx, out),
        Ok(Incoming::Sink(_))
    ));
    f.a.connection_lost();
    f.a.reset();
    assert_eq!(f.srq.len(), 2, "given back");
    f.request('b', send(1, 10)).unwrap();
    assert_eq!(f.wcs(), [(2, 0xb, WcStatus::Success)], "at the head");
}

/// A QP with an SRQ has no receive queue of its own.
#[test]
fn posting_to_the_qp_is_refused() {
    let mut f = Fixture::new();
    let sge = [Sge::new(f.mr.addr(), 8, KEY)];
    assert_eq!(f.a.post(&RecvWr::new(1, &sge)), Err(PostRecvError::HasSrq));
    assert_eq!(f.a.posted(), 0);
}
