//! The kv-rpc server's bookkeeping for one client connection: how many receives are
//! posted (and how long the receive queue was empty, [`DryQueue`]), which receive slots
//! were consumed and wait to be re-posted, which requests wait for a free response slot.

use std::collections::VecDeque;
use std::time::Instant;

use super::report::DryQueue;

/// One connection's receive and response slots.
#[derive(Debug)]
pub struct ConnSlots {
    /// Receives currently posted.
    posted: u32,
    /// Receive slots consumed and processed, waiting to be re-posted.
    consumed: Vec<u32>,
    /// Received requests (slot, length) waiting for a free response slot.
    pending: VecDeque<(u32, u32)>,
    /// Free response slots.
    free_resp: Vec<u32>,
    /// The receive queue's empty spells.
    pub dry: DryQueue,
}

impl ConnSlots {
    /// `depth` receives posted, `resp_slots` response slots free.
    pub fn new(depth: u32, resp_slots: u32) -> ConnSlots {
        ConnSlots {
            posted: depth,
            consumed: Vec::new(),
            pending: VecDeque::new(),
            free_resp: (0..resp_slots).rev().collect(),
            dry: DryQueue::default(),
        }
    }

    /// A receive completed at `now` (successfully or not).
    pub fn receive_completed(&mut self, now: Instant) {
        self.posted -= 1;
        if self.posted == 0 {
            self.dry.ran_dry(now);
        }
    }

    /// Receive slot `slot` holds a request of `len` bytes.
    pub fn request(&mut self, slot: u32, len: u32) {
        self.pending.push_back((slot, len));
    }

    /// The response from slot `slot` was sent.
    pub fn response_sent(&mut self, slot: u32) {
        self.free_resp.push(slot);
    }

    /// The next request to answer and a response slot for it: (receive slot, length,
    /// response slot). The receive slot counts as consumed.
    pub fn next_request(&mut self) -> Option<(u32, u32, u32)> {
        let (&(slot, len), &rslot) = (self.pending.front()?, self.free_resp.last()?);
        self.pending.pop_front();
        self.free_resp.pop();
        self.consumed.push(slot);
        Some((slot, len, rslot))
    }

    /// The consumed receive slots, to re-post (none are left).
    pub fn take_consumed(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.consumed)
    }

    /// `n` receives were posted again at `now`.
    pub fn reposted(&mut self, n: u32, now: Instant) {
        self.posted += n;
        self.dry.refilled(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_wait_for_a_response_slot_and_consumed_slots_come_back() {
        let now = Instant::now();
        let mut c = ConnSlots::new(2, 1);
        for slot in 0..2 {
            c.receive_completed(now);
            c.request(slot, 10);
        }
        assert_eq!(c.next_request(), Some((0, 10, 0)));
        assert_eq!(c.next_request(), None, "no response slot free");
        c.response_sent(0);
        assert_eq!(c.next_request(), Some((1, 10, 0)));
        assert_eq!(c.take_consumed(), [0, 1]);
        assert!(c.take_consumed().is_empty());
        c.reposted(2, now);
        assert_eq!(c.posted, 2);
    }
}
