//! The same-host path (`backend_sim::same_host`): two devices on one host connect their
//! QPs over a unix socket, exactly (a stale file, a forced TCP, another device's port all
//! go over TCP), their frames go over shared-memory rings (`backend_sim::shm_ring`),
//! strangers on the unix socket are refused as on TCP, a QP whose peer process is killed
//! ends as for a vanished host, and one whose peer process scribbles over the rings'
//! indices sees its connection closed as a broken one.
//!
//! Its own `main`: it runs itself again as the peer process that is killed.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use backend_sim::same_host::{published_path, Transport};
use backend_sim::{SimBackend, SimConfig, SimContext, SimCq, SimMr, SimPd, SimQp};
use backend_sim_proto::wire::{Frame, BASE_LEN, MAX_HDR_LEN, TOKEN_LEN};
use verbs_api::*;

mod common;
use common::{hex, unhex};

const WAIT: Duration = Duration::from_secs(10);

fn main() {
    if std::env::args().any(|a| a == "--list") {
        println!("same_host: test");
        return;
    }
    if std::env::var_os("SAME_HOST_PEER").is_some() {
        peer();
        return;
    }
    // First: the sweep runs when the process publishes its first device.
    for (name, t) in [
        (
            "stale_sockets_are_swept_when_a_process_first_publishes",
            stale_sockets_are_swept_when_a_process_first_publishes as fn(),
        ),
        (
            "two_devices_of_one_process_connect_over_the_unix_socket",
            two_devices_of_one_process_connect_over_the_unix_socket,
        ),
        ("transport_tcp_forces_tcp", transport_tcp_forces_tcp),
        (
            "ud_datagrams_between_two_devices_go_over_the_unix_socket",
            ud_datagrams_between_two_devices_go_over_the_unix_socket,
        ),
        (
            "strangers_on_the_unix_socket_are_refused",
            strangers_on_the_unix_socket_are_refused,
        ),
        (
            "a_stale_socket_falls_back_to_tcp_and_is_removed",
            a_stale_socket_falls_back_to_tcp_and_is_removed,
        ),
        (
            "a_peer_process_killed_ends_as_a_vanished_host",
            a_peer_process_killed_ends_as_a_vanished_host,
        ),
        (
            "a_new_lid_moves_the_published_socket",
            a_new_lid_moves_the_published_socket,
        ),
        (
            "writes_larger_than_the_ring_wrap_it",
            writes_larger_than_the_ring_wrap_it,
        ),
        (
            "a_peer_corrupting_the_rings_gets_its_connection_closed",
            a_peer_corrupting_the_rings_gets_its_connection_closed,
        ),
        (
            "a_hello_from_this_host_is_checked_on_the_unix_socket",
            a_hello_from_this_host_is_checked_on_the_unix_socket,
        ),
    ] {
        t();
        println!("test same_host::{name} ... ok");
    }
}

fn sim(transport: Transport) -> SimBackend {
    SimBackend::new(SimConfig {
        transport,
        ..Default::default()
    })
}

/// One side of an RC pair: its QP, CQ and a region.
struct Side {
    ctx: SimContext,
    pd: SimPd,
    qp: SimQp,
    cq: SimCq,
    mr: SimMr,
}

fn side(ctx: SimContext) -> Side {
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let qp = pd
        .create_qp(&QpInitAttr::rc(&cq, &cq, QpCap::new(16, 16)))
        .unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let mr = pd.reg_mr(1 << 20, access).unwrap();
    Side { ctx, pd, qp, cq, mr }
}

/// The defaults (an ACK timeout of 67 ms, 7 retries): a loaded machine must not turn the
/// traffic into retries, and a vanished peer still ends the WRs within a second.
fn params() -> RcParams {
    RcParams::default()
}

/// Connects the QPs of `a` and `b`.
fn connect(a: &Side, b: &Side) {
    let p = params();
    let ea = local_endpoint(&a.ctx, &a.qp, &p, 1).unwrap();
    let eb = local_endpoint(&b.ctx, &b.qp, &p, 2).unwrap();
    connect_rc(&a.qp, &p, ea.psn, &eb).unwrap();
    connect_rc(&b.qp, &p, eb.psn, &ea).unwrap();
}

/// A SEND, a 1 MiB RDMA WRITE and a READ back from `a` to `b`, checked byte for byte.
fn traffic(a: &Side, b: &Side) {
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 + 3) as u8).collect();
    a.mr.write(0, &data).unwrap();
    b.qp.post_recv(&[RecvWr::new(1, &[b.mr.sge(0, 64).unwrap()])])
        .unwrap();
    a.qp.post_send(&[
        SendWr::send(1, &[a.mr.sge(0, 64).unwrap()]).signaled(),
        SendWr::write(2, &[a.mr.sge(0, 1 << 20).unwrap()], b.mr.remote().at(0)).signaled(),
    ])
    .unwrap();
    for w in poll_n(&a.cq, 2, WAIT).unwrap() {
        assert_eq!(w.status, WcStatus::Success, "{w:?}");
    }
    let w = poll_n(&b.cq, 1, WAIT).unwrap();
    assert_eq!((w[0].status, w[0].byte_len), (WcStatus::Success, 64));
    a.mr.write(0, &vec![0u8; 1 << 20]).unwrap();
    a.qp.post_send(&[SendWr::read(3, &[a.mr.sge(0, 1 << 20).unwrap()], b.mr.remote().at(0)).signaled()])
        .unwrap();
    assert_eq!(poll_n(&a.cq, 1, WAIT).unwrap()[0].status, WcStatus::Success);
    let mut back = vec![0u8; 1 << 20];
    a.mr.read(0, &mut back).unwrap();
    assert!(back == data, "the READ brings back what the WRITE put");
}

/// A process that exited without closing its devices left its sockets: the next process
/// to publish one removes those nobody listens on, and leaves live ones.
fn stale_sockets_are_swept_when_a_process_first_publishes() {
    // Port 1: no device of this host listens there.
    let stale = published_path("127.0.0.1:1".parse().unwrap()).unwrap();
    std::fs::create_dir_all(stale.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(&stale);
    drop(UnixListener::bind(&stale).unwrap());
    let live_path = published_path("127.0.0.1:2".parse().unwrap()).unwrap();
    let _ = std::fs::remove_file(&live_path);
    let live = UnixListener::bind(&live_path).unwrap();
    let sim = sim(Transport::Auto);
    let dev = sim.open("sim0").unwrap();
    assert!(!stale.exists(), "the stale socket was swept");
    assert!(live_path.exists(), "a socket somebody listens on stays");
    let path = published_path(dev.listen_addr()).unwrap();
    assert!(path.exists());
    drop(dev);
    assert!(!path.exists(), "a closed device's socket goes with it");
    drop(live);
    std::fs::remove_file(&live_path).unwrap();
}

fn two_devices_of_one_process_connect_over_the_unix_socket() {
    let sim = sim(Transport::Auto);
    let (a, b) = (side(sim.open("sim0").unwrap()), side(sim.open("sim1").unwrap()));
    for s in [&a, &b] {
        let path = published_path(s.ctx.listen_addr()).unwrap();
        assert!(path.exists(), "{} is published", path.display());
    }
    connect(&a, &b);
    traffic(&a, &b);
    let (ca, cb) = (a.ctx.counters(), b.ctx.counters());
    assert_eq!((ca.same_host_connections, cb.same_host_connections), (1, 1));
    assert_eq!((ca.shm_ring_connections, cb.shm_ring_connections), (1, 1));
    assert_eq!((ca.tcp_connections, cb.tcp_connections), (0, 0));
}

/// Five 1 MiB WRITEs, more than a ring holds (`shm_ring::CAPACITY`), each checked byte
/// for byte as it lands: the frames wrap around the end of the ring.
fn writes_larger_than_the_ring_wrap_it() {
    let sim = sim(Transport::Auto);
    let (a, b) = (side(sim.open("sim0").unwrap()), side(sim.open("sim1").unwrap()));
    connect(&a, &b);
    for round in 0..5u32 {
        let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 13 + round) as u8).collect();
        a.mr.write(0, &data).unwrap();
        a.qp.post_send(&[SendWr::write(
            round.into(),
            &[a.mr.sge(0, 1 << 20).unwrap()],
            b.mr.remote().at(0),
        )
        .signaled()])
            .unwrap();
        assert_eq!(poll_n(&a.cq, 1, WAIT).unwrap()[0].status, WcStatus::Success);
        let mut got = vec![0u8; 1 << 20];
        b.mr.read(0, &mut got).unwrap();
        assert!(got == data, "round {round}: the WRITE landed whole");
    }
    let (ca, cb) = (a.ctx.counters(), b.ctx.counters());
    assert_eq!((ca.shm_ring_connections, cb.shm_ring_connections), (1, 1));
}

/// A port whose LID changes listens at a new address: its same-host socket moves with
/// it (the old one is no longer there to take connections meant for the old LID), and
/// a peer that names the new LID still connects over the unix socket.
fn a_new_lid_moves_the_published_socket() {
    let sim = sim(Transport::Auto);
    let (a, b) = (side(sim.open("sim0").unwrap()), side(sim.open("sim1").unwrap()));
    let old = published_path(b.ctx.listen_addr()).unwrap();
    assert!(old.exists());
    b.ctx.faults().change_lid().unwrap();
    let new = published_path(b.ctx.listen_addr()).unwrap();
    assert_ne!(old, new);
    assert!(!old.exists(), "the old LID's socket is gone");
    assert!(new.exists(), "the new LID's socket is published");
    connect(&a, &b);
    traffic(&a, &b);
    let (ca, cb) = (a.ctx.counters(), b.ctx.counters());
    assert_eq!((ca.same_host_connections, cb.same_host_connections), (1, 1));
    assert_eq!((ca.tcp_connections, cb.tcp_connections), (0, 0));
}

fn transport_tcp_forces_tcp() {
    let sim = SimBackend::new(SimConfig {
        transport: Transport::Tcp,
        devices: 3,
        ..Default::default()
    });
    let (a, b) = (side(sim.open("sim0").unwrap()), side(sim.open("sim1").unwrap()));
    assert!(!published_path(a.ctx.listen_addr()).unwrap().exists());
    // A device of another backend that does publish: still TCP, as the connector says.
    let other = sim_auto_side();
    connect(&a, &b);
    traffic(&a, &b);
    let (ca, cb) = (a.ctx.counters(), b.ctx.counters());
    assert_eq!((ca.same_host_connections, cb.same_host_connections), (0, 0));
    assert_eq!((ca.shm_ring_connections, cb.shm_ring_connections), (0, 0));
    assert_eq!((ca.tcp_connections, cb.tcp_connections), (1, 1));
    let c = side(sim.open("sim2").unwrap());
    connect(&c, &other);
    traffic(&c, &other);
    assert_eq!(c.ctx.counters().same_host_connections, 0);
    assert_eq!(other.ctx.counters().same_host_connections, 0);
}

/// A UD QP in RTS on `s`'s device, on its CQ.
fn ud_qp(s: &Side) -> SimQp {
    let pd = &s.pd;
    let qp = pd
        .create_qp(&QpInitAttr::ud(&s.cq, &s.cq, QpCap::new(8, 8)))
        .unwrap();
    let m = QpAttrMask::STATE;
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey: 0x11,
        ..Default::default()
    };
    qp.modify(
        &init,
        m | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    )
    .unwrap();
    for (state, extra) in [
        (QpState::Rtr, QpAttrMask::empty()),
        (QpState::Rts, QpAttrMask::SQ_PSN),
    ] {
        let attr = QpAttr {
            qp_state: state,
            ..Default::default()
        };
        qp.modify(&attr, m | extra).unwrap();
    }
    qp
}

/// UD datagrams from one device to another for each transport: they arrive, over the
/// link each transport gives.
fn ud_datagrams_between_two_devices_go_over_the_unix_socket() {
    for transport in [Transport::Auto, Transport::Tcp] {
        let sim = sim(transport);
        let (a, b) = (side(sim.open("sim0").unwrap()), side(sim.open("sim1").unwrap()));
        let (qa, qb) = (ud_qp(&a), ud_qp(&b));
        let p = RcParams::default();
        let ep = local_endpoint(&b.ctx, &qb, &p, 0).unwrap();
        let ah = a.pd.create_ah(&ah_attr_for(&ep, &p)).unwrap();
        qb.post_recv(&[RecvWr::new(7, &[b.mr.sge(0, 64 + 40).unwrap()])])
            .unwrap();
        a.mr.write(0, b"over the link").unwrap();
        qa.post_send(&[SendWr::send(1, &[a.mr.sge(0, 13).unwrap()])
            .signaled()
            .ud(&ah, qb.qp_num(), 0x11)])
            .unwrap();
        assert_eq!(poll_n(&a.cq, 1, WAIT).unwrap()[0].status, WcStatus::Success);
        let w = poll_n(&b.cq, 1, WAIT).unwrap();
        assert_eq!(
            (w[0].wr_id, w[0].status, w[0].byte_len),
            (7, WcStatus::Success, 13 + 40)
        );
        let mut got = [0u8; 13];
        b.mr.read(40, &mut got).unwrap();
        assert_eq!(&got, b"over the link");
        let links = |c: &SimContext| {
            let n = c.counters();
            (n.same_host_connections, n.tcp_connections)
        };
        let want = match transport {
            Transport::Auto => (1, 0),
            Transport::Tcp => (0, 1),
        };
        assert_eq!((links(&a.ctx), links(&b.ctx)), (want, want), "{transport:?}");
    }
}

fn sim_auto_side() -> Side {
    side(sim(Transport::Auto).open("sim0").unwrap())
}

/// The first setup frame on `s` (waiting up to 5 s), or `None` if it closes first.
fn read_answer(s: &mut UnixStream) -> Option<Frame> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut base = [0u8; BASE_LEN];
    s.read_exact(&mut base).ok()?;
    let n = backend_sim_proto::wire::setup_header_len(&base).ok()?;
    let mut h = [0u8; MAX_HDR_LEN];
    h[..BASE_LEN].copy_from_slice(&base);
    s.read_exact(&mut h[BASE_LEN..n]).ok()?;
    Frame::decode(&h[..n]).ok().flatten().map(|(f, _)| f)
}

fn hello(ctx: &SimContext, src_qpn: u32, dst_qpn: u32) -> Vec<u8> {
    let mut b = [0u8; MAX_HDR_LEN];
    let n = Frame::Hello {
        src_gid: ctx.query_gid(1, 0).unwrap().0,
        src_lid: ctx.query_port(1).unwrap().lid,
        qp_type: QpType::Rc,
        src_qpn,
        dst_qpn,
        token: [0x5a; TOKEN_LEN],
    }
    .encode(&mut b);
    b[..n].to_vec()
}

fn strangers_on_the_unix_socket_are_refused() {
    let sim = sim(Transport::Auto);
    let (a, b) = (side(sim.open("sim0").unwrap()), side(sim.open("sim1").unwrap()));
    let path = published_path(b.ctx.listen_addr()).unwrap();
    // Garbage instead of a hello: closed unanswered.
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(&[0xff; 64]).unwrap();
    assert!(read_answer(&mut s).is_none());
    // A hello for a QP that does not exist.
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(&hello(&a.ctx, 5, 0x7777)).unwrap();
    assert!(matches!(read_answer(&mut s), Some(Frame::HelloNak { .. })));
    // A hello for a QP in RESET.
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(&hello(&a.ctx, a.qp.qp_num(), b.qp.qp_num())).unwrap();
    assert!(matches!(read_answer(&mut s), Some(Frame::HelloNak { .. })));
    // The QPs connected, a hello that claims to be the peer's with a token nobody issued:
    // the claimed device does not confirm it, and the pair is undisturbed.
    connect(&a, &b);
    traffic(&a, &b);
    let mut s = UnixStream::connect(&path).unwrap();
    s.write_all(&hello(&a.ctx, a.qp.qp_num(), b.qp.qp_num())).unwrap();
    let mut s2 = UnixStream::connect(published_path(a.ctx.listen_addr()).unwrap()).unwrap();
    s2.write_all(&hello(&b.ctx, b.qp.qp_num(), a.qp.qp_num()))
        .unwrap();
    assert!(matches!(read_answer(&mut s), Some(Frame::HelloNak { .. })));
    assert!(matches!(read_answer(&mut s2), Some(Frame::HelloNak { .. })));
    traffic(&a, &b);
    assert_eq!(
        a.ctx.counters().same_host_connections,
        1,
        "the pair kept its connection"
    );
}

/// The check of a hello from a device on this host goes to the unix socket that device
/// publishes: the raw peer here publishes one and has no TCP listener at all (its port
/// refuses), so only a check on the unix socket confirms its hello.
fn a_hello_from_this_host_is_checked_on_the_unix_socket() {
    // 127.0.0.0: a GID below 127.0.0.1's, so the raw peer is the side that connects.
    let raw_ip = std::net::Ipv4Addr::new(127, 0, 0, 0);
    let port = std::net::TcpListener::bind((raw_ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let raw = std::net::SocketAddr::from((raw_ip, port));
    // The device first: it makes the directory of the sockets.
    let b = sim_auto_side();
    let published = published_path(raw).unwrap();
    let _ = std::fs::remove_file(&published);
    let checks = UnixListener::bind(&published).unwrap();
    let p = params();
    let peer = Endpoint {
        gid: Gid::from(raw_ip),
        lid: port,
        qpn: 2,
        psn: 0,
    };
    connect_rc(&b.qp, &p, 0, &peer).unwrap();
    let token = [0x6b; TOKEN_LEN];
    let dst_qpn = b.qp.qp_num();
    let checker = std::thread::spawn(move || {
        let (mut c, _) = checks.accept().unwrap();
        match read_answer(&mut c) {
            Some(Frame::Verify {
                src_qpn: 2,
                dst_qpn: d,
                token: t,
            }) if d == dst_qpn && t == token => {}
            other => panic!("expected the check of the hello, got {other:?}"),
        }
        let mut b = [0u8; MAX_HDR_LEN];
        let n = Frame::HelloAck.encode(&mut b);
        c.write_all(&b[..n]).unwrap();
    });
    let mut s = UnixStream::connect(published_path(b.ctx.listen_addr()).unwrap()).unwrap();
    let mut h = [0u8; MAX_HDR_LEN];
    let n = Frame::Hello {
        src_gid: peer.gid.0,
        src_lid: port,
        qp_type: QpType::Rc,
        src_qpn: 2,
        dst_qpn,
        token,
    }
    .encode(&mut h);
    s.write_all(&h[..n]).unwrap();
    assert_eq!(read_answer(&mut s), Some(Frame::HelloAck));
    checker.join().unwrap();
    let _ = std::fs::remove_file(&published);
}

fn a_stale_socket_falls_back_to_tcp_and_is_removed() {
    let sim = sim(Transport::Auto);
    let (a, b) = (side(sim.open("sim0").unwrap()), side(sim.open("sim1").unwrap()));
    // The QP with the smaller (GID, LID, QPN) connects: the other's socket goes stale, as
    // a killed process leaves it.
    let id = |s: &Side| {
        let e = local_endpoint(&s.ctx, &s.qp, &params(), 0).unwrap();
        (e.gid.0, e.lid, e.qpn)
    };
    let (active, passive) = if id(&a) < id(&b) { (&a, &b) } else { (&b, &a) };
    let path = published_path(passive.ctx.listen_addr()).unwrap();
    std::fs::remove_file(&path).unwrap();
    drop(UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    connect(&a, &b);
    traffic(&a, &b);
    assert_eq!(active.ctx.counters().tcp_connections, 1);
    assert_eq!(active.ctx.counters().same_host_connections, 0);
    assert!(!path.exists(), "the stale socket was removed");
}

// ---------------------------------------------------------------- the killed peer

/// The peer process: a device and an RC QP; says its endpoint, reads the other's,
/// connects, posts receives, says "ready", and waits to be killed.
fn peer() {
    let s = side(sim(Transport::Auto).open("sim0").unwrap());
    let p = params();
    let me = local_endpoint(&s.ctx, &s.qp, &p, 9).unwrap();
    let mut out = std::io::stdout();
    writeln!(out, "{}", hex(&me.to_bytes())).unwrap();
    let mut line = String::new();
    let mut input = BufReader::new(std::io::stdin());
    input.read_line(&mut line).unwrap();
    let them = Endpoint::from_bytes(&unhex(line.trim())).unwrap();
    connect_rc(&s.qp, &p, me.psn, &them).unwrap();
    for i in 0..8 {
        s.qp.post_recv(&[RecvWr::new(i, &[s.mr.sge(0, 64).unwrap()])])
            .unwrap();
    }
    writeln!(out, "ready").unwrap();
    // Until killed; or told to scribble over the rings' indices first.
    line.clear();
    let _ = input.read_line(&mut line);
    if line.trim() == "corrupt" {
        corrupt_rings();
        writeln!(out, "corrupted").unwrap();
        line.clear();
        let _ = input.read_line(&mut line);
    }
    std::thread::sleep(Duration::from_secs(60));
}

/// Writes garbage over every index of every ring segment this process has mapped
/// (found by the memfd's name in `/proc/self/maps`), as a hostile process could.
fn corrupt_rings() {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mut found = 0;
    for l in maps.lines().filter(|l| l.contains("memfd:rdma-sim-rings")) {
        let start = usize::from_str_radix(l.split('-').next().unwrap(), 16).unwrap();
        // SAFETY: `start` begins a shared mapping of a ring segment, whose first page
        // is its control words; scribbling over them is the point (the sim reads them
        // only as atomics and checks them).
        unsafe {
            let p = start as *mut u64;
            for i in 0..4096 / 8 {
                p.add(i).write_volatile(0x4141_4141_4141_4141);
            }
        }
        found += 1;
    }
    assert!(found > 0, "the peer has a ring segment mapped");
}

/// The peer process (see [`peer`]), connected to an RC QP of this process over the
/// rings, one SEND gone through: the child, what it is told and what it says, this side.
fn peer_connected() -> (
    std::process::Child,
    std::process::ChildStdin,
    BufReader<std::process::ChildStdout>,
    Side,
) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("SAME_HOST_PEER", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut tell = child.stdin.take().unwrap();
    let mut hear = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    hear.read_line(&mut line).unwrap();
    let them = Endpoint::from_bytes(&unhex(line.trim())).unwrap();
    let s = sim_auto_side();
    let p = params();
    let me = local_endpoint(&s.ctx, &s.qp, &p, 3).unwrap();
    writeln!(tell, "{}", hex(&me.to_bytes())).unwrap();
    connect_rc(&s.qp, &p, me.psn, &them).unwrap();
    line.clear();
    hear.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    s.qp.post_send(&[SendWr::send(1, &[s.mr.sge(0, 64).unwrap()]).signaled()])
        .unwrap();
    assert_eq!(poll_n(&s.cq, 1, WAIT).unwrap()[0].status, WcStatus::Success);
    assert_eq!(s.ctx.counters().same_host_connections, 1);
    assert_eq!(s.ctx.counters().shm_ring_connections, 1);
    (child, tell, hear, s)
}

fn a_peer_process_killed_ends_as_a_vanished_host() {
    let (mut child, _tell, _hear, s) = peer_connected();
    child.kill().unwrap();
    child.wait().unwrap();
    s.qp.post_send(&[
        SendWr::send(2, &[s.mr.sge(0, 64).unwrap()]).signaled(),
        SendWr::send(3, &[s.mr.sge(0, 64).unwrap()]).signaled(),
    ])
    .unwrap();
    let w = poll_n(&s.cq, 2, Duration::from_secs(30)).unwrap();
    assert_eq!(w[0].status, WcStatus::RetryExcErr, "{:?}", w[0]);
    assert_eq!(w[1].status, WcStatus::WrFlushErr, "{:?}", w[1]);
    // No shared memory outlives the pair (it went over rings: `peer_connected`): the
    // peer's mapping went with its process, and this side's goes with the connection,
    // closed when its end of the doorbell socket ended, or with the device at the latest
    // (the memfd has no name to leave behind).
    drop(s);
    // (The device's threads let go of its connections as they end.)
    let deadline = std::time::Instant::now() + WAIT;
    while rings_mapped() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a ring segment is still mapped after the device closed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// How many ring segments this process has mapped (the memfd's name in
/// `/proc/self/maps`).
fn rings_mapped() -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter(|l| l.contains("memfd:rdma-sim-rings"))
        .count()
}

/// The peer process overwrites the rings' indices: this side's next write finds the
/// peer's index out of bounds and closes the connection as a broken one (no panic, no
/// access outside the rings); its QP carries on as after any broken connection: the
/// WR completes over a new connection, or ends in `IBV_WC_RETRY_EXC_ERR`.
fn a_peer_corrupting_the_rings_gets_its_connection_closed() {
    let (mut child, mut tell, mut hear, s) = peer_connected();
    let mut line = String::new();
    writeln!(tell, "corrupt").unwrap();
    line.clear();
    hear.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "corrupted");
    s.qp.post_send(&[SendWr::send(2, &[s.mr.sge(0, 64).unwrap()]).signaled()])
        .unwrap();
    let w = poll_n(&s.cq, 1, Duration::from_secs(30)).unwrap();
    assert!(
        matches!(w[0].status, WcStatus::Success | WcStatus::RetryExcErr),
        "{:?}",
        w[0]
    );
    // The corrupted connection was closed: a WR that completed went over a new one.
    if w[0].status == WcStatus::Success {
        assert!(s.ctx.counters().same_host_connections >= 2);
    }
    child.kill().unwrap();
    child.wait().unwrap();
}
