//! A device's table of what a same-host peer may reach directly: region slots and QP
//! slots in a memfd only the owner writes ([`OwnerTable`]), mapped read-only by peers
//! ([`PeerTable`]), whose [`PeerTable::check`] is the responder's remote access check
//! run by the requester (IBA 9.7.4.1.4; the sim's own is `MrTable::resolve_remote`).
//!
//! Layout (all little words, offsets fixed by this build):
//! - a header: a magic word, the address of a word of the owner's memory a peer may
//!   read to learn whether it may copy to and from this process ([`super::cma`]), and the
//!   value that word holds (random per table: a process that is not the owner, such as a
//!   forked relative with the same addresses, holds another);
//! - [`MR_SLOTS`] region slots of 48 bytes: state (`generation << 1 | alive`), rkey, PD,
//!   access flags, address, length, and for a region whose pages live in a memfd (map
//!   mode, [`super::swap`]) the memfd's inode number and the owner's descriptor number
//!   for it (zero and zero otherwise), which a peer opens through `/proc`
//!   ([`super::mapped`]). A region's place is found from its rkey by at most
//!   [`PROBES`] steps of linear probing; a region that finds none free is not published
//!   (it is reached over the rings);
//! - [`QP_SLOTS`] QP slots of 16 bytes: state, QP number, PD, access flags; alive only
//!   while the QP accepts requests (RTR, RTS or SQD). A QP's place is found from its
//!   number as a region's from its rkey ([`PeerTable::find_qp`]).
//!
//! Revocation ([`OwnerTable::revoke_mr`], [`OwnerTable::revoke_qp`]): the owner stores
//! the slot dead, then waits until no peer's use count for it is raised (or the peer is
//! gone). The requester raises its count before it reads the state. Both sides store
//! then load with `SeqCst`, so either the requester sees the slot dead or the owner sees
//! its count: once a revocation returned, no copy of a peer that checked the slot is
//! still running and none will start. Slot fields are rewritten only while the slot is
//! dead and drained, so a requester that holds a count and saw the slot alive reads
//! fields that do not change under it.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use verbs_api::AccessFlags;

use super::segment::{self, Mapping};
use super::usage::{Peer, Usage};

/// Region slots in a table.
pub const MR_SLOTS: usize = 4096;
/// QP slots in a table.
pub const QP_SLOTS: usize = 1024;
/// How many places a region's rkey may take, from its hash on.
pub const PROBES: usize = 8;

const MAGIC: u64 = u64::from_le_bytes(*b"rsim1sd2");
const HEADER: usize = 64;
const PROBE_ADDR: usize = 8;
const PROBE_VALUE: usize = 16;
const MR_SLOT: usize = 48;
const QP_SLOT: usize = 16;
const QP_BASE: usize = HEADER + MR_SLOTS * MR_SLOT;
/// The size of a table segment.
pub const LEN: usize = QP_BASE + QP_SLOTS * QP_SLOT;

const ALIVE: u32 = 1;

fn mr_off(slot: usize) -> usize {
    HEADER + slot * MR_SLOT
}

fn qp_off(slot: usize) -> usize {
    QP_BASE + slot * QP_SLOT
}

/// The first place of rkey `key` (a multiplicative hash: keys are random, but a seed
/// makes them a sequence).
pub(super) fn home(key: u32) -> usize {
    (key.wrapping_mul(0x9E37_79B1) >> 20) as usize % MR_SLOTS
}

/// The first place of QP number `qpn` among the QP slots.
fn qp_home(qpn: u32) -> usize {
    (qpn.wrapping_mul(0x9E37_79B1) >> 20) as usize % QP_SLOTS
}

/// The operation a requester wants to run directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// RDMA WRITE: needs `REMOTE_WRITE`.
    Write,
    /// RDMA READ: needs `REMOTE_READ`.
    Read,
    /// An atomic on one aligned 8-byte word: needs `REMOTE_ATOMIC`.
    Atomic,
}

impl Op {
    fn need(self) -> AccessFlags {
        match self {
            Op::Write => AccessFlags::REMOTE_WRITE,
            Op::Read => AccessFlags::REMOTE_READ,
            Op::Atomic => AccessFlags::REMOTE_ATOMIC,
        }
    }
}

/// Why a request does not take the fast path: it goes over the rings then, and the
/// responder's own check decides (a refusal here is no verdict).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Zero bytes, or an aligned 8-byte word (which the sim stores as one atomic word,
    /// which a cross-process copy does not promise); for an atomic, anything but one
    /// aligned 8-byte word.
    NotTaken,
    /// No live region with this rkey in its places (not published, a window, or
    /// deregistered).
    NoRegion,
    /// The QP slot named is not alive with this QP number (not ready, or in error).
    QpNotReady,
    /// The region belongs to another PD than the QP.
    WrongPd,
    /// The QP or the region lacks the operation's remote right.
    NoRight,
    /// The range is not inside the region.
    OutOfBounds,
    /// The connection was closed by one side ([`Usage::close`]).
    Closed,
}

/// The owner's table: it publishes its regions and QPs and revokes them.
pub struct OwnerTable {
    map: Mapping,
    fd: OwnedFd,
    /// Which region and QP slots are taken (published, or being revoked).
    taken: Mutex<Taken>,
    peers: Mutex<Vec<Arc<Peer>>>,
}

struct Taken {
    mr: Vec<bool>,
    qp: Vec<bool>,
}

/// A published region's place, for its revocation.
#[derive(Debug, PartialEq, Eq)]
pub struct MrSlot(usize);

/// A published QP's place: its index goes to the peer at connection setup.
#[derive(Debug, PartialEq, Eq)]
pub struct QpSlot(usize);

impl QpSlot {
    /// The index the peer names in [`PeerTable::check`].
    pub fn index(&self) -> u32 {
        self.0 as u32
    }
}

/// How a revocation ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Revoked {
    /// Every live peer's count drained (or none was raised).
    Drained,
    /// Peers still held a count after the bound: they are listed so that their
    /// connections are closed (see the module docs of [`super::usage`]).
    Stuck(Vec<Arc<Peer>>),
}

impl OwnerTable {
    /// A fresh table (no region or QP published); `probe` is the address of a word of
    /// this process's memory peers read to test their right to copy, `value` what it
    /// holds.
    pub fn create(probe: u64, value: u64) -> io::Result<OwnerTable> {
        let (fd, map) = segment::create("rdma-sim-onesided-table", LEN, true)?;
        map.u64_at(0).store(MAGIC, Ordering::Relaxed);
        map.u64_at(PROBE_VALUE).store(value, Ordering::Relaxed);
        map.u64_at(PROBE_ADDR).store(probe, Ordering::Release);
        Ok(OwnerTable {
            map,
            fd,
            taken: Mutex::new(Taken {
                mr: vec![false; MR_SLOTS],
                qp: vec![false; QP_SLOTS],
            }),
            peers: Mutex::new(Vec::new()),
        })
    }

    /// The segment, to send to a peer.
    pub fn fd(&self) -> BorrowedFd<'_> {
        rustix::fd::AsFd::as_fd(&self.fd)
    }

    /// A new peer connection: its use counts, and their segment to send to it.
    pub fn add_peer(&self) -> io::Result<(Arc<Peer>, OwnedFd)> {
        let (usage, fd) = Usage::create()?;
        let peer = Arc::new(Peer::new(usage));
        self.peers.lock().push(peer.clone());
        Ok((peer, fd))
    }

    /// A new peer connection whose use counts `usage` the peer made (it sent their
    /// segment): a revocation waits for them as for those of [`OwnerTable::add_peer`].
    pub fn add_peer_from(&self, usage: Usage) -> Arc<Peer> {
        let peer = Arc::new(Peer::new(usage));
        self.peers.lock().push(peer.clone());
        peer
    }

    /// Closes a peer's connection ([`Usage::close`]), waits up to `bound` for its copies
    /// to end, then forgets it: revocations no longer wait for it.
    pub fn close_peer(&self, peer: &Arc<Peer>, bound: Duration) -> Revoked {
        peer.usage().close();
        let r = self.drain_one(peer, bound, Usage::any_in_use);
        self.remove_peer(peer);
        r
    }

    /// Forgets a peer whose connection ended (after [`Peer::mark_gone`]).
    pub fn remove_peer(&self, peer: &Arc<Peer>) {
        peer.mark_gone();
        self.peers.lock().retain(|p| !Arc::ptr_eq(p, peer));
    }

    /// Publishes a region, with `mapped` (the owner's descriptor number and the inode
    /// number of the memfd holding its pages) if it has one: `None` if its places are
    /// all taken (it is then reached over the rings only).
    pub fn publish_mr(
        &self,
        key: u32,
        pd: u32,
        access: AccessFlags,
        (addr, len): (u64, u64),
        mapped: Option<(u32, u64)>,
    ) -> Option<MrSlot> {
        let mut taken = self.taken.lock();
        let slot = (0..PROBES)
            .map(|i| (home(key) + i) % MR_SLOTS)
            .find(|&s| !taken.mr[s])?;
        taken.mr[slot] = true;
        let o = mr_off(slot);
        self.map.u32_at(o + 4).store(key, Ordering::Relaxed);
        self.map.u32_at(o + 8).store(pd, Ordering::Relaxed);
        self.map.u32_at(o + 12).store(access.bits(), Ordering::Relaxed);
        self.map.u64_at(o + 16).store(addr, Ordering::Relaxed);
        self.map.u64_at(o + 24).store(len, Ordering::Relaxed);
        let (fd, ino) = mapped.unwrap_or((0, 0));
        self.map.u64_at(o + 32).store(ino, Ordering::Relaxed);
        self.map.u32_at(o + 40).store(fd, Ordering::Relaxed);
        let state = self.map.u32_at(o);
        let next_gen = (state.load(Ordering::Relaxed) >> 1).wrapping_add(1);
        state.store(next_gen << 1 | ALIVE, Ordering::SeqCst);
        Some(MrSlot(slot))
    }

    /// Publishes a QP that accepts requests (RTR, RTS or SQD): `None` if its places are
    /// all taken (its requests then go over the rings).
    pub fn publish_qp(&self, qpn: u32, pd: u32, access: AccessFlags) -> Option<QpSlot> {
        let mut taken = self.taken.lock();
        let slot = (0..PROBES)
            .map(|i| (qp_home(qpn) + i) % QP_SLOTS)
            .find(|&s| !taken.qp[s])?;
        taken.qp[slot] = true;
        let o = qp_off(slot);
        self.map.u32_at(o + 4).store(qpn, Ordering::Relaxed);
        self.map.u32_at(o + 8).store(pd, Ordering::Relaxed);
        self.map.u32_at(o + 12).store(access.bits(), Ordering::Relaxed);
        let state = self.map.u32_at(o);
        let next_gen = (state.load(Ordering::Relaxed) >> 1).wrapping_add(1);
        state.store(next_gen << 1 | ALIVE, Ordering::SeqCst);
        Some(QpSlot(slot))
    }

    /// Revokes a region (`dereg_mr`): once this returns, no peer copies into or out of
    /// it, unless it is listed as [`Revoked::Stuck`] after `bound`.
    pub fn revoke_mr(&self, slot: MrSlot, bound: Duration) -> Revoked {
        self.kill_state(mr_off(slot.0));
        let r = self.drain(bound, |u| u.count(slot.0).load(Ordering::SeqCst) != 0);
        self.taken.lock().mr[slot.0] = false;
        r
    }

    /// Revokes a QP (its move to ERROR, or its destruction): once this returns, no
    /// copy that checked it is running (as [`OwnerTable::revoke_mr`]).
    pub fn revoke_qp(&self, slot: QpSlot, bound: Duration) -> Revoked {
        self.kill_state(qp_off(slot.0));
        let r = self.drain(bound, Usage::any_in_use);
        self.taken.lock().qp[slot.0] = false;
        r
    }

    fn kill_state(&self, off: usize) {
        self.map.u32_at(off).fetch_and(!ALIVE, Ordering::SeqCst);
    }

    /// Waits until no live peer's counts are `held`, or `bound` passed.
    fn drain(&self, bound: Duration, held: impl Fn(&Usage) -> bool) -> Revoked {
        let peers: Vec<Arc<Peer>> = self.peers.lock().clone();
        let start = Instant::now();
        let mut stuck = Vec::new();
        for p in peers {
            let left = bound.saturating_sub(start.elapsed());
            if let Revoked::Stuck(mut s) = self.drain_one(&p, left, &held) {
                stuck.append(&mut s);
            }
        }
        match stuck.is_empty() {
            true => Revoked::Drained,
            false => Revoked::Stuck(stuck),
        }
    }

    /// Waits until peer `p` is gone or its counts are not `held`, or `bound` passed.
    fn drain_one(&self, p: &Arc<Peer>, bound: Duration, held: impl Fn(&Usage) -> bool) -> Revoked {
        let start = Instant::now();
        let mut spins = 0u32;
        while !p.is_gone() && held(p.usage()) {
            if start.elapsed() >= bound {
                return Revoked::Stuck(vec![p.clone()]);
            }
            // A copy is a bounded memcpy: spin briefly, then give the CPU away.
            spins = spins.saturating_add(1);
            match spins {
                0..64 => std::hint::spin_loop(),
                64..1024 => std::thread::yield_now(),
                _ => std::thread::sleep(Duration::from_micros(50)),
            }
        }
        Revoked::Drained
    }
}

#[cfg(test)]
impl OwnerTable {
    /// Fills every slot with garbage, as a hostile owner could: an eighth of the words
    /// any value, the rest from small ranges, so that keys, QP numbers, PDs, rights and
    /// bounds often match a request by chance.
    pub(super) fn scribble(&self, rng: &mut impl rand::Rng) {
        fn small(rng: &mut impl rand::Rng, max: u64) -> u64 {
            match rng.random_range(0..8) {
                0 => rng.random::<u64>(),
                _ => rng.random_range(0..max),
            }
        }
        for s in 0..MR_SLOTS {
            let o = mr_off(s);
            for (at, max) in [(0, 2), (4, 2), (8, 2), (12, 16)] {
                self.map
                    .u32_at(o + at)
                    .store(small(rng, max) as u32, Ordering::Relaxed);
            }
            for at in [16, 24, 32] {
                self.map
                    .u64_at(o + at)
                    .store(small(rng, 1 << 16), Ordering::Relaxed);
            }
            self.map
                .u32_at(o + 40)
                .store(small(rng, 64) as u32, Ordering::Relaxed);
        }
        for s in 0..QP_SLOTS {
            let o = qp_off(s);
            for (at, max) in [(0, 2), (4, 2), (8, 2), (12, 16)] {
                self.map
                    .u32_at(o + at)
                    .store(small(rng, max) as u32, Ordering::Relaxed);
            }
        }
    }
}

/// A WRITE, READ or atomic the requester would run directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The QP slot the peer named for its QP at connection setup.
    pub qp_slot: u32,
    /// The peer's QP number (the destination QP of the request).
    pub qpn: u32,
    /// The request's rkey.
    pub rkey: u32,
    /// The remote address.
    pub addr: u64,
    /// How many bytes.
    pub len: u64,
    /// WRITE, READ or atomic.
    pub op: Op,
}

/// A peer's table, mapped read-only.
pub struct PeerTable {
    map: Mapping,
}

/// A passed check: the requester holds the slot's use count until this is dropped, and
/// may copy `len` bytes at the peer's address `addr` meanwhile.
pub struct Granted<'a> {
    usage: &'a Usage,
    slot: usize,
    /// The address in the peer's memory, inside the region.
    pub addr: u64,
    /// How many bytes.
    pub len: usize,
    /// Where the region's pages are, if the owner moved them into a memfd.
    pub mapped: Option<MapRef>,
}

/// A granted region's memfd as the owner's table names it (read under the use count,
/// so it is the one of the region granted; [`super::mapped`] checks it all the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapRef {
    /// The region slot.
    pub slot: usize,
    /// The slot's generation: the slot was published again if it changed.
    pub generation: u32,
    /// The owner's descriptor number for the memfd.
    pub fd: u32,
    /// The memfd's inode number.
    pub ino: u64,
    /// The region's first address in the owner's memory (offset 0 of the memfd).
    pub region_addr: u64,
    /// The region's length.
    pub region_len: u64,
}

impl Drop for Granted<'_> {
    fn drop(&mut self) {
        self.usage.count(self.slot).fetch_sub(1, Ordering::SeqCst);
    }
}

impl PeerTable {
    /// Maps a table a peer sent, once its size, seals and magic word check out.
    pub fn map(seg: BorrowedFd<'_>) -> io::Result<PeerTable> {
        let map = segment::map_peer(seg, LEN, false)?;
        if map.u64_at(0).load(Ordering::Acquire) != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the peer's one-sided table: not a table of this build",
            ));
        }
        Ok(PeerTable { map })
    }

    /// The bounds of the region slot `g` holds, as the table says now.
    #[cfg(test)]
    pub(super) fn bounds_of(&self, g: &Granted<'_>) -> (u64, u64) {
        let o = mr_off(g.slot);
        (
            self.map.u64_at(o + 16).load(Ordering::Relaxed),
            self.map.u64_at(o + 24).load(Ordering::Relaxed),
        )
    }

    /// The address the owner named for the copy-right probe (any value; reading it
    /// only fails if it is bad).
    pub fn probe_addr(&self) -> u64 {
        self.map.u64_at(PROBE_ADDR).load(Ordering::Acquire)
    }

    /// The value the word at [`PeerTable::probe_addr`] holds in the owner's memory.
    pub fn probe_value(&self) -> u64 {
        self.map.u64_at(PROBE_VALUE).load(Ordering::Acquire)
    }

    /// Region slot `slot`'s generation and memfd inode number if it is published (alive)
    /// now with a memfd, as the table says at this moment (read without a use count:
    /// only good for dropping mappings no longer published).
    pub fn published_map(&self, slot: usize) -> Option<(u32, u64)> {
        if slot >= MR_SLOTS {
            return None;
        }
        let o = mr_off(slot);
        let state = self.map.u32_at(o).load(Ordering::Acquire);
        let ino = self.map.u64_at(o + 32).load(Ordering::Relaxed);
        (state & ALIVE != 0 && ino != 0).then_some((state >> 1, ino))
    }

    /// The slot of the peer's QP `qpn`, if it is published (alive) now; the check
    /// confirms it under the use count.
    pub fn find_qp(&self, qpn: u32) -> Option<u32> {
        (0..PROBES).map(|i| (qp_home(qpn) + i) % QP_SLOTS).find_map(|s| {
            let o = qp_off(s);
            let alive = self.map.u32_at(o).load(Ordering::Relaxed) & ALIVE != 0;
            (alive && self.map.u32_at(o + 4).load(Ordering::Relaxed) == qpn).then_some(s as u32)
        })
    }

    /// The responder's remote access check of request `r`, run against the peer's
    /// table with this connection's use counts `usage`.
    pub fn check<'a>(&self, usage: &'a Usage, r: &Request) -> Result<Granted<'a>, Refused> {
        let Request {
            qp_slot,
            qpn,
            rkey,
            addr,
            len,
            op,
        } = *r;
        let word = len == 8 && addr % 8 == 0;
        let not_taken = match op {
            Op::Atomic => !word,
            Op::Write | Op::Read => len == 0 || word || len > isize::MAX as u64,
        };
        if not_taken {
            return Err(Refused::NotTaken);
        }
        let qp_slot = qp_slot as usize;
        if qp_slot >= QP_SLOTS {
            return Err(Refused::QpNotReady);
        }
        // A first look without the count, to find the place: confirmed below.
        let slot = (0..PROBES)
            .map(|i| (home(rkey) + i) % MR_SLOTS)
            .find(|&s| {
                let o = mr_off(s);
                self.map.u32_at(o).load(Ordering::Relaxed) & ALIVE != 0
                    && self.map.u32_at(o + 4).load(Ordering::Relaxed) == rkey
            })
            .ok_or(Refused::NoRegion)?;
        let count = usage.count(slot);
        count.fetch_add(1, Ordering::SeqCst);
        // From here the count is held: dropping `held` lowers it on every refusal.
        let mut held = Granted {
            usage,
            slot,
            addr: 0,
            len: 0,
            mapped: None,
        };
        if usage.is_closed() {
            return Err(Refused::Closed);
        }
        let o = mr_off(slot);
        let state = self.map.u32_at(o).load(Ordering::SeqCst);
        if state & ALIVE == 0 || self.map.u32_at(o + 4).load(Ordering::Relaxed) != rkey {
            return Err(Refused::NoRegion);
        }
        let mr_pd = self.map.u32_at(o + 8).load(Ordering::Relaxed);
        let mr_access = AccessFlags::from_bits_retain(self.map.u32_at(o + 12).load(Ordering::Relaxed));
        let mr_addr = self.map.u64_at(o + 16).load(Ordering::Relaxed);
        let mr_len = self.map.u64_at(o + 24).load(Ordering::Relaxed);
        let q = qp_off(qp_slot);
        if self.map.u32_at(q).load(Ordering::SeqCst) & ALIVE == 0
            || self.map.u32_at(q + 4).load(Ordering::Relaxed) != qpn
        {
            return Err(Refused::QpNotReady);
        }
        let qp_pd = self.map.u32_at(q + 8).load(Ordering::Relaxed);
        let qp_access = AccessFlags::from_bits_retain(self.map.u32_at(q + 12).load(Ordering::Relaxed));
        if qp_pd != mr_pd {
            return Err(Refused::WrongPd);
        }
        if !qp_access.contains(op.need()) || !mr_access.contains(op.need()) {
            return Err(Refused::NoRight);
        }
        let inside = addr
            .checked_sub(mr_addr)
            .and_then(|off| off.checked_add(len))
            .is_some_and(|end| end <= mr_len)
            && mr_addr.checked_add(mr_len).is_some();
        if !inside {
            return Err(Refused::OutOfBounds);
        }
        held.addr = addr;
        held.len = len as usize;
        let ino = self.map.u64_at(o + 32).load(Ordering::Relaxed);
        held.mapped = (ino != 0).then(|| MapRef {
            slot,
            generation: state >> 1,
            fd: self.map.u32_at(o + 40).load(Ordering::Relaxed),
            ino,
            region_addr: mr_addr,
            region_len: mr_len,
        });
        Ok(held)
    }
}
