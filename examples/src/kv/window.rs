//! A kv-rpc client's request window: request `i` uses request buffer `i % window`, and a
//! buffer is free again only once both its SEND has completed (the HCA is done reading
//! it) and its response has arrived, in either order. Each response is timed from the
//! post, and a gap of more than 1 ms without one while requests were in flight counts as
//! a stall (in the connection's [`ClientReport`]).

use std::time::{Duration, Instant};

use anyhow::bail;

use super::report::ClientReport;
use crate::Res;

/// A gap without a response longer than this is a stall.
const STALL: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, Debug)]
enum Slot {
    Free,
    Busy {
        req: usize,
        t0: Instant,
        send_done: bool,
        resp_done: bool,
    },
}

/// Which request is in which buffer, and how far the run is.
#[derive(Debug)]
pub struct Window {
    slots: Vec<Slot>,
    total: usize,
    next: usize,
    done: usize,
    /// The last response, or the moment the pipeline was empty.
    last_event: Instant,
}

impl Window {
    /// `window` buffers for `total` requests.
    pub fn new(window: usize, total: usize) -> Window {
        Window {
            slots: vec![Slot::Free; window.max(1)],
            total,
            next: 0,
            done: 0,
            last_event: Instant::now(),
        }
    }

    /// The next request and its buffer, marked posted at `now`, if one is left and its
    /// buffer is free.
    pub fn take(&mut self, now: Instant) -> Option<(usize, usize)> {
        if self.next == self.done {
            self.last_event = now; // the pipeline was empty: no stall until now
        }
        let s = self.next % self.slots.len();
        if self.next == self.total
            || self.next - self.done >= self.slots.len()
            || !matches!(self.slots[s], Slot::Free)
        {
            return None;
        }
        self.slots[s] = Slot::Busy {
            req: self.next,
            t0: now,
            send_done: false,
            resp_done: false,
        };
        self.next += 1;
        Some((s, self.next - 1))
    }

    /// The SEND from buffer `slot` completed.
    pub fn sent(&mut self, slot: usize) {
        if let Some(Slot::Busy {
            req, t0, resp_done, ..
        }) = self.slots.get(slot).copied()
        {
            self.slots[slot] = if resp_done {
                Slot::Free
            } else {
                Slot::Busy {
                    req,
                    t0,
                    send_done: true,
                    resp_done,
                }
            };
        }
    }

    /// The response to `req_id` arrived at `now`: checks that it is in flight, records its
    /// latency (and a stall) in `rep`, and returns the request's index.
    pub fn answered(&mut self, req_id: u32, now: Instant, rep: &mut ClientReport) -> Res<usize> {
        let s = req_id as usize % self.slots.len();
        let Slot::Busy {
            req, t0, send_done, ..
        } = self.slots[s]
        else {
            bail!("response to request {req_id} that is not in flight")
        };
        if req != req_id as usize {
            bail!("response to request {req_id} while {req} is in flight");
        }
        rep.lat.record(now - t0);
        let gap = now - self.last_event;
        if gap > STALL {
            rep.stalls += 1;
            rep.stalled += gap;
        }
        self.last_event = now;
        self.done += 1;
        self.slots[s] = if send_done {
            Slot::Free
        } else {
            Slot::Busy {
                req,
                t0,
                send_done,
                resp_done: true,
            }
        };
        Ok(req)
    }

    /// The request in buffer `slot`, if any.
    pub fn request_in(&self, slot: usize) -> Option<usize> {
        match self.slots.get(slot) {
            Some(Slot::Busy { req, .. }) => Some(*req),
            _ => None,
        }
    }

    /// Whether every request is answered and every buffer free.
    pub fn finished(&self) -> bool {
        self.done == self.total && self.slots.iter().all(|s| matches!(s, Slot::Free))
    }

    /// Requests answered.
    pub fn done(&self) -> usize {
        self.done
    }

    /// Requests posted and not answered yet.
    pub fn in_flight(&self) -> usize {
        self.next - self.done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_free_after_both_its_send_and_its_response() {
        let now = Instant::now();
        let mut rep = ClientReport::default();
        let mut w = Window::new(2, 3);
        assert_eq!(w.take(now), Some((0, 0)));
        assert_eq!(w.take(now), Some((1, 1)));
        assert_eq!(w.take(now), None, "the window is full");
        assert_eq!(w.answered(0, now, &mut rep).unwrap(), 0);
        assert_eq!(w.take(now), None, "buffer 0's SEND has not completed");
        w.sent(0);
        assert_eq!(w.take(now), Some((0, 2)));
        assert!(w.answered(0, now, &mut rep).is_err(), "request 0 is answered");
        w.sent(1);
        w.sent(0);
        w.answered(1, now, &mut rep).unwrap();
        assert!(!w.finished());
        w.answered(2, now, &mut rep).unwrap();
        assert!(w.finished() && w.done() == 3 && w.in_flight() == 0);
        assert_eq!(rep.lat.len(), 3);
    }
}
