//! Shared receive queues of the deterministic world (`man ibv_create_srq`,
//! `ibv_post_srq_recv`, `ibv_modify_srq`, `ibv_query_srq`).
//!
//! The SRQ is the protocol core's
//! [`SharedRecvQueue`](backend_sim_proto::recv_queue::SharedRecvQueue): its FIFO, its size
//! and its limit, and the rules they follow. Each QP created with it holds it, and its
//! responder takes receives from it in the world's one thread; taking one below the
//! armed limit raises `IBV_EVENT_SRQ_LIMIT_REACHED` on that QP's context, in the virtual
//! time the receive was taken. Whether a limit given at creation is armed is the world's
//! profile's to decide ([`Switches`]: rxe arms it, mlx5 and the man page ignore it); the
//! SRQ holds what was asked, as the world's other queues do.
//!
//! [`Switches`]: backend_sim_proto::switches::Switches

use std::sync::Arc;

use backend_sim_proto::queue_sizing::QueueSizing;
use backend_sim_proto::recv_queue::SharedRecvQueue;
use verbs_api::{Error, PostError, RecvWr, Result, SharedReceiveQueue, SrqAttr, SrqAttrMask};

use crate::handles::DetPd;
use crate::limits::{MAX_SRQ_SGE, MAX_SRQ_WR};
use crate::shared::Shared;

/// A shared receive queue of the deterministic world.
pub struct DetSrq {
    shared: Arc<Shared>,
    /// What the QPs created with it hold too.
    pub(crate) srq: Arc<SharedRecvQueue>,
}

impl DetSrq {
    /// `ibv_create_srq` on `pd`: `max_wr` in `1..=MAX_SRQ_WR` and `max_sge` up to
    /// [`MAX_SRQ_SGE`] (0 is granted as 1), else EINVAL.
    pub(crate) fn create(pd: &DetPd, attr: &SrqAttr) -> Result<DetSrq> {
        let shared = &pd.ctx.shared;
        let mut w = shared.enter("ibv_create_srq")?;
        if attr.max_wr == 0 || attr.max_wr > MAX_SRQ_WR {
            return Err(Error::InvalidAttr {
                name: "max_wr",
                reason: format!("{} is outside 1..={MAX_SRQ_WR} (max_srq_wr)", attr.max_wr),
            });
        }
        if attr.max_sge > MAX_SRQ_SGE {
            return Err(Error::InvalidAttr {
                name: "max_sge",
                reason: format!(
                    "{} exceeds the device limit {MAX_SRQ_SGE} (max_srq_sge)",
                    attr.max_sge
                ),
            });
        }
        let limit = if w.sw.srq_limit_at_create {
            attr.srq_limit
        } else {
            0
        };
        let handle = w.fresh_srq();
        w.progressed();
        Ok(DetSrq {
            shared: shared.clone(),
            srq: Arc::new(SharedRecvQueue::new(
                handle,
                attr.max_wr,
                attr.max_sge.max(1),
                limit,
            )),
        })
    }

    /// Whether it belongs to the world `shared`.
    pub(crate) fn is_of(&self, shared: &Arc<Shared>) -> bool {
        Arc::ptr_eq(&self.shared, shared)
    }
}

impl SharedReceiveQueue for DetSrq {
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let mut w = self
            .shared
            .enter("ibv_post_srq_recv")
            .map_err(|error| PostError {
                index: 0,
                wr_id: wrs.first().map_or(0, |wr| wr.wr_id),
                error,
            })?;
        // A post is a step of the program (its waits' budget starts again), though it
        // sends nothing: a SEND refused for want of a receive comes back by itself, after
        // its RNR wait.
        w.progressed();
        self.srq.post_srq_recv(wrs)
    }

    fn modify(&self, attr: &SrqAttr, mask: SrqAttrMask) -> Result<()> {
        let mut w = self.shared.enter("ibv_modify_srq")?;
        w.progressed();
        self.srq.modify(attr, mask, MAX_SRQ_WR, QueueSizing::AsAsked)
    }

    fn query(&self) -> Result<SrqAttr> {
        self.shared.check("ibv_query_srq")?;
        Ok(self.srq.query())
    }

    fn handle(&self) -> u32 {
        self.srq.handle()
    }
}

impl Drop for DetSrq {
    /// Disarms the limit: with the handle gone nobody could take its event (the QPs
    /// still created with it keep taking receives from it).
    fn drop(&mut self) {
        self.srq.disarm();
    }
}
