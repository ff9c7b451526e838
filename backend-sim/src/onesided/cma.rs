//! Copies between this process and a same-host peer's memory with
//! `process_vm_writev`/`process_vm_readv` (`man 2 process_vm_readv`), the kernel's
//! cross-memory attach, once a [`Granted`] check holds the region.
//!
//! The calls need the right to ptrace the peer ("Ptrace access mode checking" in
//! `man 2 ptrace`: same user and no stricter policy). [`Gate::probe`] tests it once per
//! peer by reading the word the peer named in its table, which must hold the value the
//! table says (so a process that is not the table's owner, but for the address could be,
//! never passes): refused, a bad address or another value, the peer's requests stay on
//! the rings. A zero-length call proves nothing (the kernel returns before it checks), so
//! the probe reads the whole word.

use std::io;

use rustix::process::Pid;

use backend_sim_proto::memory::Seg;

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
    /// Reads the word at `probe_addr` in process `pid`: open if it holds `value`.
    pub fn probe(pid: Pid, probe_addr: u64, value: u64) -> Gate {
        let mut word = [0u8; 8];
        match read_raw(pid, probe_addr, word.as_mut_ptr(), 8) {
            Ok(8) if u64::from_ne_bytes(word) == value => Gate::Open,
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

/// The most local ranges [`write_segs`] copies from in one call (a WR's gather list
/// longer than this goes over the rings): the list of ranges lives on the stack, so the
/// data path allocates nothing.
pub const MAX_SEGS: usize = 32;

/// Copies the bytes of the local ranges `segs` (registered memory of this process, each
/// region pinned while the copy runs) into the granted range of process `pid`, in order.
/// `Ok(false)`: more than [`MAX_SEGS`] ranges, a region was deregistered meanwhile, or
/// the copy stopped short (the request must go over the rings). Their lengths must add
/// up to the grant's.
pub fn write_segs(pid: Pid, grant: &Granted<'_>, segs: &[Seg]) -> io::Result<bool> {
    segs_call(pid, grant, segs, Dir::Write)
}

/// Copies the granted range of process `pid` into the local ranges `segs` (registered
/// memory of this process, each region pinned while the copy runs), in order; as
/// [`write_segs`] otherwise (`Ok(false)`: the bytes in `segs` must not be used).
pub fn read_segs(pid: Pid, grant: &Granted<'_>, segs: &[Seg]) -> io::Result<bool> {
    segs_call(pid, grant, segs, Dir::Read)
}

/// Which way a copy goes.
#[derive(Clone, Copy)]
enum Dir {
    /// From this process into the peer (`process_vm_writev`).
    Write,
    /// From the peer into this process (`process_vm_readv`).
    Read,
}

fn segs_call(pid: Pid, grant: &Granted<'_>, segs: &[Seg], dir: Dir) -> io::Result<bool> {
    let total: usize = segs.iter().map(|s| s.len).sum();
    if total != grant.len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the local ranges are not the granted length",
        ));
    }
    if segs.len() > MAX_SEGS {
        return Ok(false);
    }
    let mut local = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; MAX_SEGS];
    Ok(pinned(pid, grant, segs, &mut local, 0, dir)
        .transpose()?
        .unwrap_or(false))
}

/// Pins the regions of `segs` one after the other (each pin lasts until the copy
/// returned), noting each range in `local` from index `at`, then copies from or into all
/// of them with one call. `None`: a region is dead.
fn pinned(
    pid: Pid,
    grant: &Granted<'_>,
    segs: &[Seg],
    local: &mut [libc::iovec; MAX_SEGS],
    at: usize,
    dir: Dir,
) -> Option<io::Result<bool>> {
    let Some((first, rest)) = segs.split_first() else {
        let remote = libc::iovec {
            iov_base: grant.addr as usize as *mut libc::c_void,
            iov_len: grant.len,
        };
        let call = match dir {
            Dir::Write => libc::process_vm_writev,
            Dir::Read => libc::process_vm_readv,
        };
        // SAFETY: the first `at` entries of `local` describe ranges of regions pinned by
        // callers up this recursion (readable and writable for their lengths: the
        // kernel reads them for a write and fills them for a read, never past them);
        // `remote` is an address in another process, which the kernel checks.
        let n = unsafe {
            call(
                pid.as_raw_nonzero().get(),
                local.as_ptr(),
                at as libc::c_ulong,
                &remote,
                1,
                0,
            )
        };
        return Some(match n {
            -1 => Err(io::Error::last_os_error()),
            n => Ok(n as usize == grant.len),
        });
    };
    first
        .with_ptr(|p| {
            local[at] = libc::iovec {
                iov_base: p.cast(),
                iov_len: first.len,
            };
            pinned(pid, grant, rest, local, at + 1, dir)
        })
        .flatten()
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
