//! What a case runs in: a fresh device context, the run's configuration, helpers that
//! build connected RC or UC pairs, bring UD QPs up and wait for completions with a bound,
//! and the record of the documented deviations a case accepted.

use std::cell::RefCell;
use std::time::Duration;

use verbs_api::{
    ah_attr_for, connect_rc, local_endpoint, modify_to_init, poll_n, poll_quiet, AccessFlags, AsyncElement,
    AsyncEventType, Backend, Context, Endpoint, MemoryRegion, ProtectionDomain, QpAttr, QpAttrMask as M,
    QpCap, QpInitAttr, QpState, QpType, QueuePair, RcParams, WcStatus, WorkCompletion, PSN_MASK,
};

use crate::Failure;

/// The run's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Device to open.
    pub device: String,
    /// GID index for connections (1 for RoCE v2 over IPv4 on rxe).
    pub gid_index: u8,
    /// Bound on every wait for a completion.
    pub timeout: Duration,
    /// Where the server halves of the `remote` cases run (a runner started with
    /// `--serve`); `None`: in this process, on a second context of the device.
    pub peer: Option<std::net::SocketAddr>,
    /// The kind of device: what the cases expect where HCAs differ.
    pub profile: Profile,
    /// A directory where each case's traffic is captured, one file per case: the sim's
    /// own capture, or tcpdump on a RoCE device's netdev ([`crate::capture`]).
    pub capture: Option<std::path::PathBuf>,
}

impl Config {
    /// Settings for `device` with GID index 0 and a 10 s wait bound.
    pub fn new(device: impl Into<String>) -> Self {
        Config {
            device: device.into(),
            gid_index: 0,
            timeout: Duration::from_secs(10),
            peer: None,
            profile: Profile::Portable,
            capture: None,
        }
    }
}

/// Which kind of device runs the case, the same profiles the sim plays
/// ([`backend_sim::Profile`]): deviations are documented per kind, and accepted only from
/// the kind that has them. `portable` and `mlx5` expect IBA's choices; `rxe` accepts the
/// recorded rxe deviations (and the sim, run with the rxe profile, reproduces them).
pub use backend_sim::Profile;

/// The profile to expect of `device` on a backend named `backend` when none is given:
/// the sim's is its own (`RDMA_SIM_PROFILE`, default `portable`), an `rxe*` device and
/// the deterministic backend's (which plays the sim's rxe profile) are rxe,
/// and any other HCA is taken for a ConnectX.
pub fn default_profile(backend: &str, device: &str) -> Profile {
    if backend == "sim" {
        std::env::var("RDMA_SIM_PROFILE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_default()
    } else if backend == "det" || device.starts_with("rxe") {
        Profile::Rxe
    } else {
        Profile::Mlx5
    }
}

/// A case's environment.
pub struct Env<'a, B: Backend> {
    /// The backend.
    pub backend: &'a B,
    /// The run's settings.
    pub cfg: &'a Config,
    /// A context opened for this case alone.
    pub ctx: B::Context,
    /// The kind of device.
    pub profile: Profile,
    deviations: RefCell<Vec<String>>,
    observed: RefCell<Vec<(String, String)>>,
}

/// Options for [`Env::pair`]: A is usually the requester, B the responder.
#[derive(Clone, Debug)]
pub struct PairOpts {
    /// Queue capacities of both QPs.
    pub cap: QpCap,
    /// Connection attributes of QP A (its `rnr_retry`, `retry_cnt`, `timeout` matter).
    pub a: RcParams,
    /// Connection attributes of QP B (its `access` and `min_rnr_timer` matter).
    pub b: RcParams,
    /// `sq_sig_all` for QP A.
    pub sq_sig_all: bool,
    /// Give B's CQ a completion channel.
    pub channel: bool,
    /// Size of A's CQ.
    pub cqe: u32,
    /// Size of B's CQ (default: `cqe`).
    pub cqe_b: Option<u32>,
    /// Transport of both QPs: RC (the default) or UC.
    pub qp_type: QpType,
}

impl Default for PairOpts {
    fn default() -> Self {
        PairOpts {
            cap: QpCap {
                max_send_wr: 64,
                max_recv_wr: 64,
                max_send_sge: 4,
                max_recv_sge: 4,
                max_inline_data: 64,
            },
            a: RcParams {
                min_rnr_timer: 1,
                ..RcParams::default()
            },
            b: RcParams {
                min_rnr_timer: 1,
                ..RcParams::default()
            },
            sq_sig_all: false,
            channel: false,
            cqe: 512,
            cqe_b: None,
            qp_type: QpType::Rc,
        }
    }
}

/// Two RC QPs on one device, connected to each other, each with its own CQ.
pub struct Pair<B: Backend> {
    /// Their PD.
    pub pd: B::Pd,
    /// CQ of QP A (send and receive).
    pub cq_a: B::Cq,
    /// CQ of QP B (send and receive).
    pub cq_b: B::Cq,
    /// QP A.
    pub a: B::Qp,
    /// QP B.
    pub b: B::Qp,
    /// Channel of `cq_b`, with `PairOpts::channel`.
    pub ch_b: Option<B::Channel>,
    /// A's endpoint.
    pub ep_a: Endpoint,
    /// B's endpoint.
    pub ep_b: Endpoint,
}

impl<'a, B: Backend> Env<'a, B> {
    /// Opens `cfg.device` for one case.
    pub fn new(backend: &'a B, cfg: &'a Config) -> Result<Self, Failure> {
        let ctx = backend.open(&cfg.device)?;
        Ok(Env {
            backend,
            cfg,
            ctx,
            profile: cfg.profile,
            deviations: RefCell::new(Vec::new()),
            observed: RefCell::new(Vec::new()),
        })
    }

    /// Records a documented deviation of this device (with its source).
    pub fn deviation(&self, why: impl Into<String>) {
        let why = why.into();
        let mut d = self.deviations.borrow_mut();
        if !d.contains(&why) {
            d.push(why);
        }
    }

    /// The deviations recorded so far.
    pub fn take_deviations(&self) -> Vec<String> {
        std::mem::take(&mut self.deviations.borrow_mut())
    }

    /// Records what the device did at `what` (a status, an errno, an event): the report
    /// keeps it per case, and `--compare` holds two devices to the same observations. A
    /// second observation of `what` replaces the first.
    pub fn observe(&self, what: impl Into<String>, value: impl std::fmt::Display) {
        let what = what.into();
        let mut o = self.observed.borrow_mut();
        let value = value.to_string();
        match o.iter_mut().find(|(w, _)| *w == what) {
            Some(slot) => slot.1 = value,
            None => o.push((what, value)),
        }
    }

    /// Records a post's result (`accepted`, or the errno's name) as the observation
    /// `what`.
    pub fn observe_post(&self, what: &str, r: &std::result::Result<(), verbs_api::PostError>) {
        self.observe(
            what,
            r.as_ref()
                .map_or_else(|e| errno_name(e.errno()), |_| "accepted".into()),
        );
    }

    /// Waits up to `within` for the next asynchronous event, acknowledges it, records its
    /// type (or `none`) as the observation `what`, and returns its type and element.
    pub fn take_event(
        &self,
        what: impl Into<String>,
        within: Duration,
    ) -> Result<Option<(AsyncEventType, AsyncElement)>, Failure> {
        let ev = self.ctx.get_async_event(Some(within))?;
        self.observe(
            what,
            ev.as_ref()
                .map_or("none".to_string(), |e| format!("{:?}", e.event_type)),
        );
        Ok(ev.map(|ev| {
            let got = (ev.event_type, ev.element);
            self.ctx.ack_async_event(ev);
            got
        }))
    }

    /// Takes the device's port down (`up` false) or brings it back: on the sim through
    /// its fault injection ([`backend_sim::faults::Faults::port_down`]), on a RoCE device
    /// by taking its netdev down or up (`ip link set dev NETDEV down|up`, as a cable
    /// pulled; needs root). `Err(Skip)` says why this runner cannot.
    pub fn set_port(&self, up: bool) -> Result<(), PortControl> {
        if let Some(sim) = (&self.ctx as &dyn std::any::Any).downcast_ref::<backend_sim::SimContext>() {
            let f = sim.faults();
            let r = if up { f.port_up() } else { f.port_down() };
            return r.map_err(|e| PortControl::Failed(Failure(format!("sim fault injection: {e}"))));
        }
        let netdev = netdev_of(&self.cfg.device).map_err(PortControl::Cannot)?;
        let out = std::process::Command::new("ip")
            .args(["link", "set", "dev", &netdev, if up { "up" } else { "down" }])
            .output()
            .map_err(|e| PortControl::Cannot(format!("cannot run ip(8): {e}")))?;
        if !out.status.success() {
            return Err(PortControl::Cannot(format!(
                "`ip link set dev {netdev}` failed (root needed to take a port down): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// Changes the address of the device's port 1, as a real port's changes: on the sim
    /// through its fault injection (an InfiniBand port's new LID,
    /// [`backend_sim::faults::Faults::change_lid`]; a RoCE port's added GID,
    /// [`backend_sim::faults::Faults::add_gid`]), on a RoCE device by adding
    /// [`ADDED_IP`] to its netdev (`ip addr add`, root), after which the kernel lists
    /// its GID. An InfiniBand port's LID is the subnet manager's: `Err(Cannot)`.
    pub fn change_address(&self) -> Result<AddrChange, PortControl> {
        let failed = |e: verbs_api::Error| PortControl::Failed(Failure(format!("sim fault injection: {e}")));
        let roce = self
            .ctx
            .query_port(1)
            .map_err(|e| PortControl::Failed(e.into()))?
            .link_layer
            == verbs_api::LinkLayer::Ethernet;
        if let Some(sim) = (&self.ctx as &dyn std::any::Any).downcast_ref::<backend_sim::SimContext>() {
            let f = sim.faults();
            if !roce {
                return f.change_lid().map(AddrChange::Lid).map_err(failed);
            }
            let index = f.add_gid(None).map_err(failed)?;
            let gid = self.ctx.query_gid(1, index).map_err(failed)?;
            return Ok(AddrChange::Gid {
                gid,
                index: Some(index),
            });
        }
        if !roce {
            return Err(PortControl::Cannot(
                "an InfiniBand port's LID is assigned by the subnet manager: this runner cannot change it"
                    .into(),
            ));
        }
        self.ip_addr("add")?;
        Ok(AddrChange::Gid {
            gid: verbs_api::Gid::from(ADDED_IP),
            index: None,
        })
    }

    /// Undoes what [`change_address`](Self::change_address) added: the sim removes the
    /// GID, a RoCE device's netdev loses [`ADDED_IP`] (`ip addr del`). A new LID stays.
    pub fn restore_address(&self, change: &AddrChange) -> Result<(), PortControl> {
        let AddrChange::Gid { index, .. } = change else {
            return Ok(());
        };
        if let Some(sim) = (&self.ctx as &dyn std::any::Any).downcast_ref::<backend_sim::SimContext>() {
            let index = index.unwrap_or_default();
            return sim
                .faults()
                .remove_gid(index)
                .map_err(|e| PortControl::Failed(Failure(format!("sim fault injection: {e}"))));
        }
        self.ip_addr("del")
    }

    /// `ip addr add|del ADDED_IP/32 dev NETDEV` on the device's netdev.
    fn ip_addr(&self, verb: &str) -> Result<(), PortControl> {
        let netdev = netdev_of(&self.cfg.device).map_err(PortControl::Cannot)?;
        let ip = format!("{ADDED_IP}/32");
        let out = std::process::Command::new("ip")
            .args(["addr", verb, &ip, "dev", &netdev])
            .output()
            .map_err(|e| PortControl::Cannot(format!("cannot run ip(8): {e}")))?;
        if !out.status.success() {
            return Err(PortControl::Cannot(format!(
                "`ip addr {verb} {ip} dev {netdev}` failed (root needed to change a netdev's addresses): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(())
    }

    /// Waits up to `within` for port 1 of the device to reach `state` (a netdev's carrier
    /// takes a moment on a real device).
    pub fn wait_port(&self, state: verbs_api::PortState, within: Duration) -> Result<(), Failure> {
        let until = std::time::Instant::now() + within;
        loop {
            let now = self.ctx.query_port(1)?.state;
            if now == state {
                return Ok(());
            }
            if std::time::Instant::now() >= until {
                return Err(Failure(format!(
                    "port 1 is {now:?}, not {state:?}, {within:?} after the change"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The observations recorded so far.
    pub fn take_observed(&self) -> Vec<(String, String)> {
        std::mem::take(&mut self.observed.borrow_mut())
    }

    /// Connection attributes for this run (the configured GID index).
    pub fn params(&self) -> RcParams {
        RcParams {
            gid_index: self.cfg.gid_index,
            ..RcParams::default()
        }
    }

    /// Default pair options with this run's GID index.
    pub fn opts(&self) -> PairOpts {
        let mut o = PairOpts::default();
        o.a.gid_index = self.cfg.gid_index;
        o.b.gid_index = self.cfg.gid_index;
        o
    }

    /// A memory region of `len` bytes.
    pub fn mr(&self, pd: &B::Pd, len: usize, access: AccessFlags) -> Result<B::Mr, Failure> {
        Ok(pd.reg_mr(len, access)?)
    }

    /// Two QPs with their CQs, created but not connected (both in RESET).
    pub fn pair_unconnected(&self, o: &PairOpts) -> Result<Pair<B>, Failure> {
        let pd = self.ctx.alloc_pd()?;
        let ch_b = if o.channel {
            Some(self.ctx.create_comp_channel()?)
        } else {
            None
        };
        let cq_a = self.ctx.create_cq(o.cqe, None)?;
        let cq_b = self.ctx.create_cq(o.cqe_b.unwrap_or(o.cqe), ch_b.as_ref())?;
        let mut ia = QpInitAttr::new(o.qp_type, &cq_a, &cq_a, o.cap);
        ia.sq_sig_all = o.sq_sig_all;
        let a = pd.create_qp(&ia)?;
        let b = pd.create_qp(&QpInitAttr::new(o.qp_type, &cq_b, &cq_b, o.cap))?;
        let ep_a = local_endpoint(&self.ctx, &a, &o.a, 0x1000)?;
        let ep_b = local_endpoint(&self.ctx, &b, &o.b, 0x2000)?;
        Ok(Pair {
            pd,
            cq_a,
            cq_b,
            a,
            b,
            ch_b,
            ep_a,
            ep_b,
        })
    }

    /// Two connected QPs (both in RTS).
    pub fn pair(&self, o: &PairOpts) -> Result<Pair<B>, Failure> {
        let p = self.pair_unconnected(o)?;
        connect(&p.a, &o.a, p.ep_a.psn, &p.ep_b)?;
        connect(&p.b, &o.b, p.ep_b.psn, &p.ep_a)?;
        Ok(p)
    }

    /// Waits for exactly `n` completions on `cq` (bounded by the configured timeout).
    pub fn wait(&self, cq: &B::Cq, n: usize) -> Result<Vec<WorkCompletion>, Failure> {
        poll_n(cq, n, self.cfg.timeout).map_err(|e| Failure(e.to_string()))
    }

    /// Waits for one completion.
    pub fn wait1(&self, cq: &B::Cq) -> Result<WorkCompletion, Failure> {
        Ok(self.wait(cq, 1)?[0])
    }

    /// Everything that arrives on `cq` within `quiet`. On the deterministic backend,
    /// whose world does not move while the thread sleeps, `quiet` is virtual time: the
    /// world runs that long (or until nothing is left to happen), then `cq` is polled.
    pub fn quiet(&self, cq: &B::Cq, quiet: Duration) -> Result<Vec<WorkCompletion>, Failure> {
        self.settle(quiet)?;
        Ok(poll_quiet(cq, Duration::ZERO)?)
    }

    /// Lets `d` pass for the devices ([`Backend::settle`]): a backend on a virtual clock
    /// runs its world through `d` of virtual time (a thread's sleep moves nothing there);
    /// the others sleep.
    pub fn settle(&self, d: Duration) -> Result<(), Failure> {
        Ok(self.backend.settle(d)?)
    }

    /// Checks a completion's status: `want` is what a real HCA reports; `alt` lists what a
    /// given device reports instead, with the source that documents it.
    pub fn expect_status(
        &self,
        what: &str,
        wc: &WorkCompletion,
        want: WcStatus,
        alt: &[(Profile, WcStatus, &str)],
    ) -> Result<(), Failure> {
        self.observe(what, format_args!("{:?}", wc.status));
        if wc.status == want {
            return Ok(());
        }
        for (p, s, why) in alt {
            if *p == self.profile && wc.status == *s {
                self.deviation(format!("{what}: {s:?} instead of {want:?}; {why}"));
                return Ok(());
            }
        }
        Err(Failure(format!(
            "{what}: expected status {want:?}, got {:?} (wr_id {:#x})",
            wc.status, wc.wr_id
        )))
    }

    /// Checks a refused post's errno: `want` is what `man ibv_post_send` names; `alt` lists
    /// what a given device answers instead, with the source that documents it. Records
    /// the errno as the observation `what`.
    pub fn expect_errno(
        &self,
        what: &str,
        e: &verbs_api::PostError,
        want: i32,
        alt: &[(Profile, i32, &str)],
    ) -> Result<(), Failure> {
        let got = e.errno();
        self.observe(what, errno_name(got));
        if got == want {
            return Ok(());
        }
        for (p, errno, why) in alt {
            if *p == self.profile && got == *errno {
                self.deviation(format!(
                    "{what}: {} instead of {}; {why}",
                    errno_name(got),
                    errno_name(want)
                ));
                return Ok(());
            }
        }
        Err(Failure(format!(
            "{what}: expected {}, got {} ({e})",
            errno_name(want),
            errno_name(got)
        )))
    }

    /// Checks that `cq` holds nothing (after a short wait).
    pub fn expect_empty(&self, cq: &B::Cq, what: &str) -> Result<(), Failure> {
        let extra = self.quiet(cq, Duration::from_millis(20))?;
        if !extra.is_empty() {
            return Err(Failure(format!("{what}: expected no completion, got {extra:?}")));
        }
        Ok(())
    }
}

/// Connects an RC or UC QP (by its type) to `remote`: [`connect_rc`] or [`connect_uc`].
pub fn connect(
    qp: &impl QueuePair,
    params: &RcParams,
    local_psn: u32,
    remote: &Endpoint,
) -> verbs_api::Result<()> {
    match qp.qp_type() {
        QpType::Uc => connect_uc(qp, params, local_psn, remote),
        _ => connect_rc(qp, params, local_psn, remote),
    }
}

/// RESET → INIT → RTR → RTS of a UC QP towards `remote`, with the attributes
/// `man ibv_modify_qp` lists for UC: INIT: PKEY_INDEX, PORT, ACCESS_FLAGS; RTR: AV,
/// PATH_MTU, DEST_QPN, RQ_PSN; RTS: SQ_PSN. UC has no reads, atomics, ACKs or retries, so
/// none of RC's MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER, TIMEOUT, RETRY_CNT, RNR_RETRY or
/// MAX_QP_RD_ATOMIC (the kernel refuses them with EINVAL).
pub fn connect_uc(
    qp: &impl QueuePair,
    params: &RcParams,
    local_psn: u32,
    remote: &Endpoint,
) -> verbs_api::Result<()> {
    modify_to_init(qp, params)?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: params.path_mtu,
        dest_qp_num: remote.qpn,
        rq_psn: remote.psn & PSN_MASK,
        ah_attr: ah_attr_for(remote, params),
        ..Default::default()
    };
    qp.modify(&rtr, M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN)?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: local_psn & PSN_MASK,
        ..Default::default()
    };
    qp.modify(&rts, M::STATE | M::SQ_PSN)
}

/// RESET → INIT → RTR → RTS of a UD QP, with the attributes `man ibv_modify_qp` lists for
/// UD: INIT: PKEY_INDEX, PORT, QKEY; RTR: the state alone; RTS: SQ_PSN.
pub fn ud_to_rts(qp: &impl QueuePair, params: &RcParams, qkey: u32, sq_psn: u32) -> verbs_api::Result<()> {
    let init = QpAttr {
        qp_state: QpState::Init,
        pkey_index: params.pkey_index,
        port_num: params.port_num,
        qkey,
        ..Default::default()
    };
    qp.modify(&init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)?;
    let rtr = QpAttr {
        qp_state: QpState::Rtr,
        ..Default::default()
    };
    qp.modify(&rtr, M::STATE)?;
    let rts = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: sq_psn & PSN_MASK,
        ..Default::default()
    };
    qp.modify(&rts, M::STATE | M::SQ_PSN)
}

/// An errno by its name (`EINVAL`), or its number when it has none here.
pub fn errno_name(e: i32) -> String {
    match e {
        libc::EINVAL => "EINVAL".into(),
        libc::ENOMEM => "ENOMEM".into(),
        libc::EOPNOTSUPP => "EOPNOTSUPP".into(),
        libc::EBUSY => "EBUSY".into(),
        libc::EPERM => "EPERM".into(),
        libc::EAGAIN => "EAGAIN".into(),
        libc::ENOENT => "ENOENT".into(),
        n => format!("errno {n}"),
    }
}

/// A buffer with a recognisable pattern.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    // Folding in the higher bytes of the offset keeps the pattern from repeating every
    // 256 bytes: a packet placed at the wrong offset (a multiple of the path MTU) would
    // otherwise carry the very bytes that belong there, and a wrong resend would pass.
    (0..len)
        .map(|i| {
            let x = i as u32;
            ((x ^ (x >> 8) ^ (x >> 16)) as u8)
                .wrapping_mul(31)
                .wrapping_add(seed)
        })
        .collect()
}

/// Reads `len` bytes at `offset` of `mr`.
pub fn read_back(mr: &impl MemoryRegion, offset: usize, len: usize) -> Result<Vec<u8>, Failure> {
    let mut v = vec![0u8; len];
    mr.read(offset, &mut v)?;
    Ok(v)
}

/// The address [`Env::change_address`] adds to a RoCE device's netdev: one of TEST-NET-1
/// (RFC 5737), which no network uses, held for the case alone.
pub const ADDED_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(192, 0, 2, 77);

/// What [`Env::change_address`] changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddrChange {
    /// An InfiniBand port's new LID.
    Lid(u16),
    /// A GID a RoCE port gained, at `index` where the runner knows it.
    Gid {
        /// The GID added.
        gid: verbs_api::Gid,
        /// Its GID table index, if the runner chose it (the sim's).
        index: Option<u32>,
    },
}

/// Why [`Env::set_port`] did not move the port.
#[derive(Debug)]
pub enum PortControl {
    /// This runner cannot (not root, no netdev): the case is skipped, saying why.
    Cannot(String),
    /// It tried and failed.
    Failed(Failure),
}

impl PortControl {
    /// The case's outcome: a skip, or the failure.
    pub fn outcome(self) -> crate::CaseResult {
        match self {
            PortControl::Cannot(why) => Ok(crate::Outcome::Skip(crate::report::Lack::PortControl, why)),
            PortControl::Failed(f) => Err(f),
        }
    }
}

/// The netdev under RDMA device `device` (its port 1's first GID's,
/// `/sys/class/infiniband/DEV/ports/1/gid_attrs/ndevs/0`).
pub(crate) fn netdev_of(device: &str) -> Result<String, String> {
    let path = format!("/sys/class/infiniband/{device}/ports/1/gid_attrs/ndevs/0");
    std::fs::read_to_string(&path)
        .map(|s| s.trim().to_string())
        .map_err(|e| format!("{device} has no netdev to take down ({path}: {e})"))
}
