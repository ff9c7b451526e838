//! When a completion channel's descriptor is written (`man ibv_get_cq_event`: the
//! thread blocked on it wakes), relative to the locks of the thread that completes.
//!
//! A thread servicing a connection delivers completions with the QP's lock held, and
//! writes the connection's ACK after that. A thread it woke on the same CPU (where the
//! scheduler likes to place it) preempts it there, and its first verbs (`ibv_poll_cq`,
//! `ibv_post_recv`) wait for that very lock: the two then take turns at a lock instead
//! of the woken thread running on, and the ACK leaves late. So a round of service
//! defers its channels' signals ([`Deferral`]) until it lets go of the connection, with
//! its frames written; the events are queued then, in the order they were raised.
//!
//! The progress thread also asks whether its turn woke anyone
//! ([`take_signalled`]): it then blocks instead of spinning (see `progress::thread`).

use std::cell::{Cell, RefCell};
use std::sync::Arc;

use crate::comp_channel::ChannelShared;

thread_local! {
    /// Twice the number of this thread's open [`Deferral`]s, plus one while [`DEFERRED`]
    /// holds anything: one word read and written on the way into and out of every round.
    static STATE: Cell<u32> = const { Cell::new(0) };
    /// The signals deferred, oldest first: the channel and the CQ's handle. Kept
    /// allocated: the steady state allocates nothing.
    static DEFERRED: RefCell<Vec<(Arc<ChannelShared>, u32)>> = const { RefCell::new(Vec::new()) };
    /// Whether this thread signalled a channel since it last asked ([`take_signalled`]).
    static SIGNALLED: Cell<bool> = const { Cell::new(false) };
    /// How many signals this thread raised, deferred or not ([`raised`]).
    static RAISED: Cell<u64> = const { Cell::new(0) };
}

/// Signals `ch` that CQ `cq` has an event: now, or when the calling thread's open
/// [`Deferral`]s close.
pub(crate) fn signal(ch: &Arc<ChannelShared>, cq: u32) {
    RAISED.set(RAISED.get().wrapping_add(1));
    let state = STATE.get();
    if state >= 2 {
        STATE.set(state | 1);
        DEFERRED.with_borrow_mut(|d| d.push((ch.clone(), cq)));
    } else {
        ch.post(cq);
        SIGNALLED.set(true);
    }
}

/// How many signals the calling thread raised so far, deferred or not: a round compares
/// the count before and after it delivers to learn whether it woke anyone.
pub(crate) fn raised() -> u64 {
    RAISED.get()
}

/// Whether the calling thread signalled a completion channel (woke whatever waits on
/// its descriptor) since the last call.
pub(crate) fn take_signalled() -> bool {
    SIGNALLED.replace(false)
}

/// While one lives, the thread's channel signals wait; the last one to close sends them.
/// Hold it only where the thread blocks on nothing: what it defers may be what another
/// thread waits for.
pub(crate) struct Deferral(());

impl Deferral {
    #[inline]
    pub(crate) fn begin() -> Deferral {
        STATE.set(STATE.get() + 2);
        Deferral(())
    }
}

impl Drop for Deferral {
    #[inline]
    fn drop(&mut self) {
        let state = STATE.get() - 2;
        if state == 1 {
            // The outermost one, with signals deferred.
            STATE.set(0);
            send_deferred();
        } else {
            STATE.set(state);
        }
    }
}

/// Sends the signals deferred (no [`Deferral`] open any more).
#[cold]
fn send_deferred() {
    let mut due = DEFERRED.with_borrow_mut(std::mem::take);
    for (ch, cq) in due.drain(..) {
        ch.post(cq);
    }
    SIGNALLED.set(true);
    // Hand the (empty) list back for reuse, unless a signal raised meanwhile (none can
    // be: no deferral is open) left one there.
    DEFERRED.with_borrow_mut(|d| {
        if d.is_empty() {
            *d = due;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Signals wait while a deferral is open, nested ones included, and leave in the
    /// order they were raised when the outermost one closes; without one they leave at
    /// once. Either way the thread learns that it signalled.
    #[test]
    fn signals_wait_for_the_outermost_deferral_and_keep_their_order() {
        let ch = Arc::new(ChannelShared::new().unwrap());
        take_signalled();
        {
            let _outer = Deferral::begin();
            signal(&ch, 1);
            {
                let _inner = Deferral::begin();
                signal(&ch, 2);
            }
            assert!(!ch.has_event(), "signalled before the outer deferral closed");
            assert!(!take_signalled());
            signal(&ch, 3);
        }
        assert!(take_signalled());
        let got: Vec<_> = (0..3)
            .map(|_| ch.get_event(Some(std::time::Duration::ZERO)).unwrap())
            .collect();
        assert_eq!(got, [Some(1), Some(2), Some(3)]);
        signal(&ch, 4);
        assert!(take_signalled());
        assert_eq!(ch.get_event(Some(std::time::Duration::ZERO)).unwrap(), Some(4));
        // A deferral that saw no signal leaves nothing behind.
        drop(Deferral::begin());
        assert!(!take_signalled());
        assert!(!ch.has_event());
    }
}
