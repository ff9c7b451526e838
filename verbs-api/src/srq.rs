//! Shared receive queues: `struct ibv_srq_attr` and `enum ibv_srq_attr_mask`
//! (`man ibv_create_srq`, `man ibv_modify_srq`, `man ibv_query_srq`,
//! `man ibv_post_srq_recv`).
//!
//! An SRQ is one receive queue that several QPs of a PD take their receives from, first
//! in first out whatever QP a message arrived on; the completion's `qp_num` names that
//! QP. A QP created with an SRQ has no receive queue of its own: `post_recv` on it fails
//! with EINVAL. An empty SRQ behaves as an empty receive queue would for the transport
//! (RC: RNR NAK and retries; UC and UD: the message is dropped).
//!
//! `srq_limit` is the low watermark: armed (non-zero), the SRQ raises
//! `IBV_EVENT_SRQ_LIMIT_REACHED` once when the number of receives in it drops below the
//! limit, and disarms itself (the limit reads 0 again) until it is armed again with
//! [`SharedReceiveQueue::modify`](crate::SharedReceiveQueue::modify). This is the hook for
//! refilling receives in batches.

use bitflags::bitflags;

/// `struct ibv_srq_attr`: the size of an SRQ and its limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SrqAttr {
    /// Receives the SRQ holds (granted values may be larger, as for QPs).
    pub max_wr: u32,
    /// SGEs per receive.
    pub max_sge: u32,
    /// The limit (low watermark); 0 when not armed.
    pub srq_limit: u32,
}

impl SrqAttr {
    /// `max_wr` receives of `max_sge` SGEs each, no limit armed.
    pub const fn new(max_wr: u32, max_sge: u32) -> SrqAttr {
        SrqAttr {
            max_wr,
            max_sge,
            srq_limit: 0,
        }
    }

    /// The same with the limit armed at `srq_limit`.
    pub const fn with_limit(self, srq_limit: u32) -> SrqAttr {
        SrqAttr { srq_limit, ..self }
    }
}

bitflags! {
    /// `enum ibv_srq_attr_mask`: which fields of an [`SrqAttr`] `ibv_modify_srq` sets.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
    pub struct SrqAttrMask: u32 {
        /// `IBV_SRQ_MAX_WR`: resize the SRQ (devices with `IBV_DEVICE_SRQ_RESIZE`).
        const MAX_WR = 1;
        /// `IBV_SRQ_LIMIT`: arm (non-zero) or disarm (0) the limit event.
        const LIMIT = 1 << 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_values_match_verbs_h() {
        assert_eq!(SrqAttrMask::MAX_WR.bits(), 1);
        assert_eq!(SrqAttrMask::LIMIT.bits(), 2);
        let a = SrqAttr::new(64, 1).with_limit(16);
        assert_eq!((a.max_wr, a.max_sge, a.srq_limit), (64, 1, 16));
    }
}
