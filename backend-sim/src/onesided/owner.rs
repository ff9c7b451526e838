//! A device's side of the one-sided fast path: its owner table ([`super::table`]), what
//! it publishes there (regions with a remote right at `ibv_reg_mr`, RC QPs while they
//! accept requests) and the revocations that `ibv_dereg_mr`, a QP's move to ERR or
//! RESET and its destruction make before they return; and the setting that turns the
//! fast path on (`RDMA_SIM_ONESIDED=on`) or sets the shortest WRITE it takes
//! (`RDMA_SIM_ONESIDED=<bytes>`, e.g. 1 to put every WRITE it may take through it, as a
//! test of the path does).
//!
//! It is off unless asked for: `process_vm_writev` pins the peer's pages and copies them
//! in the kernel, a few times slower per byte than the two in-cache copies through the
//! rings, which two threads overlap (docs/sim.md, "The one-sided fast path", gives the
//! figures and the command).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use backend_sim_proto::memory::MrShared;
use verbs_api::AccessFlags;

use super::table::{MrSlot, OwnerTable, QpSlot, Revoked};
use super::usage::{Peer, Usage};

/// The setting: `on` places WRITEs of [`MIN_LEN`] bytes and more directly, a number is
/// the shortest WRITE placed directly; unset or `off`, every WRITE stays on the
/// connection.
pub const SETTING: &str = "RDMA_SIM_ONESIDED";

/// The shortest WRITE placed directly by default: below it the connection's rings carry
/// the payload for less than the check and the system call cost (docs/sim.md, "The
/// one-sided fast path", says how it was chosen).
pub const MIN_LEN: u64 = 16 << 10;

/// How long a revocation waits for a peer's copy before it gives up on that peer: a copy
/// is a bounded `memcpy`, so only a stopped or hostile peer holds a count this long.
const BOUND: Duration = Duration::from_secs(1);

/// Unset: off for programs; on in this crate's own unit tests, whose subject the fast
/// path is (they share one process, so a test cannot set the variable before the others
/// read it).
const DEFAULT: Option<u64> = if cfg!(test) { Some(MIN_LEN) } else { None };

/// The shortest WRITE this process places directly, or `None` if it neither offers nor
/// uses the fast path (unset, or `RDMA_SIM_ONESIDED=off`). A value that is neither
/// `off`, `on` nor a number is warned about and taken as unset.
pub fn min_len() -> Option<u64> {
    static MIN: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| match std::env::var(SETTING).as_deref() {
        Err(_) | Ok("") => DEFAULT,
        Ok("on") => Some(MIN_LEN),
        Ok("off") => None,
        Ok(v) => match v.parse::<u64>() {
            Ok(n) => Some(n.max(1)),
            Err(_) => {
                tracing::warn!("{SETTING}={v:?}: neither off, on nor a byte count; taken as unset (off)");
                DEFAULT
            }
        },
    })
}

/// A device's owner table, and the word of its memory that peers probe.
pub struct Owner {
    table: OwnerTable,
    /// The shortest WRITE its requesters place directly.
    min_len: u64,
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
        let min_len = min_len()?;
        // Never zero, so that a word of zeroes elsewhere does not pass for it.
        let probe = Box::new(rand::random::<u64>() | 1);
        match OwnerTable::create(std::ptr::from_ref::<u64>(&probe) as u64, *probe) {
            Ok(table) => Some(Arc::new(Owner {
                table,
                min_len,
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

    /// The shortest WRITE this device's requesters place directly.
    pub fn min_len(&self) -> u64 {
        self.min_len
    }

    /// How many WRITEs this device's requesters placed in same-host peers' memory.
    pub fn placed(&self) -> u64 {
        self.placed.load(Ordering::Relaxed)
    }

    /// Whether the device captures its traffic (and so places nothing).
    pub(super) fn captures(&self) -> bool {
        self.capture.get().is_some()
    }

    /// Counts a WRITE placed by this device's requester.
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

    /// Publishes region `mr` if a peer may reach it directly: it has a remote right and
    /// bytes (windows are never published: their rkeys go over the connection).
    pub fn publish_mr(&self, mr: &MrShared) -> Option<MrSlot> {
        let remote = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        if !mr.access.intersects(remote) || mr.is_empty() {
            return None;
        }
        self.table
            .publish_mr(mr.key, mr.pd, mr.access, mr.addr(), mr.len() as u64)
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
