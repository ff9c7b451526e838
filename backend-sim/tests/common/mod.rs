//! Helpers shared by the integration tests: READs that must come back, a connected pair
//! of QPs on two devices, and a raw peer's frames (each test file is its own crate; this
//! module is included with `mod common;`).

// Each test crate uses a part of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use backend_sim::SimContext;
use backend_sim_proto::wire::{Frame, MAX_HDR_LEN};
use verbs_api::*;

/// How long one READ may take before the test calls it lost.
pub const WAIT: Duration = Duration::from_secs(5);

/// A 4 KiB region on each side of a READ: `local` (LOCAL_WRITE, where data lands) and
/// `remote` (LOCAL_WRITE | REMOTE_READ, what is read).
pub fn read_mrs<P: ProtectionDomain>(local: &P, remote: &P) -> (MrOf<P::Backend>, MrOf<P::Backend>) {
    let l = local.reg_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let r = remote
        .reg_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ)
        .unwrap();
    (l, r)
}

/// Writes `v` at `off` of `mrb`, READs it over `qp` into the same offset of `mra` and
/// checks it arrived (each wait bounded).
pub fn read_back<Q: QueuePair, C: CompletionQueue, M: MemoryRegion>(
    qp: &Q,
    cq: &C,
    mra: &M,
    mrb: &M,
    off: usize,
    v: u64,
    what: &str,
) {
    mrb.write_u64(off, v).unwrap();
    qp.post_send(&[SendWr::read(v, &[mra.sge(off, 8).unwrap()], mrb.remote().at(off as u64)).signaled()])
        .unwrap();
    let w = poll_n(cq, 1, WAIT).unwrap_or_else(|e| panic!("{what}: lost: {e}"));
    assert!(w[0].is_ok(), "{what}: {w:?}");
    assert_eq!(mra.read_u64(off).unwrap(), v, "{what}");
}

/// Two devices of one sim with one connected RC QP each (`a` on sim0, `b` on sim1).
pub struct Pair {
    _sim: backend_sim::SimBackend,
    pub c0: backend_sim::SimContext,
    pub c1: backend_sim::SimContext,
    pub pd0: backend_sim::SimPd,
    pub pd1: backend_sim::SimPd,
    pub cq0: backend_sim::SimCq,
    pub cq1: backend_sim::SimCq,
    pub a: backend_sim::SimQp,
    pub b: backend_sim::SimQp,
    /// The endpoints A and B were connected with.
    pub ea: Endpoint,
    pub eb: Endpoint,
}

/// One device of a test: its context, a PD and a CQ.
pub struct Device {
    pub ctx: SimContext,
    pub pd: backend_sim::SimPd,
    pub cq: backend_sim::SimCq,
}

impl Device {
    /// A PD and a CQ of `cq_len` entries on `ctx`.
    pub fn new(ctx: SimContext, cq_len: u32) -> Device {
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(cq_len, None).unwrap();
        Device { ctx, pd, cq }
    }
}

/// The two devices of one sim under `profile` (sim0 and sim1), each with a PD and a CQ of
/// `cq_len` entries.
pub fn two_devices(profile: backend_sim::Profile, cq_len: u32) -> (Device, Device) {
    let sim = backend_sim::SimBackend::new(backend_sim::SimConfig {
        profile,
        devices: 2,
        ..backend_sim::SimConfig::default()
    });
    (
        Device::new(sim.open("sim0").unwrap(), cq_len),
        Device::new(sim.open("sim1").unwrap(), cq_len),
    )
}

/// What [`Pair::build`] makes: the devices' profile, each side's connection parameters,
/// the QPs' capacities, the CQs' size and the PSNs each side starts with.
pub struct PairSpec {
    pub profile: backend_sim::Profile,
    /// A's connection parameters (as a requester: its timeout and retry counts).
    pub a: RcParams,
    /// B's.
    pub b: RcParams,
    pub cap: QpCap,
    /// Entries of each side's CQ.
    pub cq_len: u32,
    /// The PSNs A and B start sending with.
    pub psns: (u32, u32),
}

impl PairSpec {
    /// Both sides with `p` and `cap`, CQs of 64 entries, PSNs 1 and 2, on the default
    /// profile.
    pub fn new(p: &RcParams, cap: QpCap) -> PairSpec {
        PairSpec {
            profile: backend_sim::Profile::default(),
            a: *p,
            b: *p,
            cap,
            cq_len: 64,
            psns: (1, 2),
        }
    }
}

impl Pair {
    /// Both QPs with `cap`, connected with `p` (CQs of 64 entries).
    pub fn new(p: &RcParams, cap: QpCap) -> Pair {
        Self::on(backend_sim::Profile::default(), p, cap)
    }

    /// [`Pair::new`] on devices that play `profile`.
    pub fn on(profile: backend_sim::Profile, p: &RcParams, cap: QpCap) -> Pair {
        Self::with(profile, p, cap, |_, _| {})
    }

    /// [`Pair::on`], `open` called with the two devices before anything is made on
    /// them (to capture their traffic).
    pub fn with(
        profile: backend_sim::Profile,
        p: &RcParams,
        cap: QpCap,
        open: impl FnOnce(&SimContext, &SimContext),
    ) -> Pair {
        Self::build(
            PairSpec {
                profile,
                ..PairSpec::new(p, cap)
            },
            open,
        )
    }

    /// The pair `spec` describes, `open` called with the two devices before anything is
    /// made on them.
    pub fn build(spec: PairSpec, open: impl FnOnce(&SimContext, &SimContext)) -> Pair {
        let sim = backend_sim::SimBackend::new(backend_sim::SimConfig {
            profile: spec.profile,
            ..Default::default()
        });
        let (c0, c1) = (sim.open("sim0").unwrap(), sim.open("sim1").unwrap());
        open(&c0, &c1);
        let (pd0, pd1) = (c0.alloc_pd().unwrap(), c1.alloc_pd().unwrap());
        let (cq0, cq1) = (
            c0.create_cq(spec.cq_len, None).unwrap(),
            c1.create_cq(spec.cq_len, None).unwrap(),
        );
        let a = pd0.create_qp(&QpInitAttr::rc(&cq0, &cq0, spec.cap)).unwrap();
        let b = pd1.create_qp(&QpInitAttr::rc(&cq1, &cq1, spec.cap)).unwrap();
        let (pa, pb) = (&spec.a, &spec.b);
        let ea = local_endpoint(&c0, &a, pa, spec.psns.0).unwrap();
        let eb = local_endpoint(&c1, &b, pb, spec.psns.1).unwrap();
        connect_rc(&a, pa, ea.psn, &eb).unwrap();
        connect_rc(&b, pb, eb.psn, &ea).unwrap();
        Pair {
            _sim: sim,
            c0,
            c1,
            pd0,
            pd1,
            cq0,
            cq1,
            a,
            b,
            ea,
            eb,
        }
    }
}

/// Gives connected RC QP `qp` (in RTS, nothing outstanding) a new requester budget: its
/// local ACK `timeout`, `retry_cnt` and `rnr_retry`, through SQD (the only state in which
/// `ibv_modify_qp` changes them) and back to RTS. A test that wants a short budget warms
/// its connection up with a long one first: on a machine loaded to several threads per
/// CPU, a connection's setup alone can outlast a budget of milliseconds, and what the test
/// injects is not the setup.
pub fn set_budget<Q: QueuePair>(qp: &Q, timeout: u8, retry_cnt: u8, rnr_retry: u8) {
    let to = |qp_state| QpAttr {
        qp_state,
        ..Default::default()
    };
    qp.modify(&to(QpState::Sqd), QpAttrMask::STATE).unwrap();
    let budget = QpAttr {
        timeout,
        retry_cnt,
        rnr_retry,
        ..to(QpState::Sqd)
    };
    let mask = QpAttrMask::STATE | QpAttrMask::TIMEOUT | QpAttrMask::RETRY_CNT | QpAttrMask::RNR_RETRY;
    qp.modify(&budget, mask).unwrap();
    qp.modify(&to(QpState::Rts), QpAttrMask::STATE).unwrap();
}

// ---------------------------------------------------------------- captures

/// A RoCE packet of a capture: parsed, its bytes as kept from the IP header on, its
/// length on the wire and its comment.
pub type Roce = (
    backend_sim_proto::capture::parse::Parsed,
    Vec<u8>,
    usize,
    Option<String>,
);

/// The RoCE packets of the capture `file`, in order (the verbs context's events left out).
pub fn roce(file: &[u8]) -> Vec<Roce> {
    backend_sim_proto::capture::read::packets(file)
        .unwrap()
        .into_iter()
        .filter_map(|c| {
            let ip = c.ip?;
            let p = backend_sim_proto::capture::parse::parse(c.data, ip, c.orig_len).unwrap();
            Some((p, c.data[ip..].to_vec(), c.orig_len, c.comment))
        })
        .collect()
}

/// The name of a parsed packet's opcode (`SEND_FIRST`, ...).
pub fn name(p: &backend_sim_proto::capture::parse::Parsed) -> &'static str {
    backend_sim_proto::capture::opcode::name(p.headers.bth.opcode).unwrap()
}

/// The comments of the capture `file`: the verbs context, and packets' marks.
pub fn comments(file: &[u8]) -> Vec<String> {
    backend_sim_proto::capture::read::packets(file)
        .unwrap()
        .into_iter()
        .filter_map(|c| c.comment)
        .collect()
}

// ---------------------------------------------------------------- a raw peer's frames

/// `f` encoded, as a raw peer writes it.
pub fn frame(f: Frame) -> Vec<u8> {
    let mut b = [0u8; MAX_HDR_LEN];
    let n = f.encode(&mut b);
    b[..n].to_vec()
}

/// A hello from QP `src_qpn` at `ctx`'s own address, for the QP `dst_qpn`, with a token
/// nobody issued: a stranger's claim.
pub fn hello(ctx: &SimContext, src_qpn: u32, dst_qpn: u32) -> Vec<u8> {
    let gid = ctx.query_gid(1, 0).unwrap();
    frame(Frame::Hello {
        src_gid: gid.0,
        src_lid: ctx.query_port(1).unwrap().lid,
        qp_type: QpType::Rc,
        src_qpn,
        dst_qpn,
        token: [0x5a; backend_sim_proto::wire::TOKEN_LEN],
    })
}

/// QPN of the raw peer [`impersonate`] plays.
pub const RAW_QPN: u32 = 2;

/// Where the raw peer of [`impersonate`] listens: another loopback address, whose GID is
/// greater than 127.0.0.1's, so the sim QP is the active side and connects to it.
pub const RAW_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 0, 2);

/// Connects `qp` (on `ctx`) to a raw peer (QPN [`RAW_QPN`], PSN 0) that listens on
/// [`RAW_IP`], plays that peer on a raw socket, and returns the socket once `qp`'s device
/// connected to it and the raw peer accepted its hello. This is a legitimate peer: the
/// QP's address vector names it.
pub fn impersonate<Q: QueuePair>(ctx: &SimContext, qp: &Q, p: &RcParams) -> TcpStream {
    let listener = std::net::TcpListener::bind((RAW_IP, 0)).unwrap();
    let fake = Endpoint {
        gid: Gid::from(RAW_IP),
        lid: listener.local_addr().unwrap().port(),
        qpn: RAW_QPN,
        psn: 0,
    };
    connect_rc(qp, p, 0, &fake).unwrap();
    listener.set_nonblocking(false).unwrap();
    let (mut s, _) = listener.accept().unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut h = [0u8; MAX_HDR_LEN];
    s.read_exact(&mut h).unwrap();
    match Frame::decode(&h).unwrap() {
        Some((Frame::Hello { src_qpn, dst_qpn, .. }, _)) => {
            assert_eq!((src_qpn, dst_qpn), (qp.qp_num(), RAW_QPN));
        }
        other => panic!("expected a hello, got {other:?}"),
    }
    s.write_all(&frame(Frame::HelloAck)).unwrap();
    s.set_read_timeout(None).unwrap();
    let _ = ctx;
    s
}

/// The first frame on `s` (waiting up to 5 s), or `None` if it closes first.
pub fn read_answer(s: &mut TcpStream) -> Option<Frame> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; MAX_HDR_LEN];
    let mut got = 0;
    loop {
        if let Ok(Some((f, _))) = Frame::decode(&buf[..got]) {
            return Some(f);
        }
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => return None,
            Ok(n) => got += n,
        }
    }
}

/// Reads exactly one frame header (a setup frame) from `s` (a raw device's side of a link).
pub fn read_setup(s: &mut TcpStream) -> Frame {
    let mut base = [0u8; backend_sim_proto::wire::BASE_LEN];
    s.read_exact(&mut base).unwrap();
    let n = backend_sim_proto::wire::setup_header_len(&base).unwrap();
    let mut h = vec![0u8; n];
    h[..base.len()].copy_from_slice(&base);
    s.read_exact(&mut h[base.len()..]).unwrap();
    Frame::decode(&h).unwrap().unwrap().0
}

/// A UD QP on `cq` (64 sends and receives) in RTS with Q_Key `qkey`.
pub fn ud_qp(pd: &backend_sim::SimPd, cq: &backend_sim::SimCq, qkey: u32) -> backend_sim::SimQp {
    ud_qp_on(pd, cq, cq, qkey)
}

/// A UD QP whose sends complete on `scq` and receives on `rcq` (64 of each), in RTS with
/// Q_Key `qkey`.
pub fn ud_qp_on(
    pd: &backend_sim::SimPd,
    scq: &backend_sim::SimCq,
    rcq: &backend_sim::SimCq,
    qkey: u32,
) -> backend_sim::SimQp {
    let qp = pd
        .create_qp(&QpInitAttr::ud(scq, rcq, QpCap::new(64, 64)))
        .unwrap();
    let m = QpAttrMask::STATE;
    qp.modify(
        &QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qkey,
            ..Default::default()
        },
        m | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    )
    .unwrap();
    qp.modify(
        &QpAttr {
            qp_state: QpState::Rtr,
            ..Default::default()
        },
        m,
    )
    .unwrap();
    qp.modify(
        &QpAttr {
            qp_state: QpState::Rts,
            ..Default::default()
        },
        m | QpAttrMask::SQ_PSN,
    )
    .unwrap();
    qp
}

// ---------------------------------------------------------------- the process's descriptors

/// Sets this process's soft open-file limit to `soft` (the hard limit if `soft` is above
/// it).
pub fn set_nofile(soft: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one rlimit struct on this stack frame.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        r.rlim_cur = soft.min(r.rlim_max);
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
    }
}

/// How many descriptors this process has open.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// RESET → INIT → RTR → RTS with UC's attributes only (`man ibv_modify_qp`, UC).
pub fn connect_uc(qp: &backend_sim::SimQp, p: &RcParams, psn: u32, remote: &Endpoint) -> Result<()> {
    modify_to_init(qp, p)?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: p.path_mtu,
        dest_qp_num: remote.qpn,
        rq_psn: remote.psn,
        ah_attr: ah_attr_for(remote, p),
        ..Default::default()
    };
    qp.modify(
        &rtr,
        QpAttrMask::STATE | QpAttrMask::AV | QpAttrMask::PATH_MTU | QpAttrMask::DEST_QPN | QpAttrMask::RQ_PSN,
    )?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: psn,
        ..Default::default()
    };
    qp.modify(&rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
}

/// Bytes as hex, for handing an endpoint to a peer process over a pipe.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes of [`hex`]'s text.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}
