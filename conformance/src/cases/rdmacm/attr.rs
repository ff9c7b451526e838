//! What rdma_cm takes and gives about a connection's QP (`man rdma_set_option`, `man
//! rdma_init_qp_attr`): a route given as a path record (RDMA_OPTION_IB_PATH) instead of
//! resolved, and the QP attributes of each transition that rdma_init_qp_attr gives.

use std::time::Duration;

use verbs_api::rdmacm::{
    qp as cmqp, CmBackend, CmEventChannel, CmEventType as E, CmId, CmOption, ConnParam, PathRecord, PortSpace,
};
use verbs_api::{AccessFlags, Gid, Mtu, QpAttrMask as M, QpState, QpType, QueuePair};

use super::{expect, listener, refused, resolved, side};
use crate::{ensure, ensure_eq, CaseResult, Env, Failure, Outcome};

pub(super) fn ib_path<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let (_lch, _lid, addr) = listener(env, PortSpace::Tcp)?;
    let ch = env.backend.create_event_channel()?;
    let id = ch.create_id(9, PortSpace::Tcp, QpType::Rc)?;
    let path = |sgid, dgid| {
        CmOption::IbPath(vec![PathRecord {
            sgid,
            dgid,
            pkey: 0xffff,
            hop_limit: 64,
            mtu: Mtu::Mtu1024,
            ..PathRecord::default()
        }])
    };
    refused(
        "RDMA_OPTION_IB_PATH before the address resolves",
        id.set_option(&path(Gid::default(), Gid::default())),
    )?;
    id.resolve_addr(None, addr, Duration::from_secs(2))?;
    expect(env, &ch, E::AddrResolved, "client: address")?;
    let (sgid, dgid) = id.query_gid()?;
    id.set_option(&path(sgid, dgid))?;
    expect(env, &ch, E::RouteResolved, "client: route given")?;
    Ok(Outcome::Pass)
}

pub(super) fn init_qp_attr<B: CmBackend>(env: &Env<B>) -> CaseResult {
    let (lch, _lid, addr) = listener(env, PortSpace::Tcp)?;
    let (_cch, cid) = resolved(env, PortSpace::Tcp, addr)?;
    let (a, m) = cid.init_qp_attr(QpState::Init)?;
    env.observe("INIT mask", format!("{m:?}"));
    ensure_eq!(
        m,
        M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS,
        "INIT's mask"
    );
    ensure_eq!(
        a.qp_access_flags,
        AccessFlags::empty(),
        "INIT's access before a connection"
    );
    let client = side::<B>(&cid, QpType::Rc)?;
    cmqp::connect(&cid, &client.qp, &ConnParam::rc(b""))?;
    let req = expect(env, &lch, E::ConnectRequest, "server: request")?;
    let sid = req
        .new_id
        .ok_or_else(|| Failure("a request without a new id".into()))?;
    let (a, m) = sid.init_qp_attr(QpState::Rtr)?;
    env.observe("RTR mask", format!("{m:?}"));
    ensure!(
        m.contains(
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER
        ),
        "RTR's mask: {m:?}"
    );
    ensure_eq!(a.dest_qp_num, client.qp.qp_num(), "RTR's destination QP");
    ensure!(a.ah_attr.is_global, "RTR's address vector has a GRH");
    let (a, m) = sid.init_qp_attr(QpState::Rts)?;
    env.observe("RTS mask", format!("{m:?}"));
    ensure!(
        m.contains(M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC),
        "RTS's mask: {m:?}"
    );
    ensure_eq!(
        (a.retry_cnt, a.rnr_retry),
        (7, 7),
        "RTS's retries (the request's)"
    );
    let (a, _) = sid.init_qp_attr(QpState::Init)?;
    ensure!(
        a.qp_access_flags
            .contains(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ),
        "INIT's access of a request with responder resources: {:?}",
        a.qp_access_flags
    );
    let e = sid.init_qp_attr(QpState::Sqd).err();
    env.observe(
        "SQD",
        e.as_ref()
            .map_or("accepted".into(), |e| crate::env::errno_name(e.errno())),
    );
    ensure!(e.is_some(), "rdma_init_qp_attr gives no SQD attributes");
    Ok(Outcome::Pass)
}
