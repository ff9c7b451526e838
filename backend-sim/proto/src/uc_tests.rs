//! UC's two halves (IBA 9.8.3): the responder drops what RC would NAK (no NAK, no RNR,
//! the QP stays up), counts it, and acknowledges every message it took in (the sim's
//! delivery receipt); a PSN gap is counted and the message after it taken; the requester
//! refuses READ and atomics, completes WRs on the receipt, resends nothing after a lost
//! connection, completes WRs that found no link within the link wait, and treats any
//! other response as a protocol error.

use std::sync::Arc;
use std::time::{Duration, Instant};

use verbs_api::{AccessFlags, QpCap, RecvWr, SendWr, Sge, WcStatus, WorkCompletion};

use crate::engine::{drive, DriveState, Sides, Stop};
use crate::faults::ForcedRnr;
use crate::memory::{MrShared, MrTable};
use crate::requester::{PostCheck, ReqAttrs, Requester, LINK_WAIT};
use crate::responder::{Incoming, RespAttrs, Responder};
use crate::rx::Reader;
use crate::tx::TxQueue;
use crate::wire::{Frame, NakCode};

const PD: u32 = 1;
const KEY: u32 = 0x42;

fn region() -> (MrTable, Arc<MrShared>) {
    let mrs = MrTable::default();
    let mr = Arc::new(MrShared::new_owned(PD, KEY, 4096, AccessFlags::ALL).unwrap());
    mrs.insert(mr.clone());
    (mrs, mr)
}

fn responder() -> Responder {
    let mut r = Responder::new(2, PD, 4, 1).unreliable();
    r.connect(RespAttrs {
        rq_psn: 10,
        min_rnr_timer: 5,
    });
    r.access = AccessFlags::REMOTE_WRITE;
    r
}

fn frames(tx: &mut TxQueue) -> Vec<Frame> {
    let mut b = Vec::new();
    tx.drain_into(&mut b);
    crate::wire::tests::decode_all(&b)
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

/// Hands `f` to `r`, writes a payload it asks for; returns whether it was taken.
fn take(r: &mut Responder, mrs: &MrTable, f: Frame, out: &mut Vec<(WorkCompletion, bool)>) -> bool {
    let mut tx = TxQueue::new();
    match r
        .on_request(&f, mrs, &mut tx, out)
        .expect("UC never fails the QP here")
    {
        Incoming::Sink(segs) => {
            for s in &segs {
                assert!(s.copy_in(0, &vec![0x77; s.len]));
            }
            r.payload_done(segs, mrs, out);
            true
        }
        Incoming::Discard => {
            assert!(tx.is_empty(), "a UC responder answers nothing but ACKs");
            false
        }
    }
}

/// What RC would NAK is dropped: no receive, a bad rkey, a READ or an atomic; nothing is
/// sent back but one ACK for all of them, the QP keeps working, and each drop is counted.
#[test]
fn the_responder_drops_and_acknowledges() {
    let (mrs, mr) = region();
    let mut r = responder();
    let mut out = Vec::new();
    assert!(!take(&mut r, &mrs, send(10, 8), &mut out));
    let write = Frame::Write {
        psn: 11,
        len: 8,
        addr: mr.addr(),
        rkey: KEY + 1,
        imm: None,
        solicited: false,
        ack_req: false,
    };
    assert!(!take(&mut r, &mrs, write, &mut out));
    let read = Frame::Read {
        inflight: 1,
        psn: 12,
        len: 8,
        addr: mr.addr(),
        rkey: KEY,
    };
    assert!(!take(&mut r, &mrs, read, &mut out));
    let faa = Frame::FetchAdd {
        inflight: 1,
        psn: 13,
        addr: mr.addr(),
        rkey: KEY,
        add: 1,
    };
    assert!(!take(&mut r, &mrs, faa, &mut out));
    assert!(out.is_empty());
    assert_eq!(r.take_uc_counts(), (4, 0));
    let mut b = [0u8; 16];
    assert!(mr.copy_out(0, &mut b));
    assert_eq!(b, [0; 16], "memory untouched");
    let mut tx = TxQueue::new();
    assert!(r.owes_ack());
    r.flush_ack(&mut tx);
    assert_eq!(frames(&mut tx), [Frame::Ack { psn: 13 }]);
    // Still receiving.
    let sge = [Sge::new(mr.addr() + 64, 32, KEY)];
    r.post(&RecvWr::new(9, &sge)).unwrap();
    assert!(take(&mut r, &mrs, send(14, 8), &mut out));
    assert_eq!(
        out.iter()
            .map(|(w, _)| (w.wr_id, w.status, w.byte_len))
            .collect::<Vec<_>>(),
        [(9, WcStatus::Success, 8)]
    );
}

/// A message of several packets dropped (no receive posted) is acknowledged by its last
/// packet's PSN, as one taken in: the requester completes a WR once the ACK's PSN reaches
/// its message's last packet, so a receipt of the first would leave it waiting, and UC
/// has no timer to end the wait.
#[test]
fn a_dropped_message_of_several_packets_is_acknowledged_by_its_last_psn() {
    let (mrs, _) = region();
    let mut r = responder();
    r.set_path_mtu(1024);
    let mut out = Vec::new();
    assert!(!take(&mut r, &mrs, send(10, 3000), &mut out));
    let mut tx = TxQueue::new();
    r.flush_ack(&mut tx);
    assert_eq!(frames(&mut tx), [Frame::Ack { psn: 12 }]);
}

/// A SEND longer than its receive completes it with LOC_LEN_ERR and drops the message:
/// nothing is written, the QP is not failed (no `Fatal`).
#[test]
fn a_short_receive_is_loc_len_err_and_the_qp_stays() {
    let (mrs, mr) = region();
    let mut r = responder();
    let mut out = Vec::new();
    let sge = [Sge::new(mr.addr(), 4, KEY)];
    r.post(&RecvWr::new(1, &sge)).unwrap();
    assert!(!take(&mut r, &mrs, send(10, 100), &mut out));
    assert_eq!(
        out.iter().map(|(w, _)| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::LocLenErr)]
    );
    let mut b = [0u8; 8];
    assert!(mr.copy_out(0, &mut b));
    assert_eq!(b, [0; 8]);
    assert_eq!(r.take_uc_counts(), (1, 0));
}

/// A PSN other than the expected one: the messages between were lost; the gap is counted
/// and the message that came is received (a new message starts anew).
#[test]
fn a_psn_gap_is_counted_and_the_next_message_taken() {
    let (mrs, mr) = region();
    let mut r = responder();
    let mut out = Vec::new();
    let sge = [Sge::new(mr.addr(), 64, KEY)];
    r.post(&RecvWr::new(1, &sge)).unwrap();
    r.post(&RecvWr::new(2, &sge)).unwrap();
    assert!(take(&mut r, &mrs, send(15, 8), &mut out));
    assert!(take(&mut r, &mrs, send(16, 8), &mut out));
    assert_eq!(out.len(), 2);
    assert_eq!(r.take_uc_counts(), (0, 1));
    assert_eq!(r.expected_psn(), 17);
}

/// A message whose connection broke mid-payload is dropped whole; its receive takes the
/// next one.
#[test]
fn a_message_cut_short_is_dropped_and_its_receive_reused() {
    let (mrs, mr) = region();
    let mut r = responder();
    let mut out = Vec::new();
    let sge = [Sge::new(mr.addr(), 64, KEY)];
    r.post(&RecvWr::new(1, &sge)).unwrap();
    let mut tx = TxQueue::new();
    let Ok(Incoming::Sink(_segs)) = r.on_request(&send(10, 32), &mrs, &mut tx, &mut out) else {
        panic!("the SEND is taken");
    };
    r.connection_lost();
    assert!(!r.owes_ack(), "nothing to acknowledge on a dead connection");
    assert_eq!(r.take_uc_counts(), (1, 0));
    assert!(take(&mut r, &mrs, send(11, 5), &mut out));
    assert_eq!(
        out.iter().map(|(w, _)| (w.wr_id, w.byte_len)).collect::<Vec<_>>(),
        [(1, 5)]
    );
}

/// Requests to a UC QP that accepts none (here: in ERR) are dropped and still
/// acknowledged, so the requester's WRs complete.
#[test]
fn an_unaccepting_qp_acknowledges() {
    let mut r = responder();
    r.uc_unaccepted(&send(10, 0));
    r.uc_unaccepted(&send(11, 0));
    let mut tx = TxQueue::new();
    r.flush_ack(&mut tx);
    assert_eq!(frames(&mut tx), [Frame::Ack { psn: 11 }]);
    assert_eq!(r.take_uc_counts(), (2, 0));
}

fn requester(mrs: &MrTable) -> (Requester, Vec<Sge>) {
    let mut q = Requester::new(1, PD, &QpCap::new(8, 8), false).unreliable();
    q.connect(ReqAttrs {
        sq_psn: 10,
        timeout: None,
        retry_cnt: 0,
        rnr_retry: 0,
        max_rd_atomic: 0,
    });
    q.link_error = 0;
    let mr = mrs.get(KEY).unwrap();
    (q, vec![Sge::new(mr.addr(), 8, KEY)])
}

/// READ and atomics are refused at post; SENDs and WRITEs complete on the receipt, in
/// order, and nothing is resent after a lost connection (the WRs sent on it complete).
#[test]
fn the_requester_completes_on_receipt_and_never_resends() {
    let (mrs, _mr) = region();
    let (mut q, sge) = requester(&mrs);
    let now = Instant::now();
    let remote = (0x1000u64, 5u32);
    assert_eq!(
        q.post(&SendWr::read(1, &sge, remote), &mrs),
        Err(PostCheck::NotUc)
    );
    assert_eq!(
        q.post(&SendWr::fetch_and_add(1, &sge, remote, 1), &mrs),
        Err(PostCheck::NotUc)
    );
    let (mut tx, mut out) = (TxQueue::new(), Vec::new());
    for id in 1..=3 {
        q.post(&SendWr::send(id, &sge).signaled(), &mrs).unwrap();
    }
    assert_eq!(q.poll_transmit(&mrs, now, &mut tx, 16, &mut out), Ok(3));
    assert!(out.is_empty(), "complete on the receipt, not before");
    assert_eq!(q.next_deadline(), None, "no ACK timer");
    q.on_response(&Frame::Ack { psn: 11 }, now, &mut out).unwrap();
    assert_eq!(out.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2]);
    q.on_connection_lost();
    q.take_done(&mut out);
    assert_eq!(
        out.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
    tx.drain_into(&mut Vec::new());
    assert_eq!(q.poll_transmit(&mrs, now, &mut tx, 16, &mut out), Ok(0), "resent");
    assert!(!q.has_unsent());
}

/// WRs posted without a link wait for it up to LINK_WAIT, then complete (lost).
#[test]
fn wrs_without_a_link_complete_after_the_link_wait() {
    let (mrs, _mr) = region();
    let (mut q, sge) = requester(&mrs);
    q.link_error = libc::ECONNREFUSED as u32;
    let t0 = Instant::now();
    q.post(&SendWr::send(1, &sge).signaled(), &mrs).unwrap();
    q.wait_for_link(t0);
    assert_eq!(q.next_deadline(), Some(t0 + LINK_WAIT));
    let mut out = Vec::new();
    assert_eq!(
        q.on_timer(t0 + Duration::from_secs(1), None, None, &mut out),
        Ok(false)
    );
    assert!(out.is_empty());
    q.on_timer(t0 + LINK_WAIT, None, None, &mut out).unwrap();
    assert_eq!(
        out.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success)]
    );
    assert_eq!(q.outstanding(), 0);
}

/// A UC requester takes nothing but ACKs: a NAK is a broken protocol.
#[test]
fn a_nak_on_a_uc_connection_is_a_protocol_error() {
    let (mrs, _mr) = region();
    let (mut q, _) = requester(&mrs);
    let mut h = [0u8; crate::wire::MAX_HDR_LEN];
    let n = Frame::Nak {
        psn: 10,
        code: NakCode::Rnr { timer: 1 },
        reason: None,
    }
    .encode(&mut h);
    let mut reader = Reader::new();
    reader.feed(&h[..n]);
    let (mut swc, mut rwc) = (Vec::new(), Vec::new());
    let mut sides = Sides {
        req: Some(&mut q),
        resp: None,
        accepting: true,
        send_wc: &mut swc,
        recv_wc: &mut rwc,
        forced_rnr: &mut ForcedRnr::default(),
    };
    let r = drive(
        &mut sides,
        &mut reader,
        &mrs,
        &mut TxQueue::new(),
        Instant::now(),
        &mut DriveState::default(),
        16,
        0,
    );
    assert!(
        matches!(r, Err(Stop::Protocol(ref m)) if m.contains("UC")),
        "{r:?}"
    );
}

proptest::proptest! {
    /// Arbitrary requests (mostly aimed at the region, some at its edges or anywhere) at
    /// a UC responder, on its own receive queue or an SRQ, with payloads: never a panic,
    /// never a byte written outside the registered region (which sits between guard
    /// zones of a larger buffer), never a frame back but an ACK, and the QP never fails
    /// for what the peer sent.
    #[test]
    fn hostile_requests_at_a_uc_responder(
        frames in proptest::collection::vec((crate::wire::tests::arb_frame(), 0u8..4, proptest::prelude::any::<u16>()), 1..40),
        srq in proptest::prelude::any::<bool>(),
    ) {
        use crate::recv_queue::SharedRecvQueue;
        let mut backing = vec![0xeeu8; 3 * 4096];
        let mrs = MrTable::default();
        // SAFETY: `backing` outlives the region (killed below before the Vec drops).
        let mr = Arc::new(unsafe {
            MrShared::new_borrowed(PD, KEY, backing.as_mut_ptr().add(4096), 4096, AccessFlags::ALL)
        });
        mrs.insert(mr.clone());
        let mut r = if srq {
            let s = Arc::new(SharedRecvQueue::new(1, 8, 2, 3));
            let sge = [Sge::new(mr.addr(), 1024, KEY)];
            s.post_all(&[RecvWr::new(1, &sge), RecvWr::new(2, &sge)]).unwrap();
            Responder::with_srq(2, PD, s).unreliable()
        } else {
            let mut r = Responder::new(2, PD, 8, 2).unreliable();
            for id in 0..3 {
                r.post(&RecvWr::new(id, &[Sge::new(mr.addr() + 1024 * id, 1024, KEY)])).unwrap();
            }
            r
        };
        r.connect(RespAttrs { rq_psn: 0, min_rnr_timer: 1 });
        r.access = AccessFlags::REMOTE_WRITE;
        let (mut rx, mut tx, mut st, mut out) = (Reader::new(), TxQueue::new(), DriveState::default(), Vec::new());
        for (f, aim, off) in frames {
            let f = match f {
                Frame::Write { psn, len, addr, rkey, imm, solicited, ack_req } => Frame::Write {
                    psn,
                    len: len % 6000,
                    addr: if aim > 0 { mr.addr().wrapping_add(off as u64 % 5000).wrapping_sub(500) } else { addr },
                    rkey: if aim > 1 { KEY } else { rkey },
                    imm,
                    solicited,
                    ack_req,
                },
                Frame::Send { psn, len, imm, solicited, ack_req, inv } => Frame::Send { psn, len: len % 3000, imm, solicited, ack_req, inv },
                f if f.is_request() => f,
                _ => continue,
            };
            let mut h = [0u8; crate::wire::MAX_HDR_LEN];
            let n = f.encode(&mut h);
            let mut bytes = h[..n].to_vec();
            bytes.extend(std::iter::repeat_n(0x5a, f.payload_len() as usize));
            let mut at = 0;
            while at < bytes.len() {
                at += rx.feed(&bytes[at..]);
                let mut swc = Vec::new();
                let mut sides = Sides { req: None, resp: Some(&mut r), accepting: true, send_wc: &mut swc, recv_wc: &mut out, forced_rnr: &mut ForcedRnr::default() };
                let d = drive(&mut sides, &mut rx, &mrs, &mut tx, Instant::now(), &mut st, usize::MAX, 0);
                proptest::prop_assert!(d.is_ok(), "{d:?}");
            }
            let mut back = Vec::new();
            tx.drain_into(&mut back);
            for f in crate::wire::tests::decode_all(&back) {
                proptest::prop_assert!(matches!(f, Frame::Ack { .. }), "{f:?}");
            }
        }
        mr.kill();
        proptest::prop_assert!(backing[..4096].iter().all(|&b| b == 0xee), "written before the region");
        proptest::prop_assert!(backing[8192..].iter().all(|&b| b == 0xee), "written after the region");
    }
}
