//! UD QPs and address handles on the sim (`man ibv_create_ah`, `ibv_post_send`'s `wr.ud`,
//! `ibv_post_recv`'s 40 bytes of GRH, `ibv_poll_cq`'s `src_qp` and `slid`; IBA 9.8.4),
//! through the verbs-api traits only, between two devices (and on one): datagrams arrive
//! behind the GRH, which is there (and flagged) only when the sender's address handle had
//! one; a wrong Q_Key is dropped and counted in the port's `qkey_viol_cntr`, and a Q_Key
//! with the high bit set stands for the sender's own; a datagram that finds no receive is
//! dropped and counted; nothing above the MTU leaves; two senders are told apart by
//! `src_qp` and `slid`; an SRQ serves UD QPs; a receive too short is LOC_LEN_ERR with
//! nothing written; fault injection loses datagrams and nothing else; what `post_send`
//! refuses; one link per pair of devices, whichever sends first, reused both ways; one
//! post to many devices; a device nobody listens at loses the datagrams and completes the
//! WRs.

use std::time::{Duration, Instant};

use backend_sim::{SimAh, SimBackend, SimContext, SimCq, SimMr, SimPd, SimQp};
use verbs_api::*;

const WAIT: Duration = Duration::from_secs(5);
const QUIET: Duration = Duration::from_millis(300);
const QKEY: u32 = 0x1111_1111;
const GRH: usize = 40;

/// RESET → INIT → RTR → RTS with UD's attributes (`man ibv_modify_qp`, UD).
fn ud_up(qp: &SimQp, qkey: u32) {
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey,
        ..Default::default()
    };
    qp.modify(
        &init,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    )
    .unwrap();
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..Default::default()
    };
    qp.modify(&rtr, QpAttrMask::STATE).unwrap();
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: 7,
        ..Default::default()
    };
    qp.modify(&rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN).unwrap();
}

/// One device's side: a PD, a CQ, a 16 KiB region.
struct Side {
    ctx: SimContext,
    pd: SimPd,
    cq: SimCq,
    mr: SimMr,
}

impl Side {
    fn new(ctx: SimContext) -> Side {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256, None).unwrap();
        let mr = pd.reg_mr(16384, AccessFlags::LOCAL_WRITE).unwrap();
        Side { ctx, pd, cq, mr }
    }

    /// A UD QP in RTS with Q_Key `qkey`.
    fn qp(&self, qkey: u32) -> SimQp {
        let qp = self
            .pd
            .create_qp(&QpInitAttr::ud(
                &self.cq,
                &self.cq,
                QpCap::new(64, 64).with_inline(64),
            ))
            .unwrap();
        assert_eq!(qp.qp_type(), QpType::Ud);
        ud_up(&qp, qkey);
        qp
    }

    /// An address handle to `qp` of the device `to`, with or without the GRH.
    fn ah_to(&self, to: &SimContext, qp: &SimQp, global: bool) -> SimAh {
        let ep = local_endpoint(to, qp, &RcParams::default(), 0).unwrap();
        let attr = AhAttr {
            is_global: global,
            ..ah_attr_for(&ep, &RcParams::default())
        };
        let ah = self.pd.create_ah(&attr).unwrap();
        assert_eq!(ah.attr(), attr);
        ah
    }

    fn gid(&self) -> Gid {
        self.ctx.query_gid(1, 0).unwrap()
    }

    fn lid(&self) -> u16 {
        self.ctx.query_port(1).unwrap().lid
    }
}

fn two_devices() -> (SimBackend, Side, Side) {
    let sim = SimBackend::default();
    let a = Side::new(sim.open("sim0").unwrap());
    let b = Side::new(sim.open("sim1").unwrap());
    (sim, a, b)
}

/// Sends `len` bytes at `at` of `from.mr` from `qp` to `(address handle, QPN, Q_Key)`,
/// and waits for the sender's completion, which must be SUCCESS.
fn send(from: &Side, qp: &SimQp, (ah, dst, qkey): (&SimAh, u32, u32), wr_id: u64, at: usize, len: usize) {
    qp.post_send(&[SendWr::send(wr_id, &[from.mr.sge(at, len).unwrap()])
        .signaled()
        .ud(ah, dst, qkey)])
        .unwrap();
    let wc = poll_n(&from.cq, 1, WAIT).unwrap();
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].opcode),
        (wr_id, WcStatus::Success, WcOpcode::Send),
        "{wc:?}"
    );
}

fn post_recv(side: &Side, qp: &SimQp, wr_id: u64, at: usize, len: usize) {
    qp.post_recv(&[RecvWr::new(wr_id, &[side.mr.sge(at, len).unwrap()])])
        .unwrap();
}

/// Polls `cq` for `d` and returns what came (nothing should).
fn quiet(cq: &SimCq, d: Duration) -> Vec<WorkCompletion> {
    let end = Instant::now() + d;
    let mut got = Vec::new();
    let mut wc = [WorkCompletion::default(); 8];
    while Instant::now() < end {
        let n = cq.poll(&mut wc).unwrap();
        got.extend_from_slice(&wc[..n]);
        std::thread::sleep(Duration::from_millis(5));
    }
    got
}

/// From sim0 to sim1 through a global address handle: the GRH (IB's: IP version 6, the
/// handle's traffic class, flow label and hop limit, IBA's payload length, next header
/// 0x1B, the sender device's GID and the destination GID) fills the first 40 bytes and is
/// flagged; the payload follows, `byte_len` counts both, and the completion names the
/// sending QP and its device's LID. Through a handle without the GRH the 40 bytes are
/// left alone and the flag is not set.
#[test]
fn datagrams_arrive_behind_the_grh_which_only_a_global_handle_writes() {
    let (_sim, a, b) = two_devices();
    let s = a.qp(QKEY);
    let r = b.qp(QKEY);
    b.mr.fill(0xee);
    a.mr.write(0, b"through a global handle").unwrap();
    a.mr.write(64, b"and without the GRH").unwrap();
    let ep = local_endpoint(&b.ctx, &r, &RcParams::default(), 0).unwrap();
    let attr = AhAttr {
        grh: GlobalRoute {
            dgid: ep.gid,
            flow_label: 0x1_2345,
            sgid_index: 0,
            hop_limit: 9,
            traffic_class: 0xa4,
        },
        dlid: ep.lid,
        is_global: true,
        port_num: 1,
        ..Default::default()
    };
    let global = a.pd.create_ah(&attr).unwrap();
    let local = a.ah_to(&b.ctx, &r, false);
    post_recv(&b, &r, 1, 0, 1024);
    post_recv(&b, &r, 2, 4096, 1024);
    send(&a, &s, (&global, r.qp_num(), QKEY), 10, 0, 23);
    send(&a, &s, (&local, r.qp_num(), QKEY), 11, 64, 19);
    let wc = poll_n(&b.cq, 2, WAIT).unwrap();
    let (w1, w2) = (&wc[0], &wc[1]);
    assert_eq!(
        (w1.wr_id, w1.status, w1.opcode),
        (1, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(w1.byte_len as usize, GRH + 23);
    assert_eq!(
        (w1.qp_num, w1.src_qp, w1.slid, w1.sl, w1.pkey_index),
        (r.qp_num(), s.qp_num(), a.lid(), 0, 0)
    );
    assert!(w1.wc_flags.contains(WcFlags::GRH), "{:?}", w1.wc_flags);
    let mut h = [0u8; GRH];
    b.mr.read(0, &mut h).unwrap();
    assert_eq!(h[0] >> 4, 6, "IP version");
    assert_eq!((h[0] << 4) | (h[1] >> 4), 0xa4, "traffic class");
    assert_eq!(
        u32::from_be_bytes([0, h[1] & 0xf, h[2], h[3]]),
        0x1_2345,
        "flow label"
    );
    // BTH 12 + DETH 8 + 23 bytes padded to 24 + ICRC 4.
    assert_eq!(u16::from_be_bytes([h[4], h[5]]), 48, "payload length");
    assert_eq!((h[6], h[7]), (0x1b, 9), "next header, hop limit");
    assert_eq!(&h[8..24], &a.gid().0, "source GID: the sending device's");
    assert_eq!(&h[24..40], &ep.gid.0, "destination GID");
    let mut p = [0u8; 24];
    b.mr.read(GRH, &mut p).unwrap();
    assert_eq!(&p, b"through a global handle\xee");
    assert_eq!(
        (w2.wr_id, w2.byte_len as usize, w2.src_qp, w2.slid),
        (2, GRH + 19, s.qp_num(), a.lid())
    );
    assert!(!w2.wc_flags.contains(WcFlags::GRH), "{:?}", w2.wc_flags);
    let mut h = [0u8; GRH];
    b.mr.read(4096, &mut h).unwrap();
    assert_eq!(h, [0xee; GRH], "no GRH: the 40 bytes are not written");
    let mut p = [0u8; 20];
    b.mr.read(4096 + GRH, &mut p).unwrap();
    assert_eq!(&p, b"and without the GRH\xee");
}

/// One UD QP receives from a QP of its own device and from one of another device, and
/// tells them apart by `src_qp` and `slid`; SEND_WITH_IMM brings its immediate and the
/// solicited bit; an inline send arrives like any other.
#[test]
fn one_qp_hears_many_senders_and_tells_them_apart() {
    let (_sim, a, b) = two_devices();
    let r = b.qp(QKEY);
    let near = b.qp(QKEY);
    let far = a.qp(QKEY);
    let ah_far = a.ah_to(&b.ctx, &r, true);
    let ah_near = b.ah_to(&b.ctx, &r, true);
    for i in 0..3 {
        post_recv(&b, &r, i, 1024 * i as usize, 1024);
    }
    a.mr.write(0, b"far").unwrap();
    b.mr.write(8192, b"near").unwrap();
    send(&a, &far, (&ah_far, r.qp_num(), QKEY), 1, 0, 3);
    near.post_send(&[
        SendWr::send_with_imm(2, &[b.mr.sge(8192, 4).unwrap()], 0xfeed)
            .signaled()
            .solicited()
            .ud(&ah_near, r.qp_num(), QKEY),
        SendWr::send(3, &[b.mr.sge(8192, 4).unwrap()])
            .signaled()
            .inline()
            .ud(&ah_near, r.qp_num(), QKEY),
    ])
    .unwrap();
    let wc = poll_n(&b.cq, 5, WAIT).unwrap();
    let recvs: Vec<_> = wc.iter().filter(|w| w.opcode == WcOpcode::Recv).collect();
    assert_eq!(recvs.len(), 3, "{wc:?}");
    assert!(wc.iter().all(|w| w.is_ok()), "{wc:?}");
    for w in recvs {
        let mut p = [0u8; 4];
        b.mr.read(1024 * w.wr_id as usize + GRH, &mut p).unwrap();
        if &p[..3] == b"far" {
            assert_eq!((w.src_qp, w.slid, w.imm()), (far.qp_num(), a.lid(), None));
        } else {
            assert_eq!(&p, b"near");
            assert_eq!((w.src_qp, w.slid), (near.qp_num(), b.lid()));
        }
    }
    assert!(a.lid() != b.lid());
    let imm: Vec<_> = wc.iter().filter_map(|w| w.imm()).collect();
    assert_eq!(imm, [0xfeed]);
}

/// A datagram with another Q_Key is dropped and counted in the port's `qkey_viol_cntr`;
/// the receive stays for the next datagram. A WR's Q_Key with the high bit set stands for
/// the sending QP's own (IBA 10.2.5): a sender whose own Q_Key matches gets through.
#[test]
fn a_wrong_qkey_is_dropped_and_counted() {
    let (_sim, a, b) = two_devices();
    let s = a.qp(QKEY);
    let other = a.qp(0x2222);
    let r = b.qp(QKEY);
    let ah = a.ah_to(&b.ctx, &r, true);
    post_recv(&b, &r, 1, 0, 1024);
    let before = b.ctx.query_port(1).unwrap().qkey_viol_cntr;
    send(&a, &s, (&ah, r.qp_num(), QKEY ^ 0x100), 1, 0, 8);
    send(&a, &other, (&ah, r.qp_num(), 0x8000_0000), 2, 0, 8);
    let got = quiet(&b.cq, QUIET);
    assert!(got.is_empty(), "{got:?}");
    assert_eq!(b.ctx.query_port(1).unwrap().qkey_viol_cntr, before + 2);
    send(&a, &s, (&ah, r.qp_num(), 0x8000_0000), 3, 0, 8);
    let wc = poll_n(&b.cq, 1, WAIT).unwrap();
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].src_qp),
        (1, WcStatus::Success, s.qp_num())
    );
    assert_eq!(r.state().unwrap(), QpState::Rts);
}

/// A datagram that finds no receive is dropped (the sender completes SUCCESS, the
/// receiver sees nothing and stays in RTS) and counted in `ud_dropped`; so is one for a
/// QP that does not exist, and one for a QP that does not receive yet (INIT).
#[test]
fn a_datagram_without_a_receive_is_dropped_and_counted() {
    let (_sim, a, b) = two_devices();
    let s = a.qp(QKEY);
    let r = b.qp(QKEY);
    let ah = a.ah_to(&b.ctx, &r, true);
    let init =
        b.pd.create_qp(&QpInitAttr::ud(&b.cq, &b.cq, QpCap::new(4, 4)))
            .unwrap();
    init.modify(
        &QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey: QKEY,
            ..Default::default()
        },
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    )
    .unwrap();
    post_recv(&b, &init, 9, 8192, 1024);
    let before = b.ctx.counters().ud_dropped;
    send(&a, &s, (&ah, r.qp_num(), QKEY), 1, 0, 8);
    send(&a, &s, (&ah, r.qp_num() ^ 0x40_0000, QKEY), 2, 0, 8);
    send(&a, &s, (&ah, init.qp_num(), QKEY), 3, 0, 8);
    let got = quiet(&b.cq, QUIET);
    assert!(got.is_empty(), "{got:?}");
    assert_eq!(b.ctx.counters().ud_dropped, before + 3);
    assert_eq!(r.state().unwrap(), QpState::Rts);
    post_recv(&b, &r, 4, 0, 1024);
    send(&a, &s, (&ah, r.qp_num(), QKEY), 5, 0, 8);
    assert_eq!(poll_n(&b.cq, 1, WAIT).unwrap()[0].wr_id, 4);
}

/// A send longer than the port's active MTU (the profile's, which the port reports: 1024
/// under the default `portable`) completes SUCCESS
/// and nothing leaves (IBA C10-93.1.1; counted in `ud_unsent`); one of exactly the MTU
/// arrives whole.
#[test]
fn nothing_above_the_mtu_leaves() {
    let (_sim, a, b) = two_devices();
    let mtu = a.ctx.query_port(1).unwrap().active_mtu.bytes() as usize;
    assert_eq!(
        mtu as u32,
        backend_sim::Profile::Portable.attrs().active_mtu.bytes()
    );
    let s = a.qp(QKEY);
    let r = b.qp(QKEY);
    let ah = a.ah_to(&b.ctx, &r, true);
    let data: Vec<u8> = (0..mtu + 1).map(|i| (i * 7) as u8).collect();
    a.mr.write(0, &data).unwrap();
    post_recv(&b, &r, 1, 0, GRH + mtu + 1);
    let unsent = a.ctx.counters().ud_unsent;
    send(&a, &s, (&ah, r.qp_num(), QKEY), 1, 0, mtu + 1);
    assert!(quiet(&b.cq, QUIET).is_empty());
    assert_eq!(a.ctx.counters().ud_unsent, unsent + 1);
    send(&a, &s, (&ah, r.qp_num(), QKEY), 2, 0, mtu);
    let wc = poll_n(&b.cq, 1, WAIT).unwrap();
    assert_eq!(
        (wc[0].status, wc[0].byte_len as usize),
        (WcStatus::Success, GRH + mtu)
    );
    let mut got = vec![0u8; mtu];
    b.mr.read(GRH, &mut got).unwrap();
    assert_eq!(got, data[..mtu]);
}

/// UD QPs on one SRQ take its receives first in first out; each completion names the
/// QP the datagram came to and the sender.
#[test]
fn an_srq_serves_ud_qps() {
    let (_sim, a, b) = two_devices();
    let srq = b.pd.create_srq(&SrqAttr::new(16, 1)).unwrap();
    let cap = QpCap::new(8, 0);
    let rs: Vec<SimQp> = (0..2)
        .map(|_| {
            let q =
                b.pd.create_qp(&QpInitAttr::ud(&b.cq, &b.cq, cap).with_srq(&srq))
                    .unwrap();
            ud_up(&q, QKEY);
            q
        })
        .collect();
    let s = a.qp(QKEY);
    for i in 0..3u64 {
        srq.post_recv(&[RecvWr::new(i, &[b.mr.sge(1024 * i as usize, 512).unwrap()])])
            .unwrap();
    }
    let err = rs[0]
        .post_recv(&[RecvWr::new(9, &[b.mr.sge(0, 64).unwrap()])])
        .unwrap_err();
    assert_eq!(err.errno(), libc::EINVAL);
    let ahs: Vec<SimAh> = rs.iter().map(|q| a.ah_to(&b.ctx, q, true)).collect();
    for (i, to) in [1usize, 0, 1].into_iter().enumerate() {
        a.mr.write(0, &[i as u8; 4]).unwrap();
        send(&a, &s, (&ahs[to], rs[to].qp_num(), QKEY), i as u64, 0, 4);
        let wc = poll_n(&b.cq, 1, WAIT).unwrap();
        assert_eq!(
            (wc[0].wr_id, wc[0].qp_num, wc[0].src_qp),
            (i as u64, rs[to].qp_num(), s.qp_num())
        );
        let mut p = [0u8; 4];
        b.mr.read(1024 * i + GRH, &mut p).unwrap();
        assert_eq!(p, [i as u8; 4]);
    }
}

/// A receive too short for the 40 bytes and the payload completes with LOC_LEN_ERR, and
/// nothing is written into it; the QP stays in RTS and takes the next datagram.
#[test]
fn a_receive_too_short_is_a_length_error() {
    let (_sim, a, b) = two_devices();
    let s = a.qp(QKEY);
    let r = b.qp(QKEY);
    let ah = a.ah_to(&b.ctx, &r, true);
    b.mr.fill(0xee);
    post_recv(&b, &r, 1, 0, GRH + 99);
    post_recv(&b, &r, 2, 4096, GRH + 100);
    send(&a, &s, (&ah, r.qp_num(), QKEY), 1, 0, 100);
    let wc = poll_n(&b.cq, 1, WAIT).unwrap();
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::LocLenErr));
    assert!(
        b.mr.to_vec()[..4096].iter().all(|&x| x == 0xee),
        "a short receive was written"
    );
    assert_eq!(r.state().unwrap(), QpState::Rts);
    send(&a, &s, (&ah, r.qp_num(), QKEY), 2, 0, 100);
    let wc = poll_n(&b.cq, 1, WAIT).unwrap();
    assert_eq!(
        (wc[0].wr_id, wc[0].status, wc[0].byte_len),
        (2, WcStatus::Success, 140)
    );
}

/// Fault injection loses the next datagrams of a QP: their WRs complete SUCCESS, nothing
/// arrives, the receives stay for the datagrams after them, and nothing else changes.
#[test]
fn injected_loss_loses_datagrams_and_nothing_else() {
    let (_sim, a, b) = two_devices();
    let s = a.qp(QKEY);
    let r = b.qp(QKEY);
    let ah = a.ah_to(&b.ctx, &r, true);
    for i in 0..4 {
        post_recv(&b, &r, i, 1024 * i as usize, 512);
    }
    a.ctx.faults().drop_datagrams(s.qp_num(), 2).unwrap();
    for i in 0..5u8 {
        a.mr.write(64 * i as usize, &[i; 8]).unwrap();
        send(&a, &s, (&ah, r.qp_num(), QKEY), i as u64, 64 * i as usize, 8);
    }
    let wc = poll_n(&b.cq, 3, WAIT).unwrap();
    assert!(quiet(&b.cq, QUIET).is_empty());
    for (k, w) in wc.iter().enumerate() {
        assert_eq!((w.wr_id, w.status), (k as u64, WcStatus::Success));
        let mut p = [0u8; 8];
        b.mr.read(1024 * k + GRH, &mut p).unwrap();
        assert_eq!(p, [k as u8 + 2; 8], "the third datagram is the first to arrive");
    }
    assert_eq!(a.ctx.faults().stats().datagrams_dropped, 2);
    assert_eq!(
        (s.state().unwrap(), r.state().unwrap()),
        (QpState::Rts, QpState::Rts)
    );
    let rc =
        a.pd.create_qp(&QpInitAttr::rc(&a.cq, &a.cq, QpCap::new(1, 1)))
            .unwrap();
    assert_eq!(
        a.ctx.faults().drop_datagrams(rc.qp_num(), 1).unwrap_err().errno(),
        libc::EINVAL
    );
}

/// What `post_send` refuses with EINVAL, naming the WR: an RDMA WRITE on a UD QP, a UD
/// send without a destination, one through another device's address handle, a connected
/// QP's send with a UD destination, inline data beyond `max_inline_data`. Nothing is
/// sent, and the QPs keep working.
#[test]
fn post_send_refuses_what_ud_has_not() {
    let (_sim, a, b) = two_devices();
    let s = a.qp(QKEY);
    let r = b.qp(QKEY);
    let ah = a.ah_to(&b.ctx, &r, true);
    let foreign = b.ah_to(&b.ctx, &r, true);
    let sge = [a.mr.sge(0, 8).unwrap()];
    let big = [a.mr.sge(0, 65).unwrap()];
    let rc =
        a.pd.create_qp(&QpInitAttr::rc(&a.cq, &a.cq, QpCap::new(4, 4)))
            .unwrap();
    let refused = [
        (
            &s,
            SendWr::write(1, &sge, (a.mr.addr(), a.mr.rkey())).ud(&ah, r.qp_num(), QKEY),
        ),
        (&s, SendWr::send(2, &sge)),
        (&s, SendWr::send(3, &sge).ud(&foreign, r.qp_num(), QKEY)),
        (&s, SendWr::send(4, &big).inline().ud(&ah, r.qp_num(), QKEY)),
        (&rc, SendWr::send(5, &sge).ud(&ah, r.qp_num(), QKEY)),
    ];
    for (qp, wr) in refused {
        // On the UD QP a good WR goes first: it is posted, and the error names the next.
        let good = SendWr::send(0, &sge).ud(&ah, r.qp_num(), QKEY);
        let e = match qp.qp_type() {
            QpType::Ud => qp.post_send(&[good, wr]).unwrap_err(),
            _ => qp.post_send(&[wr]).unwrap_err(),
        };
        assert_eq!(e.errno(), libc::EINVAL, "wr {}: {e}", wr.wr_id);
        assert_eq!(e.wr_id, wr.wr_id, "{e}");
    }
    // Nothing was sent but the good WRs, and the queues still work.
    assert!(quiet(&b.cq, QUIET).is_empty());
    post_recv(&b, &r, 1, 0, 1024);
    send(&a, &s, (&ah, r.qp_num(), QKEY), 9, 0, 8);
    let wc = poll_n(&b.cq, 1, WAIT).unwrap();
    assert!(wc[0].is_ok());
}

/// A datagram to a device where nobody listens is lost: its WR completes SUCCESS once the
/// link cannot be set up, and the loss is counted; later ones within the hold are lost at
/// once.
#[test]
fn a_device_nobody_listens_at_loses_the_datagrams() {
    let (_sim, a, _b) = two_devices();
    let s = a.qp(QKEY);
    // A port nobody listens at: bound, then closed.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let attr = AhAttr {
        dlid: port,
        port_num: 1,
        ..Default::default()
    };
    let ah = a.pd.create_ah(&attr).unwrap();
    let unsent = a.ctx.counters().ud_unsent;
    let t0 = Instant::now();
    send(&a, &s, (&ah, 0x1234, QKEY), 1, 0, 8);
    send(&a, &s, (&ah, 0x1234, QKEY), 2, 0, 8);
    assert!(t0.elapsed() < WAIT);
    assert_eq!(a.ctx.counters().ud_unsent, unsent + 2);
    assert_eq!(s.state().unwrap(), QpState::Rts);
}

/// The TCP connections established with local port `port` and with remote port `port`.
fn connections(port: u16) -> (usize, usize) {
    let mut local = 0;
    let mut remote = 0;
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address rem_address st (01: ESTABLISHED), ports in hex.
            let port_of = |a: &str| u16::from_str_radix(a.rsplit(':').next().unwrap(), 16).unwrap();
            if f.len() > 3 && f[3] == "01" {
                local += usize::from(port_of(f[1]) == port);
                remote += usize::from(port_of(f[2]) == port);
            }
        }
    }
    (local, remote)
}

/// Many UD QPs on two devices exchange datagrams both ways over one connection (over TCP,
/// and over the same-host socket): the first send opens it, every other QP of both
/// devices uses it.
#[test]
fn one_link_per_pair_of_devices_carries_every_qp_both_ways() {
    use backend_sim::same_host::Transport;
    for transport in [Transport::Tcp, Transport::Auto] {
        one_link_per_pair(transport);
    }
}

fn one_link_per_pair(transport: backend_sim::same_host::Transport) {
    let sim = SimBackend::new(backend_sim::SimConfig {
        transport,
        ..Default::default()
    });
    let (a, b) = (
        Side::new(sim.open("sim0").unwrap()),
        Side::new(sim.open("sim1").unwrap()),
    );
    let qa: Vec<SimQp> = (0..3).map(|_| a.qp(QKEY)).collect();
    let qb: Vec<SimQp> = (0..3).map(|_| b.qp(QKEY)).collect();
    assert_eq!(connections(a.lid()), (0, 0));
    assert_eq!(connections(b.lid()), (0, 0));
    for (i, q) in qb.iter().enumerate() {
        for k in 0..3 {
            post_recv(&b, q, (i * 3 + k) as u64, (i * 3 + k) * 1024, 512);
        }
    }
    for (i, q) in qa.iter().enumerate() {
        for k in 0..3 {
            post_recv(&a, q, (i * 3 + k) as u64, (i * 3 + k) * 1024, 512);
        }
    }
    for s in &qa {
        for r in &qb {
            send(&a, s, (&a.ah_to(&b.ctx, r, true), r.qp_num(), QKEY), 0, 12000, 8);
        }
    }
    assert_eq!(poll_n(&b.cq, 9, WAIT).unwrap().len(), 9);
    for s in &qb {
        for r in &qa {
            send(&b, s, (&b.ah_to(&a.ctx, r, true), r.qp_num(), QKEY), 0, 12000, 8);
        }
    }
    assert_eq!(poll_n(&a.cq, 9, WAIT).unwrap().len(), 9);
    // One link, set up once (each end counts it).
    let links = |c: &SimContext| {
        let n = c.counters();
        n.same_host_connections + n.tcp_connections
    };
    assert_eq!((links(&a.ctx), links(&b.ctx)), (1, 1));
    if transport != backend_sim::same_host::Transport::Tcp {
        return;
    }
    // sim0 opened the one link: its socket's remote port is sim1's LID, the accepted
    // end's local port; nothing connected to sim0's listener (the checks of the link's
    // hello came and went).
    assert_eq!(connections(b.lid()), (1, 1));
    assert_eq!(connections(a.lid()), (0, 0));
}

/// One post of datagrams to twelve devices (more links than a post writes itself: the
/// rest are written by their links' tasks): every datagram arrives, each named by its
/// sender, and the links, set up while the WRs waited, complete them in posting order.
#[test]
fn one_post_reaches_many_devices() {
    let sim = SimBackend::new(backend_sim::SimConfig {
        devices: 13,
        ..Default::default()
    });
    let a = Side::new(sim.open("sim0").unwrap());
    let s = a.qp(QKEY);
    let far: Vec<Side> = (1..13)
        .map(|i| Side::new(sim.open(&format!("sim{i}")).unwrap()))
        .collect();
    let rs: Vec<SimQp> = far.iter().map(|d| d.qp(QKEY)).collect();
    let ahs: Vec<SimAh> = far
        .iter()
        .zip(&rs)
        .map(|(d, r)| a.ah_to(&d.ctx, r, true))
        .collect();
    for (d, r) in far.iter().zip(&rs) {
        post_recv(d, r, 1, 0, 1024);
    }
    for round in 0..2u64 {
        a.mr.write(0, &[round as u8; 8]).unwrap();
        let sge = [a.mr.sge(0, 8).unwrap()];
        let wrs: Vec<SendWr<'_>> = ahs
            .iter()
            .zip(&rs)
            .enumerate()
            .map(|(i, (ah, r))| SendWr::send(i as u64, &sge).signaled().ud(ah, r.qp_num(), QKEY))
            .collect();
        s.post_send(&wrs).unwrap();
        let wc = poll_n(&a.cq, 12, WAIT).unwrap();
        assert_eq!(
            wc.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
            (0..12).collect::<Vec<_>>()
        );
        for (d, r) in far.iter().zip(&rs) {
            let w = poll_n(&d.cq, 1, WAIT).unwrap();
            assert_eq!((w[0].src_qp, w[0].slid), (s.qp_num(), a.lid()));
            let mut p = [0u8; 8];
            d.mr.read(GRH, &mut p).unwrap();
            assert_eq!(p, [round as u8; 8]);
            post_recv(d, r, 2, 0, 1024);
        }
    }
}

/// A sender faster than the link: 8 MiB of datagrams of the port's MTU (far more than the
/// link's queue and the sockets' buffers hold) posted as fast as the send queue takes
/// them. The send queue waits for the wire, as an HCA's does: every datagram arrives and
/// none is counted as unsent. (Before, a full link queue lost datagrams, and a receiver
/// counting messages, as `ib_send_bw -c UD` does, never finished.)
#[test]
fn a_sender_faster_than_the_link_waits_and_loses_nothing() {
    let sim = SimBackend::default();
    let a = Side::new(sim.open("sim0").unwrap());
    let b = Side::new(sim.open("sim1").unwrap());
    // Datagrams of the port's MTU (the profile's active MTU).
    let mtu = a.ctx.query_port(1).unwrap().active_mtu.bytes() as usize;
    // 8 MiB of them.
    let total = (8u64 << 20) / mtu as u64;
    let send_cq = a.ctx.create_cq(512, None).unwrap();
    let recv_cq = b.ctx.create_cq(total as u32, None).unwrap();
    let s =
        a.pd.create_qp(&QpInitAttr::ud(&send_cq, &send_cq, QpCap::new(256, 1)))
            .unwrap();
    let r =
        b.pd.create_qp(&QpInitAttr::ud(&recv_cq, &recv_cq, QpCap::new(1, total as u32)))
            .unwrap();
    ud_up(&s, QKEY);
    ud_up(&r, QKEY);
    // Every receive may share one buffer: only the count matters here.
    let rmr = b.pd.reg_mr(GRH + mtu, AccessFlags::LOCAL_WRITE).unwrap();
    let recvs: Vec<_> = (0..total)
        .map(|i| (i, [rmr.sge(0, GRH + mtu).unwrap()]))
        .collect();
    let wrs: Vec<RecvWr<'_>> = recvs.iter().map(|(i, sge)| RecvWr::new(*i, sge)).collect();
    r.post_recv(&wrs).unwrap();
    let smr = a.pd.reg_mr(mtu, AccessFlags::LOCAL_WRITE).unwrap();
    let ah = a.ah_to(&b.ctx, &r, false);
    let (unsent, dropped) = (a.ctx.counters().ud_unsent, b.ctx.counters().ud_dropped);

    let sge = [smr.sge(0, mtu).unwrap()];
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut posted, mut sent, mut received) = (0u64, 0u64, 0u64);
    let mut wc = [WorkCompletion::default(); 64];
    while received < total {
        assert!(
            Instant::now() < deadline,
            "posted {posted}, sent {sent}, received {received} of {total}"
        );
        while posted < total && posted - sent < 256 {
            let wr = SendWr::send(posted, &sge).signaled().ud(&ah, r.qp_num(), QKEY);
            match s.post_send(&[wr]) {
                Ok(()) => posted += 1,
                Err(e) if e.errno() == libc::ENOMEM => break,
                Err(e) => panic!("post_send: {e}"),
            }
        }
        let n = send_cq.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            assert_eq!((w.wr_id, w.status), (sent, WcStatus::Success), "{w:?}");
            sent += 1;
        }
        let n = recv_cq.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            assert_eq!(
                (w.status, w.byte_len),
                (WcStatus::Success, (GRH + mtu) as u32),
                "{w:?}"
            );
            received += 1;
        }
    }
    assert_eq!(a.ctx.counters().ud_unsent, unsent, "datagrams lost at the sender");
    assert_eq!(
        b.ctx.counters().ud_dropped,
        dropped,
        "datagrams dropped at the receiver"
    );
}

/// A datagram reaches a thread that polls its CQ in a loop even while the receiving
/// device's setup thread, whose task reads the link otherwise, gets no CPU (stalled here
/// for 2 s, as on a machine whose cores all run pollers): the poll reads the device's
/// links as it reads its connections. (The link's task alone took a thread wake-up per
/// datagram, and up to a time slice on a busy machine.)
#[test]
fn a_polling_thread_receives_datagrams_without_the_setup_thread() {
    let (_sim, a, b) = two_devices();
    let s = a.qp(QKEY);
    let r = b.qp(QKEY);
    let ah = a.ah_to(&b.ctx, &r, false);
    // The first datagram sets the link up.
    post_recv(&b, &r, 0, 0, 512);
    send(&a, &s, (&ah, r.qp_num(), QKEY), 0, 0, 8);
    assert_eq!(poll_n(&b.cq, 1, WAIT).unwrap()[0].status, WcStatus::Success);

    b.ctx.faults().stall_setup_thread(Duration::from_secs(2)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    post_recv(&b, &r, 1, 1024, 512);
    a.mr.write(64, &[7; 8]).unwrap();
    send(&a, &s, (&ah, r.qp_num(), QKEY), 1, 64, 8);
    let start = Instant::now();
    let mut wc = [WorkCompletion::default(); 1];
    while b.cq.poll(&mut wc).unwrap() == 0 {
        assert!(
            start.elapsed() < Duration::from_millis(500),
            "the datagram waited for the stalled setup thread"
        );
    }
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success), "{wc:?}");
    let mut p = [0u8; 8];
    b.mr.read(1024 + GRH, &mut p).unwrap();
    assert_eq!(p, [7; 8]);
}
