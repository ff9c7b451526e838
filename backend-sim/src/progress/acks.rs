//! The delayed-ACK list (IBA 9.7.5.1.2: a responder may coalesce its ACKs): the
//! connections whose last round left an ACK for later, and an exact count of them, which
//! every poll and post reads without a lock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::qp::Conn;

pub(super) struct DelayedAcks {
    /// Connections with an ACK left for later (delayed ACK).
    list: Mutex<Vec<Arc<Conn>>>,
    /// How many connections owe an ACK (`Conn::ack_owed` set). Exact: each flag's change
    /// from false to true adds one and each change back subtracts one, and a closed
    /// connection's flag is cleared ([`DelayedAcks::forget`]): a count kept above zero
    /// would never let the progress thread sleep. Briefly off by one between a flag's
    /// swap and the count's update, as the flag and a boolean were.
    owed: AtomicUsize,
    /// The list [`DelayedAcks::take_owed`] fills, kept for reuse: the steady state
    /// allocates nothing.
    spare: Mutex<Vec<Arc<Conn>>>,
}

impl DelayedAcks {
    pub fn new() -> DelayedAcks {
        DelayedAcks {
            list: Mutex::new(Vec::new()),
            owed: AtomicUsize::new(0),
            spare: Mutex::new(Vec::new()),
        }
    }

    /// Whether some connection owes an ACK (a plain load: this runs on every poll and
    /// post, and usually finds nothing owed, a ping-pong's ACK leaving with its next
    /// request).
    #[inline]
    pub fn any(&self) -> bool {
        // SeqCst (a plain load on x86, as Acquire): the progress thread's look before it
        // sleeps pairs with `Progress::owe_ack`'s count and look at its `sleeping`.
        self.owed.load(Ordering::SeqCst) != 0
    }

    /// `conn` owes an ACK left for later: counts it and lists it once. Returns whether
    /// it was newly counted.
    pub fn owe(&self, conn: &Arc<Conn>) -> bool {
        if conn.ack_owed.load(Ordering::Relaxed) || conn.ack_owed.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.owed.fetch_add(1, Ordering::SeqCst);
        if !conn.ack_listed.load(Ordering::Acquire) && !conn.ack_listed.swap(true, Ordering::SeqCst) {
            self.list.lock().push(conn.clone());
        }
        // A `close` that cleared the flag (and the list) before this round set it has
        // gone by: do its part here. Either this look sees `closed`, or `close`'s swap
        // and its `forget` come later and find the flag set and the connection listed
        // (the swaps and looks are SeqCst), or its removal from the list took the list's
        // lock before the push above, and this look sees `closed` after all.
        if conn.closed.load(Ordering::SeqCst) {
            self.forget(conn);
        }
        true
    }

    /// A closed `conn` leaves the count and the list.
    pub fn forget(&self, conn: &Conn) {
        self.disown(conn);
        if conn.ack_listed.load(Ordering::SeqCst) {
            self.list.lock().retain(|c| !std::ptr::eq(Arc::as_ptr(c), conn));
        }
    }

    /// `conn` owes no ACK (any it owed left, or it is closed): uncounts it. Always a
    /// swap, never a plain look first: a closed connection's flag must be found set if
    /// it is.
    pub fn disown(&self, conn: &Conn) {
        if conn.ack_owed.swap(false, Ordering::SeqCst) {
            self.owed.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// The connections that owe an ACK, their flags cleared, in the spare list (hand it
    /// back with [`DelayedAcks::give_back`] once they are serviced, outside the list's
    /// lock); `None` if none did. A closed one found here leaves the list (`close` and
    /// `owe` remove them; this is the backstop).
    pub fn take_owed(&self) -> Option<Vec<Arc<Conn>>> {
        let mut owed: Option<Vec<Arc<Conn>>> = None;
        self.list.lock().retain(|c| {
            if c.is_closed() {
                c.ack_listed.store(false, Ordering::Release);
                self.disown(c);
                return false;
            }
            if c.ack_owed.load(Ordering::Acquire) && c.ack_owed.swap(false, Ordering::SeqCst) {
                self.owed.fetch_sub(1, Ordering::SeqCst);
                owed.get_or_insert_with(|| std::mem::take(&mut *self.spare.lock()))
                    .push(c.clone());
            }
            true
        });
        owed
    }

    /// Returns the list [`DelayedAcks::take_owed`] filled, for reuse.
    pub fn give_back(&self, mut owed: Vec<Arc<Conn>>) {
        owed.clear();
        *self.spare.lock() = owed;
    }

    /// How many connections the list holds (tests).
    #[cfg(test)]
    pub fn listed(&self) -> usize {
        self.list.lock().len()
    }

    /// How many connections owe an ACK (tests).
    #[cfg(test)]
    pub fn owed(&self) -> usize {
        self.owed.load(Ordering::SeqCst)
    }
}
