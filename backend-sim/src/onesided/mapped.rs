//! The requester's mappings of a same-host peer's memfd-backed regions (map mode,
//! docs/sim.md "The one-sided fast path"): for a granted region whose owner published a
//! memfd ([`MapRef`]), the requester opens `/proc/<owner>/fd/<n>` (same user: the
//! ptrace "read" access mode, which Yama's `ptrace_scope` 1 leaves alone), checks the
//! file, maps it shared and keeps the mapping per region slot until the slot's
//! generation or inode changes.
//!
//! The table is the owner's to write, so whatever it names is refused unless it checks
//! out: a regular file that takes seals and is sealed against shrinking (a memfd: never a
//! file on disk, and its pages cannot go away under the mapping), with the inode number
//! the slot names and at least the region's length. A mapping is only ever touched
//! inside the range a grant checked ([`View::at`]).

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use parking_lot::Mutex;
use rustix::fs::{Mode, OFlags, SealFlags};
use rustix::process::Pid;

use super::table::{Granted, MapRef};

/// One peer's regions mapped here, by region slot.
pub struct Regions {
    pid: Pid,
    cache: Mutex<HashMap<usize, Cached>>,
}

struct Cached {
    generation: u32,
    ino: u64,
    view: Arc<View>,
}

/// A shared mapping of a peer's region: offset 0 is the region's first byte.
pub struct View {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned by this value and lives until it drops; all access goes
// through raw pointers inside checked bounds or atomics, from any thread.
unsafe impl Send for View {}
// SAFETY: as for `Send`.
unsafe impl Sync for View {}

impl View {
    /// A pointer to `len` bytes at the peer's address `addr` of the region `m`
    /// describes, if they lie inside the mapping.
    pub fn at(&self, m: &MapRef, addr: u64, len: usize) -> Option<*mut u8> {
        let off = addr.checked_sub(m.region_addr)?;
        let end = off.checked_add(len as u64)?;
        // SAFETY: `off + len <= self.len`, inside the mapping.
        (end <= self.len as u64).then(|| unsafe { self.base.add(off as usize) })
    }
}

impl Drop for View {
    fn drop(&mut self) {
        // SAFETY: `base..base + len` is this value's own mapping; pointers into it are
        // only used while a caller holds the `Arc`.
        let _ = unsafe { rustix::mm::munmap(self.base.cast(), self.len) };
    }
}

impl Regions {
    /// No regions of process `pid` mapped yet.
    pub fn new(pid: Pid) -> Regions {
        Regions {
            pid,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The mapping of the region `g` granted, if its owner published a memfd for it and
    /// it checks out (opened and mapped now if not cached for the slot's generation).
    /// `None` sends the request the other way (a `process_vm_*` copy or the rings).
    ///
    /// Before a new mapping is made, those of slots `published` no longer names
    /// (deregistered regions: a slot's generation and inode, if alive with a memfd) are
    /// dropped, so that a peer's deregistered regions are not kept alive here for long.
    pub fn view(
        &self,
        g: &Granted<'_>,
        published: impl Fn(usize) -> Option<(u32, u64)>,
    ) -> Option<Arc<View>> {
        let m = g.mapped.as_ref()?;
        let mut cache = self.cache.lock();
        if let Some(c) = cache.get(&m.slot) {
            if c.generation == m.generation && c.ino == m.ino {
                return Some(c.view.clone());
            }
        }
        // The slot was published again (or never seen): its old mapping goes, and so
        // do those of regions deregistered since.
        cache.remove(&m.slot);
        cache.retain(|&slot, c| published(slot) == Some((c.generation, c.ino)));
        match open(self.pid, m) {
            Ok(view) => {
                let view = Arc::new(view);
                cache.insert(
                    m.slot,
                    Cached {
                        generation: m.generation,
                        ino: m.ino,
                        view: view.clone(),
                    },
                );
                Some(view)
            }
            Err(e) => {
                tracing::debug!("a same-host peer's region is not mapped here: {e}");
                None
            }
        }
    }

    /// How many regions are mapped.
    #[cfg(test)]
    pub(super) fn cached(&self) -> usize {
        self.cache.lock().len()
    }
}

fn invalid(why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the peer's region memfd: {why}"),
    )
}

/// Opens and maps the memfd `m` names in process `pid`, once it checks out.
fn open(pid: Pid, m: &MapRef) -> io::Result<View> {
    let len = usize::try_from(m.region_len)
        .ok()
        .filter(|&l| l > 0 && l <= isize::MAX as usize)
        .ok_or_else(|| invalid("no length"))?;
    let path = format!("/proc/{}/fd/{}", pid.as_raw_nonzero(), m.fd);
    // Non-blocking, no controlling terminal: whatever file the number names, opening it
    // has no effect on this process.
    let fd = rustix::fs::open(
        path.as_str(),
        OFlags::RDWR | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&fd)?;
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(invalid("not a regular file"));
    }
    if st.st_ino != m.ino {
        return Err(invalid("not the inode the table names"));
    }
    if (st.st_size as u64) < m.region_len {
        return Err(invalid("shorter than the region"));
    }
    let seals = rustix::fs::fcntl_get_seals(&fd).map_err(|e| invalid(format!("takes no seals ({e})")))?;
    if !seals.contains(SealFlags::SHRINK) {
        return Err(invalid("not sealed against shrinking"));
    }
    // SAFETY: the file is at least `len` bytes long and sealed against shrinking.
    let base = unsafe { super::segment::map_shared(rustix::fd::AsFd::as_fd(&fd), len, true) }?;
    Ok(View { base, len })
}
