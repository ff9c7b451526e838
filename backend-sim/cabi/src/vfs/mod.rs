//! What a program finds of the sim's devices outside the verbs: their sysfs entries and
//! device nodes.
//!
//! Programs look at more than the verbs. UCX lists a device only if
//! `/dev/infiniband/<dev_name>` is a character device it may read and write
//! (`uct_ib_device_is_accessible()`), and reads `/sys/class/infiniband/<dev>/ports/N/
//! gid_attrs/{types,ndevs}/M` to pick a RoCE GID; Open MPI's openib BTL runs only if
//! `<ibv_get_sysfs_path()>/class/infiniband` is a directory; `ibv_devinfo` reads
//! `board_id` through `ibv_read_sysfs_file`. The host has none of these for the sim's
//! devices, and making them takes root. So, as umockdev's preload library answers a
//! program's `/sys` and `/dev` look-ups from a test bed it owns, this library answers
//! the look-ups of three places from a tree of its own ([`tree`], filled by [`files`]):
//!
//! - `/dev/infiniband` (with `rdma_cm`, which [`crate::ucma`] opens),
//! - `class/infiniband`, `class/infiniband_verbs` and `class/misc/rdma_cm` under `/sys`, and under
//!   `SYSFS_PATH` when it names another directory (libibverbs' `ibv_get_sysfs_path()`
//!   honours it, and so does [`sysfs_root`]; UCX names `/sys` itself).
//!
//! The tree replaces the host's entries there: a process on the sim sees the sim's
//! devices only, as its device list has them only, and the sim's connection manager as
//! its rdma_cm. Every other path is the host's, untouched. [`crate::interpose`]
//! has the libc calls that consult [`lookup`].

pub mod files;
pub mod tree;

use std::ffi::{c_char, CStr, CString};
use std::sync::OnceLock;

use crate::ffi::Errno;

/// The tree's directories, as the host names them less the leading `/` (and `/sys`
/// for the sysfs classes).
pub const DEV: &str = "dev/infiniband";
/// See [`DEV`].
pub const IB_CLASS: &str = "sys/class/infiniband";
/// See [`DEV`].
pub const VERBS_CLASS: &str = "sys/class/infiniband_verbs";
/// See [`DEV`].
pub const MISC_CM: &str = "sys/class/misc/rdma_cm";

/// Where a program's path leads.
pub enum Lookup {
    /// Not one of the sim's places: the host's file system answers.
    Outside,
    /// The tree's file that stands for it.
    Inside(CString),
    /// One of the sim's places, but the tree could not be made: this error number.
    Unavailable(Errno),
}

/// The sysfs mount point libibverbs would use (`ibv_get_sysfs_path()`): `SYSFS_PATH`
/// without trailing slashes, if set and the process is not set-user-ID (as libibverbs
/// checks, `getuid() == geteuid()`), else `/sys`. Read once, as libibverbs does.
pub fn sysfs_root() -> &'static CStr {
    static ROOT: OnceLock<CString> = OnceLock::new();
    ROOT.get_or_init(|| {
        // SAFETY: getuid and geteuid have no preconditions.
        let trusted = unsafe { libc::getuid() == libc::geteuid() };
        let env = std::env::var_os("SYSFS_PATH").filter(|_| trusted);
        let mut v = env
            .map(std::os::unix::ffi::OsStringExt::into_vec)
            .unwrap_or_default();
        while v.last() == Some(&b'/') {
            v.pop();
        }
        // libibverbs keeps at most IBV_SYSFS_PATH_MAX bytes (strndup).
        v.truncate(crate::abi::IBV_SYSFS_PATH_MAX);
        if v.is_empty() || v.contains(&0) {
            v = b"/sys".to_vec();
        }
        CString::new(v).expect("no NUL")
    })
}

/// Whether the C string at `p` starts with `prefix` (which has no NUL): reads no further
/// than the first difference, so a path elsewhere costs a few byte compares.
///
/// # Safety
///
/// `p` points to a NUL-terminated string.
unsafe fn starts_with(p: *const u8, prefix: &[u8]) -> bool {
    for (i, b) in prefix.iter().enumerate() {
        // SAFETY: every byte before index i matched a non-NUL byte of `prefix`, so the
        // string goes on at least to index i.
        if unsafe { *p.add(i) } != *b {
            return false;
        }
    }
    true
}

/// Whether the C string at `p` ends, or goes on with a `/`, at index `at`.
///
/// # Safety
///
/// `p` points to a NUL-terminated string at least `at` bytes long.
unsafe fn ends_or_slash(p: *const u8, at: usize) -> bool {
    // SAFETY: the caller's contract: index `at` is the NUL at the latest.
    matches!(unsafe { *p.add(at) }, 0 | b'/')
}

/// Which of the sim's places the absolute path at `p` is in: the tree directory and
/// where the rest of the path begins.
///
/// # Safety
///
/// `p` points to a NUL-terminated string.
unsafe fn place(p: *const u8) -> Option<(&'static str, usize)> {
    // SAFETY: (all reads below) `p` is NUL-terminated and each index read is at most
    // the length of a prefix that matched.
    unsafe {
        if *p != b'/' {
            return None;
        }
        let dev = DEV.as_bytes();
        if starts_with(p.add(1), dev) && ends_or_slash(p, 1 + dev.len()) {
            return Some((DEV, 1 + dev.len()));
        }
        let custom = sysfs_root().to_bytes();
        for root in [b"/sys".as_slice(), custom] {
            if !starts_with(p, root) {
                continue;
            }
            let class = b"/class/infiniband";
            let at = root.len() + class.len();
            if !starts_with(p.add(root.len()), class) {
                continue;
            }
            if ends_or_slash(p, at) {
                return Some((IB_CLASS, at));
            }
            if starts_with(p.add(at), b"_verbs") && ends_or_slash(p, at + 6) {
                return Some((VERBS_CLASS, at + 6));
            }
        }
        for root in [b"/sys".as_slice(), custom] {
            let misc = b"/class/misc/rdma_cm";
            let at = root.len() + misc.len();
            if starts_with(p, root) && starts_with(p.add(root.len()), misc) && ends_or_slash(p, at) {
                return Some((MISC_CM, at));
            }
        }
        None
    }
}

/// Whether the absolute path at `path` is `/dev/infiniband/rdma_cm`, which opens the
/// sim's connection manager.
///
/// # Safety
///
/// `path` is NULL or points to a NUL-terminated string.
pub unsafe fn is_rdma_cm(path: *const c_char) -> bool {
    const CM: &[u8] = b"/dev/infiniband/rdma_cm\0";
    // SAFETY: the caller's contract; `starts_with` stops at the first difference, and a
    // NUL in the string differs from every byte of `CM` but its last.
    !path.is_null() && unsafe { starts_with(path.cast::<u8>(), CM) }
}

/// Where the path at `path` leads (a relative path, or NULL, is the host's: the places
/// are named by absolute paths).
///
/// # Safety
///
/// `path` is NULL or points to a NUL-terminated string.
pub unsafe fn lookup(path: *const c_char) -> Lookup {
    if path.is_null() {
        return Lookup::Outside;
    }
    // SAFETY: the caller's contract.
    let Some((dir, rest_at)) = (unsafe { place(path.cast::<u8>()) }) else {
        return Lookup::Outside;
    };
    let t = match tree::get() {
        Ok(t) => t,
        Err(e) => return Lookup::Unavailable(e),
    };
    // SAFETY: the caller's contract; `rest_at` is inside the string.
    let rest = unsafe { CStr::from_ptr(path.add(rest_at)) }.to_bytes();
    match t.path(dir, rest) {
        Some(p) => Lookup::Inside(p),
        None => Lookup::Unavailable(libc::EINVAL),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place_of(p: &CStr) -> Option<(&'static str, String)> {
        // SAFETY: a NUL-terminated string.
        unsafe { place(p.as_ptr().cast()) }
            .map(|(d, at)| (d, String::from_utf8_lossy(&p.to_bytes()[at..]).into_owned()))
    }

    #[test]
    fn the_three_places_and_only_them() {
        assert_eq!(place_of(c"/dev/infiniband"), Some((DEV, "".into())));
        assert_eq!(
            place_of(c"/dev/infiniband/uverbs0"),
            Some((DEV, "/uverbs0".into()))
        );
        assert_eq!(
            place_of(c"/sys/class/infiniband/sim0/ports/1/lid"),
            Some((IB_CLASS, "/sim0/ports/1/lid".into()))
        );
        assert_eq!(
            place_of(c"/sys/class/infiniband_verbs/uverbs0/ibdev"),
            Some((VERBS_CLASS, "/uverbs0/ibdev".into()))
        );
        assert_eq!(
            place_of(c"/sys/class/misc/rdma_cm/abi_version"),
            Some((MISC_CM, "/abi_version".into()))
        );
        // SAFETY: NUL-terminated strings.
        unsafe {
            assert!(is_rdma_cm(c"/dev/infiniband/rdma_cm".as_ptr()));
            assert!(!is_rdma_cm(c"/dev/infiniband/rdma_cmx".as_ptr()));
            assert!(!is_rdma_cm(c"/dev/infiniband/rdma".as_ptr()));
        }
        for other in [
            c"/sys/class/misc/rdma_cmx",
            c"/sys/class/misc",
            c"/dev/infinibandx",
            c"/dev/null",
            c"/sys/class/infiniband_mad",
            c"/sys/class/infiniband_verbsx",
            c"/sys/class/net/lo",
            c"sys/class/infiniband",
            c"/",
            c"",
        ] {
            assert_eq!(place_of(other), None, "{other:?}");
        }
    }
}
