//! The responder half of a QP, as pure state: no I/O (`man ibv_post_recv`; IBA 9.7.4
//! "Responder", 9.7.5.2 NAK codes, 9.7.8 atomics, 10.7.2.2 receive errors). This module
//! is RC's; a UC QP's requests go to [`uc`], which shares the receive handling, and a UD
//! QP's datagrams to [`ud`].
//!
//! For each incoming request, in PSN order:
//!
//! - a PSN behind the expected one is a duplicate: SEND/WRITE are acknowledged again
//!   (by the next coalesced ACK) without executing, READs are executed again, atomics
//!   return the saved result, a notice of a READ or atomic the same-host requester
//!   executed itself is acknowledged again ([`placed`]);
//! - a PSN ahead of the expected one gets one PSN-sequence-error NAK, then everything is
//!   dropped until the expected PSN arrives;
//! - SEND, SEND_WITH_IMM and RDMA_WRITE_WITH_IMM consume the oldest posted receive, from
//!   the QP's own receive queue or from its SRQ ([`RecvSource`]); with none posted the
//!   answer is an RNR NAK carrying this QP's `min_rnr_timer`, and requests are dropped
//!   until the refused one is resent (an empty SRQ is an empty receive queue);
//! - a message longer than the receive's buffers completes the receive with
//!   `IBV_WC_LOC_LEN_ERR` and NAKs the request as invalid (`IBV_WC_REM_INV_REQ_ERR` at
//!   the requester); a receive SGE with a bad lkey is `IBV_WC_LOC_PROT_ERR` here and a
//!   remote operational error there;
//! - a READ or atomic to a QP with `max_dest_rd_atomic` 0 (no responder resources for
//!   them) is NAKed as invalid (`IBV_WC_REM_INV_REQ_ERR` at the requester) and not
//!   executed, as rxe's `check_resource()` does; a non-zero limit is not enforced;
//! - RDMA and atomics pass the one access check of [`MrTable::resolve_remote`] (an rkey
//!   of a memory window is checked against the window); a violation NAKs with remote
//!   access error (misaligned atomics: invalid request) and leaves memory untouched;
//! - a SEND_WITH_INV invalidates the memory window it names once its message is in,
//!   and its receive completes with `IBV_WC_WITH_INV` and the rkey; a window it may not
//!   invalidate (no such window, a type 1 window, not bound, or not this QP's) completes
//!   the receive with `IBV_WC_REM_INV_REQ_ERR` and moves the QP to ERR without a NAK
//!   (rxe_resp.c `RESPST_ERR_INVALIDATE_RKEY`, IBA's class J): the requester hears
//!   nothing and its transport retries run out;
//! - atomics run as one atomic instruction on the target word, so they are atomic against
//!   every other atomic on the device, from any QP.
//!
//! Errors return [`Fatal`]: the QP goes to ERR (as an HCA does after a responder error on
//! RC). ACKs are coalesced: one ACK covers every request executed before it is sent.
//!
//! A receive taken from the source belongs to this QP until it completes: a message that
//! never arrived whole (the connection broke) leaves it held for the resend, and a QP
//! going to ERR flushes it with `IBV_WC_WR_FLUSH_ERR`. With an SRQ that is the only
//! receive flushed: the SRQ's own stay for its other QPs.
//!
//! Asynchronous events the responder gives rise to wait in [`Responder::take_events`] for
//! the driver, which raises them on the device: `IBV_EVENT_SRQ_LIMIT_REACHED` when a take
//! drains the SRQ below its limit; `IBV_EVENT_QP_LAST_WQE_REACHED` when a QP on an SRQ is
//! flushed (IBA 11.6.3.3: it will take no more receives from the SRQ; rxe 6.1 never
//! raises it); and the affiliated errors of IBA 11.6.3.1 for a request refused without a
//! completion here to say why, `IBV_EVENT_QP_ACCESS_ERR` (remote access error) and
//! `IBV_EVENT_QP_REQ_ERR` (invalid request) (rxe 6.1 raises neither).
//!
//! Here the state and the order of the checks every request meets; each new request's
//! execution in the module of its kind (`send`, `write`, `read`, `atomic`), a repeated
//! one's in `duplicate`, the receive a message consumes in `recv`, the ACKs owed and the
//! MSN in `ack`, the NAKs of refused requests and their affiliated errors in `refuse`.

use std::collections::VecDeque;
use std::sync::Arc;

use verbs_api::{AccessFlags, AsyncElement, AsyncEvent, AsyncEventType, WcOpcode, WcStatus, WorkCompletion};

use crate::faults::ForcedRnr;
use crate::memory::{MrTable, Seg, Target};
use crate::psn;
use crate::recv_queue::{RecvQueue, RecvSource, RecvWqe, SharedRecvQueue};
use crate::requester::Fatal;
use crate::switches::Switches;
use crate::tx::TxQueue;
use crate::wire::{Frame, NakCode, NakReason};

mod ack;
mod atomic;
mod duplicate;
mod part;
mod place;
mod placed;
mod read;
mod recv;
mod refuse;
mod send;
mod write;

pub mod uc;
pub mod ud;

pub(crate) use refuse::reason_of;
pub use ud::{DatagramSource, UdOutcome};

/// Asynchronous events kept for the driver at most.
const MAX_EVENTS: usize = 64;

/// The receive this QP took from its source and has not completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Taken {
    /// Taken for a request that did not execute (its message never arrived whole, or a
    /// check after the take failed): the next request that needs one uses it.
    Held,
    /// Consumed by a request whose payload is arriving.
    Filling {
        opcode: WcOpcode,
        byte_len: u32,
        imm: Option<u32>,
        /// The window a SEND_WITH_INV invalidates once its payload is in.
        inv: Option<u32>,
        solicited: bool,
    },
}

/// What to do with the payload that follows a request header.
#[derive(Debug)]
pub enum Incoming {
    /// Write it into these segments (in order), then call [`Responder::payload_done`].
    Sink(Vec<Seg>),
    /// Read and drop it.
    Discard,
}

/// Responder attributes (set at INIT → RTR).
#[derive(Clone, Copy, Debug)]
pub struct RespAttrs {
    /// Expected PSN of the first request (`rq_psn`).
    pub rq_psn: u32,
    /// RNR NAK timer code advertised to requesters.
    pub min_rnr_timer: u8,
}

/// The receive side of a QP.
pub struct Responder {
    qpn: u32,
    pd: u32,
    source: RecvSource,
    /// The receive taken from `source` (its buffers; valid while `taken` is set).
    wqe: RecvWqe,
    taken: Option<Taken>,
    /// Asynchronous events for the driver to raise.
    events: Vec<AsyncEvent>,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED` was raised since the last reset.
    last_wqe_raised: bool,
    /// A UC QP: no ACKs, NAKs or RNR; errors drop the message ([`uc`]).
    uc: bool,
    /// A UD QP: datagrams, each taken whole or dropped ([`ud`]).
    ud: bool,
    /// The QP's Q_Key (UD: a datagram must carry it).
    pub qkey: u32,
    /// The port is an Ethernet (RoCE v2) port: a UD receive's first 40 bytes take the
    /// packet's IP header rather than an IB GRH ([`ud::roce_ip_header`]).
    pub roce: bool,
    /// UC messages dropped, and PSN gaps met, since [`Responder::take_uc_counts`].
    uc_dropped: u64,
    uc_gaps: u64,
    epsn: u32,
    /// The message sequence number (IBA 9.7.5.1.1): messages completed since the QP
    /// left RESET, 24 bits, carried by the AETH of every response.
    msn: u32,
    /// The path MTU (`path_mtu`): a request takes one PSN per packet of this size, a READ
    /// as many as its response has ([`Responder::set_path_mtu`]).
    path_mtu: u32,
    /// Set after a NAK: requests are dropped until this PSN arrives.
    nak_psn: Option<u32>,
    /// Remote operations the QP accepts (`qp_access_flags`).
    pub access: AccessFlags,
    /// RDMA READs and atomics this QP may have outstanding as a responder
    /// (`max_dest_rd_atomic`). 0 leaves it no resources for them: each is refused as an
    /// invalid request, as rxe's `check_resource()` does (an HCA that allocated no
    /// responder resources cannot execute one). A request sent while its requester had
    /// more outstanding than a non-zero limit is refused the same way, unless the
    /// profile serves it as rxe does (`Switches::rd_atomic_over_limit_served`).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code.
    pub min_rnr_timer: u8,
    ack_owed: Option<u32>,
    /// Payload bytes of the requests the owed ACK covers.
    owed_bytes: usize,
    /// Requests (executed, repeated, or for UC taken in) the owed ACK covers.
    owed_reqs: u32,
    replay: VecDeque<(u32, u64)>,
    /// PSN of the request whose payload is arriving (to roll back if it never does).
    payload_psn: Option<u32>,
    /// The request whose payload is arriving asked for an ACK.
    payload_ack_req: bool,
    /// A request the owed ACK covers asked for it: send it at the end of this batch.
    ack_asked: bool,
    scratch: Vec<Seg>,
    /// A message whose first parts are in ([`part`]).
    partial: Option<part::Partial>,
    /// The device profile's behavioural switches.
    sw: Switches,
}

impl Responder {
    /// QP `qpn` in PD `pd` with an empty receive queue of its own, of `cap` receives of
    /// `max_sge` SGEs.
    pub fn new(qpn: u32, pd: u32, cap: u32, max_sge: u32) -> Self {
        Self::with_source(qpn, pd, RecvSource::Own(RecvQueue::new(cap, max_sge)))
    }

    /// QP `qpn` in PD `pd` taking its receives from `srq`.
    pub fn with_srq(qpn: u32, pd: u32, srq: Arc<SharedRecvQueue>) -> Self {
        Self::with_source(qpn, pd, RecvSource::Shared(srq))
    }

    fn with_source(qpn: u32, pd: u32, source: RecvSource) -> Self {
        Responder {
            qpn,
            pd,
            source,
            wqe: RecvWqe::default(),
            taken: None,
            events: Vec::new(),
            last_wqe_raised: false,
            uc: false,
            ud: false,
            qkey: 0,
            roce: false,
            uc_dropped: 0,
            uc_gaps: 0,
            epsn: 0,
            msn: 0,
            path_mtu: psn::NO_MTU,
            nak_psn: None,
            access: AccessFlags::empty(),
            max_dest_rd_atomic: 0,
            min_rnr_timer: 0,
            ack_owed: None,
            owed_bytes: 0,
            owed_reqs: 0,
            replay: VecDeque::new(),
            payload_psn: None,
            payload_ack_req: false,
            ack_asked: false,
            scratch: Vec::new(),
            partial: None,
            sw: Switches::default(),
        }
    }

    /// The same, on a device with the switches `sw`.
    pub fn with_switches(mut self, sw: Switches) -> Self {
        self.sw = sw;
        self
    }

    /// The QP as the remote access check sees it.
    fn target(&self) -> Target {
        Target {
            pd: self.pd,
            qpn: self.qpn,
            access: self.access,
            region_bounds: self.sw.mw_region_bounds,
        }
    }

    /// The same as the responder of a UC QP ([`uc`]).
    pub fn unreliable(mut self) -> Self {
        self.uc = true;
        self
    }

    /// Whether this is a UC QP's responder.
    pub fn is_unreliable(&self) -> bool {
        self.uc
    }

    /// Applies INIT → RTR attributes.
    pub fn connect(&mut self, attrs: RespAttrs) {
        self.epsn = attrs.rq_psn;
        self.min_rnr_timer = attrs.min_rnr_timer;
        self.nak_psn = None;
        self.forget_ack();
        self.replay.clear();
        self.forget_partial();
    }

    /// Sets the path MTU in bytes (`path_mtu`, given at RTR): the next expected PSN
    /// moves past every packet of a message (IBA 9.7.1). Until it is set a message takes
    /// one PSN. The requester counts packets by its own path MTU: ends that were given
    /// different ones lose step on the first message longer than the smaller MTU, and the
    /// requester ends in `IBV_WC_RETRY_EXC_ERR` (rxe's responder refuses such a packet as
    /// an invalid request).
    pub fn set_path_mtu(&mut self, mtu: u32) {
        self.path_mtu = mtu;
    }

    /// The PSNs a request of `len` bytes takes (atomics one).
    fn packets(&self, len: u32) -> u32 {
        psn::packets(len as u64, self.path_mtu)
    }

    /// The expected PSN (`rq_psn` as `ibv_query_qp` reports it).
    pub fn expected_psn(&self) -> u32 {
        self.epsn
    }

    /// The asynchronous events raised since the last call, oldest first, for the driver
    /// to queue on the device.
    pub fn take_events(&mut self) -> std::vec::Drain<'_, AsyncEvent> {
        self.events.drain(..)
    }

    /// Whether events wait for [`Responder::take_events`], or counts for
    /// [`Responder::take_uc_counts`].
    pub fn has_news(&self) -> bool {
        !self.events.is_empty() || self.uc_dropped > 0 || self.uc_gaps > 0
    }

    fn event(&mut self, event_type: AsyncEventType, element: AsyncElement) {
        // Bounded for a driver that never takes them (the fuzz harness, tests); the
        // sim's driver takes them after every batch of frames.
        if self.events.len() < MAX_EVENTS {
            self.events.push(AsyncEvent { event_type, element });
        }
    }

    /// Handles a request header. Responses go to `tx`, receive completions to `out`.
    #[cfg(any(test, feature = "internals"))]
    pub fn on_request(
        &mut self,
        frame: &Frame,
        mrs: &MrTable,
        tx: &mut TxQueue,
        out: &mut Vec<(WorkCompletion, bool)>,
    ) -> Result<Incoming, Fatal> {
        self.on_request_rnr(frame, mrs, tx, out, &mut ForcedRnr::default())
    }

    /// [`Responder::on_request`], answering RNR to the SEND and
    /// WRITE_WITH_IMM requests `forced_rnr` refuses, whether or not receives are posted:
    /// the driver's fault injection arms it.
    pub fn on_request_rnr(
        &mut self,
        frame: &Frame,
        mrs: &MrTable,
        tx: &mut TxQueue,
        out: &mut Vec<(WorkCompletion, bool)>,
        forced_rnr: &mut ForcedRnr,
    ) -> Result<Incoming, Fatal> {
        let Some(psn) = frame.psn().filter(|_| frame.is_request()) else {
            return Ok(Incoming::Discard);
        };
        if self.uc {
            return self.on_uc_request(frame, psn, mrs, out, forced_rnr);
        }
        let d = psn::diff(psn, self.epsn);
        if d < 0 && matches!(frame, Frame::PlacedRun { .. }) {
            // Wholly seen: acknowledged again; partly (only a peer's own doing: a run is
            // never resent as one): its part from the expected PSN on is new.
            return self.on_run(frame, psn, tx);
        }
        if d < 0 && !self.planted_reexecution(frame) {
            if self.partial.is_some() && self.straddles(frame, psn) {
                self.nak_psn = None;
                return self.on_part(frame, psn, mrs, tx, out, forced_rnr);
            }
            return Ok(self.duplicate(frame, mrs, tx));
        }
        if d > 0 {
            if self.nak_psn.is_none() {
                self.nak_psn = Some(self.epsn);
                let e = self.epsn;
                self.nak(tx, e, NakCode::PsnSeq, None);
            }
            return Ok(Incoming::Discard);
        }
        self.nak_psn = None;
        if self.for_part(frame) {
            return self.on_part(frame, psn, mrs, tx, out, forced_rnr);
        }
        match *frame {
            Frame::Send { .. } => self.on_send(frame, psn, mrs, tx, out, forced_rnr),
            Frame::Write { .. } | Frame::WritePlaced { .. } => {
                self.on_write(frame, psn, mrs, tx, out, forced_rnr)
            }
            Frame::Read { .. } => self.on_read(frame, psn, mrs, tx),
            Frame::CmpSwap { .. } | Frame::FetchAdd { .. } => self.on_atomic(frame, psn, mrs, tx),
            Frame::ReadPlaced { .. } | Frame::AtomicPlaced { .. } => self.on_placed(frame, psn, tx),
            Frame::PlacedRun { .. } => self.on_run(frame, psn, tx),
            _ => Ok(Incoming::Discard),
        }
    }

    /// The payload of the current request has been written (or was empty): invalidate
    /// the window a SEND_WITH_INV names, complete the receive it consumed, if any, and
    /// owe an ACK.
    pub fn payload_done(&mut self, sink: Vec<Seg>, mrs: &MrTable, out: &mut Vec<(WorkCompletion, bool)>) {
        let mut sink = sink;
        if self.partial.is_some() && self.part_done() {
            self.unplace(sink);
            return;
        }
        self.owed_bytes += sink.iter().map(|s| s.len).sum::<usize>();
        self.ack_asked |= std::mem::take(&mut self.payload_ack_req);
        sink.clear();
        self.scratch = sink;
        self.payload_psn = None;
        self.invalidate_filled(mrs);
        self.complete_filled(out);
        self.message_done();
        self.ack_owed = Some(psn::add(self.epsn, verbs_api::PSN_MASK));
        self.owed_reqs += 1;
    }

    /// The region the current request's payload was going to was deregistered while the
    /// payload arrived, so part of it was dropped: the request fails as if its later
    /// packets had met the dead key. A SEND completes its receive with
    /// `IBV_WC_LOC_PROT_ERR` and NAKs a remote operational error (as for a receive SGE
    /// with a bad lkey); a WRITE NAKs a remote access error (a receive consumed by
    /// WRITE_WITH_IMM goes back to the queue, to be flushed). The QP must go to ERR.
    pub fn payload_lost(
        &mut self,
        sink: Vec<Seg>,
        tx: &mut TxQueue,
        out: &mut Vec<(WorkCompletion, bool)>,
    ) -> Option<Fatal> {
        let mut sink = sink;
        sink.clear();
        self.scratch = sink;
        self.forget_partial();
        if self.uc {
            return self.uc_payload_lost(out);
        }
        let psn = self
            .payload_psn
            .take()
            .unwrap_or_else(|| psn::add(self.epsn, verbs_api::PSN_MASK));
        match self.taken {
            Some(Taken::Filling {
                opcode: WcOpcode::Recv,
                ..
            }) => {
                self.fail_recv(WcStatus::LocProtErr, out);
                self.nak(tx, psn, NakCode::RemoteOperational, None);
                Some(Fatal(WcStatus::LocProtErr))
            }
            _ => {
                if self.taken.is_some() {
                    self.taken = Some(Taken::Held);
                }
                let reason = NakReason::DeregisteredRkey;
                self.nak(tx, psn, reason.code(), Some(reason));
                Some(Fatal(self.affiliated_error(reason.code())))
            }
        }
    }

    /// The connection broke in the middle of a request's payload: as an HCA that never
    /// saw the last packet, forget the request (the requester resends it): the expected
    /// PSN goes back, and a receive it consumed stays held for the resend.
    pub fn connection_lost(&mut self) {
        if self.uc {
            return self.uc_connection_lost();
        }
        if let Some(psn) = self.payload_psn.take() {
            self.epsn = psn;
            self.part_lost();
            if self.taken.is_some() && !self.partly_in() {
                self.taken = Some(Taken::Held);
            }
        }
        self.nak_psn = None;
        self.forget_ack();
    }
}

/// Shortens a scatter list to its first `len` bytes.
pub(crate) fn trim(segs: &mut Vec<Seg>, len: usize) {
    let mut left = len;
    let mut keep = 0;
    for s in segs.iter_mut() {
        if left == 0 {
            break;
        }
        s.len = s.len.min(left);
        left -= s.len;
        keep += 1;
    }
    segs.truncate(keep);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The frames queued in `tx`, taken out of it.
    pub(super) fn frames(tx: &mut TxQueue) -> Vec<Frame> {
        let mut b = Vec::new();
        tx.drain_into(&mut b);
        crate::wire::tests::decode_all(&b)
    }
}
