//! A hostile process attacks a live QP pair: only the peer its address vector names may
//! become a QP's peer.
//!
//! The attacker (this binary run again as a child process, so it is another process as on
//! a real host) knows everything the pair's out-of-band exchange said: both devices'
//! GID and LID, both QPNs, and the rkey and address of the responder's region. From its
//! own sockets, also from another source address and through the devices' same-host
//! sockets (the pair itself runs over those), it
//! - says hello to each device claiming to be the other side's QP (with a token it made
//!   up), then sends SENDs and WRITEs on the connection anyway;
//! - asks the active side's device to confirm tokens it guessed;
//! - says hello for random QPNs, for a QP in RESET and for the live QPs, and records the
//!   bytes of every refusal.
//!
//! Meanwhile the pair runs SENDs and WRITEs, and twice drops its own connection (a
//! legitimate reconnect must still work). At the end every byte and completion of the
//! pair is checked, no refusal differs from another by a byte, no attempt was accepted,
//! and the strangers' connections allocated far less than a connection's 32 KiB reader.
//!
//! `harness = false` (see Cargo.toml): `main` is the test, so the binary can also be the
//! attacker and can count the bytes the process allocates.

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use backend_sim::SimBackend;
use backend_sim_proto::wire::{Frame, HelloReject, MAX_HDR_LEN, TOKEN_LEN};
use verbs_api::*;

struct Counting;
static COUNTING: AtomicBool = AtomicBool::new(false);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counting is two
// relaxed atomics and allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        }
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const N: u64 = 2000;
const MSG: usize = 64;
const WAIT: Duration = Duration::from_secs(20);
/// Stranger connections in the allocation phase.
const STRANGERS: usize = 300;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        println!("takeover: test");
        return;
    }
    if let Ok(spec) = std::env::var("TAKEOVER_ATTACK") {
        attacker(&spec);
        return;
    }
    live_pair_survives_a_hostile_process();
    println!("test takeover::live_pair_survives_a_hostile_process ... ok");
}

/// What the attacker knows, as `key=value` words.
struct Spec {
    a: SocketAddr,
    b: SocketAddr,
    gid: Gid,
    qpn_a: u32,
    qpn_b: u32,
    reset_qpn: u32,
    rkey: u32,
    addr: u64,
}

impl Spec {
    fn encode(&self) -> String {
        format!(
            "a={} b={} gid={} qpn_a={} qpn_b={} reset_qpn={} rkey={} addr={}",
            self.a,
            self.b,
            hex(&self.gid.0),
            self.qpn_a,
            self.qpn_b,
            self.reset_qpn,
            self.rkey,
            self.addr
        )
    }

    fn decode(s: &str) -> Spec {
        let get = |k: &str| {
            s.split(' ')
                .find_map(|w| w.strip_prefix(&format!("{k}=")))
                .unwrap_or_else(|| panic!("{k} missing in {s:?}"))
                .to_string()
        };
        let mut gid = [0u8; 16];
        let g = get("gid");
        for (i, b) in gid.iter_mut().enumerate() {
            *b = u8::from_str_radix(&g[2 * i..2 * i + 2], 16).unwrap();
        }
        Spec {
            a: get("a").parse().unwrap(),
            b: get("b").parse().unwrap(),
            gid: Gid(gid),
            qpn_a: get("qpn_a").parse().unwrap(),
            qpn_b: get("qpn_b").parse().unwrap(),
            reset_qpn: get("reset_qpn").parse().unwrap(),
            rkey: get("rkey").parse().unwrap(),
            addr: get("addr").parse().unwrap(),
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn enc(f: Frame) -> Vec<u8> {
    let mut b = [0u8; MAX_HDR_LEN];
    let n = f.encode(&mut b);
    b[..n].to_vec()
}

// ---------------------------------------------------------------- the attacker

/// The answer to a setup frame: the first 16 bytes (a whole refusal), or fewer if the
/// device closed first.
fn answer(s: &mut Conn) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut out = vec![0u8; 16];
    let mut got = 0;
    while got < out.len() {
        match s.read(&mut out[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    out.truncate(got);
    out
}

/// Whatever else the device sends until it closes: nothing, for a refused connection.
fn rest(s: &mut impl Read) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

/// The attacker's connection to a device: over TCP, or through its same-host socket.
enum Conn {
    Tcp(TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Conn {
    fn set_read_timeout(&self, t: Option<Duration>) {
        match self {
            Conn::Tcp(s) => s.set_read_timeout(t).unwrap(),
            Conn::Unix(s) => s.set_read_timeout(t).unwrap(),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(b),
            Conn::Unix(s) => s.read(b),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(b),
            Conn::Unix(s) => s.write(b),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// How an attempt reaches a device.
#[derive(Clone, Copy)]
enum Via {
    /// TCP, from this source address (or the default one).
    Tcp(Option<std::net::Ipv4Addr>),
    /// The device's same-host socket.
    Unix,
}

fn connect_via(to: SocketAddr, via: Via) -> Conn {
    match via {
        Via::Tcp(from) => Conn::Tcp(connect_from(to, from)),
        Via::Unix => {
            let path = backend_sim::same_host::published_path(to).unwrap();
            Conn::Unix(std::os::unix::net::UnixStream::connect(path).unwrap())
        }
    }
}

fn connect_from(to: SocketAddr, from: Option<std::net::Ipv4Addr>) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    if let Some(ip) = from {
        sock.bind(&SocketAddr::new(ip.into(), 0).into()).unwrap();
    }
    sock.connect_timeout(&to.into(), Duration::from_secs(2)).unwrap();
    sock.into()
}

fn attacker(spec: &str) {
    let sp = Spec::decode(spec);
    let hello = |lid: u16, src_qpn: u32, dst_qpn: u32| {
        enc(Frame::Hello {
            src_gid: sp.gid.0,
            src_lid: lid,
            qp_type: QpType::Rc,
            src_qpn,
            dst_qpn,
            token: rand::random::<[u8; TOKEN_LEN]>(),
        })
    };
    // Data frames a taken-over connection would carry: a SEND into the victim's receive
    // buffer and a WRITE into its region.
    let mut payload = enc(Frame::Send {
        psn: 0,
        len: MSG as u32,
        imm: None,
        solicited: false,
        ack_req: true,
        inv: None,
    });
    payload.extend([0xee; MSG]);
    payload.extend(enc(Frame::Write {
        psn: 1,
        len: MSG as u32,
        addr: sp.addr,
        rkey: sp.rkey,
        imm: None,
        solicited: false,
        ack_req: true,
    }));
    payload.extend([0xee; MSG]);
    let mut refusals: Vec<Vec<u8>> = Vec::new();
    let mut attempt = |to: SocketAddr, bytes: Vec<u8>, from| {
        let mut s = connect_via(to, from);
        s.write_all(&bytes).unwrap();
        let mut got = answer(&mut s);
        // Data frames anyway: a refused connection carries nothing.
        let _ = s.write_all(&payload);
        got.extend(rest(&mut s));
        refusals.push(got);
    };
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut phase = |name: &str| {
        let l = lines.next().unwrap().unwrap();
        assert_eq!(l, name, "the test and the attacker are out of step");
    };

    phase("attack");
    let from2 = std::net::Ipv4Addr::new(127, 0, 0, 3);
    for round in 0..100 {
        let from = match round % 3 {
            0 => Via::Tcp(None),
            1 => Via::Tcp(Some(from2)),
            _ => Via::Unix,
        };
        // To B, as A; to A, as B.
        attempt(sp.b, hello(sp.a.port(), sp.qpn_a, sp.qpn_b), from);
        attempt(sp.a, hello(sp.b.port(), sp.qpn_b, sp.qpn_a), from);
        // Guessed tokens, asked of the device that makes the real attempts.
        for dev in [sp.a, sp.b] {
            attempt(
                dev,
                enc(Frame::Verify {
                    src_qpn: sp.qpn_a,
                    dst_qpn: sp.qpn_b,
                    token: rand::random(),
                }),
                from,
            );
            attempt(
                dev,
                enc(Frame::Verify {
                    src_qpn: sp.qpn_b,
                    dst_qpn: sp.qpn_a,
                    token: rand::random(),
                }),
                from,
            );
        }
        // Enumeration: a random QPN, the QP in RESET, a QPN that cannot exist.
        let dst = rand::random::<u32>() & 0xff_ffff;
        attempt(sp.b, hello(sp.a.port(), sp.qpn_a, dst), from);
        attempt(sp.b, hello(sp.a.port(), sp.qpn_a, sp.reset_qpn), from);
        attempt(sp.b, hello(sp.a.port(), 7, sp.qpn_b), from);
    }
    let refused = enc(Frame::HelloNak {
        reason: HelloReject::Refused,
    });
    let odd: Vec<_> = refusals.iter().filter(|r| **r != refused).collect();
    println!("attempts {} odd {}", refusals.len(), odd.len());
    for r in odd.iter().take(5) {
        println!("odd answer {}", hex(r));
    }
    std::io::stdout().flush().unwrap();

    phase("strangers");
    // Connections that claim a live QP's peer, and silent ones: what does each cost?
    let mut held = Vec::new();
    for i in 0..STRANGERS {
        let mut s = connect_via(sp.b, if i % 4 == 3 { Via::Unix } else { Via::Tcp(None) });
        if i % 2 == 0 {
            s.write_all(&hello(sp.a.port(), sp.qpn_a, sp.qpn_b)).unwrap();
        }
        held.push(s);
    }
    for (i, s) in held.iter_mut().enumerate() {
        if i % 2 == 0 {
            let _ = answer(s);
        }
    }
    drop(held);
    println!("strangers done");
    std::io::stdout().flush().unwrap();
    phase("end");
}

// ---------------------------------------------------------------- the test

fn live_pair_survives_a_hostile_process() {
    let sim = SimBackend::default();
    let (ca, cb) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
    let (pa, pb) = (ca.alloc_pd().unwrap(), cb.alloc_pd().unwrap());
    let (qa_cq, qb_cq) = (
        ca.create_cq(4096, None).unwrap(),
        cb.create_cq(4096, None).unwrap(),
    );
    let cap = QpCap::new(256, 256);
    let a = pa.create_qp(&QpInitAttr::rc(&qa_cq, &qa_cq, cap)).unwrap();
    let b = pb.create_qp(&QpInitAttr::rc(&qb_cq, &qb_cq, cap)).unwrap();
    let reset = pb.create_qp(&QpInitAttr::rc(&qb_cq, &qb_cq, cap)).unwrap();
    let p = RcParams::default();
    let ea = local_endpoint(&ca, &a, &p, 1).unwrap();
    let eb = local_endpoint(&cb, &b, &p, 2).unwrap();
    modify_to_init(&b, &p).unwrap();
    let src = pa.reg_mr(MSG * 2, AccessFlags::LOCAL_WRITE).unwrap();
    let rx = pb.reg_mr(MSG * 256, AccessFlags::LOCAL_WRITE).unwrap();
    let region = pb
        .reg_mr(
            MSG * N as usize,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    for i in 0..256 {
        b.post_recv(&[RecvWr::new(i, &[rx.sge(i as usize * MSG, MSG).unwrap()])])
            .unwrap();
    }
    connect_rc(&a, &p, ea.psn, &eb).unwrap();
    connect_rc(&b, &p, eb.psn, &ea).unwrap();

    let spec = Spec {
        a: ca.listen_addr(),
        b: cb.listen_addr(),
        gid: ca.query_gid(1, 0).unwrap(),
        qpn_a: a.qp_num(),
        qpn_b: b.qp_num(),
        reset_qpn: reset.qp_num(),
        rkey: region.rkey(),
        addr: region.addr(),
    };
    let mut child = Command::new(std::env::current_exe().unwrap())
        .env("TAKEOVER_ATTACK", spec.encode())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_child = child.stdin.take().unwrap();
    let mut from_child = BufReader::new(child.stdout.take().unwrap()).lines();
    writeln!(to_child, "attack").unwrap();

    // The pair's traffic while the attack runs: SEND i carries i, WRITE i writes i at
    // slot i; receives are refilled as they complete.
    let pattern = |i: u64| -> [u8; MSG] {
        let mut m = [0u8; MSG];
        for (k, b) in m.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(31).wrapping_add(k as u8) | 1;
        }
        m
    };
    let (mut sends_done, mut recvs, mut posted) = (0u64, 0u64, 0u64);
    let mut wcs = [WorkCompletion::default(); 32];
    let t0 = Instant::now();
    while sends_done < 2 * N || recvs < N {
        assert!(
            t0.elapsed() < WAIT * 3,
            "stalled: {sends_done} sends, {recvs} receives"
        );
        if posted < N && posted < sends_done / 2 + 64 {
            let i = posted;
            let m = pattern(i);
            src.write(0, &m).unwrap();
            src.write(MSG, &m).unwrap();
            a.post_send(&[
                SendWr::send(2 * i, &[src.sge(0, MSG).unwrap()]).signaled(),
                SendWr::write(
                    2 * i + 1,
                    &[src.sge(MSG, MSG).unwrap()],
                    region.remote().at(i * MSG as u64),
                )
                .signaled(),
            ])
            .unwrap();
            posted += 1;
            // Wait for this pair of WRs, so the source buffer can be reused.
            let mut got = 0;
            while got < 2 {
                let n = qa_cq.poll(&mut wcs).unwrap();
                for wc in &wcs[..n] {
                    assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
                }
                got += n;
                assert!(t0.elapsed() < WAIT * 3, "send {i} never completed");
            }
            sends_done += 2;
            if i == N / 3 || i == 2 * N / 3 {
                // A legitimate reconnect in the middle of the attack.
                ca.faults().drop_connections(a.qp_num()).unwrap();
            }
        }
        let n = qb_cq.poll(&mut wcs).unwrap();
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            assert_eq!(wc.opcode, WcOpcode::Recv);
            assert_eq!(wc.byte_len as usize, MSG);
            let slot = wc.wr_id as usize;
            let mut got = [0u8; MSG];
            rx.read(slot * MSG, &mut got).unwrap();
            assert_eq!(got, pattern(recvs), "SEND {recvs} arrived changed");
            recvs += 1;
            b.post_recv(&[RecvWr::new(slot as u64, &[rx.sge(slot * MSG, MSG).unwrap()])])
                .unwrap();
        }
    }
    let summary = from_child.next().unwrap().unwrap();
    let n_odd: usize = summary.split(' ').nth(3).unwrap().parse().unwrap();
    let odd: Vec<String> = (0..n_odd.min(5))
        .map(|_| from_child.next().unwrap().unwrap())
        .collect();
    assert_eq!(
        n_odd, 0,
        "refusals differ or an attempt was accepted: {summary}; {odd:?}"
    );
    let attempts: usize = summary.split(' ').nth(1).unwrap().parse().unwrap();
    assert_eq!(attempts, 100 * 9);
    for i in 0..N {
        let mut got = [0u8; MSG];
        region.read(i as usize * MSG, &mut got).unwrap();
        assert_eq!(got, pattern(i), "WRITE {i} landed changed (or not at all)");
    }
    // Nothing else arrived: no extra receive completion, no error anywhere.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(qb_cq.poll(&mut wcs).unwrap(), 0, "a stranger's SEND was received");
    assert_eq!(qa_cq.poll(&mut wcs).unwrap(), 0);
    assert_eq!(a.state().unwrap(), QpState::Rts);
    assert_eq!(b.state().unwrap(), QpState::Rts);

    // What strangers cost: with the pair idle, count the bytes the process allocates
    // while they connect, claim and stay silent.
    BYTES.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    writeln!(to_child, "strangers").unwrap();
    assert_eq!(from_child.next().unwrap().unwrap(), "strangers done");
    COUNTING.store(false, Ordering::SeqCst);
    let per = BYTES.load(Ordering::SeqCst) / STRANGERS as u64;
    println!("strangers: {per} bytes allocated per connection");
    assert!(per < 8 * 1024, "{per} bytes allocated per stranger connection");
    writeln!(to_child, "end").unwrap();
    assert!(child.wait().unwrap().success(), "the attacker process failed");

    // The pair still works after all of it.
    a.post_send(&[SendWr::write(9, &[src.sge(0, 8).unwrap()], region.remote().at(0)).signaled()])
        .unwrap();
    let wc = poll_n(&qa_cq, 1, WAIT).unwrap();
    assert_eq!(wc[0].status, WcStatus::Success);
    drop(reset);
}
