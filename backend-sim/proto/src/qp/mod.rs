//! The queue pair, whole (in the manner of quinn-proto's `Connection`): its state
//! machine (IBA 10.3 "QP state transitions", 11.2.5 "Modify Queue Pair";
//! `man ibv_modify_qp`), its two halves ([`Requester`] and [`Responder`]), the
//! completions and asynchronous events they owe, and what an error does (IBA 10.3.1:
//! ERR flushes both queues with `IBV_WC_WR_FLUSH_ERR`, a send error moves an unreliable
//! QP to SQE and flushes its send queue only; [`Qp::enter_error`], [`Qp::enter_sqe`]).
//!
//! The driver hands in what happens (`handle_*`: a post, a connection's frames, a timer,
//! a modify, a connection up or down) and takes out what is owed (`poll_*`: frames to
//! send, the next deadline, completions, events). It does no I/O: what a transition asks
//! of the driver (a connection to set up, connections to close, a send queue to start)
//! comes back as an [`Effect`]. The data path is in [`data`](self) (posts, frames,
//! timers, datagrams), the completions and events in `owed`.

mod data;
mod modify;
mod owed;
#[cfg(test)]
mod tests;

use verbs_api::{AsyncEvent, QpAttr, QpCap, QpState, QpType, WorkCompletion};

use crate::requester::Requester;
use crate::responder::Responder;
use crate::switches::Switches;

pub use crate::requester::{DirectAtomic, DirectWrite};
pub use modify::{AvCheck, Effect, QpLimits, Transition};
pub use owed::Completions;

// What the driver names of the two halves: a post's refusal, a UD destination and what
// became of a datagram, a fatal completion, the send queue's slots, the setup grace.
pub use crate::engine::Stop;
pub use crate::requester::ud::Emitted;
pub use crate::requester::{gather_shape, Fatal, PostCheck, SqSlots, UdRoute, LINK_SETUP_GRACE, LINK_WAIT};
pub use crate::responder::{DatagramSource, UdOutcome};

/// Whether a QP in `state` takes what arrives for it: its receive queue works in RTR,
/// RTS, SQD and SQE (IBA 10.3.1: SQD and SQE stop the send queue only).
pub fn receives_in(state: QpState) -> bool {
    matches!(state, QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe)
}

/// The two halves of a QP of `qp_type`, made from those of an RC QP: UC's requester
/// and responder do without retries, UD's deal in datagrams.
fn halves_for(qp_type: QpType, req: Requester, resp: Responder) -> (Requester, Responder) {
    match qp_type {
        QpType::Rc => (req, resp),
        QpType::Uc => (req.unreliable(), resp.unreliable()),
        QpType::Ud => (req.datagram(), resp.datagram()),
    }
}

/// What a QP is made of (`ibv_create_qp`'s attributes and the device's).
#[derive(Clone)]
pub struct QpConfig {
    /// Its number.
    pub qpn: u32,
    /// Its protection domain.
    pub pd: u32,
    /// Its transport.
    pub qp_type: QpType,
    /// The capacities granted.
    pub cap: QpCap,
    /// `sq_sig_all`: every send WR completes signaled.
    pub sq_sig_all: bool,
    /// The shared receive queue it takes its receives from, if any.
    pub srq: Option<std::sync::Arc<crate::recv_queue::SharedRecvQueue>>,
    /// The device's behavioural switches.
    pub sw: Switches,
    /// The device's `max_msg_sz`.
    pub max_msg_sz: u32,
    /// The port's active MTU in bytes (until the QP's path MTU is set).
    pub mtu: u32,
    /// Whether the port's link layer is Ethernet (RoCE: a UD receive's GRH holds an IP
    /// header).
    pub roce: bool,
}

/// A queue pair: its state and attributes, its two halves, and the completions and
/// events they owe the driver.
pub struct Qp {
    qpn: u32,
    qp_type: QpType,
    cap: QpCap,
    state: QpState,
    attr: QpAttr,
    /// Moved to SQD asking for `IBV_EVENT_SQ_DRAINED`, and it is not raised yet.
    sqd_event_due: bool,
    sw: Switches,
    /// The send side.
    req: Requester,
    /// The receive side.
    resp: Responder,
    /// Completions of the send side, not yet taken ([`Qp::poll_completions`]).
    send_wc: Vec<WorkCompletion>,
    /// Completions of the receive side (with the solicited bit), not yet taken.
    recv_wc: Vec<(WorkCompletion, bool)>,
    /// Asynchronous events of the QP's own (not its responder's), not yet taken.
    events: Vec<AsyncEvent>,
}

impl Qp {
    /// A QP in RESET as `cfg` describes it (`ibv_create_qp`).
    pub fn create(cfg: QpConfig) -> Self {
        let mut resp = match cfg.srq {
            Some(srq) => Responder::with_srq(cfg.qpn, cfg.pd, srq),
            None => Responder::new(cfg.qpn, cfg.pd, cfg.cap.max_recv_wr, cfg.cap.max_recv_sge),
        }
        .with_switches(cfg.sw);
        resp.roce = cfg.roce;
        let req = Requester::new(cfg.qpn, cfg.pd, &cfg.cap, cfg.sq_sig_all).with_profile(
            cfg.sw,
            cfg.max_msg_sz,
            cfg.mtu,
        );
        Qp::new(cfg.qp_type, cfg.cap, cfg.sw, req, resp)
    }

    /// A QP of `qp_type` in RESET with the granted capacities `cap`, on a device whose
    /// behaviour is `sw`, with the halves of an RC QP `req` and `resp` (made over into
    /// those of `qp_type`).
    pub(crate) fn new(qp_type: QpType, cap: QpCap, sw: Switches, req: Requester, resp: Responder) -> Self {
        let (req, resp) = halves_for(qp_type, req, resp);
        Qp {
            qpn: req.qpn,
            qp_type,
            cap,
            state: QpState::Reset,
            attr: QpAttr {
                cap,
                ..Default::default()
            },
            sqd_event_due: false,
            sw,
            req,
            resp,
            send_wc: Vec::new(),
            recv_wc: Vec::new(),
            events: Vec::new(),
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
    #[inline]
    pub fn sqd_event_due(&self) -> bool {
        self.sqd_event_due
    }

    /// In SQD with the drained event asked for: once no WQE it started is outstanding,
    /// `IBV_EVENT_SQ_DRAINED` is owed ([`Qp::poll_events`]), once per move to SQD.
    /// Whether it became owed now.
    pub fn check_drained(&mut self) -> bool {
        if self.sqd_event_due && self.state == QpState::Sqd && self.req.drained() {
            self.sqd_event_due = false;
            self.raise(verbs_api::AsyncEventType::SqDrained);
            return true;
        }
        false
    }

    /// The peer broke the protocol on the QP's connection: the QP goes to ERR (through
    /// [`Qp::enter_error`], the driver's to call) and no completion says so, so it owes
    /// the affiliated error IBA 11.6.3.1 defines for that, `IBV_EVENT_QP_FATAL` (unless
    /// it was in ERR already).
    pub fn handle_protocol_error(&mut self) {
        if self.state != QpState::Err {
            self.raise(verbs_api::AsyncEventType::QpFatal);
        }
    }

    /// Owes the affiliated event `t` of this QP.
    fn raise(&mut self, t: verbs_api::AsyncEventType) {
        self.events.push(AsyncEvent {
            event_type: t,
            element: verbs_api::AsyncElement::Qp(self.qpn),
        });
    }

    /// Moves the QP to ERR (any path to it: a modify, a fatal completion, a CQ overflow,
    /// a connection that cannot be had): every WQE of both queues not yet finished
    /// completes with `IBV_WC_WR_FLUSH_ERR`, in order. Returns the state it left, or
    /// `None` if it was in ERR already.
    pub fn enter_error(&mut self) -> Option<QpState> {
        let from = self.state;
        if from == QpState::Err {
            return None;
        }
        self.state = QpState::Err;
        self.sqd_event_due = false;
        self.req.flush(&mut self.send_wc);
        self.resp.flush(&mut self.recv_wc);
        Some(from)
    }

    /// A send WR completed in error. A UC or UD QP in RTS or SQD moves to SQE where the
    /// device does so (`Switches::send_error_sqe`, IBA 10.3.1): its send queue is flushed
    /// and its receive queue works on until the application moves it back to RTS;
    /// returns the state it left. `None`: the QP must go to ERR instead
    /// ([`Qp::enter_error`]).
    pub fn enter_sqe(&mut self) -> Option<QpState> {
        let sqe = self.qp_type != QpType::Rc
            && self.sw.send_error_sqe
            && matches!(self.state, QpState::Rts | QpState::Sqd);
        if !sqe {
            return None;
        }
        let from = self.state;
        self.state = QpState::Sqe;
        self.sqd_event_due = false;
        self.req.flush(&mut self.send_wc);
        Some(from)
    }

    /// Offers (`Some`) or withdraws (`None`) the one-sided fast path of the QP's
    /// connection to its requester ([`crate::requester::DirectWrite`]): the driver offers
    /// it with a same-host connection that has one and withdraws it when the connection
    /// ends.
    pub fn set_direct(&mut self, direct: Option<std::sync::Arc<dyn DirectWrite>>) {
        self.req.set_direct(direct);
    }

    /// The QP's connection to its peer is up (set up, or accepted): a transport error
    /// from now on means the peer stopped answering (`vendor_err` 0, see
    /// `Requester::link_error`).
    pub fn handle_connection_up(&mut self) {
        self.req.link_error = 0;
    }

    /// A connection set up by this side is about to carry the QP's traffic: what an RC
    /// requester started before it existed was lost on the way (see
    /// [`Qp::transmit_unconnected`]) and is resent on it.
    pub fn handle_connection_set_up(&mut self) {
        if !self.req.is_unreliable() {
            self.req.on_connection_lost();
        }
    }

    /// The QP's connection is gone (broken, or replaced by a newer one): what was in
    /// flight on it is resent (RC) or lost (UC, whose WRs then complete), a request half
    /// received is forgotten, and until a connection is up again a transport error means
    /// the peer could not be reached (`vendor_err` ENOTCONN).
    pub fn handle_connection_lost(&mut self) {
        self.req.link_error = libc::ENOTCONN as u32;
        self.resp.connection_lost();
        self.req.on_connection_lost();
        self.req.take_done(&mut self.send_wc);
    }

    /// The accepting end of a QP's connection to itself is gone: a request half received
    /// on it is forgotten (the requester's side is the connecting end's).
    pub fn handle_self_connection_lost(&mut self) {
        self.resp.connection_lost();
    }

    /// A connection is being set up since `since` (`None`: the attempt ended), during
    /// which the requester's timers wait (`requester::LINK_SETUP_GRACE`).
    pub fn handle_connecting(&mut self, since: Option<std::time::Instant>) {
        self.req.connecting(since);
    }

    /// An attempt to set up the QP's connection failed with `errno` at `now`: like a lost
    /// packet, the ACK timer runs (if there is work) and counts against `retry_cnt`, a
    /// transport error then carries `errno` in `vendor_err`, and UC's WRs wait for a
    /// link no longer than [`LINK_WAIT`].
    pub fn handle_connection_failed(&mut self, errno: u32, now: std::time::Instant) {
        self.req.link_error = errno;
        self.req.arm_timer(now);
        self.req.wait_for_link(now);
    }

    /// The QP is without a connection at `now` (none yet, or it was lost): a UC send
    /// queue's WRs wait for one no longer than [`LINK_WAIT`].
    pub fn handle_link_wait(&mut self, now: std::time::Instant) {
        self.req.wait_for_link(now);
    }

    /// The QP is destroyed: both queues are forgotten without completions.
    pub fn handle_destroy(&mut self) {
        self.req.reset();
        self.resp.reset();
    }

    /// What `ibv_query_qp` reports: the attributes with the state, the capacities, the
    /// PSNs as they stand (as rxe's `rxe_qp_to_attr` and mlx5's next_send_psn /
    /// next_rcv_psn report them, once the QP has them) and whether the send queue is
    /// draining (in SQD with WQEs sent and not yet complete; those posted in SQD wait
    /// to be started and are no part of it).
    pub fn query(&self) -> QpAttr {
        let mut a = self.attr;
        a.qp_state = self.state;
        a.cur_qp_state = self.state;
        a.cap = self.cap;
        if !matches!(self.state, QpState::Reset | QpState::Init) {
            if self.qp_type != QpType::Ud {
                a.rq_psn = self.resp.expected_psn();
            }
            if self.state != QpState::Rtr {
                a.sq_psn = self.req.next_psn();
            }
        }
        a.sq_draining = self.req.draining && !self.req.drained();
        a
    }

    /// The next PSN the requester sends (`rdma-sim status`).
    pub fn sq_psn(&self) -> u32 {
        self.req.next_psn()
    }

    /// The PSN the responder expects next (`rdma-sim status`).
    pub fn rq_psn(&self) -> u32 {
        self.resp.expected_psn()
    }

    /// Send WQEs posted and not yet complete.
    #[inline]
    pub fn sq_outstanding(&self) -> usize {
        self.req.outstanding()
    }

    /// Receive WQEs posted to the QP's own receive queue and not yet consumed.
    pub fn rq_posted(&self) -> usize {
        self.resp.posted()
    }

    /// Whether the QP takes its receives from an SRQ.
    pub fn has_srq(&self) -> bool {
        self.resp.srq().is_some()
    }

    /// Whether the QP's transport neither acknowledges nor resends (UC).
    #[inline]
    pub fn is_unreliable(&self) -> bool {
        self.req.is_unreliable()
    }
}
