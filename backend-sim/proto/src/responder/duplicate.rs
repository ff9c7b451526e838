//! Duplicate requests (IBA 9.7.5.1.3, 9.7.7): a PSN behind the expected one was executed
//! before. A SEND or WRITE is acknowledged again (by the next coalesced ACK), a READ is
//! executed again, an atomic is answered with its saved result and not executed again; a
//! notice of a READ or atomic the requester executed itself is acknowledged again.

use verbs_api::WrOpcode;

use super::{reason_of, Incoming, Responder};
use crate::memory::MrTable;
use crate::opcode_table;
use crate::psn;
use crate::tx::TxQueue;
use crate::wire::{Frame, NakCode, NakReason};

impl Responder {
    /// Whether a planted bug ([`crate::plant`]) has this duplicate executed as new.
    #[inline(always)]
    pub(super) fn planted_reexecution(&self, frame: &Frame) -> bool {
        use crate::plant::{active, Plant};
        active(Plant::NoDuplicateCheck)
            || (active(Plant::NoAtomicReplay)
                && matches!(frame, Frame::CmpSwap { .. } | Frame::FetchAdd { .. }))
    }

    pub(super) fn duplicate(&mut self, frame: &Frame, mrs: &MrTable, tx: &mut TxQueue) -> Incoming {
        match *frame {
            Frame::Send { .. }
            | Frame::Write { .. }
            | Frame::WritePlaced { .. }
            | Frame::ReadPlaced { .. }
            | Frame::AtomicPlaced { .. }
            | Frame::Part { .. } => {
                // Owed, not queued: one ACK of the last executed PSN answers a whole run
                // of duplicates, so a peer resending the same SEND without reading the
                // answers cannot make this side queue an ACK per copy.
                self.ack_owed = Some(psn::add(self.epsn, verbs_api::PSN_MASK));
                self.owed_reqs += 1;
                self.ack_asked |= frame.ack_req();
            }
            // With no responder resources no READ was executed, so none is repeated.
            Frame::Read { psn, .. } if self.max_dest_rd_atomic == 0 => {
                let reason = NakReason::NoRdAtomicResources;
                self.nak(tx, psn, reason.code(), Some(reason))
            }
            Frame::Read {
                psn, len, addr, rkey, ..
            } => {
                match mrs.resolve_remote(
                    &self.target(),
                    rkey,
                    addr,
                    len as u64,
                    opcode_table::row(WrOpcode::RdmaRead).access,
                ) {
                    Ok(seg) => {
                        self.flush_ack(tx);
                        tx.push_reply(&Frame::ReadResp { psn, len }, self.msn);
                        if let Some(s) = seg {
                            tx.push_seg(&s);
                        }
                    }
                    Err(e) => {
                        // A debug event: a duplicate does not take the QP to ERR, so a
                        // peer could repeat it at will.
                        let reason = reason_of(e);
                        tracing::debug!(
                            qpn = self.qpn,
                            rkey = %format_args!("{rkey:#x}"),
                            addr = %format_args!("{addr:#x}"),
                            len,
                            reason = ?reason,
                            "repeated READ refused: {reason}"
                        );
                        self.nak(tx, psn, self.code_of(reason), Some(reason))
                    }
                }
            }
            Frame::CmpSwap { psn, .. } | Frame::FetchAdd { psn, .. } => {
                match self.replay.iter().find(|(p, _)| *p == psn) {
                    Some(&(_, orig)) => {
                        self.flush_ack(tx);
                        tx.push_reply(&Frame::AtomicResp { psn, orig }, self.msn);
                    }
                    None => self.nak(tx, psn, NakCode::InvalidRequest, None),
                }
            }
            _ => {}
        }
        Incoming::Discard
    }
}

#[cfg(test)]
mod tests {
    use verbs_api::AccessFlags;

    use super::super::tests::frames;
    use super::super::RespAttrs;
    use super::*;

    /// Found by the `responder` fuzz target: every duplicate SEND/WRITE queued an ACK of
    /// its own, so a peer resending one SEND without reading grew the send queue by 16
    /// bytes per copy. A run of duplicates is now answered by one coalesced ACK.
    #[test]
    fn duplicates_owe_one_coalesced_ack() {
        let mrs = MrTable::default();
        let mut resp = Responder::new(2, 1, 4, 1);
        resp.connect(RespAttrs {
            rq_psn: 7,
            min_rnr_timer: 1,
        });
        resp.access = AccessFlags::REMOTE;
        resp.max_dest_rd_atomic = 4;
        let mut tx = TxQueue::new();
        let mut out = Vec::new();
        let write = Frame::Write {
            psn: 7,
            len: 0,
            addr: 0,
            rkey: 0,
            imm: None,
            solicited: false,
            ack_req: false,
        };
        match resp.on_request(&write, &mrs, &mut tx, &mut out).unwrap() {
            Incoming::Sink(s) => resp.payload_done(s, &mrs, &mut out),
            Incoming::Discard => panic!("a zero-length WRITE is executed"),
        }
        for _ in 0..1000 {
            let dup = Frame::Send {
                psn: 7,
                len: 0,
                imm: None,
                solicited: false,
                ack_req: false,
                inv: None,
            };
            assert!(matches!(
                resp.on_request(&dup, &mrs, &mut tx, &mut out),
                Ok(Incoming::Discard)
            ));
            assert!(matches!(
                resp.on_request(&write, &mrs, &mut tx, &mut out),
                Ok(Incoming::Discard)
            ));
        }
        assert!(tx.is_empty(), "{} bytes queued for duplicates", tx.pending());
        assert!(resp.owes_ack());
        resp.flush_ack(&mut tx);
        assert_eq!(frames(&mut tx), [Frame::Ack { psn: 7 }]);
        assert!(out.is_empty());
        // A duplicate still answers at once when a READ response follows it.
        resp.on_request(&write, &mrs, &mut tx, &mut out).unwrap();
        let read = Frame::Read {
            inflight: 1,
            psn: 8,
            len: 0,
            addr: 0,
            rkey: 0,
        };
        resp.on_request(&read, &mrs, &mut tx, &mut out).unwrap();
        assert_eq!(
            frames(&mut tx),
            [Frame::Ack { psn: 7 }, Frame::ReadResp { psn: 8, len: 0 }]
        );
    }
}
