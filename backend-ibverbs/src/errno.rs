//! errno handling: libibverbs reports failures in three ways (a NULL pointer with `errno`
//! set, a positive errno value returned, or -1 with `errno` set; `man ibv_create_qp`,
//! `man ibv_modify_qp`, `man ibv_get_cq_event`), and some providers return a negative
//! errno. These helpers turn all of them into one errno value.

use std::os::raw::c_int;

/// The calling thread's `errno` (EIO if it is somehow 0).
pub(crate) fn last_errno() -> i32 {
    match std::io::Error::last_os_error().raw_os_error() {
        Some(e) if e != 0 => e,
        _ => libc::EIO,
    }
}

/// The errno behind a non-zero return code: the value itself when positive, `errno` for
/// -1, and `-rc` for another negative value (providers that return `-errno`).
pub(crate) fn rc_errno(rc: c_int) -> i32 {
    match rc {
        rc if rc > 0 => rc,
        -1 => last_errno(),
        rc => rc.checked_neg().unwrap_or(libc::EIO),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_code_conventions() {
        assert_eq!(rc_errno(libc::EINVAL), libc::EINVAL);
        assert_eq!(rc_errno(-libc::ENOMEM), libc::ENOMEM);
        assert_eq!(rc_errno(c_int::MIN), libc::EIO);
    }
}
