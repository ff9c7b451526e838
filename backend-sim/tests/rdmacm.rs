//! The sim's connection manager (`man rdma_cm`) through the verbs-api traits: the event
//! sequences, statuses and private data of connect, accept, reject, disconnect from
//! either side, a listener that is not there, an address nobody has, UD, and what a
//! destroyed id leaves behind. Two backends in one process are two hosts' worth of
//! devices (each its own connection manager); one backend is one host.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use backend_sim::rdmacm::{SimCmChannel, SimCmId};
use backend_sim::{SimBackend, SimConfig};
use backend_sim_proto::wire::{Frame, HelloReject};
use common::{frame, read_answer};
use verbs_api::rdmacm::{
    self, qp as cmqp, CmBackend, CmEvent, CmEventChannel, CmEventType as E, CmId, ConnParam, PortSpace,
};
use verbs_api::*;

const WAIT: Duration = Duration::from_secs(10);

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), port)
}

fn expect(ch: &SimCmChannel, want: E) -> CmEvent<SimCmId> {
    match ch.get_event(Some(WAIT)).unwrap() {
        Some(ev) => {
            assert_eq!(ev.event, want, "got {ev:?}");
            ev
        }
        None => panic!("no {want} within {WAIT:?}"),
    }
}

fn nothing(ch: &SimCmChannel, d: Duration) {
    if let Some(ev) = ch.get_event(Some(d)).unwrap() {
        panic!("unexpected {ev:?}");
    }
}

/// A listener on loopback, its port chosen: (channel, id, port).
fn listener(b: &SimBackend, ps: PortSpace) -> (SimCmChannel, SimCmId, u16) {
    listener_of(b, ps, 4)
}

/// [`listener`] with a backlog of `backlog` requests.
fn listener_of(b: &SimBackend, ps: PortSpace, backlog: u32) -> (SimCmChannel, SimCmId, u16) {
    let ch = b.create_event_channel().unwrap();
    let id = ch.create_id(7, ps, ps.qp_type()).unwrap();
    id.bind_addr(loopback(0)).unwrap();
    id.listen(backlog).unwrap();
    let port = id.query_addr().unwrap().src.unwrap().port();
    assert_ne!(port, 0);
    (ch, id, port)
}

/// A client id resolved to `dst` (address and route).
fn resolved(b: &SimBackend, ps: PortSpace, dst: SocketAddr) -> (SimCmChannel, SimCmId) {
    let ch = b.create_event_channel().unwrap();
    let id = ch.create_id(9, ps, ps.qp_type()).unwrap();
    id.resolve_addr(None, dst, Duration::from_secs(2)).unwrap();
    let ev = expect(&ch, E::AddrResolved);
    assert_eq!((ev.status, ev.id.handle, ev.id.context), (0, id.handle(), 9));
    assert!(
        id.verbs().is_some(),
        "resolving the address binds the id to a device"
    );
    id.resolve_route(Duration::from_secs(2)).unwrap();
    expect(&ch, E::RouteResolved);
    assert_eq!(id.query_path().unwrap().len(), 1);
    (ch, id)
}

/// A client on `b` whose id resolved `dst` and sent its connection request with `data`
/// from an RC QP: (channel, id, its side).
fn requesting(b: &SimBackend, dst: SocketAddr, data: &[u8]) -> (SimCmChannel, SimCmId, Side) {
    let (ch, id) = resolved(b, PortSpace::Tcp, dst);
    let client = side(&id, QpType::Rc);
    cmqp::connect(&id, &client.qp, &ConnParam::rc(data)).unwrap();
    (ch, id, client)
}

/// An RC QP on `id`'s device, moved to INIT as `rdma_create_qp` does.
struct Side {
    _pd: PdOf<SimBackend>,
    cq: CqOf<SimBackend>,
    qp: QpOf<SimBackend>,
    mr: MrOf<SimBackend>,
}

fn side(id: &SimCmId, qp_type: QpType) -> Side {
    let ctx = id.verbs().unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(16, None).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr::new(qp_type, &cq, &cq, QpCap::new(8, 8)))
        .unwrap();
    cmqp::init(id, &qp).unwrap();
    let mr = pd.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    Side { _pd: pd, cq, qp, mr }
}

/// A connected RC pair: (server channel and id, client channel and id, server and client
/// sides), every event of the handshake checked.
#[allow(clippy::type_complexity)]
fn connected(
    sb: &SimBackend,
    cb: &SimBackend,
) -> (SimCmChannel, SimCmId, SimCmChannel, SimCmId, Side, Side, SimCmId) {
    let (sch, lid, port) = listener(sb, PortSpace::Tcp);
    let (cch, cid, client) = requesting(cb, loopback(port), b"hello from the client");
    let req = expect(&sch, E::ConnectRequest);
    assert_eq!(req.listen_id.unwrap().handle, lid.handle());
    let pd = req.param.private_data();
    assert_eq!(
        pd.len(),
        56,
        "a REQ's whole private data area (92 less rdma_cm's header)"
    );
    assert_eq!(&pd[..21], b"hello from the client");
    assert!(pd[21..].iter().all(|&b| b == 0));
    let sid = req.new_id.unwrap();
    assert_eq!(sid.context(), 7, "a request's id has its listener's context");
    let src = sid.query_addr().unwrap();
    assert_eq!(src.src.unwrap().port(), port);
    assert_eq!(
        src.dst,
        cid.query_addr().unwrap().src,
        "the request comes from the client's address"
    );
    let server = side(&sid, QpType::Rc);
    cmqp::accept(&sid, &server.qp, &ConnParam::rc(b"welcome")).unwrap();
    let rep = expect(&cch, E::ConnectResponse);
    assert_eq!(rep.param.private_data().len(), 196);
    assert_eq!(&rep.param.private_data()[..7], b"welcome");
    match &rep.param {
        rdmacm::CmEventParam::Conn(c) => assert_eq!(c.qp_num, server.qp.qp_num()),
        other => panic!("{other:?}"),
    }
    cmqp::complete_connect(&cid, &client.qp).unwrap();
    let est = expect(&sch, E::Established);
    assert_eq!(est.id.handle, sid.handle());
    assert_eq!(client.qp.state().unwrap(), QpState::Rts);
    assert_eq!(server.qp.state().unwrap(), QpState::Rts);
    (sch, sid, cch, cid, server, client, lid)
}

/// A SEND from `a` arrives at `b`.
fn send_recv(a: &Side, b: &Side, text: &[u8]) {
    b.qp.post_recv(&[RecvWr::new(1, &[b.mr.sge(0, 64).unwrap()])])
        .unwrap();
    a.mr.write(0, text).unwrap();
    a.qp.post_send(&[SendWr::send(2, &[a.mr.sge(0, text.len()).unwrap()]).signaled()])
        .unwrap();
    let wc = poll_n(&a.cq, 1, WAIT).unwrap();
    assert_eq!(wc[0].status, WcStatus::Success);
    let wc = poll_n(&b.cq, 1, WAIT).unwrap();
    assert_eq!(wc[0].status, WcStatus::Success);
    let mut got = vec![0u8; text.len()];
    b.mr.read(0, &mut got).unwrap();
    assert_eq!(got, text);
}

fn two_hosts() -> (SimBackend, SimBackend) {
    (SimBackend::default(), SimBackend::default())
}

#[test]
fn connect_accept_exchange_and_disconnect_from_the_client() {
    let (sb, cb) = two_hosts();
    let (sch, sid, cch, cid, server, client, _l) = connected(&sb, &cb);
    send_recv(&client, &server, b"ping");
    send_recv(&server, &client, b"pong");
    cmqp::disconnect(&cid, &client.qp).unwrap();
    expect(&sch, E::Disconnected);
    cmqp::disconnect(&sid, &server.qp).unwrap();
    let d = expect(&cch, E::Disconnected);
    assert_eq!(d.status, 0);
    expect(&cch, E::TimewaitExit);
    expect(&sch, E::TimewaitExit);
}

#[test]
fn disconnect_from_the_server() {
    let (sb, cb) = two_hosts();
    let (sch, sid, cch, cid, server, client, _l) = connected(&sb, &cb);
    cmqp::disconnect(&sid, &server.qp).unwrap();
    expect(&cch, E::Disconnected);
    cmqp::disconnect(&cid, &client.qp).unwrap();
    expect(&sch, E::Disconnected);
}

#[test]
fn one_host_one_connection_manager() {
    let b = SimBackend::default();
    let (sch, sid, cch, _cid, server, client, _l) = connected(&b, &b);
    send_recv(&client, &server, b"same host");
    drop(sid);
    // Destroying a connected id disconnects its peer.
    expect(&cch, E::Disconnected);
    nothing(&sch, Duration::from_millis(100));
}

#[test]
fn reject_with_private_data() {
    let (sb, cb) = two_hosts();
    let (sch, _lid, port) = listener(&sb, PortSpace::Tcp);
    let (cch, _cid, _client) = requesting(&cb, loopback(port), b"may I?");
    let req = expect(&sch, E::ConnectRequest);
    let sid = req.new_id.unwrap();
    sid.reject(b"no, sorry", 0).unwrap();
    let rej = expect(&cch, E::Rejected);
    assert_eq!(rej.status, rdmacm::reject::CONSUMER_DEFINED);
    assert_eq!(rej.param.private_data().len(), 148);
    assert_eq!(&rej.param.private_data()[..9], b"no, sorry");
}

#[test]
fn a_listener_that_is_not_there_rejects_with_invalid_service_id() {
    let (sb, cb) = two_hosts();
    // A port nobody listens on: one a listener held and gave back.
    let port = {
        let (_ch, _id, port) = listener(&sb, PortSpace::Tcp);
        port
    };
    let (cch, _cid, _client) = requesting(&cb, loopback(port), b"");
    let rej = expect(&cch, E::Rejected);
    assert_eq!(rej.status, rdmacm::reject::INVALID_SERVICE_ID);
}

/// An address where nothing answers: a TCP port that takes connections and says nothing
/// (as a host that drops the rendezvous would). The address error comes within the
/// timeout the caller passed, with `-ETIMEDOUT`, as rxe's when no ARP reply comes.
#[test]
fn an_address_nobody_answers_is_an_address_error_within_the_timeout() {
    let hole = std::net::TcpListener::bind(loopback(0)).unwrap();
    let b = SimBackend::default();
    let ch = b.create_event_channel().unwrap();
    let id = ch.create_id(0, PortSpace::Tcp, QpType::Rc).unwrap();
    let t = Duration::from_millis(300);
    let start = std::time::Instant::now();
    id.resolve_addr(None, hole.local_addr().unwrap(), t).unwrap();
    let ev = expect(&ch, E::AddrError);
    assert_eq!(ev.status, -libc::ETIMEDOUT);
    assert!(
        start.elapsed() >= t && start.elapsed() < WAIT,
        "{:?}",
        start.elapsed()
    );
    // The id is bound again, and may resolve again.
    id.resolve_addr(None, hole.local_addr().unwrap(), t).unwrap();
    expect(&ch, E::AddrError);
}

#[test]
fn a_listener_destroyed_with_a_request_pending_rejects_the_request() {
    let (sb, cb) = two_hosts();
    let (sch, lid, port) = listener(&sb, PortSpace::Tcp);
    let (cch, _cid, _client) = requesting(&cb, loopback(port), b"");
    // The request arrives (the channel is readable) and is never taken.
    let deadline = std::time::Instant::now() + WAIT;
    while !readable(sch.fd()) {
        assert!(std::time::Instant::now() < deadline, "no request");
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(lid);
    let rej = expect(&cch, E::Rejected);
    assert_eq!(rej.status, rdmacm::reject::CONSUMER_DEFINED);
    nothing(&sch, Duration::from_millis(100));
}

fn readable(fd: std::os::fd::RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd, no wait.
    unsafe { libc::poll(&mut p, 1, 0) == 1 }
}

#[test]
fn a_port_is_held_once_per_port_space() {
    let b = SimBackend::default();
    let (_ch, _l, port) = listener(&b, PortSpace::Tcp);
    let ch = b.create_event_channel().unwrap();
    let id = ch.create_id(0, PortSpace::Tcp, QpType::Rc).unwrap();
    let e = id.bind_addr(loopback(port)).unwrap_err();
    assert_eq!(e.errno(), libc::EADDRINUSE, "{e}");
    // Calls out of order are EINVAL, as rdma_cm's.
    let e = id.connect(&ConnParam::default()).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
    let e = id.resolve_route(WAIT).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "{e}");
}

#[test]
fn ud_resolves_the_services_qp_and_qkey() {
    let (sb, cb) = two_hosts();
    let (sch, _lid, port) = listener(&sb, PortSpace::Udp);
    let (cch, cid) = resolved(&cb, PortSpace::Udp, loopback(port));
    let client = side(&cid, QpType::Ud);
    assert_eq!(client.qp.state().unwrap(), QpState::Rts);
    cid.connect(&ConnParam {
        private_data: b"ud?".to_vec(),
        ..Default::default()
    })
    .unwrap();
    let req = expect(&sch, E::ConnectRequest);
    assert_eq!(req.param.private_data().len(), 180);
    let sid = req.new_id.unwrap();
    let server = side(&sid, QpType::Ud);
    cmqp::accept(&sid, &server.qp, &ConnParam::default()).unwrap();
    let est = expect(&cch, E::Established);
    let rdmacm::CmEventParam::Ud(ud) = &est.param else {
        panic!("{est:?}");
    };
    assert_eq!(ud.qp_num, server.qp.qp_num());
    assert_eq!(ud.qkey, rdmacm::UDP_QKEY);
    assert_eq!(ud.private_data.len(), 136);
    // A datagram to the QP and Q_Key the event named.
    let ctx = cid.verbs().unwrap();
    let ah = client._pd.create_ah(&ud.ah_attr).unwrap();
    server
        .qp
        .post_recv(&[RecvWr::new(1, &[server.mr.sge(0, 128).unwrap()])])
        .unwrap();
    client.mr.write(0, b"datagram").unwrap();
    client
        .qp
        .post_send(&[SendWr::send(2, &[client.mr.sge(0, 8).unwrap()])
            .ud(&ah, ud.qp_num, ud.qkey)
            .signaled()])
        .unwrap();
    poll_n(&client.cq, 1, WAIT).unwrap();
    let wc = poll_n(&server.cq, 1, WAIT).unwrap();
    assert_eq!(wc[0].status, WcStatus::Success);
    assert_eq!(wc[0].byte_len, 40 + 8);
    let mut got = [0u8; 8];
    server.mr.read(40, &mut got).unwrap();
    assert_eq!(&got, b"datagram");
    drop(ctx);
}

#[test]
fn ud_to_no_listener_is_unreachable_unsupported() {
    let (sb, cb) = two_hosts();
    let port = {
        let (_ch, _id, port) = listener(&sb, PortSpace::Udp);
        port
    };
    let (cch, cid) = resolved(&cb, PortSpace::Udp, loopback(port));
    cid.connect(&ConnParam::default()).unwrap();
    let ev = expect(&cch, E::Unreachable);
    assert_eq!(ev.status, rdmacm::sidr::UNSUPPORTED);
}

#[test]
fn init_qp_attr_gives_rdma_cms_transitions() {
    let (sb, cb) = two_hosts();
    let (sch, _lid, port) = listener(&sb, PortSpace::Tcp);
    let (_cch, cid) = resolved(&cb, PortSpace::Tcp, loopback(port));
    let (a, m) = cid.init_qp_attr(QpState::Init).unwrap();
    assert_eq!(
        m,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS
    );
    assert_eq!(a.qp_access_flags, AccessFlags::empty());
    assert!(
        cid.init_qp_attr(QpState::Rtr).is_ok(),
        "before a connection: INIT's attributes"
    );
    let client = side(&cid, QpType::Rc);
    cmqp::connect(&cid, &client.qp, &ConnParam::rc(b"")).unwrap();
    let req = expect(&sch, E::ConnectRequest);
    let sid = req.new_id.unwrap();
    let (a, m) = sid.init_qp_attr(QpState::Rtr).unwrap();
    assert!(m.contains(
        QpAttrMask::AV | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN | QpAttrMask::MAX_DEST_RD_ATOMIC
    ));
    assert_eq!(a.dest_qp_num, client.qp.qp_num());
    assert!(a.ah_attr.is_global);
    let (a2, m2) = sid.init_qp_attr(QpState::Rts).unwrap();
    assert!(m2.contains(QpAttrMask::SQ_PSN | QpAttrMask::TIMEOUT | QpAttrMask::RETRY_CNT));
    assert_eq!((a2.retry_cnt, a2.rnr_retry), (7, 7));
    let (a3, _) = sid.init_qp_attr(QpState::Init).unwrap();
    assert!(a3
        .qp_access_flags
        .contains(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ));
    assert!(sid.init_qp_attr(QpState::Sqd).is_err());
}

#[test]
fn rxe_profile_connects_by_gid() {
    let rxe = || {
        SimBackend::new(SimConfig {
            profile: backend_sim::Profile::Rxe,
            ..SimConfig::default()
        })
    };
    let (sb, cb) = (rxe(), rxe());
    let (_sch, _sid, _cch, cid, server, client, _l) = connected(&sb, &cb);
    send_recv(&client, &server, b"over RoCE");
    let (sgid, dgid) = cid.query_gid().unwrap();
    let v4 = |g: Gid| std::net::Ipv6Addr::from(g.0).to_ipv4_mapped();
    assert!(
        v4(sgid).is_some_and(|a| a.is_loopback()),
        "an IPv4-mapped RoCE v2 GID: {sgid:?}"
    );
    assert!(v4(dgid).is_some_and(|a| a.is_loopback()), "{dgid:?}");
    assert_eq!(cid.query_path().unwrap()[0].dlid, 0, "RoCE paths have no LID");
}

#[test]
fn migrate_moves_the_id_and_its_events() {
    let b = SimBackend::default();
    let (sch, _lid, port) = listener(&b, PortSpace::Tcp);
    let ch1 = b.create_event_channel().unwrap();
    let ch2 = b.create_event_channel().unwrap();
    let id = ch1.create_id(3, PortSpace::Tcp, QpType::Rc).unwrap();
    id.resolve_addr(None, loopback(port), WAIT).unwrap();
    let deadline = std::time::Instant::now() + WAIT;
    while !readable(ch1.fd()) {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    id.migrate(&ch2).unwrap();
    assert!(!readable(ch1.fd()));
    expect(&ch2, E::AddrResolved);
    id.resolve_route(WAIT).unwrap();
    expect(&ch2, E::RouteResolved);
    drop(sch);
}

/// A wildcard listener takes the clients of every address of the host, and holds its
/// rendezvous port (and a device) while it listens.
#[test]
fn a_wildcard_listener_takes_loopback_clients() {
    let (sb, cb) = two_hosts();
    let sch = sb.create_event_channel().unwrap();
    let lid = sch.create_id(7, PortSpace::Tcp, QpType::Rc).unwrap();
    let port = {
        let probe = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    lid.bind_addr(format!("0.0.0.0:{port}").parse().unwrap()).unwrap();
    lid.listen(4).unwrap();
    assert!(lid.verbs().is_none(), "a wildcard listener is bound to no device");
    let (cch, cid, client) = requesting(&cb, loopback(port), b"");
    let req = expect(&sch, E::ConnectRequest);
    let sid = req.new_id.unwrap();
    assert!(sid.verbs().is_some());
    let server = side(&sid, QpType::Rc);
    cmqp::accept(&sid, &server.qp, &ConnParam::rc(b"")).unwrap();
    expect(&cch, E::ConnectResponse);
    cmqp::complete_connect(&cid, &client.qp).unwrap();
    expect(&sch, E::Established);
    send_recv(&client, &server, b"wildcard");
}

// ---------------------------------------------------------------------- bad input

/// Polls `f` until it holds, at most `WAIT`.
fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + WAIT;
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The next event of `ch` for `handle` within `within`, skipping none: its type.
fn next_for(ch: &SimCmChannel, handle: u32, within: Duration) -> E {
    match ch.get_event(Some(within)).unwrap() {
        Some(ev) => {
            assert_eq!(ev.id.handle, handle, "{ev:?}");
            ev.event
        }
        None => panic!("no event for {handle} within {within:?}"),
    }
}

/// The client half of the tests below that kill a client process: run as this test
/// binary again with `RDMACM_CLIENT_OF=port`, it connects to the listener at `port` and
/// then sleeps, taking no event: it is killed mid-handshake.
fn client_process(port: u16) {
    let b = SimBackend::default();
    let (_ch, _id, _client) = requesting(&b, loopback(port), b"about to die");
    std::thread::sleep(Duration::from_secs(600));
}

/// This test run again as a client process of the listener at `port`.
fn spawn_client(test: &str, port: u16) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--nocapture", "--test-threads", "1"])
        .env("RDMACM_CLIENT_OF", port.to_string())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn as_client_process() -> bool {
    match std::env::var("RDMACM_CLIENT_OF") {
        Ok(p) => {
            client_process(p.parse().unwrap());
            true
        }
        Err(_) => false,
    }
}

/// A client process killed after the server accepted (its REP unanswered): the server's
/// new id learns it well before the REP's own timeout (the peer's device is gone), the
/// server is left with its listener alone once it destroyed that id, and takes the next
/// client.
#[test]
fn a_client_that_exits_mid_handshake_leaves_nothing_in_the_server() {
    if as_client_process() {
        return;
    }
    let sb = SimBackend::default();
    let (sch, _lid, port) = listener(&sb, PortSpace::Tcp);
    let mut child = spawn_client(
        "a_client_that_exits_mid_handshake_leaves_nothing_in_the_server",
        port,
    );
    let req = expect(&sch, E::ConnectRequest);
    let sid = req.new_id.unwrap();
    let server = side(&sid, QpType::Rc);
    cmqp::accept(&sid, &server.qp, &ConnParam::rc(b"")).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let t0 = std::time::Instant::now();
    let ev = next_for(&sch, sid.handle(), WAIT);
    assert!(
        matches!(ev, E::Unreachable | E::Rejected | E::ConnectError),
        "{ev}"
    );
    assert!(t0.elapsed() < backend_sim::rdmacm::cm::REP_WAIT);
    drop((server, sid));
    eventually("the listener alone", || sb.cm_ids() == 1);
    let cb = SimBackend::default();
    let (cch, cid, client) = requesting(&cb, loopback(port), b"");
    let sid = expect(&sch, E::ConnectRequest).new_id.unwrap();
    let server = side(&sid, QpType::Rc);
    cmqp::accept(&sid, &server.qp, &ConnParam::rc(b"")).unwrap();
    expect(&cch, E::ConnectResponse);
    cmqp::complete_connect(&cid, &client.qp).unwrap();
    expect(&sch, E::Established);
    send_recv(&client, &server, b"after the dead one");
}

/// A client process killed while its request waits for the server's consumer: the
/// server's late accept finds the peer gone and says so within the wait for a peer, and
/// nothing of it stays.
#[test]
fn a_client_that_exits_before_the_accept_leaves_nothing_in_the_server() {
    if as_client_process() {
        return;
    }
    let sb = SimBackend::default();
    let (sch, _lid, port) = listener(&sb, PortSpace::Tcp);
    let mut child = spawn_client(
        "a_client_that_exits_before_the_accept_leaves_nothing_in_the_server",
        port,
    );
    let req = expect(&sch, E::ConnectRequest);
    child.kill().unwrap();
    child.wait().unwrap();
    let sid = req.new_id.unwrap();
    let server = side(&sid, QpType::Rc);
    // The accept itself may already know the peer is gone; if it does not, an event says so.
    if cmqp::accept(&sid, &server.qp, &ConnParam::rc(b"")).is_ok() {
        let ev = next_for(&sch, sid.handle(), WAIT);
        assert!(
            matches!(ev, E::Unreachable | E::Rejected | E::ConnectError),
            "{ev}"
        );
    }
    drop((server, sid));
    eventually("the listener alone", || sb.cm_ids() == 1);
}

/// Ids destroyed with their events never taken (a program that never acks): the
/// client's destroy with a CONNECT_RESPONSE pending rejects the server's id at once (not
/// after the REP's timeout), and neither side keeps anything once its ids are gone.
#[test]
fn ids_destroyed_with_events_pending_leave_nothing_behind() {
    let (sb, cb) = two_hosts();
    let (sch, lid, port) = listener(&sb, PortSpace::Tcp);
    let (cch, cid, client) = requesting(&cb, loopback(port), b"");
    let sid = expect(&sch, E::ConnectRequest).new_id.unwrap();
    let server = side(&sid, QpType::Rc);
    cmqp::accept(&sid, &server.qp, &ConnParam::rc(b"")).unwrap();
    // The reply arrives at the client, which never takes it.
    eventually("the client's CONNECT_RESPONSE", || readable(cch.fd()));
    drop((client, cid));
    assert_eq!(next_for(&sch, sid.handle(), WAIT), E::Rejected);
    assert!(!readable(cch.fd()), "a destroyed id's events go with it");
    drop((server, sid));
    // An id destroyed with its ADDR_RESOLVED pending.
    let id = cch.create_id(0, PortSpace::Tcp, QpType::Rc).unwrap();
    id.resolve_addr(None, loopback(port), WAIT).unwrap();
    eventually("ADDR_RESOLVED", || readable(cch.fd()));
    drop(id);
    assert!(!readable(cch.fd()));
    eventually("nothing in the client", || cb.cm_ids() == 0);
    eventually("the listener alone", || sb.cm_ids() == 1);
    drop(lid);
    assert_eq!(sb.cm_ids(), 0);
}

/// A listener that never takes its requests holds at most its backlog of them, as
/// rdma_ucm does (a request beyond it is dropped, and the client's retries end in its
/// timeout); requests whose clients gave up stay in that backlog until the listener
/// takes them (their later events dropped, as rdma_ucm drops the events of an id
/// userspace does not know yet), and all go with the listener.
#[test]
fn a_listener_that_never_accepts_holds_no_more_than_its_backlog() {
    let (sb, cb) = two_hosts();
    let (sch, lid, port) = listener_of(&sb, PortSpace::Tcp, 2);
    let mut clients = Vec::new();
    for _ in 0..6 {
        let (cch, cid, client) = requesting(&cb, loopback(port), b"");
        clients.push((cch, cid, client));
    }
    eventually("the backlog's requests", || sb.cm_ids() == 3);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(sb.cm_ids(), 3, "the listener and its backlog of 2");
    // Every client gives up: nothing grows.
    clients.clear();
    eventually("nothing in the clients", || cb.cm_ids() == 0);
    assert!(sb.cm_ids() <= 3);
    // The listener takes its requests at last and drops them.
    while let Some(ev) = sch.get_event(Some(Duration::from_millis(300))).unwrap() {
        drop(ev.new_id);
    }
    eventually("the listener alone", || sb.cm_ids() == 1);
    drop(lid);
    assert_eq!(sb.cm_ids(), 0);
}

/// A stranger's bytes at a listener's rdma_cm port (the rendezvous) get what every
/// listener of the sim gives them (`verify::read_first`): garbage and a lookup's
/// truncation end the connection unanswered, a hello is refused, another protocol
/// version is told so; and the listener's clients still connect.
#[test]
fn a_stranger_at_the_rdma_cm_port_is_refused_as_at_any_listener() {
    use std::io::Write;
    let (sb, cb) = two_hosts();
    let (sch, _lid, port) = listener(&sb, PortSpace::Tcp);
    let at = loopback(port);
    let answer = |bytes: &[u8]| {
        let mut s = std::net::TcpStream::connect(at).unwrap();
        s.write_all(bytes).unwrap();
        read_answer(&mut s)
    };
    assert_eq!(answer(&[0xff; 64]), None, "garbage");
    let hello = frame(Frame::LinkHello {
        src_gid: [1; 16],
        src_lid: 1,
        token: [0x5a; backend_sim_proto::wire::TOKEN_LEN],
    });
    assert_eq!(
        answer(&hello),
        Some(Frame::HelloNak {
            reason: HelloReject::Refused
        })
    );
    let mut old = hello.clone();
    old[2..4].copy_from_slice(&(backend_sim_proto::wire::VERSION - 1).to_le_bytes());
    assert_eq!(
        answer(&old),
        Some(Frame::HelloNak {
            reason: HelloReject::Version
        })
    );
    let lookup = frame(Frame::CmLookup {
        port_space: PortSpace::Tcp as u16,
        port,
    });
    assert_eq!(answer(&lookup[..lookup.len() - 1]), None, "a truncated lookup");
    assert!(matches!(answer(&lookup), Some(Frame::CmAddress { .. })));
    let (cch, _cid, _client) = requesting(&cb, at, b"");
    expect(&sch, E::ConnectRequest);
    drop(cch);
}

/// A flood at the rdma_cm port (connections that say nothing, and garbage) does not
/// keep the listener's clients out: each resolves, connects and exchanges data while
/// the flood holds its connections open.
#[test]
fn a_flood_at_the_rdma_cm_port_does_not_stop_real_clients() {
    use std::io::Write;
    let (sb, cb) = two_hosts();
    let (sch, _lid, port) = listener(&sb, PortSpace::Tcp);
    let at = loopback(port);
    let flood: Vec<_> = (0..400)
        .filter_map(|i| {
            let mut s = std::net::TcpStream::connect_timeout(&at, Duration::from_millis(200)).ok()?;
            if i % 4 == 0 {
                let _ = s.write_all(&[0xa5; 16]);
            }
            Some(s)
        })
        .collect();
    // More than the rendezvous lets be in setup at once (the listeners' bound).
    assert!(flood.len() > 256, "{}", flood.len());
    for i in 0..3u8 {
        let (cch, cid, client) = requesting(&cb, at, &[i]);
        let sid = expect(&sch, E::ConnectRequest).new_id.unwrap();
        let server = side(&sid, QpType::Rc);
        cmqp::accept(&sid, &server.qp, &ConnParam::rc(b"")).unwrap();
        expect(&cch, E::ConnectResponse);
        cmqp::complete_connect(&cid, &client.qp).unwrap();
        expect(&sch, E::Established);
        send_recv(&client, &server, b"through the flood");
    }
    drop(flood);
}

/// Destroying the last id that holds a device (here a listener, its connections gone)
/// closes the device, whose setup thread tells the connection manager of the links that
/// close meanwhile (its clients' hosts going away): the destroy must not hold the
/// manager's lock while it waits for that thread. Each round races the two.
#[test]
fn destroying_the_last_id_of_a_device_while_its_links_close_returns() {
    for round in 0..10 {
        let sb = SimBackend::default();
        let (sch, lid, port) = listener(&sb, PortSpace::Tcp);
        let mut hosts = Vec::new();
        for _ in 0..12 {
            let cb = SimBackend::default();
            let (cch, cid, client) = requesting(&cb, loopback(port), b"");
            let sid = expect(&sch, E::ConnectRequest).new_id.unwrap();
            let server = side(&sid, QpType::Rc);
            cmqp::accept(&sid, &server.qp, &ConnParam::rc(b"")).unwrap();
            expect(&cch, E::ConnectResponse);
            cmqp::complete_connect(&cid, &client.qp).unwrap();
            expect(&sch, E::Established);
            drop((server, sid));
            hosts.push((client, cid, cch, cb));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let gone = std::thread::spawn(move || drop(hosts));
        std::thread::spawn(move || {
            drop(lid);
            tx.send(()).unwrap();
        });
        rx.recv_timeout(WAIT).unwrap_or_else(|_| {
            panic!("round {round}: rdma_destroy_id of the device's last id did not return")
        });
        gone.join().unwrap();
        drop((sch, sb));
    }
}

/// Ids that resolve one address at once (cmtime's pattern) share the question to its
/// rendezvous: each gets its ADDR_RESOLVED, and a later resolve asks anew (a listener
/// gone meanwhile is not remembered).
#[test]
fn ids_resolving_one_address_at_once_each_get_their_answer() {
    let (sb, cb) = two_hosts();
    let (_sch, lid, port) = listener(&sb, PortSpace::Tcp);
    let ch = cb.create_event_channel().unwrap();
    let ids: Vec<_> = (0..50)
        .map(|i| {
            let id = ch.create_id(i, PortSpace::Tcp, QpType::Rc).unwrap();
            id.resolve_addr(None, loopback(port), WAIT).unwrap();
            id
        })
        .collect();
    let mut got = std::collections::HashSet::new();
    for _ in &ids {
        let ev = expect(&ch, E::AddrResolved);
        assert_eq!(ev.status, 0);
        got.insert(ev.id.handle);
    }
    assert_eq!(got.len(), ids.len());
    drop(lid);
    let id = ch.create_id(99, PortSpace::Tcp, QpType::Rc).unwrap();
    id.resolve_addr(None, loopback(port), WAIT).unwrap();
    let ev = ch.get_event(Some(WAIT)).unwrap().expect("an answer");
    assert_eq!(ev.id.handle, id.handle());
}
