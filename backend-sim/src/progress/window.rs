//! Whether an application thread drives the device's progress itself: its polls come
//! less than [`DRIVE_GAP`] apart, so it reads and writes the connections on its way and
//! the progress thread stays off them for the driving window ([`USER_WINDOW`]) plus a
//! grace period. Also the thread-local facts behind it (which device a thread polled
//! last, whether it is a progress thread, its posts since its last poll).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Weak;
use std::time::Duration;

use super::bell::Bell;
use super::clock::Clock;
use super::Progress;

/// Polls closer together than this count as an application thread driving progress.
pub(super) const DRIVE_GAP: Duration = Duration::from_micros(50);
/// How long an application-driven poll keeps the progress thread off the connections.
pub(super) const USER_WINDOW: Duration = Duration::from_micros(100);
/// How long after that the progress thread looks again (`RDMA_SIM_GRACE_US`).
pub(super) const USER_GRACE: Duration = Duration::from_millis(2);
/// Bytes a thread may leave queued on busy send queues between two polls before its
/// post transmits them (`Progress::kick`). At this size copying the payload costs far
/// more than the `sendmsg` that carries it, so a batch gains little by growing, while
/// the peer waits for bytes that sit queued behind the poster's own work.
pub(super) const STREAM_FLUSH: u64 = 64 << 10;

thread_local! {
    /// Set on progress threads: their writes are not an application driving progress.
    pub(super) static ON_PROGRESS_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// The device this application thread polled last (`Progress::user_here`).
    pub(super) static POLLED: std::cell::RefCell<Weak<Progress>> = const { std::cell::RefCell::new(Weak::new()) };
    /// Its address, for the comparison on every poll: a plain thread-local read, where
    /// `POLLED` (it has a destructor) is first checked for being initialized.
    pub(super) static POLLED_AT: std::cell::Cell<*const Progress> = const { std::cell::Cell::new(std::ptr::null()) };
    /// `post_send` calls of this application thread since its last poll of a CQ
    /// (`Progress::kick`: only a post that follows another one may wait for more).
    pub(super) static POSTS_SINCE_POLL: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// Payload bytes this application thread's posts left queued since its last poll or
    /// since a post sent them for exceeding [`STREAM_FLUSH`] (`Progress::kick`).
    pub(super) static QUEUED_SINCE_POLL: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The driving window of one device.
pub(super) struct Window {
    /// Nanoseconds since the clock's base until which an application thread counts as
    /// driving (`u64::MAX` while a driving thread services a connection, see
    /// [`Window::entered`]).
    pub until: AtomicU64,
    /// When an application thread last polled (nanoseconds since the base).
    pub last_poll: AtomicU64,
    /// How long the progress thread stays off the connections after an application
    /// thread's driving window ends ([`USER_GRACE`] unless `RDMA_SIM_GRACE_US` says).
    pub grace: Duration,
}

impl Window {
    pub fn new(grace: Duration) -> Window {
        Window {
            until: AtomicU64::new(0),
            last_poll: AtomicU64::new(0),
            grace,
        }
    }

    /// Whether an application thread drives progress at `now_ns`.
    pub fn driving(&self, now_ns: u64) -> bool {
        self.until.load(Ordering::Relaxed) > now_ns
    }

    /// An application thread polls at `now` (nanoseconds since the base): if its
    /// previous poll was less than [`DRIVE_GAP`] before, it drives progress for the next
    /// [`USER_WINDOW`].
    ///
    /// A thread that starts driving (no window was open) while the progress thread
    /// sleeps on the whole epoll set, with no end to its sleep, rings it: that thread
    /// must learn that a window opened, to sleep on the doorbell alone and take over
    /// when the window and grace period end. Else what the driving thread leaves behind
    /// when it stops polling (an ACK it owes, a transmit queued behind others) would wait
    /// for the next packet or timer, for ever if none comes: the packets of the window
    /// only woke it for readiness that the driving thread had already taken.
    pub fn active(&self, now: u64, bell: &Bell) {
        // A load and a store, not a swap (a locked instruction on every poll): two threads
        // polling at once may each see the other's time, which is as good as their own.
        let last = self.last_poll.load(Ordering::Relaxed);
        self.last_poll.store(now, Ordering::Relaxed);
        // (`last` 0: no poll since the window was closed, however soon after the clock's
        // base this one comes.)
        if last != 0 && now.saturating_sub(last) < DRIVE_GAP.as_nanos() as u64 {
            let until = now + USER_WINDOW.as_nanos() as u64;
            if self.until.load(Ordering::Relaxed) > now {
                // A window is open (or a driving thread is inside a connection).
                self.until.store(until, Ordering::Relaxed);
                return;
            }
            // SeqCst: paired with the progress thread's `sleeping` store and second look.
            self.until.store(until, Ordering::SeqCst);
            if bell.sleeping.load(Ordering::SeqCst) && !bell.bounded.load(Ordering::Relaxed) {
                bell.ring();
            }
        }
    }

    /// An application thread posted at `now` (nanoseconds since the base): whether an
    /// application thread drives progress. If one does, the post counts as a poll
    /// towards its window: a loop that refills many QPs can take longer than the window
    /// between two polls, and the progress thread, finding the window over, would take
    /// the transmits it is queueing (a third busy thread on the connections). A post
    /// opens no window of its own: a thread that posts and waits on a completion channel
    /// does not drive.
    pub fn posted(&self, now: u64, bell: &Bell) -> bool {
        let until = self.until.load(Ordering::Relaxed);
        // (`u64::MAX`: a driving thread is inside a connection; its exit sets the window.)
        if until > now && until != u64::MAX {
            self.active(now, bell);
        }
        until > now
    }

    /// An application thread starts servicing a connection: if it drives progress (its
    /// last poll opened or extended the window), it goes on driving for as long as it is
    /// there, however short the window: reading or writing a large payload (up to a
    /// [`WRITE_BUDGET`](crate::tx::WRITE_BUDGET)) takes a millisecond or more on
    /// loopback. Without this, a progress thread waking meanwhile finds the window over,
    /// watches the connections itself and fights the application for them. Returns the
    /// window to hand to [`Window::left`]; `None` on a progress thread, or when the
    /// thread was not driving (zero: never, or it armed a CQ to sleep, see [`Window::idle`]).
    pub fn entered(&self) -> Option<u64> {
        if ON_PROGRESS_THREAD.get() {
            return None;
        }
        let until = self.until.load(Ordering::Relaxed);
        if until != 0 && until >= self.last_poll.load(Ordering::Relaxed) {
            self.until.store(u64::MAX, Ordering::Relaxed);
            Some(until)
        } else {
            None
        }
    }

    /// The thread of [`Window::entered`] lets go of the connection: if it moved bytes,
    /// the time spent was not a pause between polls and the window runs on from `now()`;
    /// else the window is as it was. Only undoes its own mark: a CQ armed meanwhile
    /// ([`Window::idle`]) or a newer poll's window stands.
    pub fn left(&self, entered: Option<u64>, moved: bool, now: impl FnOnce() -> u64) {
        let Some(until) = entered else { return };
        // (`u64::MAX`: another thread was in a connection too; it counts as moved.)
        let (until, at) = if moved || until == u64::MAX {
            let t = now();
            (t + USER_WINDOW.as_nanos() as u64, Some(t))
        } else {
            (until, None)
        };
        let swapped = self
            .until
            .compare_exchange(u64::MAX, until, Ordering::Relaxed, Ordering::Relaxed);
        if let (Ok(_), Some(t)) = (swapped, at) {
            self.last_poll.store(t, Ordering::Relaxed);
        }
    }

    /// Whether an application thread has been inside one connection for about the grace
    /// period or longer (`now_ns`: nanoseconds since the base). It entered within a
    /// window of its last poll and has not polled since, so while its stream does not
    /// drain the device's other connections have nobody to read them: the progress
    /// thread gives them a round every window plus grace period, as it would if nobody
    /// drove.
    pub fn long_stay(&self, now_ns: u64) -> bool {
        self.until.load(Ordering::Relaxed) == u64::MAX
            && now_ns.saturating_sub(self.last_poll.load(Ordering::Relaxed)) >= self.grace.as_nanos() as u64
    }

    /// An application thread stops driving without waking the progress thread: it is
    /// about to wait on the connections itself (see `waiter`), or arms a CQ to do so.
    /// A progress thread asleep on the doorbell because it drove ends its sleep at its
    /// bound, as ever.
    pub fn close_quietly(&self) {
        self.last_poll.store(0, Ordering::Relaxed);
        if self.until.load(Ordering::Relaxed) != 0 {
            // SeqCst: paired with the progress thread's `sleeping` store and second look.
            self.until.store(0, Ordering::SeqCst);
        }
    }

    /// An application thread is about to sleep on a completion channel (it armed a CQ):
    /// it no longer drives progress, so the progress thread must take over at once
    /// rather than after the grace period, and the thread's next poll does not start a
    /// new driving window.
    pub fn idle(&self, clock: &Clock, bell: &Bell) {
        self.last_poll.store(0, Ordering::Relaxed);
        // SeqCst: paired with the progress thread's `sleeping` store and second look.
        let until = self.until.swap(0, Ordering::SeqCst);
        // While the window and the grace period after it last, the progress thread may
        // be asleep on the doorbell alone: wake it to watch the connections.
        let off_until = until.saturating_add(self.grace.as_nanos() as u64);
        if until != 0 && off_until > clock.now_ns() && bell.sleeping.load(Ordering::SeqCst) {
            bell.ring();
        }
    }
}
