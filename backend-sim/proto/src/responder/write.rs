//! An incoming RDMA WRITE or WRITE_WITH_IMM (IBA 9.7.4.1.5): the remote access check,
//! then its payload goes straight to the region; with an immediate it consumes a receive
//! first (an RNR NAK without one). A [`Frame::WritePlaced`] (the same-host requester
//! moved the data itself) meets every one of these rules and only has no payload to
//! place.

use verbs_api::{WorkCompletion, WrOpcode};

use super::{reason_of, Incoming, Responder};
use crate::faults::ForcedRnr;
use crate::memory::MrTable;
use crate::opcode_table;
use crate::psn;
use crate::requester::Fatal;
use crate::tx::TxQueue;
use crate::wire::{Frame, NakReason};

impl Responder {
    /// A new WRITE (or placed WRITE) `frame` of PSN `psn`, the expected one.
    pub(super) fn on_write(
        &mut self,
        frame: &Frame,
        psn: u32,
        mrs: &MrTable,
        tx: &mut TxQueue,
        out: &mut Vec<(WorkCompletion, bool)>,
        forced_rnr: &mut ForcedRnr,
    ) -> Result<Incoming, Fatal> {
        let (Frame::Write {
            len,
            addr,
            rkey,
            imm,
            solicited,
            ..
        }
        | Frame::WritePlaced {
            len,
            addr,
            rkey,
            imm,
            solicited,
            ..
        }) = *frame
        else {
            return Ok(Incoming::Discard);
        };
        let placed = matches!(frame, Frame::WritePlaced { .. });
        // Resources (a receive for the immediate) are checked before the rkey, as
        // the responder state machines of rxe and the IBA do. The receive is taken
        // now (an SRQ's last one could go to another QP between a look and a
        // take); if the rkey check fails it completes in error
        // (`Switches::write_imm_bad_rkey`).
        if imm.is_some() && !self.take_recv_or_rnr(psn, tx, forced_rnr) {
            return Ok(Incoming::Discard);
        }
        let seg = match mrs.resolve_remote(
            &self.target(),
            rkey,
            addr,
            len as u64,
            opcode_table::row(WrOpcode::RdmaWrite).access,
        ) {
            Ok(s) => s,
            Err(e) => {
                let reason = reason_of(e);
                // The receive the immediate took completes with the switch's
                // status; a QP whose access flags forbid WRITEs refuses the
                // opcode before taking any receive (rxe's `check_op_valid()`), so
                // there the receive is only flushed.
                if imm.is_some() && reason != NakReason::QpAccess {
                    self.fail_recv(self.sw.write_imm_bad_rkey, out);
                }
                return self.refuse(psn, "WRITE", reason, rkey, addr, len as u64, tx);
            }
        };
        // A placed WRITE's data is in already: nothing follows the header to sink.
        let seg = if placed { None } else { seg };
        let sunk = self.sink_write(psn, seg, len, imm, solicited);
        self.payload_ack_req = frame.ack_req();
        self.epsn = psn::add(psn, self.packets(len));
        Ok(sunk)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use verbs_api::{AccessFlags, AsyncElement, AsyncEventType, WcStatus};

    use super::super::RespAttrs;
    use super::*;

    /// A WRITE refused for its rkey raises QP_ACCESS_ERR on the responder's QP.
    #[test]
    fn a_refused_write_raises_an_access_error() {
        let mrs = MrTable::default();
        let mut resp = Responder::new(2, 1, 4, 1);
        resp.connect(RespAttrs {
            rq_psn: 0,
            min_rnr_timer: 1,
        });
        resp.access = AccessFlags::REMOTE;
        let (mut tx, mut out) = (TxQueue::new(), Vec::new());
        let write = Frame::Write {
            psn: 0,
            len: 8,
            addr: 0x1000,
            rkey: 9,
            imm: None,
            solicited: false,
            ack_req: false,
        };
        assert!(matches!(
            resp.on_request(&write, &mrs, &mut tx, &mut out),
            Err(Fatal(WcStatus::RemAccessErr))
        ));
        let evs: Vec<_> = resp.take_events().map(|e| (e.event_type, e.element)).collect();
        assert_eq!(evs, [(AsyncEventType::QpAccessErr, AsyncElement::Qp(2))]);
    }

    /// A placed WRITE_WITH_IMM (the requester moved the data itself) consumes exactly
    /// one receive, which completes with the immediate and the message's length, and
    /// advances the PSN by the message's packets; the responder writes nothing (a
    /// hostile peer's placed frame moves no memory). Refused by the access check, it
    /// meets the NAK a WRITE meets.
    #[test]
    fn a_placed_write_runs_every_rule_but_placement() {
        use verbs_api::{RecvWr, Sge, WcOpcode};

        use crate::memory::MrShared;

        let mrs = MrTable::default();
        let target = Arc::new(
            MrShared::new_owned(1, 5, 8192, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE).unwrap(),
        );
        mrs.insert(target.clone());
        let mut resp = Responder::new(2, 1, 4, 1);
        resp.set_path_mtu(1024);
        resp.connect(RespAttrs {
            rq_psn: 0,
            min_rnr_timer: 1,
        });
        resp.access = AccessFlags::REMOTE;
        let sges = [Sge::new(target.addr(), 8, 5)];
        for id in [10, 11] {
            resp.post(&RecvWr::new(id, &sges)).unwrap();
        }
        let (mut tx, mut out) = (TxQueue::new(), Vec::new());
        let placed = |psn, rkey| Frame::WritePlaced {
            psn,
            len: 4096,
            addr: target.addr() + 64,
            rkey,
            imm: Some(0xabcd),
            solicited: false,
            ack_req: true,
        };
        match resp.on_request(&placed(0, 5), &mrs, &mut tx, &mut out) {
            Ok(Incoming::Sink(segs)) => {
                assert!(segs.is_empty(), "a placed WRITE has nowhere to sink: {segs:?}");
                resp.payload_done(segs, &mrs, &mut out);
            }
            other => panic!("{other:?}"),
        }
        let wcs: Vec<_> = out
            .iter()
            .map(|(w, _)| (w.wr_id, w.status, w.opcode, w.imm_data, w.byte_len))
            .collect();
        assert_eq!(
            wcs,
            [(10, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 0xabcd, 4096)]
        );
        assert_eq!(resp.expected_psn(), 4, "4 KiB at MTU 1024 take four PSNs");
        let mut bytes = vec![0xffu8; 8192];
        assert!(target.copy_out(0, &mut bytes));
        assert!(
            bytes.iter().all(|&b| b == 0),
            "the responder wrote memory for a placed WRITE"
        );
        // A bad rkey: the NAK a WRITE meets, and the receive it took completes in error.
        out.clear();
        assert!(matches!(
            resp.on_request(&placed(4, 99), &mrs, &mut tx, &mut out),
            Err(Fatal(WcStatus::RemAccessErr))
        ));
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].0.wr_id, 11);
    }
}
