//! The shared-memory segment of a same-host connection's rings
//! ([`shm_ring`](crate::shm_ring)): its sizes, making it (`man 2 memfd_create`), sealing
//! it (`man 2 fcntl` "File Sealing"), passing it over the unix socket (`SCM_RIGHTS`),
//! checking one received from a peer, and mapping it. What lives inside it, the rings and
//! their control words, is `shm_ring`'s.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::SealFlags;
/// Bytes of each direction's ring (a power of two) while the process has fewer than
/// [`LARGE_BUDGET`] bytes of such segments mapped: as much as the unix socket's send
/// buffer holds (`same_host`), so that a stream of large messages hands the reader as
/// much per wake-up as the socket did. On a host whose CPUs are all busy, the two ends
/// take turns, and each turn moves at most a ring: with a quarter of this, 1 MiB WRITEs
/// went at a third of the socket's rate.
pub const CAPACITY: usize = 2 << 20;

/// Bytes of each direction's ring once the process has [`LARGE_BUDGET`] bytes of
/// [`CAPACITY`] segments mapped. Ring pages stay resident once touched (a socket's
/// buffer is freed as it is read): 256 connections of one process (the soak test's),
/// both ends in it, touch at most 128 MiB of these. A larger message crosses in pieces,
/// as through a socket's buffer.
pub const SMALL_CAPACITY: usize = 256 << 10;

/// Bytes of [`CAPACITY`] segments a process maps before its connectors make
/// [`SMALL_CAPACITY`] ones: 3 segments (a connection to another process maps one).
pub const LARGE_BUDGET: usize = 16 << 20;

/// Bytes of [`CAPACITY`] segments this process has mapped (either end).
pub(crate) static LARGE_MAPPED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Bytes of the control page before the rings.
pub(crate) const HEADER: usize = 4096;

/// The byte that accompanies the segment's descriptor on the socket.
pub(crate) const SEGMENT_TAG: u8 = b'R';
/// The byte a connector sends instead when the connection is to stay on the socket.
const NO_SEGMENT_TAG: u8 = b'S';

/// Whether this process sets its same-host connections up over rings: yes unless
/// `RDMA_SIM_SHM_RINGS=off` (for comparing with the unix-socket path). The connector
/// decides; the acceptor follows what it sent.
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("RDMA_SIM_SHM_RINGS").map_or(true, |v| v != "off"))
}

/// The seals a segment must carry: its size is fixed, and no one can add or remove a seal.
pub(crate) fn required_seals() -> SealFlags {
    SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL
}

/// The size of a segment whose rings hold `cap` bytes each.
pub(crate) fn segment_len(cap: usize) -> usize {
    HEADER + 2 * cap
}

/// Creates a sealed segment whose rings hold [`CAPACITY`] bytes each, or
/// [`SMALL_CAPACITY`] once the process maps [`LARGE_BUDGET`] bytes of large ones (all
/// indices zero).
pub fn create() -> io::Result<OwnedFd> {
    let large = LARGE_MAPPED.load(Ordering::Relaxed) + segment_len(CAPACITY) <= LARGE_BUDGET;
    create_with(if large { CAPACITY } else { SMALL_CAPACITY })
}

/// The capacity of the rings of segment `seg`, from its size: one of the two this build
/// makes, anything else refused.
pub(crate) fn capacity_of(seg: BorrowedFd<'_>) -> io::Result<usize> {
    let size = rustix::fs::fstat(seg)?.st_size as u64;
    [CAPACITY, SMALL_CAPACITY]
        .into_iter()
        .find(|&cap| segment_len(cap) as u64 == size)
        .ok_or_else(|| invalid(format!("{size} bytes, the size of no segment of this build")))
}

pub(crate) fn create_with(cap: usize) -> io::Result<OwnedFd> {
    use rustix::fs::MemfdFlags;
    let fd = rustix::fs::memfd_create("rdma-sim-rings", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    rustix::fs::ftruncate(&fd, segment_len(cap) as u64)?;
    rustix::fs::fcntl_add_seals(&fd, required_seals())?;
    Ok(fd)
}

/// The refusal of a segment the peer sent.
pub(crate) fn invalid(why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the peer's ring segment: {why}"),
    )
}

/// Sends the segment `seg` over the connected unix socket `sock` (one byte carrying the
/// descriptor), without blocking: `WouldBlock` if the socket's buffer is full.
pub fn send_segment(sock: BorrowedFd<'_>, seg: BorrowedFd<'_>) -> io::Result<()> {
    crate::fd_pass::send(sock, SEGMENT_TAG, &[seg])
}

/// Tells the acceptor that the connection stays on the socket (one byte, no descriptor),
/// without blocking.
pub fn send_no_segment(sock: BorrowedFd<'_>) -> io::Result<()> {
    crate::fd_pass::send(sock, NO_SEGMENT_TAG, &[])
}

/// Receives a segment sent by [`send_segment`] from `sock` (`None`: the peer sent
/// [`send_no_segment`]'s byte), without blocking
/// (`WouldBlock`: not there yet). Anything but one byte with exactly one descriptor is
/// refused (`InvalidData`), and every descriptor that came with it closed.
pub fn recv_segment(sock: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    let (byte, fds) = crate::fd_pass::recv(sock)?;
    if byte == NO_SEGMENT_TAG && fds.is_empty() {
        return Ok(None);
    }
    if byte != SEGMENT_TAG {
        return Err(invalid("not the segment's byte"));
    }
    match <[OwnedFd; 1]>::try_from(fds) {
        Ok([fd]) => Ok(Some(fd)),
        Err(fds) => Err(invalid(format!(
            "{} descriptors where one was expected",
            fds.len()
        ))),
    }
}

/// Checks that `seg` is a segment this side may map: a memfd of exactly the size of
/// rings of `cap` bytes, sealed as the module docs say.
pub(crate) fn validate(seg: BorrowedFd<'_>, cap: usize) -> io::Result<()> {
    let st = rustix::fs::fstat(seg)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(invalid("not a regular file"));
    }
    // Only memfds (and shmem files) take seals: a file elsewhere fails here.
    let seals = rustix::fs::fcntl_get_seals(seg).map_err(|e| invalid(format!("no seals ({e})")))?;
    if !seals.contains(required_seals()) {
        return Err(invalid(format!(
            "sealed {seals:?}, not against shrinking, growing and new seals"
        )));
    }
    if seals.intersects(SealFlags::WRITE | SealFlags::FUTURE_WRITE) {
        return Err(invalid("sealed against writing"));
    }
    if st.st_size as u64 != segment_len(cap) as u64 {
        return Err(invalid(format!("{} bytes, not {}", st.st_size, segment_len(cap))));
    }
    Ok(())
}

/// A shared mapping of a whole segment; unmapped on drop.
pub(crate) struct Mapping {
    pub(crate) base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory owned by this value; every access through it
// goes through raw pointers or atomics, which any thread may use.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: shared access is through atomics (the control words) or raw
// copies of the rings' bytes, whose races at worst give garbage bytes (module docs).
unsafe impl Sync for Mapping {}

impl Mapping {
    pub(crate) fn new(seg: BorrowedFd<'_>, len: usize) -> io::Result<Mapping> {
        use rustix::mm::{MapFlags, ProtFlags};
        // SAFETY: a fresh mapping chosen by the kernel (null hint) replaces nothing; the
        // file was checked to be `len` bytes long and sealed against shrinking, so every
        // page of the mapping stays backed.
        let base = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                seg,
                0,
            )
        }?;
        if len == segment_len(CAPACITY) {
            LARGE_MAPPED.fetch_add(len, Ordering::Relaxed);
        }
        Ok(Mapping {
            base: base.cast(),
            len,
        })
    }

    /// The control word at byte `off` of the control page.
    pub(crate) fn word(&self, off: usize) -> &AtomicU64 {
        assert!(off + 8 <= HEADER && off % 8 == 0);
        // SAFETY: `off` is within the control page (checked), 8-aligned (pages are), and
        // the mapping lives as long as `self`; atomics are how both processes touch it.
        unsafe { AtomicU64::from_ptr(self.base.add(off).cast()) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base..base + len` is this value's own mapping; nothing refers to it
        // after `self` goes (the words borrow `self`).
        let _ = unsafe { rustix::mm::munmap(self.base.cast(), self.len) };
        if self.len == segment_len(CAPACITY) {
            LARGE_MAPPED.fetch_sub(self.len, Ordering::Relaxed);
        }
    }
}
