//! Shared receive queues (`man ibv_create_srq`, `man ibv_post_srq_recv`,
//! `man ibv_modify_srq`, `man ibv_query_srq`, `man ibv_destroy_srq`).
//!
//! The SRQ itself is the protocol core's
//! [`SharedRecvQueue`](backend_sim_proto::recv_queue::SharedRecvQueue): its FIFO, its
//! size and its limit, and the rules they follow (rxe's, which arm a limit given at
//! create time). Each QP created with it holds it, so it lives as long as its last QP:
//! `ibv_destroy_srq` of an SRQ that QPs still use fails with EBUSY on a real device
//! (`ib_destroy_srq_user`), and with handles that own what they use that cannot happen
//! here. Dropping a [`SimSrq`] disarms its limit (nobody could take the event) and, as
//! `ibv_destroy_srq` does, waits until every asynchronous event taken for it is
//! acknowledged.

use std::sync::Arc;

use verbs_api::{AsyncElement, PostError, RecvWr, Result, SharedReceiveQueue, SrqAttr, SrqAttrMask};

use crate::device::PdShared;
use backend_sim_proto::recv_queue::SharedRecvQueue;

/// A shared receive queue of the sim.
pub struct SimSrq {
    pub(crate) srq: Arc<SharedRecvQueue>,
    /// Keeps the PD (and through it the device) alive as long as the SRQ handle.
    pub(crate) pd: Arc<PdShared>,
}

impl SharedReceiveQueue for SimSrq {
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        self.srq.post_srq_recv(wrs)
    }

    fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        let dev = &self.pd.dev;
        self.srq.modify(
            attr,
            mask,
            dev.attr.max_srq_wr,
            dev.profile.switches().queue_sizing,
        )
    }

    fn query(&self) -> Result<SrqAttr> {
        Ok(self.srq.query())
    }

    fn handle(&self) -> u32 {
        self.srq.handle()
    }
}

impl SimSrq {
    /// The attributes `ibv_create_srq` hands back for an SRQ created with `asked`: what it
    /// holds, except where the profile's device does not write its rounding back (rxe,
    /// whose `ibv_query_srq` reports it all the same; `Switches::queue_sizing`).
    pub fn created_attr(&self, asked: &SrqAttr) -> SrqAttr {
        let held = self.srq.query();
        let sizing = self.pd.dev.profile.switches().queue_sizing;
        SrqAttr {
            max_wr: sizing.srq_created_max_wr(asked.max_wr, held.max_wr),
            ..held
        }
    }
}

impl Drop for SimSrq {
    fn drop(&mut self) {
        self.srq.disarm();
        self.pd.dev.events.forget(AsyncElement::Srq(self.srq.handle()));
    }
}
