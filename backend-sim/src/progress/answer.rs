//! ACKs held for an answer (IBA 9.7.5.1.2: a responder may coalesce its ACKs, within
//! the requester's ACK timeout).
//!
//! A program that sleeps on a completion channel and answers what it receives with a
//! post of its own (a ping-pong, an RPC: `ib_send_lat -e`, qperf's `rc_lat`,
//! `ibv_rc_pingpong -e`) has a peer that sleeps on a channel too. Its request's ACK and
//! its answer, sent apart, wake that peer's progress thread twice and its application
//! twice (once for the send completion, once for the receive); sent together, once
//! each. So when the progress thread's round delivers a completion that wakes a thread
//! on a channel, and the QP's application has answered before ([`Conn::answers`], set
//! by its posts), the ACK the round owes is held for the answer. It leaves with the
//! application's next post on the connection; or when a thread blocks on a channel of
//! the device again (the answer is not coming: `Progress::waiter_blocks`); or on its
//! own when [`ANSWER_WAIT`] passes first (a thread that went off to compute, or waits
//! in `poll(2)` on the channel's descriptor, which the sim does not see). An
//! application that did not answer in time is not waited for again until it posts
//! again: a receiver that never sends costs its peers nothing.
//!
//! A hold starts in two steps (`Conn::ack_held_until`): the round marks the ACK
//! ([`HeldAcks::mark`], with the connection locked), and once it has let go of the
//! connection and signalled its channels, the wait starts ([`HeldAcks::hold`]). So a
//! thread about to block on a channel that finds a hold (and no event to take) has taken
//! that hold's event already: the answer is not coming (`Progress::waiter_blocks`). An
//! ACK that left between the two steps (the woken thread was quick) is not held; one
//! whose thread blocked again between them (it preempted the round's thread right after
//! the signal) waits out [`ANSWER_WAIT`]. A
//! connection holds at most one ACK; its deadline tells a current hold from an entry
//! left behind by one whose ACK already left. Such entries stay until their deadline:
//! removing each when its ACK leaves would take the list's lock once per message.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::qp::Conn;

/// The longest an ACK waits for an answer. An answer normally comes within
/// microseconds, or the thread blocks again and the ACK leaves then; this bounds the
/// rest, within any requester's ACK timeout worth having (4.096 µs x 2^timeout, 67 ms
/// by default), and the progress thread wakes for it only when no message came
/// meanwhile (an entry whose ACK left stays until its deadline). As long as the longest
/// spin window: a host on which a woken thread waits longer than that for a CPU
/// answers late, and then the ACK goes alone, as before.
pub(super) const ANSWER_WAIT: Duration = super::MAX_SPIN;

/// `Conn::ack_held_until` of an ACK marked for an answer whose wait has not started.
const MARKED: u64 = 1;

/// The connections whose ACK waits for an answer, with their deadlines.
pub(super) struct HeldAcks {
    list: Mutex<Vec<(Arc<Conn>, u64)>>,
    /// The earliest deadline in the list (nanoseconds on the device's clock), `u64::MAX`
    /// when it is empty: the progress thread's sleep ends there.
    next: AtomicU64,
    /// How many connections hold an ACK now (entries whose ACK left not counted).
    current: AtomicUsize,
    /// How long a hold lasts ([`ANSWER_WAIT`]; tests make it longer).
    wait_ns: AtomicU64,
    /// A list for [`HeldAcks::take_all`]'s callers, kept for reuse (the steady state
    /// allocates nothing).
    spare: Mutex<Vec<Arc<Conn>>>,
    /// The holds so far (tests).
    #[cfg(test)]
    pub held: AtomicU64,
}

impl HeldAcks {
    pub fn new() -> HeldAcks {
        HeldAcks {
            list: Mutex::new(Vec::new()),
            next: AtomicU64::new(u64::MAX),
            current: AtomicUsize::new(0),
            wait_ns: AtomicU64::new(ANSWER_WAIT.as_nanos() as u64),
            spare: Mutex::new(Vec::new()),
            #[cfg(test)]
            held: AtomicU64::new(0),
        }
    }

    /// A round of `conn` (its I/O lock held) leaves its ACK for an answer: marks it,
    /// unless a hold runs already (the ACK covers the requests of both).
    pub fn mark(conn: &Conn) {
        let _ = conn
            .ack_held_until
            .compare_exchange(0, MARKED, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// Whether `conn`'s ACK waits for an answer (its hold started; tests).
    #[cfg(test)]
    pub fn waits(conn: &Conn) -> bool {
        conn.ack_held_until.load(Ordering::Acquire) > MARKED
    }

    /// Whether `conn`'s ACK is marked and waits for [`HeldAcks::hold`].
    #[inline]
    pub fn marked(conn: &Conn) -> bool {
        conn.ack_held_until.load(Ordering::Acquire) == MARKED
    }

    /// `conn`'s marked ACK waits for an answer from `now_ns` on, unless it left
    /// meanwhile; returns whether a sleeping progress thread must be woken to heed its
    /// deadline (none was held, see [`HeldAcks::due_in`], or it is the earliest).
    pub fn hold(&self, conn: &Arc<Conn>, now_ns: u64) -> bool {
        let until = now_ns + self.wait_ns.load(Ordering::Relaxed);
        // Counted first: whoever clears the hold uncounts it.
        let before = self.current.fetch_add(1, Ordering::AcqRel);
        if conn
            .ack_held_until
            .compare_exchange(MARKED, until, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            self.current.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        #[cfg(test)]
        self.held.fetch_add(1, Ordering::Relaxed);
        self.list.lock().push((conn.clone(), until));
        self.next.fetch_min(until, Ordering::AcqRel) > until || before == 0
    }

    /// No ACK of `conn` waits any more (it left with the round's frames, or is left for
    /// later by other means).
    #[inline]
    pub fn left(&self, conn: &Conn) {
        if conn.ack_held_until.load(Ordering::Relaxed) != 0
            && conn.ack_held_until.swap(0, Ordering::AcqRel) > MARKED
        {
            self.current.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether some connection holds an ACK now.
    #[inline]
    pub fn any(&self) -> bool {
        self.current.load(Ordering::Acquire) != 0
    }

    /// How long until the earliest deadline, from `now_ns`; `None` with no ACK held now
    /// (the entries left behind by ACKs that left do not end a sleep: in a ping-pong
    /// slower than [`ANSWER_WAIT`] each would cost the progress thread a wake-up).
    pub fn due_in(&self, now_ns: u64) -> Option<Duration> {
        if !self.any() {
            return None;
        }
        match self.next.load(Ordering::Acquire) {
            u64::MAX => None,
            at => Some(Duration::from_nanos(at.saturating_sub(now_ns))),
        }
    }

    /// The earliest deadline in the list, `u64::MAX` if it is empty.
    #[inline]
    pub fn next(&self) -> u64 {
        self.next.load(Ordering::Acquire)
    }

    /// Moves the connections whose hold ended by `now_ns` into `due`, their holds
    /// cleared and their applications no longer waited for (`Conn::answers`); entries
    /// whose ACK already left are dropped.
    pub fn take_due(&self, now_ns: u64, due: &mut Vec<Arc<Conn>>) {
        if self.next.load(Ordering::Acquire) > now_ns {
            return;
        }
        let mut list = self.list.lock();
        let mut next = u64::MAX;
        list.retain(|(c, until)| {
            if *until > now_ns {
                next = next.min(*until);
                return true;
            }
            if self.clear(c, *until) {
                c.answers.store(false, Ordering::Relaxed);
                due.push(c.clone());
            }
            false
        });
        self.next.store(next, Ordering::Release);
    }

    /// Every connection that holds an ACK, their holds cleared (the application keeps
    /// its standing), in the spare list: hand it back with [`HeldAcks::give_back`] once
    /// they are serviced. The list of holds is emptied.
    pub fn take_all(&self) -> Vec<Arc<Conn>> {
        let mut due = std::mem::take(&mut *self.spare.lock());
        let mut list = self.list.lock();
        for (c, until) in list.drain(..) {
            if self.clear(&c, until) {
                due.push(c);
            }
        }
        self.next.store(u64::MAX, Ordering::Release);
        due
    }

    /// Returns the list [`HeldAcks::take_all`] filled, for reuse.
    pub fn give_back(&self, mut due: Vec<Arc<Conn>>) {
        due.clear();
        *self.spare.lock() = due;
    }

    /// Clears `conn`'s hold if it is the one of deadline `until`; whether it was.
    fn clear(&self, conn: &Conn, until: u64) -> bool {
        let cleared = conn
            .ack_held_until
            .compare_exchange(until, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if cleared {
            self.current.fetch_sub(1, Ordering::AcqRel);
        }
        cleared
    }

    /// Makes holds last `d` (tests: long enough for a loaded host's answer).
    #[cfg(test)]
    pub fn set_wait(&self, d: Duration) {
        self.wait_ns.store(d.as_nanos() as u64, Ordering::Relaxed);
    }
}
