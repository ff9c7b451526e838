//! An incoming atomic, CMP_AND_SWP or FETCH_AND_ADD (IBA 9.7.8): the responder
//! resources and the remote access check, then one atomic instruction on the target word
//! (atomic against every other atomic on the device, from any QP); the result answers it
//! and is kept for a duplicate of it ([`duplicate`](super::duplicate)).

use std::sync::atomic::Ordering;

use verbs_api::WrOpcode;

use super::{reason_of, Incoming, Responder};
use crate::memory::MrTable;
use crate::opcode_table;
use crate::psn;
use crate::requester::Fatal;
use crate::tx::TxQueue;
use crate::wire::{Frame, NakReason};

/// How many atomic results are kept for duplicate requests.
const ATOMIC_REPLAY: usize = 16;

impl Responder {
    /// A new atomic `frame` of PSN `psn`, the expected one.
    pub(super) fn on_atomic(
        &mut self,
        frame: &Frame,
        psn: u32,
        mrs: &MrTable,
        tx: &mut TxQueue,
    ) -> Result<Incoming, Fatal> {
        let (Frame::CmpSwap {
            addr, rkey, inflight, ..
        }
        | Frame::FetchAdd {
            addr, rkey, inflight, ..
        }) = *frame
        else {
            return Ok(Incoming::Discard);
        };
        let op = match frame {
            Frame::CmpSwap { .. } => "CMP_AND_SWP",
            _ => "FETCH_AND_ADD",
        };
        if let Some(reason) = self.rd_atomic_resources(inflight) {
            return self.refuse(psn, op, reason, rkey, addr, 8, tx);
        }
        let seg = match mrs.resolve_remote(
            &self.target(),
            rkey,
            addr,
            8,
            opcode_table::row(WrOpcode::AtomicCmpAndSwp).access,
        ) {
            Ok(Some(s)) => s,
            Ok(None) => unreachable!("atomics always name 8 bytes"),
            Err(e) => return self.refuse(psn, op, reason_of(e), rkey, addr, 8, tx),
        };
        let orig = seg.atomic(|w| match *frame {
            Frame::CmpSwap { compare, swap, .. } => {
                match w.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
                    Ok(v) | Err(v) => v,
                }
            }
            Frame::FetchAdd { add, .. } => w.fetch_add(add, Ordering::SeqCst),
            _ => unreachable!("matched atomics above"),
        });
        let Some(orig) = orig else {
            // Deregistered between the check and the operation.
            let reason = NakReason::DeregisteredRkey;
            return self.refuse(psn, op, reason, rkey, addr, 8, tx);
        };
        if self.replay.len() == ATOMIC_REPLAY {
            self.replay.pop_front();
        }
        self.replay.push_back((psn, orig));
        self.flush_ack_before_response(tx);
        self.message_done();
        tx.push_reply(&Frame::AtomicResp { psn, orig }, self.msn);
        self.epsn = psn::add(psn, 1);
        Ok(Incoming::Discard)
    }
}
