//! A message whose packets come apart ([`Frame::Part`]; IBA 9.7.4.1, 9.7.5.1.2): its
//! first part is executed as the whole message's frame would be (a SEND takes its receive
//! and places the whole message in it, a WRITE passes the access check for its whole
//! RETH), and the responder keeps the message's receive and position (its scatter list,
//! the bytes placed) while the later parts come, each at the PSN it expects. A part of
//! another message's kind, or a new message while one is partly in, is an opcode sequence
//! error, NAKed as an invalid request (IBA 9.7.5.2.2). A PSN ahead of the expected one (a
//! lost MIDDLE) is NAKed as a sequence error once by the checks every request meets
//! (`Responder::on_request_rnr`), and the partial message waits for the resend; a part
//! behind it is a duplicate, acknowledged again.

use verbs_api::WorkCompletion;

use super::{Incoming, Responder};
use crate::faults::ForcedRnr;
use crate::memory::{MrTable, Seg};
use crate::psn;
use crate::region::slice;
use crate::requester::Fatal;
use crate::tx::TxQueue;
use crate::wire::{Frame, NakCode, PartKind};

/// The message partly in.
#[derive(Debug)]
pub(super) struct Partial {
    kind: PartKind,
    /// The PSN of its first packet.
    start: u32,
    /// The whole message's scatter list (a SEND's receive buffers, a WRITE's region).
    segs: Vec<Seg>,
    /// Bytes placed by the parts whose payload is in (from the message's start).
    done: usize,
    /// The message's length.
    total: usize,
    /// Where the part whose payload is arriving ends, and whether it is the last.
    arriving: Option<(usize, bool)>,
}

impl Responder {
    /// Whether request `frame` goes to [`Responder::on_part`]: it is a part, or a
    /// message is partly in (anything but its next part breaks the sequence).
    #[inline]
    pub(super) fn for_part(&self, frame: &Frame) -> bool {
        self.partial.is_some() || matches!(frame, Frame::Part { .. })
    }

    /// Whether request `frame` of PSN `psn`, behind the expected one, carries packets of
    /// the message partly in from before the expected PSN to after it: a resend of the
    /// message (or of its rest) from a packet the responder already has. Its packets from
    /// the expected one on are new ([`Responder::on_part`]); a frame of IBA's, one packet
    /// each, is either a duplicate or not.
    #[inline]
    pub(super) fn straddles(&self, frame: &Frame, psn: u32) -> bool {
        let (Some(p), Some(c)) = (&self.partial, frame.packets()) else {
            return false;
        };
        let end = psn::add(psn, self.packets(c.len));
        p.kind == c.kind && psn::diff(psn, p.start) >= 0 && psn::diff(end, self.epsn) > 0
    }

    /// Request `frame` of PSN `psn` (the expected one, or one that [`straddles`] it)
    /// while a message is partly in, or as a part of one.
    ///
    /// [`straddles`]: Responder::straddles
    pub(super) fn on_part(
        &mut self,
        frame: &Frame,
        psn: u32,
        mrs: &MrTable,
        tx: &mut TxQueue,
        out: &mut Vec<(WorkCompletion, bool)>,
        forced_rnr: &mut ForcedRnr,
    ) -> Result<Incoming, Fatal> {
        let Some(c) = frame.packets().filter(|c| c.kind != PartKind::ReadResp) else {
            return self.out_of_sequence(psn, frame, tx);
        };
        let mtu = self.path_mtu as usize;
        let whole_packets = c.last || self.path_mtu == psn::NO_MTU || c.len as usize % mtu == 0;
        let Some(p) = &self.partial else {
            if !c.first || c.last || !whole_packets {
                return self.out_of_sequence(psn, frame, tx);
            }
            return self.first_part(frame, psn, mrs, tx, out, forced_rnr);
        };
        let off = psn::diff(psn, p.start);
        let at = (off.max(0) as usize).saturating_mul(mtu);
        let end = at + c.len as usize;
        let in_step = p.kind == c.kind
            && off >= 0
            && c.first == (off == 0)
            && at <= p.done
            && end > p.done
            && end <= p.total;
        if !in_step || !whole_packets || (c.last && end != p.total) {
            return self.out_of_sequence(psn, frame, tx);
        }
        let part = slice(&p.segs, at, c.len as usize);
        if let Some(p) = self.partial.as_mut() {
            p.arriving = Some((end, c.last));
        }
        self.payload_psn = Some(psn);
        self.payload_ack_req = c.ack_req;
        self.epsn = psn::add(psn, self.packets(c.len));
        Ok(Incoming::Sink(part))
    }

    /// The first part of a message: executed as the whole message's frame would be,
    /// then cut to this part.
    fn first_part(
        &mut self,
        frame: &Frame,
        psn: u32,
        mrs: &MrTable,
        tx: &mut TxQueue,
        out: &mut Vec<(WorkCompletion, bool)>,
        forced_rnr: &mut ForcedRnr,
    ) -> Result<Incoming, Fatal> {
        let Frame::Part {
            len,
            kind,
            addr,
            rkey,
            total,
            imm,
            solicited,
            inv,
            ..
        } = *frame
        else {
            return self.out_of_sequence(psn, frame, tx);
        };
        let whole = match kind {
            PartKind::Send => Frame::Send {
                psn,
                len: total,
                imm,
                solicited,
                ack_req: false,
                inv,
            },
            _ => Frame::Write {
                psn,
                len: total,
                addr,
                rkey,
                imm,
                solicited,
                ack_req: false,
            },
        };
        let r = match kind {
            PartKind::Send => self.on_send(&whole, psn, mrs, tx, out, forced_rnr),
            _ => self.on_write(&whole, psn, mrs, tx, out, forced_rnr),
        };
        let Ok(Incoming::Sink(segs)) = r else {
            return r;
        };
        let part = slice(&segs, 0, len as usize);
        self.partial = Some(Partial {
            kind,
            start: psn,
            segs,
            done: 0,
            total: total as usize,
            arriving: Some((len as usize, false)),
        });
        self.epsn = psn::add(psn, self.packets(len));
        Ok(Incoming::Sink(part))
    }

    /// A part's payload is in: `true` if the message is not yet whole (nothing more to
    /// do), `false` if it was the last part (the message completes as a whole one does).
    #[inline]
    pub(super) fn part_done(&mut self) -> bool {
        let Some(p) = self.partial.as_mut() else {
            return false;
        };
        let (end, last) = p.arriving.take().unwrap_or((p.total, true));
        p.done = p.done.max(end);
        if last {
            self.partial = None;
            return false;
        }
        self.payload_psn = None;
        self.payload_ack_req = false;
        true
    }

    /// The part whose payload was arriving never came whole (the connection broke): the
    /// message's position stays where the parts before it left it, unless it was the
    /// first, which is forgotten (its receive is held for the resend).
    pub(super) fn part_lost(&mut self) {
        if let Some(p) = self.partial.as_mut() {
            p.arriving = None;
            if p.done == 0 {
                self.partial = None;
            }
        }
    }

    /// Whether the message partly in holds the receive taken (the receive stays
    /// consumed when a later part's payload is lost).
    pub(super) fn partly_in(&self) -> bool {
        self.partial.as_ref().is_some_and(|p| p.done > 0)
    }

    /// A request that breaks a partial message's sequence (or a part that fits no
    /// message): an invalid request NAK (IBA 9.7.5.2.2), and the QP goes to ERR.
    fn out_of_sequence(&mut self, psn: u32, frame: &Frame, tx: &mut TxQueue) -> Result<Incoming, Fatal> {
        tracing::warn!(
            qpn = self.qpn,
            psn,
            "{frame} out of sequence with the message partly in: an invalid request; the QP goes to ERR"
        );
        if self.partial.take().is_some() {
            // (The receive a SEND took completes flushed with the rest.)
            self.taken = self.taken.map(|_| super::Taken::Held);
        }
        self.nak(tx, psn, NakCode::InvalidRequest, None);
        Err(Fatal(self.affiliated_error(NakCode::InvalidRequest)))
    }

    /// Forgets a message partly in (the QP was reset or flushed).
    pub(super) fn forget_partial(&mut self) {
        self.partial = None;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use verbs_api::{AccessFlags, RecvWr, Sge, WcStatus};

    use super::super::tests::frames;
    use super::super::RespAttrs;
    use super::*;
    use crate::memory::MrShared;

    /// A responder at `rq_psn` with path MTU 1024 and one receive (wr_id 7) posted for
    /// the whole of a 4 KiB region (rkey/lkey 5), and the region's table.
    fn with_a_receive(rq_psn: u32) -> (MrTable, Arc<MrShared>, Responder) {
        let mrs = MrTable::default();
        let mr = Arc::new(MrShared::new_owned(1, 5, 4096, AccessFlags::ALL).unwrap());
        mrs.insert(mr.clone());
        let mut resp = Responder::new(2, 1, 4, 1);
        resp.connect(RespAttrs {
            rq_psn,
            min_rnr_timer: 1,
        });
        resp.set_path_mtu(1024);
        resp.post(&RecvWr::new(7, &[Sge::new(mr.addr(), 4096, 5)]))
            .unwrap();
        (mrs, mr, resp)
    }

    fn part(psn: u32, len: u32, first: bool, last: bool) -> Frame {
        Frame::Part {
            psn,
            len,
            kind: PartKind::Send,
            first,
            last,
            addr: 0,
            rkey: 0,
            total: 2500,
            imm: None,
            solicited: false,
            ack_req: last,
            inv: None,
        }
    }

    /// A SEND of three packets whose MIDDLE is lost: the LAST gets one PSN sequence
    /// error NAK for the MIDDLE's PSN and a copy of it none; the receive the FIRST took
    /// stays with the message; a copy of the FIRST is acknowledged as a duplicate (up to
    /// the packet before the one expected); the MIDDLE and LAST, resent, complete the
    /// receive with the message's bytes in place.
    #[test]
    fn a_lost_middle_is_nakked_once_and_the_receive_waits_for_it() {
        let (mrs, mr, mut resp) = with_a_receive(10);
        let (mut tx, mut out) = (TxQueue::new(), Vec::new());
        let data: Vec<u8> = (0..2500u32).map(|i| (i / 3) as u8).collect();
        let feed = |resp: &mut Responder, f: &Frame, tx: &mut TxQueue, out: &mut Vec<_>| {
            let Frame::Part { psn, len, .. } = *f else {
                unreachable!()
            };
            let at = (psn - 10) as usize * 1024;
            match resp.on_request(f, &mrs, tx, out).unwrap() {
                Incoming::Sink(segs) => {
                    let mut o = 0;
                    for s in &segs {
                        s.copy_in(0, &data[at + o..at + o + s.len]);
                        o += s.len;
                    }
                    assert_eq!(o, len as usize);
                    resp.payload_done(segs, &mrs, out);
                    true
                }
                Incoming::Discard => false,
            }
        };
        assert!(feed(&mut resp, &part(10, 1024, true, false), &mut tx, &mut out));
        assert!(!feed(&mut resp, &part(12, 452, false, true), &mut tx, &mut out));
        assert!(!feed(&mut resp, &part(12, 452, false, true), &mut tx, &mut out));
        let nak = Frame::Nak {
            psn: 11,
            code: NakCode::PsnSeq,
            reason: None,
        };
        assert_eq!(frames(&mut tx), [nak]);
        assert!(!feed(&mut resp, &part(10, 1024, true, false), &mut tx, &mut out));
        resp.flush_ack(&mut tx);
        assert_eq!(frames(&mut tx), [Frame::Ack { psn: 10 }]);
        assert!(out.is_empty(), "{out:?}");
        assert!(feed(&mut resp, &part(11, 1024, false, false), &mut tx, &mut out));
        assert!(feed(&mut resp, &part(12, 452, false, true), &mut tx, &mut out));
        let wc: Vec<_> = out.iter().map(|(w, _)| (w.wr_id, w.status, w.byte_len)).collect();
        assert_eq!(wc, [(7, WcStatus::Success, 2500)]);
        let mut got = vec![0u8; 2500];
        assert!(mr.copy_out(0, &mut got));
        assert_eq!(got, data);
        assert_eq!(resp.expected_psn(), 13);
    }

    /// A part of a WRITE in the middle of a SEND is an opcode sequence error: an
    /// invalid request NAK, and the QP goes to ERR.
    #[test]
    fn a_part_of_another_message_is_an_invalid_request() {
        let (mrs, _, mut resp) = with_a_receive(0);
        let (mut tx, mut out) = (TxQueue::new(), Vec::new());
        let Incoming::Sink(s) = resp
            .on_request(&part(0, 1024, true, false), &mrs, &mut tx, &mut out)
            .unwrap()
        else {
            panic!("the FIRST is placed");
        };
        resp.payload_done(s, &mrs, &mut out);
        let mut write = part(1, 1024, false, false);
        if let Frame::Part { kind, .. } = &mut write {
            *kind = PartKind::Write;
        }
        assert!(matches!(
            resp.on_request(&write, &mrs, &mut tx, &mut out),
            Err(Fatal(WcStatus::RemInvReqErr))
        ));
        assert_eq!(
            frames(&mut tx),
            [Frame::Nak {
                psn: 1,
                code: NakCode::InvalidRequest,
                reason: None
            }]
        );
    }
}
