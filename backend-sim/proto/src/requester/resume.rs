//! Resending from a PSN inside a message, and READ responses that come in parts (IBA
//! 9.7.5.1.2, 9.7.5.1.4, 9.7.5.2.1; rxe's `req_retry()` and its completer's `check_psn()`
//! are the reference).
//!
//! An ACK whose PSN lies inside a SEND or WRITE, and a PSN sequence error NAK for a PSN
//! inside one (the responder lost a MIDDLE packet and expects it), say that the
//! responder has the message's packets before that PSN: the WQE counts them as done,
//! and a resend (for the NAK, or after the local ACK timeout) starts at the first packet
//! not done, as MIDDLE and LAST packets ([`Frame::Part`]) carrying the message from that
//! packet's byte on, without a RETH: the responder kept the message's receive and its
//! write position, as IBA requires of it and as rxe resends (`retry_first_write_send()`
//! steps the opcode through the packets acknowledged, so the next one is a MIDDLE or
//! LAST).
//!
//! A READ's response packets are placed as they come, each at the PSN next expected; one
//! beyond it (a response packet was lost) makes the requester send the READ again for
//! the rest only, as rxe does: a new READ request whose RETH's address and length are
//! advanced past the packets placed, with the PSN of the first packet missing, whose
//! response the responder numbers from there. Copies of packets already placed are
//! dropped; a frame of several packets that reaches past the ones placed (the first
//! response, arriving after the packets a reordering network let overtake it) is
//! placed whole, its bytes before the first missing packet written again with the same
//! data. Each packet placed is progress: the retry counts start afresh.

use super::*;
use crate::region::slice;
use crate::wire::PartKind;

impl Requester {
    /// The position of the sent, unfinished WQE whose PSNs hold `psn`, and the index of
    /// `psn`'s packet in its message.
    pub(super) fn containing(&self, psn: u32) -> Option<(usize, u32)> {
        self.sq.iter().take(self.next).enumerate().find_map(|(i, w)| {
            let d = psn::diff(psn, w.psn);
            (w.sent && w.status.is_none() && !w.op.is_local() && d >= 0 && (d as u32) < w.pkts)
                .then_some((i, d as u32))
        })
    }

    /// An ACK of `psn` that completed the WQEs before `next` (their index): if `psn` lies
    /// inside that SEND or WRITE, its packets up to `psn` are done. Returns whether that
    /// is news (progress).
    pub(super) fn ack_inside(&mut self, next: usize, psn: u32) -> bool {
        let Some(w) = self.sq.get_mut(next).filter(|_| next < self.next) else {
            return false;
        };
        let d = psn::diff(psn, w.psn);
        if !w.sent || w.status.is_some() || w.op.is_read_or_atomic() || d < 0 || d as u32 + 1 >= w.pkts {
            return false;
        }
        let now_done = d as u32 + 1;
        let news = now_done > w.done;
        w.done = w.done.max(now_done);
        news
    }

    /// A NAK of `psn` for WQE `idx`, `off` packets into its message: the packets before
    /// it are done (a SEND's or WRITE's). Returns whether that is news.
    pub(super) fn nak_inside(&mut self, idx: usize, off: u32) -> bool {
        let w = &mut self.sq[idx];
        if w.op.is_read_or_atomic() || off <= w.done {
            return false;
        }
        w.done = off;
        true
    }

    /// The response packets `psn..` of `len` bytes of a READ (`last`: they end the
    /// response). Returns where the payload goes.
    pub(super) fn on_read_data(
        &mut self,
        psn: u32,
        len: u32,
        last: bool,
        now: Instant,
        out: &mut Vec<WorkCompletion>,
    ) -> Result<ReadSink, Fatal> {
        let Some((i, off)) = self.containing(psn) else {
            return Ok(ReadSink::Discard);
        };
        let mtu = u64::from(self.path_mtu);
        let w = &self.sq[i];
        if w.executed() {
            // A notice's PSNs: its data is in already, and nothing answers it but an ACK.
            return Ok(ReadSink::Discard);
        }
        if !matches!(w.op, WrOp::RdmaRead { .. }) {
            return self.fail(i, WcStatus::BadRespErr, out);
        }
        let len64 = u64::from(len);
        let end = if last {
            w.pkts
        } else {
            off + psn::packets(len64, self.path_mtu)
        };
        if end <= w.done {
            // A copy of packets already placed.
            return Ok(ReadSink::Discard);
        }
        if off > w.done {
            tracing::debug!(
                qpn = self.qpn,
                dest_qpn = self.dest_qpn,
                psn,
                expected = psn::add(w.psn, w.done),
                "READ response packet out of sequence: resending the READ for the rest"
            );
            if self.ack_through(i, false) {
                self.progress(now);
            }
            return self.nak_retry(i, out);
        }
        let at = u64::from(off) * mtu;
        let rest = w.len - at.min(w.len);
        if len64 > rest || (last && len64 != rest) || (!last && len64 % mtu != 0) {
            return self.fail(i, WcStatus::BadRespErr, out);
        }
        self.ack_through(i, false);
        // A response restarts the timer, as every response packet does on an HCA
        // (rxe's completer re-arms it after each): the responder has answered, and the
        // payload that follows is timed from its own bytes (`on_timer`).
        self.ack_deadline = self.attrs.timeout.map(|t| now + t);
        let w = &mut self.sq[i];
        let whole = at == 0 && last;
        self.arriving = (end, last, whole);
        self.receiving = Some(w.psn);
        let segs = if whole {
            std::mem::take(&mut w.local)
        } else {
            slice(&w.local, at as usize, len as usize)
        };
        Ok(ReadSink::Into { psn: w.psn, segs })
    }

    /// The READ response payload arriving for the WQE at `idx` is in (`segs` are what
    /// the reader filled). Returns whether the READ is complete.
    pub(super) fn read_placed(&mut self, idx: usize, segs: Vec<Seg>) -> bool {
        let (end, last, whole) = std::mem::replace(&mut self.arriving, (0, true, true));
        let w = &mut self.sq[idx];
        if whole {
            w.local = segs;
        }
        w.done = w.done.max(end);
        last
    }

    /// The scatter list the reader filled for a READ whose payload was lost goes back to
    /// the WQE at `idx` if it is the WQE's own.
    pub(super) fn read_unplaced(&mut self, idx: usize, segs: Vec<Seg>) {
        let (_, _, whole) = std::mem::replace(&mut self.arriving, (0, true, true));
        if whole {
            self.sq[idx].local = segs;
        }
    }

    /// Builds the resend of WQE `idx` (message PSN `psn`) from its first packet not
    /// done: a SEND's or WRITE's last part, or a READ of the rest.
    pub(super) fn build_resumed(
        &mut self,
        idx: usize,
        psn: u32,
        mrs: &MrTable,
        tx: &mut TxQueue,
    ) -> Result<(), WcStatus> {
        let pd = self.pd;
        let ack_req = !self.sq[idx].op.is_read_or_atomic() && self.ack_req_due();
        let inflight = u16::try_from(self.rd_inflight + 1).unwrap_or(u16::MAX);
        let mtu = u64::from(self.path_mtu);
        let w = &mut self.sq[idx];
        let at = u64::from(w.done) * mtu;
        let from = psn::add(psn, w.done);
        let rest = (w.len - at) as u32;
        tracing::debug!(
            qpn = self.qpn,
            dest_qpn = self.dest_qpn,
            psn = from,
            offset = at,
            "resending from a packet inside the message"
        );
        if let WrOp::RdmaRead { remote } = w.op {
            mrs.resolve_local(pd, &w.sges, true, &mut w.local)
                .map_err(|_| WcStatus::LocProtErr)?;
            tx.push_frame(&Frame::Read {
                psn: from,
                len: rest,
                addr: remote.addr.wrapping_add(at),
                rkey: remote.rkey,
                inflight,
            });
            return Ok(());
        }
        let kind = if w.op.remote().is_some() {
            PartKind::Write
        } else {
            PartKind::Send
        };
        tx.push_frame(&Frame::Part {
            psn: from,
            len: rest,
            kind,
            first: false,
            last: true,
            addr: 0,
            rkey: 0,
            total: w.len as u32,
            imm: w.op.imm_data(),
            solicited: w.solicited,
            ack_req,
            inv: w.op.invalidate_rkey(),
        });
        // The payload from the first byte not done (a planted bug takes it from the
        // message's start).
        let at = if crate::plant::active(crate::plant::Plant::ResendFromMessageStart) {
            0
        } else {
            at as usize
        };
        if w.inline {
            tx.push_bytes(&w.inline_data[at..at + rest as usize]);
        } else {
            let segs = &mut self.scratch;
            let sw = &self.sw;
            mrs.resolve_local(pd, &w.sges, false, segs)
                .map_err(|e| gather_status(sw, e))?;
            for s in slice(segs, at, rest as usize) {
                tx.push_seg(&s);
            }
            segs.clear();
        }
        Ok(())
    }
}
