//! An incoming SEND, SEND_WITH_IMM or SEND_WITH_INV (IBA 9.7.4.1.4): it consumes the
//! oldest receive (an RNR NAK without one), its payload is scattered over the receive's
//! buffers, and a message longer than them fails the receive (`IBV_WC_LOC_LEN_ERR`).

use verbs_api::{WcOpcode, WcStatus, WorkCompletion};

use super::place::{Fill, Unplaced};
use super::{Incoming, Responder};
use crate::faults::ForcedRnr;
use crate::memory::MrTable;
use crate::psn;
use crate::requester::Fatal;
use crate::tx::TxQueue;
use crate::wire::{Frame, NakCode, NakReason};

impl Responder {
    /// A new SEND `frame` of PSN `psn`, the expected one.
    pub(super) fn on_send(
        &mut self,
        frame: &Frame,
        psn: u32,
        mrs: &MrTable,
        tx: &mut TxQueue,
        out: &mut Vec<(WorkCompletion, bool)>,
        forced_rnr: &mut ForcedRnr,
    ) -> Result<Incoming, Fatal> {
        let Frame::Send {
            len,
            imm,
            inv,
            solicited,
            ..
        } = *frame
        else {
            return Ok(Incoming::Discard);
        };
        if !self.take_recv_or_rnr(psn, tx, forced_rnr) {
            return Ok(Incoming::Discard);
        }
        let segs = match self.place(len as u64, mrs, out) {
            Ok(segs) => segs,
            Err(Unplaced::BadLkey(status)) => {
                self.nak(tx, psn, NakCode::RemoteOperational, None);
                return Err(Fatal(status));
            }
            Err(Unplaced::Malformed { room }) => {
                tracing::debug!(
                    qpn = self.qpn,
                    len,
                    room,
                    "SEND longer than the receive buffers: a malformed WQE (LOC_QP_OP_ERR) here, the QP goes to ERR"
                );
                self.nak(tx, psn, NakCode::RemoteOperational, None);
                return Err(Fatal(WcStatus::LocQpOpErr));
            }
            Err(Unplaced::TooLong { room }) => {
                tracing::debug!(
                    qpn = self.qpn,
                    len,
                    room,
                    "SEND longer than the receive buffers: LOC_LEN_ERR here, the QP goes to ERR"
                );
                let reason = NakReason::RecvTooShort;
                self.nak(tx, psn, reason.code(), Some(reason));
                return Err(Fatal(WcStatus::LocLenErr));
            }
        };
        if let Some(rkey) = inv {
            if let Err(fatal) = self.check_invalidate(rkey, mrs, out) {
                self.unplace(segs);
                return Err(fatal);
            }
        }
        let fill = Fill {
            opcode: WcOpcode::Recv,
            byte_len: len,
            imm,
            inv,
            solicited,
        };
        let sunk = self.sink(psn, segs, len, Some(fill));
        self.payload_ack_req = frame.ack_req();
        self.epsn = psn::add(psn, self.packets(len));
        Ok(sunk)
    }
}
