//! Queue pairs: `ibv_create_qp` / `ibv_destroy_qp`, `ibv_modify_qp`, `ibv_query_qp`
//! (`man ibv_create_qp`, `man ibv_modify_qp`, `man ibv_query_qp`), and the conversions
//! between [`QpAttr`] and `struct ibv_qp_attr`. Posting lives in `post.rs`.
//!
//! The QP state machine is the provider's and the kernel's business; only when
//! `ibv_modify_qp` fails with EINVAL does the backend ask
//! [`verbs_api::transitions::check_modify`] to explain it (current and requested state,
//! missing or extra attributes). RC, UC and UD QPs are created alike; a QP created with an
//! SRQ keeps the SRQ alive and refuses `post_recv` with EINVAL (its receives come from the
//! SRQ), before the provider sees it. Destroying a QP first waits until the asynchronous
//! events the application took for it are acknowledged (`man ibv_get_async_event`).

use std::os::raw::c_int;
use std::sync::Arc;

use parking_lot::Mutex;
use rdma_sys::{
    ibv_ah_attr, ibv_attach_mcast, ibv_create_qp, ibv_destroy_qp, ibv_detach_mcast, ibv_gid,
    ibv_global_route, ibv_modify_qp, ibv_qp,
};
use rdma_sys::{ibv_qp_attr, ibv_qp_cap, ibv_qp_init_attr, ibv_query_qp};
use verbs_api::transitions::check_modify;
use verbs_api::{
    AccessFlags, AhAttr, AsyncElement, AsyncEventType, Error, Gid, GlobalRoute, Mtu, PostError, QpAttr,
    QpAttrMask, QpCap, QpInitAttr, QpState, QpType, QueuePair, RecvWr, Result, SendWr,
};

use crate::async_events::QpState as QpEvents;
use crate::cq::{CqInner, IbvCq};
use crate::errno::{last_errno, rc_errno};
use crate::pd::PdInner;
use crate::srq::{IbvSrq, SrqInner};

/// Every `IBV_QP_*` attribute bit up to `IBV_QP_DEST_QPN`: what `query` asks for.
const QUERY_ALL: QpAttrMask = QpAttrMask::all();

/// A queue pair (`struct ibv_qp`).
pub struct IbvQp {
    pub(crate) raw: *mut ibv_qp,
    pub(crate) qp_num: u32,
    pub(crate) qp_type: QpType,
    /// The capacities `ibv_create_qp` granted.
    pub(crate) cap: QpCap,
    events: Arc<QpEvents>,
    pub(crate) pd: Arc<PdInner>,
    _send_cq: Arc<CqInner>,
    _recv_cq: Arc<CqInner>,
    /// The SRQ the QP takes its receives from.
    srq: Option<Arc<SrqInner>>,
    /// The multicast groups it is attached to (detached before it is destroyed).
    mcast: Mutex<Vec<(Gid, u16)>>,
}

// SAFETY: `ibv_qp` is safe for multi-threaded access (crate docs: providers lock their
// queues); destroyed only in Drop.
unsafe impl Send for IbvQp {}
// SAFETY: as above.
unsafe impl Sync for IbvQp {}

impl std::fmt::Debug for IbvQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbvQp")
            .field("qp_num", &format_args!("{:#x}", self.qp_num))
            .field("qp_type", &self.qp_type)
            .field("cap", &self.cap)
            .field("srq", &self.srq.is_some())
            .finish()
    }
}

impl Drop for IbvQp {
    fn drop(&mut self) {
        let registry = &self.pd.ctx.registry;
        // Leave the table first, so that no event for this QP is queued after `forget`.
        registry.qps.lock().remove(&self.qp_num);
        registry.events.forget(AsyncElement::Qp(self.qp_num));
        for (gid, lid) in self.mcast.get_mut().drain(..) {
            let raw = ibv_gid { raw: gid.0 };
            // SAFETY: the QP is live; `raw` is a valid GID for the call. A failure leaves
            // the destroy below to report EBUSY, which a drop cannot.
            unsafe { ibv_detach_mcast(self.raw, &raw, lid) };
        }
        // SAFETY: the QP is live and destroyed once; its CQs, SRQ and PD outlive it (Arcs
        // held in fields, dropped after this). The async thread acknowledged every
        // libibverbs event for it, so the call does not wait.
        unsafe { ibv_destroy_qp(self.raw) };
    }
}

fn cap_to_raw(c: &QpCap) -> ibv_qp_cap {
    ibv_qp_cap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

fn cap_from_raw(c: &ibv_qp_cap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

pub(crate) fn ah_to_raw(a: &AhAttr) -> ibv_ah_attr {
    ibv_ah_attr {
        grh: ibv_global_route {
            dgid: ibv_gid { raw: a.grh.dgid.0 },
            flow_label: a.grh.flow_label,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: a.is_global as u8,
        port_num: a.port_num,
    }
}

pub(crate) fn ah_from_raw(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        grh: GlobalRoute {
            // SAFETY: both union variants are plain bytes covering all 16 bytes.
            dgid: Gid(unsafe { a.grh.dgid.raw }),
            flow_label: a.grh.flow_label,
            sgid_index: a.grh.sgid_index,
            hop_limit: a.grh.hop_limit,
            traffic_class: a.grh.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: a.is_global != 0,
        port_num: a.port_num,
    }
}

/// [`QpAttr`] to `struct ibv_qp_attr`, every field (the mask decides what is read).
pub(crate) fn qp_attr_to_raw(a: &QpAttr) -> ibv_qp_attr {
    // SAFETY: all-zero is a valid ibv_qp_attr (integers, and unions of bytes).
    let mut r: ibv_qp_attr = unsafe { std::mem::zeroed() };
    r.qp_state = a.qp_state as u32;
    r.cur_qp_state = a.cur_qp_state as u32;
    r.path_mtu = a.path_mtu as u32;
    r.qkey = a.qkey;
    r.rq_psn = a.rq_psn;
    r.sq_psn = a.sq_psn;
    r.dest_qp_num = a.dest_qp_num;
    r.qp_access_flags = a.qp_access_flags.bits();
    r.cap = cap_to_raw(&a.cap);
    r.ah_attr = ah_to_raw(&a.ah_attr);
    r.pkey_index = a.pkey_index;
    r.en_sqd_async_notify = a.en_sqd_async_notify as u8;
    r.sq_draining = a.sq_draining as u8;
    r.max_rd_atomic = a.max_rd_atomic;
    r.max_dest_rd_atomic = a.max_dest_rd_atomic;
    r.min_rnr_timer = a.min_rnr_timer;
    r.port_num = a.port_num;
    r.timeout = a.timeout;
    r.retry_cnt = a.retry_cnt;
    r.rnr_retry = a.rnr_retry;
    r
}

/// `struct ibv_qp_attr` to [`QpAttr`]. A state libibverbs reports outside the IB state
/// machine (`IBV_QPS_UNKNOWN`) reads as `Err`; an MTU of 0 (never set) as the default.
pub(crate) fn qp_attr_from_raw(r: &ibv_qp_attr) -> QpAttr {
    QpAttr {
        qp_state: QpState::from_raw(r.qp_state).unwrap_or(QpState::Err),
        cur_qp_state: QpState::from_raw(r.cur_qp_state).unwrap_or(QpState::Err),
        path_mtu: Mtu::from_raw(r.path_mtu).unwrap_or_default(),
        qkey: r.qkey,
        rq_psn: r.rq_psn,
        sq_psn: r.sq_psn,
        dest_qp_num: r.dest_qp_num,
        qp_access_flags: AccessFlags::from_bits_truncate(r.qp_access_flags),
        cap: cap_from_raw(&r.cap),
        ah_attr: ah_from_raw(&r.ah_attr),
        pkey_index: r.pkey_index,
        en_sqd_async_notify: r.en_sqd_async_notify != 0,
        sq_draining: r.sq_draining != 0,
        max_rd_atomic: r.max_rd_atomic,
        max_dest_rd_atomic: r.max_dest_rd_atomic,
        min_rnr_timer: r.min_rnr_timer,
        port_num: r.port_num,
        timeout: r.timeout,
        retry_cnt: r.retry_cnt,
        rnr_retry: r.rnr_retry,
    }
}

/// `ibv_create_qp_ex` with the attributes of `init` and `create_flags`; the granted
/// capacities are written back to `init`. NULL with `errno` set on failure.
fn create_ex(pd: &PdInner, init: &mut ibv_qp_init_attr, create_flags: u32) -> *mut ibv_qp {
    use rdma_sys::{ibv_qp_init_attr_ex, ibv_qp_init_attr_mask};
    // SAFETY: all-zero is a valid ibv_qp_init_attr_ex (pointers may be NULL).
    let mut ex: ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    ex.send_cq = init.send_cq;
    ex.recv_cq = init.recv_cq;
    ex.srq = init.srq;
    ex.cap = init.cap;
    ex.qp_type = init.qp_type;
    ex.sq_sig_all = init.sq_sig_all;
    ex.pd = pd.raw;
    ex.comp_mask =
        (ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD | ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_CREATE_FLAGS).0;
    ex.create_flags = create_flags;
    // SAFETY: the context, PD, CQs and SRQ are live; `ex` is valid for the call.
    let raw = unsafe { rdma_sys::ibv_create_qp_ex(pd.ctx.raw, &mut ex) }.unwrap_or(std::ptr::null_mut());
    init.cap = ex.cap;
    raw
}

fn qp_type_from_raw(t: u32) -> QpType {
    match t {
        3 => QpType::Uc,
        4 => QpType::Ud,
        _ => QpType::Rc,
    }
}

impl IbvQp {
    /// `ibv_create_qp`; the granted capacities are kept for [`QueuePair::query`].
    pub(crate) fn create(pd: Arc<PdInner>, attr: &QpInitAttr<'_, IbvCq, IbvSrq>) -> Result<IbvQp> {
        for cq in [attr.send_cq, attr.recv_cq] {
            // A CQ of another context would be handed to this context's provider, which
            // casts it to its own CQ structure.
            if !Arc::ptr_eq(&cq.inner.ctx, &pd.ctx) {
                return Err(Error::invalid(
                    "ibv_create_qp",
                    "the CQ belongs to another device context than the PD",
                ));
            }
        }
        if let Some(srq) = attr.srq {
            // The same hazard: the provider would cast it to its own SRQ structure.
            if !Arc::ptr_eq(&srq.inner.pd.ctx, &pd.ctx) {
                return Err(Error::invalid(
                    "ibv_create_qp",
                    "the SRQ belongs to another device context than the PD",
                ));
            }
        }
        // SAFETY: all-zero is a valid ibv_qp_init_attr (pointers may be NULL: no SRQ).
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = attr.send_cq.inner.raw;
        init.recv_cq = attr.recv_cq.inner.raw;
        init.cap = cap_to_raw(&attr.cap);
        init.qp_type = attr.qp_type as u32;
        init.sq_sig_all = attr.sq_sig_all as c_int;
        init.srq = attr.srq.map_or(std::ptr::null_mut(), |s| s.inner.raw);
        let raw = if attr.create_flags == 0 {
            // SAFETY: the PD, both CQs and the SRQ (if any) are live and of this context;
            // `init` is valid and written back with the granted capacities.
            unsafe { ibv_create_qp(pd.raw, &mut init) }
        } else {
            create_ex(&pd, &mut init, attr.create_flags)
        };
        if raw.is_null() {
            let e = last_errno();
            return Err(match e {
                libc::EINVAL => Error::invalid(
                    "ibv_create_qp",
                    format!(
                        "a {:?} QP with {:?}{} exceeds what the device allows \
                         (max_qp_wr, max_sge, max_inline_data)",
                        attr.qp_type,
                        attr.cap,
                        if attr.srq.is_some() { " on an SRQ" } else { "" }
                    ),
                ),
                libc::ENOMEM => Error::NoMemory {
                    call: "ibv_create_qp",
                    reason: format!("cannot allocate a QP with {:?}", attr.cap),
                },
                libc::EOPNOTSUPP | libc::ENOSYS | libc::EPROTONOSUPPORT => Error::Unsupported {
                    backend: "ibverbs",
                    what: format!("{:?} QPs", attr.qp_type),
                },
                e => Error::from_errno("ibv_create_qp", e),
            });
        }
        // SAFETY: the QP is live; `qp_num` and `qp_type` are plain fields.
        let (qp_num, qp_type) = unsafe { ((*raw).qp_num, (*raw).qp_type) };
        let events = Arc::new(QpEvents::default());
        pd.ctx.registry.qps.lock().insert(qp_num, events.clone());
        Ok(IbvQp {
            raw,
            qp_num,
            qp_type: qp_type_from_raw(qp_type),
            cap: cap_from_raw(&init.cap),
            events,
            pd,
            _send_cq: attr.send_cq.inner.clone(),
            _recv_cq: attr.recv_cq.inner.clone(),
            srq: attr.srq.map(|s| s.inner.clone()),
            mcast: Mutex::new(Vec::new()),
        })
    }

    /// The `struct ibv_qp *`, valid while this QP lives.
    pub fn as_raw(&self) -> *mut ibv_qp {
        self.raw
    }

    /// The capacities `ibv_create_qp` granted (also in [`QueuePair::query`]'s `cap`).
    pub fn granted_cap(&self) -> QpCap {
        self.cap
    }

    /// The last QP error event (`IBV_EVENT_QP_FATAL`, `IBV_EVENT_QP_REQ_ERR`,
    /// `IBV_EVENT_QP_ACCESS_ERR`) the device reported for this QP, if any (the event is
    /// also queued for [`verbs_api::Context::get_async_event`]).
    pub fn fatal_event(&self) -> Option<AsyncEventType> {
        *self.events.fatal.lock()
    }

    /// The error of a `post_recv` on a QP that takes its receives from an SRQ.
    #[cold]
    #[inline(never)]
    fn recv_on_srq_qp(&self, wrs: &[RecvWr<'_>]) -> PostError {
        PostError {
            index: 0,
            wr_id: wrs[0].wr_id,
            error: Error::invalid(
                "ibv_post_recv",
                format!(
                    "QP {:#x} takes its receives from a shared receive queue: post them to the SRQ \
                     (ibv_post_srq_recv)",
                    self.qp_num
                ),
            ),
        }
    }
}

impl IbvQp {
    /// `ibv_attach_mcast` or `ibv_detach_mcast` (`attach`) of (`gid`, `lid`).
    fn mcast_call(&self, attach: bool, gid: &Gid, lid: u16) -> Result<()> {
        let raw = ibv_gid { raw: gid.0 };
        let mut list = self.mcast.lock();
        // SAFETY: the QP is live; `raw` is a valid GID for the call.
        let rc = unsafe {
            if attach {
                ibv_attach_mcast(self.raw, &raw, lid)
            } else {
                ibv_detach_mcast(self.raw, &raw, lid)
            }
        };
        let call = if attach {
            "ibv_attach_mcast"
        } else {
            "ibv_detach_mcast"
        };
        if rc != 0 {
            let e = rc_errno(rc);
            if e == libc::EINVAL {
                // Say which of the kernel's checks it was, if one.
                let link = self.pd.ctx.link_layer();
                verbs_api::mcast::check_attach(call, self.qp_type, gid, lid, link)?;
            }
            return Err(Error::from_errno(call, e));
        }
        match attach {
            true if !list.contains(&(*gid, lid)) => list.push((*gid, lid)),
            true => {}
            false => list.retain(|p| *p != (*gid, lid)),
        }
        Ok(())
    }
}

impl QueuePair for IbvQp {
    fn qp_num(&self) -> u32 {
        self.qp_num
    }

    fn qp_type(&self) -> QpType {
        self.qp_type
    }

    fn attach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        self.mcast_call(true, gid, lid)
    }

    fn detach_mcast(&self, gid: &Gid, lid: u16) -> Result<()> {
        self.mcast_call(false, gid, lid)
    }

    fn modify(&self, attr: &QpAttr, mask: QpAttrMask) -> Result<()> {
        let mut raw = qp_attr_to_raw(attr);
        // SAFETY: the QP is live; `raw` is a valid attribute struct; the mask bits are
        // libibverbs' IBV_QP_* values (checked in the tests).
        let rc = unsafe { ibv_modify_qp(self.raw, &mut raw, mask.bits() as c_int) };
        if rc == 0 {
            return Ok(());
        }
        let e = rc_errno(rc);
        if e == libc::EINVAL {
            // Explain the EINVAL in words when the state machine says why.
            if let Ok(cur) = self.state() {
                check_modify(cur, self.qp_type, attr, mask)?;
            }
        }
        Err(Error::from_errno("ibv_modify_qp", e))
    }

    fn query(&self) -> Result<QpAttr> {
        // SAFETY: all-zero is valid for both out-structs.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the QP is live; both out-pointers are valid.
        let rc = unsafe { ibv_query_qp(self.raw, &mut attr, QUERY_ALL.bits() as c_int, &mut init) };
        if rc != 0 {
            return Err(Error::from_errno("ibv_query_qp", rc_errno(rc)));
        }
        let mut q = qp_attr_from_raw(&attr);
        // What the device reports now; some providers leave the capacities out of
        // ibv_query_qp, then the ones ibv_create_qp granted stand. (rxe on Linux 6.1 rounds
        // queues up to 2^n - 1 entries but writes only the requested sizes back at create
        // time; its ibv_query_qp reports the real ones.)
        if q.cap.max_send_wr == 0 && q.cap.max_recv_wr == 0 {
            q.cap = self.cap;
        }
        Ok(q)
    }

    #[inline]
    fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<(), PostError> {
        crate::post::post_send(self, wrs)
    }

    #[inline]
    fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<(), PostError> {
        // Checked here, not left to the provider: the QP has no receive queue of its own,
        // and what a provider does with the post is its own (rxe: EINVAL with bad_wr NULL,
        // rdma-core providers/rxe/rxe.c rxe_post_recv).
        if self.srq.is_some() && !wrs.is_empty() {
            return Err(self.recv_on_srq_qp(wrs));
        }
        crate::post::post_recv(self, wrs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_sys::ibv_qp_attr_mask as M;
    use verbs_api::QpAttrMask as Q;

    #[test]
    fn mask_bits_match_verbs_h() {
        for (ours, theirs) in [
            (Q::STATE, M::IBV_QP_STATE),
            (Q::CUR_STATE, M::IBV_QP_CUR_STATE),
            (Q::EN_SQD_ASYNC_NOTIFY, M::IBV_QP_EN_SQD_ASYNC_NOTIFY),
            (Q::ACCESS_FLAGS, M::IBV_QP_ACCESS_FLAGS),
            (Q::PKEY_INDEX, M::IBV_QP_PKEY_INDEX),
            (Q::PORT, M::IBV_QP_PORT),
            (Q::QKEY, M::IBV_QP_QKEY),
            (Q::AV, M::IBV_QP_AV),
            (Q::PATH_MTU, M::IBV_QP_PATH_MTU),
            (Q::TIMEOUT, M::IBV_QP_TIMEOUT),
            (Q::RETRY_CNT, M::IBV_QP_RETRY_CNT),
            (Q::RNR_RETRY, M::IBV_QP_RNR_RETRY),
            (Q::RQ_PSN, M::IBV_QP_RQ_PSN),
            (Q::MAX_QP_RD_ATOMIC, M::IBV_QP_MAX_QP_RD_ATOMIC),
            (Q::ALT_PATH, M::IBV_QP_ALT_PATH),
            (Q::MIN_RNR_TIMER, M::IBV_QP_MIN_RNR_TIMER),
            (Q::SQ_PSN, M::IBV_QP_SQ_PSN),
            (Q::MAX_DEST_RD_ATOMIC, M::IBV_QP_MAX_DEST_RD_ATOMIC),
            (Q::PATH_MIG_STATE, M::IBV_QP_PATH_MIG_STATE),
            (Q::CAP, M::IBV_QP_CAP),
            (Q::DEST_QPN, M::IBV_QP_DEST_QPN),
        ] {
            assert_eq!(ours.bits(), theirs.0, "{ours:?}");
        }
        assert!(QUERY_ALL.bits() < M::IBV_QP_RATE_LIMIT.0);
    }

    fn sample() -> QpAttr {
        QpAttr {
            qp_state: QpState::Rtr,
            cur_qp_state: QpState::Init,
            path_mtu: Mtu::Mtu4096,
            qkey: 0x1111_1111,
            rq_psn: 0x00ab_cdef,
            sq_psn: 0x0012_3456,
            dest_qp_num: 0x0000_0042,
            qp_access_flags: AccessFlags::REMOTE,
            cap: QpCap {
                max_send_wr: 16,
                max_recv_wr: 32,
                max_send_sge: 2,
                max_recv_sge: 3,
                max_inline_data: 64,
            },
            ah_attr: AhAttr {
                grh: GlobalRoute {
                    dgid: Gid::from(std::net::Ipv4Addr::new(10, 77, 0, 1)),
                    flow_label: 0x12345,
                    sgid_index: 1,
                    hop_limit: 64,
                    traffic_class: 0x20,
                },
                dlid: 7,
                sl: 3,
                src_path_bits: 1,
                static_rate: 2,
                is_global: true,
                port_num: 1,
            },
            pkey_index: 5,
            en_sqd_async_notify: true,
            sq_draining: false,
            max_rd_atomic: 4,
            max_dest_rd_atomic: 8,
            min_rnr_timer: 12,
            port_num: 1,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 6,
        }
    }

    #[test]
    fn qp_attr_fields_land_where_libibverbs_reads_them() {
        let r = qp_attr_to_raw(&sample());
        assert_eq!(r.qp_state, rdma_sys::ibv_qp_state::IBV_QPS_RTR);
        assert_eq!(r.cur_qp_state, rdma_sys::ibv_qp_state::IBV_QPS_INIT);
        assert_eq!(r.path_mtu, rdma_sys::ibv_mtu::IBV_MTU_4096);
        assert_eq!(r.qkey, 0x1111_1111);
        assert_eq!(r.rq_psn, 0x00ab_cdef);
        assert_eq!(r.sq_psn, 0x0012_3456);
        assert_eq!(r.dest_qp_num, 0x42);
        assert_eq!(r.qp_access_flags, 0b1110);
        assert_eq!(r.cap.max_recv_sge, 3);
        // SAFETY: reading a byte-array union variant.
        let dgid = unsafe { r.ah_attr.grh.dgid.raw };
        assert_eq!(dgid[10..], [0xff, 0xff, 10, 77, 0, 1]);
        assert_eq!(r.ah_attr.grh.flow_label, 0x12345);
        assert_eq!(r.ah_attr.grh.sgid_index, 1);
        assert_eq!(r.ah_attr.grh.hop_limit, 64);
        assert_eq!(r.ah_attr.grh.traffic_class, 0x20);
        assert_eq!(
            (
                r.ah_attr.dlid,
                r.ah_attr.sl,
                r.ah_attr.is_global,
                r.ah_attr.port_num
            ),
            (7, 3, 1, 1)
        );
        assert_eq!((r.pkey_index, r.en_sqd_async_notify), (5, 1));
        assert_eq!(
            (r.max_rd_atomic, r.max_dest_rd_atomic, r.min_rnr_timer),
            (4, 8, 12)
        );
        assert_eq!((r.port_num, r.timeout, r.retry_cnt, r.rnr_retry), (1, 14, 7, 6));
    }

    #[test]
    fn qp_attr_roundtrip() {
        let a = sample();
        assert_eq!(qp_attr_from_raw(&qp_attr_to_raw(&a)), a);
        assert_eq!(
            qp_attr_from_raw(&qp_attr_to_raw(&QpAttr::default())),
            QpAttr::default()
        );
    }

    #[test]
    fn unknown_raw_values_do_not_panic() {
        let mut r = qp_attr_to_raw(&QpAttr::default());
        r.qp_state = 7; // IBV_QPS_UNKNOWN
        r.path_mtu = 0;
        let a = qp_attr_from_raw(&r);
        assert_eq!(a.qp_state, QpState::Err);
        assert_eq!(a.path_mtu, Mtu::default());
        assert_eq!(qp_type_from_raw(rdma_sys::ibv_qp_type::IBV_QPT_UD), QpType::Ud);
    }
}
