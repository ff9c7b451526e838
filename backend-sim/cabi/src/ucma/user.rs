//! Copies between the program's memory and the library's as the kernel's
//! `copy_from_user` / `copy_to_user` do for rdma_cm's commands: an address the program
//! does not have is EFAULT, never a crash (`process_vm_readv` / `process_vm_writev` on
//! the process itself, which check every page).

use crate::ffi::Errno;

/// A plain C structure: every byte pattern is a valid value (integers, byte arrays,
/// unions of them).
///
/// # Safety
///
/// Implementors are `#[repr(C)]` structures of plain integers and arrays of them.
pub unsafe trait Plain: Copy + Default {}

fn vm(read: bool, local: *mut u8, remote: u64, len: usize) -> Result<(), Errno> {
    if len == 0 {
        return Ok(());
    }
    let l = libc::iovec {
        iov_base: local.cast(),
        iov_len: len,
    };
    let r = libc::iovec {
        iov_base: remote as usize as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `local` is `len` bytes of the library's own memory (the caller's
    // contract); the kernel checks the program's `remote` range and fails with EFAULT
    // where it is not mapped.
    let n = unsafe {
        if read {
            libc::process_vm_readv(libc::getpid(), &l, 1, &r, 1, 0)
        } else {
            libc::process_vm_writev(libc::getpid(), &l, 1, &r, 1, 0)
        }
    };
    if n == len as isize {
        Ok(())
    } else {
        Err(libc::EFAULT)
    }
}

/// The program's bytes at `addr` into `buf`.
pub fn read_bytes(addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
    vm(true, buf.as_mut_ptr(), addr, buf.len())
}

/// `buf` to the program's memory at `addr`.
pub fn write_bytes(addr: u64, buf: &[u8]) -> Result<(), Errno> {
    vm(false, buf.as_ptr().cast_mut(), addr, buf.len())
}

/// A `T` from the program's `len` bytes at `addr` (fewer than `T` has: the rest zero,
/// as the kernel reads a shorter command of an older librdmacm).
pub fn read<T: Plain>(addr: u64, len: usize) -> Result<T, Errno> {
    let mut v = T::default();
    let n = len.min(size_of::<T>());
    // SAFETY: `v` is a `T`, `n` bytes of it are written, and every byte pattern is a
    // valid `T` (`Plain`).
    let bytes = unsafe { std::slice::from_raw_parts_mut((&mut v as *mut T).cast::<u8>(), n) };
    read_bytes(addr, bytes)?;
    Ok(v)
}

/// `v` to the program's memory at `addr`, at most `len` bytes of it (the answer's size
/// the program gave).
pub fn write<T: Plain>(addr: u64, v: &T, len: usize) -> Result<(), Errno> {
    let n = len.min(size_of::<T>());
    // SAFETY: the first `n` bytes of a live `T` of plain data.
    let bytes = unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), n) };
    write_bytes(addr, bytes)
}

macro_rules! plain {
    ($($t:ty),*) => {$(
        // SAFETY: a `#[repr(C)]` structure of integers and arrays of them (abi::ucma).
        unsafe impl Plain for $t {}
    )*};
}

use crate::abi::ucma::*;
plain!(crate::abi::ib_uverbs_qp_attr);
plain!(
    rdma_ucm_cmd_hdr,
    rdma_ucm_create_id,
    rdma_ucm_create_id_resp,
    rdma_ucm_destroy_id,
    rdma_ucm_destroy_id_resp,
    rdma_ucm_bind_ip,
    rdma_ucm_bind,
    rdma_ucm_resolve_ip,
    rdma_ucm_resolve_addr,
    rdma_ucm_resolve_route,
    rdma_ucm_query,
    rdma_ucm_query_addr_resp,
    rdma_ucm_query_route_resp,
    rdma_ucm_query_path_resp,
    rdma_ucm_connect,
    rdma_ucm_listen,
    rdma_ucm_accept,
    rdma_ucm_reject,
    rdma_ucm_disconnect,
    rdma_ucm_init_qp_attr,
    rdma_ucm_notify,
    rdma_ucm_get_event,
    rdma_ucm_event_resp,
    rdma_ucm_set_option,
    rdma_ucm_migrate_id,
    rdma_ucm_join_ip_mcast,
    rdma_ucm_join_mcast
);
