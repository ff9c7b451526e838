//! An incoming RDMA READ (IBA 9.7.4.1.6): the responder resources it needs
//! (`max_dest_rd_atomic`, shared with the atomics), the remote access check, and the READ
//! response, which carries the region's bytes.

use verbs_api::WrOpcode;

use super::{reason_of, Incoming, Responder};
use crate::memory::MrTable;
use crate::opcode_table;
use crate::psn;
use crate::requester::Fatal;
use crate::tx::TxQueue;
use crate::wire::{Frame, NakReason};

impl Responder {
    /// A new READ `frame` of PSN `psn`, the expected one.
    pub(super) fn on_read(
        &mut self,
        frame: &Frame,
        psn: u32,
        mrs: &MrTable,
        tx: &mut TxQueue,
    ) -> Result<Incoming, Fatal> {
        let Frame::Read {
            len,
            addr,
            rkey,
            inflight,
            ..
        } = *frame
        else {
            return Ok(Incoming::Discard);
        };
        // Resources before the rkey, as the responder state machines of rxe
        // (`check_resource()` before `check_rkey()`) and the IBA order them.
        if let Some(reason) = self.rd_atomic_resources(inflight) {
            return self.refuse(psn, "READ", reason, rkey, addr, len as u64, tx);
        }
        let seg = match mrs.resolve_remote(
            &self.target(),
            rkey,
            addr,
            len as u64,
            opcode_table::row(WrOpcode::RdmaRead).access,
        ) {
            Ok(s) => s,
            Err(e) => return self.refuse(psn, "READ", reason_of(e), rkey, addr, len as u64, tx),
        };
        self.flush_ack_before_response(tx);
        self.message_done();
        tx.push_reply(&Frame::ReadResp { psn, len }, self.msn);
        if let Some(s) = seg {
            tx.push_seg(&s);
        }
        self.epsn = psn::add(psn, self.packets(len));
        Ok(Incoming::Discard)
    }

    /// Why a new READ or atomic, sent while its requester had `inflight` of them
    /// outstanding (itself included), finds no responder resources: none at all
    /// (`max_dest_rd_atomic` 0, refused under every profile, as rxe refuses it), or fewer
    /// than asked for (refused unless `Switches::rd_atomic_over_limit_served`, rxe's
    /// choice).
    pub(super) fn rd_atomic_resources(&self, inflight: u16) -> Option<NakReason> {
        if self.max_dest_rd_atomic == 0 {
            Some(NakReason::NoRdAtomicResources)
        } else if inflight > u16::from(self.max_dest_rd_atomic) && !self.sw.rd_atomic_over_limit_served {
            Some(NakReason::RdAtomicOverLimit)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use verbs_api::{AccessFlags, AsyncElement, AsyncEventType, WcStatus};

    use super::super::tests::frames;
    use super::super::RespAttrs;
    use super::*;
    use crate::memory::Seg;
    use crate::wire::NakCode;

    /// Without responder resources (`max_dest_rd_atomic` 0) no READ or atomic runs, as a
    /// new request (a NAK and `Fatal`) or as a duplicate of an older PSN (a peer replaying
    /// one that was never executed gets a NAK, not the region's bytes).
    #[test]
    fn without_responder_resources_no_read_or_atomic_runs() {
        use crate::memory::MrShared;
        use std::sync::Arc;
        let mrs = MrTable::default();
        let mr = Arc::new(MrShared::new_owned(1, 9, 64, AccessFlags::ALL).unwrap());
        mrs.insert(mr.clone());
        let seg = Seg {
            mr: mr.clone(),
            offset: 0,
            len: 64,
        };
        assert!(seg.copy_in(0, &[7; 64]));
        let mut resp = Responder::new(2, 1, 4, 1);
        resp.connect(RespAttrs {
            rq_psn: 20,
            min_rnr_timer: 1,
        });
        resp.access = AccessFlags::REMOTE;
        let (mut tx, mut out) = (TxQueue::new(), Vec::new());
        let read = |psn| Frame::Read {
            inflight: 1,
            psn,
            len: 64,
            addr: mr.addr(),
            rkey: 9,
        };
        let faa = Frame::FetchAdd {
            inflight: 1,
            psn: 20,
            addr: mr.addr(),
            rkey: 9,
            add: 1,
        };
        for f in [read(20), faa] {
            assert!(matches!(
                resp.on_request(&f, &mrs, &mut tx, &mut out),
                Err(Fatal(WcStatus::RemInvReqErr))
            ));
            assert_eq!(
                frames(&mut tx),
                [Frame::Nak {
                    psn: 20,
                    code: NakCode::InvalidRequest,
                    reason: Some(NakReason::NoRdAtomicResources)
                }]
            );
        }
        assert!(matches!(
            resp.on_request(&read(19), &mrs, &mut tx, &mut out),
            Ok(Incoming::Discard)
        ));
        assert_eq!(
            frames(&mut tx),
            [Frame::Nak {
                psn: 19,
                code: NakCode::InvalidRequest,
                reason: Some(NakReason::NoRdAtomicResources)
            }]
        );
        let mut now = [0u8; 64];
        assert!(seg.copy_out(0, &mut now));
        assert_eq!(now, [7; 64], "the region changed");
        assert!(out.is_empty());
        // Each refusal of a new request is an invalid request at this QP (IBA 11.6.3.1);
        // the refused duplicate took the QP nowhere and raises nothing.
        let evs: Vec<_> = resp.take_events().map(|e| (e.event_type, e.element)).collect();
        let req_err = (AsyncEventType::QpReqErr, AsyncElement::Qp(2));
        assert_eq!(evs, [req_err, req_err]);
    }
}
