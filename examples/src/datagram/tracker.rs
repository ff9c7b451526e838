//! A ud-echo client's datagrams in flight ([`Tracker`]): which sequence numbers wait for
//! their echo, since when, and what became of each. UD delivers nothing twice and
//! retransmits nothing, so a datagram whose echo has not come within the loss timeout
//! counts as lost (it, or its echo, was dropped); an echo that still comes later counts
//! as late, never as answered.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// What became of a client's datagrams.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Datagrams sent.
    pub sent: u64,
    /// Echoed intact within the loss timeout.
    pub echoed: u64,
    /// Not echoed within the loss timeout.
    pub lost: u64,
    /// Echoes of datagrams already counted lost.
    pub late: u64,
    /// Echoes that did not decode intact, or that were not this client's.
    pub damaged: u64,
    /// Echoes of sequence numbers never sent, or echoed twice.
    pub unexpected: u64,
}

/// The datagrams in flight of one client, `total` in all.
#[derive(Debug)]
pub struct Tracker {
    out: BTreeMap<u64, Instant>,
    /// Those counted lost whose echo has not come (late) since.
    lost: BTreeSet<u64>,
    next: u64,
    total: u64,
    loss_timeout: Duration,
    /// What became of them.
    pub counts: Counts,
}

/// What an echo was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Echo {
    /// The answer to a datagram in flight, after this long.
    Answered(Duration),
    /// The answer to a datagram already counted lost.
    Late,
    /// Not the answer to anything sent (or a second one).
    Unexpected,
}

impl Tracker {
    /// `total` datagrams to send, each lost after `loss_timeout` without its echo.
    pub fn new(total: u64, loss_timeout: Duration) -> Tracker {
        Tracker {
            out: BTreeMap::new(),
            lost: BTreeSet::new(),
            next: 0,
            total,
            loss_timeout,
            counts: Counts::default(),
        }
    }

    /// The next sequence number to send, if fewer than `window` are in flight and any
    /// are left.
    pub fn next_to_send(&self, window: usize) -> Option<u64> {
        (self.out.len() < window && self.next < self.total).then_some(self.next)
    }

    /// The next sequence number was sent at `now`.
    pub fn sent(&mut self, now: Instant) {
        self.out.insert(self.next, now);
        self.next += 1;
        self.counts.sent += 1;
    }

    /// The echo of `seq` arrived at `now`.
    pub fn echo(&mut self, seq: u64, now: Instant) -> Echo {
        if let Some(t) = self.out.remove(&seq) {
            self.counts.echoed += 1;
            Echo::Answered(now.saturating_duration_since(t))
        } else if self.lost.remove(&seq) {
            self.counts.late += 1;
            Echo::Late
        } else {
            self.counts.unexpected += 1;
            Echo::Unexpected
        }
    }

    /// An echo arrived damaged.
    pub fn damaged(&mut self) {
        self.counts.damaged += 1;
    }

    /// Counts the datagrams in flight longer than the loss timeout at `now` as lost;
    /// returns how many.
    pub fn expire(&mut self, now: Instant) -> u64 {
        let mut n = 0;
        // Sequence numbers are sent in order, so the oldest come first.
        while let Some((&seq, &t)) = self.out.first_key_value() {
            if now.saturating_duration_since(t) < self.loss_timeout {
                break;
            }
            self.out.remove(&seq);
            self.lost.insert(seq);
            n += 1;
        }
        self.counts.lost += n;
        n
    }

    /// Datagrams in flight.
    pub fn in_flight(&self) -> usize {
        self.out.len()
    }

    /// Whether every datagram was sent and answered or lost.
    pub fn finished(&self) -> bool {
        self.next == self.total && self.out.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_datagram_ends_answered_or_lost_and_late_echoes_are_not_answers() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut t = Tracker::new(4, ms(100));
        for _ in 0..2 {
            assert!(t.next_to_send(2).is_some());
            t.sent(t0);
        }
        assert_eq!(t.next_to_send(2), None, "window full");
        assert_eq!(t.echo(1, t0 + ms(5)), Echo::Answered(ms(5)));
        assert_eq!(t.echo(1, t0 + ms(6)), Echo::Unexpected, "twice");
        t.sent(t0 + ms(50));
        assert_eq!(t.expire(t0 + ms(120)), 1, "seq 0 is lost, seq 2 is not yet");
        assert_eq!(t.echo(0, t0 + ms(130)), Echo::Late);
        assert_eq!(t.echo(0, t0 + ms(131)), Echo::Unexpected, "late twice");
        assert_eq!(t.echo(9, t0 + ms(130)), Echo::Unexpected, "never sent");
        assert_eq!(t.echo(2, t0 + ms(140)), Echo::Answered(ms(90)));
        t.sent(t0 + ms(140));
        assert!(!t.finished());
        assert_eq!(t.expire(t0 + ms(240)), 1);
        assert!(t.finished());
        let c = t.counts;
        assert_eq!((c.sent, c.echoed, c.lost, c.late, c.unexpected), (4, 2, 2, 1, 3));
        assert_eq!(c.sent, c.echoed + c.lost);
    }
}
