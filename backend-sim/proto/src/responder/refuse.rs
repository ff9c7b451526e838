//! Requests a responder refuses (IBA 9.7.5.2): an RNR NAK when no receive is posted, a
//! NAK that carries the [`NakReason`] of a refused access or an invalid request, and the
//! affiliated asynchronous error that tells the responder's own application (IBA
//! 11.6.3.1).

use verbs_api::{AsyncElement, AsyncEventType, WcStatus};

use super::{Incoming, Responder};
use crate::faults::ForcedRnr;
use crate::memory::RemoteAccessError;
use crate::requester::Fatal;
use crate::tx::TxQueue;
use crate::wire::{NakCode, NakReason};

/// What a capture says of an RNR NAK that fault injection forced.
const FORCED_RNR: &str = "RNR NAK forced (fault injection)";

impl Responder {
    /// The NAK syndrome of a refusal for `reason` on this device: the reason's own, but
    /// an invalid request for a `qp_access_flags` refusal where the profile says so
    /// ([`Switches::qp_access_invalid_request`](crate::switches::Switches::qp_access_invalid_request)).
    pub(super) fn code_of(&self, reason: NakReason) -> NakCode {
        if reason == NakReason::QpAccess && self.sw.qp_access_invalid_request {
            NakCode::InvalidRequest
        } else {
            reason.code()
        }
    }

    /// Takes the receive a SEND or WRITE_WITH_IMM `psn` consumes; `false`: there was none
    /// (or fault injection's [`ForcedRnr`] refuses it),
    /// and the request is answered with an RNR NAK of this QP's timer: requests are
    /// dropped until it is resent.
    pub(super) fn take_recv_or_rnr(
        &mut self,
        psn: u32,
        tx: &mut TxQueue,
        forced_rnr: &mut ForcedRnr,
    ) -> bool {
        if forced_rnr.fire() {
            tx.mark_next(FORCED_RNR);
        } else if self.take_recv() {
            return true;
        }
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
        false
    }

    /// Refuses request `psn` (`op` of `len` bytes at `addr` with `rkey`) for `reason`:
    /// a NAK of the reason's kind (remote access error: `IBV_WC_REM_ACCESS_ERR` at the
    /// requester; invalid request: `IBV_WC_REM_INV_REQ_ERR`) that carries the reason, and
    /// the QP goes to ERR.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn refuse(
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

    /// The affiliated asynchronous error of a request refused with `code` (IBA
    /// 11.6.3.1; rxe raises neither: `Switches::responder_error_events`): the responder's QP goes to ERR with no completion
    /// of its own that says why, so its application hears of it as
    /// `IBV_EVENT_QP_ACCESS_ERR` (a remote access error) or `IBV_EVENT_QP_REQ_ERR` (an
    /// invalid request). Returns the status the requester's WQE gets.
    pub(super) fn affiliated_error(&mut self, code: NakCode) -> WcStatus {
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
