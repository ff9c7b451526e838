//! The queue pair's state machine (IBA 10.3 "QP state transitions", 11.2.5 "Modify
//! Queue Pair"; `man ibv_modify_qp`): its state and attributes, which modify calls are
//! legal ([`Qp::handle_modify`]), what each transition sets in motion in
//! the [`Requester`] and [`Responder`], and what an error does (IBA 10.3.1: ERR flushes
//! both queues with `IBV_WC_WR_FLUSH_ERR`, a send error moves an unreliable QP to SQE
//! and flushes its send queue only; [`Qp::enter_error`], [`Qp::enter_sqe`]). It does
//! no I/O: what a transition asks of the driver (a connection to set up, connections to
//! close, a send queue to start) comes back as an [`Effect`].

mod modify;
#[cfg(test)]
mod tests;

use verbs_api::{QpAttr, QpCap, QpState, QpType, WorkCompletion};

use crate::requester::Requester;
use crate::responder::Responder;
use crate::switches::Switches;

pub use modify::{AvCheck, Effect, QpLimits, Transition};

/// Whether a QP in `state` takes what arrives for it: its receive queue works in RTR,
/// RTS, SQD and SQE (IBA 10.3.1: SQD and SQE stop the send queue only).
pub fn receives_in(state: QpState) -> bool {
    matches!(state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe)
}

/// The two halves of a QP of `qp_type`, made from those of an RC QP: UC's requester
/// and responder do without retries, UD's deal in datagrams.
pub fn halves_for(qp_type: QpType, req: Requester, resp: Responder) -> (Requester, Responder) {
    match qp_type {
        QpType::Rc => (req, resp),
        QpType::Uc => (req.unreliable(), resp.unreliable()),
        QpType::Ud => (req.datagram(), resp.datagram()),
    }
}

/// A QP's state and attributes (the two halves, [`Requester`] and [`Responder`], are
/// handed to the methods that change them).
#[derive(Debug, Clone)]
pub struct Qp {
    qp_type: QpType,
    cap: QpCap,
    state: QpState,
    attr: QpAttr,
    /// Moved to SQD asking for `IBV_EVENT_SQ_DRAINED`, and it is not raised yet.
    sqd_event_due: bool,
    sw: Switches,
}

impl Qp {
    /// A QP of `qp_type` in RESET with the granted capacities `cap`, on a device whose
    /// behaviour is `sw`.
    pub fn new(qp_type: QpType, cap: QpCap, sw: Switches) -> Self {
        Qp {
            qp_type,
            cap,
            state: QpState::Reset,
            attr: QpAttr {
                cap,
                ..Default::default()
            },
            sqd_event_due: false,
            sw,
        }
    }

    /// The current state.
    #[inline]
    pub fn state(&self) -> QpState {
        self.state
    }

    /// The attributes as last set (`qp_state` is not kept here: see [`Qp::state`]).
    #[inline]
    pub fn attr(&self) -> &QpAttr {
        &self.attr
    }

    /// Its transport.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// Whether `IBV_EVENT_SQ_DRAINED` is still to be raised for the current stay in SQD.
    pub fn sqd_event_due(&self) -> bool {
        self.sqd_event_due
    }

    /// Whether the QP is to raise `IBV_EVENT_SQ_DRAINED` now: it is in SQD, asked for
    /// the event, and no WQE it started is outstanding any more. Answers `true` once per
    /// move to SQD.
    pub fn take_drained_event(&mut self, req: &Requester) -> bool {
        if self.sqd_event_due && self.state == QpState::Sqd && req.drained() {
            self.sqd_event_due = false;
            return true;
        }
        false
    }

    /// Moves the QP to ERR (any path to it: a modify, a fatal completion, a CQ overflow,
    /// a connection that cannot be had): every WQE of both queues not yet finished
    /// completes with `IBV_WC_WR_FLUSH_ERR` into `send_wc` and `recv_wc`, in order.
    /// Returns the state it left, or `None` if it was in ERR already.
    pub fn enter_error(
        &mut self,
        req: &mut Requester,
        resp: &mut Responder,
        send_wc: &mut Vec<WorkCompletion>,
        recv_wc: &mut Vec<(WorkCompletion, bool)>,
    ) -> Option<QpState> {
        let from = self.state;
        if from == QpState::Err {
            return None;
        }
        self.state = QpState::Err;
        self.sqd_event_due = false;
        req.flush(send_wc);
        resp.flush(recv_wc);
        Some(from)
    }

    /// A send WR completed in error. A UC or UD QP in RTS or SQD moves to SQE where the
    /// device does so (`Switches::send_error_sqe`, IBA 10.3.1): its send queue is flushed
    /// into `send_wc` and its receive queue works on until the application moves it back
    /// to RTS; returns the state it left. `None`: the QP must go to ERR instead
    /// ([`Qp::enter_error`]).
    pub fn enter_sqe(&mut self, req: &mut Requester, send_wc: &mut Vec<WorkCompletion>) -> Option<QpState> {
        let sqe = self.qp_type != QpType::Rc
            && self.sw.send_error_sqe
            && matches!(self.state, QpState::Rts | QpState::Sqd);
        if !sqe {
            return None;
        }
        let from = self.state;
        self.state = QpState::Sqe;
        self.sqd_event_due = false;
        req.flush(send_wc);
        Some(from)
    }

    /// Send WRs were just posted: in ERR, and in SQE (IBA 10.3.1), they complete at once
    /// with `IBV_WC_WR_FLUSH_ERR` into `send_wc`. Whether they did.
    #[inline]
    pub fn flush_posted_sends(&self, req: &mut Requester, send_wc: &mut Vec<WorkCompletion>) -> bool {
        if !matches!(self.state, QpState::Err | QpState::Sqe) {
            return false;
        }
        req.flush(send_wc);
        true
    }

    /// Receive WRs were just posted: in ERR they complete at once with
    /// `IBV_WC_WR_FLUSH_ERR` into `recv_wc` where the device does so
    /// (`Switches::recv_in_err_flushed`; off, as on rxe, they stay queued). Whether they
    /// did.
    #[inline]
    pub fn flush_posted_recvs(
        &self,
        resp: &mut Responder,
        recv_wc: &mut Vec<(WorkCompletion, bool)>,
    ) -> bool {
        if self.state != QpState::Err || !self.sw.recv_in_err_flushed {
            return false;
        }
        resp.flush(recv_wc);
        true
    }

    /// The QP's connection to its peer is up (set up, or accepted): a transport error
    /// from now on means the peer stopped answering (`vendor_err` 0, see
    /// `Requester::link_error`).
    pub fn handle_connection_up(&self, req: &mut Requester) {
        req.link_error = 0;
    }

    /// The QP's connection is gone (broken, or replaced by a newer one): what was in
    /// flight on it is resent (RC) or lost (UC, whose WRs then complete into `send_wc`),
    /// a request half received is forgotten, and until a connection is up again a
    /// transport error means the peer could not be reached (`vendor_err` ENOTCONN).
    pub fn handle_connection_lost(
        &self,
        req: &mut Requester,
        resp: &mut Responder,
        send_wc: &mut Vec<WorkCompletion>,
    ) {
        req.link_error = libc::ENOTCONN as u32;
        resp.connection_lost();
        req.on_connection_lost();
        req.take_done(send_wc);
    }

    /// An attempt to set up the QP's connection failed with `errno` at `now`: like a lost
    /// packet, the ACK timer runs (if there is work) and counts against `retry_cnt`, a
    /// transport error then carries `errno` in `vendor_err`, and UC's WRs wait for a
    /// link no longer than `requester::LINK_WAIT`.
    pub fn handle_connection_failed(&self, req: &mut Requester, errno: u32, now: std::time::Instant) {
        req.link_error = errno;
        req.arm_timer(now);
        req.wait_for_link(now);
    }

    /// What `ibv_query_qp` reports: the attributes with the state, the capacities, the
    /// PSNs as they stand (as rxe's `rxe_qp_to_attr` and mlx5's next_send_psn /
    /// next_rcv_psn report them, once the QP has them) and whether the send queue is
    /// draining (in SQD with WQEs sent and not yet complete; those posted in SQD wait
    /// to be started and are no part of it).
    pub fn query(&self, req: &Requester, resp: &Responder) -> QpAttr {
        let mut a = self.attr;
        a.qp_state = self.state;
        a.cur_qp_state = self.state;
        a.cap = self.cap;
        if !matches!(self.state, QpState::Reset | QpState::Init) {
            if self.qp_type != QpType::Ud {
                a.rq_psn = resp.expected_psn();
            }
            if self.state != QpState::Rtr {
                a.sq_psn = req.next_psn();
            }
        }
        a.sq_draining = req.draining && !req.drained();
        a
    }
}
