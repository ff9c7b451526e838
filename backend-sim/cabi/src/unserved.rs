//! Verbs the sim does not serve, answered as libibverbs documents a device without the
//! feature: sharing objects between processes
//! (`man ibv_import_device`), enhanced connection establishment (`man ibv_set_ece`) and
//! Ethernet L2 resolution (the sim's port is InfiniBand).

use std::ffi::{c_int, c_void};

use crate::ffi::set_errno;

fn null_eopnotsupp<T>() -> *mut T {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// `ibv_import_device`: NULL, errno EOPNOTSUPP.
pub(crate) extern "C" fn ibv_import_device(_cmd_fd: c_int) -> *mut c_void {
    null_eopnotsupp()
}

/// `ibv_import_pd`: NULL, errno EOPNOTSUPP.
pub(crate) extern "C" fn ibv_import_pd(_ctx: *mut c_void, _handle: u32) -> *mut c_void {
    null_eopnotsupp()
}

/// `ibv_import_mr`: NULL, errno EOPNOTSUPP.
pub(crate) extern "C" fn ibv_import_mr(_pd: *mut c_void, _handle: u32) -> *mut c_void {
    null_eopnotsupp()
}

/// `ibv_import_dm`: NULL, errno EOPNOTSUPP.
pub(crate) extern "C" fn ibv_import_dm(_ctx: *mut c_void, _handle: u32) -> *mut c_void {
    null_eopnotsupp()
}

/// `ibv_unimport_pd`, `ibv_unimport_mr`, `ibv_unimport_dm`: nothing was imported.
pub(crate) extern "C" fn ibv_unimport(_obj: *mut c_void) {}

/// `ibv_set_ece`: EOPNOTSUPP.
pub(crate) extern "C" fn ibv_set_ece(_qp: *mut c_void, _ece: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

/// `ibv_query_ece`: EOPNOTSUPP.
pub(crate) extern "C" fn ibv_query_ece(_qp: *mut c_void, _ece: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

/// `ibv_resolve_eth_l2_from_gid`: EINVAL, libibverbs' answer for a port whose link layer
/// is not Ethernet.
pub(crate) extern "C" fn ibv_resolve_eth_l2_from_gid(
    _ctx: *mut c_void,
    _attr: *mut c_void,
    _mac: *mut u8,
    _vid: *mut u16,
) -> c_int {
    libc::EINVAL
}
