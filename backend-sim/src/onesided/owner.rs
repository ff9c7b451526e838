//! A device's side of the one-sided fast path: its owner table ([`super::table`]), what
//! it publishes there (regions with a remote right at `ibv_reg_mr`, RC QPs while they
//! accept requests) and the revocations that `ibv_dereg_mr`, a QP's move to ERR or
//! RESET and its destruction make before they return; and the setting that turns the
//! fast path on (`RDMA_SIM_ONESIDED=on`) or sets the shortest WRITE it takes
//! (`RDMA_SIM_ONESIDED=<bytes>`, e.g. 1 to put every WRITE it may take through it, as a
//! test of the path does), or turns it on in map mode (`RDMA_SIM_ONESIDED=map`: as `on`,
//! and the pages of eligible regions move into memfds peers map, [`super::swap`]; with
//! its own shortest WRITE, and READ, through a mapping: `RDMA_SIM_ONESIDED=map:<bytes>`).
//!
//! It is off unless asked for: `process_vm_writev` pins the peer's pages and copies them
//! in the kernel, a few times slower per byte than the two in-cache copies through the
//! rings, which two threads overlap (docs/sim.md, "The one-sided fast path", gives the
//! figures and the command).

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backend_sim_proto::memory::MrShared;
use verbs_api::AccessFlags;

use super::swap::Swapped;
use super::table::{MrSlot, OwnerTable, QpSlot, Revoked};
use super::usage::{Peer, Usage};

/// The setting: `on` places WRITEs of [`MIN_LEN`] bytes and more directly, a number is
/// the shortest WRITE placed directly, `map` is `on` with regions' pages in memfds
/// ([`Setting::map`]) and [`MAP_MIN_LEN`] as the shortest WRITE placed through a mapping
/// (READs keep [`MIN_LEN`]), `map:<bytes>` the same with that as the shortest WRITE and
/// READ; unset or `off`, every WRITE stays on the connection.
pub const SETTING: &str = "RDMA_SIM_ONESIDED";

/// The shortest WRITE placed directly by default: below it the connection's rings carry
/// the payload for less than the check and the system call cost (docs/sim.md, "The
/// one-sided fast path", says how it was chosen).
pub const MIN_LEN: u64 = 16 << 10;

/// The shortest WRITE map mode places through a peer's mapped region by default: there
/// a placed WRITE is a `memcpy` and no system call, so it pays from shorter lengths on;
/// below this the rings' copies, which the two sides' threads overlap, still carry more
/// (docs/sim.md, "Map mode", says how it was chosen). A READ placed on the requester's
/// thread forgoes the READs the rings keep in flight at once, and keeps [`MIN_LEN`];
/// copies with `process_vm_writev`/`readv` keep it too ([`Setting::cma_min_len`]).
pub const MAP_MIN_LEN: u64 = 4 << 10;

/// How long a revocation waits for a peer's copy before it gives up on that peer: a copy
/// is a bounded `memcpy`, so only a stopped or hostile peer holds a count this long.
const BOUND: Duration = Duration::from_secs(1);

/// Unset: off for programs; on in this crate's own unit tests, whose subject the fast
/// path is (they share one process, so a test cannot set the variable before the others
/// read it).
const DEFAULT: Option<Setting> = if cfg!(test) {
    Some(Setting {
        min_len: MIN_LEN,
        read_min_len: MIN_LEN,
        map: false,
    })
} else {
    None
};

#[cfg(test)]
thread_local! {
    /// The setting of the devices a unit test opens on its thread, if it chose one (the
    /// tests share a process, so none may set the variable for the others).
    pub(crate) static TEST_SETTING: std::cell::Cell<Option<Setting>> = const { std::cell::Cell::new(None) };
}

/// What [`SETTING`] asks of a process whose fast path is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    /// The shortest WRITE placed directly: in map mode, through a peer's mapped region
    /// ([`Setting::cma_min_len`] for the others).
    pub min_len: u64,
    /// The shortest READ placed directly (likewise).
    pub read_min_len: u64,
    /// Whether eligible regions' pages move into memfds that peers map at `ibv_reg_mr`
    /// (`map`), so that peers copy with `memcpy` and run atomics on them.
    pub map: bool,
}

impl Setting {
    /// The shortest WRITE or READ copied with `process_vm_writev`/`readv`: the setting's
    /// own, except in map mode, whose number is for mapped regions (a system call per
    /// copy does not pay below [`MIN_LEN`] whatever the mapped path does).
    pub fn cma_min_len(&self) -> u64 {
        match self.map {
            true => self.min_len.max(MIN_LEN),
            false => self.min_len,
        }
    }

    /// The setting with `n` as the shortest WRITE and READ.
    pub fn with_min_len(n: u64, map: bool) -> Setting {
        Setting {
            min_len: n,
            read_min_len: n,
            map,
        }
    }
}

/// The fast path's setting in this process, or `None` if it neither offers nor uses the
/// fast path (unset, or `RDMA_SIM_ONESIDED=off`). A value that is neither `off`, `on`,
/// `map`, `map:<bytes>` nor a number is warned about and taken as unset.
pub fn setting() -> Option<Setting> {
    static SET: std::sync::OnceLock<Option<Setting>> = std::sync::OnceLock::new();
    *SET.get_or_init(|| parse(std::env::var(SETTING).ok().as_deref()))
}

/// What the setting's value `v` (`None`: unset) asks for (see [`setting`]).
pub(super) fn parse(v: Option<&str>) -> Option<Setting> {
    let on = |n, map| Some(Setting::with_min_len(n, map));
    match v {
        None | Some("") => DEFAULT,
        Some("on") => on(MIN_LEN, false),
        Some("map") => Some(Setting {
            min_len: MAP_MIN_LEN,
            read_min_len: MIN_LEN,
            map: true,
        }),
        Some("off") => None,
        Some(v) => {
            let (n, map) = match v.strip_prefix("map:") {
                Some(n) => (n, true),
                None => (v, false),
            };
            match n.parse::<u64>() {
                Ok(n) => on(n.max(1), map),
                Err(_) => {
                    tracing::warn!(
                        "{SETTING}={v:?}: neither off, on, map, map:<bytes> nor a byte count; taken as unset (off)"
                    );
                    DEFAULT
                }
            }
        }
    }
}

/// A device's owner table, and the word of its memory that peers probe.
pub struct Owner {
    table: OwnerTable,
    /// The shortest WRITE its requesters place directly, and whether regions are mapped.
    setting: Setting,
    /// WRITEs this device's requesters placed in peers' memory.
    placed: AtomicU64,
    /// The device's capture: while it captures, its requesters place nothing, so that
    /// the capture shows every WRITE's packets with their bytes.
    capture: crate::capture::Slot,
    /// The probed word (boxed: its address is in the table, and stays put).
    _probe: Box<u64>,
}

impl Owner {
    /// A device's owner table, or `None` if the fast path is off or no table could be
    /// made (the device's connections then carry every WRITE); `capture` is the device's.
    pub fn open(capture: crate::capture::Slot) -> Option<Arc<Owner>> {
        #[cfg(test)]
        if let Some(s) = TEST_SETTING.get() {
            return Owner::with_setting(capture, s);
        }
        Owner::with_setting(capture, setting()?)
    }

    /// As [`Owner::open`], with `setting` rather than the process's.
    pub fn with_setting(capture: crate::capture::Slot, setting: Setting) -> Option<Arc<Owner>> {
        // Never zero, so that a word of zeroes elsewhere does not pass for it.
        let probe = Box::new(rand::random::<u64>() | 1);
        match OwnerTable::create(std::ptr::from_ref::<u64>(&probe) as u64, *probe) {
            Ok(table) => Some(Arc::new(Owner {
                table,
                setting,
                placed: AtomicU64::new(0),
                capture,
                _probe: probe,
            })),
            Err(e) => {
                tracing::warn!("no one-sided table ({e}): same-host WRITEs go over the connection");
                None
            }
        }
    }

    /// The shortest WRITE this device's requesters place directly (in map mode, through
    /// a peer's mapped region).
    pub fn min_len(&self) -> u64 {
        self.setting.min_len
    }

    /// The shortest WRITE or READ they copy with `process_vm_writev`/`readv`.
    pub fn cma_min_len(&self) -> u64 {
        self.setting.cma_min_len()
    }

    /// The shortest READ they place directly.
    pub fn read_min_len(&self) -> u64 {
        self.setting.read_min_len
    }

    /// How many WRITEs, READs and atomics this device's requesters executed directly on
    /// same-host peers' memory.
    pub fn placed(&self) -> u64 {
        self.placed.load(Ordering::Relaxed)
    }

    /// Whether this device moves its regions' pages into memfds (map mode).
    pub fn maps(&self) -> bool {
        self.setting.map
    }

    /// Whether the device captures its traffic (and so places nothing).
    pub(super) fn captures(&self) -> bool {
        self.capture.get().is_some()
    }

    /// Counts an operation executed directly by this device's requester.
    pub(super) fn count_placed(&self) {
        self.placed.fetch_add(1, Ordering::Relaxed);
    }

    /// The table, for a connection's setup to send and register peers in.
    pub fn table(&self) -> &OwnerTable {
        &self.table
    }

    /// A peer connection whose use counts are `usage`; forgotten when the returned
    /// handle drops.
    pub fn add_peer(self: &Arc<Self>, usage: Usage) -> PeerHandle {
        PeerHandle {
            owner: self.clone(),
            peer: self.table.add_peer_from(usage),
        }
    }

    /// In map mode, moves the pages of region `mr` (not yet in the device's table) into
    /// a memfd, if it has a remote right and its memory is eligible ([`super::swap`]);
    /// `None` otherwise, with a debug event saying why. The pages move back when the
    /// returned value drops, which must be after the region was revoked and killed.
    pub fn map_region(&self, mr: &MrShared) -> Option<Swapped> {
        if !self.setting.map || !remote(mr) {
            return None;
        }
        // SAFETY: a region's memory stays mapped while it is registered, and the caller
        // drops the value before the registration ends.
        unsafe { Swapped::new(mr.addr() as usize, mr.len()) }
            .inspect_err(|e| match e.kind() {
                // Memory the mode does not take: the common case, not worth a warning.
                std::io::ErrorKind::Unsupported => tracing::debug!(rkey = mr.key, "{e}"),
                _ => tracing::warn!(
                    rkey = mr.key,
                    "the region's pages stay where they are, reached without map mode: {e}"
                ),
            })
            .ok()
    }

    /// Publishes region `mr` if a peer may reach it directly: it has a remote right and
    /// bytes (windows are never published: their rkeys go over the connection); with
    /// the memfd its pages are in, if [`Owner::map_region`] moved them.
    pub fn publish_mr(&self, mr: &MrShared, mapped: Option<&Swapped>) -> Option<MrSlot> {
        if !remote(mr) {
            return None;
        }
        let mapped = mapped.and_then(|s| Some((s.fd()?.as_raw_fd() as u32, s.ino())));
        self.table
            .publish_mr(mr.key, mr.pd, mr.access, (mr.addr(), mr.len() as u64), mapped)
    }

    /// Revokes a region: once this returns no peer copies into it.
    pub fn revoke_mr(&self, slot: MrSlot) {
        self.settle(self.table.revoke_mr(slot, BOUND), "a region");
    }

    /// Publishes RC QP `qpn` of PD `pd` with remote rights `access`.
    pub fn publish_qp(&self, qpn: u32, pd: u32, access: AccessFlags) -> Option<QpSlot> {
        self.table.publish_qp(qpn, pd, access)
    }

    /// Revokes a QP: once this returns no copy that checked it runs.
    pub fn revoke_qp(&self, slot: QpSlot) {
        self.settle(self.table.revoke_qp(slot, BOUND), "a QP");
    }

    fn settle(&self, r: Revoked, what: &str) {
        if let Revoked::Stuck(peers) = r {
            // A same-user process that holds a count this long is stopped or hostile; it
            // could write this process's memory with `process_vm_writev` anyway. Its
            // counts are not waited for again.
            tracing::warn!(
                "revoking {what}: {} same-host peer(s) held the one-sided fast path past {BOUND:?}; no longer waited for",
                peers.len()
            );
            for p in peers {
                p.mark_gone();
            }
        }
    }
}

/// Whether region `mr` has bytes and a remote right.
fn remote(mr: &MrShared) -> bool {
    let rights = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
    mr.access.intersects(rights) && !mr.is_empty()
}

/// A peer connection registered with a device's table; dropping it (the connection
/// ended) closes the connection's fast path, waits for the peer's copies under way, and
/// tells revocations to stop waiting for that peer.
pub struct PeerHandle {
    owner: Arc<Owner>,
    peer: Arc<Peer>,
}

impl Drop for PeerHandle {
    fn drop(&mut self) {
        let r = self.owner.table.close_peer(&self.peer, BOUND);
        self.owner.settle(r, "a closed connection's fast path");
    }
}
