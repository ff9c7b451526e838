//! The responder of a UC QP (IBA 9.8.3 "Unreliable connected service", 9.9.3.1 responder
//! errors of classes D and E; `man ibv_post_send`'s opcode table: UC has SEND,
//! SEND_WITH_IMM, RDMA_WRITE and RDMA_WRITE_WITH_IMM).
//!
//! No NAK, no RNR: what would be a NAK on RC drops the message silently, the QP stays in
//! RTS, and the requester never hears of it (its WR completes successfully). The one
//! thing a UC responder sends is an ACK for every message it took in, executed or
//! dropped, also in a state that accepts no requests: the sim's delivery receipt, which
//! times the requester's completion and nothing else (see the requester's `uc`). Each
//! drop is a debug event and counted ([`Responder::take_uc_counts`], the device's
//! counters):
//!
//! - a SEND or RDMA_WRITE_WITH_IMM that finds no receive (own queue or SRQ), or one that
//!   fault injection answers "RNR";
//! - an RDMA WRITE that fails the rkey, PD, access or bounds check (memory untouched). A
//!   WRITE_WITH_IMM's receive then stays with the QP for the next message, except on an
//!   SRQ, where it was consumed and completes with `IBV_WC_REM_ACCESS_ERR` (rxe's
//!   `RESPST_ERR_RKEY_VIOLATION` for UC with an SRQ, "class D");
//! - a READ or an atomic (not UC operations: a peer of another transport), or any
//!   request while the QP is not in RTR, RTS or SQD ([`Responder::uc_unaccepted`]);
//! - a message whose connection broke in the middle of its payload: dropped whole (what
//!   arrived of it stays where it landed, as an HCA leaves a partial message in the
//!   buffer), never resent; its receive is used by the next message.
//!
//! A SEND_WITH_INV invalidates its window as on RC; one that may not is dropped as the
//! other class D errors are, its receive kept for the next message. (rxe completes the
//! receive with `IBV_WC_REM_INV_REQ_ERR` and moves the QP to ERR, its
//! `RESPST_ERR_INVALIDATE_RKEY` for every transport.)
//!
//! A SEND longer than its receive completes the receive with `IBV_WC_LOC_LEN_ERR` (IBA),
//! writes nothing past the buffers, drops the message and leaves the QP in RTS. (rxe gives
//! `IBV_WC_LOC_QP_OP_ERR` and moves the QP to ERR: `copy_data()` fails, then
//! `RESPST_ERR_MALFORMED_WQE`.) A receive with a bad lkey is this QP's own error:
//! `IBV_WC_LOC_PROT_ERR`, and the QP goes to ERR.
//!
//! Frames carry whole messages, so a PSN other than the expected one means the messages
//! between were lost on the way (the requester's queue died with its connection): the
//! message that arrives starts anew, as a FIRST or ONLY packet re-synchronises a UC
//! responder (IBA; rxe's `check_psn()`), and the gap is counted.

use verbs_api::{WcOpcode, WcStatus, WorkCompletion, WrOpcode};

use super::place::{Fill, Unplaced};
use super::{reason_of, Incoming, Responder, Taken};
use crate::faults::ForcedRnr;
use crate::memory::MrTable;
use crate::opcode_table;
use crate::psn;
use crate::requester::Fatal;
use crate::wire::Frame;

impl Responder {
    /// Request `frame` (PSN `psn`) on a UC QP: executed or dropped, and acknowledged
    /// either way (a message with a payload once the payload is in).
    pub(super) fn on_uc_request(
        &mut self,
        frame: &Frame,
        psn: u32,
        mrs: &MrTable,
        out: &mut Vec<(WorkCompletion, bool)>,
        forced_rnr: &mut ForcedRnr,
    ) -> Result<Incoming, Fatal> {
        let r = self.uc_execute(frame, psn, mrs, out, forced_rnr);
        match r {
            Ok(Incoming::Sink(_)) => self.payload_ack_req = frame.ack_req(),
            // (Acknowledged by its last packet's PSN, as an ACK covers a message.)
            _ => self.uc_receipt(psn::add(self.epsn, verbs_api::PSN_MASK), frame.ack_req()),
        }
        r
    }

    /// Owes the ACK that tells the requester message `psn` arrived.
    fn uc_receipt(&mut self, psn: u32, ack_req: bool) {
        self.ack_owed = Some(psn);
        self.owed_reqs += 1;
        self.ack_asked |= ack_req;
    }

    /// A request arrived while the QP accepts none (not in RTR, RTS or SQD): dropped,
    /// counted and acknowledged, as a UC QP drops what it cannot take.
    pub fn uc_unaccepted(&mut self, frame: &Frame) {
        if let Some(psn) = frame.psn().filter(|_| frame.is_request()) {
            self.uc_drop(psn, "request", "the QP is not in RTR, RTS or SQD");
            let last = psn::add(psn, self.packets(frame.payload_len()) - 1);
            self.uc_receipt(last, frame.ack_req());
        }
    }

    fn uc_execute(
        &mut self,
        frame: &Frame,
        psn: u32,
        mrs: &MrTable,
        out: &mut Vec<(WorkCompletion, bool)>,
        forced_rnr: &mut ForcedRnr,
    ) -> Result<Incoming, Fatal> {
        if psn != self.epsn {
            self.uc_gaps += 1;
            tracing::debug!(
                qpn = self.qpn,
                psn,
                expected = self.epsn,
                "UC: PSN gap (messages lost on the way); this message starts anew"
            );
        }
        let len = match *frame {
            Frame::Send { len, .. } | Frame::Write { len, .. } => len,
            _ => 0,
        };
        self.epsn = psn::add(psn, self.packets(len));
        match *frame {
            Frame::Send {
                len,
                imm,
                inv,
                solicited,
                ..
            } => {
                if forced_rnr.fire() {
                    return Ok(self.uc_drop(psn, "SEND", "fault injection forced RNR"));
                }
                if !self.take_recv() {
                    return Ok(self.uc_drop(psn, "SEND", "no receive posted"));
                }
                let segs = match self.place(len as u64, mrs, out) {
                    Ok(segs) => segs,
                    Err(Unplaced::TooLong { .. }) => {
                        return Ok(self.uc_drop(psn, "SEND", "longer than the receive buffers (LOC_LEN_ERR)"))
                    }
                    Err(e) => return Err(Fatal(e.status())),
                };
                if let Some(rkey) = inv.filter(|&k| !self.may_invalidate(k, mrs)) {
                    self.unplace(segs);
                    tracing::debug!(qpn = self.qpn, rkey = %format_args!("{rkey:#x}"), "UC: SEND_WITH_INV names a window it may not invalidate");
                    return Ok(self.uc_drop(psn, "SEND_WITH_INV", "the window may not be invalidated"));
                }
                let fill = Fill {
                    opcode: WcOpcode::Recv,
                    byte_len: len,
                    imm,
                    inv,
                    solicited,
                };
                Ok(self.sink(psn, segs, len, Some(fill)))
            }
            Frame::Write {
                len,
                addr,
                rkey,
                imm,
                solicited,
                ..
            } => {
                if imm.is_some() {
                    if forced_rnr.fire() {
                        return Ok(self.uc_drop(psn, "WRITE_WITH_IMM", "fault injection forced RNR"));
                    }
                    if !self.take_recv() {
                        return Ok(self.uc_drop(psn, "WRITE_WITH_IMM", "no receive posted"));
                    }
                }
                let check = mrs.resolve_remote(
                    &self.target(),
                    rkey,
                    addr,
                    len as u64,
                    opcode_table::row(WrOpcode::RdmaWrite).access,
                );
                let seg = match check {
                    Ok(s) => s,
                    Err(e) => {
                        if imm.is_some() && self.srq().is_some() {
                            self.fail_recv(WcStatus::RemAccessErr, out);
                        }
                        tracing::debug!(
                            qpn = self.qpn,
                            rkey = %format_args!("{rkey:#x}"),
                            addr = %format_args!("{addr:#x}"),
                            len,
                            reason = ?reason_of(e),
                            "UC: WRITE refused: {}",
                            reason_of(e)
                        );
                        return Ok(self.uc_drop(psn, "WRITE", "the remote access check failed"));
                    }
                };
                Ok(self.sink_write(psn, seg, len, imm, solicited))
            }
            _ => Ok(self.uc_drop(psn, "request", "not a UC operation (READ or atomic)")),
        }
    }

    /// Drops message `psn` (`op`) for `why`: counted, a debug event, its payload read and
    /// thrown away.
    fn uc_drop(&mut self, psn: u32, op: &'static str, why: &'static str) -> Incoming {
        self.uc_dropped += 1;
        tracing::debug!(qpn = self.qpn, psn, op, "UC: message dropped: {why}");
        Incoming::Discard
    }

    /// The region the payload was going to was deregistered while it arrived. A SEND's
    /// receive completes with `IBV_WC_LOC_PROT_ERR` (its own buffer is gone: the QP goes
    /// to ERR); a WRITE is dropped (a WRITE_WITH_IMM's receive as for a failed rkey
    /// check).
    pub(super) fn uc_payload_lost(&mut self, out: &mut Vec<(WorkCompletion, bool)>) -> Option<Fatal> {
        self.payload_psn = None;
        let psn = psn::add(self.epsn, verbs_api::PSN_MASK);
        let ack_req = std::mem::take(&mut self.payload_ack_req);
        self.uc_receipt(psn, ack_req);
        match self.taken {
            Some(Taken::Filling {
                opcode: WcOpcode::Recv,
                ..
            }) => {
                self.fail_recv(WcStatus::LocProtErr, out);
                Some(Fatal(WcStatus::LocProtErr))
            }
            Some(_) => {
                if self.srq().is_some() {
                    self.fail_recv(WcStatus::RemAccessErr, out);
                } else {
                    self.taken = Some(Taken::Held);
                }
                self.uc_drop(psn, "WRITE", "its region was deregistered while it arrived");
                None
            }
            None => {
                self.uc_drop(psn, "WRITE", "its region was deregistered while it arrived");
                None
            }
        }
    }

    /// The connection broke in the middle of a message's payload: the message is
    /// dropped whole and its receive kept for the next one (nothing is resent on UC).
    pub(super) fn uc_connection_lost(&mut self) {
        if let Some(psn) = self.payload_psn.take() {
            if self.taken.is_some() {
                self.taken = Some(Taken::Held);
            }
            self.uc_drop(psn, "message", "its connection broke before the payload was in");
        }
        self.payload_ack_req = false;
        self.forget_ack();
    }

    /// Messages dropped and PSN gaps met since the last call.
    pub fn take_uc_counts(&mut self) -> (u64, u64) {
        (
            std::mem::take(&mut self.uc_dropped),
            std::mem::take(&mut self.uc_gaps),
        )
    }
}
