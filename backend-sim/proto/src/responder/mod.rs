//! The responder half of a QP, as pure state: no I/O (`man ibv_post_recv`; IBA 9.7.4
//! "Responder", 9.7.5.2 NAK codes, 9.7.8 atomics, 10.7.2.2 receive errors). This module
//! is RC's; a UC QP's requests go to [`uc`], which shares the receive handling, and a UD
//! QP's datagrams to [`ud`].
//!
//! For each incoming request, in PSN order:
//!
//! - a PSN behind the expected one is a duplicate: SEND/WRITE are acknowledged again
//!   (by the next coalesced ACK) without executing, READs are executed again, atomics
//!   return the saved result;
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

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use verbs_api::{
    AccessFlags, AsyncElement, AsyncEvent, AsyncEventType, RecvWr, WcFlags, WcOpcode, WcStatus,
    WorkCompletion,
};

use crate::memory::{MrTable, RemoteAccessError, Seg, Target};
use crate::psn;
use crate::recv_queue::{PostRecvError, RecvQueue, RecvSource, RecvWqe, SharedRecvQueue};
use crate::requester::Fatal;
use crate::switches::{RecvError, Switches};
use crate::tx::TxQueue;
use crate::window::{Invalidator, OnQp};
use crate::wire::{Frame, NakCode, NakReason};

pub mod uc;
pub mod ud;
pub use ud::{DatagramSource, UdOutcome};

/// How many atomic results are kept for duplicate requests.
const ATOMIC_REPLAY: usize = 16;

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
    /// The device profile's behavioural switches.
    sw: Switches,
}

/// What a capture says of an RNR NAK that fault injection forced.
const FORCED_RNR: &str = "RNR NAK forced (fault injection)";

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
            sw: Switches::default(),
        }
    }

    /// The same, on a device with the switches `sw`.
    pub fn with_switches(mut self, sw: Switches) -> Self {
        self.sw = sw;
        self
    }

    /// The switches it follows.
    pub fn switches(&self) -> &Switches {
        &self.sw
    }

    /// The status of a receive the message could not be placed in: IBA's `iba`, or
    /// `IBV_WC_LOC_QP_OP_ERR` where the profile treats it as a malformed WQE
    /// ([`RecvError`]).
    fn recv_error(choice: RecvError, iba: WcStatus) -> WcStatus {
        match choice {
            RecvError::Iba => iba,
            RecvError::MalformedWqe => WcStatus::LocQpOpErr,
        }
    }

    /// The NAK syndrome of a refusal for `reason` on this device: the reason's own, but
    /// an invalid request for a `qp_access_flags` refusal where the profile says so
    /// ([`Switches::qp_access_invalid_request`]).
    fn code_of(&self, reason: NakReason) -> NakCode {
        if reason == NakReason::QpAccess && self.sw.qp_access_invalid_request {
            NakCode::InvalidRequest
        } else {
            reason.code()
        }
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

    /// Whether a SEND_WITH_INV arriving on this QP may invalidate the window `rkey`.
    fn may_invalidate(&self, rkey: u32, mrs: &MrTable) -> bool {
        let who = Invalidator::Remote(OnQp {
            pd: self.pd,
            qpn: self.qpn,
        });
        mrs.invalidate(rkey, who, self.sw.mw_owner_checks, false).is_ok()
    }

    /// Whether a SEND_WITH_INV arriving on this QP may invalidate the window `rkey`
    /// (checked when its header arrives; the invalidation itself happens once its
    /// payload is in, [`Responder::payload_done`]). A refusal completes the receive taken
    /// for it with `IBV_WC_REM_INV_REQ_ERR` and the QP must go to ERR, with no NAK
    /// (rxe_resp.c: `RESPST_ERR_INVALIDATE_RKEY`, class J).
    fn check_invalidate(
        &mut self,
        rkey: u32,
        mrs: &MrTable,
        out: &mut Vec<(WorkCompletion, bool)>,
    ) -> Result<(), Fatal> {
        let who = Invalidator::Remote(OnQp {
            pd: self.pd,
            qpn: self.qpn,
        });
        match mrs.invalidate(rkey, who, self.sw.mw_owner_checks, false) {
            Ok(()) => Ok(()),
            Err(e) => {
                tracing::warn!(
                    qpn = self.qpn,
                    rkey = %format_args!("{rkey:#x}"),
                    "SEND_WITH_INV refused: {e}; the receive completes with REM_INV_REQ_ERR and the QP goes to ERR"
                );
                self.fail_recv(WcStatus::RemInvReqErr, out);
                Err(Fatal(WcStatus::RemInvReqErr))
            }
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

    /// Receives posted to the QP's own receive queue and not yet consumed (0 with an
    /// SRQ).
    pub fn posted(&self) -> usize {
        match &self.source {
            RecvSource::Own(q) => q.len(),
            RecvSource::Shared(_) => 0,
        }
    }

    /// Receives the next message could take: the QP's own, or its SRQ's.
    fn available(&self) -> usize {
        match &self.source {
            RecvSource::Own(q) => q.len(),
            RecvSource::Shared(s) => s.len(),
        }
    }

    /// The SRQ the QP takes its receives from, if any.
    pub fn srq(&self) -> Option<&Arc<SharedRecvQueue>> {
        match &self.source {
            RecvSource::Own(_) => None,
            RecvSource::Shared(s) => Some(s),
        }
    }

    /// Queues a receive WQE on the QP's own receive queue (`ibv_post_recv`).
    pub fn post(&mut self, wr: &RecvWr<'_>) -> Result<(), PostRecvError> {
        match &mut self.source {
            RecvSource::Own(q) => q.post(wr),
            RecvSource::Shared(_) => Err(PostRecvError::HasSrq),
        }
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

    /// Takes the oldest receive (unless one is held already); false if there is none.
    fn take_recv(&mut self) -> bool {
        if self.taken.is_some() {
            return true;
        }
        let got = match &mut self.source {
            RecvSource::Own(q) => q.take_into(&mut self.wqe),
            RecvSource::Shared(s) => match s.take_into(&mut self.wqe) {
                None => false,
                Some(reached) => {
                    if reached {
                        let h = s.handle();
                        self.event(AsyncEventType::SrqLimitReached, AsyncElement::Srq(h));
                    }
                    true
                }
            },
        };
        if got {
            self.taken = Some(Taken::Held);
        }
        got
    }

    /// Completes the receive taken with `status` (an error: only `wr_id`, `status` and
    /// `qp_num` are valid, as `man ibv_poll_cq` says).
    fn fail_recv(&mut self, status: WcStatus, out: &mut Vec<(WorkCompletion, bool)>) {
        self.taken = None;
        out.push((self.recv_completion(self.wqe.wr_id, status), false));
    }

    fn recv_completion(&self, wr_id: u64, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode: WcOpcode::Recv,
            qp_num: self.qpn,
            ..Default::default()
        }
    }

    fn nak(&mut self, tx: &mut TxQueue, psn: u32, code: NakCode, reason: Option<NakReason>) {
        self.forget_ack();
        tx.push_reply(&Frame::Nak { psn, code, reason }, self.msn);
    }

    /// Whether an ACK is owed (requests executed but not yet acknowledged).
    pub fn owes_ack(&self) -> bool {
        self.ack_owed.is_some()
    }

    /// Owes no ACK any more (without sending one).
    fn forget_ack(&mut self) {
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

    fn flush_ack_before_response(&mut self, tx: &mut TxQueue) {
        // A READ or atomic response implicitly acknowledges everything before it, but an
        // explicit ACK keeps the requester's view simple and costs 16 bytes.
        self.flush_ack(tx);
    }

    /// Handles a request header. Responses go to `tx`, receive completions to `out`.
    pub fn on_request(
        &mut self,
        frame: &Frame,
        mrs: &MrTable,
        tx: &mut TxQueue,
        out: &mut Vec<(WorkCompletion, bool)>,
    ) -> Result<Incoming, Fatal> {
        self.on_request_rnr(frame, mrs, tx, out, &mut 0)
    }

    /// [`Responder::on_request`], answering RNR to the next `force_rnr` SEND /
    /// WRITE_WITH_IMM requests (counted down) whether or not receives are posted: the
    /// driver's fault injection owns the count.
    pub fn on_request_rnr(
        &mut self,
        frame: &Frame,
        mrs: &MrTable,
        tx: &mut TxQueue,
        out: &mut Vec<(WorkCompletion, bool)>,
        force_rnr: &mut u32,
    ) -> Result<Incoming, Fatal> {
        let Some(psn) = frame.psn().filter(|_| frame.is_request()) else {
            return Ok(Incoming::Discard);
        };
        if self.uc {
            return self.on_uc_request(frame, psn, mrs, out, force_rnr);
        }
        let d = psn::diff(psn, self.epsn);
        if d < 0 && !self.planted_reexecution(frame) {
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
        match *frame {
            Frame::Send {
                len,
                imm,
                inv,
                solicited,
                ..
            } => {
                if *force_rnr > 0 {
                    *force_rnr -= 1;
                    tx.mark_next(FORCED_RNR);
                    return self.rnr(psn, tx);
                }
                if !self.take_recv() {
                    return self.rnr(psn, tx);
                }
                let mut segs = std::mem::take(&mut self.scratch);
                let resolved = mrs.resolve_local(self.pd, &self.wqe.sges, true, &mut segs);
                let total = match resolved {
                    Ok(t) => t,
                    Err(_) => {
                        let status = Self::recv_error(self.sw.recv_bad_lkey, WcStatus::LocProtErr);
                        self.fail_recv(status, out);
                        self.scratch = segs;
                        self.nak(tx, psn, NakCode::RemoteOperational, None);
                        return Err(Fatal(status));
                    }
                };
                if (len as u64) > total && self.sw.recv_too_small == RecvError::MalformedWqe {
                    tracing::debug!(
                        qpn = self.qpn,
                        len,
                        room = total,
                        "SEND longer than the receive buffers: a malformed WQE (LOC_QP_OP_ERR) here, the QP goes to ERR"
                    );
                    self.fail_recv(WcStatus::LocQpOpErr, out);
                    self.scratch = segs;
                    self.nak(tx, psn, NakCode::RemoteOperational, None);
                    return Err(Fatal(WcStatus::LocQpOpErr));
                }
                if (len as u64) > total {
                    tracing::debug!(
                        qpn = self.qpn,
                        len,
                        room = total,
                        "SEND longer than the receive buffers: LOC_LEN_ERR here, the QP goes to ERR"
                    );
                    self.fail_recv(WcStatus::LocLenErr, out);
                    self.scratch = segs;
                    let reason = NakReason::RecvTooShort;
                    self.nak(tx, psn, reason.code(), Some(reason));
                    return Err(Fatal(WcStatus::LocLenErr));
                }
                if let Some(rkey) = inv {
                    if let Err(fatal) = self.check_invalidate(rkey, mrs, out) {
                        self.scratch = segs;
                        return Err(fatal);
                    }
                }
                trim(&mut segs, len as usize);
                self.taken = Some(Taken::Filling {
                    opcode: WcOpcode::Recv,
                    byte_len: len,
                    imm,
                    inv,
                    solicited,
                });
                self.payload_psn = Some(psn);
                self.payload_ack_req = frame.ack_req();
                self.epsn = psn::add(psn, self.packets(len));
                Ok(Incoming::Sink(segs))
            }
            Frame::Write {
                len,
                addr,
                rkey,
                imm,
                solicited,
                ..
            } => {
                // Resources (a receive for the immediate) are checked before the rkey, as
                // the responder state machines of rxe and the IBA do. The receive is taken
                // now (an SRQ's last one could go to another QP between a look and a
                // take); if the rkey check fails it completes in error
                // (`Switches::write_imm_bad_rkey`).
                if imm.is_some() && *force_rnr > 0 {
                    *force_rnr -= 1;
                    tx.mark_next(FORCED_RNR);
                    return self.rnr(psn, tx);
                }
                if imm.is_some() && !self.take_recv() {
                    return self.rnr(psn, tx);
                }
                let seg = match mrs.resolve_remote(
                    &self.target(),
                    rkey,
                    addr,
                    len as u64,
                    AccessFlags::REMOTE_WRITE,
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
                if imm.is_some() {
                    self.taken = Some(Taken::Filling {
                        opcode: WcOpcode::RecvRdmaWithImm,
                        byte_len: len,
                        imm,
                        inv: None,
                        solicited,
                    });
                }
                self.payload_psn = Some(psn);
                self.payload_ack_req = frame.ack_req();
                self.epsn = psn::add(psn, self.packets(len));
                let mut segs = std::mem::take(&mut self.scratch);
                segs.clear();
                segs.extend(seg);
                Ok(Incoming::Sink(segs))
            }
            Frame::Read {
                len,
                addr,
                rkey,
                inflight,
                ..
            } => {
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
                    AccessFlags::REMOTE_READ,
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
            Frame::CmpSwap {
                addr, rkey, inflight, ..
            }
            | Frame::FetchAdd {
                addr, rkey, inflight, ..
            } => {
                let op = match frame {
                    Frame::CmpSwap { .. } => "CMP_AND_SWP",
                    _ => "FETCH_AND_ADD",
                };
                if let Some(reason) = self.rd_atomic_resources(inflight) {
                    return self.refuse(psn, op, reason, rkey, addr, 8, tx);
                }
                let seg = match mrs.resolve_remote(&self.target(), rkey, addr, 8, AccessFlags::REMOTE_ATOMIC)
                {
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
            _ => Ok(Incoming::Discard),
        }
    }

    fn rnr(&mut self, psn: u32, tx: &mut TxQueue) -> Result<Incoming, Fatal> {
        self.nak_psn = Some(psn);
        let timer = self.min_rnr_timer;
        tracing::debug!(
            qpn = self.qpn,
            psn,
            timer,
            available = self.available(),
            "RNR NAK sent: no receive posted (or one forced by fault injection)"
        );
        self.nak(tx, psn, NakCode::Rnr { timer }, None);
        Ok(Incoming::Discard)
    }

    /// Refuses request `psn` (`op` of `len` bytes at `addr` with `rkey`) for `reason`:
    /// a NAK of the reason's kind (remote access error: `IBV_WC_REM_ACCESS_ERR` at the
    /// requester; invalid request: `IBV_WC_REM_INV_REQ_ERR`) that carries the reason, and
    /// the QP goes to ERR.
    #[allow(clippy::too_many_arguments)]
    fn refuse(
        &mut self,
        psn: u32,
        op: &'static str,
        reason: NakReason,
        rkey: u32,
        addr: u64,
        len: u64,
        tx: &mut TxQueue,
    ) -> Result<Incoming, Fatal> {
        // A warning, not a debug event: this side's QP goes to ERR for it, and its
        // application learns nothing else about why (the error completion is the peer's).
        // It comes at most once per QP life (in ERR, requests are dropped), so a peer
        // cannot flood the log with it.
        tracing::warn!(
            qpn = self.qpn,
            op,
            rkey = %format_args!("{rkey:#x}"),
            addr = %format_args!("{addr:#x}"),
            len,
            reason = ?reason,
            "remote {op} refused: {reason}; the QP goes to ERR"
        );
        let code = self.code_of(reason);
        self.nak(tx, psn, code, Some(reason));
        Err(Fatal(self.affiliated_error(code)))
    }

    /// Why a new READ or atomic, sent while its requester had `inflight` of them
    /// outstanding (itself included), finds no responder resources: none at all
    /// (`max_dest_rd_atomic` 0, refused under every profile, as rxe refuses it), or fewer
    /// than asked for (refused unless `Switches::rd_atomic_over_limit_served`, rxe's
    /// choice).
    fn rd_atomic_resources(&self, inflight: u16) -> Option<NakReason> {
        if self.max_dest_rd_atomic == 0 {
            Some(NakReason::NoRdAtomicResources)
        } else if inflight > u16::from(self.max_dest_rd_atomic) && !self.sw.rd_atomic_over_limit_served {
            Some(NakReason::RdAtomicOverLimit)
        } else {
            None
        }
    }

    /// The affiliated asynchronous error of a request refused with `code` (IBA
    /// 11.6.3.1; rxe raises neither: `Switches::responder_error_events`): the responder's QP goes to ERR with no completion
    /// of its own that says why, so its application hears of it as
    /// `IBV_EVENT_QP_ACCESS_ERR` (a remote access error) or `IBV_EVENT_QP_REQ_ERR` (an
    /// invalid request). Returns the status the requester's WQE gets.
    fn affiliated_error(&mut self, code: NakCode) -> WcStatus {
        let qp = AsyncElement::Qp(self.qpn);
        let (event, status) = match code {
            NakCode::InvalidRequest => (AsyncEventType::QpReqErr, WcStatus::RemInvReqErr),
            _ => (AsyncEventType::QpAccessErr, WcStatus::RemAccessErr),
        };
        if self.sw.responder_error_events {
            self.event(event, qp);
        }
        status
    }

    /// Whether a planted bug ([`crate::plant`]) has this duplicate executed as new.
    #[inline(always)]
    fn planted_reexecution(&self, frame: &Frame) -> bool {
        use crate::plant::{active, Plant};
        active(Plant::NoDuplicateCheck)
            || (active(Plant::NoAtomicReplay)
                && matches!(frame, Frame::CmpSwap { .. } | Frame::FetchAdd { .. }))
    }

    fn duplicate(&mut self, frame: &Frame, mrs: &MrTable, tx: &mut TxQueue) -> Incoming {
        match *frame {
            Frame::Send { .. } | Frame::Write { .. } => {
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
                match mrs.resolve_remote(&self.target(), rkey, addr, len as u64, AccessFlags::REMOTE_READ) {
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

    /// The payload of the current request has been written (or was empty): invalidate
    /// the window a SEND_WITH_INV names, complete the receive it consumed, if any, and
    /// owe an ACK.
    pub fn payload_done(&mut self, sink: Vec<Seg>, mrs: &MrTable, out: &mut Vec<(WorkCompletion, bool)>) {
        let mut sink = sink;
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

    /// A new request message completed here: the MSN counts it (IBA 9.7.5.1.1; for a
    /// READ or atomic when it executes, so that its response carries the count, as rxe
    /// counts it in `execute()`). A repeated request is not a new message.
    fn message_done(&mut self) {
        self.msn = (self.msn + 1) & verbs_api::PSN_MASK;
    }

    /// The responder's message sequence number (IBA 9.7.5.1.1).
    pub fn msn(&self) -> u32 {
        self.msn
    }

    /// The SEND_WITH_INV whose payload is now in invalidates its window (checked when
    /// its header arrived; one invalidated meanwhile, by another QP, stays so).
    fn invalidate_filled(&mut self, mrs: &MrTable) {
        if let Some(Taken::Filling { inv: Some(rkey), .. }) = self.taken {
            let who = Invalidator::Remote(OnQp {
                pd: self.pd,
                qpn: self.qpn,
            });
            if let Err(e) = mrs.invalidate(rkey, who, self.sw.mw_owner_checks, true) {
                tracing::debug!(
                    qpn = self.qpn,
                    rkey = %format_args!("{rkey:#x}"),
                    "SEND_WITH_INV: the window changed while the message arrived: {e}"
                );
            }
        }
    }

    /// Completes the receive a request whose payload is now in consumed, if any.
    fn complete_filled(&mut self, out: &mut Vec<(WorkCompletion, bool)>) {
        if let Some(Taken::Filling {
            opcode,
            byte_len,
            imm,
            inv,
            solicited,
        }) = self.taken
        {
            self.taken = None;
            let mut wc = self.recv_completion(self.wqe.wr_id, WcStatus::Success);
            wc.opcode = opcode;
            wc.byte_len = byte_len;
            if let Some(imm) = imm {
                wc.imm_data = imm;
                wc.wc_flags |= WcFlags::WITH_IMM;
            }
            if let Some(rkey) = inv {
                wc.imm_data = rkey;
                wc.wc_flags |= match self.sw.inv_flag_kernel_bit {
                    true => WcFlags::IP_CSUM_OK,
                    false => WcFlags::WITH_INV,
                };
            }
            out.push((wc, solicited));
        }
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
            if self.taken.is_some() {
                self.taken = Some(Taken::Held);
            }
        }
        self.nak_psn = None;
        self.forget_ack();
    }

    /// QP to ERR: the receive taken (held, or consumed by a request still arriving) and,
    /// without an SRQ, every posted receive complete with `IBV_WC_WR_FLUSH_ERR`, in order.
    /// An SRQ keeps its receives for its other QPs; the QP raises
    /// `IBV_EVENT_QP_LAST_WQE_REACHED` (once until the next reset).
    pub fn flush(&mut self, out: &mut Vec<(WorkCompletion, bool)>) {
        self.payload_psn = None;
        if self.taken.is_some() {
            self.fail_recv(WcStatus::WrFlushErr, out);
        }
        match &mut self.source {
            RecvSource::Own(q) => {
                let qpn = self.qpn;
                q.drain(|wr_id| out.push((flushed(qpn, wr_id), false)));
            }
            RecvSource::Shared(_) => {
                if self.sw.last_wqe_reached && !self.last_wqe_raised {
                    self.last_wqe_raised = true;
                    let qpn = self.qpn;
                    self.event(AsyncEventType::QpLastWqeReached, AsyncElement::Qp(qpn));
                }
            }
        }
        if !self.uc {
            // (A UC QP still owes the receipt of what it took in: see `uc`.)
            self.forget_ack();
        }
    }

    /// QP to RESET (or destroyed): its own receives are discarded without completions; a
    /// receive held from an SRQ goes back to the SRQ's head, for its other QPs.
    pub fn reset(&mut self) {
        if self.taken.take().is_some() {
            if let RecvSource::Shared(s) = &self.source {
                s.put_back(&mut self.wqe);
            }
        }
        self.payload_psn = None;
        if let RecvSource::Own(q) = &mut self.source {
            q.drain(|_| {});
        }
        self.forget_ack();
        self.nak_psn = None;
        self.last_wqe_raised = false;
        self.msn = 0;
    }
}

/// A receive flushed on QP `qpn`.
fn flushed(qpn: u32, wr_id: u64) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: WcStatus::WrFlushErr,
        opcode: WcOpcode::Recv,
        qp_num: qpn,
        ..Default::default()
    }
}

/// The reason a refused remote access gives the requester.
pub(crate) fn reason_of(e: RemoteAccessError) -> NakReason {
    match e {
        RemoteAccessError::BadKey => NakReason::UnknownRkey,
        RemoteAccessError::Deregistered => NakReason::DeregisteredRkey,
        RemoteAccessError::WrongPd => NakReason::WrongPd,
        RemoteAccessError::QpAccess => NakReason::QpAccess,
        RemoteAccessError::MrAccess => NakReason::MrAccess,
        RemoteAccessError::OutOfBounds => NakReason::OutOfBounds,
        RemoteAccessError::Misaligned => NakReason::MisalignedAtomic,
        RemoteAccessError::UnboundWindow => NakReason::UnboundWindow,
        RemoteAccessError::StaleWindowKey => NakReason::StaleWindowKey,
        RemoteAccessError::WindowOfOtherQp => NakReason::WindowOfOtherQp,
        RemoteAccessError::WindowAccess => NakReason::WindowAccess,
        RemoteAccessError::OutsideWindow => NakReason::OutsideWindow,
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

    fn frames(tx: &mut TxQueue) -> Vec<Frame> {
        let mut b = Vec::new();
        tx.drain_into(&mut b);
        crate::wire::tests::decode_all(&b)
    }

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
}
