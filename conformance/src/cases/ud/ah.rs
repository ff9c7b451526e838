//! Address handles (`man ibv_create_ah`): the attributes one keeps, the GRH a RoCE port
//! requires, and the RoCE hints UCX sets (a 32-bit flow label, a DLID that is ignored).

use verbs_api::{
    ah_attr_for, local_endpoint, AddressHandle, Backend, Context, LinkLayer, MemoryRegion, ProtectionDomain,
    QpInitAttr, QueuePair, SendWr,
};

use super::{UdSetup, GRH, QKEY};
use crate::env::read_back;
use crate::{ensure, ensure_eq, CaseResult, Env, Failure, Outcome};

pub(super) fn ud_ah<B: Backend>(env: &Env<B>) -> CaseResult {
    let params = env.params();
    let pd = env.ctx.alloc_pd()?;
    let cq = env.ctx.create_cq(16, None)?;
    let qp = pd.create_qp(&QpInitAttr::ud(&cq, &cq, env.opts().cap))?;
    let ep = local_endpoint(&env.ctx, &qp, &params, 0)?;
    let attr = ah_attr_for(&ep, &params);
    let ah = pd.create_ah(&attr)?;
    ensure_eq!(ah.attr(), attr, "attr() of the address handle");
    let local = verbs_api::AhAttr {
        is_global: false,
        ..attr
    };
    let port = env.ctx.query_port(1)?;
    match (port.link_layer, pd.create_ah(&local)) {
        (LinkLayer::Ethernet, Ok(_)) => {
            return Err(Failure(
                "an address handle without the GRH was created on an Ethernet (RoCE) port".into(),
            ))
        }
        (LinkLayer::Ethernet, Err(e)) => {
            ensure_eq!(e.errno(), libc::EINVAL, "create_ah without the GRH on RoCE ({e})")
        }
        (_, Ok(ah)) => ensure_eq!(ah.attr(), local, "attr() of a local address handle"),
        (_, Err(e)) => {
            return Err(Failure(format!(
                "create_ah without the GRH on {:?}: {e}",
                port.link_layer
            )))
        }
    }
    Ok(Outcome::Pass)
}

pub(super) fn ud_ah_udp_hint<B: Backend>(env: &Env<B>) -> CaseResult {
    let u = UdSetup::new(env, 1)?;
    let link_layer = env.ctx.query_port(1)?.link_layer;
    let ah =
        u.pd.create_ah(&crate::cases::qp::ucx_ah_attr(&u.ep_r, &env.params(), link_layer))?;
    u.src.write(0, b"hinted datagram")?;
    u.post(1, 0, 15)?;
    u.s[0].post_send(&[SendWr::send(2, &[u.src.sge(0, 15)?])
        .signaled()
        .ud(&ah, u.r.qp_num(), QKEY)])?;
    ensure!(env.wait1(&u.cq_s)?.is_ok(), "the send through the hinted handle");
    let wc = env.wait1(&u.cq_r)?;
    ensure!(wc.is_ok() && wc.wr_id == 1, "receive: {wc:?}");
    ensure_eq!(
        read_back(&u.dst, GRH, 15)?,
        b"hinted datagram".to_vec(),
        "payload"
    );
    if link_layer != LinkLayer::Ethernet {
        // The IB GRH's first word: IPVer 6, TClass, and the flow label's low 20 bits.
        let grh = read_back(&u.dst, 0, 4)?;
        let word = u32::from_be_bytes([grh[0], grh[1], grh[2], grh[3]]);
        ensure_eq!(word & 0xf_ffff, 0xf_ffff, "the GRH's flow label");
    }
    Ok(Outcome::Pass)
}
