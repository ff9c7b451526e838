//! Map mode's page swap (`RDMA_SIM_ONESIDED=map`, docs/sim.md "The one-sided fast
//! path"): at `ibv_reg_mr` the pages of a region move, in place, into a memfd a
//! same-host peer can map, so that its requester copies with `memcpy` and runs CPU
//! atomics on the region (IBA 9.4.5: atomic with the responder's own atomics on the same
//! word); at deregistration they move back into private anonymous memory.
//!
//! A region is taken only if its start and length are page-aligned and every page of it
//! lies in private anonymous writable memory of this process (`/proc/self/maps`, read once
//! per registration): file-backed, shared, stack and special mappings are never touched.
//! The move: a memfd of the region's size, mapped at a temporary address, the bytes
//! copied, then `mremap(MREMAP_FIXED | MREMAP_MAYMOVE)` over the region; the program's
//! addresses and contents stay as they were. Back: the same with a private anonymous
//! mapping. Bytes another thread writes into the region while it moves may be lost (the
//! reason the mode is opt-in).
//!
//! A forked child must not share the pages with its parent (with private memory it gets
//! its own copy at `fork`): a `pthread_atfork` child handler moves every swapped region
//! of the child back into private memory and closes the memfds the child inherited.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, MremapFlags, ProtFlags};

/// The swapped regions of this process, for the fork handlers: the lock is held across
/// `fork` (taken in the prepare handler), so no swap is half done in the child.
static SWAPPED: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// Counts the forks this process came out of as a child: a [`Swapped`] made before the
/// last one was undone by the child handler, and its drop leaves it alone.
static FORKS: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Copy)]
struct Entry {
    addr: usize,
    len: usize,
    fd: RawFd,
    ino: u64,
}

/// A region whose pages live in a memfd; moved back into private anonymous memory on
/// drop (after the region was revoked and no copy runs in it).
pub struct Swapped {
    addr: usize,
    len: usize,
    fd: Option<OwnedFd>,
    ino: u64,
    forks: u64,
}

impl Swapped {
    /// Moves the pages of `addr..addr + len` into a memfd, if the range is eligible (see
    /// the module docs); the error says why not, and the range is then left as it was.
    ///
    /// # Safety
    ///
    /// The range must be memory of this process that stays mapped until the returned
    /// value is dropped (a registered region's memory, which its registration keeps).
    pub unsafe fn new(addr: usize, len: usize) -> io::Result<Swapped> {
        let page = page_size();
        if len == 0 || addr % page != 0 || len % page != 0 {
            return Err(refuse("its start or length is not page-aligned"));
        }
        let maps = std::fs::read_to_string("/proc/self/maps")?;
        eligible(&maps, addr, len)?;
        install_fork_handlers();
        let mut reg = SWAPPED.lock();
        let fd = rustix::fs::memfd_create("rdma-sim-mr", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, len as u64)?;
        // The size never changes, so a peer's mapping never meets a missing page.
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        let ino = rustix::fs::fstat(&fd)?.st_ino;
        // SAFETY: the memfd is `len` bytes long and sealed against shrinking.
        let tmp = unsafe { super::segment::map_shared(fd.as_fd(), len, true) }?;
        // SAFETY: `tmp` is the mapping just made; the range is mapped by the caller's
        // contract and checked writable private memory.
        unsafe { move_over(tmp, addr, len) }?;
        reg.push(Entry {
            addr,
            len,
            fd: fd.as_raw_fd(),
            ino,
        });
        Ok(Swapped {
            addr,
            len,
            fd: Some(fd),
            ino,
            forks: FORKS.load(Ordering::Relaxed),
        })
    }

    /// The memfd holding the region's pages.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(AsFd::as_fd)
    }

    /// The memfd's inode number, which a peer checks the descriptor it opens against.
    pub fn ino(&self) -> u64 {
        self.ino
    }
}

impl Drop for Swapped {
    fn drop(&mut self) {
        if self.forks != FORKS.load(Ordering::Relaxed) {
            // A forked child: the fork handler moved the pages back and closed the
            // descriptor (its number may name another file by now).
            if let Some(fd) = self.fd.take() {
                std::mem::forget(fd);
            }
            return;
        }
        let mut reg = SWAPPED.lock();
        reg.retain(|e| e.addr != self.addr);
        if !still_ours(self.addr, self.len, self.ino) {
            // The program unmapped (or replaced) the memory before it deregistered the
            // region, which the verbs allow: there is nothing to move back, and what is
            // mapped there now is not the sim's to touch.
            tracing::debug!("a deregistered region's memory was unmapped before ibv_dereg_mr: left as it is");
            return;
        }
        // SAFETY: the range is this value's swapped region, still mapped as the sim
        // left it (checked just now).
        if let Err(e) = unsafe { privatize(self.addr, self.len) } {
            // The pages stay in the memfd: still the program's memory, at the same
            // addresses, only not private (a peer no longer reaches it: it was revoked).
            tracing::warn!(
                "a deregistered region's pages stay in their memfd ({e}); the memory is still valid"
            );
        }
    }
}

/// Whether `addr..addr + len` is still exactly one mapping of the memfd with inode
/// `ino` (`/proc/self/map_files`, whose entry exists only for a mapping of exactly that
/// range). Allocates nothing: the fork handler calls it.
fn still_ours(addr: usize, len: usize, ino: u64) -> bool {
    const PREFIX: &[u8] = b"/proc/self/map_files/";
    let mut path = [0u8; 64];
    path[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut at = PREFIX.len();
    at = hex_into(&mut path, at, addr);
    path[at] = b'-';
    at = hex_into(&mut path, at + 1, addr.wrapping_add(len));
    let Ok(path) = std::ffi::CStr::from_bytes_until_nul(&path[..=at]) else {
        return false;
    };
    rustix::fs::stat(path).is_ok_and(|st| st.st_ino == ino)
}

/// Writes `v` in lowercase hexadecimal (no leading zeros) into `buf` at `at`; returns
/// where it ended. `buf` holds the 16 digits a `usize` may take from any `at` it is
/// given here.
fn hex_into(buf: &mut [u8; 64], at: usize, v: usize) -> usize {
    let digits = (usize::BITS - v.leading_zeros()).div_ceil(4).max(1) as usize;
    for i in 0..digits {
        let d = (v >> (4 * (digits - 1 - i))) & 0xf;
        buf[at + i] = b"0123456789abcdef"[d];
    }
    at + digits
}

/// The size of a page.
pub fn page_size() -> usize {
    // SAFETY: `sysconf` reads a constant of the system; no memory is passed.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    }
}

/// Why a range is not swapped.
fn refuse(why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("the region is not mapped for peers: {why}"),
    )
}

/// Checks that `maps` (the text of `/proc/self/maps`) covers `addr..addr + len` with
/// private anonymous writable mappings and nothing else.
pub(super) fn eligible(maps: &str, addr: usize, len: usize) -> io::Result<()> {
    let end = addr.checked_add(len).ok_or_else(|| refuse("its range wraps"))?;
    let mut at = addr;
    for line in maps.lines() {
        let mut f = line.split_ascii_whitespace();
        let (Some(range), Some(perms), Some(_off), Some(_dev), Some(ino)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            return Err(refuse("a line of /proc/self/maps does not parse"));
        };
        let name = f.collect::<Vec<_>>().join(" ");
        let Some((lo, hi)) = range.split_once('-') else {
            return Err(refuse("a line of /proc/self/maps does not parse"));
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) else {
            return Err(refuse("a line of /proc/self/maps does not parse"));
        };
        if hi <= at || lo >= end {
            continue;
        }
        if lo > at {
            return Err(refuse("part of it is not mapped"));
        }
        let anonymous = ino == "0" && (name.is_empty() || name == "[heap]" || name.starts_with("[anon:"));
        if perms != "rw-p" || !anonymous {
            return Err(refuse(&format!(
                "part of it is not private anonymous writable memory ({perms} {name})"
            )));
        }
        at = hi;
        if at >= end {
            return Ok(());
        }
    }
    Err(refuse("part of it is not mapped"))
}

/// Copies `len` bytes at `addr` to `tmp`, then moves the mapping at `tmp` over them.
/// On failure `tmp` is unmapped and the range is as it was.
///
/// # Safety
///
/// `tmp..tmp + len` must be a mapping of its own (made by the caller), and
/// `addr..addr + len` mapped readable memory of this process.
unsafe fn move_over(tmp: *mut u8, addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: both ranges are mapped for `len` bytes (the contract) and distinct (`tmp`
    // is fresh).
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, tmp, len) };
    // SAFETY: `tmp` is a whole mapping of its own; the destination is the caller's
    // range, replaced by pages holding the same bytes.
    let moved =
        unsafe { rustix::mm::mremap_fixed(tmp.cast(), len, len, MremapFlags::MAYMOVE, addr as *mut _) };
    if let Err(e) = moved {
        // SAFETY: the mapping at `tmp` is still its own (the move failed).
        let _ = unsafe { rustix::mm::munmap(tmp.cast(), len) };
        return Err(e.into());
    }
    Ok(())
}

/// Moves the pages of `addr..addr + len` into a fresh private anonymous mapping.
///
/// # Safety
///
/// `addr..addr + len` must be mapped memory of this process.
unsafe fn privatize(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: a fresh private mapping at an address the kernel chooses.
    let tmp = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE,
        )
    }?;
    // SAFETY: `tmp` was just made; the range is mapped (the contract).
    unsafe { move_over(tmp.cast(), addr, len) }
}

fn install_fork_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: the handlers are `extern "C" fn()`s that live for the process.
        let r = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
        if r != 0 {
            tracing::warn!(
                errno = r,
                "pthread_atfork failed: children forked from this process share mapped regions' pages with it"
            );
        }
    });
}

extern "C" fn prepare() {
    // Held across fork, released by `parent` and `child`.
    std::mem::forget(SWAPPED.lock());
}

extern "C" fn parent() {
    // SAFETY: `prepare` took the lock in this thread and forgot its guard.
    unsafe { SWAPPED.force_unlock() };
}

/// The child's handler: its one thread runs it before `fork` returns, so only system
/// calls and a copy run here (no allocation).
extern "C" fn child() {
    FORKS.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the lock is held (taken by `prepare` before the fork), and the child has
    // one thread: nothing else touches the list.
    let reg = unsafe { &mut *SWAPPED.data_ptr() };
    for e in reg.iter() {
        if !still_ours(e.addr, e.len, e.ino) {
            // The parent unmapped the memory before deregistering it: nothing to share.
            continue;
        }
        // SAFETY: the range is still the region's memfd mapping (checked just now), in
        // the child's copy of the parent's address space.
        let _ = unsafe { privatize(e.addr, e.len) };
        // SAFETY: the child's copy of the memfd's descriptor, not used again in the child
        // (the `Swapped` it belongs to knows of the fork and leaves it alone).
        drop(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(e.fd) });
    }
    reg.clear();
    // SAFETY: the lock was taken by `prepare` and its guard forgotten.
    unsafe { SWAPPED.force_unlock() };
}
