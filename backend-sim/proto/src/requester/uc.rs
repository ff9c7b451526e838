//! The requester of a UC QP (IBA 9.8.3 "Unreliable connected service"; `man
//! ibv_post_send`'s opcode table): SEND, SEND_WITH_IMM, RDMA_WRITE and
//! RDMA_WRITE_WITH_IMM only; no retries, no timers, no errors from the peer.
//!
//! - A READ or an atomic is refused at post time with EINVAL, as IBA has no UC opcode
//!   for them. (rxe accepts the post and completes the WR with `IBV_WC_LOC_QP_OP_ERR`,
//!   moving the QP to ERR: librxe's `validate_send_wr()` does not check the opcode against
//!   the QP type, and the kernel's `next_opcode()` finds none.)
//! - Every WR completes successfully (with a completion if signaled) once its message
//!   has reached the peer's device, whatever the peer did with it: the UC responder
//!   acknowledges every message it took in, executed or dropped, and never NAKs. These
//!   ACKs are the sim's delivery receipts, not IBA's acknowledgements (nothing is resent
//!   for want of one). An HCA completes a UC send once its last packet has left; the sim
//!   cannot tell "left" from "still queued in its socket", and completing at hand-off
//!   would let the application change a buffer not yet gathered, or read the target of a
//!   WRITE before it landed (on rxe with both ends on one host the data is in place by
//!   the time the send completes, and programs come to rely on it).
//! - A message that never reaches the peer is still a success: frames lost with a broken
//!   connection complete when it breaks, and while the QP has no connection its WRs wait
//!   up to [`LINK_WAIT`] for one (the first is still being set up, or the peer is
//!   reconnecting), then complete as sent into a dead link.

use std::time::{Duration, Instant};

use verbs_api::{WcStatus, WorkCompletion};

use super::Requester;

/// How long a UC QP's WRs wait for a connection before they count as sent into a dead
/// link. The sim's connections take a hello and its check to set up, which an HCA's link
/// does not: WRs posted meanwhile must still reach a peer that is there.
pub const LINK_WAIT: Duration = Duration::from_secs(2);

impl Requester {
    /// The same as the requester of a UC QP.
    pub fn unreliable(mut self) -> Self {
        self.uc = true;
        self
    }

    /// Whether this is a UC QP's requester.
    pub fn is_unreliable(&self) -> bool {
        self.uc
    }

    /// The QP has no connection at `now`: its WRs wait for one until `now + LINK_WAIT`
    /// (a wait already running is not extended).
    pub fn wait_for_link(&mut self, now: Instant) {
        if self.uc && self.has_unsent() && self.link_wait.is_none() {
            self.link_wait = Some(now + LINK_WAIT);
        }
    }

    /// [`LINK_WAIT`] is over at `now` and there is still no connection: every WR waiting
    /// completes successfully, its message lost.
    pub(super) fn link_wait_over(&mut self, now: Instant, out: &mut Vec<WorkCompletion>) {
        if self.link_wait.is_none_or(|t| now < t) {
            return;
        }
        self.link_wait = None;
        if self.link_error == 0 || !self.has_unsent() {
            return;
        }
        tracing::debug!(
            qpn = self.qpn,
            dest_qpn = self.dest_qpn,
            lost = self.sq.len() - self.next,
            errno = self.link_error,
            "UC: no connection to the peer within {LINK_WAIT:?}: WRs complete, their messages lost"
        );
        for w in self.sq.iter_mut() {
            w.status.get_or_insert(WcStatus::Success);
        }
        self.next = self.sq.len();
        self.retire(out);
    }

    /// The connection broke: messages sent on it and not acknowledged may or may not have
    /// arrived; their WRs complete successfully (UC resends nothing).
    pub(super) fn uc_connection_lost(&mut self) {
        for w in self.sq.iter_mut().take(self.next) {
            w.status.get_or_insert(WcStatus::Success);
        }
    }

    /// Completions of WRs finished by something that had no completion list at hand (a
    /// lost connection), in order.
    pub fn take_done(&mut self, out: &mut Vec<WorkCompletion>) {
        self.retire(out);
    }
}
