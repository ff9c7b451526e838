//! The ACKs a responder owes (IBA 9.7.5.1: one coalesced ACK covers every request
//! executed before it leaves; a request with AckReq has it leave at the end of the batch),
//! its NAKs, and the message sequence number every response carries (IBA 9.7.5.1.1).

use verbs_api::PSN_MASK;

use super::Responder;
use crate::tx::TxQueue;
use crate::wire::{Frame, NakCode, NakReason};

impl Responder {
    pub(super) fn nak(&mut self, tx: &mut TxQueue, psn: u32, code: NakCode, reason: Option<NakReason>) {
        self.forget_ack();
        tx.push_reply(&Frame::Nak { psn, code, reason }, self.msn);
    }

    /// Whether an ACK is owed (requests executed but not yet acknowledged).
    pub fn owes_ack(&self) -> bool {
        self.ack_owed.is_some()
    }

    /// Owes no ACK any more (without sending one).
    pub(super) fn forget_ack(&mut self) {
        self.ack_owed = None;
        self.owed_bytes = 0;
        self.owed_reqs = 0;
        self.ack_asked = false;
    }

    /// Payload bytes of the requests executed since the last ACK (0 if none is owed).
    pub fn owed_bytes(&self) -> usize {
        self.owed_bytes
    }

    /// How many requests the owed ACK covers: more than one means the peer streams (a
    /// ping-pong's peer waits for the answer to each).
    pub fn owed_requests(&self) -> u32 {
        self.owed_reqs
    }

    /// Whether a request the owed ACK covers asked for it (AckReq): it should leave at
    /// the end of the current batch rather than be coalesced with later ones.
    pub fn ack_asked(&self) -> bool {
        self.ack_asked
    }

    /// Sends the ACK owed, if any (call when the current batch of requests is done).
    pub fn flush_ack(&mut self, tx: &mut TxQueue) {
        if let Some(psn) = self.ack_owed.take() {
            tx.push_reply(&Frame::Ack { psn }, self.msn);
        }
        self.owed_bytes = 0;
        self.owed_reqs = 0;
        self.ack_asked = false;
    }

    pub(super) fn flush_ack_before_response(&mut self, tx: &mut TxQueue) {
        // A READ or atomic response implicitly acknowledges everything before it, but an
        // explicit ACK keeps the requester's view simple and costs 16 bytes.
        self.flush_ack(tx);
    }

    /// A new request message completed here: the MSN counts it (IBA 9.7.5.1.1; for a
    /// READ or atomic when it executes, so that its response carries the count, as rxe
    /// counts it in `execute()`). A repeated request is not a new message.
    pub(super) fn message_done(&mut self) {
        self.msn = (self.msn + 1) & PSN_MASK;
    }

    /// The responder's message sequence number (IBA 9.7.5.1.1).
    #[cfg(any(test, feature = "internals"))]
    pub fn msn(&self) -> u32 {
        self.msn
    }
}

#[cfg(test)]
mod tests {
    use verbs_api::AccessFlags;

    use super::super::{Incoming, RespAttrs};
    use super::*;
    use crate::memory::MrTable;

    /// The MSN in the responses (IBA 9.7.5.1.1): one more per new message completed,
    /// a READ counted when it executes (its response carries the count), duplicates and
    /// NAKs not counted, 0 again after RESET.
    #[test]
    fn responses_carry_the_message_sequence_number() {
        struct Tap(std::sync::Arc<parking_lot::Mutex<Vec<(Frame, u32)>>>);
        impl crate::tx::FrameTap for Tap {
            fn sent(&mut self, f: &Frame, msn: u32) {
                self.0.lock().push((*f, msn));
            }
        }
        let seen = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let mrs = MrTable::default();
        let mut resp = Responder::new(2, 1, 4, 1);
        resp.connect(RespAttrs {
            rq_psn: 1,
            min_rnr_timer: 1,
        });
        resp.access = AccessFlags::REMOTE;
        resp.max_dest_rd_atomic = 4;
        let mut tx = TxQueue::new();
        tx.tap = Some(Box::new(Tap(seen.clone())));
        let mut out = Vec::new();
        let write = |psn| Frame::Write {
            psn,
            len: 0,
            addr: 0,
            rkey: 0,
            imm: None,
            solicited: false,
            ack_req: true,
        };
        for psn in [1, 2] {
            match resp.on_request(&write(psn), &mrs, &mut tx, &mut out).unwrap() {
                Incoming::Sink(s) => resp.payload_done(s, &mrs, &mut out),
                Incoming::Discard => panic!("a zero-length WRITE is executed"),
            }
            resp.flush_ack(&mut tx);
        }
        // A duplicate: answered with the MSN unchanged.
        resp.on_request(&write(2), &mrs, &mut tx, &mut out).unwrap();
        resp.flush_ack(&mut tx);
        let read = Frame::Read {
            inflight: 1,
            psn: 3,
            len: 0,
            addr: 0,
            rkey: 0,
        };
        resp.on_request(&read, &mrs, &mut tx, &mut out).unwrap();
        // A PSN ahead: a sequence NAK, with the MSN as it stands.
        resp.on_request(&write(9), &mrs, &mut tx, &mut out).unwrap();
        assert_eq!(resp.msn(), 3);
        assert_eq!(
            *seen.lock(),
            [
                (Frame::Ack { psn: 1 }, 1),
                (Frame::Ack { psn: 2 }, 2),
                (Frame::Ack { psn: 2 }, 2),
                (Frame::ReadResp { psn: 3, len: 0 }, 3),
                (
                    Frame::Nak {
                        psn: 4,
                        code: NakCode::PsnSeq,
                        reason: None
                    },
                    3
                ),
            ]
        );
        resp.reset();
        assert_eq!(resp.msn(), 0);
    }
}
