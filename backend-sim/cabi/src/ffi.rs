//! How an entry point answers C: the three conventions of libibverbs' man pages (a
//! pointer or NULL with `errno`; 0 or an error number; 0 or -1 with `errno`), and a
//! guard that keeps a panic of this library from unwinding into C (which would abort the
//! program): a panic is logged and answered as an `EIO` failure.

use std::ffi::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A failed verb: the error number to report.
pub type Errno = c_int;

/// Sets the calling thread's `errno`.
pub fn set_errno(e: Errno) {
    // SAFETY: `__errno_location` returns the calling thread's errno, valid for writes
    // for the thread's lifetime.
    unsafe { *libc::__errno_location() = e };
}

/// The error number of a verbs-api error, logged (at debug level: a refusal is often
/// expected, e.g. a program probing for a feature) with the reason the sim gives.
pub fn errno_of(call: &'static str, e: &verbs_api::Error) -> Errno {
    tracing::debug!(call, error = %e, "refused");
    e.errno()
}

fn guarded<T>(call: &'static str, on_panic: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(call, panic = %what, "internal error in the sim's libibverbs (a bug): failing the call with EIO");
            on_panic
        }
    }
}

/// A verb that returns a pointer: the pointer, or NULL with `errno` set.
pub fn ptr_verb<T>(call: &'static str, f: impl FnOnce() -> Result<*mut T, Errno>) -> *mut T {
    match guarded(call, Err(libc::EIO), f) {
        Ok(p) => p,
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    }
}

/// A verb that returns 0 or an error number (`errno` is set too, as libibverbs'
/// providers often leave it).
pub fn errno_verb(call: &'static str, f: impl FnOnce() -> Result<(), Errno>) -> c_int {
    match guarded(call, Err(libc::EIO), f) {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            e
        }
    }
}

/// A verb that returns a non-negative value, or -1 with `errno` set.
pub fn minus_one_verb(call: &'static str, f: impl FnOnce() -> Result<c_int, Errno>) -> c_int {
    match guarded(call, Err(libc::EIO), f) {
        Ok(v) => v,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// A verb without a result: failures can only be logged.
pub fn void_verb(call: &'static str, f: impl FnOnce()) {
    guarded(call, (), f)
}

/// A verb with a plain result (a value on success, `fallback` after a panic).
pub fn value_verb<T>(call: &'static str, fallback: T, f: impl FnOnce() -> T) -> T {
    guarded(call, fallback, f)
}

/// Copies `s` into a fixed C string field, truncated to leave the terminating NUL.
pub fn copy_c_str(dst: &mut [std::ffi::c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.bytes().take(n)) {
        *d = b as std::ffi::c_char;
    }
    if let Some(end) = dst.get_mut(n) {
        *end = 0;
    }
}
