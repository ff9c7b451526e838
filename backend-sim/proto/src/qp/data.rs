//! The QP's data path (`man ibv_post_send`, `man ibv_post_recv`; IBA 9.7 for RC, 9.8.3
//! for UC, 9.8.4 for UD): posts, a connection's frames handed to both halves and those
//! they answer, the requester's timers, and a UD QP's datagrams. The driver calls these
//! with the QP's lock held and moves the bytes; the completions they produce wait in
//! the QP until [`Qp::poll_completions`].

use std::time::Instant;

use verbs_api::{RecvWr, SendWr, WcStatus};

use super::{receives_in, Qp};
use crate::connection::{AckPolicy, Connection};
use crate::engine::{Sides, Stop};
use crate::faults::ForcedRnr;
use crate::memory::MrTable;
use crate::recv_queue::PostRecvError;
use crate::requester::ud::Emitted;
use crate::requester::{Fatal, PostCheck, UdRoute};
use crate::responder::{DatagramSource, UdOutcome};
use crate::tx::TxQueue;
use crate::window::BindReq;
use crate::wire::Frame;

impl Qp {
    /// Queues send WR `wr` of a connected QP (RC, UC), its inline data from `pieces`
    /// when the caller read them itself (`None`: from its SGEs in `mrs`).
    #[inline]
    pub fn handle_post_send(
        &mut self,
        wr: &SendWr<'_>,
        mrs: &MrTable,
        pieces: Option<&[&[u8]]>,
    ) -> Result<(), PostCheck> {
        self.req.post_with(wr, mrs, pieces)
    }

    /// Queues send WR `wr` of a UD QP to the destination `route`.
    pub fn handle_post_datagram(
        &mut self,
        wr: &SendWr<'_>,
        route: UdRoute,
        mrs: &MrTable,
        pieces: Option<&[&[u8]]>,
    ) -> Result<(), PostCheck> {
        self.req.post_ud_with(wr, route, mrs, pieces)
    }

    /// Queues the BIND_MW WR `wr`, whose window and binding the driver resolved (`bind`).
    pub fn handle_post_bind(&mut self, wr: &SendWr<'_>, bind: BindReq) -> Result<(), PostCheck> {
        self.req.post_bind(wr, bind)
    }

    /// Queues receive WR `wr` (`ibv_post_recv`).
    #[inline]
    pub fn handle_post_recv(&mut self, wr: &RecvWr<'_>) -> Result<(), PostRecvError> {
        self.resp.post(wr)
    }

    /// Send WRs were just posted: in ERR, and in SQE (IBA 10.3.1), they complete at once
    /// with `IBV_WC_WR_FLUSH_ERR`. Whether they did.
    #[inline]
    pub fn flush_posted_sends(&mut self) -> bool {
        if !matches!(self.state, verbs_api::QpState::Err | verbs_api::QpState::Sqe) {
            return false;
        }
        self.req.flush(&mut self.send_wc);
        true
    }

    /// Receive WRs were just posted: in ERR they complete at once with
    /// `IBV_WC_WR_FLUSH_ERR` where the device does so (`Switches::recv_in_err_flushed`;
    /// off, as on rxe, they stay queued). Whether they did.
    #[inline]
    pub fn flush_posted_recvs(&mut self) -> bool {
        if self.state != verbs_api::QpState::Err || !self.sw.recv_in_err_flushed {
            return false;
        }
        self.resp.flush(&mut self.recv_wc);
        true
    }

    /// The frames buffered in `conn` at `now`: requests to the responder (dropped
    /// silently in a state that does not receive), responses to the requester; their
    /// answers are queued in `conn`, ACKs as `policy` says. `forced_rnr`: fault
    /// injection's RNR for requests that consume a receive. A [`Stop::Fatal`]
    /// means the QP goes to ERR: call again afterwards to keep the stream in sync.
    #[inline]
    pub fn handle_frames(
        &mut self,
        conn: &mut Connection,
        mrs: &MrTable,
        now: Instant,
        policy: AckPolicy,
        forced_rnr: &mut ForcedRnr,
    ) -> Result<(), Stop> {
        conn.receive(&mut self.sides(forced_rnr), mrs, now, policy)
    }

    /// Turns the send queue's WQEs into frames queued in `conn` (as many as
    /// [`Connection::transmit`] lets one pass build), after the ACK still owed. Call in
    /// RTS or SQD (which resends what it started). A [`Fatal`] moves the QP to ERR (a UC
    /// QP to SQE where the profile says so: [`Qp::enter_sqe`]).
    #[inline]
    pub fn poll_transmit(&mut self, conn: &mut Connection, mrs: &MrTable, now: Instant) -> Result<(), Fatal> {
        conn.transmit(&mut self.req, &mut self.resp, mrs, now, &mut self.send_wc)
    }

    /// The two halves as one connection's frames drive them (`engine::drive`), for a
    /// harness that feeds the engine itself.
    pub(crate) fn sides<'a>(&'a mut self, forced_rnr: &'a mut ForcedRnr) -> Sides<'a> {
        Sides {
            accepting: receives_in(self.state),
            req: Some(&mut self.req),
            resp: Some(&mut self.resp),
            send_wc: &mut self.send_wc,
            recv_wc: &mut self.recv_wc,
            forced_rnr,
        }
    }

    /// Builds request frames for at most `budget` WQEs into `tx` (a harness's own queue).
    pub(crate) fn transmit_into(
        &mut self,
        mrs: &MrTable,
        now: Instant,
        tx: &mut TxQueue,
        budget: usize,
    ) -> Result<usize, Fatal> {
        self.req.poll_transmit(mrs, now, tx, budget, &mut self.send_wc)
    }

    /// An RC send queue without a connection starts its WQEs not yet started anyway, as
    /// an HCA processes them whether anything answers or not: the frames are built (the
    /// local checks run) and lost on the way, and the ACK timer runs. A [`Fatal`] moves
    /// the QP to ERR.
    pub fn transmit_unconnected(&mut self, mrs: &MrTable, now: Instant) -> Result<(), Fatal> {
        self.req.builds_are_lost(true);
        let built = self.transmit_into(mrs, now, &mut TxQueue::new(), usize::MAX);
        self.req.builds_are_lost(false);
        built?;
        self.req.arm_timer(now);
        Ok(())
    }

    /// The end of a round over `conn`: a thread that just posted ([`AckPolicy::Post`])
    /// takes the ACK owed along with its frames.
    #[inline]
    pub fn end_round(&mut self, conn: &mut Connection, policy: AckPolicy) {
        conn.end_round(&mut self.resp, policy);
    }

    /// Queues the ACK the responder owes (if any) in `tx`.
    #[inline]
    pub fn flush_ack(&mut self, tx: &mut TxQueue) {
        self.resp.flush_ack(tx);
    }

    /// Whether the responder owes the peer an ACK (for requests it executed).
    #[inline]
    pub fn owes_ack(&self) -> bool {
        self.resp.owes_ack()
    }

    /// Whether WQEs wait to be turned into frames.
    #[inline]
    pub fn has_unsent(&self) -> bool {
        self.req.has_unsent()
    }

    /// Whether the requester has nothing in flight (no frame sent and unanswered).
    #[inline]
    pub fn nothing_in_flight(&self) -> bool {
        self.req.nothing_in_flight()
    }

    /// The send queue's WQEs that completed and wait for the application's poll
    /// (`PostCheck::FullUnpolled`'s advice).
    pub fn held_unpolled(&self) -> u64 {
        self.req.held_unpolled()
    }

    /// When the requester's next timer is due (ACK timeout, end of an RNR wait, a UC
    /// send queue's wait for a link), if one runs.
    #[inline]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.req.next_deadline()
    }

    /// Whether the ACK timer's deadline has passed at `now`.
    #[inline]
    pub fn ack_deadline_passed(&self, now: Instant) -> bool {
        self.req.ack_deadline_passed(now)
    }

    /// The requester's timers at `now`, the connection's last write and read being
    /// `last_tx` and `last_rx`: whether one fired (a resend, the end of an RNR wait).
    /// A [`Fatal`] (retries exhausted) moves the QP to ERR.
    pub fn handle_timeout(
        &mut self,
        now: Instant,
        last_tx: Option<Instant>,
        last_rx: Option<Instant>,
    ) -> Result<bool, Fatal> {
        self.req.on_timer(now, last_tx, last_rx, &mut self.send_wc)
    }

    /// The local ACK timeouts counted since the last call (the device's counter).
    pub fn take_ack_timeouts(&mut self) -> u64 {
        self.req.take_ack_timeouts()
    }

    /// The oldest WQE not yet finished completes with `status` (a send through a port
    /// that is down, where that fails). Whether there was one.
    pub fn fail_oldest(&mut self, status: WcStatus) -> bool {
        self.req.fail_oldest(status, &mut self.send_wc).is_some()
    }

    /// A UD QP: the first WQE at index `from` or later whose datagram may go now, with
    /// its route.
    #[inline]
    pub fn poll_datagram(&self, from: usize) -> Option<(usize, UdRoute)> {
        self.req.ud_next(from)
    }

    /// Hands WQE `idx`'s datagram on: its header and payload appended to `out`, and the
    /// WR done. A bad gather list completes the WR with its error ([`Fatal`]).
    #[inline]
    pub fn emit_datagram(&mut self, idx: usize, mrs: &MrTable, out: &mut Vec<u8>) -> Result<Emitted, Fatal> {
        self.req.ud_emit(idx, mrs, out)
    }

    /// WQE `idx`'s datagram waits for the link to its destination device.
    pub fn datagram_waits(&mut self, idx: usize) {
        self.req.ud_wait(idx);
    }

    /// WQE `idx`'s datagram is lost on the way: the WR completes successfully, as UD's do.
    pub fn datagram_lost(&mut self, idx: usize) {
        self.req.ud_lost(idx);
    }

    /// The header WQE `idx`'s datagram would carry (for a capture).
    pub fn datagram_frame(&self, idx: usize) -> Option<Frame> {
        self.req.ud_frame(idx)
    }

    /// The WRs whose datagrams were handed on (or lost) complete, in posting order.
    pub fn take_done(&mut self) {
        self.req.take_done(&mut self.send_wc);
    }

    /// Datagram `frame` with `payload` arrived from `src` for this UD QP, in a state
    /// that receives: taken into a receive, or dropped (the outcome says why). `Err`:
    /// the QP must go to ERR.
    pub fn handle_datagram(
        &mut self,
        frame: &Frame,
        payload: &[u8],
        src: &DatagramSource,
        mrs: &MrTable,
    ) -> Result<UdOutcome, Fatal> {
        self.resp.on_datagram(frame, payload, src, mrs, &mut self.recv_wc)
    }
}
