//! The device's timer heap: when each QP's requester wants its next look (ACK timeout,
//! RNR wait) or fault injection a stall's end; the earliest deadline is kept where every
//! poll can read it without the lock.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::clock::Clock;
use crate::qp::QpShared;

struct TimerEntry {
    at: Instant,
    qp: Weak<QpShared>,
}

impl PartialEq for TimerEntry {
    fn eq(&self, o: &Self) -> bool {
        self.at == o.at
    }
}
impl Eq for TimerEntry {}
impl PartialOrd for TimerEntry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for TimerEntry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.at.cmp(&o.at)
    }
}

pub(super) struct Timers {
    heap: Mutex<BinaryHeap<Reverse<TimerEntry>>>,
    /// When the earliest timer is due (nanoseconds since the clock's base; `u64::MAX`:
    /// none), kept under the heap's lock and read without it on every poll.
    next: AtomicU64,
}

impl Timers {
    pub fn new() -> Timers {
        Timers {
            heap: Mutex::new(BinaryHeap::new()),
            next: AtomicU64::new(u64::MAX),
        }
    }

    /// Adds a check of `qp` at `at`; returns whether it is now the earliest.
    pub fn push(&self, qp: &Arc<QpShared>, at: Instant, clock: &Clock) -> bool {
        let mut t = self.heap.lock();
        t.push(Reverse(TimerEntry {
            at,
            qp: Arc::downgrade(qp),
        }));
        let first = t.peek().map(|e| e.0.at);
        self.note_next(first, clock);
        first == Some(at)
    }

    /// Whether the earliest timer is due at `now_ns` (nanoseconds since the base).
    pub fn due(&self, now_ns: u64) -> bool {
        self.next.load(Ordering::Acquire) <= now_ns
    }

    /// The earliest entry if it is due at `now`, taken off the heap: (its deadline, its
    /// QP).
    pub fn pop_due(&self, now: Instant, clock: &Clock) -> Option<(Instant, Weak<QpShared>)> {
        let mut t = self.heap.lock();
        let due = match t.peek() {
            Some(e) if e.0.at <= now => t.pop().map(|e| e.0),
            _ => None,
        };
        if due.is_some() {
            self.note_next(t.peek().map(|e| e.0.at), clock);
        }
        due.map(|e| (e.at, e.qp))
    }

    /// How long until the earliest timer, if any.
    pub fn left(&self, now: Instant) -> Option<Duration> {
        self.heap
            .lock()
            .peek()
            .map(|e| e.0.at.saturating_duration_since(now))
    }

    /// Records when the earliest timer is due; call with the heap's lock held.
    fn note_next(&self, first: Option<Instant>, clock: &Clock) {
        let ns = first.map_or(u64::MAX, |at| clock.nanos(at));
        self.next.store(ns, Ordering::Release);
    }
}
