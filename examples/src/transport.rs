//! QP types beyond RC: bringing UC and UD QPs up with the attributes `man ibv_modify_qp`
//! lists for them ([`ud_to_rts`]), and [`Typed`], a QP seen through which
//! `verbs_api::cm` sets up a UC or UD QP as well as an RC one.
//!
//! `cm` brings a QP up with RC's attributes (RTR: `MAX_DEST_RD_ATOMIC`,
//! `MIN_RNR_TIMER`; RTS: `TIMEOUT`, `RETRY_CNT`, `RNR_RETRY`, `MAX_QP_RD_ATOMIC`), which
//! a UC or UD QP refuses with EINVAL, as the kernel does. [`Typed`] forwards every call to
//! its QP and narrows each `modify` to what the QP's type takes: UC drops RC's
//! reliability attributes; UD takes a Q_Key instead of access flags at INIT, the state
//! alone at RTR and the send PSN at RTS, and ignores the peer (a UD QP is not connected:
//! its sends name their destination). So the examples' connection setup, its side
//! channel and its private data work for every transport, and for UD the peer's endpoint
//! is what an address handle is built from.

use verbs_api::{
    PostError, QpAttr, QpAttrMask as M, QpState, QpType, QueuePair, RcParams, RecvWr, SendWr, PSN_MASK,
};

/// The Q_Key of the examples' UD QPs (rdma-core's tests use the same).
pub const QKEY: u32 = 0x1111_1111;

/// Bytes of the GRH in front of every UD receive: a UD receive buffer is this much
/// larger than the largest datagram it takes, and the payload starts here.
pub const GRH: usize = 40;

/// RC's attributes that UC has no use for (no READs, atomics, ACKs or retries).
const RC_ONLY: M = M::MAX_DEST_RD_ATOMIC
    .union(M::MIN_RNR_TIMER)
    .union(M::TIMEOUT)
    .union(M::RETRY_CNT)
    .union(M::RNR_RETRY)
    .union(M::MAX_QP_RD_ATOMIC);

/// What UD takes of a transition's attributes.
const UD_KEEPS: M = M::STATE
    .union(M::CUR_STATE)
    .union(M::PKEY_INDEX)
    .union(M::PORT)
    .union(M::QKEY)
    .union(M::SQ_PSN);

/// `attr` and `mask` of a modify written for RC, narrowed to what a QP of `qp_type`
/// takes (see the module's docs); `qkey` is a UD QP's Q_Key, set where RC sets the
/// access flags (INIT).
pub fn for_type(qp_type: QpType, attr: &QpAttr, mask: M, qkey: u32) -> (QpAttr, M) {
    match qp_type {
        QpType::Rc => (*attr, mask),
        QpType::Uc => (*attr, mask - RC_ONLY),
        QpType::Ud => {
            let mut a = *attr;
            let mut m = mask & UD_KEEPS;
            if mask.contains(M::ACCESS_FLAGS) {
                a.qkey = qkey;
                m |= M::QKEY;
            }
            (a, m)
        }
    }
}

/// A QP whose transitions are narrowed to its type ([`for_type`]); everything else is
/// forwarded. Hand it to `cm` (or to the examples' `conn::Acceptor` and `conn::connect`)
/// in place of the QP.
pub struct Typed<'a, Q> {
    qp: &'a Q,
    qkey: u32,
}

impl<'a, Q: QueuePair> Typed<'a, Q> {
    /// `qp`, with [`QKEY`] if it is a UD QP.
    pub fn new(qp: &'a Q) -> Self {
        Typed { qp, qkey: QKEY }
    }
}

impl<Q: QueuePair> QueuePair for Typed<'_, Q> {
    fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    fn qp_type(&self) -> QpType {
        self.qp.qp_type()
    }

    fn modify(&self, attr: &QpAttr, mask: M) -> verbs_api::Result<()> {
        let (a, m) = for_type(self.qp.qp_type(), attr, mask, self.qkey);
        self.qp.modify(&a, m)
    }

    fn query(&self) -> verbs_api::Result<QpAttr> {
        self.qp.query()
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        self.qp.post_send(wrs)
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        self.qp.post_recv(wrs)
    }

    fn bind_mw(
        &self,
        mw: &dyn verbs_api::MemoryWindow,
        bind: &verbs_api::MwBind<'_>,
    ) -> verbs_api::Result<u32> {
        self.qp.bind_mw(mw, bind)
    }

    fn attach_mcast(&self, gid: &verbs_api::Gid, lid: u16) -> verbs_api::Result<()> {
        self.qp.attach_mcast(gid, lid)
    }

    fn detach_mcast(&self, gid: &verbs_api::Gid, lid: u16) -> verbs_api::Result<()> {
        self.qp.detach_mcast(gid, lid)
    }
}

/// RESET → INIT → RTR → RTS of a UD QP with `qkey`, sending from `sq_psn`: INIT takes
/// the P_Key index, the port and the Q_Key, RTR the state alone, RTS the send PSN.
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

/// The name perftest prints for a connection type (`Connection type : UD`).
pub fn type_name(t: QpType) -> &'static str {
    match t {
        QpType::Rc => "RC",
        QpType::Uc => "UC",
        QpType::Ud => "UD",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verbs_api::AccessFlags;

    fn rc_init() -> (QpAttr, M) {
        let a = QpAttr {
            qp_state: QpState::Init,
            port_num: 1,
            qp_access_flags: AccessFlags::REMOTE,
            ..Default::default()
        };
        (a, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)
    }

    #[test]
    fn rc_is_untouched_and_uc_loses_rcs_reliability_attributes() {
        let (a, m) = rc_init();
        assert_eq!(for_type(QpType::Rc, &a, m, QKEY), (a, m));
        assert_eq!(for_type(QpType::Uc, &a, m, QKEY), (a, m), "UC's INIT is RC's");
        let rtr = M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        assert_eq!(
            for_type(QpType::Uc, &a, rtr, QKEY).1,
            M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN
        );
        let rts = M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
        assert_eq!(for_type(QpType::Uc, &a, rts, QKEY).1, M::STATE | M::SQ_PSN);
    }

    #[test]
    fn ud_takes_a_qkey_at_init_the_state_at_rtr_and_the_psn_at_rts() {
        let (a, m) = rc_init();
        let (ua, um) = for_type(QpType::Ud, &a, m, 7);
        assert_eq!(um, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY);
        assert_eq!(ua.qkey, 7);
        let rtr = M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        assert_eq!(for_type(QpType::Ud, &a, rtr, 7).1, M::STATE);
        let rts = M::STATE | M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC;
        assert_eq!(for_type(QpType::Ud, &a, rts, 7).1, M::STATE | M::SQ_PSN);
        assert_eq!(for_type(QpType::Ud, &a, M::STATE, 7).1, M::STATE, "RESET, ERR");
    }
}
