//! The device context: `struct ibv_context` with its `struct ibv_context_ops`, inside
//! `struct verbs_context`, whose extended operations the header's inline functions find
//! through `verbs_get_ctx_op()` (`man ibv_open_device`).
//!
//! `verbs_get_ctx_op(ctx, op)` takes the `verbs_context` that ends at `ctx` when
//! `ctx->abi_compat` is `__VERBS_ABI_IS_EXTENDED`, and uses `op` when `sz` covers it and
//! it is not NULL. Every operation here is set: the ones the sim does not serve answer as
//! libibverbs' own placeholders do (NULL with errno EOPNOTSUPP, or EOPNOTSUPP), so that
//! inline functions which call an operation without checking it (`ibv_close_xrcd`) meet
//! an answer rather than a NULL pointer.

use std::ffi::{c_int, c_void};

use super::attr::{ibv_cq_init_attr_ex, ibv_qp_init_attr_ex, ibv_srq_init_attr_ex};
use super::device::{ibv_device, ibv_device_attr_ex, ibv_port_attr, ibv_query_device_ex_input};
use super::objects::{ibv_cq, ibv_cq_ex, ibv_mw, ibv_pd, ibv_qp, ibv_srq};
use super::wr::{ibv_recv_wr, ibv_send_wr, ibv_wc};

/// `__VERBS_ABI_IS_EXTENDED`: `ibv_context::abi_compat` of a context inside a
/// `verbs_context`.
pub const VERBS_ABI_IS_EXTENDED: *mut c_void = usize::MAX as *mut c_void;

/// An operation the sim does not serve that returns a pointer: NULL, errno EOPNOTSUPP.
/// It ignores its arguments, which the C calling convention allows.
pub type NullOp = unsafe extern "C" fn() -> *mut c_void;
/// An operation the sim does not serve that returns an error number: EOPNOTSUPP.
pub type ErrOp = unsafe extern "C" fn() -> c_int;

/// `ops.poll_cq`
pub type PollCqFn = unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int;
/// `ops.req_notify_cq`
pub type ReqNotifyFn = unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int;
/// `ops.post_send`
pub type PostSendFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
/// `ops.post_recv`
pub type PostRecvFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `ops.post_srq_recv`
pub type PostSrqRecvFn = unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
/// `ops.alloc_mw`
pub type AllocMwFn = unsafe extern "C" fn(*mut ibv_pd, u32) -> *mut ibv_mw;
/// `ops.bind_mw`
pub type BindMwFn = unsafe extern "C" fn(*mut ibv_qp, *mut ibv_mw, *mut super::wr::ibv_mw_bind) -> c_int;
/// `ops.dealloc_mw`
pub type DeallocMwFn = unsafe extern "C" fn(*mut ibv_mw) -> c_int;

/// `struct ibv_context_ops`. The `_compat_*` entries are what libibverbs keeps "just in
/// case" for binaries of 2007; nothing calls them and they stay NULL, as they do for a
/// provider without the operation.
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_query_device: Option<NullOp>,
    pub _compat_query_port: Option<NullOp>,
    pub _compat_alloc_pd: Option<NullOp>,
    pub _compat_dealloc_pd: Option<NullOp>,
    pub _compat_reg_mr: Option<NullOp>,
    pub _compat_rereg_mr: Option<NullOp>,
    pub _compat_dereg_mr: Option<NullOp>,
    pub alloc_mw: Option<AllocMwFn>,
    pub bind_mw: Option<BindMwFn>,
    pub dealloc_mw: Option<DeallocMwFn>,
    pub _compat_create_cq: Option<NullOp>,
    pub poll_cq: Option<PollCqFn>,
    pub req_notify_cq: Option<ReqNotifyFn>,
    pub _compat_cq_event: Option<NullOp>,
    pub _compat_resize_cq: Option<NullOp>,
    pub _compat_destroy_cq: Option<NullOp>,
    pub _compat_create_srq: Option<NullOp>,
    pub _compat_modify_srq: Option<NullOp>,
    pub _compat_query_srq: Option<NullOp>,
    pub _compat_destroy_srq: Option<NullOp>,
    pub post_srq_recv: Option<PostSrqRecvFn>,
    pub _compat_create_qp: Option<NullOp>,
    pub _compat_query_qp: Option<NullOp>,
    pub _compat_modify_qp: Option<NullOp>,
    pub _compat_destroy_qp: Option<NullOp>,
    pub post_send: Option<PostSendFn>,
    pub post_recv: Option<PostRecvFn>,
    pub _compat_create_ah: Option<NullOp>,
    pub _compat_destroy_ah: Option<NullOp>,
    pub _compat_attach_mcast: Option<NullOp>,
    pub _compat_detach_mcast: Option<NullOp>,
    pub _compat_async_event: Option<NullOp>,
}

/// `struct ibv_context`.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: libc::pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `verbs_context::query_port`
pub type QueryPortFn = unsafe extern "C" fn(*mut ibv_context, u8, *mut ibv_port_attr, usize) -> c_int;
/// `verbs_context::query_device_ex`
pub type QueryDeviceExFn = unsafe extern "C" fn(
    *mut ibv_context,
    *const ibv_query_device_ex_input,
    *mut ibv_device_attr_ex,
    usize,
) -> c_int;
/// `verbs_context::create_cq_ex`
pub type CreateCqExFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex;
/// `verbs_context::create_qp_ex`
pub type CreateQpExFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_qp_init_attr_ex) -> *mut ibv_qp;
/// `verbs_context::create_srq_ex`
pub type CreateSrqExFn = unsafe extern "C" fn(*mut ibv_context, *mut ibv_srq_init_attr_ex) -> *mut ibv_srq;
/// `verbs_context::post_srq_ops`
pub type PostSrqOpsFn = unsafe extern "C" fn(*mut ibv_srq, *mut c_void, *mut *mut c_void) -> c_int;

/// `struct verbs_context`: the extended operations in front of the `ibv_context`
/// programs hold (it "grows up": newer operations are added at the front).
#[repr(C)]
pub struct verbs_context {
    pub query_port: Option<QueryPortFn>,
    pub advise_mr: Option<ErrOp>,
    pub alloc_null_mr: Option<NullOp>,
    pub read_counters: Option<ErrOp>,
    pub attach_counters_point_flow: Option<ErrOp>,
    pub create_counters: Option<NullOp>,
    pub destroy_counters: Option<ErrOp>,
    pub reg_dm_mr: Option<NullOp>,
    pub alloc_dm: Option<NullOp>,
    pub free_dm: Option<ErrOp>,
    pub modify_flow_action_esp: Option<ErrOp>,
    pub destroy_flow_action: Option<ErrOp>,
    pub create_flow_action_esp: Option<NullOp>,
    pub modify_qp_rate_limit: Option<ErrOp>,
    pub alloc_parent_domain: Option<NullOp>,
    pub dealloc_td: Option<ErrOp>,
    pub alloc_td: Option<NullOp>,
    pub modify_cq: Option<ErrOp>,
    pub post_srq_ops: Option<PostSrqOpsFn>,
    pub destroy_rwq_ind_table: Option<ErrOp>,
    pub create_rwq_ind_table: Option<NullOp>,
    pub destroy_wq: Option<ErrOp>,
    pub modify_wq: Option<ErrOp>,
    pub create_wq: Option<NullOp>,
    pub query_rt_values: Option<ErrOp>,
    pub create_cq_ex: Option<CreateCqExFn>,
    /// libibverbs' private state; nothing outside libibverbs reads it.
    pub priv_: *mut c_void,
    pub query_device_ex: Option<QueryDeviceExFn>,
    pub ibv_destroy_flow: Option<ErrOp>,
    pub abi_placeholder2: Option<NullOp>,
    pub ibv_create_flow: Option<NullOp>,
    pub abi_placeholder1: Option<NullOp>,
    pub open_qp: Option<NullOp>,
    pub create_qp_ex: Option<CreateQpExFn>,
    pub get_srq_num: Option<ErrOp>,
    pub create_srq_ex: Option<CreateSrqExFn>,
    pub open_xrcd: Option<NullOp>,
    pub close_xrcd: Option<ErrOp>,
    pub _abi_placeholder3: u64,
    /// `sizeof(struct verbs_context)`: which operations exist.
    pub sz: usize,
    /// What programs hold; must be last.
    pub context: ibv_context,
}
