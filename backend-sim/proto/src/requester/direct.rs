//! The requester's side of the same-host one-sided fast path (docs/sim.md "The one-sided
//! fast path"): an RC WRITE the driver may place in the responder's memory itself, after
//! running the responder's access check on state the responder publishes. The protocol
//! core stays free of I/O: the driver hands it a [`DirectWrite`] for the connection, and
//! the core decides which WQEs may ask it and sends what it placed as a
//! [`Frame::WritePlaced`](crate::wire::Frame::WritePlaced), which the responder runs every
//! rule of a WRITE on but moving the data.
//!
//! RC ordering: a WQE may go this way only when every WQE before it has completed or went
//! this way too, so no earlier message still travelling over the connection lands after
//! (or reads before) the data placed now. A WQE asks once: a resend (a rewind after a
//! lost connection, a timeout or an RNR NAK) carries the payload the normal way, and
//! clears the mark, so WQEs after it go the normal way as well.

use super::*;

/// What the driver offers for one connection: the check and the copy of the fast path.
pub trait DirectWrite: Send + Sync {
    /// The shortest message worth placing directly (shorter ones are cheaper over the
    /// connection).
    fn min_len(&self) -> u64;

    /// Runs the responder's remote access check for a WRITE of the bytes of `segs` (the
    /// WQE's gather list, resolved and checked) to `addr` under `rkey` at the peer's QP
    /// `dest_qpn`, and copies them there. True if every byte was placed; false leaves the
    /// WQE to the normal way (bytes a short copy wrote lie inside the checked range, and
    /// the normal WRITE overwrites them).
    fn write(&self, dest_qpn: u32, rkey: u32, addr: u64, segs: &[Seg]) -> bool;
}

impl Requester {
    /// Offers (or, with `None`, withdraws) the fast path of the QP's connection.
    pub fn set_direct(&mut self, direct: Option<Arc<dyn DirectWrite>>) {
        self.direct = direct;
    }

    /// The fast path, if WQE `idx` may ask it (an RC WRITE from registered memory, long
    /// enough, never asked before, with every WQE before it complete or placed); marks
    /// the WQE as having asked.
    pub(super) fn direct_for(&mut self, idx: usize) -> Option<Arc<dyn DirectWrite>> {
        let d = self.direct.as_ref()?;
        if self.uc || self.ud {
            return None;
        }
        let w = &self.sq[idx];
        if !matches!(w.op, WrOp::RdmaWrite { .. } | WrOp::RdmaWriteWithImm { .. })
            || w.inline
            || w.direct_tried
            || w.len < d.min_len()
        {
            return None;
        }
        if !self.sq.iter().take(idx).all(|e| e.status.is_some() || e.placed) {
            return None;
        }
        let d = d.clone();
        self.sq[idx].direct_tried = true;
        Some(d)
    }
}
