//! Copies between this process and a same-host peer's memory with
//! `process_vm_writev`/`process_vm_readv` (`man 2 process_vm_readv`), the kernel's
//! cross-memory attach, once a [`Granted`] check holds the region.
//!
//! The calls need the right to ptrace the peer ("Ptrace access mode checking" in
//! `man 2 ptrace`: same user and no stricter policy). [`Gate::probe`] tests it once per
//! peer by reading the word the peer named in its table: refused (or a bad address), the
//! peer's requests stay on the rings. A zero-length call proves nothing (the kernel
//! returns before it checks), so the probe reads one byte.

use std::io;

use rustix::process::Pid;

use super::table::Granted;

/// Whether this process may copy to and from one peer's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// The probe read succeeded.
    Open,
    /// The probe failed: the peer's requests stay on the rings.
    Closed,
}

impl Gate {
    /// Reads one byte at `probe_addr` in process `pid`.
    pub fn probe(pid: Pid, probe_addr: u64) -> Gate {
        let mut byte = 0u8;
        match read_raw(pid, probe_addr, std::ptr::from_mut(&mut byte), 1) {
            Ok(1) => Gate::Open,
            _ => Gate::Closed,
        }
    }
}

/// Copies `src` into the granted range of process `pid` (`src.len()` must be the
/// grant's length). `Ok(false)`: the copy stopped short, and the request must go over
/// the rings (the bytes it did write lie inside the granted range).
pub fn write(pid: Pid, grant: &Granted<'_>, src: &[u8]) -> io::Result<bool> {
    if src.len() != grant.len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the source is not the granted length",
        ));
    }
    let local = libc::iovec {
        iov_base: src.as_ptr().cast_mut().cast(),
        iov_len: src.len(),
    };
    let remote = libc::iovec {
        iov_base: grant.addr as usize as *mut libc::c_void,
        iov_len: grant.len,
    };
    // SAFETY: `local` describes `src`, readable for its length (the kernel only reads
    // it); `remote` is an address in another process, which the kernel checks.
    let n = unsafe { libc::process_vm_writev(pid.as_raw_nonzero().get(), &local, 1, &remote, 1, 0) };
    match n {
        -1 => Err(io::Error::last_os_error()),
        n => Ok(n as usize == grant.len),
    }
}

/// Copies the granted range of process `pid` into `dst` (`dst.len()` must be the
/// grant's length). `Ok(false)`: the copy stopped short (`dst` must not be used).
pub fn read(pid: Pid, grant: &Granted<'_>, dst: &mut [u8]) -> io::Result<bool> {
    if dst.len() != grant.len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the destination is not the granted length",
        ));
    }
    read_raw(pid, grant.addr, dst.as_mut_ptr(), dst.len()).map(|n| n == grant.len)
}

fn read_raw(pid: Pid, addr: u64, dst: *mut u8, len: usize) -> io::Result<usize> {
    let local = libc::iovec {
        iov_base: dst.cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as usize as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `local` describes memory of this process the callers own, writable for
    // `len` bytes; `remote` is an address in another process, which the kernel checks.
    let n = unsafe { libc::process_vm_readv(pid.as_raw_nonzero().get(), &local, 1, &remote, 1, 0) };
    match n {
        -1 => Err(io::Error::last_os_error()),
        n => Ok(n as usize),
    }
}
