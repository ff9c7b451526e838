//! One same-host connection's fast path, both ways: the peer's table mapped read-only
//! and the connection's use counts, through which this side's requester places RC WRITEs
//! and runs READs and atomics itself ([`DirectWrite`], called by the protocol core:
//! `memcpy` and CPU atomics on the peer's memfd-backed regions, [`super::mapped`];
//! WRITEs also with `process_vm_writev` on its other regions; READs and atomics only on
//! the former, see docs/sim.md's map mode caveats), and
//! this side's registration of the same counts with its own table, so that its
//! revocations wait for the peer's copies. Made at the connection's setup
//! (`ring_setup.rs`); dropped when the connection ends, which closes the fast path both
//! ways and waits for copies under way.

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use backend_sim_proto::qp::{DirectAtomic, DirectWrite};
use rustix::process::Pid;

use super::cma::{self, Gate};
use super::mapped::Regions;
use super::owner::{Owner, PeerHandle};
use super::table::{Granted, Op, PeerTable, Request};
use super::usage::Usage;
use backend_sim_proto::memory::Seg;

/// A connection's fast path (see the module docs).
pub struct Link {
    /// This side's way into the peer's memory, if the peer sent its table and this
    /// process may copy into it.
    out: Option<Out>,
    /// The peer's way into this side's memory, registered with this side's table.
    _registered: Option<PeerHandle>,
}

struct Out {
    /// This side's device, which counts what it placed.
    owner: Arc<Owner>,
    table: PeerTable,
    usage: Usage,
    pid: Pid,
    /// Whether `process_vm_writev`/`readv` may reach the peer ([`Gate`]).
    cma: bool,
    /// The peer's memfd-backed regions mapped here.
    regions: Regions,
}

impl Link {
    /// Registers the connection's use counts `usage` with `owner`'s table, before the
    /// table goes to the peer: from then on its revocations wait for the peer's copies.
    pub fn register(owner: &Arc<Owner>, usage: BorrowedFd<'_>) -> io::Result<PeerHandle> {
        Ok(owner.add_peer(Usage::map(usage)?))
    }

    /// A connection's fast path: into process `pid`, whose table is `peer_table` (if it
    /// sent one), with the connection's use counts `usage`, for `owner`'s device; and
    /// `registered`, the peer's into this side's memory. The way out is left out, with a debug message, if the
    /// table is not one this build makes, or this process may not copy into the peer's
    /// memory ([`Gate`]) and does not map regions itself (a peer's memfd-backed regions
    /// need no such right, but an owner that does not map its own offers none).
    pub fn new(
        owner: &Arc<Owner>,
        peer_table: Option<BorrowedFd<'_>>,
        usage: BorrowedFd<'_>,
        pid: Option<Pid>,
        registered: Option<PeerHandle>,
    ) -> Link {
        let out = match (peer_table, pid) {
            (Some(t), Some(pid)) => Out::new(owner, t, usage, pid)
                .inspect_err(|e| tracing::debug!("no one-sided fast path to the peer: {e}"))
                .ok(),
            _ => None,
        };
        Link {
            out,
            _registered: registered,
        }
    }

    /// How many of the peer's regions this side maps now.
    #[cfg(test)]
    pub(super) fn mapped_regions(&self) -> usize {
        self.out.as_ref().map_or(0, |o| o.regions.cached())
    }

    /// Whether this side may place WRITEs in the peer's memory.
    pub fn goes_out(&self) -> bool {
        self.out.is_some()
    }

    /// A WRITE (the bytes of `segs` to the peer) or READ (into `segs`) executed
    /// directly, if the check passes and every byte moves.
    fn copy(&self, qpn: u32, rkey: u32, addr: u64, segs: &[Seg], op: Op) -> bool {
        let Some(o) = &self.out else {
            return false;
        };
        let len = segs.iter().map(|s| s.len as u64).sum();
        let Some(g) = o.grant(qpn, rkey, addr, len, op) else {
            return false;
        };
        let done = o.copy(&g, segs, op);
        if done {
            o.owner.count_placed();
        }
        done
    }
}

impl Out {
    fn new(
        owner: &Arc<Owner>,
        peer_table: BorrowedFd<'_>,
        usage: BorrowedFd<'_>,
        pid: Pid,
    ) -> io::Result<Out> {
        let table = PeerTable::map(peer_table)?;
        let cma = Gate::probe(pid, table.probe_addr(), table.probe_value()) == Gate::Open;
        if !cma && !owner.maps() {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "process_vm_writev may not reach the peer (ptrace access mode check), or the peer is not the table's owner",
            ));
        }
        Ok(Out {
            owner: owner.clone(),
            table,
            usage: Usage::map(usage)?,
            pid,
            cma,
            regions: Regions::new(pid),
        })
    }

    /// Runs the responder's check of `op` on `len` bytes at `addr` under `rkey` at the
    /// peer's QP `qpn`; `None` if the device captures (every operation then shows on
    /// the wire) or anything refuses.
    fn grant(&self, qpn: u32, rkey: u32, addr: u64, len: u64, op: Op) -> Option<Granted<'_>> {
        if self.owner.captures() {
            return None;
        }
        let req = Request {
            qp_slot: self.table.find_qp(qpn)?,
            qpn,
            rkey,
            addr,
            len,
            op,
        };
        self.table.check(&self.usage, &req).ok()
    }

    /// Copies between the local ranges `segs` and the granted range through the peer's
    /// mapped region if it has one, else with `process_vm_*` if allowed: true if every
    /// byte moved.
    fn copy(&self, g: &Granted<'_>, segs: &[Seg], op: Op) -> bool {
        let Some(view) = self.regions.view(g, |s| self.table.published_map(s)) else {
            // Shorter copies than this go the normal way: the caller's threshold (the
            // setting's) is the mapped path's in map mode.
            if (g.len as u64) < self.owner.cma_min_len() {
                return false;
            }
            let r = match op {
                Op::Write if self.cma => cma::write_segs(self.pid, g, segs),
                // READs are placed through a mapping (map mode) only: a placed READ
                // completes before the responder has seen it, so the responder's rq_psn
                // lags the completion and a requester whose max_rd_atomic exceeds the
                // responder's max_dest_rd_atomic gets no NAK-invalid request (docs/sim.md,
                // map mode's caveats); the CMA modes keep READs exact.
                _ => return false,
            };
            return r.unwrap_or(false);
        };
        let Some(m) = g.mapped.as_ref() else {
            return false;
        };
        let mut at = g.addr;
        for s in segs {
            let Some(remote) = view.at(m, at, s.len) else {
                return false;
            };
            let copied = s.with_ptr(|local| {
                let (src, dst) = match op {
                    Op::Read => (remote.cast_const(), local),
                    _ => (local.cast_const(), remote),
                };
                // SAFETY: `local` is `s.len` bytes of a pinned region of this process,
                // `remote` `s.len` bytes inside the peer's mapped region and inside the
                // grant (checked by `at`, and the grant holds the region); the two are
                // distinct mappings.
                unsafe { std::ptr::copy_nonoverlapping(src, dst, s.len) }
            });
            if copied.is_none() {
                return false;
            }
            at += s.len as u64;
        }
        at == g.addr + g.len as u64
    }
}

impl DirectWrite for Link {
    fn min_len(&self) -> u64 {
        match &self.out {
            Some(o) => o.owner.min_len(),
            None => u64::MAX,
        }
    }

    fn write(&self, dest_qpn: u32, rkey: u32, addr: u64, segs: &[Seg]) -> bool {
        self.copy(dest_qpn, rkey, addr, segs, Op::Write)
    }

    fn read(&self, dest_qpn: u32, rkey: u32, addr: u64, segs: &[Seg]) -> bool {
        // (The requester asks with the WRITEs' threshold: a shorter READ goes the normal
        // way before any check.)
        let len: u64 = segs.iter().map(|s| s.len as u64).sum();
        if self.out.as_ref().is_none_or(|o| len < o.owner.read_min_len()) {
            return false;
        }
        self.copy(dest_qpn, rkey, addr, segs, Op::Read)
    }

    fn atomic(&self, dest_qpn: u32, rkey: u32, addr: u64, op: DirectAtomic) -> Option<u64> {
        let o = self.out.as_ref()?;
        let g = o.grant(dest_qpn, rkey, addr, 8, Op::Atomic)?;
        let view = o.regions.view(&g, |s| o.table.published_map(s))?;
        let word = view.at(g.mapped.as_ref()?, g.addr, 8)?;
        if word as usize % 8 != 0 {
            return None;
        }
        // SAFETY: 8 bytes inside the peer's mapped region and the grant (which holds the
        // region until `g` drops, after the operation), 8-byte aligned (checked); the
        // owner touches aligned words of its regions only through atomics, so the word
        // is only ever accessed atomically, by either process.
        let w = unsafe { AtomicU64::from_ptr(word.cast()) };
        let old = match op {
            DirectAtomic::FetchAdd { add } => w.fetch_add(add, Ordering::SeqCst),
            DirectAtomic::CompareSwap { compare, swap } => {
                match w.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
        };
        o.owner.count_placed();
        Some(old)
    }
}
