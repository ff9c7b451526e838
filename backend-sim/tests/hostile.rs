//! A hostile peer on a raw TCP socket: garbage, unknown QPs, and crafted frames from a
//! peer that knows (or spoofs) a QP's expected endpoint. Memory outside the registered
//! region stays untouched, only the attacked QP goes to ERR, and the device keeps
//! serving other QPs.
mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use backend_sim::SimBackend;
use backend_sim_proto::wire::Frame;
use common::{frame, hello, impersonate, read_answer, read_setup, ud_qp, RAW_QPN};
use verbs_api::*;

#[test]
fn strangers_are_turned_away() {
    let ctx = SimBackend::default().open("sim0").unwrap();
    let addr = ctx.listen_addr();
    // Garbage instead of a hello: the connection is closed.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&[0xff; 64]).unwrap();
    assert!(read_answer(&mut s).is_none());
    // A hello for a QP that does not exist.
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&hello(&ctx, 5, 0x7777)).unwrap();
    assert!(matches!(read_answer(&mut s), Some(Frame::HelloNak { .. })));
    // A hello of another protocol version (the version sits in bytes 2-3 of the header):
    // refused as such, so that the other build can say why.
    let mut old = hello(&ctx, 5, 0x7777);
    old[2..4].copy_from_slice(&(backend_sim_proto::wire::VERSION - 1).to_le_bytes());
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&old).unwrap();
    assert_eq!(
        read_answer(&mut s),
        Some(Frame::HelloNak {
            reason: backend_sim_proto::wire::HelloReject::Version
        })
    );
    // A hello for a QP in RESET.
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    let cap = QpCap::new(1, 1);
    let qp = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&hello(&ctx, 5, qp.qp_num())).unwrap();
    assert!(matches!(read_answer(&mut s), Some(Frame::HelloNak { .. })));
}

#[test]
fn crafted_frames_never_touch_memory_outside_the_region() {
    let ctx = SimBackend::default().open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None).unwrap();
    let cap = QpCap::new(8, 8);
    // The victim QP, connected to an endpoint the attacker then impersonates. Its region
    // sits in the middle of a larger buffer whose guard zones must stay untouched.
    let victim = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let mut backing = vec![0xeeu8; 3 * 4096];
    // SAFETY: `backing` outlives `mr` (dropped below) and is only read after that.
    let mr = unsafe {
        pd.reg_mr_raw(backing.as_mut_ptr().add(4096), 4096, AccessFlags::ALL)
            .unwrap()
    };
    mr.fill(0);
    let mut s = impersonate(&ctx, &victim, &RcParams::default());
    victim
        .post_recv(&[RecvWr::new(1, &[mr.sge(0, 64).unwrap()])])
        .unwrap();
    let (rkey, base) = (mr.rkey(), mr.addr());
    let mut attack = Vec::new();
    let w = |psn, addr: u64, rkey, len: u32| Frame::Write {
        psn,
        len,
        addr,
        rkey,
        imm: None,
        solicited: false,
        ack_req: false,
    };
    // In order: writes just before and across both ends, a guessed rkey, a READ past the
    // end, misaligned and out-of-range atomics, a huge length, a SEND larger than the receive.
    attack.extend(frame(w(0, base - 8, rkey, 16)));
    attack.extend([0xaa; 16]);
    attack.extend(frame(w(0, base + 4090, rkey, 16)));
    attack.extend([0xaa; 16]);
    attack.extend(frame(w(0, base, rkey ^ 1, 16)));
    attack.extend([0xaa; 16]);
    attack.extend(frame(Frame::Read {
        inflight: 1,
        psn: 0,
        len: 64,
        addr: base + 4095,
        rkey,
    }));
    attack.extend(frame(Frame::FetchAdd {
        inflight: 1,
        psn: 0,
        addr: base + 4,
        rkey,
        add: 1,
    }));
    attack.extend(frame(Frame::CmpSwap {
        inflight: 1,
        psn: 0,
        addr: base + 4096,
        rkey,
        compare: 0,
        swap: 1,
    }));
    attack.extend(frame(w(0, base, rkey, 1 << 30)));
    attack.extend(vec![0xaa; 1 << 16]); // then hang up, long before the claimed 1 GiB
    let _ = s.write_all(&attack);
    drop(s);
    // A truncated frame and an unknown opcode on a second connection.
    let mut s = TcpStream::connect(ctx.listen_addr()).unwrap();
    s.write_all(&hello(&ctx, RAW_QPN, victim.qp_num())).unwrap();
    let _ = read_answer(&mut s);
    let _ = s.write_all(&[0x11, 0, 0, 0, 0, 0]);
    let _ = s.write_all(&[0x99; 32]);
    drop(s);
    std::thread::sleep(Duration::from_millis(200));
    // The victim went to ERR on the first violation and flushed its receive.
    assert_eq!(victim.state().unwrap(), QpState::Err);
    let wc = poll_n(&cq, 1, Duration::from_secs(5)).unwrap();
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::WrFlushErr));
    drop(mr);
    assert!(
        backing[..4096].iter().all(|&b| b == 0xee),
        "bytes before the region changed"
    );
    assert!(
        backing[8192..].iter().all(|&b| b == 0xee),
        "bytes after the region changed"
    );
    assert!(
        backing[4096..8192].iter().all(|&b| b == 0),
        "a refused WRITE changed the region"
    );

    // The device still serves good QPs.
    let a = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let b = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let p = RcParams::default();
    let ea = local_endpoint(&ctx, &a, &p, 1).unwrap();
    let eb = local_endpoint(&ctx, &b, &p, 2).unwrap();
    connect_rc(&a, &p, 1, &eb).unwrap();
    connect_rc(&b, &p, 2, &ea).unwrap();
    let good = pd.reg_mr(64, AccessFlags::ALL).unwrap();
    a.post_send(&[SendWr::write(7, &[good.sge(0, 8).unwrap()], good.remote().at(8)).signaled()])
        .unwrap();
    let wc = poll_n(&cq, 1, Duration::from_secs(5)).unwrap();
    assert_eq!((wc[0].wr_id, wc[0].status), (7, WcStatus::Success));
}

/// A peer's notices of READs and atomics it claims to have executed itself (the
/// same-host fast path's) check no key and move no memory, even naming bytes outside the
/// region or a word inside it: they are acknowledged, take their PSNs, and the WRITE
/// after them lands.
#[test]
fn notices_of_placed_reads_and_atomics_move_nothing() {
    let ctx = SimBackend::default().open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    let victim = pd.create_qp(&QpInitAttr::rc(&cq, &cq, QpCap::new(4, 1))).unwrap();
    let mut backing = vec![0xeeu8; 3 * 4096];
    // SAFETY: `backing` outlives `mr` (dropped below) and is only read after that.
    let mr = unsafe {
        pd.reg_mr_raw(backing.as_mut_ptr().add(4096), 4096, AccessFlags::ALL)
            .unwrap()
    };
    mr.fill(0);
    let mut s = impersonate(&ctx, &victim, &RcParams::default());
    let (rkey, base) = (mr.rkey(), mr.addr());
    let mut attack = Vec::new();
    attack.extend(frame(Frame::ReadPlaced {
        psn: 0,
        len: 2048,
        addr: base - 8,
        rkey: rkey ^ 1,
        ack_req: false,
    }));
    attack.extend(frame(Frame::AtomicPlaced {
        psn: 2,
        addr: base,
        rkey,
        compare: None,
        swap_add: 5,
        ack_req: false,
    }));
    attack.extend(frame(Frame::AtomicPlaced {
        psn: 3,
        addr: base + 4096,
        rkey,
        compare: Some(0),
        swap_add: 1,
        ack_req: false,
    }));
    attack.extend(frame(Frame::Write {
        psn: 4,
        len: 8,
        addr: base + 64,
        rkey,
        imm: None,
        solicited: false,
        ack_req: true,
    }));
    attack.extend([0x55; 8]);
    s.write_all(&attack).unwrap();
    let mut last = None;
    while last != Some(4) {
        match read_answer(&mut s) {
            Some(Frame::Ack { psn }) => last = Some(psn),
            other => panic!("expected ACKs up to PSN 4, got {other:?} after {last:?}"),
        }
    }
    assert_eq!(victim.state().unwrap(), QpState::Rts);
    drop(s);
    drop(mr);
    let mut want = vec![0xeeu8; 3 * 4096];
    want[4096..8192].fill(0);
    want[4096 + 64..4096 + 72].fill(0x55);
    assert!(backing == want, "a notice moved memory");
}

#[test]
fn a_peer_that_floods_without_reading_is_bounded() {
    // 2 KiB READ requests (whose responses are copied into the reply queue), never
    // reading the responses: the responder stops reading once its replies back up, the
    // kernel buffers fill, and the flooder is pushed back. Without that, 512 Ki requests
    // would queue 1 GiB of replies.
    let ctx = SimBackend::default().open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    let cap = QpCap::new(1, 1);
    let victim = pd.create_qp(&QpInitAttr::rc(&cq, &cq, cap)).unwrap();
    let mr = pd.reg_mr(1 << 20, AccessFlags::ALL).unwrap();
    let mut s = impersonate(&ctx, &victim, &RcParams::default());
    s.set_write_timeout(Some(Duration::from_millis(300))).unwrap();
    let rss_before = rss_kib();
    let total = 512 * 1024u32;
    let mut sent = 0u32;
    'flood: while sent < total {
        let mut batch = Vec::with_capacity(1024 * 44);
        for k in 0..1024 {
            batch.extend(frame(Frame::Read {
                inflight: 1,
                psn: (sent + k) & 0xff_ffff,
                len: 2048,
                addr: mr.addr(),
                rkey: mr.rkey(),
            }));
        }
        if s.write_all(&batch).is_err() {
            break 'flood; // pushed back: the responder stopped reading
        }
        sent += 1024;
    }
    std::thread::sleep(Duration::from_millis(200));
    let grew = rss_kib().saturating_sub(rss_before);
    eprintln!("flood: {sent} READ requests taken before back-pressure, RSS grew {grew} KiB");
    assert!(
        sent < total,
        "all {total} requests were taken without back-pressure"
    );
    assert!(
        grew < 64 * 1024,
        "RSS grew by {grew} KiB after {sent} READ requests"
    );
    drop(s);
    drop(victim);
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// QPNs give a stranger nothing to count from: drawn over the whole 24 bits, never from
/// one base upwards.
#[test]
fn qp_numbers_are_spread_over_24_bits() {
    let ctx = SimBackend::default().open("sim0").unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(8, None).unwrap();
    let qps: Vec<_> = (0..64)
        .map(|_| pd.create_qp(&QpInitAttr::rc(&cq, &cq, QpCap::new(1, 1))).unwrap())
        .collect();
    let n: Vec<u32> = qps.iter().map(|q| q.qp_num()).collect();
    assert!(n.iter().all(|&q| q > 1 && q < 0xff_ffff), "{n:x?}");
    let adjacent = n.windows(2).filter(|w| w[1].abs_diff(w[0]) < 256).count();
    assert!(adjacent < 4, "QPNs close to their predecessor: {n:x?}");
    // Each of the top bits is set in some QPNs and clear in others.
    for bit in [0x80_0000, 0x40_0000, 0x20_0000] {
        let set = n.iter().filter(|&&q| q & bit != 0).count();
        assert!(set > 4 && set < 60, "bit {bit:#x} set in {set} of 64: {n:x?}");
    }
}

// ---------------------------------------------------------------- UD links

/// Whether `s` is closed by the other end within 5 s (after what it sent, if anything).
fn closed(s: &mut TcpStream) -> bool {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}

/// A datagram frame for QP `dst_qpn` that claims to come from QP `src_qpn`, and its
/// payload.
fn datagram(dst_qpn: u32, src_qpn: u32, qkey: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = frame(Frame::Datagram {
        psn: 0,
        len: payload.len() as u32,
        dst_qpn,
        src_qpn,
        qkey,
        imm: None,
        solicited: false,
        grh: Some(backend_sim_proto::wire::Grh::default()),
    });
    v.extend_from_slice(payload);
    v
}

/// A UD datagram's source (the sending device's LID and GID) is the device its link
/// proved, never what a frame or a stranger claims. Device X's QP `xq` and device R's QP
/// `rq` exchange datagrams; a stranger who knows their GIDs, LIDs, QPNs and the Q_Key
/// - claims to be X on R's listener (a link hello with X's GID and LID and a token of
///   its own) and sends datagrams from `xq` after it: refused, the connection closed,
///   nothing delivered; also while X's real link to R is up;
/// - sends datagrams with no hello at all: closed;
/// - gets X to open a link to it, and passes X's hello (X's real token) on to R as its
///   own: R's check with X names the address the hello reached (R's, not the
///   stranger's), so X denies it;
/// - opens an honest link of its own (it answers R's check for its own token at its own
///   address, 127.0.0.2): its datagrams that claim `xq` are delivered, named as from its
///   device (its LID, its GID), never X's;
/// - floods R on that link (no receive for them: dropped and counted, memory bounded),
///   never reads what R sends it (R's send queue waits for the wire, nothing lost, memory
///   bounded), and sends garbage (the link closes; R's waiting WRs complete, their
///   datagrams lost with the stranger's device).
///
/// Throughout, X's datagrams reach `rq` named as X's, and nothing else reaches it.
#[test]
fn ud_datagrams_cannot_be_forged_from_another_device() {
    use std::io::Read;
    use std::net::TcpListener;
    const QKEY: u32 = 0x1111_1111;
    let sim = SimBackend::default();
    let (cx, cr) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
    let (pdx, pdr) = (cx.alloc_pd().unwrap(), cr.alloc_pd().unwrap());
    let (cqx, cqr) = (
        cx.create_cq(256, None).unwrap(),
        cr.create_cq(4096, None).unwrap(),
    );
    let (xq, rq) = (ud_qp(&pdx, &cqx, QKEY), ud_qp(&pdr, &cqr, QKEY));
    let mrx = pdx.reg_mr(1 << 16, AccessFlags::LOCAL_WRITE).unwrap();
    let mrr = pdr.reg_mr(1 << 16, AccessFlags::LOCAL_WRITE).unwrap();
    for i in 0..32u64 {
        rq.post_recv(&[RecvWr::new(i, &[mrr.sge(1024 * i as usize, 1024).unwrap()])])
            .unwrap();
    }
    let p = RcParams::default();
    // A link names its device by the GID of its IP (GID 1).
    let (gx, lx) = (cx.query_gid(1, 1).unwrap(), cx.query_port(1).unwrap().lid);
    let r_addr = cr.listen_addr();
    let x_to_r = pdx
        .create_ah(&ah_attr_for(&local_endpoint(&cr, &rq, &p, 0).unwrap(), &p))
        .unwrap();
    let x_send = |wr_id: u64| {
        mrx.write(0, b"from X").unwrap();
        xq.post_send(&[SendWr::send(wr_id, &[mrx.sge(0, 6).unwrap()]).signaled().ud(
            &x_to_r,
            rq.qp_num(),
            QKEY,
        )])
        .unwrap();
        assert!(poll_n(&cqx, 1, Duration::from_secs(5)).unwrap()[0].is_ok());
    };
    let claim_x = |token| {
        frame(Frame::LinkHello {
            src_gid: gx.0,
            src_lid: lx,
            token,
        })
    };
    let forged = datagram(rq.qp_num(), xq.qp_num(), QKEY, b"forged");
    let mut delivered = Vec::new();
    let mut take = |n: usize| {
        let wc = poll_n(&cqr, n, Duration::from_secs(5)).unwrap();
        delivered.extend(wc.iter().map(|w| (w.src_qp, w.slid)));
        wc
    };

    // A stranger claims X's identity, twice: before X's link exists and while it is up.
    for round in 0..2 {
        if round == 1 {
            x_send(1);
            assert_eq!(take(1)[0].slid, lx);
        }
        let mut s = TcpStream::connect(r_addr).unwrap();
        let mut attack = claim_x([0x5a; 16]);
        for _ in 0..3 {
            attack.extend(&forged);
        }
        s.write_all(&attack).unwrap();
        assert!(matches!(read_answer(&mut s), Some(Frame::HelloNak { .. })));
        assert!(closed(&mut s));
        // Datagrams with no hello.
        let mut s = TcpStream::connect(r_addr).unwrap();
        let _ = s.write_all(&forged);
        assert!(closed(&mut s));
    }

    // The relay: X opens a link to the stranger's listener, which passes X's hello on.
    let relay = TcpListener::bind((common::RAW_IP, 0)).unwrap();
    let x_to_relay = pdx
        .create_ah(&AhAttr {
            grh: GlobalRoute {
                dgid: Gid::from(common::RAW_IP),
                ..Default::default()
            },
            dlid: relay.local_addr().unwrap().port(),
            is_global: true,
            port_num: 1,
            ..Default::default()
        })
        .unwrap();
    xq.post_send(&[SendWr::send(2, &[mrx.sge(0, 6).unwrap()])
        .signaled()
        .ud(&x_to_relay, 0x42, QKEY)])
        .unwrap();
    let (mut from_x, _) = relay.accept().unwrap();
    let Frame::LinkHello {
        src_gid,
        src_lid,
        token,
    } = read_setup(&mut from_x)
    else {
        panic!("X did not say a link hello");
    };
    assert_eq!((src_gid, src_lid), (gx.0, lx));
    let mut s = TcpStream::connect(r_addr).unwrap();
    s.write_all(&claim_x(token)).unwrap();
    s.write_all(&forged).unwrap();
    assert!(matches!(read_answer(&mut s), Some(Frame::HelloNak { .. })));
    assert!(closed(&mut s));
    drop(from_x);
    // X's WR completes all the same: its datagram is lost with the link that failed.
    assert!(poll_n(&cqx, 1, Duration::from_secs(10)).unwrap()[0].is_ok());

    // The stranger's honest link: its own listener answers R's check.
    let own = TcpListener::bind((common::RAW_IP, 0)).unwrap();
    let own_lid = own.local_addr().unwrap().port();
    let token = [0x77; 16];
    let checker = std::thread::spawn(move || {
        let (mut c, _) = own.accept().unwrap();
        let f = read_setup(&mut c);
        let Frame::LinkVerify {
            token: t, at_port, ..
        } = f
        else {
            panic!("expected a link check, got {f}");
        };
        assert_eq!((t, at_port), (token, r_addr.port()));
        c.write_all(&frame(Frame::HelloAck)).unwrap();
        own
    });
    let mut link = TcpStream::connect(r_addr).unwrap();
    link.write_all(&frame(Frame::LinkHello {
        src_gid: Gid::from(common::RAW_IP).0,
        src_lid: own_lid,
        token,
    }))
    .unwrap();
    assert_eq!(read_answer(&mut link), Some(Frame::HelloAck));
    let own = checker.join().unwrap();
    link.write_all(&forged).unwrap();
    let wc = take(1);
    assert_eq!(
        (wc[0].src_qp, wc[0].slid),
        (xq.qp_num(), own_lid),
        "named as from the stranger's device"
    );
    let mut h = [0u8; 40];
    mrr.read(1024 * wc[0].wr_id as usize, &mut h).unwrap();
    assert_eq!(
        &h[8..24],
        &Gid::from(common::RAW_IP).0,
        "the GRH's source GID is the stranger's"
    );
    assert_ne!(own_lid, lx);

    // A flood on it: for a QPN with no receive, then never reading R's datagrams.
    let dropped = cr.counters().ud_dropped;
    let rss_before = rss_kib();
    let junk = datagram(rq.qp_num() ^ 1, xq.qp_num(), QKEY, &[0xaa; 4096]);
    let mut batch = Vec::new();
    for _ in 0..64 {
        batch.extend(&junk);
    }
    for _ in 0..100 {
        link.write_all(&batch).unwrap();
    }
    let r_to_own = pdr
        .create_ah(&AhAttr {
            grh: GlobalRoute {
                dgid: Gid::from(common::RAW_IP),
                ..Default::default()
            },
            dlid: own_lid,
            is_global: true,
            port_num: 1,
            ..Default::default()
        })
        .unwrap();
    // R sends into the link, which the stranger never reads: more than the kernel's
    // socket buffers and the link's queue hold together. R's send queue waits for the
    // wire as an HCA's does: WRs stay outstanding, none is lost, memory does not grow.
    let unsent = cr.counters().ud_unsent;
    // Datagrams of the port's MTU (the profile's active MTU).
    let mtu = cr.query_port(1).unwrap().active_mtu.bytes() as usize;
    let big = [mrr.sge(32768, mtu).unwrap()];
    let (mut posted, mut done) = (0u64, 0u64);
    let mut wc = [WorkCompletion::default(); 64];
    let mut reap = |done: &mut u64| {
        let n = cqr.poll(&mut wc).unwrap();
        for w in &wc[..n] {
            assert_eq!((w.wr_id, w.status), (1000 + *done, WcStatus::Success), "{w:?}");
            *done += 1;
        }
    };
    // Well within the link's stall limit (5 s).
    let until = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < until {
        while posted - done < 64 {
            match rq.post_send(&[SendWr::send(1000 + posted, &big)
                .signaled()
                .ud(&r_to_own, 0x42, QKEY)])
            {
                Ok(()) => posted += 1,
                Err(e) if e.errno() == libc::ENOMEM => break,
                Err(e) => panic!("post_send: {e}"),
            }
        }
        reap(&mut done);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        done < posted && posted > 1000,
        "R's send queue waits for a link nobody reads ({done} of {posted} completed)"
    );
    assert_eq!(cr.counters().ud_unsent, unsent, "nothing is lost at R");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while cr.counters().ud_dropped < dropped + 6400 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(cr.counters().ud_dropped, dropped + 6400);
    let grew = rss_kib().saturating_sub(rss_before);
    assert!(grew < 16 * 1024, "RSS grew by {grew} KiB");
    // Garbage on the link ends it. The stranger's device now hangs up on every new
    // link, so what R's send queue held is lost on the way, and completes.
    own.set_nonblocking(true).unwrap();
    let hang_up = std::thread::spawn(move || {
        let end = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < end {
            match own.accept() {
                Ok((c, _)) => drop(c),
                Err(_) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    });
    link.write_all(&[0xff; 64]).unwrap();
    let mut rest = Vec::new();
    link.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = link.read_to_end(&mut rest);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while done < posted && std::time::Instant::now() < deadline {
        reap(&mut done);
        std::thread::sleep(Duration::from_millis(1));
    }
    // (Each either went out as the stranger read the link to its end, or was lost with
    // the link: which, depends on when R read the garbage.)
    assert_eq!(done, posted, "R's waiting WRs complete once the link is gone");
    drop(hang_up);

    // X's datagrams still reach rq as X's, and nothing else reached it.
    x_send(3);
    assert_eq!(take(1)[0].slid, lx);
    std::thread::sleep(Duration::from_millis(100));
    let mut wc = [WorkCompletion::default(); 8];
    assert_eq!(cqr.poll(&mut wc).unwrap(), 0);
    assert_eq!(
        delivered,
        [(xq.qp_num(), lx), (xq.qp_num(), own_lid), (xq.qp_num(), lx)],
        "(src_qp, slid) of everything rq received"
    );
    assert_eq!(rq.state().unwrap(), QpState::Rts);
}
