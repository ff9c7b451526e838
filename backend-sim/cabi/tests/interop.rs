//! A C program and a Rust program on the sim talk to each other over the sim's wire:
//! `ibv_rc_pingpong` (C, this library preloaded) against a Rust peer on `backend-sim`
//! that speaks its TCP exchange and its ping-pong. The exchange is rdma-core's
//! libibverbs/examples/rc_pingpong.c: each side sends
//! `"LLLL:QQQQQQ:PPPPPP:<32 hex digits of the GID>"` and its NUL (52 bytes); the server
//! connects its QP before it answers, and the client then writes `"done"` and its NUL.
//! Each side sends a message when its previous send completed and a message arrived;
//! the client starts. `-c` has the server check the first byte of each page of what it
//! received (0, as the client writes it); both directions also check here that the data
//! is what the other side sent.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use backend_sim::{SimBackend, SimConfig};
use verbs_api::*;

const SIZE: usize = 4096;
const ITERS: u32 = 200;
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
const LIMIT: Duration = Duration::from_secs(60);

/// The 52-byte message of `ep`.
fn to_wire(ep: &Endpoint) -> [u8; 52] {
    let gid: String = ep.gid.0.iter().map(|b| format!("{b:02x}")).collect();
    let text = format!("{:04x}:{:06x}:{:06x}:{gid}", ep.lid, ep.qpn, ep.psn);
    let mut msg = [0u8; 52];
    msg[..text.len()].copy_from_slice(text.as_bytes());
    msg
}

fn from_wire(msg: &[u8; 52]) -> Endpoint {
    let text = std::str::from_utf8(&msg[..51]).expect("ascii");
    let f: Vec<&str> = text.split(':').collect();
    let hex = |s: &str| u32::from_str_radix(s, 16).expect("hex");
    let mut gid = [0u8; 16];
    for (i, b) in gid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&f[3][2 * i..2 * i + 2], 16).expect("gid hex");
    }
    Endpoint {
        gid: Gid(gid),
        lid: hex(f[0]) as u16,
        qpn: hex(f[1]),
        psn: hex(f[2]),
    }
}

/// The Rust side: one RC QP, a region to send from and one to receive into.
struct Peer {
    ctx: <SimBackend as Backend>::Context,
    _pd: <SimBackend as Backend>::Pd,
    send: <SimBackend as Backend>::Mr,
    recv: <SimBackend as Backend>::Mr,
    cq: <SimBackend as Backend>::Cq,
    qp: <SimBackend as Backend>::Qp,
}

impl Peer {
    fn new() -> Peer {
        let sim = SimBackend::new(SimConfig {
            devices: 1,
            ..SimConfig::default()
        });
        let ctx = sim.open("sim0").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let send = pd.reg_mr(SIZE, AccessFlags::LOCAL_WRITE).unwrap();
        let recv = pd.reg_mr(SIZE, AccessFlags::LOCAL_WRITE).unwrap();
        let cq = ctx.create_cq(1024, None).unwrap();
        let qp = pd
            .create_qp(&QpInitAttr::rc(&cq, &cq, QpCap::new(16, 600)))
            .unwrap();
        modify_to_init(&qp, &RcParams::default()).unwrap();
        for _ in 0..500 {
            qp.post_recv(&[RecvWr::new(RECV_WRID, &[recv.sge_all()])])
                .unwrap();
        }
        Peer {
            ctx,
            _pd: pd,
            send,
            recv,
            cq,
            qp,
        }
    }

    fn endpoint(&self, gid: bool) -> Endpoint {
        let mut me = local_endpoint(&self.ctx, &self.qp, &RcParams::default(), 0x1234).unwrap();
        assert!(
            me.lid > 0 && me.lid < 0xc000,
            "LID {:#x} is a unicast LID",
            me.lid
        );
        if !gid {
            // What ibv_rc_pingpong sends without -g.
            me.gid = Gid::ZERO;
        }
        me
    }

    fn connect(&self, remote: &Endpoint) {
        let p = RcParams::default();
        modify_to_rtr(&self.qp, &p, remote).unwrap();
        modify_to_rts(&self.qp, &p, 0x1234).unwrap();
    }

    /// rc_pingpong's loop for `ITERS` messages each way; `check` sees each message
    /// received.
    fn pingpong(&self, client: bool, check: impl Fn(&[u8])) {
        self.pingpong_n(client, ITERS, check)
    }

    fn pingpong_n(&self, client: bool, iters: u32, check: impl Fn(&[u8])) {
        let post_send = || {
            self.qp
                .post_send(&[SendWr::send(SEND_WRID, &[self.send.sge_all()]).signaled()])
                .unwrap()
        };
        let mut pending = RECV_WRID;
        if client {
            post_send();
            pending |= SEND_WRID;
        }
        let (mut scnt, mut rcnt) = (0, 0);
        let deadline = Instant::now() + LIMIT;
        let mut wc = [WorkCompletion::default(); 2];
        while rcnt < iters || scnt < iters {
            assert!(
                Instant::now() < deadline,
                "ping-pong stalled at {scnt} sent, {rcnt} received"
            );
            let n = self.cq.poll(&mut wc).unwrap();
            for w in &wc[..n] {
                assert_eq!(w.status, WcStatus::Success, "{w:?}");
                match w.wr_id {
                    SEND_WRID => scnt += 1,
                    RECV_WRID => {
                        assert_eq!(w.byte_len as usize, SIZE);
                        check(&self.recv.to_vec());
                        self.qp
                            .post_recv(&[RecvWr::new(RECV_WRID, &[self.recv.sge_all()])])
                            .unwrap();
                        rcnt += 1;
                    }
                    other => panic!("wr_id {other}"),
                }
                pending &= !w.wr_id;
                if scnt < iters && pending == 0 {
                    post_send();
                    pending = RECV_WRID | SEND_WRID;
                }
            }
        }
    }
}

/// What the C client sends with -c: 0x7b, and 0 at the start of each page.
fn c_client_data(buf: &[u8]) {
    let page = 4096;
    for (i, b) in buf.iter().enumerate() {
        let want = if i % page == 0 { 0 } else { 0x7b };
        assert_eq!(*b, want, "byte {i} of the C client's message");
    }
}

fn c_server_against_rust_client(gid: bool) {
    let port = common::free_port();
    let p = port.to_string();
    let mut args = vec!["-c", "-n", "200", "-s", "4096", "-p", &p];
    if gid {
        args.extend(["-g", "0"]);
    }
    let mut server = common::preloaded("ibv_rc_pingpong", &args).spawn().unwrap();
    common::wait_listening(port, &mut server, LIMIT);

    let peer = Peer::new();
    // What rc_pingpong's client sends with -c: zero at each page's start; the rest is
    // ours, and the server echoes it (it sends from the buffer it receives into).
    let mut data: Vec<u8> = (0..SIZE).map(|i| (i * 7 + 1) as u8).collect();
    data[0] = 0;
    peer.send.write(0, &data).unwrap();

    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&to_wire(&peer.endpoint(gid))).unwrap();
    let mut msg = [0u8; 52];
    s.read_exact(&mut msg).unwrap();
    s.write_all(b"done\0").unwrap();
    let remote = from_wire(&msg);
    assert_eq!(remote.gid.is_zero(), !gid);
    peer.connect(&remote);
    peer.pingpong(true, |got| {
        assert_eq!(got, &data[..], "the C server echoes the Rust client")
    });

    let out = common::wait(server, LIMIT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "server: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("200 iters in"), "{stdout}");
    assert!(!stdout.contains("invalid data"), "{stdout}");
}

/// Connects a Rust server to a C `ibv_rc_pingpong` client started with `args` (the
/// port and 127.0.0.1 are added); the client's process.
fn rust_server_with_c_client(peer: &Peer, args: &[&str], gid: bool) -> std::process::Child {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let mut args = args.to_vec();
    args.extend(["-p", &port, "127.0.0.1"]);
    let client = common::preloaded("ibv_rc_pingpong", &args).spawn().unwrap();
    let (mut s, _) = listener.accept().unwrap();
    let mut msg = [0u8; 52];
    s.read_exact(&mut msg).unwrap();
    let remote = from_wire(&msg);
    assert_eq!(remote.gid.is_zero(), !gid);
    peer.connect(&remote);
    s.write_all(&to_wire(&peer.endpoint(gid))).unwrap();
    let mut done = [0u8; 5];
    s.read_exact(&mut done).unwrap();
    assert_eq!(&done, b"done\0");
    client
}

fn rust_server_against_c_client(gid: bool) {
    let peer = Peer::new();
    let mut args = vec!["-c", "-n", "200", "-s", "4096"];
    if gid {
        args.extend(["-g", "0"]);
    }
    let client = rust_server_with_c_client(&peer, &args, gid);
    // The server's role: it answers with what arrived (rc_pingpong's server sends from
    // its receive buffer), so the C client's own data comes back to it.
    peer.pingpong(false, |got| {
        c_client_data(got);
        peer.send.write(0, got).unwrap();
    });

    let out = common::wait(client, LIMIT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("200 iters in"), "{stdout}");
}

#[test]
fn c_server_rust_client_by_lid() {
    c_server_against_rust_client(false);
}

#[test]
fn c_server_rust_client_by_gid() {
    c_server_against_rust_client(true);
}

#[test]
fn rust_server_c_client_by_lid() {
    rust_server_against_c_client(false);
}

#[test]
fn rust_server_c_client_by_gid() {
    rust_server_against_c_client(true);
}

/// A C program killed in the middle of a run (no cleanup, no goodbye) leaves its peer
/// no QP to wait on for ever: the peer's next send fails with `IBV_WC_RETRY_EXC_ERR`
/// (nobody accepts its reconnection: `vendor_err` ECONNREFUSED) within the QP's
/// timeout and retries, and the peer's QP is destroyed at once.
#[test]
fn a_killed_c_peer_leaves_no_hung_peer() {
    let peer = Peer::new();
    let mut client = rust_server_with_c_client(&peer, &["-n", "1000000", "-s", "4096"], false);
    peer.pingpong_n(false, 50, |_| {});
    client.kill().unwrap();
    client.wait().unwrap();
    let start = Instant::now();
    peer.qp
        .post_send(&[SendWr::send(SEND_WRID, &[peer.send.sge_all()]).signaled()])
        .unwrap();
    let wc = loop {
        let mut wc = [WorkCompletion::default(); 1];
        if peer.cq.poll(&mut wc).unwrap() == 1 && wc[0].wr_id == SEND_WRID {
            break wc[0];
        }
        assert!(start.elapsed() < LIMIT, "the send to a dead peer never completed");
    };
    assert_eq!(wc.status, WcStatus::RetryExcErr, "{wc:?}");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "took {:?}",
        start.elapsed()
    );
    let t = Instant::now();
    drop(peer);
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "destroy took {:?}",
        t.elapsed()
    );
}
