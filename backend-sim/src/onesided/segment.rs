//! The memfd segments of the fast path (`man 2 memfd_create`): made by the owner at a
//! fixed size, sealed so that the size and the seals never change, and mapped by the
//! peer only once its size and seals are the ones this build makes. The table is sealed
//! against new writable mappings too (`F_SEAL_FUTURE_WRITE`), after its owner mapped it:
//! only the owner writes it.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

use rustix::fs::SealFlags;
use rustix::mm::{MapFlags, ProtFlags};

/// The seals every segment carries.
fn base_seals() -> SealFlags {
    SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL
}

/// A fresh zeroed segment of `len` bytes, and the owner's writable mapping of it; with
/// `read_only_for_peers`, sealed against any later writable mapping.
pub(super) fn create(name: &str, len: usize, read_only_for_peers: bool) -> io::Result<(OwnedFd, Mapping)> {
    use rustix::fs::MemfdFlags;
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    rustix::fs::ftruncate(&fd, len as u64)?;
    let map = Mapping::new(rustix::fd::AsFd::as_fd(&fd), len, true)?;
    let mut seals = base_seals();
    if read_only_for_peers {
        seals |= SealFlags::FUTURE_WRITE;
    }
    rustix::fs::fcntl_add_seals(&fd, seals)?;
    Ok((fd, map))
}

/// Maps a segment a peer made, after checking it is a memfd of exactly `len` bytes
/// with the seals this build puts on it (`writable`: the use counts; else the table,
/// mapped read-only).
pub(super) fn map_peer(seg: BorrowedFd<'_>, len: usize, writable: bool) -> io::Result<Mapping> {
    let st = rustix::fs::fstat(seg)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(invalid("not a regular file"));
    }
    let seals = rustix::fs::fcntl_get_seals(seg).map_err(|e| invalid(format!("no seals ({e})")))?;
    let mut want = base_seals();
    if !writable {
        want |= SealFlags::FUTURE_WRITE;
    }
    if seals != want {
        return Err(invalid(format!("sealed {seals:?}, not {want:?}")));
    }
    if st.st_size as u64 != len as u64 {
        return Err(invalid(format!("{} bytes, not {len}", st.st_size)));
    }
    Mapping::new(seg, len, writable)
}

fn invalid(why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the peer's one-sided segment: {why}"),
    )
}

/// A fresh shared mapping of the first `len` bytes of `fd` (readable, and writable if
/// `writable`) at an address the kernel chooses; the caller unmaps it.
///
/// # Safety
///
/// The file must stay at least `len` bytes long while it is mapped (sealed against
/// shrinking), so that every page of the mapping stays backed.
pub(super) unsafe fn map_shared(fd: BorrowedFd<'_>, len: usize, writable: bool) -> io::Result<*mut u8> {
    let prot = match writable {
        true => ProtFlags::READ | ProtFlags::WRITE,
        false => ProtFlags::READ,
    };
    // SAFETY: a fresh mapping chosen by the kernel (null hint) replaces nothing; the
    // pages stay backed by the caller's contract.
    let base = unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, fd, 0) }?;
    Ok(base.cast())
}

/// A shared mapping of a whole segment; unmapped on drop.
pub(super) struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is shared memory owned by this value; every access goes through
// atomics, which any thread may use.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: all access is through atomics.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(seg: BorrowedFd<'_>, len: usize, writable: bool) -> io::Result<Mapping> {
        // SAFETY: the file is `len` bytes long and sealed (or about to be, by its maker)
        // against shrinking.
        let base = unsafe { map_shared(seg, len, writable) }?;
        Ok(Mapping { base, len })
    }

    /// The 32-bit word at byte `off`. Panics if `off` is not an aligned offset inside
    /// the mapping: offsets are computed from this build's constants, never read.
    pub(super) fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(off % 4 == 0 && off + 4 <= self.len);
        // SAFETY: in bounds and aligned (checked; the mapping is page-aligned), alive as
        // long as `self`; both processes touch the word only through atomics.
        unsafe { AtomicU32::from_ptr(self.base.add(off).cast()) }
    }

    /// The 64-bit word at byte `off` (as [`Mapping::u32_at`]).
    pub(super) fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off % 8 == 0 && off + 8 <= self.len);
        // SAFETY: as in `u32_at`.
        unsafe { AtomicU64::from_ptr(self.base.add(off).cast()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base..base + len` is this value's own mapping; the words borrow
        // `self`, so none outlives it.
        let _ = unsafe { rustix::mm::munmap(self.base.cast(), self.len) };
    }
}
