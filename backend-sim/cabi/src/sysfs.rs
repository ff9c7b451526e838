//! libibverbs' sysfs helpers (`ibv_get_sysfs_path`, `ibv_read_sysfs_file`, and the
//! private `ibv_read_ibdev_sysfs_file`).
//!
//! Programs read a device's attributes from the directories its `ibv_device` names
//! (`ibv_devinfo` reads `board_id` from `ibdev_path`), under the sysfs path libibverbs
//! uses (`SYSFS_PATH`, else `/sys`). A sim device's directories are answered from the
//! process's tree ([`crate::vfs`]), as a program's own `open` of them is; every other
//! path is read from the file system, as libibverbs does.

use std::ffi::{c_char, c_int, CStr};
use std::os::unix::ffi::OsStrExt;

use crate::ffi::minus_one_verb;
use crate::vfs::{lookup, sysfs_root, Lookup};

/// `ibv_get_sysfs_path`: `SYSFS_PATH` (trailing slashes removed) or `/sys`, as
/// libibverbs answers ([`sysfs_root`]).
pub(crate) unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    sysfs_root().as_ptr()
}

/// `ibv_read_sysfs_file`: reads `dir/file` into `buf` (at most `size` bytes, NUL
/// terminated, a trailing newline removed) and returns its length, or -1 with errno.
pub(crate) unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    minus_one_verb("ibv_read_sysfs_file", || {
        if dir.is_null() || file.is_null() || buf.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the program passes NUL-terminated strings.
        let (dir, file) = unsafe { (CStr::from_ptr(dir), CStr::from_ptr(file)) };
        let mut path = dir.to_bytes().to_vec();
        path.push(b'/');
        path.extend_from_slice(file.to_bytes());
        let path = std::ffi::CString::new(path).map_err(|_| libc::EINVAL)?;
        // SAFETY: a NUL-terminated string.
        let path = match unsafe { lookup(path.as_ptr()) } {
            Lookup::Outside => path,
            Lookup::Inside(p) => p,
            Lookup::Unavailable(e) => return Err(e),
        };
        let path = std::path::Path::new(std::ffi::OsStr::from_bytes(path.to_bytes()));
        let mut data = std::fs::read(path).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        data.truncate(size);
        let mut len = data.len();
        if len > 0 {
            if data[len - 1] == b'\n' {
                len -= 1;
                data[len] = 0;
            } else if len < size {
                data.push(0);
            } else {
                // No room for the terminating NUL: libibverbs fails rather than hand out
                // an unterminated string.
                return Err(libc::EOVERFLOW);
            }
            // SAFETY: `buf` holds `size` bytes (the program's contract) and `data` has at
            // most `size` bytes.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.cast::<u8>(), data.len().min(size)) };
        }
        Ok(len as c_int)
    })
}

/// `ibv_read_ibdev_sysfs_file` (private: providers read their device's files through
/// libibverbs' `struct verbs_sysfs_dev`, which the sim's devices do not have): -1, errno
/// EOPNOTSUPP.
pub(crate) unsafe extern "C" fn ibv_read_ibdev_sysfs_file() -> c_int {
    crate::ffi::set_errno(libc::EOPNOTSUPP);
    -1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(dir: &CStr, file: &CStr, size: usize) -> (c_int, String) {
        let mut buf = vec![0x55 as c_char; size];
        // SAFETY: NUL-terminated strings and a buffer of `size` bytes.
        let n = unsafe { ibv_read_sysfs_file(dir.as_ptr(), file.as_ptr(), buf.as_mut_ptr(), size) };
        let text = buf
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8 as char)
            .collect();
        (n, text)
    }

    #[test]
    fn a_sim_device_directory_answers_for_its_files() {
        let (n, text) = read(c"/sys/class/infiniband/sim0", c"board_id", 64);
        assert_eq!((n, text.as_str()), (12, "VERBS-RS-SIM"));
        let (n, _) = read(c"/sys/class/infiniband/sim0", c"no_such_file", 64);
        assert_eq!(n, -1);
        // Too small for the text and its NUL: libibverbs fails rather than truncate.
        assert_eq!(read(c"/sys/class/infiniband/sim0", c"board_id", 12).0, -1);
    }

    #[test]
    fn other_paths_are_read_from_the_file_system() {
        let (n, text) = read(c"/proc/sys/kernel", c"ostype", 64);
        assert_eq!((n, text.as_str()), (5, "Linux"));
        assert_eq!(read(c"/nonexistent", c"file", 64).0, -1);
    }
}
