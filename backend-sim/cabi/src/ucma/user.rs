//! Copies between the program's memory and the library's as the kernel's
//! `copy_from_user` / `copy_to_user` do for rdma_cm's commands: an address the program
//! does not have is EFAULT, never a crash (`process_vm_readv` / `process_vm_writev` on
//! the process itself, which check every page).
//!
//! Each such copy is a system call that pins the program's pages, the costliest part
//! of a command on the sim: a command's own bytes (its header and the structure after
//! it) are therefore copied once, into a [`Window`] for the time the command runs, and
//! its reads are served from there. A command whose bytes are not all the program's
//! gets no window, and its reads fail piece by piece as the kernel's do.

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
    #[cfg(test)]
    tests::COPIES.with(|c| c.set(c.get() + 1));
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

/// The most bytes of a command a [`Window`] holds (more than any command of
/// `rdma_user_cm.h` has; a longer write is read piece by piece).
const WINDOW_MAX: usize = 1024;

/// The copy of the command the calling thread runs: where it is in the program's
/// memory (`None`: no command is copied), and its bytes.
struct Cmd {
    at: Option<(u64, usize)>,
    bytes: [u8; WINDOW_MAX],
}

thread_local! {
    static WINDOW: std::cell::RefCell<Cmd> = const {
        std::cell::RefCell::new(Cmd {
            at: None,
            bytes: [0; WINDOW_MAX],
        })
    };
}

/// The `len` bytes of a command at `addr`, copied once for the reads of the command
/// the calling thread runs, until it is dropped.
pub struct Window(());

impl Window {
    /// Copies the program's `len` bytes at `addr`; if they are not all the program's
    /// (or more than a window holds), the command's reads go to the program's memory
    /// one by one, as without a window.
    pub fn load(addr: u64, len: usize) -> Window {
        WINDOW.with(|w| {
            let mut w = w.borrow_mut();
            let ok = len <= WINDOW_MAX && vm(true, w.bytes.as_mut_ptr(), addr, len).is_ok();
            w.at = ok.then_some((addr, len));
        });
        Window(())
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        WINDOW.with(|w| w.borrow_mut().at = None);
    }
}

/// Where `[addr, addr + n)` starts in the window's copy, if the copy holds all of it.
fn within(at: Option<(u64, usize)>, addr: u64, n: usize) -> Option<usize> {
    let (start, len) = at?;
    let off = usize::try_from(addr.checked_sub(start)?).ok()?;
    (off.checked_add(n)? <= len).then_some(off)
}

/// The program's bytes at `addr` into `buf`.
pub fn read_bytes(addr: u64, buf: &mut [u8]) -> Result<(), Errno> {
    let copied = WINDOW.with(|w| {
        let w = w.borrow();
        let off = within(w.at, addr, buf.len())?;
        buf.copy_from_slice(&w.bytes[off..off + buf.len()]);
        Some(())
    });
    match copied {
        Some(()) => Ok(()),
        None => vm(true, buf.as_mut_ptr(), addr, buf.len()),
    }
}

/// `buf` to the program's memory at `addr`.
pub fn write_bytes(addr: u64, buf: &[u8]) -> Result<(), Errno> {
    vm(false, buf.as_ptr().cast_mut(), addr, buf.len())?;
    // An answer written over the command's own bytes is what later reads see.
    WINDOW.with(|w| {
        let mut w = w.borrow_mut();
        let overlaps = w.at.is_some_and(|(start, len)| {
            addr < start + len as u64 && addr.saturating_add(buf.len() as u64) > start
        });
        if overlaps {
            w.at = None;
        }
    });
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// The copies between the program's memory and the library's this thread made.
        pub static COPIES: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }

    fn copies() -> u32 {
        COPIES.with(|c| c.get())
    }

    /// A command as librdmacm writes one: its header, then its structure.
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Cmd {
        hdr: rdma_ucm_cmd_hdr,
        body: rdma_ucm_resolve_route,
    }

    #[test]
    fn a_command_is_copied_from_the_program_once() {
        let cmd = Cmd {
            hdr: rdma_ucm_cmd_hdr {
                cmd: 4,
                r#in: 8,
                out: 0,
            },
            body: rdma_ucm_resolve_route {
                id: 7,
                timeout_ms: 2000,
            },
        };
        let at = &cmd as *const Cmd as u64;
        let before = copies();
        let w = Window::load(at, size_of::<Cmd>());
        let hdr: rdma_ucm_cmd_hdr = read(at, size_of::<rdma_ucm_cmd_hdr>()).unwrap();
        let body: rdma_ucm_resolve_route = read(at + 8, 8).unwrap();
        assert_eq!((hdr.cmd, hdr.r#in, body.id, body.timeout_ms), (4, 8, 7, 2000));
        assert_eq!(copies() - before, 1);
        drop(w);
        // Past the command, reads go to the program's memory again.
        let _: rdma_ucm_cmd_hdr = read(at, size_of::<rdma_ucm_cmd_hdr>()).unwrap();
        assert_eq!(copies() - before, 2);
    }

    #[test]
    fn an_answer_written_over_the_command_is_what_is_read_after() {
        let mut cmd = Cmd::default();
        let at = &mut cmd as *mut Cmd as u64;
        let _w = Window::load(at, size_of::<Cmd>());
        write(at + 8, &rdma_ucm_resolve_route { id: 9, timeout_ms: 1 }, 8).unwrap();
        let body: rdma_ucm_resolve_route = read(at + 8, 8).unwrap();
        assert_eq!((body.id, body.timeout_ms), (9, 1));
    }

    #[test]
    fn a_command_the_program_does_not_have_is_efault() {
        let _w = Window::load(8, 16);
        assert_eq!(read::<rdma_ucm_cmd_hdr>(8, 8).err(), Some(libc::EFAULT));
    }
}
