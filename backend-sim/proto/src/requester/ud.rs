//! The requester of a UD QP (IBA 9.8.4 "Unreliable datagram service", 10.2.5 "Q_Keys",
//! C10-93.1.1; `man ibv_post_send`: `wr.ud`'s address handle, `remote_qpn` and
//! `remote_qkey`): each WR is one datagram to the QP its destination names, handed on
//! and forgotten.
//!
//! - SEND and SEND_WITH_IMM only; any other opcode is refused at post time with EINVAL
//!   ([`PostCheck::NotUd`]), as IBA has no UD opcode for it. (rxe accepts the post and
//!   completes the WR with `IBV_WC_LOC_QP_OP_ERR`, moving the QP to ERR: librxe's
//!   `validate_send_wr()` does not check the opcode against the QP type and the kernel's
//!   `next_opcode()` finds none.) A WR without a destination is EINVAL too
//!   ([`PostCheck::NoUdDestination`]).
//! - A message longer than the port's MTU (the profile's active MTU, at most
//!   [`MAX_DATAGRAM`](crate::wire::MAX_DATAGRAM)) is not sent, and its WR
//!   completes successfully: "the CI shall not emit any packets for this message.
//!   Further, the CI shall not generate an error due to this condition" (C10-93.1.1, as
//!   rxe's `rxe_requester()` quotes it and does).
//! - The Q_Key a datagram carries is the WR's `remote_qkey`, or the QP's own Q_Key when
//!   the WR's has its high bit set (IBA 10.2.5; rxe sends the WR's value unchanged).
//! - A WR completes (successfully) once its datagram is handed on to the link to its
//!   destination device, or is lost: no link could be set up, the link's queue is full,
//!   or fault injection dropped it. Nothing tells the sender whether it arrived. Only a
//!   local error fails a WR: a bad gather list (as on RC, see
//!   [`gather_status`](super::gather_status)) or, on rxe, an opcode UD lacks. The QP
//!   then goes to SQE or ERR, as the profile says (`Switches::send_error_sqe`).
//!
//! Which link a datagram takes is the driver's business: [`Requester::ud_next`] names
//! the next WQE and its [`UdRoute`], and the driver answers with [`Requester::ud_emit`]
//! (handed on), [`Requester::ud_lost`] or [`Requester::ud_wait`] (the link is being set
//! up). WQEs complete in posting order whatever order their datagrams leave in
//! ([`Requester::take_done`]).

use std::net::SocketAddr;

use verbs_api::{QpType, SendWr, WcStatus};

use super::{gather_status, Fatal, PostCheck, Requester};
use crate::memory::MrTable;
use crate::opcode_table;
use crate::wire::{Frame, Grh, MAX_HDR_LEN};

/// Where a UD send goes: the address handle's destination, resolved by the driver, and
/// the WR's QP number and Q_Key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdRoute {
    /// Where the destination device listens (the address its address handle names).
    pub peer: SocketAddr,
    /// The GRH fields, when the address handle has a GRH (`is_global`).
    pub grh: Option<Grh>,
    /// The destination QP (`wr.ud.remote_qpn`).
    pub remote_qpn: u32,
    /// The WR's Q_Key (`wr.ud.remote_qkey`).
    pub remote_qkey: u32,
}

/// What [`Requester::ud_emit`] did with a datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Emitted {
    /// Its header and payload were appended.
    Sent,
    /// Nothing: it is longer than the MTU (C10-93.1.1); the WR completes successfully.
    TooLong,
}

/// The high bit of a WR's Q_Key: use the QP's own (IBA 10.2.5).
const QKEY_OWN: u32 = 0x8000_0000;

impl Requester {
    /// The same as the requester of a UD QP.
    pub fn datagram(mut self) -> Self {
        self.ud = true;
        self
    }

    /// Queues a UD send to `route` (`ibv_post_send` with `wr.ud`): the checks of
    /// [`Requester::post`], and the opcode must be SEND or SEND_WITH_IMM.
    #[cfg(any(test, feature = "internals"))]
    pub fn post_ud(&mut self, wr: &SendWr<'_>, route: UdRoute, mrs: &MrTable) -> Result<(), PostCheck> {
        self.post_ud_with(wr, route, mrs, None)
    }

    /// [`Requester::post_ud`] with inline data as pieces (see [`Requester::post_with`]).
    pub fn post_ud_with(
        &mut self,
        wr: &SendWr<'_>,
        route: UdRoute,
        mrs: &MrTable,
        pieces: Option<&[&[u8]]>,
    ) -> Result<(), PostCheck> {
        if !self.ud {
            return Err(PostCheck::UdDestination);
        }
        if self.sw.opcode_checked_at_post && !opcode_table::row(wr.op.opcode()).allowed_on(QpType::Ud) {
            return Err(PostCheck::NotUd);
        }
        self.post_from(wr, mrs, Some(route), pieces)
    }

    /// The first WQE at index `from` or later whose datagram may go now, with its route:
    /// one not yet handed on, and in SQD only one started before (waiting for its link).
    pub fn ud_next(&self, from: usize) -> Option<(usize, UdRoute)> {
        self.sq
            .iter()
            .enumerate()
            .skip(from)
            .filter(|(_, w)| w.status.is_none() && (!self.draining || w.sent))
            .find_map(|(i, w)| w.route.map(|r| (i, r)))
    }

    /// WQE `idx` waits for the link to its destination device to be set up. It counts as
    /// started: a move to SQD meanwhile does not hold it back.
    pub fn ud_wait(&mut self, idx: usize) {
        self.sq[idx].sent = true;
    }

    /// WQE `idx`'s datagram is lost on the way (no link, a full link, fault injection):
    /// the WR completes successfully, as UD's do.
    pub fn ud_lost(&mut self, idx: usize) {
        let psn = self.psn;
        let w = &mut self.sq[idx];
        w.psn = psn;
        w.sent = true;
        w.status = Some(WcStatus::Success);
        self.psn = crate::psn::add(psn, 1);
    }

    /// Hands WQE `idx`'s datagram on: appends its header and payload to `out` (a link's
    /// queue of bytes), and the WR is done. A bad gather list completes the WR with its
    /// error and returns [`Fatal`] (nothing is appended).
    pub fn ud_emit(&mut self, idx: usize, mrs: &MrTable, out: &mut Vec<u8>) -> Result<Emitted, Fatal> {
        let (pd, qpn, psn, mtu) = (self.pd, self.qpn, self.psn, self.mtu);
        let frame = self.ud_frame(idx);
        let w = &mut self.sq[idx];
        let Some(frame) = frame else {
            w.status = Some(WcStatus::LocQpOpErr);
            return Err(Fatal(WcStatus::LocQpOpErr));
        };
        if !opcode_table::row(w.op.opcode()).allowed_on(QpType::Ud) {
            // Accepted at post (`Switches::opcode_checked_at_post` off, as on rxe): UD
            // sends nothing else, so it fails as it starts.
            w.status = Some(WcStatus::LocQpOpErr);
            return Err(Fatal(WcStatus::LocQpOpErr));
        }
        w.sent = true;
        if w.len > mtu as u64 {
            tracing::debug!(
                qpn,
                len = w.len,
                mtu,
                "UD: a message longer than the MTU is not sent (C10-93.1.1)"
            );
            w.status = Some(WcStatus::Success);
            return Ok(Emitted::TooLong);
        }
        let segs = &mut self.scratch;
        segs.clear();
        if !w.inline {
            if let Err(e) = mrs.resolve_local(pd, &w.sges, false, segs) {
                let status = gather_status(&self.sw, e);
                w.status = Some(status);
                return Err(Fatal(status));
            }
        }
        let start = out.len();
        let mut hdr = [0u8; MAX_HDR_LEN];
        let n = frame.encode(&mut hdr);
        out.extend_from_slice(&hdr[..n]);
        if w.inline {
            out.extend_from_slice(&w.inline_data);
        } else {
            for s in segs.iter() {
                let at = out.len();
                out.resize(at + s.len, 0);
                if !s.copy_out(0, &mut out[at..]) {
                    // Deregistered between the check and the copy.
                    out.truncate(start);
                    segs.clear();
                    w.status = Some(WcStatus::LocProtErr);
                    return Err(Fatal(WcStatus::LocProtErr));
                }
            }
            segs.clear();
        }
        w.psn = psn;
        w.status = Some(WcStatus::Success);
        self.psn = crate::psn::add(psn, 1);
        Ok(Emitted::Sent)
    }

    /// The header WQE `idx`'s datagram goes out with (at the PSN it would take), if it
    /// has a destination: what a capture shows of a datagram lost on the way.
    pub fn ud_frame(&self, idx: usize) -> Option<Frame> {
        let w = &self.sq[idx];
        let route = w.route?;
        // (`Switches::qkey_high_bit_own` off, as on rxe: the WR's value goes out as it is.)
        let qkey = if self.sw.qkey_high_bit_own && route.remote_qkey & QKEY_OWN != 0 {
            self.qkey
        } else {
            route.remote_qkey
        };
        Some(Frame::Datagram {
            psn: self.psn,
            len: w.len as u32,
            dst_qpn: route.remote_qpn,
            src_qpn: self.qpn,
            qkey,
            imm: w.op.imm_data(),
            solicited: w.solicited,
            grh: route.grh,
        })
    }

    /// Whether no WQE started is still waiting for its link (SQD has drained).
    pub(super) fn ud_drained(&self) -> bool {
        !self.sq.iter().any(|w| w.sent && w.status.is_none())
    }
}
