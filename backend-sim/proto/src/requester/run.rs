//! Coalesced notices (docs/wire.md `PLACED_RUN`; docs/sim.md "The one-sided fast path"):
//! the notices of consecutive READs and atomics the driver executed itself, first sent in one call of `poll_transmit`, leave as one frame that takes
//! all their PSNs, instead of a frame each. Nothing waits for a notice but its WQE's send
//! queue slot (the completion went early), so the notices are held while the call goes
//! on and leave (a) before any other request frame of the QP, so the responder sees PSNs
//! in order, (b) when the run reaches half the send queue, asking for the ACK that frees
//! their slots, and (c) when the call ends: none waits beyond the call that built it, so
//! a QP's moves to SQD, ERR or RESET, its destruction and a lost connection meet no
//! notice held back, and treat them exactly as single notices.
//!
//! A run of one goes as that WQE's own notice. Resends (a rewind, a timeout, a sequence
//! NAK) are never coalesced: each executed WQE is resent as its own notice, so a run the
//! responder meets again is either wholly seen (a duplicate) or not at all, and a partial
//! overlap comes only from a misbehaving peer.

use super::*;

/// Notices held back: consecutive PSNs from `psn`.
#[derive(Clone, Copy, Debug)]
pub(super) struct NoticeRun {
    psn: u32,
    pkts: u32,
    msgs: u32,
    rd_atomic: u32,
    ack_req: bool,
}

impl Requester {
    /// Holds the notice of executed WQE `idx`, first sent at `psn` over `pkts` PSNs and
    /// asking for an ACK if `ack_req`; sends the run at the bound.
    pub(super) fn defer_notice(&mut self, idx: usize, psn: u32, pkts: u32, ack_req: bool, tx: &mut TxQueue) {
        self.sq[idx].psn = psn;
        let rd = u32::from(self.sq[idx].op.is_read_or_atomic());
        match &mut self.run {
            Some(r) if psn::add(r.psn, r.pkts) == psn => {
                r.pkts += pkts;
                r.msgs += 1;
                r.rd_atomic += rd;
                r.ack_req |= ack_req;
            }
            _ => {
                self.flush_notices(tx);
                self.run = Some(NoticeRun {
                    psn,
                    pkts,
                    msgs: 1,
                    rd_atomic: rd,
                    ack_req,
                });
            }
        }
        let bound = (self.cap / 2).max(1) as u32;
        if let Some(r) = &mut self.run {
            if r.msgs >= bound {
                // Their slots free on the ACK: ask for it now.
                r.ack_req = true;
                self.flush_notices(tx);
            }
        }
    }

    /// Sends the notices held back, if any: one WQE's own notice, or one `PlacedRun`.
    pub(super) fn flush_notices(&mut self, tx: &mut TxQueue) {
        let Some(r) = self.run.take() else { return };
        if r.msgs == 1 {
            if let Some(idx) = self.sq.iter().position(|w| w.executed() && w.psn == r.psn) {
                self.push_notice_with(idx, r.psn, r.ack_req, tx);
                return;
            }
        }
        tx.push_frame(&Frame::PlacedRun {
            psn: r.psn,
            pkts: r.pkts,
            msgs: r.msgs,
            rd_atomic: r.rd_atomic,
            ack_req: r.ack_req,
        });
    }
}
