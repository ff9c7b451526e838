//! One connection's use counts: a segment the responder makes and the requester maps
//! writable, one 32-bit count per region slot of the responder's table. The requester
//! raises a slot's count before it checks the slot and lowers it once its copy ended;
//! the responder, revoking a slot, waits until the count is zero or the peer is gone.
//!
//! After the counts, one word says the connection is closed: the side whose connection
//! ends stores it (`SeqCst`) and waits until the counts drain; a requester reads it after
//! raising its count and refuses once it is set, so no copy of a connection one side
//! closed runs after that side stopped waiting for it (the store-then-load argument of
//! [`super::table`]'s revocation). Either side may close it: the segment serves both
//! directions of the connection.
//!
//! The counts are the one thing the requester writes into shared state. A hostile peer
//! can only make the responder's revocation wait (up to its bound, after which the
//! connection is closed); the responder never indexes anything with what it reads here.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use super::segment::{self, Mapping};
use super::table::MR_SLOTS;

/// The size of a use-count segment.
pub const LEN: usize = CLOSED + 64;

/// Where the word that says the connection is closed sits.
const CLOSED: usize = MR_SLOTS * 4;

/// One connection's use counts, seen from either side.
pub struct Usage {
    map: Mapping,
}

impl Usage {
    /// The responder's side: a fresh segment (all counts zero) and its descriptor, to be
    /// sent to the peer.
    pub fn create() -> io::Result<(Usage, OwnedFd)> {
        let (fd, map) = segment::create("rdma-sim-onesided-use", LEN, false)?;
        Ok((Usage { map }, fd))
    }

    /// The requester's side: maps the segment the responder sent, once checked.
    pub fn map(seg: BorrowedFd<'_>) -> io::Result<Usage> {
        segment::map_peer(seg, LEN, true).map(|map| Usage { map })
    }

    /// The count of region slot `slot` (`slot < MR_SLOTS`).
    pub(super) fn count(&self, slot: usize) -> &AtomicU32 {
        self.map.u32_at(slot * 4)
    }

    /// Whether any slot's count is not zero (a QP's revocation waits for all of them).
    pub(super) fn any_in_use(&self) -> bool {
        (0..MR_SLOTS).any(|s| self.count(s).load(Ordering::SeqCst) != 0)
    }

    /// Says the connection is closed: requesters refuse from now on (see the module docs).
    pub fn close(&self) {
        self.map.u32_at(CLOSED).store(1, Ordering::SeqCst);
    }

    /// Whether either side closed the connection ([`Usage::close`]).
    pub(super) fn is_closed(&self) -> bool {
        self.map.u32_at(CLOSED).load(Ordering::SeqCst) != 0
    }
}

/// A peer connection as the responder's table knows it: its use counts and whether it
/// is gone (its socket ended), in which case its counts are ignored.
pub struct Peer {
    usage: Usage,
    gone: AtomicBool,
}

impl Peer {
    pub(super) fn new(usage: Usage) -> Peer {
        Peer {
            usage,
            gone: AtomicBool::new(false),
        }
    }

    /// Says the peer is gone: its connection ended (a killed process's included), so
    /// it makes no more copies and a revocation stops waiting for its counts.
    pub fn mark_gone(&self) {
        self.gone.store(true, Ordering::SeqCst);
    }

    /// Whether [`Peer::mark_gone`] ran.
    pub fn is_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }

    /// The peer's use counts.
    pub(super) fn usage(&self) -> &Usage {
        &self.usage
    }
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer").field("gone", &self.is_gone()).finish()
    }
}

/// A peer is itself only: two connections are never equal.
impl PartialEq for Peer {
    fn eq(&self, other: &Peer) -> bool {
        std::ptr::eq(self, other)
    }
}

impl Eq for Peer {}
