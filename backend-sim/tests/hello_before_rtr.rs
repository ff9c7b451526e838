//! The two ends of a QP pair reach RTR one after the other: rdma_cm's passive side before
//! it sends its REP, the active side once it has it. When the side that connects gets
//! there first, its hello finds the peer's QP still in INIT; the peer's device holds the
//! hello until the QP reaches RTR (for at most `NOT_READY_WAIT`) and accepts it then,
//! instead of refusing it and leaving the connector to try again.
mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use backend_sim::{SimBackend, NOT_READY_WAIT};
use backend_sim_proto::wire::{Frame, TOKEN_LEN};
use common::{frame, read_answer, read_setup, RAW_QPN};
use verbs_api::*;

/// Where the raw peer listens: its GID (IPv4-mapped 127.0.0.0) is below 127.0.0.1's, so
/// it is the side of the pair that connects.
const RAW_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 0);

/// The raw peer's device: answers one check of `token` for `dst_qpn` with yes.
fn confirm(listener: TcpListener, dst_qpn: u32, token: [u8; TOKEN_LEN]) -> std::thread::JoinHandle<()> {
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut c = loop {
            match listener.accept() {
                Ok((c, _)) => break c,
                // A hello refused for being late is never checked.
                Err(_) if Instant::now() > deadline => return,
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        };
        c.set_nonblocking(false).unwrap();
        let f = read_setup(&mut c);
        let Frame::Verify {
            src_qpn,
            dst_qpn: d,
            token: t,
        } = f
        else {
            panic!("expected a check, got {f}");
        };
        assert_eq!((src_qpn, d, t), (RAW_QPN, dst_qpn, token));
        c.write_all(&frame(Frame::HelloAck)).unwrap();
    })
}

#[test]
fn a_hello_for_a_qp_in_init_is_accepted_once_it_reaches_rtr() {
    let sim = SimBackend::default();
    let ctx = sim.open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let p = RcParams {
        gid_index: 1,
        ..RcParams::default()
    };
    // An attempt whose RTR came later than the hello may wait is inconclusive (a loaded
    // machine): tried again with a fresh QP.
    for _ in 0..5 {
        let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, QpCap::new(4, 4))).unwrap();
        modify_to_init(&qp, &p).unwrap();
        let raw = TcpListener::bind((RAW_IP, 0)).unwrap();
        let peer = Endpoint {
            gid: Gid::from(RAW_IP),
            lid: raw.local_addr().unwrap().port(),
            qpn: RAW_QPN,
            psn: 0,
        };
        let token = [0x42; TOKEN_LEN];
        let checker = confirm(raw, qp.qp_num(), token);
        let mut s = TcpStream::connect(ctx.listen_addr()).unwrap();
        s.write_all(&frame(Frame::Hello {
            src_gid: peer.gid.0,
            src_lid: peer.lid,
            qp_type: QpType::Rc,
            src_qpn: RAW_QPN,
            dst_qpn: qp.qp_num(),
            token,
        }))
        .unwrap();
        let sent = Instant::now();
        // While the QP is in INIT the hello is not answered.
        s.set_read_timeout(Some(NOT_READY_WAIT / 5)).unwrap();
        let mut b = [0u8; 64];
        match s.read(&mut b) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            other => panic!(
                "the hello was answered while its QP was in INIT: {other:?} {:?}",
                &b[..8]
            ),
        }
        modify_to_rtr(&qp, &p, &peer).unwrap();
        let late = sent.elapsed() >= NOT_READY_WAIT;
        let answer = read_answer(&mut s);
        checker.join().unwrap();
        match answer {
            Some(Frame::HelloAck) => return,
            Some(Frame::HelloNak { .. }) if late => continue,
            other => panic!("the hello was not accepted once its QP reached RTR: {other:?}"),
        }
    }
    panic!("every attempt reached RTR later than a hello waits");
}
