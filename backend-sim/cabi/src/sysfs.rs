//! libibverbs' sysfs helpers (`ibv_get_sysfs_path`, `ibv_read_sysfs_file`, and the
//! private `ibv_read_ibdev_sysfs_file`).
//!
//! Programs read a device's attributes from the directory its `ibv_device` names
//! (`ibv_devinfo` reads `board_id` from `ibdev_path`). The sim's devices name directories
//! under [`SYSFS_ROOT`](crate::runtime::SYSFS_ROOT), which do not exist, and this module
//! answers for the files a device directory would have; every other path is read from the
//! file system, as libibverbs does.

use std::ffi::{c_char, c_int, CStr};

use crate::ffi::{minus_one_verb, Errno};
use crate::runtime::{runtime, Device, SYSFS_ROOT};

/// `ibv_get_sysfs_path`.
pub(crate) unsafe extern "C" fn ibv_get_sysfs_path() -> *const c_char {
    c"/sys".as_ptr()
}

/// The contents of `file` in the sim device's directory `dir`, if it is one.
fn virtual_file(dir: &str, file: &str) -> Option<Result<String, Errno>> {
    let rest = dir.strip_prefix(SYSFS_ROOT)?;
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => return Some(Err(e)),
    };
    let guid = |d: &Device| {
        let g = d.guid;
        format!(
            "{:04x}:{:04x}:{:04x}:{:04x}",
            (g >> 48) & 0xffff,
            (g >> 32) & 0xffff,
            (g >> 16) & 0xffff,
            g & 0xffff
        )
    };
    let file = file.trim_matches('/');
    for d in &rt.devices {
        if rest == format!("/{}", d.name) {
            return Some(match file {
                "board_id" => Ok("VERBS-RS-SIM".into()),
                "hca_type" => Ok("sim".into()),
                "node_type" => Ok("1: CA".into()),
                "node_desc" => Ok(format!("{} (verbs-rs simulated HCA)", d.name)),
                "node_guid" | "sys_image_guid" => Ok(guid(d)),
                "fw_ver" => Ok(concat!("sim-", env!("CARGO_PKG_VERSION")).into()),
                _ => Err(libc::ENOENT),
            });
        }
        if rest == format!("_verbs/uverbs-{}", d.name) {
            return Some(match file {
                "ibdev" => Ok(d.name.clone()),
                "abi_version" => Ok("1".into()),
                _ => Err(libc::ENOENT),
            });
        }
    }
    Some(Err(libc::ENOENT))
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
        let (dir, file) = (dir.to_string_lossy(), file.to_string_lossy());
        let mut data = match virtual_file(&dir, &file) {
            Some(content) => {
                let mut v = content?.into_bytes();
                v.push(b'\n');
                v
            }
            None => {
                std::fs::read(format!("{dir}/{file}")).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?
            }
        };
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
        let (n, text) = read(c"/sys/class/infiniband-sim/sim0", c"board_id", 64);
        assert_eq!((n, text.as_str()), (12, "VERBS-RS-SIM"));
        let (n, _) = read(c"/sys/class/infiniband-sim/sim0", c"no_such_file", 64);
        assert_eq!(n, -1);
        // Too small for the text and its NUL: libibverbs fails rather than truncate.
        assert_eq!(read(c"/sys/class/infiniband-sim/sim0", c"board_id", 12).0, -1);
    }

    #[test]
    fn other_paths_are_read_from_the_file_system() {
        let (n, text) = read(c"/proc/sys/kernel", c"ostype", 64);
        assert_eq!((n, text.as_str()), (5, "Linux"));
        assert_eq!(read(c"/nonexistent", c"file", 64).0, -1);
    }
}
