//! verbs_api::cm over the sim: two devices (as two hosts would be) connect through the
//! TCP side channel; a peer that hangs up, stays silent or sends garbage gets a clear error.
use std::io::Write;
use std::time::Duration;

use backend_sim::SimBackend;
use verbs_api::cm::{connect, CmListener, Offer};
use verbs_api::*;

fn qp_on(ctx: &backend_sim::SimContext) -> (backend_sim::SimPd, backend_sim::SimCq, backend_sim::SimQp) {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let cap = QpCap::new(16, 16);
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    (pd, cq, qp)
}

#[test]
fn connect_accept_and_talk() {
    let sim = SimBackend::default();
    let listener = CmListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let ctx = SimBackend::default().open("sim1").unwrap();
        let (pd, cq, qp) = qp_on(&ctx);
        let mr = pd
            .reg_mr(64, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
        // Receives before the peer can send: INIT, post, then accept.
        modify_to_init(&qp, &RcParams::default()).unwrap();
        qp.post_recv(&[RecvWr::new(1, &[mr.sge(0, 64).unwrap()])])
            .unwrap();
        let peer = listener
            .accept(
                &ctx,
                &qp,
                &RcParams::default(),
                &Offer::new().mr(mr.remote()).private_data(b"srv".to_vec()),
            )
            .unwrap();
        assert_eq!(peer.private_data, b"cli");
        let wc = poll_n(&cq, 1, Duration::from_secs(5)).unwrap();
        assert!(wc[0].is_ok(), "{wc:?}");
        let mut got = [0u8; 5];
        mr.read(0, &mut got).unwrap();
        assert_eq!(&got, b"hello");
    });
    let ctx = sim.open("sim0").unwrap();
    let (pd, cq, qp) = qp_on(&ctx);
    let peer = connect(
        addr,
        &ctx,
        &qp,
        &RcParams::default(),
        &Offer::new().private_data(b"cli".to_vec()),
    )
    .unwrap();
    assert_eq!(peer.private_data, b"srv");
    assert_eq!(peer.mrs.len(), 1);
    assert_eq!(qp.state().unwrap(), QpState::Rts);
    let mr = pd.reg_mr(64, AccessFlags::LOCAL_WRITE).unwrap();
    mr.write(0, b"hello").unwrap();
    qp.post_send(&[SendWr::send(9, &[mr.sge(0, 5).unwrap()]).signaled()])
        .unwrap();
    let wc = poll_n(&cq, 1, Duration::from_secs(5)).unwrap();
    assert!(wc[0].is_ok(), "{wc:?}");
    server.join().unwrap();
}

#[test]
fn peer_hangs_up() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let t = std::thread::spawn(move || drop(listener.accept().unwrap()));
    let ctx = SimBackend::default().open("sim0").unwrap();
    let (_pd, _cq, qp) = qp_on(&ctx);
    let e = connect(addr, &ctx, &qp, &RcParams::default(), &Offer::new()).unwrap_err();
    assert!(e.to_string().contains("closed the connection"), "{e}");
    t.join().unwrap();
}

#[test]
fn peer_is_silent() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let s = listener.accept().unwrap();
        std::thread::sleep(Duration::from_millis(600));
        drop(s);
    });
    let ctx = SimBackend::default().open("sim0").unwrap();
    let (_pd, _cq, qp) = qp_on(&ctx);
    let offer = Offer::new().timeout(Duration::from_millis(200));
    let e = connect(addr, &ctx, &qp, &RcParams::default(), &offer).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    t.join().unwrap();
}

#[test]
fn peer_sends_garbage() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.write_all(b"HTTP/1.1 200 OK\r\n\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(100));
    });
    let ctx = SimBackend::default().open("sim0").unwrap();
    let (_pd, _cq, qp) = qp_on(&ctx);
    let e = connect(addr, &ctx, &qp, &RcParams::default(), &Offer::new()).unwrap_err();
    assert!(e.to_string().contains("not a verbs-api connection setup"), "{e}");
    assert_eq!(
        qp.state().unwrap(),
        QpState::Reset,
        "a failed setup leaves the QP alone"
    );
    t.join().unwrap();
}

#[test]
fn accept_times_out_without_client() {
    let listener = CmListener::bind("127.0.0.1:0").unwrap();
    let ctx = SimBackend::default().open("sim0").unwrap();
    let (_pd, _cq, qp) = qp_on(&ctx);
    let e = listener
        .accept(
            &ctx,
            &qp,
            &RcParams::default(),
            &Offer::new().timeout(Duration::from_millis(100)),
        )
        .unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
}

/// A server taking the steps one by one: a client that sends garbage and one that says
/// nothing fail at `request`, with their addresses known, before any QP takes part; the
/// next client is accepted on the same listener and QP.
#[test]
fn incoming_request_accept_drop_bad_clients_and_serve_the_next() {
    let listener = CmListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut junk = std::net::TcpStream::connect(addr).unwrap();
    junk.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let silent = std::net::TcpStream::connect(addr).unwrap();
    let ctx = SimBackend::default().open("sim0").unwrap();
    let (_pd, _cq, qp) = qp_on(&ctx);

    let incoming = listener.incoming(Duration::from_secs(5)).unwrap();
    assert_eq!(incoming.peer_addr(), junk.local_addr().unwrap());
    let e = incoming.request(Duration::from_secs(5)).unwrap_err();
    assert!(e.to_string().contains("not a verbs-api connection setup"), "{e}");

    let incoming = listener.incoming(Duration::from_secs(5)).unwrap();
    assert_eq!(incoming.peer_addr(), silent.local_addr().unwrap());
    let e = incoming.request(Duration::from_millis(100)).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert_eq!(qp.state().unwrap(), QpState::Reset, "no QP took part");

    let client = std::thread::spawn(move || {
        let ctx = SimBackend::default().open("sim1").unwrap();
        let (_pd, _cq, qp) = qp_on(&ctx);
        let offer = Offer::new().private_data(b"hi".to_vec());
        connect(addr, &ctx, &qp, &RcParams::default(), &offer).map(|p| (p.endpoint.qpn, qp.qp_num()))
    });
    let request = listener
        .incoming(Duration::from_secs(5))
        .unwrap()
        .request(Duration::from_secs(5))
        .unwrap();
    assert_eq!(request.private_data(), b"hi");
    let client_qpn = request.endpoint().qpn;
    let peer = request
        .accept(&ctx, &qp, &RcParams::default(), &Offer::new())
        .unwrap();
    assert_eq!(qp.state().unwrap(), QpState::Rts);
    let (seen_by_client, client_qp) = client.join().unwrap().unwrap();
    assert_eq!((seen_by_client, peer.endpoint.qpn), (qp.qp_num(), client_qp));
    assert_eq!(client_qpn, client_qp);
}
