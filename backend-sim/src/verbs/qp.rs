//! The QP handle (`struct ibv_qp`): the verbs go to the QP's state machine
//! ([`crate::qp`]); dropping it destroys the QP (`ibv_destroy_qp`).

use std::sync::Arc;

use verbs_api::{
    AsyncElement, Error, Gid, MemoryWindow, MwBind, PostError, QpAttr, QpAttrMask, QpCap, QpType, QueuePair,
    RecvWr, Result, SendWr,
};

use crate::device::PdShared;
use crate::qp::QpShared;

/// A queue pair of the sim.
pub struct SimQp {
    pub(crate) qp: Arc<QpShared>,
    /// Keeps the PD (and through it the device) alive as long as the QP.
    pub(crate) pd: Arc<PdShared>,
}

impl SimQp {
    /// `ibv_post_send` for a caller that reads inline data itself: `inline` is empty, or
    /// holds for each WR the pieces of its inline data (used when the WR has
    /// `SendFlags::INLINE`; its `sg_list` is then not read). A C program may pass inline
    /// data from any memory, where [`QueuePair::post_send`] takes it only from registered
    /// memory, named by the SGEs' lkeys. The checks are the same: the pieces count as
    /// the WR's SGEs against `max_send_sge`, their length against `max_inline_data`.
    #[inline]
    pub fn post_send_with_inline(
        &self,
        wrs: &[SendWr<'_>],
        inline: &[Option<&[&[u8]]>],
    ) -> std::result::Result<(), PostError> {
        let dev = &self.pd.dev;
        let r = self
            .qp
            .post_send(wrs, inline, &|ah| super::ah::route_of(ah, dev), &|b| {
                super::mw::bind_req(b, dev)
            });
        // The windows of the binds posted hold their new rkeys.
        let posted = r.as_ref().err().map_or(wrs.len(), |e| e.index);
        for b in wrs[..posted].iter().filter_map(|w| w.bind.as_ref()) {
            super::mw::bound(b);
        }
        r
    }
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
        self.post_send_with_inline(wrs, &[])
    }
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> std::result::Result<(), PostError> {
        self.qp.post_recv(wrs)
    }
    fn bind_mw(&self, mw: &dyn MemoryWindow, bind: &MwBind<'_>) -> Result<u32> {
        // libibverbs' inline `ibv_bind_mw()` refuses a region of another PD than the
        // window's with EPERM; the rest is the trait's.
        let sim_mw = mw.downcast_ref::<super::mw::SimMw>();
        let mr = bind
            .bind_info
            .mr
            .and_then(|m| m.downcast_ref::<super::pd::SimMr>());
        if let (Some(w), Some(m)) = (sim_mw, mr) {
            if w.pd_handle() != m.pd_handle() {
                return Err(Error::Os {
                    call: "ibv_bind_mw",
                    source: std::io::Error::from_raw_os_error(libc::EPERM),
                });
            }
        }
        verbs_api::mw::post_type1_bind(self, mw, bind)
    }

    fn attach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        self.pd.dev.mcast.attach(&self.qp, gid, lid)
    }
    fn detach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        self.pd.dev.mcast.detach(self.qp.qpn, self.qp.qp_type, gid, lid)
    }
}

impl SimQp {
    /// The capacities `ibv_create_qp` hands back for a QP created with `asked`: what it
    /// got, except where the profile's device does not write its rounding back (rxe keeps
    /// the WR counts asked there, while `ibv_query_qp` reports the rounded ones;
    /// `Switches::queue_sizing`).
    pub fn created_cap(&self, asked: QpCap) -> QpCap {
        let granted = self.qp.query().cap;
        self.pd
            .dev
            .profile
            .switches()
            .queue_sizing
            .qp_created_cap(asked, granted)
    }

    /// Whether the QP is attached to a multicast group (`ibv_destroy_qp` of the C ABI
    /// is EBUSY then, as uverbs answers; dropping the handle detaches it).
    pub fn is_mcast_attached(&self) -> bool {
        self.pd.dev.mcast.groups.is_attached(self.qp.qpn)
    }
}

impl Drop for SimQp {
    fn drop(&mut self) {
        self.pd.dev.mcast.detach_all(self.qp.qpn);
        self.pd.dev.qps.lock().remove(&self.qp.qpn);
        self.qp.destroy();
        self.pd.dev.events.forget(AsyncElement::Qp(self.qp.qpn));
    }
}
