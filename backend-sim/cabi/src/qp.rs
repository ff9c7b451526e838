//! Queue pairs (`man ibv_create_qp`, `man ibv_create_qp_ex`, `man ibv_modify_qp`,
//! `man ibv_query_qp`, `man ibv_destroy_qp`, `man ibv_qp_to_qp_ex`).
//!
//! Every QP is built as a `struct ibv_qp_ex` (whose first part is `struct ibv_qp`).
//! `ibv_qp_to_qp_ex` hands the extended part out only for QPs created with
//! `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`, as libibverbs does; its `ibv_wr_*` builder is in
//! [`crate::qp_ex`], the posting verbs in [`crate::post`].

use std::cell::UnsafeCell;
use std::ffi::{c_int, c_void};

use parking_lot::Mutex;
use verbs_api::{
    AccessFlags, AhAttr, Gid, GlobalRoute, Mtu, ProtectionDomain, QpAttr, QpAttrMask, QpCap, QpInitAttr,
    QpOf, QpState, QpType, QueuePair,
};

use crate::abi::{
    ibv_ah_attr, ibv_context, ibv_cq, ibv_gid, ibv_global_route, ibv_pd, ibv_qp, ibv_qp_attr, ibv_qp_cap,
    ibv_qp_ex, ibv_qp_init_attr, ibv_qp_init_attr_ex, ibv_srq, IBV_QP_INIT_ATTR_CREATE_FLAGS,
    IBV_QP_INIT_ATTR_PD, IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, SUPPORTED_SEND_OPS,
};
use crate::context::{self, Context};
use crate::cq::Cq;
use crate::ffi::{errno_of, errno_verb, ptr_verb, value_verb, Errno};
use crate::live::{self, Kind, Object};
use crate::pd::{next_handle, Pd};
use crate::runtime::B;
use crate::srq::Srq;

/// WRs converted on the stack per round of a post call (`ibv_post_send`,
/// `ibv_wr_complete`, `ibv_post_recv`).
pub const POST_BATCH: usize = 16;

/// A queue pair.
#[repr(C)]
pub struct Qp {
    /// What programs see, shared with them (they write `wr_id` and `wr_flags`).
    pub c: UnsafeCell<ibv_qp_ex>,
    /// The sim's QP.
    pub sim: QpOf<B>,
    pd: *const Pd,
    send_cq: *const Cq,
    recv_cq: *const Cq,
    srq: *const Srq,
    sq_sig_all: bool,
    /// `enum ibv_qp_type`.
    pub qp_type: u32,
    /// Created for the `ibv_wr_*` interface, with these `IBV_QP_EX_WITH_*` operations.
    send_ops: Option<u64>,
    /// The QP's `max_inline_data`, as granted.
    pub max_inline: usize,
    /// The `ibv_wr_*` builder's pending WRs.
    pub builder: Mutex<crate::qp_ex::Builder>,
}

// SAFETY: `#[repr(C)]` with the `ibv_qp_ex` (and so the `ibv_qp`) first.
unsafe impl Object for Qp {
    const KIND: Kind = Kind::Qp;
    type C = ibv_qp_ex;
}

impl Qp {
    /// The QP behind a program's `ibv_qp *`, looked up.
    ///
    /// # Safety
    ///
    /// See [`live::get`].
    pub unsafe fn get<'a>(qp: *const ibv_qp) -> Result<&'a Qp, Errno> {
        // SAFETY: forwarded contract; an `ibv_qp *` of ours is the `ibv_qp_ex`'s address.
        unsafe { live::get::<Qp>(qp.cast()) }
    }

    /// The QP's PD.
    pub fn pd(&self) -> &Pd {
        // SAFETY: the QP holds a count on its PD.
        unsafe { &*self.pd }
    }

    /// The `IBV_QP_EX_WITH_*` operations it was created with, if for `ibv_wr_*`.
    pub fn send_ops(&self) -> Option<u64> {
        self.send_ops
    }

    fn set_state(&self, state: u32) {
        // SAFETY: the C part is ours to write; programs only read `state` (libibverbs
        // writes it after a successful modify or query, as here).
        unsafe { (*self.c.get()).qp_base.state = state };
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let qpn = self.sim.qp_num();
        self.pd().ctx().elements.lock().qps.remove(&qpn);
        // SAFETY: the QP holds a count on each of these; each is given up once.
        unsafe {
            (*self.send_cq).release();
            (*self.recv_cq).release();
            if !self.srq.is_null() {
                (*self.srq).release();
            }
            (*self.pd).release();
        }
    }
}

/// What `ibv_create_qp` and `ibv_create_qp_ex` have in common.
struct Init {
    pd: *mut ibv_pd,
    qp_context: *mut c_void,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    srq: *mut ibv_srq,
    cap: *mut ibv_qp_cap,
    qp_type: u32,
    sq_sig_all: c_int,
    send_ops: Option<u64>,
    /// `IBV_QP_CREATE_*` flags (checked against what the device takes).
    create_flags: u32,
}

fn qp_type(t: u32) -> Result<QpType, Errno> {
    match t {
        2 => Ok(QpType::Rc),
        3 => Ok(QpType::Uc),
        4 => Ok(QpType::Ud),
        // IBV_QPT_RAW_PACKET, IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV, IBV_QPT_DRIVER.
        8..=10 | 0xff => Err(libc::EOPNOTSUPP),
        _ => Err(libc::EINVAL),
    }
}

fn create(init: Init) -> Result<*mut ibv_qp, Errno> {
    // SAFETY: used within this call; the QP then holds counts (so for the CQs below).
    let pd = unsafe { live::get::<Pd>(init.pd) }?;
    // SAFETY: as the PD's.
    let send_cq = unsafe { Cq::get(init.send_cq) }?;
    // SAFETY: as the PD's.
    let recv_cq = unsafe { Cq::get(init.recv_cq) }?;
    let srq = if init.srq.is_null() {
        None
    } else {
        // SAFETY: as above.
        Some(unsafe { live::get::<Srq>(init.srq) }?)
    };
    let ctx: &Context = pd.ctx();
    if !std::ptr::eq(send_cq.ctx(), ctx) || !std::ptr::eq(recv_cq.ctx(), ctx) {
        return Err(libc::EINVAL);
    }
    if init.cap.is_null() {
        return Err(libc::EINVAL);
    }
    crate::provider_env::mlx5_alloc(ctx, "MLX_QP")?;
    if let Some(ops) = init.send_ops {
        if ops & !SUPPORTED_SEND_OPS != 0 {
            return Err(libc::EOPNOTSUPP);
        }
    }
    let ty = qp_type(init.qp_type)?;
    // SAFETY: the program passes its `struct ibv_qp_cap` (inside its init attributes).
    let asked = unsafe { init.cap.read() };
    let cap = QpCap {
        max_send_wr: asked.max_send_wr,
        max_recv_wr: asked.max_recv_wr,
        max_send_sge: asked.max_send_sge,
        max_recv_sge: asked.max_recv_sge,
        max_inline_data: asked.max_inline_data,
    };
    let mut attr = QpInitAttr::new(ty, &send_cq.sim, &recv_cq.sim, cap);
    attr.srq = srq.map(|s| &s.sim);
    attr.sq_sig_all = init.sq_sig_all != 0;
    attr.create_flags = init.create_flags;
    let sim = pd
        .sim
        .create_qp(&attr)
        .map_err(|e| errno_of("ibv_create_qp", &e))?;
    // What the QP was given, as the profile's provider reports it back.
    let granted = sim.created_cap(cap);
    // SAFETY: as for the read above.
    unsafe {
        init.cap.write(ibv_qp_cap {
            max_send_wr: granted.max_send_wr,
            max_recv_wr: granted.max_recv_wr,
            max_send_sge: granted.max_send_sge,
            max_recv_sge: granted.max_recv_sge,
            max_inline_data: granted.max_inline_data,
        })
    };
    let qpn = sim.qp_num();
    pd.hold();
    send_cq.hold();
    recv_cq.hold();
    if let Some(s) = srq {
        s.hold();
    }
    let base = ibv_qp {
        context: ctx.c_ptr(),
        qp_context: init.qp_context,
        pd: init.pd,
        send_cq: init.send_cq,
        recv_cq: init.recv_cq,
        srq: init.srq,
        handle: next_handle(),
        qp_num: qpn,
        state: QpState::Reset as u32,
        qp_type: init.qp_type,
        mutex: libc::PTHREAD_MUTEX_INITIALIZER,
        cond: libc::PTHREAD_COND_INITIALIZER,
        events_completed: 0,
    };
    let qp = Box::new(Qp {
        c: UnsafeCell::new(crate::qp_ex::qp_ex(base)),
        sim,
        pd,
        send_cq,
        recv_cq,
        srq: srq.map_or(std::ptr::null(), |s| s as *const Srq),
        sq_sig_all: init.sq_sig_all != 0,
        qp_type: init.qp_type,
        send_ops: init.send_ops,
        max_inline: granted.max_inline_data as usize,
        builder: Mutex::default(),
    });
    let p = live::register(qp);
    ctx.elements.lock().qps.insert(qpn, p as usize);
    Ok(p.cast())
}

/// `ibv_create_qp`: RC (and UC and UD where the sim has them), EOPNOTSUPP for the
/// types it has not.
pub(crate) unsafe extern "C" fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    ptr_verb("ibv_create_qp", || {
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program passes a `struct ibv_qp_init_attr *`.
        let a = unsafe { &mut *attr };
        create(Init {
            pd,
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: &mut a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
            send_ops: None,
            create_flags: 0,
        })
    })
}

/// `verbs_context::create_qp_ex` (what `ibv_create_qp_ex` calls unless only the PD is
/// given): a PD, no create flags, and the `ibv_wr_*` operations the sim has; EOPNOTSUPP
/// for XRC, RSS, TSO and the rest.
pub(crate) unsafe extern "C" fn create_qp_ex_op(
    ctx: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    ptr_verb("ibv_create_qp_ex", || {
        // SAFETY: used within this call only.
        let c = unsafe { context::get(ctx) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program passes a `struct ibv_qp_init_attr_ex *`.
        let a = unsafe { &mut *attr };
        let known = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        if a.comp_mask & !known != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        if a.comp_mask & IBV_QP_INIT_ATTR_PD == 0 {
            return Err(libc::EINVAL);
        }
        // Flags the device takes (the mlx5 profile's block of self multicast loopback)
        // are accepted; others are EOPNOTSUPP, as rxe's and mlx5's kernels answer.
        let create_flags = match a.comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS {
            0 => 0,
            _ => a.create_flags,
        };
        // SAFETY: only looked up.
        let pd = unsafe { live::get::<Pd>(a.pd) }?;
        if !std::ptr::eq(pd.ctx(), c) {
            return Err(libc::EINVAL);
        }
        let send_ops = (a.comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS != 0).then_some(a.send_ops_flags);
        create(Init {
            pd: a.pd,
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: &mut a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
            send_ops,
            create_flags,
        })
    })
}

/// `struct ibv_ah_attr` as the sim's.
pub fn ah_attr_from_c(a: &ibv_ah_attr) -> AhAttr {
    AhAttr {
        grh: GlobalRoute {
            dgid: Gid(a.grh.dgid.raw),
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

/// The sim's address vector as `struct ibv_ah_attr`.
pub fn ah_attr_to_c(a: &AhAttr) -> ibv_ah_attr {
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

/// The attributes `mask` selects from `struct ibv_qp_attr` (the others may hold
/// anything, so their enumerations are not read).
fn qp_attr_from_c(a: &ibv_qp_attr, mask: QpAttrMask) -> Result<QpAttr, Errno> {
    let state = |v: u32| QpState::from_raw(v).ok_or(libc::EINVAL);
    Ok(QpAttr {
        qp_state: if mask.contains(QpAttrMask::STATE) {
            state(a.qp_state)?
        } else {
            QpState::Reset
        },
        cur_qp_state: if mask.contains(QpAttrMask::CUR_STATE) {
            state(a.cur_qp_state)?
        } else {
            QpState::Reset
        },
        path_mtu: if mask.contains(QpAttrMask::PATH_MTU) {
            Mtu::from_raw(a.path_mtu).ok_or(libc::EINVAL)?
        } else {
            Mtu::default()
        },
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: AccessFlags::from_bits_truncate(a.qp_access_flags),
        cap: QpCap::default(),
        ah_attr: ah_attr_from_c(&a.ah_attr),
        pkey_index: a.pkey_index,
        en_sqd_async_notify: a.en_sqd_async_notify != 0,
        sq_draining: false,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
    })
}

fn qp_attr_to_c(a: &QpAttr) -> ibv_qp_attr {
    ibv_qp_attr {
        qp_state: a.qp_state as u32,
        cur_qp_state: a.cur_qp_state as u32,
        path_mtu: a.path_mtu as u32,
        path_mig_state: 0,
        qkey: a.qkey,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        dest_qp_num: a.dest_qp_num,
        qp_access_flags: a.qp_access_flags.bits(),
        cap: ibv_qp_cap {
            max_send_wr: a.cap.max_send_wr,
            max_recv_wr: a.cap.max_recv_wr,
            max_send_sge: a.cap.max_send_sge,
            max_recv_sge: a.cap.max_recv_sge,
            max_inline_data: a.cap.max_inline_data,
        },
        ah_attr: ah_attr_to_c(&a.ah_attr),
        alt_ah_attr: ibv_ah_attr::default(),
        pkey_index: a.pkey_index,
        alt_pkey_index: 0,
        en_sqd_async_notify: a.en_sqd_async_notify as u8,
        sq_draining: a.sq_draining as u8,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        port_num: a.port_num,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        alt_port_num: 0,
        alt_timeout: 0,
        rate_limit: 0,
    }
}

/// `ibv_modify_qp`: 0 or an error number (EINVAL for a transition or mask the state
/// machine refuses, with the reason logged at debug level).
pub(crate) unsafe extern "C" fn ibv_modify_qp(qp: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    errno_verb("ibv_modify_qp", || {
        // SAFETY: used within this call only.
        let q = unsafe { Qp::get(qp) }?;
        if attr.is_null() {
            return Err(libc::EINVAL);
        }
        // IBV_QP_RATE_LIMIT and unknown bits.
        let mask = QpAttrMask::from_bits(mask as u32).ok_or(libc::EINVAL)?;
        // SAFETY: the program passes a `struct ibv_qp_attr *`.
        let a = unsafe { &*attr };
        let sim_attr = qp_attr_from_c(a, mask)?;
        q.sim
            .modify(&sim_attr, mask)
            .map_err(|e| errno_of("ibv_modify_qp", &e))?;
        if mask.contains(QpAttrMask::STATE) {
            q.set_state(a.qp_state);
        }
        Ok(())
    })
}

/// `ibv_query_qp`: every attribute (more than `mask` asks for, which the man page
/// allows) and the creation attributes; 0 or an error number.
pub(crate) unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    errno_verb("ibv_query_qp", || {
        // SAFETY: used within this call only.
        let q = unsafe { Qp::get(qp) }?;
        if attr.is_null() || init_attr.is_null() {
            return Err(libc::EINVAL);
        }
        let a = q.sim.query().map_err(|e| errno_of("ibv_query_qp", &e))?;
        let c = qp_attr_to_c(&a);
        // SAFETY: the C part lives as long as `q`; a copy of plain fields.
        let base = unsafe { std::ptr::addr_of!((*q.c.get()).qp_base).read() };
        // SAFETY: the program passes a `struct ibv_qp_attr *` and a
        // `struct ibv_qp_init_attr *`.
        unsafe {
            attr.write(c);
            init_attr.write(ibv_qp_init_attr {
                qp_context: base.qp_context,
                send_cq: base.send_cq,
                recv_cq: base.recv_cq,
                srq: base.srq,
                cap: c.cap,
                qp_type: base.qp_type,
                sq_sig_all: q.sq_sig_all as c_int,
            });
        }
        q.set_state(c.qp_state);
        Ok(())
    })
}

/// `ibv_destroy_qp`: 0, EINVAL, or EBUSY while the QP is attached to a multicast group
/// (uverbs' answer: detach it first). Outstanding WRs are dropped with the QP.
pub(crate) unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    errno_verb("ibv_destroy_qp", || {
        // SAFETY: looked up, used within this block.
        if unsafe { Qp::get(qp) }?.sim.is_mcast_attached() {
            return Err(libc::EBUSY);
        }
        // SAFETY: no reference to the QP is in use.
        drop(unsafe { live::unregister::<Qp>(qp.cast()) }?);
        Ok(())
    })
}

/// `ibv_qp_to_qp_ex`: the extended QP of one created for the `ibv_wr_*` interface,
/// else NULL.
pub(crate) unsafe extern "C" fn ibv_qp_to_qp_ex(qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    value_verb("ibv_qp_to_qp_ex", std::ptr::null_mut(), || {
        // SAFETY: only looked up.
        match unsafe { Qp::get(qp) } {
            Ok(q) if q.send_ops.is_some() => qp.cast(),
            _ => std::ptr::null_mut(),
        }
    })
}

/// `ibv_query_qp_data_in_order`: 0, the answer that promises nothing (a program then
/// waits for each completion before it reads the data, which is always right).
pub(crate) unsafe extern "C" fn ibv_query_qp_data_in_order(_qp: *mut ibv_qp, _op: u32, _flags: u32) -> c_int {
    0
}
