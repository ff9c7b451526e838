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
//!
//! Memory in the calling thread's live stack (between the frame copying and the top of
//! the thread's stack: the frames of the callers, librdmacm's among them, which keeps
//! its commands and most answers in local variables) is mapped and writable while the
//! call runs, and is copied directly, without a system call ([`on_live_stack`]).

use std::cell::Cell;

use crate::ffi::Errno;

/// A plain C structure: every byte pattern is a valid value (integers, byte arrays,
/// unions of them).
///
/// # Safety
///
/// Implementors are `#[repr(C)]` structures of plain integers and arrays of them.
pub unsafe trait Plain: Copy + Default {}

/// The calling thread's stack, `[low, high)`, as its attributes give it (`None`: not
/// known).
fn stack_bounds() -> Option<(u64, u64)> {
    thread_local! {
        static BOUNDS: Cell<Option<Option<(u64, u64)>>> = const { Cell::new(None) };
    }
    BOUNDS.with(|b| {
        if let Some(v) = b.get() {
            return v;
        }
        let v = query_stack();
        b.set(Some(v));
        v
    })
}

fn query_stack() -> Option<(u64, u64)> {
    // SAFETY: the attributes are initialized by pthread_getattr_np before they are read
    // and destroyed after; the out-pointers are locals.
    unsafe {
        let mut attr: libc::pthread_attr_t = std::mem::zeroed();
        if libc::pthread_getattr_np(libc::pthread_self(), &mut attr) != 0 {
            return None;
        }
        let mut base: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        let r = libc::pthread_attr_getstack(&attr, &mut base, &mut size);
        libc::pthread_attr_destroy(&mut attr);
        (r == 0 && !base.is_null()).then(|| (base as u64, base as u64 + size as u64))
    }
}

/// Whether `[addr, addr + len)` lies in the calling thread's live stack: above this
/// frame (the callers' frames) and below the top of the thread's stack. Such memory is
/// mapped, readable and writable for as long as the call runs; memory anywhere else
/// (another thread's stack, the heap, an alternate signal stack, nothing at all) is
/// not known to be.
#[inline(never)]
pub fn on_live_stack(addr: u64, len: usize) -> bool {
    let marker = 0u8;
    let here = std::hint::black_box(std::ptr::addr_of!(marker)) as u64;
    let Some((low, high)) = stack_bounds() else {
        return false;
    };
    let Some(end) = addr.checked_add(len as u64) else {
        return false;
    };
    low <= here && here < addr && end <= high
}

fn vm(read: bool, local: *mut u8, remote: u64, len: usize) -> Result<(), Errno> {
    if len == 0 {
        return Ok(());
    }
    if on_live_stack(remote, len) {
        // SAFETY: `local` is `len` bytes of the library's own memory (the caller's
        // contract), `remote` is `len` bytes of the calling thread's live stack (mapped,
        // readable and writable), and the two do not overlap: the library's buffers are
        // in this frame or below it, or not on this stack.
        unsafe {
            let r = remote as usize as *mut u8;
            if read {
                std::ptr::copy_nonoverlapping(r, local, len);
            } else {
                std::ptr::copy_nonoverlapping(local, r, len);
            }
        }
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

    fn resolve_route() -> Cmd {
        Cmd {
            hdr: rdma_ucm_cmd_hdr {
                cmd: 4,
                r#in: 8,
                out: 0,
            },
            body: rdma_ucm_resolve_route {
                id: 7,
                timeout_ms: 2000,
            },
        }
    }

    #[test]
    fn a_command_is_copied_from_the_program_once() {
        // On the heap: not the calling thread's stack.
        let cmd = Box::new(resolve_route());
        let at = &*cmd as *const Cmd as u64;
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

    /// librdmacm's commands and most of its answers are local variables of the thread
    /// that writes the command: copied without a system call, both ways.
    #[test]
    fn a_command_and_answer_on_the_callers_stack_take_no_system_call() {
        let cmd = resolve_route();
        let mut answer = rdma_ucm_resolve_route::default();
        let at = &cmd as *const Cmd as u64;
        let to = &mut answer as *mut rdma_ucm_resolve_route as u64;
        assert!(on_live_stack(at, size_of::<Cmd>()));
        let before = copies();
        let w = Window::load(at, size_of::<Cmd>());
        let body: rdma_ucm_resolve_route = read(at + 8, 8).unwrap();
        write(to, &body, size_of::<rdma_ucm_resolve_route>()).unwrap();
        drop(w);
        let hdr: rdma_ucm_cmd_hdr = read(at, size_of::<rdma_ucm_cmd_hdr>()).unwrap();
        assert_eq!(copies() - before, 0);
        assert_eq!((hdr.cmd, answer.id, answer.timeout_ms), (4, 7, 2000));
    }

    /// Another thread's stack is not the caller's: it may be unwound and unmapped at any
    /// time, so it is copied with the system call's checks.
    #[test]
    fn another_threads_stack_is_copied_with_the_system_call() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let cmd = resolve_route();
            tx.send(&cmd as *const Cmd as u64).unwrap();
            done_rx.recv().unwrap();
            std::hint::black_box(&cmd);
        });
        let at = rx.recv().unwrap();
        assert!(!on_live_stack(at, size_of::<Cmd>()));
        let before = copies();
        let body: rdma_ucm_resolve_route = read(at + 8, 8).unwrap();
        assert_eq!((body.id, copies() - before), (7, 1));
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }

    /// A range that runs past the top of the stack, or lies below this frame, is not
    /// the live stack.
    #[test]
    fn only_the_callers_frames_are_the_live_stack() {
        let (_, high) = stack_bounds().unwrap();
        let local = 0u64;
        let at = std::hint::black_box(&local as *const u64 as u64);
        assert!(on_live_stack(at, 8));
        assert!(!on_live_stack(high - 8, 16));
        assert!(!on_live_stack(at - 4096, 8));
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
