//! Bringing an RC QP up: RESET → INIT → RTR → RTS with the attributes and masks
//! `man ibv_modify_qp` lists for RC, from a local port/GID choice and the peer's
//! [`Endpoint`]. This is what `ibv_rc_pingpong` and perftest do by hand after their TCP
//! exchange; both backends share it.
//!
//! ```no_run
//! # use verbs_api::*;
//! # fn demo<B: Backend>(ctx: &B::Context, qp: &B::Qp, remote: Endpoint) -> Result<()> {
//! let params = RcParams::default();
//! let me = local_endpoint(ctx, qp, &params, 0x1234)?; // send `me` to the peer
//! connect_rc(qp, &params, me.psn, &remote)?;           // ... after receiving `remote`
//! # Ok(()) }
//! ```

use crate::device::Mtu;
use crate::endpoint::Endpoint;
use crate::error::Result;
use crate::flags::{AccessFlags, QpAttrMask as M};
use crate::qp::{AhAttr, GlobalRoute, QpAttr, QpState, PSN_MASK};
use crate::traits::{Context, QueuePair};

/// The connection attributes of an RC QP, with the defaults most programs use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RcParams {
    /// Local port (`port_num`), default 1.
    pub port_num: u8,
    /// Source GID index (`ah_attr.grh.sgid_index`), default 0 (RoCE v2 over IPv4 usually
    /// wants the IPv4-mapped entry, often index 1).
    pub gid_index: u8,
    /// P_Key index, default 0.
    pub pkey_index: u16,
    /// Remote operations accepted (`qp_access_flags`), default all three remote rights.
    pub access: AccessFlags,
    /// Path MTU, default 1024.
    pub path_mtu: Mtu,
    /// Local ACK timeout code, default 14 (~67 ms).
    pub timeout: u8,
    /// Transport retries, default 7.
    pub retry_cnt: u8,
    /// RNR retries, default 7 (forever).
    pub rnr_retry: u8,
    /// RNR NAK timer code this QP advertises, default 12 (0.64 ms).
    pub min_rnr_timer: u8,
    /// Outstanding READ/atomics this QP may issue, default 4.
    pub max_rd_atomic: u8,
    /// Outstanding READ/atomics this QP accepts, default 4.
    pub max_dest_rd_atomic: u8,
    /// Service level, default 0.
    pub sl: u8,
}

impl Default for RcParams {
    fn default() -> Self {
        RcParams {
            port_num: 1,
            gid_index: 0,
            pkey_index: 0,
            access: AccessFlags::REMOTE,
            path_mtu: Mtu::Mtu1024,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 4,
            sl: 0,
        }
    }
}

/// This QP's endpoint: the port's LID, the GID at `params.gid_index`, the QP number and
/// the PSN it will start sending with.
pub fn local_endpoint<C: Context>(
    ctx: &C,
    qp: &impl QueuePair,
    params: &RcParams,
    psn: u32,
) -> Result<Endpoint> {
    let port = ctx.query_port(params.port_num)?;
    let gid = ctx.query_gid(params.port_num, params.gid_index as u32)?;
    Ok(Endpoint {
        gid,
        lid: port.lid,
        qpn: qp.qp_num(),
        psn: psn & PSN_MASK,
    })
}

/// RESET → INIT with the port, P_Key index and remote access flags.
pub fn modify_to_init(qp: &impl QueuePair, params: &RcParams) -> Result<()> {
    let attr = QpAttr {
        qp_state: QpState::Init,
        pkey_index: params.pkey_index,
        port_num: params.port_num,
        qp_access_flags: params.access,
        ..Default::default()
    };
    qp.modify(&attr, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
}

/// The address vector that reaches `remote` from `params`' port and GID.
pub fn ah_attr_for(remote: &Endpoint, params: &RcParams) -> AhAttr {
    AhAttr {
        grh: GlobalRoute {
            dgid: remote.gid,
            sgid_index: params.gid_index,
            hop_limit: 64,
            ..Default::default()
        },
        dlid: remote.lid,
        sl: params.sl,
        is_global: !remote.gid.is_zero(),
        port_num: params.port_num,
        ..Default::default()
    }
}

/// INIT → RTR towards `remote`.
pub fn modify_to_rtr(qp: &impl QueuePair, params: &RcParams, remote: &Endpoint) -> Result<()> {
    let attr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: params.path_mtu,
        dest_qp_num: remote.qpn,
        rq_psn: remote.psn & PSN_MASK,
        max_dest_rd_atomic: params.max_dest_rd_atomic,
        min_rnr_timer: params.min_rnr_timer,
        ah_attr: ah_attr_for(remote, params),
        ..Default::default()
    };
    qp.modify(
        &attr,
        M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
    )
}

/// RTR → RTS, sending from `sq_psn`.
pub fn modify_to_rts(qp: &impl QueuePair, params: &RcParams, sq_psn: u32) -> Result<()> {
    let attr = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: sq_psn & PSN_MASK,
        timeout: params.timeout,
        retry_cnt: params.retry_cnt,
        rnr_retry: params.rnr_retry,
        max_rd_atomic: params.max_rd_atomic,
        ..Default::default()
    };
    qp.modify(
        &attr,
        M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
    )
}

/// RESET → INIT → RTR → RTS in one call: the QP sends from `local_psn` and talks to
/// `remote`.
pub fn connect_rc(qp: &impl QueuePair, params: &RcParams, local_psn: u32, remote: &Endpoint) -> Result<()> {
    modify_to_init(qp, params)?;
    modify_to_rtr(qp, params, remote)?;
    modify_to_rts(qp, params, local_psn)
}
