//! UD's two halves (IBA 9.8.4) through a link's bytes, as the driver runs them: the
//! requester hands datagrams on into a link's queue (SEND and SEND_WITH_IMM only, nothing
//! above the MTU, the Q_Key's high bit for the QP's own), the [`LinkReader`] hands them
//! out whole, and the responder takes each into one receive behind the 40 bytes of the
//! GRH, or drops it (a wrong Q_Key, no receive), or completes a receive too short with
//! `IBV_WC_LOC_LEN_ERR` without writing it.

use std::net::SocketAddr;
use std::sync::Arc;

use verbs_api::{
    AccessFlags, AddressHandle, AhAttr, QpCap, RecvWr, SendWr, Sge, WcFlags, WcOpcode, WcStatus,
    WorkCompletion,
};

use crate::link_rx::LinkReader;
use crate::memory::{MrShared, MrTable};
use crate::recv_queue::SharedRecvQueue;
use crate::requester::ud::Emitted;
use crate::requester::{Fatal, PostCheck, Requester, UdRoute};
use crate::responder::ud::grh_bytes;
use crate::responder::{DatagramSource, Responder, UdOutcome};
use crate::switches::Switches;
use crate::wire::{Grh, MAX_DATAGRAM};

const PD: u32 = 1;
const KEY: u32 = 0x42;
const QKEY: u32 = 0x1111_1111;
const SRC_QPN: u32 = 0x10_0001;
const DST_QPN: u32 = 0x20_0002;
const SRC: DatagramSource = DatagramSource {
    gid: [7; 16],
    lid: 18515,
};

/// Send buffers at 0..8192, receive buffers at 8192..16384.
fn region() -> (MrTable, Arc<MrShared>) {
    let mrs = MrTable::default();
    let mr = Arc::new(MrShared::new_owned(PD, KEY, 16384, AccessFlags::LOCAL_WRITE).unwrap());
    mrs.insert(mr.clone());
    (mrs, mr)
}

fn write(mr: &Arc<MrShared>, at: usize, bytes: &[u8]) {
    let seg = crate::memory::Seg {
        mr: mr.clone(),
        offset: at,
        len: bytes.len(),
    };
    assert!(seg.copy_in(0, bytes));
}

fn read(mr: &MrShared, at: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    assert!(mr.copy_out(at, &mut v));
    v
}

fn sge(mr: &MrShared, at: usize, len: usize) -> Sge {
    Sge::new(mr.addr() + at as u64, len as u32, KEY)
}

fn requester() -> Requester {
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 0,
        max_send_sge: 2,
        max_recv_sge: 0,
        max_inline_data: 64,
    };
    let mut r = Requester::new(SRC_QPN, PD, &cap, true).datagram();
    r.qkey = QKEY;
    r
}

fn responder() -> Responder {
    let mut r = Responder::new(DST_QPN, PD, 8, 2).datagram();
    r.qkey = QKEY;
    r
}

fn route(grh: Option<Grh>) -> UdRoute {
    UdRoute {
        peer: SocketAddr::from(([127, 0, 0, 1], 18516)),
        grh,
        remote_qpn: DST_QPN,
        remote_qkey: QKEY,
    }
}

/// An address handle for building WRs (the requester takes the route, not the handle).
struct Ah;
impl AddressHandle for Ah {
    fn attr(&self) -> AhAttr {
        AhAttr::default()
    }
}

/// Hands every datagram `req` can send on into one link's bytes, returning them and the
/// send completions.
fn emit_all(req: &mut Requester, mrs: &MrTable) -> (Vec<u8>, Vec<WorkCompletion>) {
    let (mut link, mut wc) = (Vec::new(), Vec::new());
    let mut from = 0;
    while let Some((idx, _)) = req.ud_next(from) {
        from = idx + 1;
        req.ud_emit(idx, mrs, &mut link).expect("no local error");
    }
    req.take_done(&mut wc);
    (link, wc)
}

/// The datagrams on `link` into `resp`, with their outcomes and receive completions.
fn receive_all(
    resp: &mut Responder,
    mrs: &MrTable,
    link: &[u8],
) -> (Vec<UdOutcome>, Vec<(WorkCompletion, bool)>) {
    let mut rx = LinkReader::new();
    assert_eq!(rx.feed(link), link.len());
    let (mut outcomes, mut out) = (Vec::new(), Vec::new());
    while let Some((f, payload)) = rx.next_datagram().unwrap() {
        outcomes.push(
            resp.on_datagram(&f, payload, &SRC, mrs, &mut out)
                .expect("no local error"),
        );
    }
    (outcomes, out)
}

/// A SEND without a GRH and a SEND_WITH_IMM with one: the payload lands at byte 40 of the
/// receive, `byte_len` counts the 40 bytes, and the completion names the sender (QP and
/// LID); the GRH bytes are written, and flagged, only for the datagram that had one.
#[test]
fn datagrams_land_behind_the_grh_and_name_their_sender() {
    let (mrs, mr) = region();
    let mut req = requester();
    let mut resp = responder();
    write(&mr, 0, b"no route header");
    write(&mr, 100, b"with one");
    write(&mr, 8192, &[0xee; 8192]);
    for (id, at) in [(1, 8192), (2, 12288)] {
        resp.post(&RecvWr::new(id, &[sge(&mr, at, 1024)])).unwrap();
    }
    let grh = Grh {
        dgid: [9; 16],
        flow_label: 0xa_bcde,
        traffic_class: 0x5c,
        hop_limit: 64,
        src_default: false,
    };
    let wr1 = [sge(&mr, 0, 15)];
    req.post_ud(&SendWr::send(10, &wr1).ud(&Ah, DST_QPN, QKEY), route(None), &mrs)
        .unwrap();
    let wr2 = [sge(&mr, 100, 8)];
    req.post_ud(
        &SendWr::send_with_imm(11, &wr2, 0xcafe).ud(&Ah, DST_QPN, QKEY),
        route(Some(grh)),
        &mrs,
    )
    .unwrap();
    let (link, sent) = emit_all(&mut req, &mrs);
    assert_eq!(
        sent.iter()
            .map(|w| (w.wr_id, w.status, w.opcode))
            .collect::<Vec<_>>(),
        [
            (10, WcStatus::Success, WcOpcode::Send),
            (11, WcStatus::Success, WcOpcode::Send)
        ]
    );
    let (outcomes, out) = receive_all(&mut resp, &mrs, &link);
    assert_eq!(outcomes, [UdOutcome::Received, UdOutcome::Received]);
    let (a, b) = (&out[0].0, &out[1].0);
    assert_eq!(
        (a.wr_id, a.status, a.opcode, a.byte_len),
        (1, WcStatus::Success, WcOpcode::Recv, 40 + 15)
    );
    assert_eq!(
        (a.qp_num, a.src_qp, a.slid, a.sl, a.pkey_index),
        (DST_QPN, SRC_QPN, SRC.lid, 0, 0)
    );
    assert!(!a.wc_flags.contains(WcFlags::GRH) && !a.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(
        read(&mr, 8192, 40),
        vec![0xee; 40],
        "no GRH: the 40 bytes are not written"
    );
    assert_eq!(read(&mr, 8192 + 40, 16), b"no route header\xee");
    assert_eq!((b.wr_id, b.byte_len, b.imm()), (2, 40 + 8, Some(0xcafe)));
    assert!(b.wc_flags.contains(WcFlags::GRH | WcFlags::WITH_IMM));
    let h = read(&mr, 12288, 40);
    assert_eq!(h[0] >> 4, 6, "IP version");
    assert_eq!(((h[0] & 0xf) << 4) | (h[1] >> 4), 0x5c, "traffic class");
    assert_eq!(
        u32::from_be_bytes([0, h[1] & 0xf, h[2], h[3]]),
        0xa_bcde,
        "flow label"
    );
    // BTH 12 + DETH 8 + ImmDt 4 + the payload (8, already a multiple of 4) + ICRC 4.
    assert_eq!(u16::from_be_bytes([h[4], h[5]]), 36, "payload length");
    assert_eq!((h[6], h[7]), (0x1b, 64), "next header (IBA transport), hop limit");
    assert_eq!(&h[8..24], &SRC.gid, "source GID: the link's, not the frame's");
    assert_eq!(&h[24..40], &[9; 16], "destination GID");
    assert_eq!(h, grh_bytes(&grh, &SRC, 8, true));
    assert_eq!(read(&mr, 12288 + 40, 9), b"with one\xee");
}

/// The GRH and the payload spread over a receive's SGEs as over one buffer.
#[test]
fn a_datagram_spans_the_receives_sges() {
    let (mrs, mr) = region();
    let mut req = requester();
    let mut resp = responder();
    write(&mr, 0, &(0..100u8).collect::<Vec<_>>());
    resp.post(&RecvWr::new(1, &[sge(&mr, 8192, 30), sge(&mr, 9000, 200)]))
        .unwrap();
    let grh = Grh::default();
    let wr = [sge(&mr, 0, 60), sge(&mr, 60, 40)];
    req.post_ud(
        &SendWr::send(1, &wr).ud(&Ah, DST_QPN, QKEY),
        route(Some(grh)),
        &mrs,
    )
    .unwrap();
    let (link, _) = emit_all(&mut req, &mrs);
    let (outcomes, out) = receive_all(&mut resp, &mrs, &link);
    assert_eq!(outcomes, [UdOutcome::Received]);
    assert_eq!(out[0].0.byte_len, 140);
    let mut got = read(&mr, 8192, 30);
    got.extend(read(&mr, 9000, 110));
    assert_eq!(got[..40], grh_bytes(&grh, &SRC, 100, false));
    assert_eq!(got[40..], (0..100u8).collect::<Vec<_>>()[..]);
}

/// A wrong Q_Key drops the datagram (no completion, the receive stays for the next); a
/// WR's Q_Key with the high bit set stands for the sending QP's own (IBA 10.2.5).
#[test]
fn the_qkey_is_checked_and_its_high_bit_means_the_qps_own() {
    let (mrs, mr) = region();
    let mut req = requester();
    let mut resp = responder();
    resp.post(&RecvWr::new(1, &[sge(&mr, 8192, 100)])).unwrap();
    let wr = [sge(&mr, 0, 4)];
    let mut wrong = route(None);
    wrong.remote_qkey = QKEY ^ 1;
    req.post_ud(&SendWr::send(1, &wr).ud(&Ah, DST_QPN, QKEY ^ 1), wrong, &mrs)
        .unwrap();
    let mut own = route(None);
    own.remote_qkey = 0x8000_0000;
    req.post_ud(&SendWr::send(2, &wr).ud(&Ah, DST_QPN, 0x8000_0000), own, &mrs)
        .unwrap();
    let (link, sent) = emit_all(&mut req, &mrs);
    assert!(sent.iter().all(|w| w.status == WcStatus::Success), "{sent:?}");
    let (outcomes, out) = receive_all(&mut resp, &mrs, &link);
    assert_eq!(outcomes, [UdOutcome::QkeyViolation, UdOutcome::Received]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0.wr_id, 1);
}

/// With no receive posted, a datagram is dropped and nothing completes; the next one,
/// after a receive is posted, is taken.
#[test]
fn an_empty_receive_queue_drops_the_datagram() {
    let (mrs, mr) = region();
    let mut req = requester();
    let mut resp = responder();
    let wr = [sge(&mr, 0, 4)];
    req.post_ud(&SendWr::send(1, &wr).ud(&Ah, DST_QPN, QKEY), route(None), &mrs)
        .unwrap();
    let (link, _) = emit_all(&mut req, &mrs);
    let (outcomes, out) = receive_all(&mut resp, &mrs, &link);
    assert_eq!(outcomes, [UdOutcome::NoReceive]);
    assert!(out.is_empty());
    resp.post(&RecvWr::new(5, &[sge(&mr, 8192, 100)])).unwrap();
    let (outcomes, out) = receive_all(&mut resp, &mrs, &link);
    assert_eq!(outcomes, [UdOutcome::Received]);
    assert_eq!(out[0].0.wr_id, 5);
}

/// A message above the MTU is not sent and its WR completes successfully
/// (C10-93.1.1); one of exactly the MTU is sent.
#[test]
fn nothing_above_the_mtu_is_sent() {
    let (mrs, mr) = region();
    let mut req = requester();
    let len = MAX_DATAGRAM as usize;
    for (id, n) in [(1, len + 1), (2, len)] {
        let wr = [sge(&mr, 0, n)];
        req.post_ud(&SendWr::send(id, &wr).ud(&Ah, DST_QPN, QKEY), route(None), &mrs)
            .unwrap();
    }
    let mut link = Vec::new();
    assert_eq!(req.ud_emit(0, &mrs, &mut link), Ok(Emitted::TooLong));
    assert!(link.is_empty());
    assert_eq!(req.ud_emit(1, &mrs, &mut link), Ok(Emitted::Sent));
    let mut wc = Vec::new();
    req.take_done(&mut wc);
    assert_eq!(
        wc.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(1, WcStatus::Success), (2, WcStatus::Success)]
    );
    let mut rx = LinkReader::new();
    rx.feed(&link);
    let (f, p) = rx.next_datagram().unwrap().unwrap();
    assert_eq!((f.payload_len() as usize, p.len()), (len, len));
    assert!(rx.next_datagram().unwrap().is_none());
}

/// A receive too short for the GRH and the payload completes with LOC_LEN_ERR and is
/// not written; the responder goes on with the next receive.
#[test]
fn a_receive_too_short_is_a_length_error_and_stays_unwritten() {
    let (mrs, mr) = region();
    let mut req = requester();
    let mut resp = responder();
    write(&mr, 8192, &[0xee; 200]);
    resp.post(&RecvWr::new(1, &[sge(&mr, 8192, 40 + 9)])).unwrap();
    resp.post(&RecvWr::new(2, &[sge(&mr, 9000, 40 + 10)])).unwrap();
    let wr = [sge(&mr, 0, 10)];
    for id in [1, 2] {
        req.post_ud(
            &SendWr::send(id, &wr).ud(&Ah, DST_QPN, QKEY),
            route(Some(Grh::default())),
            &mrs,
        )
        .unwrap();
    }
    let (link, _) = emit_all(&mut req, &mrs);
    let (outcomes, out) = receive_all(&mut resp, &mrs, &link);
    assert_eq!(outcomes, [UdOutcome::TooLong, UdOutcome::Received]);
    assert_eq!((out[0].0.wr_id, out[0].0.status), (1, WcStatus::LocLenErr));
    assert_eq!(read(&mr, 8192, 200), vec![0xee; 200], "nothing written");
    assert_eq!(
        (out[1].0.wr_id, out[1].0.status, out[1].0.byte_len),
        (2, WcStatus::Success, 50)
    );
}

/// Two UD QPs on one SRQ take its receives in order; each completion names the QP the
/// datagram came to.
#[test]
fn an_srq_serves_ud_qps_first_in_first_out() {
    let (mrs, mr) = region();
    let srq = Arc::new(SharedRecvQueue::new(1, 8, 1, 0));
    let mut a = Responder::with_srq(0x31, PD, srq.clone()).datagram();
    let mut b = Responder::with_srq(0x32, PD, srq.clone()).datagram();
    a.qkey = QKEY;
    b.qkey = QKEY;
    for id in 1..=2 {
        srq.post_all(&[RecvWr::new(id, &[sge(&mr, 8192 + 1024 * id as usize, 100)])])
            .unwrap();
    }
    let mut req = requester();
    let wr = [sge(&mr, 0, 4)];
    req.post_ud(&SendWr::send(1, &wr).ud(&Ah, 0x32, QKEY), route(None), &mrs)
        .unwrap();
    let (link, _) = emit_all(&mut req, &mrs);
    let (_, out_b) = receive_all(&mut b, &mrs, &link);
    let (_, out_a) = receive_all(&mut a, &mrs, &link);
    assert_eq!((out_b[0].0.wr_id, out_b[0].0.qp_num), (1, 0x32));
    assert_eq!((out_a[0].0.wr_id, out_a[0].0.qp_num), (2, 0x31));
    assert_eq!(out_a[0].0.src_qp, SRC_QPN);
}

/// What `ibv_post_send` refuses: an opcode UD does not have, a UD send without a
/// destination, a connected QP's send with one.
#[test]
fn post_checks_the_opcode_and_the_destination() {
    let (mrs, mr) = region();
    let mut req = requester();
    let wr = [sge(&mr, 0, 8)];
    let write = SendWr::write(1, &wr, (mr.addr(), KEY)).ud(&Ah, DST_QPN, QKEY);
    assert_eq!(req.post_ud(&write, route(None), &mrs), Err(PostCheck::NotUd));
    assert_eq!(
        req.post(&SendWr::send(2, &wr), &mrs),
        Err(PostCheck::NoUdDestination)
    );
    let cap = QpCap::new(4, 4);
    let mut rc = Requester::new(3, PD, &cap, false);
    let send = SendWr::send(3, &wr).ud(&Ah, DST_QPN, QKEY);
    assert_eq!(rc.post(&send, &mrs), Err(PostCheck::UdDestination));
    assert_eq!(
        rc.post_ud(&send, route(None), &mrs),
        Err(PostCheck::UdDestination)
    );
    assert_eq!(req.outstanding() + rc.outstanding(), 0);
}

/// A UD send's lkey that names no region, or a region of another PD, takes the
/// profile's status as RC's and UC's do (`Switches::send_bad_lkey`: rxe's `lookup_mr()`
/// refuses both, LOC_QP_OP_ERR); an SGE past its region is LOC_PROT_ERR under every
/// profile. Nothing goes on the link.
#[test]
fn a_bad_send_lkey_takes_the_profiles_status() {
    let (mrs, mr) = region();
    let other_pd = Arc::new(MrShared::new_owned(PD + 1, KEY + 2, 64, AccessFlags::LOCAL_WRITE).unwrap());
    mrs.insert(other_pd.clone());
    let no_region = Sge::new(mr.addr(), 8, KEY + 1);
    let foreign = Sge::new(other_pd.addr(), 8, KEY + 2);
    let past_end = Sge::new(mr.addr() + 16380, 8, KEY);
    for (sw, bad_lkey) in [
        (Switches::PORTABLE, WcStatus::LocProtErr),
        (Switches::RXE, WcStatus::LocQpOpErr),
        (Switches::MLX5, WcStatus::LocProtErr),
    ] {
        for (sge, want) in [
            (no_region, bad_lkey),
            (foreign, bad_lkey),
            (past_end, WcStatus::LocProtErr),
        ] {
            let mut req = requester().with_profile(sw, 1 << 20, 4096);
            req.post_ud(&SendWr::send(1, &[sge]).ud(&Ah, DST_QPN, QKEY), route(None), &mrs)
                .unwrap();
            let mut link = Vec::new();
            assert_eq!(
                req.ud_emit(0, &mrs, &mut link),
                Err(Fatal(want)),
                "{sge:?} under {sw:?}"
            );
            assert!(link.is_empty());
            let mut wc = Vec::new();
            req.take_done(&mut wc);
            assert_eq!(wc[0].status, want);
        }
    }
}

/// A bad lkey in a send's gather list fails its WR with LOC_PROT_ERR (the QP goes to
/// SQE or ERR) and puts nothing on the link; one in a receive's scatter list fails the
/// receive the same way.
#[test]
fn bad_lkeys_are_local_protection_errors() {
    let (mrs, mr) = region();
    let mut req = requester();
    let bad = [Sge::new(mr.addr(), 8, KEY + 1)];
    req.post_ud(&SendWr::send(1, &bad).ud(&Ah, DST_QPN, QKEY), route(None), &mrs)
        .unwrap();
    let mut link = Vec::new();
    assert_eq!(req.ud_emit(0, &mrs, &mut link), Err(Fatal(WcStatus::LocProtErr)));
    assert!(link.is_empty());
    let mut wc = Vec::new();
    req.take_done(&mut wc);
    assert_eq!(wc[0].status, WcStatus::LocProtErr);

    let mut resp = responder();
    resp.post(&RecvWr::new(7, &[Sge::new(mr.addr() + 8192, 100, KEY + 1)]))
        .unwrap();
    let good = [sge(&mr, 0, 8)];
    req.post_ud(&SendWr::send(2, &good).ud(&Ah, DST_QPN, QKEY), route(None), &mrs)
        .unwrap();
    let (link, _) = emit_all(&mut req, &mrs);
    let mut rx = LinkReader::new();
    rx.feed(&link);
    let (f, p) = rx.next_datagram().unwrap().unwrap();
    let mut out = Vec::new();
    assert_eq!(
        resp.on_datagram(&f, p, &SRC, &mrs, &mut out),
        Err(Fatal(WcStatus::LocProtErr))
    );
    assert_eq!((out[0].0.wr_id, out[0].0.status), (7, WcStatus::LocProtErr));
}

/// WRs complete in posting order whatever order their datagrams leave in: one waiting
/// for its link holds back the completions of those after it, not their datagrams. In
/// SQD a WR not yet started stays; one waiting for its link still goes.
#[test]
fn completions_keep_posting_order_and_sqd_starts_nothing() {
    let (mrs, mr) = region();
    let mut req = requester();
    let wr = [sge(&mr, 0, 4)];
    for id in 1..=3 {
        req.post_ud(&SendWr::send(id, &wr).ud(&Ah, DST_QPN, QKEY), route(None), &mrs)
            .unwrap();
    }
    let mut link = Vec::new();
    req.ud_wait(0);
    assert_eq!(req.ud_next(1).map(|(i, _)| i), Some(1));
    req.ud_emit(1, &mrs, &mut link).unwrap();
    let mut wc = Vec::new();
    req.take_done(&mut wc);
    assert!(wc.is_empty(), "WR 2 completed before WR 1: {wc:?}");
    req.draining = true;
    assert!(!req.drained());
    assert_eq!(req.ud_next(0).map(|(i, _)| i), Some(0), "started: it goes in SQD");
    req.ud_lost(0);
    assert_eq!(req.ud_next(0), None, "WR 3 was never started");
    assert!(req.drained());
    req.take_done(&mut wc);
    assert_eq!(wc.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2]);
    req.draining = false;
    assert_eq!(req.ud_next(0).map(|(i, _)| i), Some(0));
}
