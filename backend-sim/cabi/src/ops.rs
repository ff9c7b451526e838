//! The operation tables of a context: `ibv_context::ops`, which the header's inline
//! `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`, `ibv_req_notify_cq` and
//! `ibv_post_srq_recv` call, and the extended operations of `verbs_context`, which
//! `ibv_query_port`, `ibv_query_device_ex`, `ibv_create_cq_ex`, `ibv_create_qp_ex` and
//! `ibv_create_srq_ex` reach through `verbs_get_ctx_op()` (`<infiniband/verbs.h>`).
//!
//! What the sim does not serve answers as libibverbs' placeholder operations
//! (`dummy_ops.c`) do: NULL with errno EOPNOTSUPP, or EOPNOTSUPP.

use std::ffi::{c_int, c_void};

use crate::abi::{ibv_context, ibv_context_ops, ibv_device, verbs_context, VERBS_ABI_IS_EXTENDED};
use crate::ffi::set_errno;
use crate::runtime::NUM_COMP_VECTORS;

unsafe extern "C" fn unserved_null() -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

unsafe extern "C" fn unserved_err() -> c_int {
    libc::EOPNOTSUPP
}

/// `ibv_post_srq_ops` (tag matching): refused, naming the first operation as the bad one.
unsafe extern "C" fn post_srq_ops(
    _srq: *mut crate::abi::ibv_srq,
    op: *mut c_void,
    bad: *mut *mut c_void,
) -> c_int {
    if !bad.is_null() {
        // SAFETY: the program passes a valid `struct ibv_ops_wr **` (or NULL).
        unsafe { *bad = op };
    }
    libc::EOPNOTSUPP
}

/// A context's C part: the `verbs_context` with every operation set and the
/// `ibv_context` programs hold at its end.
pub fn verbs_context(device: *mut ibv_device, async_fd: c_int, cmd_fd: c_int) -> verbs_context {
    let null = Some(unserved_null as unsafe extern "C" fn() -> *mut c_void);
    let err = Some(unserved_err as unsafe extern "C" fn() -> c_int);
    verbs_context {
        query_port: Some(crate::query::query_port_op),
        advise_mr: err,
        alloc_null_mr: null,
        read_counters: err,
        attach_counters_point_flow: err,
        create_counters: null,
        destroy_counters: err,
        reg_dm_mr: null,
        alloc_dm: null,
        free_dm: err,
        modify_flow_action_esp: err,
        destroy_flow_action: err,
        create_flow_action_esp: null,
        modify_qp_rate_limit: err,
        alloc_parent_domain: null,
        dealloc_td: err,
        alloc_td: null,
        modify_cq: err,
        post_srq_ops: Some(post_srq_ops),
        destroy_rwq_ind_table: err,
        create_rwq_ind_table: null,
        destroy_wq: err,
        modify_wq: err,
        create_wq: null,
        query_rt_values: err,
        create_cq_ex: Some(crate::cq::create_cq_ex_op),
        priv_: std::ptr::null_mut(),
        query_device_ex: Some(crate::query::query_device_ex_op),
        ibv_destroy_flow: err,
        abi_placeholder2: null,
        ibv_create_flow: null,
        abi_placeholder1: null,
        open_qp: null,
        create_qp_ex: Some(crate::qp::create_qp_ex_op),
        get_srq_num: err,
        create_srq_ex: Some(crate::srq::create_srq_ex_op),
        open_xrcd: null,
        close_xrcd: err,
        _abi_placeholder3: 0,
        sz: size_of::<verbs_context>(),
        context: ibv_context {
            device,
            ops: ibv_context_ops {
                _compat_query_device: None,
                _compat_query_port: None,
                _compat_alloc_pd: None,
                _compat_dealloc_pd: None,
                _compat_reg_mr: None,
                _compat_rereg_mr: None,
                _compat_dereg_mr: None,
                alloc_mw: Some(crate::mw::alloc_mw),
                bind_mw: Some(crate::mw::bind_mw),
                dealloc_mw: Some(crate::mw::dealloc_mw),
                _compat_create_cq: None,
                poll_cq: Some(crate::poll::poll_cq),
                req_notify_cq: Some(crate::cq::req_notify_cq),
                _compat_cq_event: None,
                _compat_resize_cq: None,
                _compat_destroy_cq: None,
                _compat_create_srq: None,
                _compat_modify_srq: None,
                _compat_query_srq: None,
                _compat_destroy_srq: None,
                post_srq_recv: Some(crate::post::post_srq_recv),
                _compat_create_qp: None,
                _compat_query_qp: None,
                _compat_modify_qp: None,
                _compat_destroy_qp: None,
                post_send: Some(crate::post::post_send),
                post_recv: Some(crate::post::post_recv),
                _compat_create_ah: None,
                _compat_destroy_ah: None,
                _compat_attach_mcast: None,
                _compat_detach_mcast: None,
                _compat_async_event: None,
            },
            cmd_fd,
            async_fd,
            num_comp_vectors: NUM_COMP_VECTORS,
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            abi_compat: VERBS_ABI_IS_EXTENDED,
        },
    }
}
