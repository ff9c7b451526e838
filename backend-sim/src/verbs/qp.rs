//! The QP handle (`struct ibv_qp`): the verbs go to the QP's state machine
//! ([`crate::qp`]); dropping it destroys the QP (`ibv_destroy_qp`).

use std::sync::Arc;

use verbs_api::{AsyncElement, PostError, QpAttr, QpAttrMask, QpType, QueuePair, RecvWr, Result, SendWr};

use crate::device::PdShared;
use crate::qp::QpShared;

/// A queue pair of the sim.
pub struct SimQp {
    pub(crate) qp: Arc<QpShared>,
    /// Keeps the PD (and through it the device) alive as long as the QP.
    pub(crate) pd: Arc<PdShared>,
}

impl QueuePair for SimQp {
    fn qp_num(&self) -> u32 {
        self.qp.qpn
    }
    fn qp_type(&self) -> QpType {
        self.qp.qp_type
    }
    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        self.qp.modify(attr, mask)
    }
    fn query(&self) -> Result<QpAttr> {
        Ok(self.qp.query())
    }
    fn post_send(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), PostError> {
        self.qp
            .post_send(wrs, &|ah| super::ah::route_of(ah, &self.pd.dev))
    }
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        self.qp.post_recv(wrs)
    }
}

impl Drop for SimQp {
    fn drop(&mut self) {
        self.pd.dev.qps.lock().remove(&self.qp.qpn);
        self.qp.destroy();
        self.pd.dev.events.forget(AsyncElement::Qp(self.qp.qpn));
    }
}
