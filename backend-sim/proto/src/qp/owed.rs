//! What a QP owes its driver: the completions its halves produced (for the CQs, `man
//! ibv_poll_cq`) and the asynchronous events it raised (`man ibv_get_async_event`),
//! taken by the driver after each call that may have produced them.

use std::sync::Arc;

use verbs_api::{AsyncEvent, WorkCompletion};

use super::Qp;
use crate::requester::{Requester, SqSlots};

/// The completions a QP produced and the driver has not taken yet
/// ([`Qp::poll_completions`]): the driver drains both lists into its CQs.
pub struct Completions<'a> {
    /// Of the send queue, oldest first.
    pub send: &'a mut Vec<WorkCompletion>,
    /// Of the receive queue, oldest first, each with its solicited bit.
    pub recv: &'a mut Vec<(WorkCompletion, bool)>,
    req: &'a mut Requester,
}

impl Completions<'_> {
    /// For each send completion, the mark up to which its send queue slots are free once
    /// it is polled (under `SlotRelease::AtPoll`; nothing otherwise), appended to `out`.
    #[inline]
    pub fn take_marks(&mut self, out: &mut Vec<u64>) {
        self.req.take_marks(out);
    }

    /// The send completions with the send queue's slots, which their marks free.
    #[inline]
    pub fn send_with_slots(&mut self) -> (&mut Vec<WorkCompletion>, &Arc<SqSlots>) {
        (self.send, self.req.slots())
    }
}

impl Qp {
    /// Whether completions wait to be taken.
    #[inline]
    pub fn has_completions(&self) -> bool {
        !self.send_wc.is_empty() || !self.recv_wc.is_empty()
    }

    /// Whether receive completions wait to be taken.
    #[inline]
    pub fn has_recv_completions(&self) -> bool {
        !self.recv_wc.is_empty()
    }

    /// The completions not taken yet, for the driver to drain into its CQs.
    #[inline]
    pub fn poll_completions(&mut self) -> Completions<'_> {
        Completions {
            send: &mut self.send_wc,
            recv: &mut self.recv_wc,
            req: &mut self.req,
        }
    }

    /// Whether events wait for [`Qp::poll_events`], or counts for
    /// [`Qp::take_uc_counts`].
    #[inline]
    pub fn has_news(&self) -> bool {
        !self.events.is_empty() || self.resp.has_news()
    }

    /// The asynchronous events raised since the last call, oldest first, for the driver
    /// to queue on the device.
    pub fn poll_events(&mut self) -> impl Iterator<Item = AsyncEvent> + '_ {
        self.resp.take_events().chain(self.events.drain(..))
    }

    /// What a UC responder dropped since the last call: (requests dropped, PSN gaps).
    pub fn take_uc_counts(&mut self) -> (u64, u64) {
        self.resp.take_uc_counts()
    }
}
