//! rdma_cm over UD (RDMA_PS_UDP; rdma-core's udaddy and mckey): the request and its
//! answer with the peer's QPN and Q_Key, a Q_Key other than RDMA_UDP_QKEY, and a
//! multicast join.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use verbs_api::rdmacm::{
    self, qp as cmqp, CmBackend, CmEventChannel, CmEventParam, CmEventType as E, CmId, ConnParam, PortSpace,
};
use verbs_api::{Context, ProtectionDomain, QpState, QpType, QueuePair};

use super::{device_ip, expect, listener, private_data, refused, resolved, send_recv, side};
use crate::{ensure, ensure_eq, CaseResult, Env, Failure, Outcome};

pub(super) fn ud<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let (lch, _lid, addr) = listener(env, PortSpace::Udp)?;
    let (cch, cid) = resolved(env, PortSpace::Udp, addr)?;
    let client = side::<B>(&cid, QpType::Ud)?;
    ensure_eq!(client.qp.state()?, QpState::Rts, "a UD QP after rdma_create_qp");
    cid.connect(&ConnParam {
        private_data: b"ud?".to_vec(),
        ..Default::default()
    })?;
    let req = expect(env, &lch, E::ConnectRequest, "server: request")?;
    private_data("request", req.param.private_data(), b"ud?", 180)?;
    let sid = req
        .new_id
        .ok_or_else(|| Failure("a request without a new id".into()))?;
    let server = side::<B>(&sid, QpType::Ud)?;
    cmqp::accept(&sid, &server.qp, &ConnParam::default())?;
    let est = expect(env, &cch, E::Established, "client: established")?;
    let CmEventParam::Ud(u) = &est.param else {
        return Err(Failure(format!("ESTABLISHED of a UD id with {:?}", est.param)));
    };
    ensure_eq!(u.qp_num, server.qp.qp_num(), "the service's QPN");
    ensure_eq!(u.qkey, rdmacm::UDP_QKEY, "the service's Q_Key");
    ensure_eq!(u.private_data.len(), 136, "ESTABLISHED's private data length");
    let ah = client._pd.create_ah(&u.ah_attr)?;
    send_recv(env, &client, &server, b"datagram", Some((&ah, u.qp_num, u.qkey)))?;
    Ok(Outcome::Pass)
}

pub(super) fn ud_qkey<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let (lch, _lid, addr) = listener(env, PortSpace::Udp)?;
    let (cch, cid) = resolved(env, PortSpace::Udp, addr)?;
    let _client = side::<B>(&cid, QpType::Ud)?;
    cid.connect(&ConnParam::default())?;
    let req = expect(env, &lch, E::ConnectRequest, "server: request")?;
    let sid = req
        .new_id
        .ok_or_else(|| Failure("a request without a new id".into()))?;
    let server = side::<B>(&sid, QpType::Ud)?;
    let foreign = ConnParam {
        qkey: 0x1111_1111,
        ..ConnParam::default()
    };
    refused(
        &format!("a UD accept with Q_Key {:#x}", foreign.qkey),
        cmqp::accept(&sid, &server.qp, &foreign),
    )?;
    cmqp::accept(&sid, &server.qp, &ConnParam::default())?;
    let est = expect(env, &cch, E::Established, "client: established")?;
    let CmEventParam::Ud(u) = &est.param else {
        return Err(Failure(format!("ESTABLISHED of a UD id with {:?}", est.param)));
    };
    ensure_eq!(u.qkey, rdmacm::UDP_QKEY, "the service's Q_Key");
    Ok(Outcome::Pass)
}

pub(super) fn multicast<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let ip = device_ip(env)?;
    let ch = env.backend.create_event_channel()?;
    let id = ch.create_id(5, PortSpace::Udp, QpType::Ud)?;
    id.bind_addr(SocketAddr::new(ip.into(), 0))?;
    // A group of this run alone (239/8: administratively scoped).
    let pid = std::process::id();
    let group = Ipv4Addr::new(239, 77, (pid >> 8) as u8, pid as u8);
    let addr = SocketAddr::new(group.into(), 0);
    id.join_multicast(addr, 4242, false)?;
    let ev = expect(env, &ch, E::MulticastJoin, "join")?;
    ensure_eq!(ev.mcast, Some(4242), "the join's context");
    ensure_eq!(ev.id.context, 5, "the id's context");
    let CmEventParam::Ud(u) = &ev.param else {
        return Err(Failure(format!("MULTICAST_JOIN with {:?}", ev.param)));
    };
    ensure_eq!(u.qp_num, verbs_api::MULTICAST_QPN, "the group's QPN");
    ensure_eq!(u.qkey, rdmacm::UDP_QKEY, "the group's Q_Key");
    ensure!(u.ah_attr.is_global, "the group's address vector has no GRH");
    let mgid = u.ah_attr.grh.dgid;
    ensure!(
        mgid.is_multicast(),
        "the group's MGID {mgid:?} is no multicast GID"
    );
    if env.ctx.query_port(1)?.link_layer == verbs_api::LinkLayer::Ethernet {
        ensure_eq!(
            mgid.to_ipv4_mapped(),
            Some(group),
            "RoCE: the MGID is the group's address"
        );
        ensure_eq!(u.ah_attr.dlid, 0, "RoCE: the MLID");
    } else {
        ensure!(
            u.ah_attr.dlid >= verbs_api::MULTICAST_LID_BASE,
            "InfiniBand: the MLID {:#x} is no multicast LID",
            u.ah_attr.dlid
        );
    }
    // The MLID itself depends on the group, which is this run's (its pid): the report
    // says only which kind it is, so that two runs' reports agree.
    let dlid = match u.ah_attr.dlid {
        0 => "0",
        _ => "a multicast LID",
    };
    env.observe(
        "join: qp_num, qkey, dlid",
        format!("{:#x} {:#x} {dlid}", u.qp_num, u.qkey),
    );
    env.observe(
        "join: hop limit, sgid index",
        format!("{} {}", u.ah_attr.grh.hop_limit, u.ah_attr.grh.sgid_index),
    );
    // The QP attaches to the group as librdmacm attaches an id's own QP.
    let qp_side = side::<B>(&id, QpType::Ud)?;
    qp_side.qp.attach_mcast(&mgid, u.ah_attr.dlid)?;
    qp_side.qp.detach_mcast(&mgid, u.ah_attr.dlid)?;
    id.leave_multicast(addr)?;
    ensure!(
        ch.get_event(Some(Duration::from_millis(100)))?.is_none(),
        "an event after the leave"
    );
    Ok(Outcome::Pass)
}
