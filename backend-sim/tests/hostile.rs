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
use common::{frame, hello, impersonate, read_answer, RAW_QPN};
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
        psn: 0,
        len: 64,
        addr: base + 4095,
        rkey,
    }));
    attack.extend(frame(Frame::FetchAdd {
        psn: 0,
        addr: base + 4,
        rkey,
        add: 1,
    }));
    attack.extend(frame(Frame::CmpSwap {
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
