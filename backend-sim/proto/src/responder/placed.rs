//! A notice of a READ or an atomic that the same-host requester executed itself
//! ([`Frame::ReadPlaced`], [`Frame::AtomicPlaced`]; docs/sim.md "The one-sided fast
//! path"). The requester ran the remote access check on the state this side publishes,
//! under the use counts that revoke access before a deregistration or a move to ERR
//! returns, and moved the data or executed the atomic itself. The notice meets the rules
//! of the operation it stands for that concern the connection: PSN order and duplicates
//! (in `on_request` and [`duplicate`](super::duplicate): a repeated notice is
//! acknowledged again, never executed), a QP without responder resources for READs and
//! atomics (`max_dest_rd_atomic` 0) refusing it as an invalid request, the MSN counting
//! it as a message and the expected PSN moving past it. It is answered with an ACK of its
//! last PSN instead of a response, and moves no data and executes nothing: one from a
//! hostile peer is as harmless as a READ of nothing.

use super::{Incoming, Responder};
use crate::psn;
use crate::requester::Fatal;
use crate::tx::TxQueue;
use crate::wire::Frame;

impl Responder {
    /// A new notice `frame` of PSN `psn`, the expected one.
    pub(super) fn on_placed(&mut self, frame: &Frame, psn: u32, tx: &mut TxQueue) -> Result<Incoming, Fatal> {
        let (op, pkts, rkey, addr, len) = match *frame {
            Frame::ReadPlaced { len, rkey, addr, .. } => {
                ("READ", self.packets(len), rkey, addr, u64::from(len))
            }
            Frame::AtomicPlaced {
                rkey, addr, compare, ..
            } => {
                let op = if compare.is_some() {
                    "CMP_AND_SWP"
                } else {
                    "FETCH_AND_ADD"
                };
                (op, 1, rkey, addr, 8)
            }
            _ => return Ok(Incoming::Discard),
        };
        // The one check the requester cannot run: a QP with no responder resources takes
        // no READ or atomic (the published state does not say so; a requester that placed
        // one anyway meets the refusal the operation meets, and its QP goes to ERR).
        if self.max_dest_rd_atomic == 0 {
            let reason = crate::wire::NakReason::NoRdAtomicResources;
            return self.refuse(psn, op, reason, rkey, addr, len, tx);
        }
        self.message_done();
        self.epsn = psn::add(psn, pkts);
        self.ack_owed = Some(psn::add(self.epsn, verbs_api::PSN_MASK));
        self.owed_reqs += 1;
        self.ack_asked |= frame.ack_req();
        Ok(Incoming::Discard)
    }

    /// A run of notices `frame` ([`Frame::PlacedRun`]) of first PSN `psn`, the expected
    /// one or behind it. The PSNs of it already taken in are a duplicate (acknowledged
    /// again); the rest advance the expected PSN to the run's end and count as the run's
    /// messages in the MSN (in a run split so, at most one per PSN left: the peer that
    /// sent it no longer agrees with this side on its messages, and nothing moves
    /// either way).
    pub(super) fn on_run(&mut self, frame: &Frame, psn: u32, tx: &mut TxQueue) -> Result<Incoming, Fatal> {
        let Frame::PlacedRun {
            pkts,
            msgs,
            rd_atomic,
            ack_req,
            ..
        } = *frame
        else {
            return Ok(Incoming::Discard);
        };
        let seen = psn::diff(self.epsn, psn).max(0) as u32;
        if seen < pkts {
            if rd_atomic > 0 && self.max_dest_rd_atomic == 0 {
                // As for a single notice of a READ or atomic (`on_placed`).
                let reason = crate::wire::NakReason::NoRdAtomicResources;
                let at = self.epsn;
                return self.refuse(at, "READ", reason, 0, 0, 0, tx);
            }
            let msgs = if seen == 0 { msgs } else { msgs.min(pkts - seen) };
            self.msn = (self.msn + msgs) & verbs_api::PSN_MASK;
            self.epsn = psn::add(psn, pkts);
        }
        self.ack_owed = Some(psn::add(self.epsn, verbs_api::PSN_MASK));
        self.owed_reqs += 1;
        self.ack_asked |= ack_req;
        Ok(Incoming::Discard)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use verbs_api::{AccessFlags, WcStatus};

    use super::super::tests::frames;
    use super::super::RespAttrs;
    use super::*;
    use crate::memory::{MrShared, MrTable, Seg};
    use crate::wire::{NakCode, NakReason};

    fn responder(rd_atomic: u8) -> Responder {
        let mut resp = Responder::new(2, 1, 4, 1);
        resp.set_path_mtu(1024);
        resp.connect(RespAttrs {
            rq_psn: 10,
            min_rnr_timer: 1,
        });
        resp.access = AccessFlags::REMOTE;
        resp.max_dest_rd_atomic = rd_atomic;
        resp
    }

    /// Notices take the PSNs of the operation they stand for (a READ those of its
    /// response, an atomic one), count as messages in the MSN and are answered by one
    /// ACK of the last PSN; the next request, at the PSN after them, is executed; a
    /// repeated notice is acknowledged again without counting; none of them touches
    /// memory, even with an rkey that names a region.
    #[test]
    fn notices_advance_psn_and_msn_and_move_nothing() {
        let mrs = MrTable::default();
        let mr = Arc::new(MrShared::new_owned(1, 9, 8192, AccessFlags::ALL).unwrap());
        mrs.insert(mr.clone());
        let seg = Seg {
            mr: mr.clone(),
            offset: 0,
            len: 8192,
        };
        assert!(seg.copy_in(0, &[7; 8192]));
        let mut resp = responder(4);
        let (mut tx, mut out) = (TxQueue::new(), Vec::new());
        let read = |psn| Frame::ReadPlaced {
            psn,
            len: 3000,
            addr: mr.addr(),
            rkey: 9,
            ack_req: false,
        };
        let faa = |psn| Frame::AtomicPlaced {
            psn,
            addr: mr.addr(),
            rkey: 9,
            compare: None,
            swap_add: 5,
            ack_req: true,
        };
        let cas = Frame::AtomicPlaced {
            psn: 14,
            addr: mr.addr() + 8,
            rkey: 9,
            compare: Some(u64::from_ne_bytes([7; 8])),
            swap_add: 1,
            ack_req: false,
        };
        for f in [read(10), faa(13), cas] {
            assert!(matches!(
                resp.on_request(&f, &mrs, &mut tx, &mut out),
                Ok(Incoming::Discard)
            ));
        }
        assert_eq!(resp.expected_psn(), 15, "3000 bytes at MTU 1024 take three PSNs");
        assert_eq!(resp.msn(), 3);
        assert!(resp.ack_asked(), "the FETCH_ADD notice asked for an ACK");
        resp.flush_ack(&mut tx);
        assert_eq!(frames(&mut tx), [Frame::Ack { psn: 14 }]);
        // Repeated: acknowledged again, not counted.
        for f in [read(10), faa(13)] {
            resp.on_request(&f, &mrs, &mut tx, &mut out).unwrap();
        }
        resp.flush_ack(&mut tx);
        assert_eq!(frames(&mut tx), [Frame::Ack { psn: 14 }]);
        assert_eq!(resp.msn(), 3);
        // The next READ, at the PSN after the notices, is executed.
        let next = Frame::Read {
            psn: 15,
            len: 8,
            addr: mr.addr(),
            rkey: 9,
            inflight: 1,
        };
        resp.on_request(&next, &mrs, &mut tx, &mut out).unwrap();
        assert_eq!(frames(&mut tx), [Frame::ReadResp { psn: 15, len: 8 }]);
        let mut now = [0u8; 8192];
        assert!(seg.copy_out(0, &mut now));
        assert!(now.iter().all(|&b| b == 7), "a notice changed memory");
        assert!(out.is_empty());
    }

    /// Without responder resources a notice meets the READ's refusal: an invalid
    /// request, and the QP goes to ERR; a hostile peer's notice with a key naming nothing
    /// is only acknowledged (no key is checked, nothing moves).
    #[test]
    fn without_resources_a_notice_is_refused_and_a_stray_key_is_harmless() {
        let mrs = MrTable::default();
        let (mut tx, mut out) = (TxQueue::new(), Vec::new());
        let notice = Frame::ReadPlaced {
            psn: 10,
            len: 0,
            addr: u64::MAX,
            rkey: 0xdead,
            ack_req: true,
        };
        let mut resp = responder(0);
        assert!(matches!(
            resp.on_request(&notice, &mrs, &mut tx, &mut out),
            Err(Fatal(WcStatus::RemInvReqErr))
        ));
        assert_eq!(
            frames(&mut tx),
            [Frame::Nak {
                psn: 10,
                code: NakCode::InvalidRequest,
                reason: Some(NakReason::NoRdAtomicResources)
            }]
        );
        let mut resp = responder(1);
        resp.on_request(&notice, &mrs, &mut tx, &mut out).unwrap();
        resp.flush_ack(&mut tx);
        assert_eq!(frames(&mut tx), [Frame::Ack { psn: 10 }]);
    }

    /// A run advances the expected PSN over its PSNs and the MSN by its messages; seen
    /// again whole it is acknowledged again and counts nothing; one that overlaps the
    /// expected PSN (a peer's own doing) takes in only its unseen PSNs, at most one
    /// message each; a run with READs or atomics meets a QP without responder resources'
    /// refusal. None of them touches memory.
    #[test]
    fn a_run_advances_by_itself_once_and_splits_at_the_expected_psn() {
        let mrs = MrTable::default();
        let (mut tx, mut out) = (TxQueue::new(), Vec::new());
        let run = |psn, pkts, msgs, rd_atomic| Frame::PlacedRun {
            psn,
            pkts,
            msgs,
            rd_atomic,
            ack_req: false,
        };
        let mut resp = responder(1);
        resp.on_request(&run(10, 6, 4, 1), &mrs, &mut tx, &mut out)
            .unwrap();
        assert_eq!((resp.expected_psn(), resp.msn()), (16, 4));
        resp.flush_ack(&mut tx);
        assert_eq!(frames(&mut tx), [Frame::Ack { psn: 15 }]);
        // Whole again: a duplicate.
        resp.on_request(&run(10, 6, 4, 1), &mrs, &mut tx, &mut out)
            .unwrap();
        resp.flush_ack(&mut tx);
        assert_eq!(frames(&mut tx), [Frame::Ack { psn: 15 }]);
        assert_eq!((resp.expected_psn(), resp.msn()), (16, 4));
        // Overlapping: PSNs 14 and 15 seen, 16-19 new; 6 messages claimed, 4 PSNs left.
        resp.on_request(&run(14, 6, 6, 0), &mrs, &mut tx, &mut out)
            .unwrap();
        assert_eq!((resp.expected_psn(), resp.msn()), (20, 8));
        resp.flush_ack(&mut tx);
        assert_eq!(frames(&mut tx), [Frame::Ack { psn: 19 }]);
        assert!(out.is_empty());
        // Without responder resources: refused when it holds a READ or an atomic.
        let mut resp = responder(0);
        resp.on_request(&run(10, 2, 2, 0), &mrs, &mut tx, &mut out)
            .unwrap();
        assert_eq!(resp.expected_psn(), 12);
        assert!(matches!(
            resp.on_request(&run(12, 2, 2, 1), &mrs, &mut tx, &mut out),
            Err(Fatal(WcStatus::RemInvReqErr))
        ));
    }
}
