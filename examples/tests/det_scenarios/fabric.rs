//! What the three scenarios share on the deterministic fabric: a device with its PD and
//! CQ ([`Node`]), an RC QP connected to a peer's ([`rc_pair`], the out-of-band exchange
//! a copy), the fault mixes they run under ([`mixes`]) and the run of every seed twice
//! with the traces compared ([`twice`]).

use std::time::Duration;

use backend_sim_det::harness::{check_seeds, Failure};
use backend_sim_det::{Det, DetBuilder};
use backend_sim_proto::fabric::FaultMix;
use verbs_api::{
    connect_rc, local_endpoint, Backend, Context, CqOf, PdOf, ProtectionDomain, QpCap, QpInitAttr, QpOf,
    QpType, RcParams, SrqOf,
};

/// The error of a verb, as the scenarios report it.
pub fn verb(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// One device of the world: its context, a PD and one CQ for all its QPs.
pub struct Node<B: Backend> {
    pub cq: CqOf<B>,
    pub pd: PdOf<B>,
    pub ctx: B::Context,
}

/// Opens device `name` with a CQ of `cqe` entries.
pub fn node<B: Backend>(b: &B, name: &str, cqe: u32) -> Result<Node<B>, String> {
    let ctx = b.open(name).map_err(verb)?;
    let pd = ctx.alloc_pd().map_err(verb)?;
    let cq = ctx.create_cq(cqe, None).map_err(verb)?;
    Ok(Node { cq, pd, ctx })
}

/// An RC QP on `n` whose send and receive queues hold `send` and `recv` WRs.
pub fn rc_qp<B: Backend>(n: &Node<B>, send: u32, recv: u32) -> Result<QpOf<B>, String> {
    rc_qp_on(n, send, recv, None)
}

/// [`rc_qp`], taking its receives from `srq` if one is given.
pub fn rc_qp_on<B: Backend>(
    n: &Node<B>,
    send: u32,
    recv: u32,
    srq: Option<&SrqOf<B>>,
) -> Result<QpOf<B>, String> {
    let cap = QpCap {
        max_send_wr: send,
        max_recv_wr: recv,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let attr = QpInitAttr::new(QpType::Rc, &n.cq, &n.cq, cap);
    let attr = match srq {
        Some(s) => attr.with_srq(s),
        None => attr,
    };
    n.pd.create_qp(&attr).map_err(verb)
}

/// The connection parameters: a local ACK timeout of about 4 ms (virtual) so that a lost
/// frame is resent soon, RNR NAKs retried forever, every remote access allowed.
pub fn params() -> RcParams {
    RcParams {
        timeout: 10,
        ..RcParams::default()
    }
}

/// Connects `a` (on `na`) and `b` (on `nb`) to each other with `p`, the endpoints exchanged by
/// copy as a side channel would. Nothing is sent until the caller posts: in one thread,
/// receives posted right after this are posted before the peer's first SEND.
pub fn rc_pair<B: Backend>(
    (na, a): (&Node<B>, &QpOf<B>),
    (nb, b): (&Node<B>, &QpOf<B>),
    p: &RcParams,
) -> Result<(), String> {
    let ea = local_endpoint(&na.ctx, a, p, 100).map_err(verb)?;
    let eb = local_endpoint(&nb.ctx, b, p, 9000).map_err(verb)?;
    connect_rc(b, p, eb.psn, &ea).map_err(verb)?;
    connect_rc(a, p, ea.psn, &eb).map_err(verb)
}

/// The fault mixes each scenario runs under, by name: loss, duplication and reordering
/// of whole frames; the same with every frame of several packets cut into its packets;
/// a little of both with connections breaking.
pub fn mixes() -> [(&'static str, FaultMix); 3] {
    let mut lossy = FaultMix::lossy(5, 5);
    lossy.jitter = Duration::from_micros(50);
    lossy.split_ppm = 0;
    let mut split = FaultMix::lossy(5, 5);
    split.split_ppm = 1_000_000;
    let mut resets = FaultMix::lossy(2, 2);
    resets.reset_ppm = 5_000;
    [("lossy", lossy), ("split", split), ("resets", resets)]
}

/// A perfect network (2 us one way).
pub fn clean() -> FaultMix {
    FaultMix::clean(Duration::from_micros(2))
}

/// A world of devices `hosts` over `mix`.
pub fn world(hosts: &[&str], mix: FaultMix) -> DetBuilder {
    Det::builder().hosts(hosts.iter().copied()).mix(mix)
}

/// Runs `run` under every seed of `seeds` in a world made by `builder`, then all of them
/// again: the first failure, or a trace per seed, equal in both rounds (same seed, same
/// run). Different seeds must give different runs unless the network is perfect.
pub fn twice(
    builder: &DetBuilder,
    seeds: std::ops::Range<u64>,
    mut run: impl FnMut(&Det) -> Result<(), String>,
) -> Result<Vec<u64>, Failure> {
    let first = check_seeds(builder, seeds.clone(), &mut run)?;
    let again = check_seeds(builder, seeds, &mut run)?;
    assert_eq!(first, again, "a seed ran differently the second time");
    Ok(first)
}
