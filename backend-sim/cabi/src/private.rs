//! libibverbs' private ABI (`IBVERBS_PRIVATE_34`), the interface of provider libraries.
//!
//! No provider runs under the sim, but a program may link one (perftest links libmlx5 and
//! libefa for their direct-verbs extensions), and the provider's constructor registers
//! itself with `verbs_register_driver_34` as it loads. That registration is accepted and
//! ignored; the command and context-building calls, which only a provider's open path
//! makes, fail with EOPNOTSUPP.

use std::ffi::{c_int, c_uint, c_void};

use crate::ffi::set_errno;

/// `verbs_register_driver_34`: accepted, ignored (the sim is the only device).
pub(crate) extern "C" fn verbs_register_driver_34(_ops: *const c_void) {}

/// `ibv_register_driver` (the 1.1 driver interface): accepted, ignored.
pub(crate) extern "C" fn ibv_register_driver(_name: *const c_void, _init: *const c_void) {}

/// `verbs_set_ops`, `verbs_init_cq`, `verbs_uninit_context`, `__verbs_log`: nothing to do.
pub(crate) extern "C" fn void_fn() {}

/// `verbs_open_device`, `_verbs_init_and_alloc_context`: NULL, errno EOPNOTSUPP.
pub(crate) extern "C" fn null_fn() -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `execute_ioctl` and the `ibv_cmd_*` commands: EOPNOTSUPP (there is no uverbs device).
pub(crate) extern "C" fn errno_fn() -> c_int {
    libc::EOPNOTSUPP
}

/// `__ioctl_final_num_attrs`: the attribute count of an ioctl command buffer under
/// construction; with no command ever executed, the count given.
pub(crate) extern "C" fn __ioctl_final_num_attrs(num_attrs: c_uint, _link: *mut c_void) -> c_uint {
    num_attrs
}
