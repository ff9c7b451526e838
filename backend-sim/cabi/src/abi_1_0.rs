//! The libibverbs 1.0 ABI (`IBVERBS_1.0` versions of symbols whose structures changed in
//! 1.1, in 2006). A program built against it would pass and expect the old layouts, which
//! this library does not build: it gets no device list, and every other call fails the
//! way its man page allows (and is unreachable without a device).

use std::ffi::{c_int, c_void};
use std::sync::Once;

use crate::ffi::set_errno;

fn warn_once() {
    static WARN: Once = Once::new();
    WARN.call_once(|| {
        tracing::warn!("this program uses the libibverbs 1.0 ABI, which the sim's libibverbs does not serve");
    });
}

/// Pointer results: NULL, errno EOPNOTSUPP.
pub(crate) extern "C" fn null_fn() -> *mut c_void {
    warn_once();
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

/// Error-number results: EOPNOTSUPP.
pub(crate) extern "C" fn errno_fn() -> c_int {
    warn_once();
    libc::EOPNOTSUPP
}

/// -1-with-errno results: -1, errno EOPNOTSUPP.
pub(crate) extern "C" fn minus_one_fn() -> c_int {
    warn_once();
    set_errno(libc::EOPNOTSUPP);
    -1
}

/// `ibv_get_device_guid@IBVERBS_1.0`: 0.
pub(crate) extern "C" fn zero_fn() -> u64 {
    warn_once();
    0
}

/// Functions without a result.
pub(crate) extern "C" fn void_fn() {
    warn_once();
}
