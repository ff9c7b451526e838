//! Yielding the CPU to connection setup: while a QP of the device waits for its
//! connection, an application thread that polls an empty CQ gives up the CPU once per
//! poll (`sched_yield(2)`).
//!
//! An HCA has nothing to set up between RTS and the first packet; the sim has a TCP
//! connection, a hello and its check, each a hop between the setup threads
//! ([`transport`](crate::transport)) of two processes. A program that starts spinning
//! as soon as its QP is in RTS (perftest starts its clock, posts and polls right after
//! its handshake) occupies a core, and so does its peer: on a machine with no more cores
//! than spinning threads (a CI runner, or a laptop running several pairs) each hop waits
//! for the scheduler to preempt a spinner, a wake-up granularity of milliseconds, and
//! the setup that takes a fraction of a millisecond takes several. A yield costs a
//! syscall that returns at once when nothing else is runnable, and it stops when the
//! last waiting QP is connected, so only the first polls of a run pay it.
//!
//! The yielding is bounded by [`YIELD_FOR`] after the count last rose from zero: a QP
//! whose peer never comes (it crashed before RTR, or will connect much later) must not
//! tax the device's polls for ever.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// How long after a QP started waiting for its connection (none waited before) polls
/// yield: the requester's grace for a connection under way
/// ([`LINK_SETUP_GRACE`](backend_sim_proto::qp::LINK_SETUP_GRACE)).
pub(super) const YIELD_FOR: Duration = backend_sim_proto::qp::LINK_SETUP_GRACE;

/// The device's QPs that wait for their connection.
pub(super) struct AwaitedLinks {
    count: AtomicUsize,
    /// When `count` last rose from zero (nanoseconds since the clock's base).
    since: AtomicU64,
}

impl AwaitedLinks {
    pub fn new() -> AwaitedLinks {
        AwaitedLinks {
            count: AtomicUsize::new(0),
            since: AtomicU64::new(0),
        }
    }

    /// A QP started (`true`) or stopped waiting for its connection at `now_ns`.
    pub fn note(&self, awaits: bool, now_ns: u64) {
        if awaits {
            if self.count.fetch_add(1, Ordering::Relaxed) == 0 {
                self.since.store(now_ns, Ordering::Relaxed);
            }
        } else {
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// How many QPs wait for their connection.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// Whether a poll at `now_ns` that found nothing should yield the CPU.
    #[inline]
    pub fn should_yield(&self, now_ns: u64) -> bool {
        // One relaxed load on the common path (nobody waits).
        self.count() > 0
            && now_ns.saturating_sub(self.since.load(Ordering::Relaxed)) < YIELD_FOR.as_nanos() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_yield_while_a_link_is_awaited_and_for_a_bounded_time() {
        let l = AwaitedLinks::new();
        assert!(!l.should_yield(5), "nobody waits");
        l.note(true, 1_000);
        l.note(true, 2_000);
        assert_eq!(l.count(), 2);
        assert!(l.should_yield(3_000));
        l.note(false, 4_000);
        assert!(l.should_yield(5_000), "one QP still waits");
        let late = 1_000 + YIELD_FOR.as_nanos() as u64;
        assert!(!l.should_yield(late), "a peer that never comes stops the yields");
        l.note(false, 6_000);
        assert!(!l.should_yield(7_000), "every QP connected");
        // The window restarts when a QP waits again after none did.
        l.note(true, late + 10);
        assert!(l.should_yield(late + 20));
    }
}
