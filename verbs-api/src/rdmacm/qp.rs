//! What librdmacm does with an id's QP (`rdma_create_qp`, `rdma_accept`, the connect
//! response, `rdma_disconnect`), for a QP the caller made: the connection manager itself
//! never touches a QP ([`CmId`]). Each function moves the QP through the transitions
//! [`CmId::init_qp_attr`] gives, as librdmacm's `ucma_init_conn_qp`,
//! `ucma_modify_qp_rtr` / `_rts` and `ucma_modify_qp_err` do.

use std::time::Duration;

use super::traits::{CmEventChannel, CmId, CmIdOf};
use super::types::{CmEvent, CmEventType, ConnParam, MAX_RD_ATOMIC};
use crate::error::{Error, Result};
use crate::flags::QpAttrMask;
use crate::qp::{QpAttr, QpState, QpType};
use crate::traits::QueuePair;

/// Moves a new QP for `id` to INIT (`rdma_create_qp`); a UD QP on to RTR and RTS, with
/// send PSN 0, as librdmacm's `ucma_init_ud_qp` does.
pub fn init<I: CmId, Q: QueuePair>(id: &I, qp: &Q) -> Result<()> {
    let (attr, mask) = id.init_qp_attr(QpState::Init)?;
    qp.modify(&attr, mask)?;
    if qp.qp_type() == QpType::Ud {
        let rtr = QpAttr {
            qp_state: QpState::Rtr,
            ..Default::default()
        };
        qp.modify(&rtr, QpAttrMask::STATE)?;
        let rts = QpAttr {
            qp_state: QpState::Rts,
            sq_psn: 0,
            ..Default::default()
        };
        qp.modify(&rts, QpAttrMask::STATE | QpAttrMask::SQ_PSN)?;
    }
    Ok(())
}

/// Moves `qp` to RTR and RTS with the id's attributes, `max_dest_rd_atomic` and
/// `max_rd_atomic` as given unless [`MAX_RD_ATOMIC`].
fn rtr_rts<I: CmId, Q: QueuePair>(id: &I, qp: &Q, resp_res: u8, init_depth: u8) -> Result<()> {
    // librdmacm first refreshes INIT: the connection's access flags come with the request.
    let (attr, mask) = id.init_qp_attr(QpState::Init)?;
    qp.modify(&attr, mask)?;
    let (mut attr, mask) = id.init_qp_attr(QpState::Rtr)?;
    if resp_res != MAX_RD_ATOMIC {
        attr.max_dest_rd_atomic = resp_res;
    }
    qp.modify(&attr, mask)?;
    let (mut attr, mask) = id.init_qp_attr(QpState::Rts)?;
    if init_depth != MAX_RD_ATOMIC {
        attr.max_rd_atomic = init_depth;
    }
    qp.modify(&attr, mask)
}

/// Moves `qp` to ERR (librdmacm's `ucma_modify_qp_err`).
pub fn to_err<Q: QueuePair>(qp: &Q) -> Result<()> {
    let err = QpAttr {
        qp_state: QpState::Err,
        ..Default::default()
    };
    qp.modify(&err, QpAttrMask::STATE)
}

/// `rdma_connect` for `qp` (in INIT: [`init`]), with `param`'s private data and limits.
pub fn connect<I: CmId, Q: QueuePair>(id: &I, qp: &Q, param: &ConnParam) -> Result<()> {
    let param = ConnParam {
        qp_num: qp.qp_num(),
        ..param.clone()
    };
    id.connect(&param)
}

/// The active side's answer to [`CmEventType::ConnectResponse`]: `qp` to RTR and RTS,
/// then [`CmId::establish`] (what librdmacm does before it reports `ESTABLISHED` for an
/// id with a QP). On failure the QP goes to ERR.
pub fn complete_connect<I: CmId, Q: QueuePair>(id: &I, qp: &Q) -> Result<()> {
    let r = rtr_rts(id, qp, MAX_RD_ATOMIC, MAX_RD_ATOMIC).and_then(|()| id.establish());
    if r.is_err() {
        let _ = to_err(qp);
    }
    r
}

/// `rdma_accept` of a connection request with `qp` (in INIT: [`init`]): for RC the QP
/// goes to RTR and RTS first; `param`'s resources as [`ConnParam`] says.
pub fn accept<I: CmId, Q: QueuePair>(id: &I, qp: &Q, param: &ConnParam) -> Result<()> {
    if qp.qp_type() != QpType::Ud {
        if let Err(e) = rtr_rts(id, qp, param.responder_resources, param.initiator_depth) {
            let _ = to_err(qp);
            return Err(e);
        }
    }
    let param = ConnParam {
        qp_num: qp.qp_num(),
        ..param.clone()
    };
    id.accept(Some(&param))
}

/// `rdma_disconnect` of a connection with `qp`: the QP to ERR (its outstanding work
/// requests flush), then the disconnect.
pub fn disconnect<I: CmId, Q: QueuePair>(id: &I, qp: &Q) -> Result<()> {
    to_err(qp)?;
    id.disconnect()
}

/// Takes the next event of `ch` within `timeout` and checks that it is `want`; another
/// event, or none in time, is an error that names it (and its status).
pub fn expect<C: CmEventChannel>(
    ch: &C,
    want: CmEventType,
    timeout: Duration,
) -> Result<CmEvent<CmIdOf<C::Backend>>> {
    match ch.get_event(Some(timeout))? {
        Some(ev) if ev.event == want => Ok(ev),
        Some(ev) => Err(Error::Transport(format!("expected {want}, got {ev}"))),
        None => Err(Error::timeout(timeout, format!("no {want}"))),
    }
}
