//! QPs of the deterministic world (`man ibv_create_qp`, `ibv_modify_qp`,
//! `ibv_query_qp`, `ibv_post_send`, `ibv_post_recv`): the protocol core's QP
//! (`backend_sim_proto::qp::Qp`) attached to the world's network. A post runs at the
//! current virtual time and puts the frames it causes on the network at once; the QP's
//! peer is the QP `dest_qp_num` names, on the device its address vector's LID (or GID)
//! names.

use std::sync::Arc;

use backend_sim_proto::fabric::Port;
use backend_sim_proto::memory::MrTable;
use backend_sim_proto::qp::{AvCheck, Effect, PostCheck, Qp, QpConfig, QpLimits};
use backend_sim_proto::recv_queue::PostRecvError;
use verbs_api::{
    AhAttr, Error, Gid, PostError, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, QueueKind,
    QueuePair, RecvWr, Result, SendWr,
};

use crate::cq::DetCq;
use crate::handles::DetPd;
use crate::limits::gid;
use crate::refuse::refused;
use crate::shared::Shared;
use crate::srq::DetSrq;
use crate::world::{Device, QpSlot};

/// The device limits a modify checks against.
const LIMITS: QpLimits = QpLimits {
    max_qp_init_rd_atom: 16,
    max_qp_rd_atom: 16,
};

/// A queue pair of the deterministic world.
pub struct DetQp {
    shared: Arc<Shared>,
    qpn: u32,
    qp_type: QpType,
}

/// An address vector must name a device of the world: by GID with a GRH, by LID
/// otherwise.
struct Av<'a>(&'a [Device]);

impl AvCheck for Av<'_> {
    fn check_av(&self, ah: &AhAttr) -> std::result::Result<(), (&'static str, String)> {
        let n = self.0.len();
        if ah.is_global {
            let known = (0..n).any(|i| gid(i) == ah.grh.dgid);
            return if known {
                Ok(())
            } else {
                Err((
                    "ah_attr.grh.dgid",
                    format!("no device of the world has GID {}", ah.grh.dgid),
                ))
            };
        }
        if (1..=n).contains(&(ah.dlid as usize)) {
            Ok(())
        } else {
            Err((
                "ah_attr.dlid",
                format!("no device of the world has LID {}", ah.dlid),
            ))
        }
    }
}

impl DetQp {
    pub(crate) fn create(pd: &DetPd, attr: &QpInitAttr<'_, DetCq, DetSrq>) -> Result<DetQp> {
        let shared = &pd.ctx.shared;
        if attr.srq.is_some_and(|s| !s.is_of(shared)) {
            return Err(Error::invalid("ibv_create_qp", "an SRQ of another world"));
        }
        if attr.qp_type == QpType::Ud {
            return Err(refused(
                "ibv_create_qp: UD is not in the deterministic world yet (RC and UC are)",
            ));
        }
        if attr.create_flags != 0 {
            return Err(refused(format!(
                "ibv_create_qp: create_flags {:#x}",
                attr.create_flags
            )));
        }
        for cq in [attr.send_cq, attr.recv_cq] {
            if !Arc::ptr_eq(&cq.shared, shared) {
                return Err(Error::invalid("ibv_create_qp", "a CQ of another world"));
            }
        }
        let c = attr.cap;
        if c.max_send_wr > 1 << 14 || c.max_recv_wr > 1 << 14 || c.max_send_sge > 32 || c.max_recv_sge > 32 {
            return Err(Error::invalid(
                "ibv_create_qp",
                format!("{c:?} exceeds the device's limits"),
            ));
        }
        let cap = QpCap {
            max_send_wr: c.max_send_wr.max(1),
            max_recv_wr: c.max_recv_wr.max(1),
            max_send_sge: c.max_send_sge.max(1),
            max_recv_sge: c.max_recv_sge.max(1),
            max_inline_data: c.max_inline_data.max(64),
        };
        let mut w = shared.enter("ibv_create_qp")?;
        let qpn = w.fresh_qpn();
        let qp = Qp::create(QpConfig {
            qpn,
            pd: pd.handle,
            qp_type: attr.qp_type,
            cap,
            sq_sig_all: attr.sq_sig_all,
            srq: attr.srq.map(|s| s.srq.clone()),
            sw: w.sw,
            max_msg_sz: 1 << 31,
            mtu: 4096,
            roce: false,
        });
        w.qps.insert(
            qpn,
            QpSlot {
                dev: pd.ctx.dev,
                ctx: pd.ctx.id,
                port: Port::new(qp),
                send_cq: attr.send_cq.handle,
                recv_cq: attr.recv_cq.handle,
            },
        );
        Ok(DetQp {
            shared: shared.clone(),
            qpn,
            qp_type: attr.qp_type,
        })
    }

    /// A post of `n` WRs (`id(i)`: the `wr_id` of the `i`-th) by verb `call`: refused
    /// unless the QP's state is `ready` (else the reason `need`); `each` queues the
    /// `i`-th (and flushes it in ERR). Those before a refused WR stay posted; the
    /// frames they cause leave at once.
    fn post(
        &self,
        call: &'static str,
        n: usize,
        id: impl Fn(usize) -> u64,
        (ready, need): (impl Fn(QpState) -> bool, &'static str),
        mut each: impl FnMut(&mut Qp, &MrTable, usize) -> Result<()>,
    ) -> Result<(), PostError> {
        let fail = |index: usize, error: Error| PostError {
            index,
            wr_id: if index < n { id(index) } else { 0 },
            error,
        };
        let mut w = self.shared.enter(call).map_err(|e| fail(0, e))?;
        let w = &mut *w;
        let slot = w.qps.get_mut(&self.qpn).expect("a live QP is in its world");
        let state = slot.port.qp.state();
        let result = if ready(state) {
            (0..n).try_for_each(|i| {
                each(&mut slot.port.qp, &w.devices[slot.dev].mrs, i).map_err(|e| fail(i, e))
            })
        } else {
            let reason = need;
            Err(fail(
                0,
                Error::InvalidQpState {
                    call,
                    qpn: self.qpn,
                    state,
                    reason,
                },
            ))
        };
        w.progressed();
        w.pump();
        result
    }

    /// The refusal of a send WR, in the verbs' words.
    fn refusal(&self, c: PostCheck, cap: &QpCap) -> Error {
        let full = Error::QueueFull {
            queue: QueueKind::Send,
            qpn: self.qpn,
            capacity: cap.max_send_wr,
        };
        let why = match c {
            PostCheck::Full | PostCheck::FullUnpolled => return full,
            PostCheck::MisalignedAtomic => "the atomic's remote address is not 8-byte aligned",
            PostCheck::TooManySge => "more SGEs than max_send_sge",
            PostCheck::InlineTooLong => "more inline data than max_inline_data",
            PostCheck::InlineNotAllowed => "IBV_SEND_INLINE is for SEND and RDMA WRITE only",
            PostCheck::BadInlineSge => "an inline SGE outside the region its lkey names",
            PostCheck::NotUc => "UC has SEND and RDMA WRITE (with immediate) only",
            PostCheck::NotUd | PostCheck::NoUdDestination => "not a UD QP",
            PostCheck::UdDestination => "wr.ud (a UD destination) is for UD QPs",
            PostCheck::BadBind => "IBV_WR_BIND_MW needs its window (none exist here)",
        };
        Error::invalid("ibv_post_send", why)
    }
}

impl QueuePair for DetQp {
    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn qp_type(&self) -> QpType {
        self.qp_type
    }

    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let mut w = self.shared.enter("ibv_modify_qp")?;
        let w = &mut *w;
        let slot = w.qps.get_mut(&self.qpn).expect("a live QP is in its world");
        let t = slot.port.qp.handle_modify(attr, mask, &LIMITS, &Av(&w.devices))?;
        match t.effect {
            Effect::Reset => {
                slot.port.forget_connection();
                let cqs = [slot.send_cq, slot.recv_cq];
                w.clean_cqs(self.qpn, cqs);
            }
            Effect::Error => {
                // The ACKs owed leave first, then the QP goes to ERR.
                w.pump();
                if let Some(slot) = w.qps.get_mut(&self.qpn) {
                    slot.port.qp.enter_error();
                }
            }
            Effect::None | Effect::Connect | Effect::Resume { .. } => {}
        }
        w.progressed();
        w.pump();
        Ok(())
    }

    fn query(&self) -> Result<QpAttr> {
        let w = self.shared.enter("ibv_query_qp")?;
        Ok(w.qps[&self.qpn].port.qp.query())
    }

    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        let ready = |s: QpState| !matches!(s, QpState::Reset | QpState::Init | QpState::Rtr);
        let need = "send work requests need RTS (or SQD/ERR)";
        self.post(
            "ibv_post_send",
            wrs.len(),
            |i| wrs[i].wr_id,
            (ready, need),
            |qp, mrs, i| {
                qp.handle_post_send(&wrs[i], mrs, None)
                    .map_err(|c| self.refusal(c, &qp.attr().cap))?;
                qp.flush_posted_sends();
                Ok(())
            },
        )
    }

    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        let ready = |s: QpState| s != QpState::Reset;
        let need = "receive work requests need INIT or later";
        self.post(
            "ibv_post_recv",
            wrs.len(),
            |i| wrs[i].wr_id,
            (ready, need),
            |qp, _, i| {
                qp.handle_post_recv(&wrs[i]).map_err(|e| match e {
                    PostRecvError::Full => Error::QueueFull {
                        queue: QueueKind::Recv,
                        qpn: self.qpn,
                        capacity: qp.attr().cap.max_recv_wr,
                    },
                    PostRecvError::TooManySge => {
                        Error::invalid("ibv_post_recv", "more SGEs than max_recv_sge")
                    }
                    PostRecvError::HasSrq => Error::invalid("ibv_post_recv", "the QP has an SRQ"),
                })?;
                qp.flush_posted_recvs();
                Ok(())
            },
        )
    }

    fn attach_mcast(&self, _: &Gid, _: u16) -> Result<()> {
        Err(refused(
            "ibv_attach_mcast: multicast (UD) is not in the deterministic world yet",
        ))
    }

    fn detach_mcast(&self, _: &Gid, _: u16) -> Result<()> {
        Err(refused(
            "ibv_detach_mcast: multicast (UD) is not in the deterministic world yet",
        ))
    }
}

impl Drop for DetQp {
    fn drop(&mut self) {
        let mut w = self.shared.lock_any();
        if let Some(mut slot) = w.qps.remove(&self.qpn) {
            slot.port.qp.handle_destroy();
            w.clean_cqs(self.qpn, [slot.send_cq, slot.recv_cq]);
        }
    }
}
