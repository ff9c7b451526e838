//! An incoming SEND, SEND_WITH_IMM or SEND_WITH_INV (IBA 9.7.4.1.4): it consumes the
//! oldest receive (an RNR NAK without one), its payload is scattered over the receive's
//! buffers, and a message longer than them fails the receive (`IBV_WC_LOC_LEN_ERR`).

use verbs_api::{WcOpcode, WcStatus, WorkCompletion};

use super::{trim, Incoming, Responder, Taken};
use crate::memory::MrTable;
use crate::psn;
use crate::requester::Fatal;
use crate::switches::RecvError;
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
        force_rnr: &mut u32,
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
        if !self.take_recv_or_rnr(psn, tx, force_rnr) {
            return Ok(Incoming::Discard);
        }
        let mut segs = std::mem::take(&mut self.scratch);
        let resolved = mrs.resolve_local(self.pd, &self.wqe.sges, true, &mut segs);
        let total = match resolved {
            Ok(t) => t,
            Err(_) => {
                let status = Self::recv_error(self.sw.recv_bad_lkey, WcStatus::LocProtErr);
                self.fail_recv(status, out);
                self.scratch = segs;
                self.nak(tx, psn, NakCode::RemoteOperational, None);
                return Err(Fatal(status));
            }
        };
        if (len as u64) > total && self.sw.recv_too_small == RecvError::MalformedWqe {
            tracing::debug!(
                qpn = self.qpn,
                len,
                room = total,
                "SEND longer than the receive buffers: a malformed WQE (LOC_QP_OP_ERR) here, the QP goes to ERR"
            );
            self.fail_recv(WcStatus::LocQpOpErr, out);
            self.scratch = segs;
            self.nak(tx, psn, NakCode::RemoteOperational, None);
            return Err(Fatal(WcStatus::LocQpOpErr));
        }
        if (len as u64) > total {
            tracing::debug!(
                qpn = self.qpn,
                len,
                room = total,
                "SEND longer than the receive buffers: LOC_LEN_ERR here, the QP goes to ERR"
            );
            self.fail_recv(WcStatus::LocLenErr, out);
            self.scratch = segs;
            let reason = NakReason::RecvTooShort;
            self.nak(tx, psn, reason.code(), Some(reason));
            return Err(Fatal(WcStatus::LocLenErr));
        }
        if let Some(rkey) = inv {
            if let Err(fatal) = self.check_invalidate(rkey, mrs, out) {
                self.scratch = segs;
                return Err(fatal);
            }
        }
        trim(&mut segs, len as usize);
        self.taken = Some(Taken::Filling {
            opcode: WcOpcode::Recv,
            byte_len: len,
            imm,
            inv,
            solicited,
        });
        self.payload_psn = Some(psn);
        self.payload_ack_req = frame.ack_req();
        self.epsn = psn::add(psn, self.packets(len));
        Ok(Incoming::Sink(segs))
    }
}
