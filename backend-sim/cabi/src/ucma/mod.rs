//! The kernel's rdma_cm interface for unmodified librdmacm programs (`rdma_user_cm.h`,
//! ABI version 4): `/dev/infiniband/rdma_cm` and the commands written to it, served by
//! the sim's connection manager (`backend_sim::rdmacm`). librdmacm itself stays the
//! system's, so programs get its exact behaviour (rsockets included), as on rxe.
//!
//! - Opening `/dev/infiniband/rdma_cm` ([`crate::interpose`]'s `open`) makes an event
//!   channel and gives the program a descriptor of its own for it (a duplicate of the
//!   channel's eventfd): it polls readable while an event is pending, takes `O_NONBLOCK`
//!   and `fcntl` as any descriptor, and `fstat` calls it the character device librdmacm
//!   checks for.
//! - A `write(2)` to such a descriptor is a command ([`cmds`]): read from the program's
//!   memory, answered into it (EFAULT for memory it does not have, as the kernel's
//!   `copy_from_user` and `copy_to_user`), and the write returns its length, or -1 with
//!   the errno the kernel's rdma_cm gives. `GET_EVENT` waits in the calling thread as
//!   the kernel's does (`O_NONBLOCK`: EAGAIN; a signal: EINTR unless `SA_RESTART`).
//! - Closing it destroys the ids it holds, as the kernel's `release` does.
//!
//! The interposed `write`, `close` and `fstat` look at every call's descriptor first:
//! one load while the process has never opened the device, a bit of a table after
//! (descriptors below 65536; a map beyond), so that programs' writes and closes of
//! their other descriptors stay as cheap as libc's.

pub mod addr;
pub mod cmds;
pub mod path;
pub mod user;

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use backend_sim::rdmacm::manager::DeviceSource;
use backend_sim::rdmacm::{SimCmChannel, SimCmId};
use parking_lot::Mutex;
use verbs_api::rdmacm::{CmBackend, CmId};
use verbs_api::Result;

use crate::ffi::Errno;
use crate::runtime::{runtime, SimContext};

/// Descriptors below this are found in the bit table.
const TABLE_FDS: usize = 1 << 16;

static ANY: AtomicBool = AtomicBool::new(false);
static BITS: [AtomicU64; TABLE_FDS / 64] = [const { AtomicU64::new(0) }; TABLE_FDS / 64];

/// Whether `fd` is an open `/dev/infiniband/rdma_cm` of the program.
#[inline]
pub fn is_cm_fd(fd: RawFd) -> bool {
    if !ANY.load(Ordering::Relaxed) || fd < 0 {
        return false;
    }
    let i = fd as usize;
    if i < TABLE_FDS {
        return BITS[i / 64].load(Ordering::Acquire) & (1 << (i % 64)) != 0;
    }
    state().files.lock().contains_key(&fd)
}

fn mark(fd: RawFd, on: bool) {
    let i = fd as usize;
    if i < TABLE_FDS {
        let bit = 1u64 << (i % 64);
        if on {
            BITS[i / 64].fetch_or(bit, Ordering::Release);
        } else {
            BITS[i / 64].fetch_and(!bit, Ordering::Release);
        }
    }
}

/// An open `/dev/infiniband/rdma_cm`.
pub struct File {
    /// Its event channel.
    pub ch: SimCmChannel,
}

/// An id as the kernel's rdma_cm keeps it for the program.
pub struct Entry {
    /// The id.
    pub id: Arc<SimCmId>,
    /// The descriptor it belongs to.
    pub file: RawFd,
    /// Events handed to the program for it (what `DESTROY_ID` and `MIGRATE_ID` answer).
    pub events: u32,
}

/// A multicast join as the kernel's rdma_cm keeps it for the program (`struct
/// ucma_multicast`): its handle is the context the sim's join carries.
pub struct McEntry {
    /// The id that joined.
    pub id: u32,
    /// The program's value for it (librdmacm's `struct cma_multicast *`).
    pub uid: u64,
    /// Its events handed to the program (what `LEAVE_MCAST` answers).
    pub events: u32,
}

/// The process's open files and ids.
#[derive(Default)]
pub struct State {
    /// Open files by descriptor.
    pub files: Mutex<HashMap<RawFd, Arc<File>>>,
    /// Ids by handle.
    pub ids: Mutex<HashMap<u32, Entry>>,
    /// Multicast joins by handle (taken under the `ids` lock).
    pub mcs: Mutex<HashMap<u32, McEntry>>,
    /// The last join's handle.
    pub last_mc: std::sync::atomic::AtomicU32,
}

/// The process's state.
pub fn state() -> &'static State {
    static S: OnceLock<State> = OnceLock::new();
    S.get_or_init(State::default)
}

/// The devices of the program's device list, shared with its `ibv_open_device`, for the
/// connection manager (librdmacm opens the device an id is bound to by its GUID).
pub struct CabiDevices;

impl DeviceSource for CabiDevices {
    fn count(&self) -> u32 {
        runtime().map_or(0, |rt| rt.devices.len() as u32)
    }

    fn open(&self, index: u32) -> Result<Arc<SimContext>> {
        let rt = runtime().map_err(|e| verbs_api::Error::from_errno("open the sim device", e))?;
        let d = rt
            .devices
            .get(index as usize)
            .ok_or_else(|| verbs_api::Error::cm("rdma_cm", libc::ENODEV, format!("no device {index}")))?;
        d.open(&rt.backend)
    }

    fn opened(&self, index: u32) -> Option<Arc<SimContext>> {
        runtime().ok()?.devices.get(index as usize)?.opened()
    }
}

/// `open("/dev/infiniband/rdma_cm", flags)`: a new event channel; the program's
/// descriptor for it, or -1 with errno.
pub fn open(flags: i32) -> RawFd {
    match open_file(flags) {
        Ok(fd) => fd,
        Err(e) => {
            crate::ffi::set_errno(e);
            -1
        }
    }
}

fn open_file(flags: i32) -> std::result::Result<RawFd, Errno> {
    let rt = runtime()?;
    let ch = rt
        .backend
        .create_event_channel()
        .map_err(|e| crate::ffi::errno_of("open(/dev/infiniband/rdma_cm)", &e))?;
    let cloexec = if flags & libc::O_CLOEXEC != 0 {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    // SAFETY: fcntl on the channel's live descriptor; the result is checked.
    let fd = unsafe { libc::fcntl(verbs_api::rdmacm::CmEventChannel::fd(&ch), cloexec, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EMFILE));
    }
    // The descriptor blocks unless the program asked otherwise (the channel's own is
    // non-blocking, and the two share their status flags).
    // SAFETY: fcntl on a descriptor just made.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        let want = if flags & libc::O_NONBLOCK != 0 {
            fl | libc::O_NONBLOCK
        } else {
            fl & !libc::O_NONBLOCK
        };
        libc::fcntl(fd, libc::F_SETFL, want);
    }
    state().files.lock().insert(fd, Arc::new(File { ch }));
    mark(fd, true);
    ANY.store(true, Ordering::Release);
    tracing::debug!(fd, "rdma_cm: event channel opened");
    Ok(fd)
}

/// `close` of an rdma_cm descriptor: its ids are destroyed (the kernel's `release`);
/// the caller closes the descriptor.
pub fn close(fd: RawFd) {
    mark(fd, false);
    let file = state().files.lock().remove(&fd);
    if file.is_none() {
        return;
    }
    let ids: Vec<Entry> = {
        let mut ids = state().ids.lock();
        let mine: Vec<u32> = ids
            .iter()
            .filter(|(_, e)| e.file == fd)
            .map(|(h, _)| *h)
            .collect();
        let gone: Vec<Entry> = mine.into_iter().filter_map(|h| ids.remove(&h)).collect();
        state()
            .mcs
            .lock()
            .retain(|_, m| !gone.iter().any(|e| e.id.handle() == m.id));
        gone
    };
    drop(ids);
    drop(file);
}

/// `fstat` of an rdma_cm descriptor: the character device the kernel's is.
///
/// # Safety
///
/// `buf` is valid for writes of a `struct stat`.
pub unsafe fn fstat(buf: *mut libc::stat) {
    // SAFETY: the caller's contract.
    let st = unsafe { &mut *buf };
    st.st_mode = libc::S_IFCHR | 0o666;
    st.st_rdev = rdev();
}

/// The device number of the host's rdma_cm if it has one (what the kernel's netlink
/// answer names to librdmacm on such a host), else the misc major and rdma_cm's usual
/// minor.
pub fn rdev() -> libc::dev_t {
    static RDEV: OnceLock<libc::dev_t> = OnceLock::new();
    *RDEV.get_or_init(|| host_dev().unwrap_or_else(|| libc::makedev(10, 58)))
}

/// The host's `/sys/class/misc/rdma_cm/dev` ("major:minor"), read past the library's
/// own answers for that place.
fn host_dev() -> Option<libc::dev_t> {
    let path = c"/sys/class/misc/rdma_cm/dev";
    // SAFETY: a direct system call with a NUL-terminated path; the result is checked.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a descriptor just opened, now owned here.
    let f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd as RawFd) };
    let mut s = String::new();
    std::io::Read::read_to_string(&mut &f, &mut s).ok()?;
    let (maj, min) = s.trim().split_once(':')?;
    Some(libc::makedev(maj.parse().ok()?, min.parse().ok()?))
}

/// The text of `/sys/class/misc/rdma_cm/dev` for the process's tree.
pub fn rdev_text() -> String {
    let d = rdev();
    format!("{}:{}", libc::major(d), libc::minor(d))
}

/// A `write(2)` of `len` bytes at `buf` to rdma_cm descriptor `fd`: the command's
/// length, or -1 with errno.
pub fn write(fd: RawFd, buf: u64, len: usize) -> isize {
    let file = state().files.lock().get(&fd).cloned();
    let Some(file) = file else {
        crate::ffi::set_errno(libc::EBADF);
        return -1;
    };
    let r = crate::ffi::value_verb("write(/dev/infiniband/rdma_cm)", Err(libc::EIO), || {
        cmds::run(fd, &file, buf, len)
    });
    match r {
        Ok(()) => len as isize,
        Err(e) => {
            crate::ffi::set_errno(e);
            -1
        }
    }
}

/// The channel's descriptor, for [`File`]'s owner.
impl AsRawFd for File {
    fn as_raw_fd(&self) -> RawFd {
        verbs_api::rdmacm::CmEventChannel::fd(&self.ch)
    }
}
