//! Bit flags with libibverbs' names and values: `enum ibv_access_flags`,
//! `enum ibv_send_flags`, `enum ibv_wc_flags` and `enum ibv_qp_attr_mask`
//! (`<infiniband/verbs.h>`, `man ibv_reg_mr`, `man ibv_post_send`, `man ibv_poll_cq`,
//! `man ibv_modify_qp`).

use bitflags::bitflags;

bitflags! {
    /// `enum ibv_access_flags` (`man ibv_reg_mr`): what the local HCA and remote peers
    /// may do with a memory region, or (as `qp_access_flags`) which remote operations a
    /// QP accepts. `REMOTE_WRITE` and `REMOTE_ATOMIC` require `LOCAL_WRITE`.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct AccessFlags: u32 {
        /// `IBV_ACCESS_LOCAL_WRITE`: the HCA may write the region (receives, READ and
        /// atomic results land here).
        const LOCAL_WRITE = 1;
        /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA WRITE into the region.
        const REMOTE_WRITE = 1 << 1;
        /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA READ from the region.
        const REMOTE_READ = 1 << 2;
        /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may run atomics on 8-byte words of the region.
        const REMOTE_ATOMIC = 1 << 3;
        /// `IBV_ACCESS_MW_BIND`: memory windows may be bound to the region (`man
        /// ibv_alloc_mw`; IBA C10-73). A window that grants remote writes or atomics also
        /// needs `LOCAL_WRITE` here (C10-74).
        const MW_BIND = 1 << 4;
    }
}

impl AccessFlags {
    /// All four access rights (local write and the three remote ones; not `MW_BIND`).
    pub const ALL: AccessFlags = AccessFlags::LOCAL_WRITE
        .union(AccessFlags::REMOTE_WRITE)
        .union(AccessFlags::REMOTE_READ)
        .union(AccessFlags::REMOTE_ATOMIC);
    /// The rights that only make sense for remote peers.
    pub const REMOTE: AccessFlags = AccessFlags::REMOTE_WRITE
        .union(AccessFlags::REMOTE_READ)
        .union(AccessFlags::REMOTE_ATOMIC);

    /// `ibv_reg_mr`'s rule: remote write or atomic access requires local write.
    pub fn is_valid_for_mr(self) -> bool {
        !self.intersects(AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC)
            || self.contains(AccessFlags::LOCAL_WRITE)
    }
}

bitflags! {
    /// `enum ibv_send_flags` (`man ibv_post_send`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct SendFlags: u32 {
        /// `IBV_SEND_FENCE`: wait until prior RDMA READs and atomics have completed.
        const FENCE = 1;
        /// `IBV_SEND_SIGNALED`: generate a completion on success (always on error).
        const SIGNALED = 1 << 1;
        /// `IBV_SEND_SOLICITED`: set the solicited event indicator (wakes a CQ armed with
        /// solicited-only on the receiver).
        const SOLICITED = 1 << 2;
        /// `IBV_SEND_INLINE`: copy the gather list at post time; the buffers may be reused
        /// as soon as `post_send` returns. At most `max_inline_data` bytes.
        const INLINE = 1 << 3;
    }
}

bitflags! {
    /// `enum ibv_wc_flags` (`man ibv_poll_cq`).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct WcFlags: u32 {
        /// `IBV_WC_GRH`: a GRH is present (UD only).
        const GRH = 1;
        /// `IBV_WC_WITH_IMM`: `imm_data` is valid.
        const WITH_IMM = 1 << 1;
        /// `IBV_WC_IP_CSUM_OK`: an offloaded IP checksum was verified. rxe sets this bit
        /// instead of `WITH_INV` on the receive of a SEND_WITH_INV (it writes the kernel's
        /// `IB_WC_WITH_INVALIDATE`, 1 << 2, into the user's CQE), with the invalidated
        /// rkey in `imm_data` all the same.
        const IP_CSUM_OK = 1 << 2;
        /// `IBV_WC_WITH_INV`: a SEND_WITH_INV invalidated the rkey in `imm_data`
        /// (`ibv_wc`'s `invalidated_rkey`, which shares the union with `imm_data`).
        const WITH_INV = 1 << 3;
    }
}

bitflags! {
    /// `enum ibv_qp_attr_mask` (`man ibv_modify_qp`): which fields of a
    /// [`QpAttr`](crate::QpAttr) a modify call sets.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct QpAttrMask: u32 {
        /// `IBV_QP_STATE`
        const STATE = 1;
        /// `IBV_QP_CUR_STATE`
        const CUR_STATE = 1 << 1;
        /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`
        const EN_SQD_ASYNC_NOTIFY = 1 << 2;
        /// `IBV_QP_ACCESS_FLAGS`
        const ACCESS_FLAGS = 1 << 3;
        /// `IBV_QP_PKEY_INDEX`
        const PKEY_INDEX = 1 << 4;
        /// `IBV_QP_PORT`
        const PORT = 1 << 5;
        /// `IBV_QP_QKEY`
        const QKEY = 1 << 6;
        /// `IBV_QP_AV`
        const AV = 1 << 7;
        /// `IBV_QP_PATH_MTU`
        const PATH_MTU = 1 << 8;
        /// `IBV_QP_TIMEOUT`
        const TIMEOUT = 1 << 9;
        /// `IBV_QP_RETRY_CNT`
        const RETRY_CNT = 1 << 10;
        /// `IBV_QP_RNR_RETRY`
        const RNR_RETRY = 1 << 11;
        /// `IBV_QP_RQ_PSN`
        const RQ_PSN = 1 << 12;
        /// `IBV_QP_MAX_QP_RD_ATOMIC`
        const MAX_QP_RD_ATOMIC = 1 << 13;
        /// `IBV_QP_ALT_PATH`
        const ALT_PATH = 1 << 14;
        /// `IBV_QP_MIN_RNR_TIMER`
        const MIN_RNR_TIMER = 1 << 15;
        /// `IBV_QP_SQ_PSN`
        const SQ_PSN = 1 << 16;
        /// `IBV_QP_MAX_DEST_RD_ATOMIC`
        const MAX_DEST_RD_ATOMIC = 1 << 17;
        /// `IBV_QP_PATH_MIG_STATE`
        const PATH_MIG_STATE = 1 << 18;
        /// `IBV_QP_CAP`
        const CAP = 1 << 19;
        /// `IBV_QP_DEST_QPN`
        const DEST_QPN = 1 << 20;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_match_verbs_h() {
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(SendFlags::INLINE.bits(), 8);
        assert_eq!(QpAttrMask::DEST_QPN.bits(), 1 << 20);
        assert_eq!(QpAttrMask::MIN_RNR_TIMER.bits(), 32768);
        assert_eq!(WcFlags::WITH_IMM.bits(), 2);
        assert_eq!(WcFlags::WITH_INV.bits(), 8);
        assert_eq!(AccessFlags::MW_BIND.bits(), 16);
        assert_eq!(AccessFlags::ALL.bits(), 15);
    }

    #[test]
    fn remote_write_needs_local_write() {
        assert!(!AccessFlags::REMOTE_WRITE.is_valid_for_mr());
        assert!(!AccessFlags::REMOTE_ATOMIC.is_valid_for_mr());
        assert!(AccessFlags::REMOTE_READ.is_valid_for_mr());
        assert!((AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).is_valid_for_mr());
        assert!(AccessFlags::empty().is_valid_for_mr());
    }
}
