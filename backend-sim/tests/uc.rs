//! UC QPs on the sim (`man ibv_create_qp`, `ibv_modify_qp`, `ibv_post_send` for
//! IBV_QPT_UC; IBA 9.8.3), through the verbs-api traits only: SEND and WRITE (with
//! immediate) arrive; READ and atomics are refused at post; what RC would NAK is dropped
//! silently (the sender completes successfully, the responder stays in RTS, the device
//! counts it): no receive, a bad rkey, a receive too short (LOC_LEN_ERR, nothing written
//! past it); on an SRQ a WRITE_WITH_IMM with a bad rkey completes its receive with
//! REM_ACCESS_ERR; a message whose connection breaks mid-payload is dropped whole and not
//! resent; WRs posted before the connection is up still arrive, and WRs to a peer that
//! never answers complete after the link wait.

mod common;

use std::time::{Duration, Instant};

use backend_sim::faults::BreakPoint;
use backend_sim::{SimBackend, SimContext, SimCq, SimMr, SimPd, SimQp, SimSrq};
use common::connect_uc;
use verbs_api::*;

const WAIT: Duration = Duration::from_secs(5);

/// UC QP `a` on sim0 connected to UC QP `b` on sim1 (optionally on an SRQ), and a
/// source region on sim0 and a destination region (remote write) on sim1.
struct Uc {
    _sim: SimBackend,
    c0: SimContext,
    c1: SimContext,
    _pd0: SimPd,
    _pd1: SimPd,
    cq0: SimCq,
    cq1: SimCq,
    srq: Option<SimSrq>,
    a: SimQp,
    b: SimQp,
    src: SimMr,
    dst: SimMr,
}

fn uc(with_srq: bool) -> Uc {
    let sim = SimBackend::default();
    let (c0, c1) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
    let (pd0, pd1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
    let (cq0, cq1) = (c0.create_cq(64, None).unwrap(), c1.create_cq(64, None).unwrap());
    let srq = with_srq.then(|| pd1.create_srq(&SrqAttr::new(16, 1)).unwrap());
    let cap = QpCap::new(16, 16);
    let a = pd0.create_qp(&QpInitAttr::uc(&cq0, &cq0, cap)).unwrap();
    let ib = QpInitAttr::uc(&cq1, &cq1, cap);
    let b = pd1
        .create_qp(&match &srq {
            Some(s) => ib.with_srq(s),
            None => ib,
        })
        .unwrap();
    assert_eq!(a.qp_type(), QpType::Uc);
    let p = RcParams {
        access: AccessFlags::REMOTE_WRITE,
        ..RcParams::default()
    };
    let ea = local_endpoint(&c0, &a, &p, 100).unwrap();
    let eb = local_endpoint(&c1, &b, &p, 200).unwrap();
    connect_uc(&a, &p, ea.psn, &eb).unwrap();
    connect_uc(&b, &p, eb.psn, &ea).unwrap();
    let src = pd0.reg_mr(1 << 20, AccessFlags::LOCAL_WRITE).unwrap();
    let dst = pd1
        .reg_mr(1 << 20, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .unwrap();
    Uc {
        _sim: sim,
        c0,
        c1,
        _pd0: pd0,
        _pd1: pd1,
        cq0,
        cq1,
        srq,
        a,
        b,
        src,
        dst,
    }
}

impl Uc {
    /// Posts `wr` on A and checks that it completes successfully (as every UC WR does).
    fn send_ok(&self, wr: SendWr<'_>) {
        let id = wr.wr_id;
        self.a.post_send(&[wr.signaled()]).unwrap();
        let w = poll_n(&self.cq0, 1, WAIT).unwrap();
        assert_eq!((w[0].wr_id, w[0].status), (id, WcStatus::Success), "{w:?}");
    }

    /// Asserts that B's CQ stays empty for a while and both QPs stay in RTS.
    fn nothing_arrives(&self, what: &str) {
        let got = poll_quiet(&self.cq1, Duration::from_millis(200)).unwrap();
        assert!(got.is_empty(), "{what}: {got:?}");
        assert_eq!(self.b.state().unwrap(), QpState::Rts, "{what}: the responder");
        assert_eq!(self.a.state().unwrap(), QpState::Rts, "{what}: the requester");
    }

    fn post_recv(&self, id: u64, off: usize, len: usize) {
        let sge = [self.dst.sge(off, len).unwrap()];
        match &self.srq {
            Some(s) => s.post_recv(&[RecvWr::new(id, &sge)]).unwrap(),
            None => self.b.post_recv(&[RecvWr::new(id, &sge)]).unwrap(),
        }
    }

    fn dropped(&self) -> u64 {
        self.c1.counters().uc_dropped
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// SEND, SEND_WITH_IMM, WRITE and WRITE_WITH_IMM arrive, large and small; the WRITE
/// alone leaves the responder's CQ empty. The first WRs are posted as soon as both QPs
/// are in RTS, before the connection is set up: they wait for it.
#[test]
fn sends_and_writes_arrive() {
    let u = uc(false);
    let data = pattern(300_000, 3);
    u.src.write(0, &data).unwrap();
    u.post_recv(1, 0, 300_000);
    u.post_recv(2, 300_000, 64);
    u.a.post_send(&[
        SendWr::send(10, &[u.src.sge(0, 300_000).unwrap()]).signaled(),
        SendWr::send_with_imm(11, &[u.src.sge(0, 16).unwrap()], 0x1234).signaled(),
    ])
    .unwrap();
    let ws = poll_n(&u.cq0, 2, WAIT).unwrap();
    assert!(
        ws.iter()
            .all(|w| w.status == WcStatus::Success && w.opcode == WcOpcode::Send),
        "{ws:?}"
    );
    let wr = poll_n(&u.cq1, 2, WAIT).unwrap();
    assert_eq!(
        wr.iter()
            .map(|w| (w.wr_id, w.status, w.byte_len, w.imm(), w.qp_num))
            .collect::<Vec<_>>(),
        [
            (1, WcStatus::Success, 300_000, None, u.b.qp_num()),
            (2, WcStatus::Success, 16, Some(0x1234), u.b.qp_num())
        ]
    );
    let mut got = vec![0u8; 300_000];
    u.dst.read(0, &mut got).unwrap();
    assert!(got == data, "SEND payload");

    u.dst.fill(0);
    u.send_ok(SendWr::write(
        20,
        &[u.src.sge(0, 200_000).unwrap()],
        u.dst.remote().at(100),
    ));
    let mut got = vec![0u8; 200_000];
    u.dst.read(100, &mut got).unwrap();
    assert!(got == data[..200_000], "WRITE payload");
    assert!(poll_quiet(&u.cq1, Duration::from_millis(100)).unwrap().is_empty());

    u.post_recv(3, 500_000, 8);
    u.send_ok(SendWr::write_with_imm(
        21,
        &[u.src.sge(0, 64).unwrap()],
        u.dst.remote().at(400_000),
        0xabcd,
    ));
    let w = poll_n(&u.cq1, 1, WAIT).unwrap();
    assert_eq!(
        (w[0].wr_id, w[0].opcode, w[0].imm(), w[0].byte_len),
        (3, WcOpcode::RecvRdmaWithImm, Some(0xabcd), 64)
    );
    assert_eq!(u.dropped(), 0);
}

/// READ and atomics are EINVAL at post (IBA has no UC opcode for them), and nothing is
/// queued.
#[test]
fn reads_and_atomics_are_refused_at_post() {
    let u = uc(false);
    let sge = [u.src.sge(0, 8).unwrap()];
    for wr in [
        SendWr::read(1, &sge, u.dst.remote().at(0)),
        SendWr::fetch_and_add(2, &sge, u.dst.remote().at(0), 1),
        SendWr::cmp_and_swp(3, &sge, u.dst.remote().at(0), 0, 1),
    ] {
        let e = u.a.post_send(&[wr.signaled()]).unwrap_err();
        assert_eq!(e.error.errno(), libc::EINVAL, "{}", e.error);
        assert!(e.error.to_string().contains("UC"), "{}", e.error);
    }
    assert!(poll_quiet(&u.cq0, Duration::from_millis(100)).unwrap().is_empty());
    assert_eq!(u.a.state().unwrap(), QpState::Rts);
}

/// A SEND with no receive posted, and a WRITE with a bad rkey, are dropped: the sender
/// completes successfully, nothing arrives, memory is untouched, both QPs stay in RTS,
/// the device counts the drops; the next message arrives.
#[test]
fn what_rc_would_nak_is_dropped() {
    let u = uc(false);
    u.src.write(0, b"dropped").unwrap();
    u.send_ok(SendWr::send(1, &[u.src.sge(0, 7).unwrap()]));
    u.nothing_arrives("a SEND with no receive");
    let mut bad = u.dst.remote().at(0);
    bad.rkey ^= 0x100;
    u.send_ok(SendWr::write(2, &[u.src.sge(0, 7).unwrap()], bad));
    u.nothing_arrives("a WRITE with a bad rkey");
    assert!(u.dst.to_vec().iter().all(|&b| b == 0), "memory changed");
    // Out of the region's bounds: the same.
    u.send_ok(SendWr::write(
        3,
        &[u.src.sge(0, 7).unwrap()],
        u.dst.remote().at(1 << 20),
    ));
    u.nothing_arrives("a WRITE past the region");
    assert_eq!(u.dropped(), 3);
    u.post_recv(4, 0, 64);
    u.send_ok(SendWr::send(5, &[u.src.sge(0, 7).unwrap()]));
    let w = poll_n(&u.cq1, 1, WAIT).unwrap();
    assert_eq!(
        (w[0].wr_id, w[0].status, w[0].byte_len),
        (4, WcStatus::Success, 7)
    );
    assert_eq!(u.c1.counters().uc_psn_gaps, 0, "nothing was lost on the way");
}

/// A SEND longer than its receive completes it with LOC_LEN_ERR, writes nothing past it,
/// and leaves the QP in RTS (IBA; rxe gives LOC_QP_OP_ERR and moves the QP to ERR).
#[test]
fn a_receive_too_short_is_loc_len_err_and_nothing_past_it() {
    let u = uc(false);
    u.dst.fill(0xee);
    u.src.write(0, &pattern(100, 1)).unwrap();
    u.post_recv(1, 0, 16);
    u.send_ok(SendWr::send(1, &[u.src.sge(0, 100).unwrap()]));
    let w = poll_n(&u.cq1, 1, WAIT).unwrap();
    assert_eq!((w[0].wr_id, w[0].status), (1, WcStatus::LocLenErr));
    assert!(
        u.dst.to_vec()[16..].iter().all(|&b| b == 0xee),
        "written past the receive"
    );
    assert_eq!(u.b.state().unwrap(), QpState::Rts);
    u.post_recv(2, 0, 128);
    u.send_ok(SendWr::send(2, &[u.src.sge(0, 100).unwrap()]));
    let w = poll_n(&u.cq1, 1, WAIT).unwrap();
    assert_eq!(
        (w[0].wr_id, w[0].status, w[0].byte_len),
        (2, WcStatus::Success, 100)
    );
    assert_eq!(u.dropped(), 1);
}

/// On an SRQ, a WRITE_WITH_IMM whose rkey check fails completes the receive it consumed
/// with REM_ACCESS_ERR (rxe's choice); with a receive queue of its own the receive stays
/// for the next message.
#[test]
fn write_with_imm_and_a_bad_rkey() {
    for with_srq in [true, false] {
        let u = uc(with_srq);
        u.post_recv(7, 0, 64);
        let mut bad = u.dst.remote().at(0);
        bad.rkey ^= 0x100;
        u.send_ok(SendWr::write_with_imm(1, &[u.src.sge(0, 8).unwrap()], bad, 5));
        if with_srq {
            let w = poll_n(&u.cq1, 1, WAIT).unwrap();
            assert_eq!(
                (w[0].wr_id, w[0].status, w[0].qp_num),
                (7, WcStatus::RemAccessErr, u.b.qp_num())
            );
            u.post_recv(8, 0, 64);
        } else {
            u.nothing_arrives("the receive stays");
        }
        assert_eq!(u.b.state().unwrap(), QpState::Rts);
        u.send_ok(SendWr::send(2, &[u.src.sge(0, 8).unwrap()]));
        let w = poll_n(&u.cq1, 1, WAIT).unwrap();
        let want = if with_srq { 8 } else { 7 };
        assert_eq!(
            (w[0].wr_id, w[0].status),
            (want, WcStatus::Success),
            "srq: {with_srq}"
        );
        assert_eq!(u.dropped(), 1);
    }
}

/// A message whose connection breaks in the middle of its payload is dropped whole and
/// never resent; its WR completes successfully; the receive it had begun to fill takes
/// the next message, which arrives over the new connection.
#[test]
fn a_message_lost_midway_is_dropped_whole() {
    let u = uc(false);
    // Connected first: the break is armed for the next request built.
    u.post_recv(1, 0, 64);
    u.send_ok(SendWr::send(1, &[u.src.sge(0, 8).unwrap()]));
    assert_eq!(poll_n(&u.cq1, 1, WAIT).unwrap()[0].wr_id, 1);
    u.post_recv(2, 4096, 1 << 19);
    u.src.write(0, &pattern(400_000, 9)).unwrap();
    u.c0.faults()
        .break_connection(u.a.qp_num(), BreakPoint::MidRequest)
        .unwrap();
    u.send_ok(SendWr::send(3, &[u.src.sge(0, 400_000).unwrap()]));
    u.nothing_arrives("a message cut in the middle");
    u.src.write(0, b"next").unwrap();
    let t0 = Instant::now();
    u.send_ok(SendWr::send(4, &[u.src.sge(0, 4).unwrap()]));
    let w = poll_n(&u.cq1, 1, WAIT).unwrap();
    assert_eq!(
        (w[0].wr_id, w[0].status, w[0].byte_len),
        (2, WcStatus::Success, 4),
        "after {:?}",
        t0.elapsed()
    );
    let mut b = [0u8; 4];
    u.dst.read(4096, &mut b).unwrap();
    assert_eq!(&b, b"next");
    assert!(
        poll_quiet(&u.cq1, Duration::from_millis(200)).unwrap().is_empty(),
        "resent"
    );
    // Dropped by the responder if its head had been read when the connection went; if
    // the new connection superseded the old one first (its hello is taken by the setup
    // thread, the old bytes by the progress thread: no order between them), nothing of
    // it arrived and the next message's PSN shows the gap. One or the other, once.
    let c = u.c1.counters();
    assert_eq!(c.uc_dropped + c.uc_psn_gaps, 1, "{c:?}");
    assert!(u.c0.faults().stats().breaks >= 1);
}

/// A UC WR to a peer that never answers completes successfully once the link wait is
/// over (its message sent into a dead link), as an HCA's would at once.
#[test]
fn a_peer_that_never_answers_costs_the_link_wait() {
    let sim = SimBackend::default();
    let c0 = sim.open("sim0").unwrap();
    let pd = c0.alloc_pd().unwrap();
    let cq = c0.create_cq(16, None).unwrap();
    let a = pd.create_qp(&QpInitAttr::uc(&cq, &cq, QpCap::new(4, 4))).unwrap();
    // A peer address nobody listens at (a port just closed).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nobody = Endpoint {
        gid: c0.query_gid(1, 0).unwrap(),
        lid: port,
        qpn: 0x1234,
        psn: 0,
    };
    connect_uc(&a, &RcParams::default(), 0, &nobody).unwrap();
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    let t0 = Instant::now();
    a.post_send(&[SendWr::send(1, &[mr.sge(0, 8).unwrap()]).signaled()])
        .unwrap();
    let w = poll_n(&cq, 1, Duration::from_secs(10)).unwrap();
    assert_eq!(w[0].status, WcStatus::Success);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(8),
        "{took:?}"
    );
    assert_eq!(a.state().unwrap(), QpState::Rts);
    drop(c0);
}

/// UC's state machine takes UC's attributes and refuses RC's (EINVAL).
#[test]
fn modify_takes_uc_attributes_only() {
    let sim = SimBackend::default();
    let c0 = sim.open("sim0").unwrap();
    let pd = c0.alloc_pd().unwrap();
    let cq = c0.create_cq(16, None).unwrap();
    let a = pd.create_qp(&QpInitAttr::uc(&cq, &cq, QpCap::new(4, 4))).unwrap();
    let p = RcParams::default();
    let me = local_endpoint(&c0, &a, &p, 0).unwrap();
    modify_to_init(&a, &p).unwrap();
    let e = modify_to_rtr(&a, &p, &me).unwrap_err();
    assert_eq!(
        e.errno(),
        libc::EINVAL,
        "RC's RTR (MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER): {e}"
    );
    assert_eq!(a.state().unwrap(), QpState::Init);
    assert!(c0.capabilities().unwrap().uc);
}

/// An RC QP and a UC QP never connect (the hello names the type, and a QP takes only a
/// peer of its own): the RC side's SEND ends in RETRY_EXC_ERR (no connection, as an RC
/// requester whose packets a UC QP drops gets no answer), and nothing reaches the UC
/// side.
#[test]
fn rc_and_uc_never_connect() {
    let sim = SimBackend::default();
    let (c0, c1) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
    let (pd0, pd1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
    let (cq0, cq1) = (c0.create_cq(16, None).unwrap(), c1.create_cq(16, None).unwrap());
    let rc = pd0
        .create_qp(&QpInitAttr::rc(&cq0, &cq0, QpCap::new(4, 4)))
        .unwrap();
    let ucq = pd1
        .create_qp(&QpInitAttr::uc(&cq1, &cq1, QpCap::new(4, 4)))
        .unwrap();
    let p = RcParams {
        timeout: 12,
        retry_cnt: 1,
        ..RcParams::default()
    };
    let e_rc = local_endpoint(&c0, &rc, &p, 0).unwrap();
    let e_uc = local_endpoint(&c1, &ucq, &p, 0).unwrap();
    connect_rc(&rc, &p, 0, &e_uc).unwrap();
    connect_uc(&ucq, &p, 0, &e_rc).unwrap();
    let rmr = pd1.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    ucq.post_recv(&[RecvWr::new(1, &[rmr.sge(0, 64).unwrap()])])
        .unwrap();
    let mr = pd0.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    rc.post_send(&[SendWr::send(1, &[mr.sge(0, 8).unwrap()]).signaled()])
        .unwrap();
    let w = poll_n(&cq0, 1, WAIT).unwrap();
    // ECONNREFUSED when the RC QP is the active side of the pair, ENOTCONN when it
    // waited for a hello that the UC side could not make it accept.
    assert_eq!(w[0].status, WcStatus::RetryExcErr, "{w:?}");
    assert!(
        [libc::ECONNREFUSED as u32, libc::ENOTCONN as u32].contains(&w[0].vendor_err),
        "{w:?}"
    );
    assert!(poll_quiet(&cq1, Duration::from_millis(100)).unwrap().is_empty());
}
