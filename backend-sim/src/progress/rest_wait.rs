//! Whether a driving application thread stays in a connection for the rest of a message
//! it started to receive. A message larger than a loopback segment arrives in several
//! reads, and the poll that reads its head may return at once (its completion came in
//! the same read). A thread that then waits on memory instead of the CQ (a WRITE-based
//! ping-pong, as `ib_write_lat`) would leave the rest to the progress thread, which only
//! looks after the driving window: the thread finishes the message it started instead,
//! as an HCA delivers a message without the CPU. If the sender pauses (a busy machine),
//! the thread gives the connection up to the progress thread rather than spin on.

use std::time::Duration;

use super::window::DRIVE_GAP;

/// How long a thread waits for more of a message when no byte came: the gap between
/// polls that counts as driving.
pub(super) const REST_WAIT: Duration = DRIVE_GAP;

/// What the thread does when its last read found the socket drained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rest {
    /// Read again: the message being received is not all in.
    Stay,
    /// Leave: no message is half-received, or the one waited for is in and the next
    /// began.
    Leave,
    /// Leave, and hand the connection to the progress thread: no byte came for
    /// [`REST_WAIT`].
    GiveUp,
}

/// The message being waited for, kept across the rounds of one service.
#[derive(Default)]
pub(super) struct RestWait {
    /// Its bytes still to come, and when (nanoseconds) that count last fell.
    kept: Option<(usize, u64)>,
}

impl RestWait {
    /// The decision after a round that ended with the socket drained. `left`: the bytes
    /// of the payload being received still to come (`None`: between messages);
    /// `progressed`: the round moved bytes; `now`: the clock, read only when needed.
    pub fn next(&mut self, left: Option<usize>, progressed: bool, now: impl FnOnce() -> u64) -> Rest {
        let Some(left) = left else {
            return Rest::Leave;
        };
        let now = now();
        match self.kept {
            // A larger count than the one kept: the next message.
            Some((kept, _)) if left > kept => Rest::Leave,
            Some((kept, since)) if !progressed && left == kept => {
                if now.saturating_sub(since) < REST_WAIT.as_nanos() as u64 {
                    Rest::Stay
                } else {
                    Rest::GiveUp
                }
            }
            _ => {
                self.kept = Some((left, now));
                Rest::Stay
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1_000;

    #[test]
    fn a_thread_between_messages_leaves() {
        let mut w = RestWait::default();
        assert_eq!(w.next(None, true, || 0), Rest::Leave);
    }

    #[test]
    fn a_thread_stays_while_the_payload_comes_and_leaves_when_it_is_in() {
        let mut w = RestWait::default();
        assert_eq!(w.next(Some(60_000), true, || 0), Rest::Stay);
        // Nothing came, but not for long.
        assert_eq!(w.next(Some(60_000), false, || 40 * US), Rest::Stay);
        // Bytes came: the wait starts again from here.
        assert_eq!(w.next(Some(30_000), true, || 45 * US), Rest::Stay);
        assert_eq!(w.next(Some(30_000), false, || 90 * US), Rest::Stay);
        // All in.
        assert_eq!(w.next(None, true, || 100 * US), Rest::Leave);
    }

    #[test]
    fn a_thread_waits_for_its_message_not_the_next_one() {
        let mut w = RestWait::default();
        assert_eq!(w.next(Some(1_000), true, || 0), Rest::Stay);
        // The message ended and the next one's head came in the same read.
        assert_eq!(w.next(Some(65_000), true, || US), Rest::Leave);
    }

    #[test]
    fn a_thread_gives_up_when_no_byte_comes_for_the_wait() {
        let mut w = RestWait::default();
        assert_eq!(w.next(Some(500), true, || 0), Rest::Stay);
        let end = REST_WAIT.as_nanos() as u64;
        assert_eq!(w.next(Some(500), false, || end - 1), Rest::Stay);
        assert_eq!(w.next(Some(500), false, || end), Rest::GiveUp);
    }
}
