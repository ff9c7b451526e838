//! One same-host connection's fast path, both ways: the peer's table mapped read-only
//! and the connection's use counts, through which this side's requester places RC WRITEs
//! itself ([`DirectWrite`], called by the protocol core), and this side's registration
//! of the same counts with its own table, so that its revocations wait for the peer's
//! copies. Made at the connection's setup (`ring_setup.rs`); dropped when the
//! connection ends, which closes the fast path both ways and waits for copies under way.

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use backend_sim_proto::qp::DirectWrite;
use rustix::process::Pid;

use super::cma::{self, Gate};
use super::owner::{Owner, PeerHandle};
use super::table::{Op, PeerTable, Request};
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
    /// table is not one this build makes or this process may not copy into the peer's
    /// memory ([`Gate`]).
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

    /// Whether this side may place WRITEs in the peer's memory.
    pub fn goes_out(&self) -> bool {
        self.out.is_some()
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
        if Gate::probe(pid, table.probe_addr(), table.probe_value()) != Gate::Open {
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
        })
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
        let Some(o) = self.out.as_ref().filter(|o| !o.owner.captures()) else {
            return false;
        };
        let len = segs.iter().map(|s| s.len as u64).sum();
        let Some(qp_slot) = o.table.find_qp(dest_qpn) else {
            return false;
        };
        let req = Request {
            qp_slot,
            qpn: dest_qpn,
            rkey,
            addr,
            len,
            op: Op::Write,
        };
        let Ok(grant) = o.table.check(&o.usage, &req) else {
            return false;
        };
        let placed = cma::write_segs(o.pid, &grant, segs).unwrap_or(false);
        if placed {
            o.owner.count_placed();
        }
        placed
    }
}
